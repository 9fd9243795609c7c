"""Numba kernels of the max-load model (``placement_rl.baselines.maxload``): the dynamic program over ideals and the
load of every device under an assignment.

DP state ``f[c, a, J]``: the least max-load of a split of the blocks in ideal ``J`` over at most ``c`` CPU cores and
``a`` accelerators, each device holding one contiguous set ``J' minus I'`` of a chain of ideals. A set on a CPU core
costs its CPU time; on an accelerator its accelerator time plus, once per source node, the cost of every output
that crosses the set's boundary (sent or received); infinite where it does not fit or holds a node accelerators
cannot run.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from placement_rl.baselines._ideal_kernel import _subset

INF = np.inf


@njit(cache=True, nogil=True)
def _bit(words, k, b):
    return (words[k, b >> 6] >> np.uint64(b & 63)) & np.uint64(1)


@njit(cache=True, nogil=True)
def set_comm(words, i, j, src_block, src_cost, cons_ptr, cons_block, by_block_ptr, by_block, seen, stamp):
    """The communication a set ``J minus I`` pays on an accelerator: the cost of every source whose output
    crosses its boundary, once. Only the sources in a block of the set or feeding one can cross it (``by_block``:
    those of each block, CSR); ``seen`` marks the sources looked at with ``stamp`` (unique per call)."""
    total = 0.0
    for w in range(words.shape[1]):
        bits = words[j, w] & ~words[i, w]
        t = 0
        while bits != np.uint64(0):
            if bits & np.uint64(1):
                b = w * 64 + t
                for q in range(by_block_ptr[b], by_block_ptr[b + 1]):
                    s = by_block[q]
                    if seen[s] == stamp:
                        continue
                    seen[s] = stamp
                    sb = src_block[s]
                    inside = _bit(words, j, sb) & ~_bit(words, i, sb) & np.uint64(1)
                    for qq in range(cons_ptr[s], cons_ptr[s + 1]):
                        c = cons_block[qq]
                        if (_bit(words, j, c) & ~_bit(words, i, c) & np.uint64(1)) != inside:
                            total += src_cost[s]
                            break
            bits >>= np.uint64(1)
            t += 1
    return total


@njit(cache=True, nogil=True)
def _dp_one(words, card, acc, cpu, size, bad, max_size, src_block, src_cost, cons_ptr, cons_block, by_block_ptr,
            by_block, j, f, choice, sub, ub):
    """Fill ``f[:, :, j]`` and its parents from every ideal inside ``j`` (all filled) whose difference costs at
    most ``ub`` on some device (no set of a split of max-load ``ub`` or less costs more); returns the pairs
    visited. (A scan in index order: visiting only the ideals whose times lie within ``ub``, found by bisection,
    was 2.5 x slower for the scattered reads of ``f`` and ``words``.)"""
    nc = f.shape[0]
    na = f.shape[1]
    best = np.full((nc, na), INF)
    arg = np.full((nc, na), -1, dtype=np.int64)
    kind = np.full((nc, na), -1, dtype=np.int64)
    pairs = 0
    seen = np.zeros(src_block.shape[0], dtype=np.int64)
    for i in range(j):
        c_cost = cpu[j] - cpu[i]
        base = acc[j] - acc[i]
        if (nc == 1 or c_cost > ub) and (na == 1 or base > ub):
            continue  # the set costs more than ``ub`` on every device (tested before the subset test: cheaper)
        if card[i] >= card[j] or not _subset(words, i, j):
            continue
        pairs += 1
        a_cost = INF
        if na > 1 and base <= ub and bad[j] - bad[i] < 0.5 and size[j] - size[i] <= max_size * (1 + 1e-12):
            useful = False  # the transfers only add: skip them where the times alone improve nothing
            for c in range(nc):
                for a in range(1, na):
                    if max(f[c, a - 1, i], base) < best[c, a]:
                        useful = True
                        break
                if useful:
                    break
            if useful:
                a_cost = base + set_comm(words, i, j, src_block, src_cost, cons_ptr, cons_block, by_block_ptr,
                                         by_block, seen, i + 1)
                if a_cost > ub:
                    a_cost = INF
        for c in range(nc):
            for a in range(na):
                if c > 0 and c_cost <= ub:
                    v = max(f[c - 1, a, i], c_cost)
                    if v < best[c, a]:
                        best[c, a] = v
                        arg[c, a] = i
                        kind[c, a] = 2
                if a > 0 and a_cost < INF:
                    v = max(f[c, a - 1, i], a_cost)
                    if v < best[c, a]:
                        best[c, a] = v
                        arg[c, a] = i
                        kind[c, a] = 3
    for c in range(nc):
        for a in range(na):
            v = best[c, a]
            k = kind[c, a]
            s = arg[c, a]
            if c > 0 and f[c - 1, a, j] < v:
                v = f[c - 1, a, j]
                k = 0
                s = j
            if a > 0 and f[c, a - 1, j] < v:
                v = f[c, a - 1, j]
                k = 1
                s = j
            f[c, a, j] = v
            choice[c, a, j] = k
            sub[c, a, j] = s
    return pairs


@njit(cache=True, nogil=True, parallel=True)
def maxload_dp(words, card, acc, cpu, size, bad, max_size, src_block, src_cost, cons_ptr, cons_block,
               by_block_ptr, by_block, j0, j1, f, choice, sub, ub):
    """Fill ``f`` [C + 1, A + 1, K] for ideals ``j0 .. j1 - 1``, all of one size (so none is inside another: they
    are filled in parallel), every smaller one already filled (``f[:, :, 0] = 0``). ``choice``: 0 a CPU core left
    unused, 1 an accelerator left unused, 2 the last set on a CPU core, 3 on an accelerator, ``sub`` its lower
    ideal. ``acc`` / ``cpu`` / ``size`` / ``bad`` are sums over each ideal (``bad``: nodes an accelerator cannot
    run). ``ub``: an upper bound on the best max-load (``inf``: none); sets costing more are never tried. Returns
    the ideal pairs visited."""
    pairs = np.zeros(j1 - j0, dtype=np.int64)
    for t in prange(j1 - j0):
        pairs[t] = _dp_one(words, card, acc, cpu, size, bad, max_size, src_block, src_cost, cons_ptr, cons_block,
                           by_block_ptr, by_block, j0 + t, f, choice, sub, ub)
    return pairs.sum()


@njit(cache=True, nogil=True)
def device_loads(device, n_acc, n_dev, acc, cpu, edges, out_cost):
    """Load of every device (int ``device`` per node, accelerators first): its nodes' times plus, on an
    accelerator, each crossing output once (sent by its producer's device, received once by every other device
    holding a consumer)."""
    load = np.zeros(n_dev)
    for v in range(device.shape[0]):
        d = device[v]
        load[d] += acc[v] if d < n_acc else cpu[v]
    seen = np.full(n_dev, -1, dtype=np.int64)
    for e in range(edges.shape[0]):
        u = edges[e, 0]
        du = device[u]
        dv = device[edges[e, 1]]
        if du == dv:
            continue
        if du < n_acc and seen[du] != u:
            seen[du] = u
            load[du] += out_cost[u]
        if dv < n_acc and seen[dv] != u:
            seen[dv] = u
            load[dv] += out_cost[u]
    return load


@njit(cache=True, nogil=True)
def latency_score(device, n_acc, acc, cpu, edges, out_cost):
    """(latency, sum of every unit's finish time) of a split for the latency objective (``maxload_latency``; device
    per node, any id from ``n_acc`` on the CPUs); (inf, inf) where its subgraphs feed each other in a cycle. The
    units are the accelerators (each one call: its nodes' times and transfers) and each node on a CPU."""
    n = device.shape[0]
    dev = np.minimum(device, n_acc)
    cost = device_loads(dev, n_acc, n_acc + 1, acc, cpu, edges, out_cost)
    n_units = n_acc + n
    unit = np.empty(n, dtype=np.int64)
    active = np.zeros(n_units, dtype=np.bool_)
    for v in range(n):
        unit[v] = dev[v] if dev[v] < n_acc else n_acc + v
        active[unit[v]] = True
    ptr = np.zeros(n_units + 1, dtype=np.int64)
    for e in range(edges.shape[0]):
        a, b = unit[edges[e, 0]], unit[edges[e, 1]]
        if a != b:
            ptr[a + 1] += 1
    for x in range(n_units):
        ptr[x + 1] += ptr[x]
    fill = ptr[:-1].copy()
    succ = np.empty(ptr[n_units], dtype=np.int64)
    indeg = np.zeros(n_units, dtype=np.int64)
    for e in range(edges.shape[0]):
        a, b = unit[edges[e, 0]], unit[edges[e, 1]]
        if a != b:
            succ[fill[a]] = b
            fill[a] += 1
            indeg[b] += 1
    start = np.zeros(n_units)
    stack = np.empty(n_units, dtype=np.int64)
    top, n_active = 0, 0
    for x in range(n_units):
        if active[x]:
            n_active += 1
            if indeg[x] == 0:
                stack[top] = x
                top += 1
    done, latency, total = 0, 0.0, 0.0
    while top > 0:
        top -= 1
        x = stack[top]
        done += 1
        finish = start[x] + (cost[x] if x < n_acc else cpu[x - n_acc])
        total += finish
        latency = max(latency, finish)
        for q in range(ptr[x], ptr[x + 1]):
            y = succ[q]
            start[y] = max(start[y], finish)
            indeg[y] -= 1
            if indeg[y] == 0:
                stack[top] = y
                top += 1
    if done < n_active:
        return np.inf, np.inf
    return latency, total
