"""Numba kernel of ``memory.fit``: single-node moves that take a placement under every device's memory.

Memory per device is the simulator's (``cost.simulate``): the bytes each of its nodes pins, plus, per producer on
another device, the largest tensor that producer sends it (``recv[u, k]``, kept for backward). A move of node ``i``
from ``s`` to ``t`` changes ``s``'s and ``t``'s pinned bytes, what ``i`` sends (its own row of ``recv``) and what
each of its producers sends (their rows); the kernel recomputes those rows exactly, so the load it keeps equals the
simulator's peak memory after every move.
"""

from __future__ import annotations

import numpy as np
from numba import njit

STAR_MAX = 16  # the most nodes a star move carries (a node with hundreds of neighbours: skipped)
SHRINK = 0.25  # weight of the total bytes held against the bytes over capacity in a move's gain


@njit(cache=True, nogil=True)
def _row(u, du, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, out):
    """``out[k]``: the largest tensor ``u`` (on ``du``) sends device ``k`` (0 where none, and at ``du``)."""
    out[:] = 0.0
    for q in range(succ_ptr[u], succ_ptr[u + 1]):
        k = dev[succ_idx[q]]
        if k != du:
            b = edge_bytes[succ_eid[q]]
            if b > out[k]:
                out[k] = b


@njit(cache=True, nogil=True)
def received(dev, succ_ptr, succ_idx, succ_eid, edge_bytes, nd):
    n = dev.shape[0]
    recv = np.zeros((n, nd))
    for u in range(n):
        _row(u, dev[u], dev, succ_ptr, succ_idx, succ_eid, edge_bytes, recv[u])
    return recv


@njit(cache=True, nogil=True)
def _over(load, cap):
    o = 0.0
    for k in range(load.shape[0]):
        if load[k] > cap[k]:
            o += load[k] - cap[k]
    return o


@njit(cache=True, nogil=True)
def _gain(load, delta, cap):
    """What a move with load changes ``delta`` removes: bytes over capacity, and ``SHRINK`` of the bytes all devices
    hold (fewer received tensors), the overflow never growing (0 then)."""
    over, total = 0.0, 0.0
    for k in range(load.shape[0]):
        a, b = load[k], load[k] + delta[k]
        over += (a - cap[k] if a > cap[k] else 0.0) - (b - cap[k] if b > cap[k] else 0.0)
        total -= delta[k]
    if over < 0.0:
        return 0.0
    return over + SHRINK * total


@njit(cache=True, nogil=True)
def _rate(load, delta, cap, cost):
    """A move's added time per byte of overflow it removes (``_gain``); inf when it removes none."""
    gain = _gain(load, delta, cap)
    return cost / gain if gain > 0.0 else np.inf


@njit(cache=True, nogil=True)
def _star(i, s, dev, pred_ptr, pred_idx, succ_ptr, succ_idx, members):
    """``members[:m]``: node ``i`` and its neighbours on its device ``s`` (one listed twice moves once); returns m."""
    m = 0
    members[m] = i
    m += 1
    for q in range(pred_ptr[i], pred_ptr[i + 1]):
        if dev[pred_idx[q]] == s:
            members[m] = pred_idx[q]
            m += 1
    for q in range(succ_ptr[i], succ_ptr[i + 1]):
        if dev[succ_idx[q]] == s:
            members[m] = succ_idx[q]
            m += 1
    return m


@njit(cache=True, nogil=True)
def _affected(members, m, pred_ptr, pred_idx, seen, stamp, out):
    """The producers whose rows a move of ``members[:m]`` changes (the members and their producers), once each."""
    c = 0
    for j in range(m):
        v = members[j]
        if seen[v] != stamp:
            seen[v] = stamp
            out[c] = v
            c += 1
        for q in range(pred_ptr[v], pred_ptr[v + 1]):
            p = pred_idx[q]
            if seen[p] != stamp:
                seen[p] = stamp
                out[c] = p
                c += 1
    return c


@njit(cache=True, nogil=True)
def _member(u, members, m):
    for j in range(m):
        if members[j] == u:
            return True
    return False


@njit(cache=True, nogil=True)
def _shift(members, m, s, t, dev, pinned, node_time, acc):
    """Put the ``members[:m]`` that sit on ``s`` on ``t`` (``dev``), their pinned bytes moved in ``acc`` (a load or
    its change); returns the compute time the move adds."""
    cost = 0.0
    for j in range(m):
        v = members[j]
        if dev[v] == s:
            dev[v] = t
            acc[s] -= pinned[v]
            acc[t] += pinned[v]
            cost += node_time[v, t] - node_time[v, s]
    return cost


