"""HEFT (Topcuoglu et al., 2002): upward-rank list scheduling with earliest-finish-time device choice.

The training step is scheduled as one task per node whose cost on device ``d`` is its fwd + bwd time, and a
cut edge costs its transfer twice (activation forward, gradient backward) on the link between the two
devices — the same quantities the simulator charges, lumped per node. Nodes go in decreasing upward rank
(ties by topological position, so parents always precede children); each is put on the device giving the
earliest finish time, using insertion into idle gaps of the device's timeline. Devices whose memory
(``MemoryLedger``: the simulator's memory model, received tensors bounded above) cannot take the node are
skipped; if none can, the one with the most free memory takes it and the final ``repair`` sorts it out.
"""

from __future__ import annotations

import bisect

import numpy as np

from placement_rl.baselines.common import Problem, topo_positions, upward_rank
from placement_rl.baselines.memory import MemoryLedger, repair


def heft_devices(prob: Problem) -> np.ndarray:
    g, n, d = prob.graph, prob.n, prob.d
    rank = upward_rank(prob)
    order = np.lexsort((topo_positions(g), -rank))
    w = prob.node_time
    lat, bw = prob.costs.link_latency, prob.costs.link_bandwidth
    ledger = MemoryLedger(prob)
    dev = np.full(n, -1, dtype=np.int64)
    finish = np.zeros(n)
    # per device: sorted busy intervals (start list, end list)
    starts: list[list[float]] = [[] for _ in range(d)]
    ends: list[list[float]] = [[] for _ in range(d)]
    pp, pi, pe = g.pred_ptr, g.pred_idx, g.pred_eid
    for i, u in enumerate(order.tolist()):
        if not i & 31:
            prob.check_start()
        preds, eids = pi[pp[u]:pp[u + 1]], pe[pp[u]:pp[u + 1]]
        # data-ready time of u on every device
        ready = np.zeros(d)
        for p, e in zip(preds.tolist(), eids.tolist()):
            src = dev[p]
            arrive = finish[p] + 2.0 * (lat[src] + g.edge_bytes[e] / bw[src])
            arrive[src] = finish[p]
            np.maximum(ready, arrive, out=ready)
        need = ledger.need(u, dev)
        fits = ledger.load + need <= prob.capacity
        if not fits.any():  # the device with the most room left
            room = prob.capacity - ledger.load - need
            fits = room >= room.max()
        best, best_dev, best_start = np.inf, -1, 0.0
        for k in np.flatnonzero(fits).tolist():
            start = _earliest_gap(starts[k], ends[k], ready[k], w[u, k])
            if start + w[u, k] < best:
                best, best_dev, best_start = start + w[u, k], k, start
        dev[u], finish[u] = best_dev, best
        ledger.place(u, best_dev, dev)
        pos = bisect.bisect_left(starts[best_dev], best_start)
        starts[best_dev].insert(pos, best_start)
        ends[best_dev].insert(pos, best)
    return dev


def _earliest_gap(starts: list[float], ends: list[float], ready: float, dur: float) -> float:
    """Earliest start >= ``ready`` of a ``dur``-long slot between the busy intervals of one device."""
    t = ready
    k = bisect.bisect_right(ends, ready)  # intervals ending after ``ready``
    for j in range(k, len(starts)):
        if t + dur <= starts[j]:
            return t
        t = max(t, ends[j])
    return t


def heft(prob: Problem) -> np.ndarray:
    return repair(prob, heft_devices(prob))
