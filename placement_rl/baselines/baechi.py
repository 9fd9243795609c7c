"""Baechi's memory-constrained placers (Jeon et al., SoCC 2020): m-TOPO, m-ETF, m-SCT.

* m-TOPO: nodes in topological order fill devices one after another, each up to a fair memory share
  (total node memory / D + the largest node), never past the device's capacity.
* m-ETF: earliest task first list scheduling — repeatedly the (ready node, device) pair with the earliest
  start time, over devices that still have memory for the node.
* m-SCT: small communication time — m-ETF plus favourite children from the SCT linear program
  (Hanen & Munier): a device whose last node's favourite child is ready, and could start it no later than
  any other device, is kept for that child; only *urgent* nodes (whose inputs have reached every device by
  then) may take it first.

Node costs are fwd + bwd time; a cut edge costs its transfer twice (activation and gradient). Memory is
booked with ``MemoryLedger`` (the simulator's memory model, received tensors bounded above); the final
``repair`` pass fixes what the simulator still finds over capacity.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.sparse

from placement_rl.baselines.common import Problem, upward_rank
from placement_rl.baselines.memory import MemoryLedger, repair


# ------------------------------------------------------------------ m-TOPO
def m_topo(prob: Problem) -> np.ndarray:
    mem, cap = prob.node_mem, prob.capacity
    share = mem.sum() / prob.d + mem.max()
    limit = np.minimum(cap, share)
    dev = np.full(prob.n, -1, dtype=np.int64)
    ledger = MemoryLedger(prob)
    k = 0
    for u in prob.graph.topo_order.tolist():
        need = ledger.need(u, dev)
        while k < prob.d and ledger.load[k] + need[k] > limit[k]:
            k += 1
        # past the last device's share: the device with the most room left
        dev[u] = k if k < prob.d else int(np.argmax(cap - ledger.load - need))
        ledger.place(u, int(dev[u]), dev)
    return repair(prob, dev)


# ------------------------------------------------------------- m-ETF / m-SCT
def m_etf(prob: Problem) -> np.ndarray:
    return repair(prob, _list_schedule(prob, favourite=None))


def m_sct(prob: Problem) -> np.ndarray:
    return repair(prob, _list_schedule(prob, favourite=favourite_children(prob)))


def _list_schedule(prob: Problem, favourite: np.ndarray | None) -> np.ndarray:
    """ETF scheduling; with ``favourite`` (child per node, -1 for none) the SCT reservation rule applies."""
    g, n, d = prob.graph, prob.n, prob.d
    w = prob.node_time
    lat, bw = prob.costs.link_latency, prob.costs.link_bandwidth
    rank = upward_rank(prob)
    pp, pi, pe = g.pred_ptr, g.pred_idx, g.pred_eid
    sp, si = g.succ_ptr, g.succ_idx
    missing = np.diff(pp).astype(np.int64)
    dev = np.full(n, -1, dtype=np.int64)
    finish = np.zeros(n)
    avail = np.zeros(d)
    ledger = MemoryLedger(prob)
    last = np.full(d, -1, dtype=np.int64)
    data_ready = np.zeros((n, d))  # filled when a node becomes ready
    urgent = np.zeros(n)  # time the node's inputs have reached every device
    ready = [int(u) for u in np.flatnonzero(missing == 0)]
    for i in range(n):
        if not i & 31:
            prob.check_start()
        cand = np.array(ready, dtype=np.int64)
        raw = np.maximum(avail[None, :], data_ready[cand])
        est = raw if favourite is None else _reserve(raw, cand, last, favourite, urgent)
        u, k, start = _first_fitting(prob, ledger, dev, cand, est, raw, rank)
        dev[u], finish[u] = k, start + w[u, k]
        avail[k], last[k] = finish[u], u
        ledger.place(u, k, dev)
        ready.remove(u)
        for v in si[sp[u]:sp[u + 1]].tolist():
            missing[v] -= 1
            if missing[v] == 0:
                ready.append(v)
                _inputs_arrival(v, dev, finish, pp, pi, pe, g.edge_bytes, lat, bw, data_ready, urgent)
    return dev


def _first_fitting(prob: Problem, ledger: MemoryLedger, dev: np.ndarray, cand: np.ndarray, est: np.ndarray,
                   raw: np.ndarray, rank: np.ndarray) -> tuple[int, int, float]:
    """The earliest-starting (node, device) pair with memory; ties: higher upward rank, lower index.

    When no pair has memory, the candidate with the most room on its roomiest device (repaired later).
    """
    rows, cols = np.nonzero(np.isfinite(est))
    order = np.lexsort((cols, cand[rows], -rank[cand[rows]], est[rows, cols]))
    needs: dict[int, np.ndarray] = {}
    for q in order.tolist():
        r, k = int(rows[q]), int(cols[q])
        u = int(cand[r])
        if u not in needs:
            needs[u] = ledger.need(u, dev)
        if ledger.load[k] + needs[u][k] <= prob.capacity[k]:
            return u, k, float(est[r, k])
    best = (-np.inf, 0, 0, 0.0)
    for r, u in enumerate(cand.tolist()):
        room = prob.capacity - ledger.load - (needs[u] if u in needs else ledger.need(u, dev))
        k = int(np.argmax(room))
        if room[k] > best[0]:
            best = (room[k], u, k, float(raw[r, k]))
    return best[1], best[2], best[3]


def _inputs_arrival(v, dev, finish, pp, pi, pe, edge_bytes, lat, bw, data_ready, urgent) -> None:
    row = np.zeros(data_ready.shape[1])
    for p, e in zip(pi[pp[v]:pp[v + 1]].tolist(), pe[pp[v]:pp[v + 1]].tolist()):
        src = dev[p]
        arrive = finish[p] + 2.0 * (lat[src] + edge_bytes[e] / bw[src])
        arrive[src] = finish[p]
        np.maximum(row, arrive, out=row)
    data_ready[v] = row
    urgent[v] = row.max()


def _reserve(est: np.ndarray, cand: np.ndarray, last: np.ndarray, favourite: np.ndarray,
             urgent: np.ndarray) -> np.ndarray:
    """SCT rule: keep a device for its last node's favourite child when it is that child's best device."""
    est = est.copy()
    where = {int(u): r for r, u in enumerate(cand.tolist())}
    for k, u in enumerate(last.tolist()):
        if u < 0 or favourite[u] < 0 or int(favourite[u]) not in where:
            continue
        r = where[int(favourite[u])]
        t_fav = est[r, k]
        if not np.isfinite(t_fav) or t_fav > est[r].min():
            continue
        others = np.ones(len(cand), dtype=bool)
        others[r] = False
        others &= urgent[cand] > t_fav  # urgent nodes may still take the device
        est[others, k] = np.inf
    return est


def favourite_children(prob: Problem, threshold: float = 0.5) -> np.ndarray:
    """Favourite child per node (-1: none) from the SCT linear-programming relaxation.

    Variables ``[x_e (E), s_i (N), makespan]``; ``x_e = 1`` means edge ``e`` pays its communication.
    minimise makespan s.t. ``s_i + p_i + c_e x_e <= s_j`` for every edge ``e = (i, j)``; each node has at
    most one favourite child and one favourite parent (``sum x >= degree - 1``); ``s_i + p_i <= makespan``.
    Edges with ``x_e < threshold`` are favourite edges (at most one per parent and per child kept, the
    smallest ``x_e`` first).
    """
    g = prob.graph
    n, e = g.num_nodes, g.num_edges
    fav = np.full(n, -1, dtype=np.int64)
    if e == 0:
        return fav
    p = prob.node_time.mean(axis=1)
    c = 2.0 * prob.mean_comm
    src, dst = g.edges[:, 0], g.edges[:, 1]
    nv = e + n + 1
    ar_e = np.arange(e)
    rows = [np.repeat(ar_e, 3)]
    cols = [np.stack([e + src, e + dst, ar_e], axis=1).ravel()]
    vals = [np.tile([1.0, -1.0, 0.0], e)]
    vals[0][2::3] = c
    rhs = [-p[src]]
    r0 = e
    out_deg, in_deg = np.bincount(src, minlength=n), np.bincount(dst, minlength=n)
    for key, deg in ((src, out_deg), (dst, in_deg)):
        rows.append(r0 + key)
        cols.append(ar_e)
        vals.append(-np.ones(e))
        rhs.append(1.0 - deg.astype(np.float64))
        r0 += n
    ar_n = np.arange(n)
    rows += [r0 + ar_n, r0 + ar_n]
    cols += [e + ar_n, np.full(n, nv - 1)]
    vals += [np.ones(n), -np.ones(n)]
    rhs.append(-p)
    a_ub = scipy.sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                   shape=(r0 + n, nv))
    obj = np.zeros(nv)
    obj[-1] = 1.0
    bounds = [(0.0, 1.0)] * e + [(0.0, None)] * (n + 1)
    res = scipy.optimize.linprog(obj, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    x = res.x[:e] if res.status == 0 else 1.0 - prob.graph.edge_bytes / max(prob.graph.edge_bytes.max(), 1.0)
    has_parent = np.zeros(n, dtype=bool)
    for k in np.argsort(x, kind="stable").tolist():
        if x[k] >= threshold:
            break
        i, j = int(src[k]), int(dst[k])
        if fav[i] < 0 and not has_parent[j]:
            fav[i], has_parent[j] = j, True
    return fav
