"""Lower bounds on the step time of any op placement: what "room" is measured against.

A search that finds nothing better is not evidence that nothing better exists; a bound is. For a (graph, costs,
topology) every placement's simulated step time (forward, then backward in reverse, one op at a time per device,
transfers >= 0) is at least:

* ``path``: the longest path of the DAG with every node at its fastest device and transfers free, forward and
  backward (a path's forwards run one after another, then its backwards in reverse: ``sum min fwd + sum min bwd``
  over the path). It covers the longest single node as well.
* ``work``: the fractional assignment bound, the optimum of the LP ``min T`` s.t. every node is split over the
  devices (``sum_d x_vd = 1``) and every device's share of forward + backward time ``sum_v x_vd t_vd <= T``
  (HiGHS through ``scipy.optimize.linprog``; with D identical devices it is the total work over D). Above
  ``LP_MAX_VARS`` variables, the total of each node's fastest time over D (weaker, still valid).
* ``exact``: on problems small enough to enumerate (``search.count_placements`` up to ``exact_budget``
  placements), the optimum itself (``search.exhaustive``): the bound is then tight.

``lower_bound(...)`` returns a ``Bound`` with the best of these (``value``) and each part. Memory limits are
relaxed (a bound of the relaxed problem is a bound of the real one); the exact part honours them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from placement_rl.cost.schedule import longest_path
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

LP_MAX_VARS = 400_000  # N x D above which the work bound is the closed form instead of the LP


@dataclass(frozen=True)
class Bound:
    value: float  # the best (largest) lower bound, seconds
    parts: dict[str, float] = field(default_factory=dict)  # path, work, exact (where computed)
    exact: bool = False  # the value is the optimum (exhaustive enumeration)

    def gap(self, step_time: float) -> float:
        """How far ``step_time`` is above the bound (``step_time / value - 1``): the most any placement can gain
        is ``1 - value / step_time``."""
        return float(step_time) / self.value - 1.0 if self.value > 0 else float("inf")


def path_bound(graph: CompGraph, costs: CostTable) -> float:
    """Longest path of (fastest forward + fastest backward) per node, transfers free."""
    return longest_path(graph, costs.fwd_time.min(axis=1) + costs.bwd_time.min(axis=1))


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
    from scipy.sparse import coo_matrix, hstack, vstack

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


def lower_bound(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, exact_budget: int = 0) -> Bound:
    """The best lower bound on any placement's step time (module doc); ``exact_budget`` > 0 enumerates problems
    of at most that many placements (after symmetry) for the optimum."""
    parts = {"path": path_bound(graph, costs), "work": work_bound(costs)}
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
    return Bound(max(parts.values()), parts)


__all__ = ["Bound", "lower_bound", "path_bound", "work_bound"]
