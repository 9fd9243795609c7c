"""Numba kernels of the op-placement simulator (see ``simulate.py`` for the model they implement).

The forward pass is a list scheduler over a fixed order, so it is written as one step per node
(``fwd_place``) that ``simulate_ops`` loops over and that the constructive environment calls one decision at a
time (``placement_rl.cost.schedule``): both run the same code on the same state, so an episode's final step
time equals ``simulate()`` of its placement. ``fwd_candidates`` prices placing the next node on every device
without changing the state. ``bwd_pass`` runs the backward in reverse order from the forward state (``bwd_range``
the backward of a placed prefix's last nodes).

Allocation-free: every array, work buffers included, is passed in. Timeline records go to ``rec_*`` arrays
when ``record`` is true (kind 0 fwd op, 1 bwd op, 2 fwd transfer, 3 bwd gradient transfer; resource = device
index for ops, ``src * D + dst`` for transfers; label = node index). ``acc`` = (comm time, forward end).
A transfer of ``n`` bytes from device ``a`` to ``b`` takes ``seg_time(link_upper, link_coef, a, b, n)``, from
each link's segment table (``comm_fit.split_segments``: one ``latency + n / bandwidth`` row, or a measured NCCL curve).
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
def seg_time(upper, coef, a, b, nbytes):
    """``alpha + beta * nbytes`` of segment table ``(a, b)``: the first row k with ``nbytes < upper[a, b, k]``
    (a binary search; one row: the plain alpha-beta link), ``(alpha, beta) = coef[a, b, k]``."""
    lo = 0
    hi = upper.shape[2] - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if nbytes < upper[a, b, mid]:
            hi = mid
        else:
            lo = mid + 1
    return coef[a, b, lo, 0] + coef[a, b, lo, 1] * nbytes


@njit(cache=True, nogil=True)
def reset_state(finish, arrive, sent, dev_free, link_free, busy, mem, acc):
    """Empty schedule: nothing placed, every device and link free at time 0."""
    finish[:] = 0.0
    arrive[:] = -1.0
    sent[:] = 0.0
    dev_free[:] = 0.0
    link_free[:] = 0.0
    busy[:] = 0.0
    mem[:] = 0.0
    acc[:] = 0.0


@njit(cache=True, nogil=True)
def fwd_place(v, dv, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef, static_mem,
              finish, arrive, sent, dev_free, link_free, busy, mem, acc,
              record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    """Schedule node ``v``'s forward op on device ``dv`` (its predecessors are scheduled; ``dev[v]`` is set).

    An input crossing devices is sent when its first consumer there is scheduled, carrying that edge's bytes;
    a later consumer on the same device that needs more of the tensor (a larger edge) sends the rest then. An edge
    of zero bytes sends nothing, but its consumer still starts after its producer's finish.
    """
    nd = dev_free.shape[0]
    ready = 0.0
    for p in range(pred_ptr[v], pred_ptr[v + 1]):
        u = pred_idx[p]
        du = dev[u]
        if du == dv:
            t = finish[u]
        else:
            b = edge_bytes[pred_eid[p]]
            slot = u * nd + dv
            have = sent[slot]
            if have < b:
                cost = seg_time(link_upper, link_coef, du, dv, b - have)
                link = du * nd + dv
                st = finish[u] if finish[u] > link_free[link] else link_free[link]
                t = st + cost
                link_free[link] = t
                arrive[slot] = t
                sent[slot] = b
                acc[0] += cost
                mem[dv] += b - have
                if record:
                    _record(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 2, link, st, t, u)
            else:  # sent already; or nothing to send (a zero-byte edge): it still waits for its producer
                t = arrive[slot] if arrive[slot] > finish[u] else finish[u]
        if t > ready:
            ready = t
    st = dev_free[dv] if dev_free[dv] > ready else ready
    en = st + fwd[v, dv]
    finish[v] = en
    dev_free[dv] = en
    busy[dv] += fwd[v, dv]
    mem[dv] += static_mem[v]
    if en > acc[1]:
        acc[1] = en
    if record:
        _record(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 0, dv, st, en, v)


@njit(cache=True, nogil=True)
def fwd_candidates(v, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef,
                   finish, arrive, sent, dev_free, link_free, scratch,
                   est, eft, new_bytes, local_bytes):
    """For every device d, what ``fwd_place(v, d)`` would give, without changing the state: ``est[d]`` and
    ``eft[d]`` (start and finish of v's forward op), ``new_bytes[d]`` (bytes it would receive) and
    ``local_bytes[d]`` (input bytes already on d). ``scratch`` [D] holds per-source link times."""
    nd = dev_free.shape[0]
    for d in range(nd):
        for s in range(nd):
            scratch[s] = -1.0
        ready = 0.0
        nb = 0.0
        lb = 0.0
        for p in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[p]
            du = dev[u]
            b = edge_bytes[pred_eid[p]]
            if du == d:
                t = finish[u]
                lb += b
            else:
                slot = u * nd + d
                have = sent[slot]
                if have < b:
                    lf = scratch[du] if scratch[du] >= 0.0 else link_free[du * nd + d]
                    st = finish[u] if finish[u] > lf else lf
                    t = st + seg_time(link_upper, link_coef, du, d, b - have)
                    scratch[du] = t
                    nb += b - have
                    lb += have
                else:  # as ``fwd_place``: a zero-byte edge still waits for its producer
                    t = arrive[slot] if arrive[slot] > finish[u] else finish[u]
                    lb += b
            if t > ready:
                ready = t
        s0 = dev_free[d] if dev_free[d] > ready else ready
        est[d] = s0
        eft[d] = s0 + fwd[v, d]
        new_bytes[d] = nb
        local_bytes[d] = lb


@njit(cache=True, nogil=True)
def bwd_pass(dev, order, succ_ptr, succ_idx, succ_eid, edge_bytes, bwd, link_upper, link_coef, grad,
             finish, bfinish, dev_free, link_free, gtime, gbytes, touched, busy, acc,
             record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    """The backward pass in reverse ``order`` after the forward state; returns the step time."""
    return bwd_range(0, order.shape[0], dev, order, succ_ptr, succ_idx, succ_eid, edge_bytes, bwd, link_upper,
                     link_coef, grad, finish, bfinish, dev_free, link_free, gtime, gbytes, touched, busy, acc,
                     record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)


@njit(cache=True, nogil=True)
def bwd_range(lo, hi, dev, order, succ_ptr, succ_idx, succ_eid, edge_bytes, bwd, link_upper, link_coef, grad,
              finish, bfinish, dev_free, link_free, gtime, gbytes, touched, busy, acc,
              record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    """The backward pass of the nodes ``order[lo:hi]`` in reverse order, after the forward state, where
    ``order[:hi]`` are the placed nodes; returns the latest backward finish among them. A successor that is not
    placed (``dev < 0``) sends no gradient. ``(0, N)`` on a complete placement is the whole step (``bwd_pass``);
    on a partial one, the backward of the placed prefix (``lo = 0``) or of its last ``hi - lo`` nodes."""
    nd = dev_free.shape[0]
    for j in range(nd):
        gtime[j] = -1.0
    step = 0.0
    for k in range(hi - 1, lo - 1, -1):
        u = order[k]
        du = dev[u]
        ready = finish[u]
        if grad[u]:
            nt = 0
            for q in range(succ_ptr[u], succ_ptr[u + 1]):
                w = succ_idx[q]
                dw = dev[w]
                if dw < 0:
                    continue
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
            # gradients accumulated on each consumer device are sent back once (none over zero-byte edges: u's
            # backward still waits for those consumers' backward, with nothing on the link)
            for x in range(nt):
                dw = touched[x]
                if gbytes[dw] <= 0.0:
                    t = gtime[dw]
                    gtime[dw] = -1.0
                    if t > ready:
                        ready = t
                    continue
                cost = seg_time(link_upper, link_coef, dw, du, gbytes[dw])
                link = dw * nd + du
                st = gtime[dw] if gtime[dw] > link_free[link] else link_free[link]
                t = st + cost
                link_free[link] = t
                acc[0] += cost
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
    return step


@njit(cache=True, nogil=True)
def simulate_ops(dev, order, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes,
                 fwd, bwd, link_upper, link_coef, grad, static_mem,
                 finish, bfinish, arrive, sent, dev_free, link_free, gtime, gbytes, touched, acc,
                 busy, mem, out, record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    """Simulate one training step; fill ``busy``/``mem`` [D] and ``out`` = (step, comm, fwd_end, ok)."""
    n = order.shape[0]
    nd = dev_free.shape[0]
    for i in range(n):
        d = dev[i]
        if d < 0 or d >= nd:
            out[3] = 0.0
            return
    reset_state(finish, arrive, sent, dev_free, link_free, busy, mem, acc)
    rec_n[0] = 0
    for k in range(n):
        v = order[k]
        fwd_place(v, dev[v], dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef, static_mem,
                  finish, arrive, sent, dev_free, link_free, busy, mem, acc,
                  record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
    fwd_end = acc[1]
    step = bwd_pass(dev, order, succ_ptr, succ_idx, succ_eid, edge_bytes, bwd, link_upper, link_coef, grad,
                    finish, bfinish, dev_free, link_free, gtime, gbytes, touched, busy, acc,
                    record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
    out[0] = step
    out[1] = acc[0]
    out[2] = fwd_end
    out[3] = 1.0
