"""Lower bounds on the step time of any op placement: what "room" is measured against.

A search that finds nothing better is not evidence that nothing better exists; a bound is. For a (graph, costs,
topology) every placement's simulated step time (forward, then backward in reverse, one op at a time per device,
transfers >= 0) is at least:

* ``path``: the longest path of the DAG with every node at its fastest device and transfers free, forward and
  backward (a path's forwards run one after another, then its backwards in reverse: ``sum min fwd + sum min bwd``
  over the path, the backward chain going back only through nodes whose output needs a gradient, as in the
  simulator). It covers the longest single node as well.
* ``work``: the fractional assignment bound, the optimum of the LP ``min T`` s.t. every node is split over the
  devices (``sum_d x_vd = 1``) and every device's share of forward + backward time ``sum_v x_vd t_vd <= T``
  (HiGHS through ``scipy.optimize.linprog``; with D identical devices it is the total work over D). Above
  ``LP_MAX_VARS`` variables, the total of each node's fastest time over D (weaker, still valid).
* ``milp`` (given ``milp_seconds``): the dual bound HiGHS proves in that time (``scipy.optimize.milp``) for the
  problem relaxed to: every node on one device (binary), each device's forward + backward time ``<= T``, along
  every edge ``F_v >= F_u + f_v + c_u y_uv`` (``F``: a forward chain's end, ``y_uv >= x_ud - x_vd``: the edge
  cut), each backward after its forward, ``B_v >= F_v + b_v``, and back along every edge whose source's output needs
  a gradient ``B_u >= B_v + b_u + c_u y_uv``, ``T >= B_v`` (a chain of forward + backward per node charged a node
  whose output needs none with its consumers' backward), where ``c_u`` is the least time anything ``u`` sends to
  another device can arrive after ``u`` ends (``cut_costs``: its first chunk carries one out-edge's bytes, over the
  fastest link for them; 0 where an out-edge carries no bytes, as nothing is sent along it). It counts
  what the others ignore, the transfers a spread placement waits on, but not each device running one op at a time
  nor the links' queues, so the relaxation's own optimum can sit far below any real placement (on the six dataflow
  pairs with slow links of ``scripts/probe_learning_comm.py`` its solutions reach 0.33-0.50 x ``la_rule``, while
  search reaches 0.64-0.87). On that probe's 12 pairs, at 30 s a pair, the dual bound is 1.000-1.103 x the path and
  work bounds (above 1.01 on 2).
* ``blocks``: the best chain of nodes ``b_0 -> b_1 -> ... -> b_m`` (each a descendant of the last, all but the last
  with a gradient) of ``pre(b_0) + sum_i (f + b)(b_i) + sum_i (F_i + B_i)``: ``pre`` the longest forward path
  before ``b_0``, ``F_i`` the least time between ``b_i``'s forward end and ``b_{i+1}``'s forward start. Every node
  of the block between them (a descendant of one, an ancestor of the other) runs in that interval; those on
  ``b_i``'s device (home) one at a time; those away (``R``) on the other D - 1 devices, each behind a transfer on
  its path from ``b_i`` and, with ``b_{i+1}`` at home, another on its path back; with ``b_{i+1}`` away every
  path between them crosses one. So ``F_i >= min(case home, case away)``, each case at least ``min over R`` of
  ``max(the home set's work on one device, the block's work over D, max over R of (the longest path through v)
  + 2c (home) or + c (away))`` (a set R whose longest path is node v's leaves at home every node with a longer
  one: the nodes in order of their paths, a sort, give each v's term), and the away case at least the longest
  path + c; ``c`` the least ``cut_costs`` over the block and ``b_i``. ``B_i`` is the same for the
  backward in reverse (``b_{i+1}``'s device at home) over the nodes whose gradient paths link the two (an output
  needing no gradient does not wait for its consumers' backward). Times at each node's fastest device, the home
  set's on one device (per class of equal devices). With no node between two chain nodes the term is 0, so the
  chain is at least the path bound; on chains of fork-join blocks whose transfers cost more than their branches
  (transformer layers on slow links) it charges each block its serial work, which the path, work and milp parts
  do not. Chain steps stay within ``BLOCK_SPAN`` positions of a topological order (O(N span^2); a smaller span on
  graphs over ~2,000 nodes; fewer steps only loosen it).
* ``cp`` (given ``cp_seconds``; ``bounds_cp``): the simulator's schedule as a CP-SAT model, relaxed only in what a
  chunk weighs and in memory: each device running its ops in the priority order, every transfer a spread
  placement waits on, each link one transfer at a time. Its proven bound after that time. On 300 problems small
  enough to enumerate it met the optimum on all; it proves bounds in seconds up to ~100 nodes on 4 devices and no
  more than the other parts on several hundred nodes.
* ``exact``: on problems small enough to enumerate (``search.count_placements`` up to ``exact_budget``
  placements), the optimum itself (``search.exhaustive``): the bound is then tight.

``lower_bound(...)`` returns a ``Bound`` with the best of these (``value``) and each part. Memory limits are
relaxed (a bound of the relaxed problem is a bound of the real one); the exact part honours them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from placement_rl.baselines.transfer_floor import cut_costs
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph, _csr
from placement_rl.topology import DeviceTopology

LP_MAX_VARS = 400_000  # N x D above which the work bound is the closed form instead of the LP
MILP_MAX_VARS = 40_000  # N x D above which the milp part is skipped (its model alone would take seconds to build)
BLOCK_SPAN = 256  # the blocks part's chain steps, in positions of a topological order (module doc) ...
BLOCK_WORK = 1.5e8  # ... fewer on very large graphs, so that N x span^2 stays under this (a few seconds)


@dataclass(frozen=True)
class Bound:
    value: float  # the best (largest) lower bound, seconds
    parts: dict[str, float] = field(default_factory=dict)  # path, work, blocks, milp, exact (where computed)
    exact: bool = False  # the value is the optimum (exhaustive enumeration)
    cp_placement: np.ndarray | None = field(default=None, repr=False, compare=False)  # the cp part's own solution
    cp_note: str = field(default="", compare=False)  # the cp part's: CP-SAT did not run, or proved and found nothing

    def gap(self, step_time: float) -> float:
        """How far ``step_time`` is above the bound (``step_time / value - 1``): the most any placement can gain
        is ``1 - value / step_time``."""
        return float(step_time) / self.value - 1.0 if self.value > 0 else float("inf")


def path_bound(graph: CompGraph, costs: CostTable) -> float:
    """The longest chain of the step's precedences at each node's fastest device, transfers free: forwards along the
    edges; a node's backward after its own forward and, where its output needs a gradient (as in the simulator),
    after its consumers' backward. (The longest path of forward + backward per node charged a node whose output
    needs no gradient with its consumers' backward: 4.0 over a placement of step 3.0.)"""
    from placement_rl.cost.modes import mode_of
    from placement_rl.cost.resolve import needs_grad

    n = graph.num_nodes
    if n == 0:
        return 0.0
    f = np.asarray(costs.fwd_time, dtype=np.float64).min(axis=1)
    b = np.asarray(costs.bwd_time, dtype=np.float64).min(axis=1)
    grad = np.zeros(n, dtype=bool) if mode_of(costs) == "inference" else needs_grad(graph).astype(bool)
    order = graph.topo_order.tolist()
    fwd_end = f.copy()
    pp, pi = graph.pred_ptr, graph.pred_idx
    for v in order:
        if pp[v + 1] > pp[v]:
            fwd_end[v] = f[v] + fwd_end[pi[pp[v]:pp[v + 1]]].max()
    bwd_end = fwd_end + b
    sp, si = graph.succ_ptr, graph.succ_idx
    for v in reversed(order):
        if grad[v] and sp[v + 1] > sp[v]:
            bwd_end[v] = max(fwd_end[v], float(bwd_end[si[sp[v]:sp[v + 1]]].max())) + b[v]
    return float(bwd_end.max())


