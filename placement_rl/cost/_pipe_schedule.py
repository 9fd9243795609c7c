"""Micro-batch schedules of the pipeline simulator (see ``pipeline.py``): the op order ``simulate_pipe`` times.

``schedule_order(S, m, sched, sgroup, G)`` runs once per plan layout: it lists every op (kind 0 = forward,
1 = backward; stage; micro-batch; device group) in an order that respects each group's schedule (GPipe, 1F1B,
interleaved 1F1B) and every dependency, so ``_pipe_kernel.simulate_pipe`` times the ops in one pass.

Interleaved 1F1B (v chunks per group): group g warms up with ``min(2 (G - g - 1) + (v - 1) G, m v)`` forwards, then
alternates one forward and one backward, then drains its backwards. That is torch's ``ScheduleInterleaved1F1B``
(what ``deploy`` runs) and Megatron-LM's order at its default micro-batch group size per virtual stage (G), which
every Megatron-LM that takes ``export``'s ``--pipeline-model-parallel-layout`` (core 0.13 on) uses. Older Megatron-LM
releases ran every forward first when ``m == G`` (all ``m v`` chunk-micro-batches held at once on every group): more
activations at the peak than this order, whose later groups start their backwards sooner.

Inference (forward only) asks for GPipe. Where a group holds several virtual stages (an interleaved plan), it runs
the interleaved order's forwards, then the backwards (no time in inference) in their drain order: what torch's
``ScheduleInterleaved1F1B.eval`` runs (its training order with every backward skipped), not GPipe's stage by stage
order, whose backward of a group's first stage would wait on a later stage's forward queued behind it (a deadlock).
"""

from __future__ import annotations

import numpy as np
from numba import njit

GPIPE, ONE_F_ONE_B, INTERLEAVED = 0, 1, 2


@njit(cache=True, nogil=True)
def _build_sequences(S, m, sched, sgroup, G, seq, gseq_ptr):
    """Per device group, the order in which it runs forward/backward ops (fills ``seq`` by group). Groups holding
    several virtual stages (``S > G``) run the interleaved order, GPipe's (inference) with every forward first."""
    sm = S * m
    pos = 0
    for g in range(G):
        gseq_ptr[g] = pos
        if S > G:
            v = S // G  # chunks per group; chunk c of group g is stage c * G + g
            total = m * v
            warm = (G - g - 1) * 2 + (v - 1) * G
            if warm > total or sched == GPIPE:
                warm = total
            for k in range(total + total):
                # position k of the sequence: warm-up forwards, then F/B alternating, then backwards
                if k < warm:
                    kind, j = 0, k
                elif k < warm + 2 * (total - warm):
                    r = k - warm
                    if r % 2 == 0:
                        kind, j = 0, warm + r // 2
                    else:
                        kind, j = 1, r // 2
                else:
                    kind, j = 1, k - warm - (total - warm)
                chunk = (j % (G * v)) // G
                if kind == 1:
                    chunk = v - 1 - chunk
                mb = (j // (G * v)) * G + j % G
                seq[pos] = kind * sm + (chunk * G + g) * m + mb
                pos += 1
        else:
            for s in range(S):
                if sgroup[s] != g:
                    continue
                if sched == GPIPE:
                    warm = m
                else:
                    warm = S - s - 1
                    if warm > m:
                        warm = m
                for i in range(warm):
                    seq[pos] = s * m + i
                    pos += 1
                for i in range(m - warm):
                    seq[pos] = s * m + warm + i
                    seq[pos + 1] = sm + s * m + i
                    pos += 2
                for i in range(m - warm, m):
                    seq[pos] = sm + s * m + i
                    pos += 1
    gseq_ptr[G] = pos


@njit(cache=True, nogil=True)
def schedule_order(S, m, sched, sgroup, G):
    """Ops as (kind, stage, mb, group) arrays in a dependency-respecting order; ok = False on deadlock."""
    sm = S * m
    code = np.empty(2 * sm, dtype=np.int64)
    gseq_ptr = np.empty(G + 1, dtype=np.int64)
    _build_sequences(S, m, sched, sgroup, G, code, gseq_ptr)
    kind = np.empty(2 * sm, dtype=np.int64)
    stage = np.empty(2 * sm, dtype=np.int64)
    mb = np.empty(2 * sm, dtype=np.int64)
    group = np.empty(2 * sm, dtype=np.int64)
    fdone = np.zeros(sm, dtype=np.bool_)
    bdone = np.zeros(sm, dtype=np.bool_)
    gpos = gseq_ptr[:G].copy()
    stack = np.empty(G, dtype=np.int64)
    queued = np.ones(G, dtype=np.bool_)
    for g in range(G):  # worklist: an op that finishes wakes the group it feeds
        stack[g] = G - 1 - g
    top = G
    done = 0
    while top > 0:
        top -= 1
        g = stack[top]
        queued[g] = False
        while gpos[g] < gseq_ptr[g + 1]:
            op = code[gpos[g]]
            k = op // sm
            s = (op % sm) // m
            i = op % m
            if k == 0:
                if s > 0 and not fdone[(s - 1) * m + i]:
                    break
                fdone[s * m + i] = True
                h = sgroup[s + 1] if s + 1 < S else g
            else:
                if not (fdone[s * m + i] if s == S - 1 else bdone[(s + 1) * m + i]):
                    break
                bdone[s * m + i] = True
                h = sgroup[s - 1] if s > 0 else g
            if h != g and not queued[h]:
                stack[top] = h
                queued[h] = True
                top += 1
            kind[done] = k
            stage[done] = s
            mb[done] = i
            group[done] = g
            done += 1
            gpos[g] += 1
    return kind, stage, mb, group, done == 2 * sm
