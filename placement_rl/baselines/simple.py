"""The simplest placers: best single device, round robin, best of k random placements.

* ``single_device``: every node on one device; devices whose memory estimate fits are simulated fastest
  first (as many as the budget allows) and the best is kept. This is the reference every speed-up is
  measured against. When no device fits, the least-overfull one is returned (infeasible, stated in meta).
* ``round_robin``: the topological order is dealt to the devices in *contiguous* chunks, chunk sizes
  proportional to each device's speed (balanced compute). Dealing nodes by modulo would cut almost every
  edge, so contiguous chunks are the sensible reading of "round robin" for a dataflow graph.
* ``random``: best of ``k = budget`` uniform random placements (at least one is drawn).
"""

from __future__ import annotations

import numpy as np

from placement_rl.baselines.common import Problem
from placement_rl.baselines.memory import REPAIR_CALLS, repair


def single_device(prob: Problem) -> np.ndarray:
    n = prob.n
    est_time = prob.node_time.sum(axis=0)
    need = prob.node_mem.sum()
    fits = need <= prob.capacity
    # fitting devices fastest first, then the others by how little they overflow
    order = np.lexsort((est_time, np.where(fits, 0.0, need - prob.capacity), ~fits))
    best_dev, best_key = int(order[0]), None
    for k in order.tolist():
        s = prob.score(np.full(n, k, dtype=np.int64))
        if s is None:
            break
        if best_key is None or s.key < best_key:
            best_dev, best_key = k, s.key
    return np.full(n, best_dev, dtype=np.int64)


def round_robin(prob: Problem) -> np.ndarray:
    g, d = prob.graph, prob.d
    speed = 1.0 / np.maximum(prob.node_time.sum(axis=0), 1e-30)
    share = speed / speed.sum()
    order = g.topo_order
    dev = np.empty(prob.n, dtype=np.int64)
    # node u (k-th in topo order) goes to the device whose cumulative share covers u's midpoint
    work = prob.node_time[order].mean(axis=1)
    if work.sum() <= 0:
        work = np.ones_like(work)
    mid = (np.cumsum(work) - 0.5 * work) / work.sum()
    bounds = np.cumsum(share)
    dev[order] = np.minimum(np.searchsorted(bounds, mid, side="right"), d - 1)
    return repair(prob, dev)


def random_placement(prob: Problem) -> np.ndarray:
    """Draws until the budget is spent, keeping a few calls for ``repair`` while nothing drawn fits."""
    reserve = min(REPAIR_CALLS, prob.budget // 4)
    best = prob.rng.integers(0, prob.d, size=prob.n)
    s = prob.score(best)
    best_key = None if s is None else s.key
    for _ in range(prob.budget - 1):  # k = budget draws in all
        if best_key is None or prob.left <= (0 if best_key[0] == 0 else reserve):
            break
        cand = prob.rng.integers(0, prob.d, size=prob.n)
        s = prob.score(cand)
        if s is not None and s.key < best_key:
            best, best_key = cand, s.key
    return repair(prob, best)
