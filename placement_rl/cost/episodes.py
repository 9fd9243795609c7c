"""The window, topology and step feature columns of every episode of a ``ScheduleState`` at its current step, the
episodes on threads (``ScheduleState.features`` calls ``episodes_extra`` when ``PLACEMENT_RL_DECODE_THREADS`` asks;
each episode's arithmetic is the serial kernel's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit, prange

from placement_rl.cost.features import STEP_COL, TOPOLOGY_COL, WINDOW_COL
from placement_rl.cost.threads import _threads
from placement_rl.cost.window import topology_features, window_features

if TYPE_CHECKING:
    from placement_rl.cost.schedule import ScheduleState


@njit(parallel=True, cache=True, nogil=True)
def _episodes_extra(t, order, window, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes,
                    fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, inv_scale, tpb, conn, finish, arrive,
                    sent, dev_free, link_free, busy, mem, acc, bload, memo_i, memo_stats, mask, e_save,
                    e_undo_slot, e_undo_val,
                    e_scratch, e_est, e_eft, e_nb, e_lb, e_stats, e_bfinish, feats, rec_n, rec_kind, rec_res,
                    rec_start, rec_end, rec_label):
    """``schedule._batch_extra`` with the episodes on threads (contiguous blocks of episodes per thread, so two
    threads share at most the cache lines at one block boundary), each with its own work buffers."""
    v = order[t]
    for k in prange(dev.shape[0]):
        window_features(t, order, window, dev[k], pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid,
                        edge_bytes, fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, inv_scale, finish[k],
                        arrive[k], sent[k], dev_free[k], link_free[k], busy[k], mem[k], acc[k], bload[k], memo_i[k],
                        memo_stats[k], mask[k],
                        e_save[k], e_undo_slot[k], e_undo_val[k], e_scratch[k], e_est[k], e_eft[k], e_nb[k], e_lb[k],
                        e_stats[k], e_bfinish[k], feats[k], WINDOW_COL, STEP_COL, rec_n, rec_kind, rec_res,
                        rec_start, rec_end, rec_label)
        topology_features(v, dev[k], pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, tpb,
                          conn, feats[k], TOPOLOGY_COL)


_MASK_AT = 32  # index of ``mask`` in ``ScheduleState.extra_args()``
MIN_STEP_WORK = 10_000  # node-device evaluations of one step's window features (K x W x D^2) worth a thread launch


def episode_threads(st: ScheduleState) -> int:
    """Threads ``st.features()`` spreads its episodes' window features over (1: the serial kernel): as
    ``split_threads`` asks (``PLACEMENT_RL_DECODE_THREADS``), for at least two episodes and a step worth it."""
    k, nd = st.episodes, st.topology.num_devices
    if k < 2 or st.window <= 0 or st.done:
        return 1
    return _threads(k * min(st.window, st.num_nodes - st.step) * nd * nd, MIN_STEP_WORK, k)


def episodes_extra(st: ScheduleState) -> None:
    """The window, topology and step columns of every episode of ``st`` at its current step, the episodes on
    threads (the same values as ``schedule._batch_extra``: each episode's arithmetic is unchanged)."""
    work = st.__dict__.get("_episode_work")
    if work is None:
        work = st._episode_work = _work_buffers(st, st.episodes)
    a = st.extra_args()  # (..., mask, save, undo_slot, undo_val, scratch, est, eft, nb, lb, stats, bfinish, feats, rec)
    i = _MASK_AT  # the shared work buffers between ``mask`` and ``feats`` are replaced by the per-episode ones
    if a[i] is not st.mask or a[i + 11] is not st.feats:
        raise RuntimeError("ScheduleState.extra_args changed its layout: update episodes._MASK_AT")
    _episodes_extra(*a[:i + 1], *work, *a[i + 11:])


def _work_buffers(st: ScheduleState, rows: int) -> tuple[np.ndarray, ...]:
    """Per-row copies of ``st``'s window work buffers (save, undo log, scratch, est, eft, nb, lb, stats,
    bfinish); the undo log is sized for ``st``'s own decision order."""
    nd, cap = st.topology.num_devices, st._undo_slot.shape[0]
    return (np.zeros((rows, st._save.shape[0])), np.zeros((rows, cap), np.int64), np.zeros((rows, cap, 2)),
            *(np.zeros((rows, nd)) for _ in range(5)), np.zeros((rows,) + st._stats.shape),
            np.zeros((rows, st.num_nodes)))
