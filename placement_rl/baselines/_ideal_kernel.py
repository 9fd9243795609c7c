"""Numba kernel of the dynamic program over ideals (see ``pipe_ideals`` for the model it minimises).

State ``f[J, c, g]``: the least bottleneck (largest per-micro-batch time of any device group, link or gradient
sync) of a pipeline covering ideal ``J`` with ``c`` (a mixed-radix index of devices used per class) devices, its
last stage on composition ``g`` (``g = G``: no stage yet, only at the empty ideal). A transition appends the
stage ``J minus I`` for every ideal ``I`` inside ``J``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placement_rl.cost._op_kernel import seg_time

INF = np.inf


@njit(cache=True, nogil=True)
def _subset(words, i, j):
    for w in range(words.shape[1]):
        if words[i, w] & ~words[j, w]:
            return False
    return True


@njit(cache=True, nogil=True)
def ideal_dp(words, size, fv, fx, bv, bx, par, act, cut, dis, comp, psize, allowed, cap, lat, inv,
             ar_up, ar_coef, ratio, m, train, inflight, nxt, f, p_i, p_c, p_g):
    """Fill ``f`` [K, NC, G + 1] (inf where unreachable) and the parent arrays; returns the pairs visited."""
    k_ideals = words.shape[0]
    ng = comp.shape[0]
    nc = comp.shape[1]
    nstates = nxt.shape[0]
    cost = np.empty(ng)
    f[:] = INF
    f[0, 0, ng] = 0.0
    pairs = 0
    for j in range(1, k_ideals):
        for i in range(j):
            if size[i] >= size[j] or not _subset(words, i, j):
                continue
            pairs += 1
            params = par[j] - par[i]
            for g in range(ng):
                cost[g] = INF
                if not allowed[g]:
                    continue
                p = psize[g]
                sc = ratio / (m * p)
                tf = 0.0
                tb = 0.0
                ok = True
                for k in range(nc):
                    if comp[g, k] == 0:
                        continue
                    if dis[k, j] - dis[k, i] > 0:
                        ok = False
                        break
                    a = (fv[k, j] - fv[k, i]) * sc + (fx[k, j] - fx[k, i])
                    b = (bv[k, j] - bv[k, i]) * sc + (bx[k, j] - bx[k, i])
                    if a > tf:
                        tf = a
                    if b > tb:
                        tb = b
                if not ok:
                    continue
                if train:
                    mem = 4.0 * params + inflight * ((act[j] - act[i]) + cut[i]) / (m * p)
                else:
                    mem = params + cut[i] / (m * p)
                if mem > cap[g]:
                    continue
                c = tf + tb
                if train and p > 1 and params > 0.0:
                    sync = seg_time(ar_up, ar_coef, g, 0, params) / m
                    if sync > c:
                        c = sync
                cost[g] = c
            for ci in range(nstates):
                for gp in range(ng + 1):
                    v = f[i, ci, gp]
                    if v == INF:
                        continue
                    for g in range(ng):
                        if cost[g] == INF:
                            continue
                        ni = nxt[ci, g]
                        if ni < 0:
                            continue
                        val = v if v > cost[g] else cost[g]
                        if gp < ng:
                            pm = psize[gp] if psize[gp] < psize[g] else psize[g]
                            link = lat[gp, g] + cut[i] / (m * pm) * inv[gp, g]
                            if link > val:
                                val = link
                        if val < f[j, ni, g]:
                            f[j, ni, g] = val
                            p_i[j, ni, g] = i
                            p_c[j, ni, g] = ci
                            p_g[j, ni, g] = gp
    return pairs
