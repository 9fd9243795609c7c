"""Numba kernel of the pipeline simulator (see ``pipeline.py`` for the model it implements).

``_pipe_schedule.schedule_order`` runs once per plan layout and lists every op in an order that respects each
group's schedule and every dependency, so ``simulate_pipe`` times the ops in one pass. Work buffers ``fw`` (float64) and ``iw`` (int64) are sliced
there; their sizes come from ``work_sizes``.
Timeline records: kind 0 fwd, 1 bwd (resource = group), 2 activation transfer, 3 gradient transfer
(resource = ``src_group * G + dst_group``), 4 all-reduce (resource = group); label = ``stage * m + mb``
(all-reduce: stage).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placement_rl.cost._op_kernel import _record as _rec  # the timeline recorder both kernels share
from placement_rl.cost._op_kernel import seg_time
from placement_rl.cost.memory import FSDP_GATHER_FACTOR, STATE_FACTOR

OK, BAD_PLAN = 1.0, -1.0
ALLREDUCE, ALLGATHER, REDUCESCATTER = 0, 1, 2  # first index of the collective coefficient array


@njit(cache=True, nogil=True)
def _coll(coll, s, kind, nbytes):
    """Collective time of ``nbytes`` for stage ``s`` (``collectives.coeff_array`` segment table)."""
    if nbytes <= 0.0:
        return 0.0
    return seg_time(coll[0], coll[1], s, kind, nbytes)


@njit(cache=True, nogil=True)
def _fsdp_pass(coll, s, nu, uf, ub, ubytes, train):
    """Per-micro-batch forward and backward span of an FSDP stage with ``nu`` units, and its collective time.

    ``train == 0`` (inference): the forward all-gathers only (no backward, no reduce-scatter).

    One communication channel and one compute stream: forward all-gathers unit k (prefetched while unit
    k-1 computes, at most one ahead) before computing it; backward all-gathers again in reverse order and
    reduce-scatters each unit's gradient after its backward, the next unit's all-gather going first.
    """
    c = 0.0
    t = 0.0
    gate = 0.0
    comm = 0.0
    for k in range(nu):
        ag = _coll(coll, s, ALLGATHER, ubytes[k])
        a = c if c > gate else gate
        c = a + ag
        comm += ag
        cs = t if t > c else c
        t = cs + uf[k]
        gate = cs
    fwd = t
    if train == 0:
        return fwd, 0.0, comm
    ag = _coll(coll, s, ALLGATHER, ubytes[nu - 1])
    c = ag
    comm += ag
    cs = c
    t = cs + ub[nu - 1]
    for k in range(nu - 2, -1, -1):
        ag = _coll(coll, s, ALLGATHER, ubytes[k])
        a = c if c > cs else cs
        c = a + ag
        comm += ag
        agend = c
        rs = _coll(coll, s, REDUCESCATTER, ubytes[k + 1])
        r = c if c > t else t
        c = r + rs
        comm += rs
        cs = t if t > agend else agend
        t = cs + ub[k]
    rs = _coll(coll, s, REDUCESCATTER, ubytes[0])
    r = c if c > t else t
    c = r + rs
    comm += rs
    bwd = c if c > t else t
    return fwd, bwd, comm


def work_sizes(n: int, s: int, m: int, p_total: int, g: int) -> tuple[int, int]:
    """Lengths of the float and int work buffers for N nodes, S stages, m micro-batches, G groups."""
    return 2 * p_total + 14 * s + 1 + 4 * n + 3 * s * m + g * g + 4 * g, n + 2 * s


@njit(cache=True, nogil=True)
def stage_transient(stage, order, act, gradb, again, sgrad, safter):
    """Per stage into ``sgrad``: the bytes one micro-batch's backward holds at its fullest beyond the saved tensors
    of the micro-batch (``cost.backward_memory``): over the stage's nodes v, ``gradb[v] + again[v]`` less the saved
    ``act`` of the stage's nodes after v in ``order`` (their backward ran before v's, so autograd has freed them),
    and at least the largest ``again`` (a recomputed region's activations, as ``cost.recompute`` prices them).
    ``safter``: work buffer [S]."""
    for s in range(sgrad.shape[0]):
        sgrad[s] = 0.0
        safter[s] = 0.0
    for pos in range(order.shape[0] - 1, -1, -1):
        v = order[pos]
        s = stage[v]
        t = gradb[v] + again[v] - safter[s]
        if t > sgrad[s]:
            sgrad[s] = t
        if again[v] > sgrad[s]:
            sgrad[s] = again[v]
        safter[s] += act[v]


@njit(cache=True, nogil=True)
def simulate_pipe(stage, S, m, op_kind, op_stage, op_mb, op_group, gptr, gdev, sgroup, G, src, dst, ebytes,
                  fvar, ffix, bvar, bfix, batch_ratio, param, act, gradb, again,
                  lat, inv_bw, order, shard, coll, cap, train, fw, iw, out_stage, out_group, out,
                  record, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    """Simulate one pipelined training step. ``out`` = (step_time, status, comm_time).

    ``train == 0`` (inference): forward only -- backward ops take no time and send nothing, no DP gradient
    sync, state = the parameters alone (no gradients or optimizer state), activations are not kept (a
    micro-batch holds its received buffer only while its forward runs).

    ``batch_ratio``: plan batch size / batch size the node times were measured at; a stage's variable
    node time is scaled by ``batch_ratio / (m * p)`` (1 when the costs were measured at its micro-batch).
    ``gradb``, ``again``: per node, the gradient buffers its backward holds (``cost.backward_memory``) and the
    activations its recomputed region holds again meanwhile (``cost.recompute``), at the whole batch; a stage's
    ``stage_transient``, per micro-batch (``/ (m * p)``), is added to its group's memory at each of its backwards
    (training only).
    ``order``: a topological order (buckets and FSDP units follow it); ``shard``: 0 DDP, 1 FSDP;
    ``coll``: per stage and collective its segment table (``comm_fit.split_segments`` of ``[S, 3, K, 3]``); ``cap``: bucket /
    unit size in bytes.
    """
    n = stage.shape[0]
    P = gptr[S]
    sm = S * m
    o = 0
    tfd = fw[o:o + P]; o += P
    tbd = fw[o:o + P]; o += P
    sparam = fw[o:o + S]; o += S
    sact = fw[o:o + S]; o += S
    srecv = fw[o:o + S]; o += S
    ct = fw[o:o + S]; o += S
    ar = fw[o:o + S]; o += S
    lastb = fw[o:o + S]; o += S
    send = fw[o:o + S]; o += S
    cut = fw[o:o + S + 1]; o += S + 1
    cur_mb = fw[o:o + S]; o += S
    sscale = fw[o:o + S]; o += S
    sref = fw[o:o + S]; o += S
    sstate = fw[o:o + S]; o += S
    sgrad = fw[o:o + S]; o += S
    safter = fw[o:o + S]; o += S
    ubytes = fw[o:o + n]; o += n
    uf = fw[o:o + n]; o += n
    ub = fw[o:o + n]; o += n
    uby = fw[o:o + n]; o += n
    fend = fw[o:o + sm]; o += sm
    farr = fw[o:o + sm]; o += sm
    barr = fw[o:o + sm]; o += sm
    lfree = fw[o:o + G * G]; o += G * G
    gfree = fw[o:o + G]; o += G
    arfree = fw[o:o + G]; o += G
    cur = fw[o:o + G]; o += G
    peak = fw[o:o + G]; o += G
    q = 0
    umax = iw[q:q + n]; q += n
    bcount = iw[q:q + S]; q += S
    ncount = iw[q:q + S]; q += S
    out[1] = BAD_PLAN
    # ------------------------------------------------------------ per-stage sizes and times
    for x in range(P):
        tfd[x] = 0.0
        tbd[x] = 0.0
    for s in range(S):
        sparam[s] = 0.0
        sact[s] = 0.0
        cut[s] = 0.0
        bcount[s] = 0
        lastb[s] = 0.0
        sscale[s] = batch_ratio / (m * (gptr[s + 1] - gptr[s]))
    cut[S] = 0.0
    for v in range(n):
        s = stage[v]
        if s < 0 or s >= S:
            return
        bcount[s] += 1
        umax[v] = s
        ubytes[v] = 0.0
        sparam[s] += param[v]
        sact[s] += act[v]
        scale = sscale[s]
        for x in range(gptr[s], gptr[s + 1]):
            g = gdev[x]
            tfd[x] += fvar[g, v] * scale + ffix[g, v]
            tbd[x] += bvar[g, v] * scale + bfix[g, v]
    for e in range(src.shape[0]):
        a = stage[src[e]]
        b = stage[dst[e]]
        if b < a:
            return
        if b > a:
            u = src[e]
            if b > umax[u]:
                umax[u] = b
            if ebytes[e] > ubytes[u]:
                ubytes[u] = ebytes[e]
    for u in range(n):  # each crossing tensor passes every boundary between its producer and last consumer
        if umax[u] > stage[u]:
            cut[stage[u]] += ubytes[u]
            cut[umax[u]] -= ubytes[u]
    for s in range(S):
        if bcount[s] == 0:  # an empty stage
            return
        ncount[s] = bcount[s]
        bcount[s] = 0
    if train == 1:
        stage_transient(stage, order, act, gradb, again, sgrad, safter)
    for s in range(1, S):
        cut[s] += cut[s - 1]
    for s in range(S):
        tf = 0.0
        tb = 0.0
        for x in range(gptr[s], gptr[s + 1]):
            if tfd[x] > tf:
                tf = tfd[x]
            if tbd[x] > tb:
                tb = tbd[x]
        out_stage[0, s] = tf
        out_stage[1, s] = tb
        p = gptr[s + 1] - gptr[s]
        # the slowest replica (largest backward) paces buckets and units
        xr = gptr[s]
        for x in range(gptr[s], gptr[s + 1]):
            if tbd[x] > tbd[xr]:
                xr = x
        sref[s] = gdev[xr]
        sf = STATE_FACTOR if train == 1 else 1.0
        sstate[s] = sf * sparam[s]
        ar[s] = 0.0
        if p > 1 and shard == 1:  # FSDP units: contiguous in the order, cut at ``cap`` parameter bytes
            nu = 0
            seen = 0
            uf[0] = 0.0
            ub[0] = 0.0
            uby[0] = 0.0
            largest = 0.0
            for pos in range(n):
                v = order[pos]
                if stage[v] != s:
                    continue
                seen += 1
                uby[nu] += param[v]
                if uby[nu] >= cap or seen == ncount[s]:
                    if uby[nu] > largest:
                        largest = uby[nu]
                    nu += 1
                    if seen < ncount[s]:
                        uf[nu] = 0.0
                        ub[nu] = 0.0
                        uby[nu] = 0.0
            # every unit's all-gather synchronises the group: each unit's forward and its backward are paced by
            # the slowest replica of that unit (not by the replica with the largest total backward)
            for x in range(gptr[s], gptr[s + 1]):
                gr = gdev[x]
                k = 0
                fsum = 0.0
                bsum = 0.0
                bys = 0.0
                seen = 0
                for pos in range(n):
                    v = order[pos]
                    if stage[v] != s:
                        continue
                    seen += 1
                    fsum += fvar[gr, v] * sscale[s] + ffix[gr, v]
                    bsum += bvar[gr, v] * sscale[s] + bfix[gr, v]
                    bys += param[v]
                    if bys >= cap or seen == ncount[s]:
                        if fsum > uf[k]:
                            uf[k] = fsum
                        if bsum > ub[k]:
                            ub[k] = bsum
                        k += 1
                        fsum = 0.0
                        bsum = 0.0
                        bys = 0.0
            tf, tb, cm = _fsdp_pass(coll, s, nu, uf, ub, uby, train)
            if train == 0:
                tb = 0.0
            out_stage[0, s] = tf
            out_stage[1, s] = tb
            ar[s] = m * cm
            gf = FSDP_GATHER_FACTOR if train == 1 else FSDP_GATHER_FACTOR - 1.0  # no unsharded gradient
            sstate[s] = sf * sparam[s] / p + gf * largest
        srecv[s] = 0.0
        ct[s] = 0.0
        if s > 0:
            srecv[s] = cut[s - 1] / (m * p)
        if s + 1 < S and sgroup[s] != sgroup[s + 1]:
            p2 = gptr[s + 2] - gptr[s + 1]
            pmin = p if p < p2 else p2
            mlat = 0.0
            minv = 0.0
            for x in range(gptr[s], gptr[s + 1]):
                for y in range(gptr[s + 1], gptr[s + 2]):
                    if lat[gdev[x], gdev[y]] > mlat:
                        mlat = lat[gdev[x], gdev[y]]
                    if inv_bw[gdev[x], gdev[y]] > minv:
                        minv = inv_bw[gdev[x], gdev[y]]
            ct[s] = mlat + cut[s] / (m * pmin) * minv
        cur_mb[s] = sact[s] / (m * p) + srecv[s] if train == 1 else srecv[s]
        sgrad[s] = sgrad[s] / (m * p) if train == 1 else 0.0
        if train == 0:
            out_stage[1, s] = 0.0
    # ------------------------------------------------------------------- event simulation
    for x in range(sm):
        fend[x] = -1.0
        farr[x] = -1.0
        barr[x] = -1.0
    for x in range(G * G):
        lfree[x] = 0.0
    for g in range(G):
        gfree[g] = 0.0
        arfree[g] = 0.0
        cur[g] = 0.0
        peak[g] = 0.0
        out_group[1, g] = 0.0
    rec_n[0] = 0
    comm = 0.0
    for x in range(2 * sm):  # ops in dependency order: every input is timed before it is read
        kind = op_kind[x]
        s = op_stage[x]
        i = op_mb[x]
        g = op_group[x]
        j = s * m + i
        if kind == 0:
            ready = farr[j] if s > 0 else 0.0
            dur = out_stage[0, s]
        else:
            ready = fend[j] if s == S - 1 else barr[j]
            dur = out_stage[1, s]
        st = gfree[g] if gfree[g] > ready else ready
        en = st + dur
        gfree[g] = en
        out_group[1, g] += dur
        if record:
            _rec(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, kind, g, st, en, j)
        if kind == 0:
            fend[j] = en
            cur[g] += cur_mb[s]
            if cur[g] > peak[g]:
                peak[g] = cur[g]
            if train == 0:  # nothing kept for a backward
                cur[g] -= cur_mb[s]
            if s + 1 < S:
                h = sgroup[s + 1]
                if h == g:
                    farr[j + m] = en
                else:
                    link = g * G + h
                    a = en if en > lfree[link] else lfree[link]
                    lfree[link] = a + ct[s]
                    farr[j + m] = a + ct[s]
                    comm += ct[s]
                    if record:
                        _rec(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 2, link, a, a + ct[s], j)
        else:
            if train == 1:  # this micro-batch's gradient buffers, with every micro-batch still held
                if cur[g] + sgrad[s] > peak[g]:
                    peak[g] = cur[g] + sgrad[s]
                cur[g] -= cur_mb[s]
            if s > 0:
                h = sgroup[s - 1]
                if h == g or train == 0:
                    barr[j - m] = en
                else:
                    link = g * G + h
                    a = en if en > lfree[link] else lfree[link]
                    lfree[link] = a + ct[s - 1]
                    barr[j - m] = a + ct[s - 1]
                    comm += ct[s - 1]
                    if record:
                        _rec(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 3, link, a, a + ct[s - 1], j)
            bcount[s] += 1
            if bcount[s] == m:
                lastb[s] = en
                send[s] = en
                p = gptr[s + 1] - gptr[s]
                if p > 1 and shard == 1:
                    comm += ar[s]  # FSDP's collectives are inside its forward / backward spans
                elif p > 1 and train == 1:
                    # DDP: gradient buckets (reverse order, ``cap`` bytes) all-reduced as the last
                    # micro-batch's backward produces them; bucket all-reduces of a group serialise
                    gr = int(sref[s])
                    total = 0.0
                    for pos in range(n):
                        v = order[pos]
                        if stage[v] == s:
                            total += bvar[gr, v] * sscale[s] + bfix[gr, v]
                    cum = 0.0
                    by = 0.0
                    seen = 0
                    chan = arfree[g]
                    for pos in range(n - 1, -1, -1):
                        v = order[pos]
                        if stage[v] != s:
                            continue
                        seen += 1
                        cum += bvar[gr, v] * sscale[s] + bfix[gr, v]
                        by += param[v]
                        if by >= cap or (seen == ncount[s] and by > 0.0):
                            ready = en if total <= 0.0 else st + (en - st) * (cum / total if cum < total else 1.0)
                            a = ready if ready > chan else chan
                            dur = _coll(coll, s, ALLREDUCE, by)
                            chan = a + dur
                            ar[s] += dur
                            if record and dur > 0.0:
                                _rec(rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label, 4, g, a, chan, s)
                            by = 0.0
                    arfree[g] = chan
                    if chan > send[s]:
                        send[s] = chan
                    comm += ar[s]
    step = 0.0
    for s in range(S):
        out_stage[2, s] = send[s]
        out_stage[3, s] = lastb[s]
        out_stage[4, s] = ar[s]
        out_stage[5, s] = cur_mb[s]
        out_stage[6, s] = ct[s]
        if send[s] > step:
            step = send[s]
    for g in range(G):
        out_group[0, g] = peak[g]
    for s in range(S):
        out_group[0, sgroup[s]] += sstate[s]
    out[0] = step
    out[1] = OK
    out[2] = comm
