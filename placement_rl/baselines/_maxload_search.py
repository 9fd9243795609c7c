"""Numba kernel of the local search of the max-load model (``maxload.improve``; ``maxload_latency`` for latency):
descent over moves of one block, and of a block with its neighbours on its device, to another device, scored by
(max-load, sum of squared loads) or (latency, sum of finish times); at each local optimum the search goes back to
the best split found and moves a random connected group of blocks on one device to another (a kick). Blocks are
colour classes; nothing moves onto an accelerator that cannot hold or run it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placement_rl.baselines._maxload_kernel import device_loads, latency_score

MAXLOAD, LATENCY = 0, 1  # objectives

_TOL = 1e-12


@njit(cache=True, nogil=True)
def _better(a_max, a_sq, b_max, b_sq):
    return a_max < b_max * (1 - _TOL) or (a_max <= b_max * (1 + _TOL) and a_sq < b_sq * (1 - _TOL))


@njit(cache=True, nogil=True)
def score_split(objective, device, n_acc, n_dev, acc, cpu, edges, out_cost):
    """(objective, tie-break) of a split: max-load and the sum of squared loads, or latency and the sum of finish
    times."""
    if objective == LATENCY:
        return latency_score(device, n_acc, acc, cpu, edges, out_cost)
    loads = device_loads(device, n_acc, n_dev, acc, cpu, edges, out_cost)
    return loads.max(), (loads ** 2).sum()


@njit(cache=True, nogil=True)
def _assign(b, d, dev_block, device, ptr, nodes):
    for q in range(ptr[b], ptr[b + 1]):
        device[nodes[q]] = d
    dev_block[b] = d


@njit(cache=True, nogil=True)
def _fits(grp, n_g, d, n_acc, mem, bsize, bbad, max_size):
    """The bytes ``grp[:n_g]`` adds to device ``d``, or -1 where an accelerator cannot run or hold it."""
    need = 0.0
    for z in range(n_g):
        need += bsize[grp[z]]
        if d < n_acc and bbad[grp[z]] > 0.5:
            return -1.0
    if d < n_acc and mem[d] + need > max_size * (1 + _TOL):
        return -1.0
    return need


@njit(cache=True, nogil=True)
def _move_group(grp, n_g, s, dev_block, device, ptr, nodes, n_acc, n_dev, acc, cpu, edges, out_cost, mem, bsize,
                bbad, max_size, cur, counter, objective):
    """Move ``grp[:n_g]`` (all on ``s``) to the first other device that lowers ``cur``; True where one does."""
    for d in range(n_dev):
        if d == s:
            continue
        need = _fits(grp, n_g, d, n_acc, mem, bsize, bbad, max_size)
        if need < 0:
            continue
        for z in range(n_g):
            _assign(grp[z], d, dev_block, device, ptr, nodes)
        m, q = score_split(objective, device, n_acc, n_dev, acc, cpu, edges, out_cost)
        counter[0] += 1
        if _better(m, q, cur[0], cur[1]):
            cur[0], cur[1] = m, q
            mem[s] -= need
            mem[d] += need
            return True
        for z in range(n_g):
            _assign(grp[z], s, dev_block, device, ptr, nodes)
    return False


@njit(cache=True, nogil=True)
def local_search(dev_block, best_block, best, ptr, nodes, aptr, adj, n_acc, n_dev, acc, cpu, edges, out_cost, bsize,
                 bbad, max_size, kick, seed, max_evals, stall, patience, objective):
    """Search from ``dev_block`` (device per block; updated: where it stopped) for about ``max_evals`` scored
    splits; ``best_block`` / ``best`` (max-load, sum of squared loads) hold the best split found (read and updated,
    so calls continue one search). ``ptr`` / ``nodes``: each block's nodes, ``aptr`` / ``adj``: its neighbouring
    blocks (CSR); ``kick``: the most blocks a kick moves; ``stall[0]``: local optima since the best last improved
    (read and updated; the search stops at ``patience``). Returns the splits scored."""
    np.random.seed(seed)
    nb = dev_block.shape[0]
    device = np.empty(acc.shape[0], dtype=np.int64)
    mem = np.zeros(n_dev)
    for b in range(nb):
        _assign(b, dev_block[b], dev_block, device, ptr, nodes)
        mem[dev_block[b]] += bsize[b]
    cur = np.array(score_split(objective, device, n_acc, n_dev, acc, cpu, edges, out_cost))
    counter = np.zeros(1, dtype=np.int64)
    grp = np.empty(nb, dtype=np.int64)
    while counter[0] < max_evals and stall[0] < patience:
        improved = False
        order = np.random.permutation(nb)
        for t in range(nb):
            if counter[0] >= max_evals:
                improved = True  # cut short: not a local optimum
                break
            b = order[t]
            s = dev_block[b]
            grp[0] = b
            moved = _move_group(grp, 1, s, dev_block, device, ptr, nodes, n_acc, n_dev, acc, cpu, edges, out_cost,
                                mem, bsize, bbad, max_size, cur, counter, objective)
            if not moved:
                n_g = 1
                for q in range(aptr[b], aptr[b + 1]):
                    if dev_block[adj[q]] == s:
                        grp[n_g] = adj[q]
                        n_g += 1
                if n_g > 1:
                    moved = _move_group(grp, n_g, s, dev_block, device, ptr, nodes, n_acc, n_dev, acc, cpu, edges,
                                        out_cost, mem, bsize, bbad, max_size, cur, counter, objective)
            if moved:
                improved = True
                if _better(cur[0], cur[1], best[0], best[1]):
                    best[0], best[1] = cur[0], cur[1]
                    best_block[:] = dev_block
                    stall[0] = 0
        if improved:
            continue
        stall[0] += 1
        # a local optimum: back to the best split, then move a connected group of one device elsewhere
        for b in range(nb):
            if dev_block[b] != best_block[b]:
                mem[dev_block[b]] -= bsize[b]
                mem[best_block[b]] += bsize[b]
                _assign(b, best_block[b], dev_block, device, ptr, nodes)
        k = 1 + np.random.randint(kick)
        b0 = np.random.randint(nb)
        s0 = dev_block[b0]
        d = np.random.randint(n_dev)
        if d != s0:
            grp[0] = b0
            n_g, head = 1, 0
            while head < n_g and n_g < k:
                x = grp[head]
                head += 1
                for q in range(aptr[x], aptr[x + 1]):
                    y = adj[q]
                    if n_g < k and dev_block[y] == s0 and not (grp[:n_g] == y).any():
                        grp[n_g] = y
                        n_g += 1
            for z in range(n_g):
                need = _fits(grp[z:], 1, d, n_acc, mem, bsize, bbad, max_size)
                if need >= 0:
                    mem[s0] -= need
                    mem[d] += need
                    _assign(grp[z], d, dev_block, device, ptr, nodes)
        cur[0], cur[1] = score_split(objective, device, n_acc, n_dev, acc, cpu, edges, out_cost)
        counter[0] += 1
    return counter[0]
