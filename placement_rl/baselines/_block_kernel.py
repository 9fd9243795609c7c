"""Numba kernel of the ``blocks`` lower bound (see ``bounds.block_bound`` for the argument it computes).

Nodes are indexed in a topological order (every edge goes from a lower index to a higher one). Longest paths are
kept in a band of ``span`` indices: ``down[t, o]`` is the longest path from node ``t - o`` to ``t`` (the sum of
``w`` over the nodes strictly between), ``up[o]`` that from the current ``s`` to ``s + o`` (the nodes after ``s``,
``s + o`` included); -1 where there is no such path (through ``ok`` nodes only, ``t`` itself excepted).
"""

from __future__ import annotations

import numpy as np
from numba import njit

NONE = -1.0


@njit(cache=True, nogil=True)
def _down(t, span, pred_ptr, pred_idx, w, ok, out):
    """``out[o]``: the longest path ``t - o -> t`` (``w`` summed strictly between; its nodes but ``t`` ``ok``)."""
    out[:] = NONE
    out[0] = 0.0
    lo = t - span if t > span else 0
    for x in range(t, lo - 1, -1):
        here = out[t - x]
        if here < 0.0:
            continue
        add = 0.0 if x == t else w[x]
        for q in range(pred_ptr[x], pred_ptr[x + 1]):
            v = pred_idx[q]
            if v < lo or not ok[v]:
                continue
            if here + add > out[t - v]:
                out[t - v] = here + add


@njit(cache=True, nogil=True)
def _up(s, span, n, succ_ptr, succ_idx, w, ok, out):
    """``out[o]``: the longest path ``s -> s + o`` (``w`` of the nodes after ``s``, ``s + o`` included), expanding
    only from ``s`` and ``ok`` nodes."""
    out[:] = NONE
    out[0] = 0.0
    hi = s + span if s + span < n - 1 else n - 1
    for u in range(s, hi + 1):
        here = out[u - s]
        if here < 0.0 or (u != s and not ok[u]):
            continue
        for q in range(succ_ptr[u], succ_ptr[u + 1]):
            x = succ_idx[q]
            if x > hi:
                continue
            if here + w[x] > out[x - s]:
                out[x - s] = here + w[x]


@njit(cache=True, nogil=True)
def _cut_points(k, nd, path, nodes, wk, total, fastest, moved, cmin, order):
    """A lower bound on ``min over R`` (the set of block nodes away from the home device) of ``max(the rest's work
    on the home device, R's work over the other nd - 1 devices, max over R of path + j x cmin)``, for j = 1 and 2
    cuts. Sets R whose longest path is that of the node ``order[i]`` lie within the first ``i + 1`` nodes in
    ``order`` (by path; ties beyond only lower the rest), so each is charged ``max(path + j x cmin, the work of the
    nodes after it on one device, the block's fastest work over nd)`` (the last: home and away together on nd
    devices; R's own share is not a prefix's, so it is not charged per prefix). ``total`` holds the block's work
    per class of devices, ``fastest`` its work at each node's fastest device; ``moved`` is scratch."""
    nk = wk.shape[1]
    one = total.min()  # nothing away from home
    two = one
    if nd < 2:
        return one, two
    floor0 = fastest / nd
    moved[:] = 0.0
    for j in range(k):
        i = order[j]
        v = nodes[i]
        rest = np.inf
        for q in range(nk):
            moved[q] += wk[v, q]
            if total[q] - moved[q] < rest:
                rest = total[q] - moved[q]
        floor = rest if rest > floor0 else floor0
        val = path[i] + cmin
        one = min(one, val if val > floor else floor)
        val += cmin
        two = min(two, val if val > floor else floor)
    return one, two


@njit(cache=True, nogil=True)
def _block(s, t, up, down, w, wk, c, c0, nd, path, nodes, total, moved):
    """The least time between ``s``'s end and ``t``'s start (``bounds.block_bound``) over the nodes between them:
    with ``t`` on ``s``'s device, the home set's serial work against the longest path through a node elsewhere
    plus two cuts (out and back); with ``t`` elsewhere, every path from ``s`` to ``t`` crosses a cut, and the
    home set is still serial. ``w`` [N]: each node's time at its fastest device (paths); ``wk`` [N, K]: its
    time on each class of devices (the home set's work is that of one device); ``nd`` devices."""
    k = 0
    nk = wk.shape[1]
    total[:] = 0.0
    fastest = 0.0
    cmin = c0
    for v in range(s + 1, t):
        a = up[v - s]
        b = down[t - v]
        if a >= 0.0 and b >= 0.0:
            path[k] = a + b
            nodes[k] = v
            fastest += w[v]
            for q in range(nk):
                total[q] += wk[v, q]
            if c[v] < cmin:
                cmin = c[v]
            k += 1
    if k == 0:
        return 0.0
    order = np.argsort(path[:k])
    longest = path[order[k - 1]]  # transfers free: the longest path between them
    away, back = _cut_points(k, nd, path, nodes, wk, total, fastest, moved, cmin, order)
    if longest + cmin > away:
        away = longest + cmin
    best = back if back < away else away
    return best if best > longest else longest


@njit(cache=True, nogil=True)
def chain_of_blocks(n, span, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, fk, bk, c, grad):
    """The bound: the best chain ``b_0 -> ... -> b_m`` (each within ``span`` of the last, all but the last with a
    gradient) of ``pre(b_0) + sum f(b_i) + b(b_i) + blocks' forward and backward least times``; ``fk``, ``bk``
    [N, K]: forward and backward times per class of ``nd`` devices."""
    f = np.empty(n)
    b = np.empty(n)
    for v in range(n):
        f[v] = fk[v].min()
        b[v] = bk[v].min()
    every = np.ones(n, dtype=np.bool_)
    down_f = np.empty((n, span + 1))
    down_b = np.empty((n, span + 1))
    for t in range(n):
        _down(t, span, pred_ptr, pred_idx, f, every, down_f[t])
        _down(t, span, pred_ptr, pred_idx, b, grad, down_b[t])
    pre_f = np.zeros(n)  # the longest forward path before each node (a chain of one)
    for u in range(n):
        for q in range(succ_ptr[u], succ_ptr[u + 1]):
            x = succ_idx[q]
            if pre_f[u] + f[u] > pre_f[x]:
                pre_f[x] = pre_f[u] + f[u]
    path = np.empty(span + 1)
    nodes = np.empty(span + 1, dtype=np.int64)
    total = np.empty(fk.shape[1])
    moved = np.empty(fk.shape[1])
    value = pre_f  # then the best chain ending at each node: its forward start + the time after its backward
    up_f = np.empty(span + 1)
    up_b = np.empty(span + 1)
    for s in range(n):
        if not grad[s]:
            continue
        _up(s, span, n, succ_ptr, succ_idx, f, every, up_f)
        _up(s, span, n, succ_ptr, succ_idx, b, grad, up_b)
        hi = s + span if s + span < n - 1 else n - 1
        for t in range(s + 1, hi + 1):
            if up_f[t - s] < 0.0:
                continue
            got = value[s] + f[s] + b[s] + _block(s, t, up_f, down_f[t], f, fk, c, c[s], nd, path, nodes, total,
                                                  moved)
            if up_b[t - s] >= 0.0:
                got += _block(s, t, up_b, down_b[t], b, bk, c, c[s], nd, path, nodes, total, moved)
            if got > value[t]:
                value[t] = got
    best = 0.0
    for v in range(n):
        if value[v] + f[v] + b[v] > best:
            best = value[v] + f[v] + b[v]
    return best