def work_bound(costs: CostTable) -> float:
    """The fractional assignment LP (see the module doc); its closed-form relaxation on very large problems."""
    t = np.asarray(costs.fwd_time + costs.bwd_time, dtype=np.float64)
    n, d = t.shape
    simple = float(t.min(axis=1).sum()) / d
    if n == 0 or d == 1:
        return float(t.sum())
    if n * d > LP_MAX_VARS:
        return simple
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, hstack

    scale = float(t.max()) or 1.0
    ts = t / scale
    nv = n * d  # x[v, d] row-major, then T
    rows = np.repeat(np.arange(n), d)
    eq = coo_matrix((np.ones(nv), (rows, np.arange(nv))), shape=(n, nv))
    a_eq = hstack([eq, coo_matrix((n, 1))]).tocsr()
    cols = np.arange(nv)
    dev = cols % d
    ub = coo_matrix((ts.reshape(-1), (dev, cols)), shape=(d, nv))
    a_ub = hstack([ub, coo_matrix(-np.ones((d, 1)))]).tocsr()
    c = np.zeros(nv + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(d), A_eq=a_eq, b_eq=np.ones(n), bounds=(0, None), method="highs")
    if res.status != 0:
        return simple
    # HiGHS' optimum is exact to its tolerances: take a hair off so float error never lifts the bound above T*
    return max(simple, float(res.fun) * scale * (1.0 - 1e-7))