@njit(cache=True, nogil=True)
def _rate_of(members, m, aff, c, s, t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap, node_time,
             inv_bw, recv, load, row, delta):
    """The rate (``_rate``) of moving ``members[:m]`` (on ``s``; one listed twice moves once) to ``t``: the load
    changes of every device and the added time (compute, and each changed received tensor's bytes x ``inv_bw``),
    the rows of the ``aff[:c]`` producers recomputed with the members on ``t``; ``dev`` is left as it was."""
    delta[:] = 0.0
    cost = _shift(members, m, s, t, dev, pinned, node_time, delta)
    for j in range(c):
        u = aff[j]
        _row(u, dev[u], dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
        was = s if dev[u] == t and _member(u, members, m) else dev[u]
        for k in range(delta.shape[0]):
            delta[k] += row[k] - recv[u, k]
            cost += row[k] * inv_bw[dev[u], k] - recv[u, k] * inv_bw[was, k]
    for j in range(m):
        dev[members[j]] = s
    return _rate(load, delta, cap, cost)


@njit(cache=True, nogil=True)
def _apply(members, m, aff, c, s, t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, node_time, recv, load,
           row):
    """Move ``members[:m]`` from ``s`` to ``t`` in place (``dev``, ``load``, the ``aff[:c]`` rows of ``recv``)."""
    _shift(members, m, s, t, dev, pinned, node_time, load)
    for j in range(c):
        u = aff[j]
        _row(u, dev[u], dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
        for k in range(load.shape[0]):
            load[k] += row[k] - recv[u, k]
            recv[u, k] = row[k]


@njit(cache=True, nogil=True)
def fit_moves(dev, pred_ptr, pred_idx, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap, node_time, inv_bw,
              max_moves):
    """Move nodes off devices over ``cap`` in place of ``dev``, one at a time: each time the move (a node on a device
    over capacity, to the device of one of its neighbours or the one with the most room) with the least added time
    (``node_time`` on the new device less the old, plus every changed received tensor's bytes x ``inv_bw``) per
    byte of overflow it removes (a node with its neighbours on its device together when no single node removes
    any), until nothing overflows, no move removes overflow, or ``max_moves``. Returns ``(moves, overflow left)``."""
    n = dev.shape[0]
    nd = cap.shape[0]
    recv = received(dev, succ_ptr, succ_idx, succ_eid, edge_bytes, nd)
    load = np.zeros(nd)
    for u in range(n):
        load[dev[u]] += pinned[u]
        for k in range(nd):
            load[k] += recv[u, k]
    row = np.zeros(nd)
    delta = np.zeros(nd)
    near = np.zeros(nd, np.int64)
    members = np.empty(n, np.int64)
    aff = np.empty(n, np.int64)
    seen = np.full(n, -1, np.int64)
    stamp = 0
    moves = 0
    over = _over(load, cap)
    while over > 0.0 and moves < max_moves:
        best_i, best_t, best_r = -1, -1, np.inf
        roomy = np.argmax(cap - load)
        for i in range(n):
            s = dev[i]
            if load[s] <= cap[s]:
                continue
            near[:] = 0  # the devices of its neighbours and the one with the most room
            near[roomy] = 1
            for q in range(pred_ptr[i], pred_ptr[i + 1]):
                near[dev[pred_idx[q]]] = 1
            for q in range(succ_ptr[i], succ_ptr[i + 1]):
                near[dev[succ_idx[q]]] = 1
            members[0] = i
            stamp += 1
            c = _affected(members, 1, pred_ptr, pred_idx, seen, stamp, aff)
            for t in range(nd):
                if t == s or not near[t]:
                    continue
                r = _rate_of(members, 1, aff, c, s, t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap,
                             node_time, inv_bw, recv, load, row, delta)
                if r < best_r:
                    best_i, best_t, best_r = i, t, r
        if best_i < 0:  # no single node helps: a node with its neighbours on its device (a star) together
            moved = _star_move(dev, pred_ptr, pred_idx, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap,
                               node_time, inv_bw, recv, load, seen, row, delta, members, aff)
            if not moved:
                break
            stamp = seen.max()  # the star's stamps are above this loop's
        else:
            members[0] = best_i
            stamp += 1
            c = _affected(members, 1, pred_ptr, pred_idx, seen, stamp, aff)
            _apply(members, 1, aff, c, dev[best_i], best_t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned,
                   node_time, recv, load, row)
        moves += 1
        over = _over(load, cap)
    return moves, over


@njit(cache=True, nogil=True)
def _star_move(dev, pred_ptr, pred_idx, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap, node_time, inv_bw,
               recv, load, seen, row, delta, members, aff):
    """The best move of a node and its neighbours on its device together (least added time per byte of overflow
    removed), applied in place (``dev``, ``recv``, ``load``); False when none removes overflow."""
    n, nd = dev.shape[0], cap.shape[0]
    near = np.zeros(nd, np.int64)
    roomy = np.argmax(cap - load)
    best_i, best_t, best_r = -1, -1, np.inf
    stamp = seen.max() + 1
    for i in range(n):
        s = dev[i]
        if load[s] <= cap[s]:
            continue
        m = _star(i, s, dev, pred_ptr, pred_idx, succ_ptr, succ_idx, members)
        if m < 2 or m > STAR_MAX:
            continue
        stamp += 1
        c = _affected(members, m, pred_ptr, pred_idx, seen, stamp, aff)
        near[:] = 0  # the devices of the members' producers and the one with the most room
        near[roomy] = 1
        for j in range(c):
            near[dev[aff[j]]] = 1
        for t in range(nd):
            if t == s or not near[t]:
                continue
            r = _rate_of(members, m, aff, c, s, t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap,
                         node_time, inv_bw, recv, load, row, delta)
            if r < best_r:
                best_i, best_t, best_r = i, t, r
    if best_i < 0:
        return False
    s = dev[best_i]
    m = _star(best_i, s, dev, pred_ptr, pred_idx, succ_ptr, succ_idx, members)
    stamp += 1
    c = _affected(members, m, pred_ptr, pred_idx, seen, stamp, aff)
    _apply(members, m, aff, c, s, best_t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, node_time, recv,
           load, row)
    return True
