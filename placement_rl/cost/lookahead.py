"""One-step lookahead over the earliest-finish rule: a rollout teacher for the constructive placement policy.

At every decision (the simulator's node order), each device the node fits on is tried; the rest of the graph is
then placed by the earliest-finish rule (``sim_eft``: the device where the node's forward ends first), the
backward pass is run, and the device whose completed placement has the shortest full step time wins (devices
within ``TIE`` of it count as tied and the earliest finish among them wins). This is
rollout policy improvement (Bertsekas) with ``sim_eft`` as the base policy: never worse than ``sim_eft`` on the
step time it sees, and it weighs what a one-pass rule cannot (the backward pass, transfers still to come).

It costs O(N^2 D) node placements (all in numba): 0.2-0.6 s at 450-500 nodes and 2-3 s at 857 nodes on 3-8 devices,
hopeless at 20,000 nodes.
The learned policy is trained to imitate it (``agents.constructive_train``), and places in O(N D).

``eft_rollout(graph, costs, topology, actions=None)`` returns ``(devices, labels, regret)``: the placement, the
lookahead choice at every step (``labels`` [N], in decision order) and every device's regret there (``regret``
[N, D]: its completed step time over the best one's, minus 1; capped at ``MAX_REGRET``, 0 where the node does
not fit). With ``actions`` (a device per node, e.g. a student policy's placement) labels and regrets are those
of the states the actions lead to (DAgger / AggreVaTe). With ``deadline`` (a ``time.perf_counter()`` value) the
lookahead stops once the clock passes it and ``sim_eft`` places the rest (``stats["lookahead_steps"]``: the
decisions the lookahead made), so a search given seconds is not held up by its start.
"""

from __future__ import annotations

import time

import numpy as np

from placement_rl.cost.decode import EARLIEST_FINISH, decode
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

MAX_REGRET = 0.25
TIE = 1e-4  # relative step-time difference below which two devices count as tied


def complete_eft(st: ScheduleState) -> None:
    """Place the rest of ``st``'s nodes in every episode by the earliest-finish rule (``sim_eft``)."""
    decode(st, EARLIEST_FINISH)


def eft_rollout(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *,
                actions: np.ndarray | None = None,
                stats: dict[str, int] | None = None,
                deadline: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(devices [N], labels [N], regret [N, D])``: the lookahead placement (or ``actions``' placement), the
    lookahead choice at every decision (the simulator's node order) and each device's regret (see module doc).
    ``stats["completions"]`` receives the number of completed placements it evaluated (its simulator calls)."""
    nd = topology.num_devices
    main = ScheduleState(graph, costs, topology, episodes=1, window=0)
    branch = ScheduleState(graph, costs, topology, episodes=nd, window=0)
    labels = np.zeros(graph.num_nodes, dtype=np.int64)
    regret = np.zeros((graph.num_nodes, nd), dtype=np.float32)
    trial = np.arange(nd, dtype=np.int64)
    completions, looked = 0, graph.num_nodes
    while not main.done:
        step = main.step
        if deadline is not None and time.perf_counter() >= deadline:
            looked = step
            complete_eft(main)  # out of time: the base policy places the rest
            break
        feats, mask = main.features()
        ok, eft = mask[0].copy(), feats[0, :, 1].copy()
        branch.branch_from(main, 0)
        branch.place(trial)
        complete_eft(branch)
        times = np.where(ok & branch.feasible(), branch.finish(), np.inf)
        completions += int(ok.sum())
        if not np.isfinite(times).any():  # nothing completes within memory: the earliest finish that fits now
            times = np.where(ok, eft, np.inf)
        # near-ties (within TIE of the best) go to the earliest finish: a label only departs from sim_eft for a
        # real gain, so a student can learn when to depart
        near = times <= times.min() * (1.0 + TIE)
        labels[step] = int(np.argmin(np.where(near, eft, np.inf)))
        if np.isfinite(times).any() and times.min() > 0.0:
            regret[step] = np.where(ok, np.minimum(times / times.min() - 1.0, MAX_REGRET), 0.0)
        v = main.node
        main.place(int(actions[v]) if actions is not None else labels[step])
    if stats is not None:
        stats["completions"] = completions
        stats["lookahead_steps"] = looked
    return main.devices[0].copy(), labels, regret