def milp_bound(graph: CompGraph, costs: CostTable, topology: DeviceTopology, seconds: float) -> float | None:
    """The ``milp`` part (module doc): HiGHS' dual bound after at most ``seconds``; None when it proved nothing."""
    from scipy.optimize import Bounds as Box, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    from placement_rl.cost.modes import mode_of
    from placement_rl.cost.resolve import needs_grad

    n, d = graph.num_nodes, topology.num_devices
    tf = np.asarray(costs.fwd_time, dtype=np.float64)
    tb = np.asarray(costs.bwd_time, dtype=np.float64)
    scale = float((tf + tb).sum(axis=1).max()) or 1.0
    tf, tb = tf / scale, tb / scale
    t = tf + tb
    grad = np.zeros(n, dtype=bool) if mode_of(costs) == "inference" else needs_grad(graph).astype(bool)
    cu = cut_costs(graph, costs, topology) / scale
    e = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    m = len(e)
    eg = np.flatnonzero(grad[e[:, 0]]) if m else np.zeros(0, dtype=np.int64)  # edges a gradient comes back along
    nx = n * d  # columns: x[v, d] row-major | y[e] | F[v] (forward end) | B[v] (backward end) | T
    col_y, col_f, col_b, col_t = nx, nx + m, nx + m + n, nx + m + 2 * n
    rows, cols, vals, lo, hi = [], [], [], [], []

    def block(r0: int, r: np.ndarray, c: np.ndarray, v: np.ndarray) -> None:  # entries of rows r0 + r
        rows.append(r0 + r)
        cols.append(c)
        vals.append(v)

    def sides(low: np.ndarray, high: np.ndarray) -> None:  # the next rows' bounds
        lo.append(low)
        hi.append(high)

    def times(r0: int, r: np.ndarray, nodes: np.ndarray, table: np.ndarray) -> None:  # - sum_k table[v, k] x[v, k]
        block(r0, np.repeat(r, d), (nodes[:, None] * d + np.arange(d)).reshape(-1), -table[nodes].reshape(-1))

    r0 = 0
    v_d = np.arange(nx)
    rv = np.arange(n)
    block(r0, v_d // d, v_d, np.ones(nx))  # sum_d x[v, d] = 1
    sides(np.ones(n), np.ones(n))
    r0 += n
    block(r0, v_d % d, v_d, t.reshape(-1))  # load_d - T <= 0
    block(r0, np.arange(d), np.full(d, col_t), -np.ones(d))
    sides(np.full(d, -np.inf), np.zeros(d))
    r0 += d
    if m:
        ek = np.arange(m * d)  # y_e - x[u, k] + x[v, k] >= 0
        ee, kk = ek // d, ek % d
        block(r0, ek, col_y + ee, np.ones(m * d))
        block(r0, ek, e[ee, 0] * d + kk, -np.ones(m * d))
        block(r0, ek, e[ee, 1] * d + kk, np.ones(m * d))
        sides(np.zeros(m * d), np.full(m * d, np.inf))
        r0 += m * d
        re = np.arange(m)  # F_v - F_u - c_u y_e - tf_v(x) >= 0
        block(r0, re, col_f + e[:, 1], np.ones(m))
        block(r0, re, col_f + e[:, 0], -np.ones(m))
        block(r0, re, col_y + re, -np.minimum(cu[e[:, 0]], 1e6))
        times(r0, re, e[:, 1], tf)
        sides(np.zeros(m), np.full(m, np.inf))
        r0 += m
    if eg.size:  # B_u - B_v - c_u y_e - tb_u(x) >= 0 where u's output needs a gradient (the simulator's rule)
        rg = np.arange(eg.size)
        block(r0, rg, col_b + e[eg, 0], np.ones(eg.size))
        block(r0, rg, col_b + e[eg, 1], -np.ones(eg.size))
        block(r0, rg, col_y + eg, -np.minimum(cu[e[eg, 0]], 1e6))
        times(r0, rg, e[eg, 0], tb)
        sides(np.zeros(eg.size), np.full(eg.size, np.inf))
        r0 += eg.size
    block(r0, rv, col_f + rv, np.ones(n))  # F_v >= tf_v(x)
    times(r0, rv, rv, tf)
    block(r0 + n, rv, col_b + rv, np.ones(n))  # B_v >= F_v + tb_v(x)
    block(r0 + n, rv, col_f + rv, -np.ones(n))
    times(r0 + n, rv, rv, tb)
    block(r0 + 2 * n, rv, np.full(n, col_t), np.ones(n))  # T >= B_v
    block(r0 + 2 * n, rv, col_b + rv, -np.ones(n))
    sides(np.zeros(3 * n), np.full(3 * n, np.inf))
    r0 += 3 * n
    nv = col_t + 1
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r0, nv)).tocsr()
    c = np.zeros(nv)
    c[col_t] = 1.0
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    upper = np.full(nv, np.inf)
    upper[:col_f] = 1.0
    res = milp(c, constraints=LinearConstraint(a, np.concatenate(lo), np.concatenate(hi)), integrality=integrality,
               bounds=Box(np.zeros(nv), upper), options={"time_limit": float(seconds), "disp": False})
    bound = getattr(res, "mip_dual_bound", None)
    if bound is None or not np.isfinite(bound) or bound <= 0:
        return None
    # HiGHS' bound holds to its tolerances (its primal feasibility tolerance, 1e-7 on rows of unit scale): a margin
    # of 1e-6 was too little (a 4-node optimum 256.72844, the bound 256.72919), so 1e-5 comes off
    return float(bound) * scale * (1.0 - 1e-5)


