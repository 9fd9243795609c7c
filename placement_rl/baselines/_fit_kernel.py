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
def fit_moves(dev, pred_ptr, pred_idx, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap, node_time, inv_bw,
              max_moves, every):
    """Move nodes off devices over ``cap`` in place of ``dev``, one at a time: each time the move (a node on a device
    over capacity, to any other device) with the least added time (``node_time`` on the new device less the old,
    plus every changed received tensor's bytes x ``inv_bw``) per byte of overflow it removes, until nothing
    overflows, no move removes overflow, or ``max_moves``; ``every``: any device as the destination, else the
    devices of its neighbours and the one with the most room. Returns ``(moves, overflow left)``."""
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
    seen = np.full(n, -1, np.int64)
    stamp = 0
    moves = 0
    over = _over(load, cap)
    near = np.zeros(nd, np.int64)
    while over > 0.0 and moves < max_moves:
        best_i, best_t, best_r = -1, -1, np.inf
        roomy = np.argmax(cap - load)
        for i in range(n):
            s = dev[i]
            if load[s] <= cap[s]:
                continue
            if not every:  # the devices of its neighbours and the one with the most room
                near[:] = 0
                near[roomy] = 1
                for q in range(pred_ptr[i], pred_ptr[i + 1]):
                    near[dev[pred_idx[q]]] = 1
                for q in range(succ_ptr[i], succ_ptr[i + 1]):
                    near[dev[succ_idx[q]]] = 1
            for t in range(nd):
                if t == s or not (every or near[t]):
                    continue
                delta[:] = 0.0
                delta[s] -= pinned[i]
                delta[t] += pinned[i]
                cost = node_time[i, t] - node_time[i, s]
                dev[i] = t
                _row(i, t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
                for k in range(nd):
                    delta[k] += row[k] - recv[i, k]
                    cost += row[k] * inv_bw[t, k] - recv[i, k] * inv_bw[s, k]
                stamp += 1
                for q in range(pred_ptr[i], pred_ptr[i + 1]):
                    p = pred_idx[q]
                    if seen[p] == stamp:
                        continue
                    seen[p] = stamp
                    _row(p, dev[p], dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
                    for k in range(nd):
                        delta[k] += row[k] - recv[p, k]
                        cost += (row[k] - recv[p, k]) * inv_bw[dev[p], k]
                dev[i] = s
                r = _rate(load, delta, cap, cost)
                if r < best_r:
                    best_i, best_t, best_r = i, t, r
        if best_i < 0:  # no single node helps: a node with its neighbours on its device (a star) together
            moved = _star_move(dev, pred_ptr, pred_idx, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap,
                               node_time, inv_bw, recv, load, seen, row)
            if not moved:
                break
            stamp = seen.max()  # the star's stamps are above this loop's
            moves += 1
            over = _over(load, cap)
            continue
        i, s, t = best_i, dev[best_i], best_t
        dev[i] = t
        load[s] -= pinned[i]
        load[t] += pinned[i]
        _row(i, t, dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
        for k in range(nd):
            load[k] += row[k] - recv[i, k]
            recv[i, k] = row[k]
        for q in range(pred_ptr[i], pred_ptr[i + 1]):
            p = pred_idx[q]
            _row(p, dev[p], dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
            for k in range(nd):
                load[k] += row[k] - recv[p, k]
                recv[p, k] = row[k]
        moves += 1
        over = _over(load, cap)
    return moves, over


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
def _star_move(dev, pred_ptr, pred_idx, succ_ptr, succ_idx, succ_eid, edge_bytes, pinned, cap, node_time, inv_bw,
               recv, load, seen, row):
    """The best move of a node and its neighbours on its device together (least added time per byte of overflow
    removed), applied in place (``dev``, ``recv``, ``load``); False when none removes overflow."""
    n, nd = dev.shape[0], cap.shape[0]
    members = np.empty(n, np.int64)
    aff = np.empty(n, np.int64)
    delta = np.zeros(nd)
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
            delta[:] = 0.0
            cost = 0.0
            for j in range(m):
                v = members[j]
                if dev[v] == s:  # a node listed twice moves once
                    dev[v] = t
                    delta[s] -= pinned[v]
                    delta[t] += pinned[v]
                    cost += node_time[v, t] - node_time[v, s]
            for j in range(c):
                u = aff[j]
                _row(u, dev[u], dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
                was = s if dev[u] == t and _member(u, members, m) else dev[u]
                for k in range(nd):
                    delta[k] += row[k] - recv[u, k]
                    cost += row[k] * inv_bw[dev[u], k] - recv[u, k] * inv_bw[was, k]
            for j in range(m):
                dev[members[j]] = s
            r = _rate(load, delta, cap, cost)
            if r < best_r:
                best_i, best_t, best_r = i, t, r
    if best_i < 0:
        return False
    i, s, t = best_i, dev[best_i], best_t
    m = _star(i, s, dev, pred_ptr, pred_idx, succ_ptr, succ_idx, members)
    stamp += 1
    c = _affected(members, m, pred_ptr, pred_idx, seen, stamp, aff)
    for j in range(m):
        v = members[j]
        if dev[v] == s:
            dev[v] = t
            load[s] -= pinned[v]
            load[t] += pinned[v]
    for j in range(c):
        u = aff[j]
        _row(u, dev[u], dev, succ_ptr, succ_idx, succ_eid, edge_bytes, row)
        for k in range(nd):
            load[k] += row[k] - recv[u, k]
            recv[u, k] = row[k]
    return True


@njit(cache=True, nogil=True)
def _member(u, members, m):
    for j in range(m):
        if members[j] == u:
            return True
    return False
