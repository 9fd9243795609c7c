"""Numba kernel of the op-placement simulator (see ``simulate.py`` for the model it implements).

Allocation-free: every array, work buffers included, is passed in. Timeline records go to ``rec_*``
arrays when ``record`` is true (kind 0 fwd op, 1 bwd op, 2 fwd transfer, 3 bwd gradient transfer;
resource = device index for ops, ``src * D + dst`` for transfers; label = node index).
"""

from __future__ import annotations

import numpy as np
from numba import njit

@njit(cache=True, nogil=True)
def _record(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, kind, res, start, end, label):
    k = rec_n[0]
    rec_kind[k] = kind
    rec_res[k] = res
    rec_start[k] = start
    rec_end[k] = end
    rec_label[k] = label
    rec_n[0] = k + 1


@njit(cache=True, nogil=True)
def simulate_ops(dev, order, pred_ptr, pred_idx, succ_ptr, succ_idx, succ_eid, edge_bytes,
                 fwd, bwd, lat, inv_bw, grad, static_mem,
                 finish, bfinish, arrive, dev_free, link_free, gtime, gbytes, touched,
                 busy, mem, out, record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    """Simulate one training step; fill ``busy``/``mem`` [D] and ``out`` = (step, comm, fwd_end, ok)."""
    n = order.shape[0]
    nd = dev_free.shape[0]
    for i in range(n):
        d = dev[i]
        if d < 0 or d >= nd:
            out[3] = 0.0
            return
    for j in range(nd):
        dev_free[j] = 0.0
        busy[j] = 0.0
        mem[j] = 0.0
        gtime[j] = -1.0
    for j in range(nd * nd):
        link_free[j] = 0.0
    for j in range(n * nd):
        arrive[j] = -1.0
    rec_n[0] = 0
    comm = 0.0
    fwd_end = 0.0
    # ---------------------------------------------------------------- forward, in priority order
    for k in range(n):
        v = order[k]
        dv = dev[v]
        ready = 0.0
        for p in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[p]
            du = dev[u]
            if du == dv:
                t = finish[u]
            else:
                t = arrive[u * nd + dv]
                if t < 0.0:
                    # first consumer of u's output on dv: send it once (largest edge to that device)
                    b = 0.0
                    for q in range(succ_ptr[u], succ_ptr[u + 1]):
                        if dev[succ_idx[q]] == dv and edge_bytes[succ_eid[q]] > b:
                            b = edge_bytes[succ_eid[q]]
                    cost = lat[du, dv] + b * inv_bw[du, dv]
                    link = du * nd + dv
                    st = finish[u] if finish[u] > link_free[link] else link_free[link]
                    t = st + cost
                    link_free[link] = t
                    arrive[u * nd + dv] = t
                    comm += cost
                    mem[dv] += b
                    if record:
                        _record(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 2, link, st, t, u)
            if t > ready:
                ready = t
        st = dev_free[dv] if dev_free[dv] > ready else ready
        en = st + fwd[v, dv]
        finish[v] = en
        dev_free[dv] = en
        busy[dv] += fwd[v, dv]
        mem[dv] += static_mem[v]
        if en > fwd_end:
            fwd_end = en
        if record:
            _record(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 0, dv, st, en, v)
    # ------------------------------------------------------ backward, in reverse priority order
    step = 0.0
    for k in range(n - 1, -1, -1):
        u = order[k]
        du = dev[u]
        ready = finish[u]
        if grad[u]:
            nt = 0
            for q in range(succ_ptr[u], succ_ptr[u + 1]):
                w = succ_idx[q]
                dw = dev[w]
                t = bfinish[w]
                if dw == du:
                    if t > ready:
                        ready = t
                else:
                    b = edge_bytes[succ_eid[q]]
                    if gtime[dw] < 0.0:
                        touched[nt] = dw
                        nt += 1
                        gtime[dw] = t
                        gbytes[dw] = b
                    else:
                        if t > gtime[dw]:
                            gtime[dw] = t
                        if b > gbytes[dw]:
                            gbytes[dw] = b
            # gradients accumulated on each consumer device are sent back once
            for x in range(nt):
                dw = touched[x]
                cost = lat[dw, du] + gbytes[dw] * inv_bw[dw, du]
                link = dw * nd + du
                st = gtime[dw] if gtime[dw] > link_free[link] else link_free[link]
                t = st + cost
                link_free[link] = t
                comm += cost
                gtime[dw] = -1.0
                if t > ready:
                    ready = t
                if record:
                    _record(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 3, link, st, t, u)
        st = dev_free[du] if dev_free[du] > ready else ready
        en = st + bwd[u, du]
        bfinish[u] = en
        dev_free[du] = en
        busy[du] += bwd[u, du]
        if en > step:
            step = en
        if record:
            _record(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 1, du, st, en, u)
    out[0] = step
    out[1] = comm
    out[2] = fwd_end
    out[3] = 1.0