def block_bound(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, span: int = BLOCK_SPAN) -> float:
    """The ``blocks`` part (module doc): the best chain of blocks, steps within ``span`` topological positions."""
    from placement_rl.baselines._block_kernel import chain_of_blocks
    from placement_rl.cost.modes import mode_of
    from placement_rl.cost.resolve import needs_grad

    n = graph.num_nodes
    if n == 0:
        return 0.0
    order = np.asarray(graph.topo_order, dtype=np.int64)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    e = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    src, dst = pos[e[:, 0]], pos[e[:, 1]]
    succ_ptr, succ_idx, _ = _csr(n, src, dst)  # the graph's own adjacency, in topological positions
    pred_ptr, pred_idx, _ = _csr(n, dst, src)
    fb = np.concatenate([np.asarray(costs.fwd_time, dtype=np.float64), np.asarray(costs.bwd_time, dtype=np.float64)])
    cls = np.unique(fb, axis=1)  # devices of one speed class have the same columns: keep one of each
    f, b = np.ascontiguousarray(cls[:n][order]), np.ascontiguousarray(cls[n:][order])
    c = cut_costs(graph, costs, topology)[order]
    grad = np.zeros(n, dtype=np.bool_) if mode_of(costs) == "inference" else needs_grad(graph).astype(np.bool_)[order]
    span = int(max(1, min(span, n, max(16, (BLOCK_WORK / n) ** 0.5))))
    got = chain_of_blocks(n, span, topology.num_devices, succ_ptr, succ_idx, pred_ptr, pred_idx, f, b, c, grad)
    # sums of floats in another order than the simulator's: take a hair off so rounding never lifts it above T*
    return float(got) * (1.0 - 1e-9)


