"""Rollout over the student: the teacher of approximate policy iteration, and per-decision Q-values for RL.

At a state of the constructive schedule, every device the node fits on is tried; the rest of the graph is then
placed by the **student's own greedy policy** (``agents.fast_decode.complete_greedy``, compiled), the backward pass
is run, and each device gets its completed step time (memory-infeasible completions count as infinitely slow).
The best device (ties within ``TIE`` go to the student's own
choice) is the label; every device's completed time over the best one's, minus 1 (capped at ``MAX_REGRET``), is
its regret. This is rollout policy improvement (Bertsekas) with the student as the base policy: following the
labels is never worse than the student on the step time it sees, so distilling them and repeating is approximate
policy iteration, and the regrets are per-decision Q-values (credit per decision for a policy-gradient step). Run
over its own labels (``actions=None``) it is fortified: the best completed placement seen is returned when it beats
the followed trajectory, so its placement is never slower than the student's greedy one.

Cost: per labelled state, D completions of the remaining nodes, each decision with the window features:
O(N W D^2) per state, O(N^2 W D^2) for a whole trajectory. ``label_every`` labels a fraction of the states.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from placement_rl.agents.constructive import graph_tensors
from placement_rl.agents.fast_decode import Head, complete_greedy
from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.cost.lookahead import MAX_REGRET, TIE
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.split import MIN_WORK, threads_asked


@dataclass
class RolloutLabels:
    """What the rollout teacher said along one trajectory (decision order): ``devices`` [N] the trajectory's
    placement, ``labels`` [N] (-1 where not labelled), ``regret`` [N, D], ``labelled`` [N] bool, ``completions``
    (placements completed by the student: the teacher's simulator calls)."""

    devices: np.ndarray
    labels: np.ndarray
    regret: np.ndarray
    labelled: np.ndarray
    completions: int


def student_head(policy, task: ConstructiveTask) -> Head:
    import torch

    with torch.no_grad():
        h = policy.embed(*graph_tensors(task)).double().numpy()
    return Head(policy, h)


def rollout_over_student(policy, task: ConstructiveTask, *, actions: np.ndarray | None = None,
                         label_every: int = 1, offset: int = 0, head: Head | None = None) -> RolloutLabels:
    """Label the states of a trajectory with the rollout teacher over ``policy``'s greedy completion.

    The trajectory follows ``actions`` (a device per node, e.g. the student's own sampled or greedy placement)
    or, when ``None``, the teacher's own labels (the rollout placement itself: every state is labelled).
    States ``t`` with ``t % label_every == offset`` are labelled."""
    head = head if head is not None else student_head(policy, task)
    g, topo = task.graph, task.topology
    nd, n = topo.num_devices, g.num_nodes
    window = task.window
    main = ScheduleState(g, task.costs, topo, episodes=1, window=window)
    branches = _branches(task, window)
    labels = np.full(n, -1, dtype=np.int64)
    regret = np.zeros((n, nd), dtype=np.float32)
    labelled = np.zeros(n, dtype=bool)
    trial = np.arange(nd, dtype=np.int64)
    every = 1 if actions is None else max(1, int(label_every))
    completions = 0
    best_seen, best_devices = np.inf, None  # fortified rollout: the best completed placement seen so far
    while not main.done:
        step, v = main.step, main.node
        feats, mask = main.features()
        ok = mask[0].copy()
        own = int(np.argmax(head.scores(feats[0], v, ok)))
        if step % every == (offset % every) and ok.sum() > 1:
            finish, feasible, devices = _complete(head, main, branches, trial)
            completions += int(ok.sum())
            times = np.where(ok & feasible, finish, np.inf)
            if actions is None and np.isfinite(times).any() and times.min() < best_seen:
                best_seen, best_devices = float(times.min()), devices[int(np.argmin(times))].copy()
            if np.isfinite(times).any():
                best = times.min()
                near = times <= best * (1.0 + TIE)
                labels[step] = own if near[own] else int(np.argmin(times))
                if best > 0.0:
                    regret[step] = np.where(ok, np.minimum(times / best - 1.0, MAX_REGRET), 0.0)
                labelled[step] = True
        if labels[step] < 0:
            labels_step = own
        else:
            labels_step = int(labels[step])
        main.place(int(actions[v]) if actions is not None else labels_step)
    devices = main.devices[0].copy()
    if actions is None and best_devices is not None and best_seen < float(main.finish()[0]) * (1.0 - 1e-12):
        devices = best_devices  # following the labels is not always best for a base policy that is not consistent
    return RolloutLabels(devices, labels, regret, labelled, completions)


def _branches(task: ConstructiveTask, window: int) -> list[tuple[ScheduleState, slice]]:
    """The branch states of one decision: every device's completion, split over the threads this process may use
    (``placement_rl.cost.split.threads_asked``: 1 unless ``PLACEMENT_RL_DECODE_THREADS`` asks, as the command
    does) when the graph is large enough to pay for them; each state holds a contiguous share of the devices."""
    g, topo = task.graph, task.topology
    nd, n = topo.num_devices, g.num_nodes
    threads = threads_asked() if n * min(max(window, 1), n) * nd * nd >= MIN_WORK // 4 else 1
    threads = max(1, min(threads, nd))
    cuts = np.linspace(0, nd, threads + 1).round().astype(int)
    return [(ScheduleState(g, task.costs, topo, episodes=int(b - a), window=window), slice(int(a), int(b)))
            for a, b in zip(cuts[:-1], cuts[1:])]


def _complete(head: Head, main: ScheduleState, branches: list, trial: np.ndarray) -> tuple[np.ndarray, ...]:
    """Place the decision's node on every device (one branch episode each) and complete every branch with the
    student's greedy decode; the shares run on threads (the compiled kernel releases the GIL; each episode's
    arithmetic is the serial one, so the result is the same). Returns (finish [D], feasible [D], devices [D, N])."""
    for st, part in branches:
        st.branch_from(main, 0)
        st.place(trial[part])
    if len(branches) == 1:
        complete_greedy(head, branches[0][0])
    else:
        list(_pool(len(branches)).map(lambda b: complete_greedy(head, b[0]), branches))
    return (np.concatenate([st.finish() for st, _ in branches]), np.concatenate([st.feasible() for st, _ in branches]),
            np.concatenate([st.devices for st, _ in branches]))


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _POOLS:
        _POOLS[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rollout")
    return _POOLS[threads]
