"""What constructive placement needs of a task: static node features, heuristic references, the task itself.

``node_features(graph, costs)`` [N, F] are normalised per graph so that one policy sees graphs of any size and
any time scale alike (times over the task's time scale, sizes over the graph's mean). ``reference_times``
runs the one-pass heuristics a learned placer must beat (HEFT, m-ETF, m-SCT, METIS) and ``sim_eft`` (the
earliest-finish-time rule run in the simulator's own order on the constructive state) and ``eft_rollout`` (one-step
lookahead over ``sim_eft``, ``placement_rl.cost.lookahead``: the teacher the policy imitates; O(N^2 D), skipped
above ``ROLLOUT_MAX_NODES``) and ``la_rule`` (argmin of the policy's ``la_step`` feature, at any size) and returns
each one's simulated step time and placement. ``ConstructiveTask`` bundles a (graph, topology, costs) with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placement_rl import baselines
from placement_rl.cost import simulate
from placement_rl.cost.limits import check_devices
from placement_rl.baselines.eft import ROLLOUT_MAX_NODES, la_rule_devices, sim_eft_devices as sim_eft
from placement_rl.cost.lookahead import eft_rollout
from placement_rl.cost.resolve import needs_grad
from placement_rl.cost.schedule import DEFAULT_WINDOW, ScheduleState, time_scale
from placement_rl.cost.simulate import _inverse_bandwidth, priority_order
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

NODE_FEATURES = ("t_level", "b_level", "slack", "fwd", "bwd", "out_bytes", "param_bytes", "act_bytes", "in_degree",
                 "out_degree", "position", "needs_grad", "comm_ratio", "on_critical_path")
NUM_NODE_FEATURES = len(NODE_FEATURES)
ONE_PASS = ("heft", "m_etf", "m_sct", "metis")  # the heuristics the learned policy is measured against
TEACHERS = ONE_PASS + ("sim_eft", "eft_rollout")  # what imitation may copy (the best of them per task)
REACTIVE = ("sim_eft", "eft_rollout")  # teachers that can label any state (DAgger)


def _rel(x: np.ndarray) -> np.ndarray:
    m = float(x.mean()) if x.size else 0.0
    return np.log1p(x / m) if m > 0 else np.zeros_like(x)


def node_features(graph: CompGraph, costs: CostTable, *, scale: float | None = None) -> np.ndarray:
    """[N, NUM_NODE_FEATURES] float32 static node features (see ``NODE_FEATURES``)."""
    n, d = graph.num_nodes, costs.num_devices
    scale = time_scale(graph, costs) if scale is None else scale
    w = costs.fwd_time.mean(axis=1) + costs.bwd_time.mean(axis=1)
    if d > 1:
        off = ~np.eye(d, dtype=bool)
        mean_lat, mean_inv = float(costs.link_latency[off].mean()), float(_inverse_bandwidth(costs)[off].mean())
    else:
        mean_lat = mean_inv = 0.0
    comm = mean_lat + graph.edge_bytes * mean_inv  # per edge
    tl, bl = np.zeros(n), w.copy()
    pp, pi, pe = graph.pred_ptr, graph.pred_idx, graph.pred_eid
    sp, si, se = graph.succ_ptr, graph.succ_idx, graph.succ_eid
    topo = graph.topo_order
    for v in topo.tolist():
        a, b = pp[v], pp[v + 1]
        if b > a:
            tl[v] = float((tl[pi[a:b]] + w[pi[a:b]] + comm[pe[a:b]]).max())
    for v in topo[::-1].tolist():
        a, b = sp[v], sp[v + 1]
        if b > a:
            bl[v] = w[v] + float((bl[si[a:b]] + comm[se[a:b]]).max())
    cp = float((tl + bl).max()) if n else 1.0
    out_bytes = np.zeros(n)
    if graph.num_edges:
        np.maximum.at(out_bytes, graph.edges[:, 0], graph.edge_bytes)
    pos = np.empty(n)
    pos[priority_order(graph, costs)] = np.arange(n) / max(n - 1, 1)
    f = np.zeros((n, NUM_NODE_FEATURES), dtype=np.float32)
    f[:, 0], f[:, 1] = tl / scale, bl / scale
    f[:, 2] = (cp - tl - bl) / scale
    f[:, 3], f[:, 4] = _rel(costs.fwd_time.mean(axis=1)), _rel(costs.bwd_time.mean(axis=1))
    f[:, 5], f[:, 6], f[:, 7] = _rel(out_bytes), _rel(graph.param_bytes), _rel(graph.act_bytes)
    f[:, 8], f[:, 9] = np.log1p(np.diff(pp)), np.log1p(np.diff(sp))
    f[:, 10] = pos
    f[:, 11] = needs_grad(graph)
    f[:, 12] = np.log1p(out_bytes * mean_inv / np.maximum(costs.fwd_time.mean(axis=1), 1e-12))
    f[:, 13] = (cp - tl - bl) <= 1e-9 * max(cp, 1e-30)
    return np.clip(f, -50.0, 50.0)


def reference_times(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *,
                    names: tuple[str, ...] = ONE_PASS, with_sim_eft: bool = True, with_rollout: bool = True,
                    seed: int = 0, extras: dict[str, Any] | None = None) -> dict[str, tuple[float, bool, np.ndarray]]:
    """``{heuristic: (step_time, feasible, device_of_node)}`` for the one-pass heuristics, ``sim_eft`` and
    ``eft_rollout`` (the latter only up to ``ROLLOUT_MAX_NODES`` nodes) and ``la_rule``. With ``extras`` given, it
    receives ``eft_rollout_regret`` (per-step regrets), ``ref_seconds`` (each heuristic's own seconds) and
    ``ref_calls`` (its simulator calls, counted as complete placements evaluated: 1 for a one-pass rule, one per
    tried device and decision for ``eft_rollout`` + 1 for its final placement, i.e. about N x D + 1)."""
    import time

    out: dict[str, tuple[float, bool, np.ndarray]] = {}
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    for name in names:
        t0 = time.perf_counter()
        p = baselines.get(name)(graph, costs, topology, budget=64, seed=seed)
        r = simulate(graph, costs, topology, p)
        out[name] = (r.step_time, r.feasible, np.asarray(p.device_of_node, dtype=np.int64))
        seconds[name], calls[name] = time.perf_counter() - t0, int(p.meta.get("sim_calls", 1) or 1)
    if with_sim_eft:
        t0 = time.perf_counter()
        dev = sim_eft(graph, costs, topology)
        r = simulate(graph, costs, topology, dev)
        out["sim_eft"] = (r.step_time, r.feasible, dev)
        seconds["sim_eft"], calls["sim_eft"] = time.perf_counter() - t0, 1
    if with_rollout and graph.num_nodes <= ROLLOUT_MAX_NODES:  # O(N^2 D)
        t0 = time.perf_counter()
        stats: dict[str, int] = {}
        dev, _, regret = eft_rollout(graph, costs, topology, stats=stats)
        if extras is not None:
            extras["eft_rollout_regret"] = regret
        r = simulate(graph, costs, topology, dev)
        out["eft_rollout"] = (r.step_time, r.feasible, dev)
        # every completed placement a call, + 1 for the final placement's simulation (as a policy's is counted)
        seconds["eft_rollout"], calls["eft_rollout"] = time.perf_counter() - t0, stats["completions"] + 1
    if with_rollout:  # at any size (at the policy's window: O(N W D^2) above FULL_WINDOW nodes)
        t0 = time.perf_counter()  # the rule the policy's lookahead feature is (argmin la_step): the bar it must clear
        dev, completions = la_rule_devices(graph, costs, topology)
        r = simulate(graph, costs, topology, dev)
        out["la_rule"] = (r.step_time, r.feasible, dev)
        seconds["la_rule"], calls["la_rule"] = time.perf_counter() - t0, completions + 1
    if extras is not None:
        extras["ref_seconds"], extras["ref_calls"] = seconds, calls
    return out


def best_of(refs: dict[str, tuple[float, bool, np.ndarray]], names: tuple[str, ...] = ONE_PASS) -> tuple[str, float]:
    """The best (feasible first, then fastest) of ``names`` among ``refs``: ``(name, step_time)``."""
    name = min((k for k in names if k in refs), key=lambda k: (not refs[k][1], refs[k][0]))
    return name, refs[name][0]


@dataclass(eq=False)
class ConstructiveTask:
    """One (graph, topology, costs) with what constructive placement needs of it, computed once."""

    graph: CompGraph
    topology: DeviceTopology
    costs: CostTable
    refs: dict[str, tuple[float, bool, np.ndarray]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    window: int = DEFAULT_WINDOW  # lookahead window of the state's features (``placement_rl.cost.window``)

    def __post_init__(self) -> None:
        self.scale = time_scale(self.graph, self.costs)
        self.x = node_features(self.graph, self.costs, scale=self.scale)

    @classmethod
    def build(cls, graph: CompGraph, topology: DeviceTopology, costs: CostTable, *, teachers: bool = True,
              **meta: Any) -> "ConstructiveTask":
        check_devices(topology)
        meta = dict(meta)
        refs = reference_times(graph, costs, topology, extras=meta) if teachers else {}
        return cls(graph, topology, costs, refs, meta)

    def state(self, episodes: int = 1) -> ScheduleState:
        """A fresh (reset) schedule state of ``episodes`` side by side, built once per count and kept."""
        key = ("state", int(episodes), self.window)
        if key not in self.meta:
            self.meta[key] = ScheduleState(self.graph, self.costs, self.topology, episodes=episodes,
                                           window=self.window)
        st = self.meta[key]
        st.reset()
        return st

    @property
    def reference(self) -> float:
        """The best one-pass heuristic's step time (min of HEFT, m-ETF, m-SCT, METIS): the reward's unit."""
        return best_of(self.refs)[1]

    def teacher(self, names: tuple[str, ...] = TEACHERS) -> tuple[str, np.ndarray]:
        """The best of the teachers on this task and its placement."""
        name = best_of(self.refs, names)[0]
        return name, self.refs[name][2]