def relaxed_start(graph: CompGraph, costs: CostTable, topology: DeviceTopology) -> np.ndarray:
    """The ``cp`` part's default start: ``sim_eft``'s placement; where the model exceeds all devices' memory together
    (which ``sim_eft`` refuses), ``sim_eft``'s with every device holding the whole model (memory ignored, as the
    bounds relax it)."""
    from placement_rl.baselines.eft import holding, sim_eft_devices
    from placement_rl.cost.memory import pinned_memory

    need = float(pinned_memory(graph, costs).sum())
    if need > float(topology.array("memory_bytes").sum()):
        topology = holding(topology, need)
    return sim_eft_devices(graph, costs, topology)


def lower_bound(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, exact_budget: int = 0,
                milp_seconds: float = 0.0, blocks: bool = True, cp_seconds: float = 0.0,
                cp_start: np.ndarray | None = None) -> Bound:
    """The best lower bound on any placement's step time (module doc); ``exact_budget`` > 0 enumerates problems
    of at most that many placements (after symmetry) for the optimum; ``milp_seconds`` > 0 adds the ``milp`` part
    (up to ``MILP_MAX_VARS`` node-device pairs); ``blocks`` the blocks part; ``cp_seconds`` > 0 the ``cp`` part
    (``bounds_cp``: CP-SAT, OR-Tools needed; ``cp_start`` a placement to start it from, else ``sim_eft``'s, with
    memory ignored where the model exceeds all devices' memory together: ``relaxed_start``)."""
    parts = {"path": path_bound(graph, costs), "work": work_bound(costs)}
    n, d = graph.num_nodes, topology.num_devices
    cp_placement, cp_note = None, ""
    if blocks and n > 1:
        parts["blocks"] = block_bound(graph, costs, topology)
    if milp_seconds > 0 and d > 1 and 0 < n * d <= MILP_MAX_VARS:
        got = milp_bound(graph, costs, topology, milp_seconds)
        if got is not None:
            parts["milp"] = got
    if cp_seconds > 0 and d > 1 and n > 1:
        from placement_rl.baselines.bounds_cp import cp_bound
        from placement_rl.baselines.common import Problem

        start = relaxed_start(graph, costs, topology) if cp_start is None else np.asarray(cp_start, dtype=np.int64)
        upper = Problem(graph, costs, topology, budget=2, seed=0).score(start).step_time
        if upper > max(parts.values()):  # else that start is optimal already (a graph of zero-time ops: upper 0)
            got = cp_bound(graph, costs, topology, upper=upper, seconds=cp_seconds, hint=start,
                           lower=max(parts.values()))
            parts["cp"] = got.bound
            cp_placement, cp_note = got.placement, got.note
    if exact_budget > 0 and topology.num_devices > 1:
        from placement_rl.baselines.common import Problem
        from placement_rl.baselines.search import count_placements, device_classes, exhaustive

        prob = Problem(graph, costs, topology, budget=int(exact_budget) + 1, seed=0)
        cls = device_classes(prob)
        sizes = [int((cls == c).sum()) for c in sorted(set(cls.tolist()))]
        if count_placements(graph.num_nodes, sizes, cap=exact_budget) <= exact_budget:
            best = prob.score(exhaustive(prob))
            if best is not None and best.feasible:
                parts["exact"] = best.step_time
                return Bound(best.step_time, parts, exact=True)
    return Bound(max(parts.values()), parts, cp_placement=cp_placement, cp_note=cp_note)


__all__ = ["Bound", "block_bound", "cut_costs", "lower_bound", "milp_bound", "path_bound", "relaxed_start",
           "work_bound"]
