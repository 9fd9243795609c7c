"""The greedy policy decode with one decision's device branches split over threads (``decode_split``).

A decision's window features (``placement_rl.cost.window``) branch the schedule once per device: place the node
there, complete the next W nodes by the earliest-finish rule, measure, undo. The branches are independent, and
they are 95% of a zero-shot decode's time (0.6-0.9 ms per decision at W = 256 on 8 devices, O(N^2 D^2) in all
with the whole-graph window). ``decode_split`` keeps T identical copies of one episode's schedule (a
``ScheduleState`` with T episodes that all take the same action), and at every decision thread k branches the
devices ``d % T == k`` on copy k (``window_stats``); the rows are then merged and normalised once
(``window_write``), the topology features and the policy head read them, and the chosen device is placed in every
copy. Each branch does exactly the arithmetic of the serial kernel on an identical state, so the placement is the
serial decode's, bit for bit (tested); only the seconds change (about T x on T idle cores for T <= D).

``split_threads(state)`` says how many threads a greedy decode of ``state`` uses. The environment variable
``PLACEMENT_RL_DECODE_THREADS`` asks: unset or ``1``, the serial kernel (the library default); ``auto``, numba's
thread count (``NUMBA_NUM_THREADS``, default the machine's cores); ``N``, N threads. The ``placement-rl`` command
sets ``auto`` for itself. Whatever is asked, at most the device count, and 1 for a state without a window, with
several episodes, so small (N x W x D^2 under ``MIN_WORK``) that the threads' start-up costs more than they save,
or in a ``multiprocessing`` child. Why not threads by default: the fast threading layer here is GNU OpenMP, which
torch shares and which is not fork-safe. Measured: after one threaded decode, a ``fork`` ``Pool`` child hangs in its
first torch layer norm even with ``torch.set_num_threads(1)`` in the parent (without the threaded decode it
returns); numba's fork-safe ``workqueue`` layer wakes its threads too slowly for a launch per decision (no gain at
4,000 nodes). A library user who forks after placing keeps the serial kernel; a process that does not fork (the
command, a script) can ask for threads. Ray workers run one thread each (``placement_rl.scale``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from placement_rl.cost._op_kernel import fwd_place
from placement_rl.cost.decode import device_scores
from placement_rl.cost.features import STEP_COL, TOPOLOGY_COL, WINDOW_COL
from placement_rl.cost.schedule import ScheduleState, _batch_features
from placement_rl.cost.episodes import MIN_STEP_WORK, _work_buffers, episode_threads, episodes_extra  # noqa: F401
from placement_rl.cost.threads import (MIN_WORK, THREADS_ENV, _threads, parse_threads,  # noqa: F401 (re-exported)
                                       requested_threads, threads_asked)
from placement_rl.cost.window import topology_features, window_stats, window_write

SPREAD = 4  # copy c is episode c x SPREAD of the replicated state: copies written by two threads never share a
# cache line (a copy's smallest per-episode arrays are 16 bytes, 4 rows apart is 64; adjacent, the writes thrash a line)


@njit(parallel=True, cache=True, nogil=True)
def _decode_split(start, order, window, node_h, w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5,
                  dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, fwd, bwd, link_upper,
                  link_coef, grad, static_mem, capacity, speed, inv_scale, inv_scale_w, tpb, conn, finish, arrive,
                  sent, dev_free, link_free, busy, mem, acc, bload, memo_i, memo_stats, scratch, est, eft, nb, lb,
                  feats, mask, save, undo_slot, undo_val, stats, bfinish, rec_n, rec_kind, rec_res, rec_start, rec_end,
                  rec_label,
                  t_save, t_undo_slot, t_undo_val, t_scratch, t_est, t_eft, t_nb, t_lb, t_stats, t_bfinish, part):
    n = order.shape[0]
    rows, nd = dev_free.shape
    copies = rows // SPREAD
    z = np.zeros(nd)
    no_memo, no_rows = memo_i[0, :0], memo_stats[0, :0]  # a copy holds only its share of the branches: no memo
    for t in range(start, n):
        v = order[t]
        # the one-step features of copy 0 (every copy holds the same schedule)
        _batch_features(v, t / n, dev[:1], pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper,
                        link_coef, static_mem, capacity, speed, inv_scale, finish[:1], arrive[:1], sent[:1],
                        dev_free[:1], link_free[:1], busy[:1], mem[:1], acc[:1], bload[:1], scratch, est, eft, nb, lb,
                        feats[:1], mask[:1])
        for c in prange(copies):
            k = c * SPREAD
            for d in range(nd):
                part[k, d] = mask[0, d] and d % copies == c
            window_stats(t, order, window, dev[k], pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid,
                         edge_bytes, fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, finish[k],
                         arrive[k], sent[k], dev_free[k], link_free[k], busy[k], mem[k], acc[k], bload[k], no_memo,
                         no_rows, part[k],
                         t_save[k], t_undo_slot[k], t_undo_val[k], t_scratch[k], t_est[k], t_eft[k], t_nb[k], t_lb[k],
                         t_stats[k], t_bfinish[k], rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
        for d in range(nd):
            for j in range(stats.shape[1]):
                stats[d, j] = t_stats[(d % copies) * SPREAD, d, j]
        window_write(stats, mask[0], t + 1 + window >= n, inv_scale_w, feats[0], WINDOW_COL, STEP_COL)
        topology_features(v, dev[0], pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, tpb,
                          conn, feats[0], TOPOLOGY_COL)
        device_scores(feats[0], node_h[v], mask[0], w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5, z)
        best, arg = -np.inf, 0
        for d in range(nd):
            if mask[0, d] and z[d] > best:
                best, arg = z[d], d
        for c in range(copies):  # every copy takes the decision (the padding episodes between them are never read)
            k = c * SPREAD
            dev[k, v] = arg
            bload[k, arg] += bwd[v, arg]
            fwd_place(v, arg, dev[k], pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef, static_mem,
                      finish[k], arrive[k], sent[k], dev_free[k], link_free[k], busy[k], mem[k], acc[k],
                      False, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)




def split_threads(st: ScheduleState) -> int:
    """Threads a greedy decode of ``st`` would use (1: the serial kernel; see the module doc)."""
    nd, n = st.topology.num_devices, st.num_nodes
    if st.episodes != 1 or st.window <= 0 or nd < 2:
        return 1
    return _threads((n - st.step) * min(st.window, n) * nd * nd, MIN_WORK, nd)


def decode_split(st: ScheduleState, head: tuple, threads: int) -> None:
    """Place ``st``'s remaining nodes greedily by the policy ``head`` (``agents.fast_decode.Head.arrays()``), as
    ``decode(st, POLICY, head)`` does, with each decision's branches on ``threads`` threads. ``st`` has one
    episode."""
    if st.episodes != 1:
        raise ValueError(f"decode_split places one episode; the state has {st.episodes}")
    copies = max(1, min(int(threads), st.topology.num_devices))
    rows = copies * SPREAD
    rep = ScheduleState(st.graph, st.costs, st.topology, episodes=rows, window=st.window)
    for name in ScheduleState._EPISODE_ARRAYS:
        getattr(rep, name)[:] = getattr(st, name)[0]
    part = np.zeros((rows, st.topology.num_devices), np.bool_)
    node_h, weights = head
    _decode_split(st.step, st.order, st.window, node_h, *weights, *rep.kernel_state(), *_work_buffers(st, rows), part)
    for name in ScheduleState._EPISODE_ARRAYS:
        getattr(st, name)[0] = getattr(rep, name)[0]
    st.feats[0], st.mask[0] = rep.feats[0], rep.mask[0]
    st.step = st.num_nodes
