"""Truncated-lookahead and topology-position features of the constructive state (the teacher's evidence).

The lookahead teacher (``placement_rl.cost.lookahead.eft_rollout``) compares whole completed schedules; a
one-step feature block cannot show what it sees (future transfers over particular links, the backward balance).
These features give the student that evidence at O(W D) node placements per decision:

* **Window** (``window_features``): for every device d the node fits on, the node is placed on d, then the next
  ``W`` nodes of the decision order are placed by the earliest-finish rule (memory-masked, exactly as
  ``complete_eft`` does), and the branch is undone (an undo log of the touched link slots, O(W x in-degree)).
  Reported per device, as gaps to the best device (over the window's time unit, ``schedule.window_time_scale``):
  the forward end, the peak forward + backward load of any device (a lower bound of the step time), the
  communication time so far, and whether the window overflowed a device's memory. ``W = 0`` prices the node
  alone (one step).
* **Step** (``la_step``, ``la_full``, written by ``window_features`` too): when the window reaches the end of the
  decision order, every node is placed and the backward pass is run on the completed placement: ``la_step`` is the
  full step time's gap to the best device, exactly the quantity the lookahead teacher compares, and ``la_full``
  is 1. Before that, ``la_step`` repeats ``la_end`` and ``la_full`` is 0. The backward costs O(N) per device in
  the last ``W + 1`` decisions only (O(W N D) per episode).
* **Backward of the branch** (``la_back``, at every decision): the backward pass of the branch's last placed nodes
  (the ``BACK x W`` nodes placed before the node, the node and its window: ``bwd_range``), started from the
  branch's forward state, as a gap to the best device. The forward end alone is not what the teacher compares
  (it compares forward + backward); this is the backward the branch already implies, O((BACK + 1) W) more node
  steps per device. Once the
  window reaches the last decision it is the whole backward, i.e. ``la_step``.
  Following one feature with no learning (``scripts/probe_features.py``: its ``argmin`` at every decision, W = 256,
  the dev split's 16 synthetic pairs of 449-857 nodes): ``la_end`` 0.951 x ``sim_eft``, ``la_step`` (``la_end``
  before the tail) 0.942, ``la_back`` 0.941, the lookahead teacher 0.932.
* **Topology position** (``topology_features``): how well d is linked to the other devices (its mean bandwidth
  over the best device's), and how well to the node's producers and to the devices holding its consumers'
  other inputs (where the consumers are likely to run): byte-weighted time per byte from those devices to d over
  the topology's fastest link (log1p). Two devices with identical one-step features but different links to the
  rest (a hybrid cube-mesh) differ here.

Both write columns ``BASE ..`` of the feature block that ``schedule._batch_features`` fills (see
``schedule.DEVICE_FEATURES``), for one episode's state arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placement_rl.cost._op_kernel import bwd_range, fwd_candidates, fwd_place

WINDOW_FEATURES = ("la_end", "la_load", "la_comm", "la_over")
TOPOLOGY_FEATURES = ("conn", "prod_link", "cons_link")
STEP_FEATURES = ("la_step", "la_full", "la_back")
BACK = 3  # la_back's backward covers the 3 W placed nodes before the node, the node and its window
EXTRA_FEATURES = WINDOW_FEATURES + TOPOLOGY_FEATURES + STEP_FEATURES
POLICY_WINDOW = 256  # the window W the shipped policy is trained with (conf/trainer/pretrain.yaml)
FULL_WINDOW = 1536  # placing a graph of at most this many nodes, the window covers the rest of the graph (dev split:
# better than W = 256 at 500-1,500 nodes, not at 2,000, where it takes 3-4x the seconds; docs/constructive.md)


def placing_window(num_nodes: int, window: int = POLICY_WINDOW, full_window: int = FULL_WINDOW) -> int:
    """The window a placement of ``num_nodes`` reads: the whole rest of the graph up to ``full_window`` nodes,
    else ``window``."""
    return max(int(window), int(num_nodes)) if 0 < num_nodes <= int(full_window) else int(window)


def window_completions(num_nodes: int, num_devices: int, window: int) -> int:
    """Completed placements one decode at ``window`` evaluates: every device's completion in each of the last
    ``window + 1`` decisions (where the window reaches the end of the graph and the step is run)."""
    return min(int(num_nodes), int(window) + 1) * int(num_devices)


def completions_until(num_nodes: int, num_devices: int, window: int, steps: int) -> int:
    """``window_completions`` of a decode at ``window`` that stopped after its first ``steps`` decisions."""
    tail = min(int(num_nodes), int(window) + 1)
    return max(0, min(int(steps), int(num_nodes)) - (int(num_nodes) - tail)) * int(num_devices)


@njit(cache=True, nogil=True)
def eft_choice(x, mem, static_mem, capacity, nb, eft, bwd):
    """The earliest-finish device of node ``x`` among those it fits on (the most room left if none), the finish
    counted over the whole step: the forward's finish plus the node's backward time there (``sim_eft``'s key, so
    a node with no forward time and a real backward does not go to a slow idle device)."""
    nd = eft.shape[0]
    best, arg = np.inf, -1
    room_best, room_arg = -np.inf, 0
    for j in range(nd):
        after = mem[j] + static_mem[x] + nb[j]
        if after <= capacity[j]:
            key = eft[j] + bwd[x, j]
            if key < best:
                best, arg = key, j
        room = capacity[j] - after
        if room > room_best:
            room_best, room_arg = room, j
    return arg if arg >= 0 else room_arg


@njit(cache=True, nogil=True)
def window_features(t, order, window, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes,
                    fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, inv_scale, finish, arrive, sent,
                    dev_free, link_free, busy, mem, acc, bload, memo_i, memo_stats, allowed, save, undo_slot,
                    undo_val, scratch, est, eft, nb, lb, stats, bfinish, out, col, col_step, rec_n, rec_kind, rec_res,
                    rec_start, rec_end, rec_label):
    """Fill ``out[:, col:col + 4]`` and ``out[:, col_step:col_step + 3]`` (one episode's [D, F] feature block)
    with the window and step features of the node ``order[t]``; the state arrays are left exactly as they were.
    ``save`` [4 D + D * D + 2] and the undo buffers (length >= in-degree sum of any W + 1 consecutive nodes) are
    work space; ``stats`` [D, 6] and ``bfinish`` [N] too; ``rec_*`` the (unused) timeline buffers of ``fwd_place``;
    ``memo_*`` the episode's branch memo (see ``window_stats``). It is ``window_stats`` over every allowed device,
    then ``window_write``."""
    window_stats(t, order, window, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, fwd,
                 bwd, link_upper, link_coef, grad, static_mem, capacity, finish, arrive, sent, dev_free, link_free,
                 busy, mem, acc, bload, memo_i, memo_stats, allowed, save, undo_slot, undo_val, scratch, est,
                 eft, nb, lb, stats, bfinish, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
    window_write(stats, allowed, t + 1 + window >= order.shape[0], inv_scale, out, col, col_step)


@njit(cache=True, nogil=True)
def window_stats(t, order, window, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes,
                 fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, finish, arrive, sent, dev_free,
                 link_free, busy, mem, acc, bload, memo_i, memo_stats, branches, save, undo_slot, undo_val,
                 scratch, est, eft, nb, lb, stats, bfinish, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    """``stats[d]`` (forward end, peak load, communication, overflow, completed step, branch backward; raw times)
    of the branch that puts node ``order[t]`` on each device d with ``branches[d]``; the rows of the other devices
    are not touched, nor are the state arrays (every branch is undone). Branches are independent: two calls on
    two copies of one state with disjoint ``branches`` fill what one call with their union fills
    (``placement_rl.cost.split`` runs them on threads, with an empty memo).

    **Branch memo** (``memo_i`` [1 + D] int64, ``memo_stats`` [D, 6]: one episode's; empty arrays switch it off).
    With a window that reaches the end of the order, the branch that put node ``order[t - 1]`` on the device ``a``
    the episode then took went on to put ``order[t]`` on its earliest-finish device e, from the very state the
    episode is in now: the branch that puts ``order[t]`` on e is that same schedule, so its row is copied instead
    of recomputed (1 of D branches; the same arithmetic on the same state, so the same row bit for bit). e is found
    again here (one node's candidates). ``memo_i[0]`` is the step whose rows are kept (-1: none; a state changed
    other than by placing its next node is reset or copied with its memo), ``memo_i[1 + d]`` whether row d is
    kept, ``memo_stats[d]`` the row."""
    n = order.shape[0]
    nd = dev_free.shape[0]
    end = t + 1 + window
    if end > n:
        end = n
    full = end == n
    lo = 0 if full else max(0, t - BACK * window)  # la_back's range order[lo:end]: the whole prefix once full
    gtime, gbytes, btouched = np.empty(nd), np.empty(nd), np.empty(nd, np.int64)
    memo = full and memo_i.shape[0] > 0
    reuse = -1
    if memo:
        a = dev[order[t - 1]] if t > 0 else -1  # the device the episode took at the step before
        if memo_i[0] == t - 1 and a >= 0 and memo_i[1 + a] == 1:
            # that branch's earliest-finish choice for this node, on this very state
            fwd_candidates(order[t], dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef,
                           finish, arrive, sent, dev_free, link_free, scratch, est, eft, nb, lb)
            e = eft_choice(order[t], mem, static_mem, capacity, nb, eft, bwd)
            if branches[e]:
                reuse = e
                for j in range(stats.shape[1]):
                    stats[e, j] = memo_stats[a, j]
                    memo_stats[e, j] = stats[e, j]
        for j in range(nd):
            memo_i[1 + j] = 1 if j == reuse else 0
        memo_i[0] = t
    elif memo_i.shape[0] > 0:
        memo_i[0] = -1
    # save the small arrays
    for j in range(nd):
        save[j] = dev_free[j]
        save[nd + j] = busy[j]
        save[2 * nd + j] = mem[j]
        save[3 * nd + j] = bload[j]
    for j in range(nd * nd):
        save[4 * nd + j] = link_free[j]
    save[4 * nd + nd * nd] = acc[0]
    save[4 * nd + nd * nd + 1] = acc[1]
    for d in range(nd):
        if not branches[d] or d == reuse:
            continue
        nu = 0
        for s in range(t, end):
            x = order[s]
            if s == t:
                dx = d
            else:
                fwd_candidates(x, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef, finish,
                               arrive, sent, dev_free, link_free, scratch, est, eft, nb, lb)
                dx = eft_choice(x, mem, static_mem, capacity, nb, eft, bwd)
            for p in range(pred_ptr[x], pred_ptr[x + 1]):
                u = pred_idx[p]
                if dev[u] != dx:
                    slot = u * nd + dx
                    undo_slot[nu] = slot
                    undo_val[nu, 0] = arrive[slot]
                    undo_val[nu, 1] = sent[slot]
                    nu += 1
            dev[x] = dx
            bload[dx] += bwd[x, dx]
            fwd_place(x, dx, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef, static_mem,
                      finish, arrive, sent, dev_free, link_free, busy, mem, acc,
                      False, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
        load = 0.0
        over = 0.0
        for j in range(nd):
            w = busy[j] + bload[j]
            if w > load:
                load = w
            if mem[j] > capacity[j]:
                over = 1.0
        stats[d, 0] = acc[1]
        stats[d, 1] = load
        stats[d, 2] = acc[0]
        stats[d, 3] = over
        # the backward of the branch's last placed nodes; in the tail (every node placed) the whole backward, the
        # step time the teacher compares (changes busy, acc, the free times: undone below)
        stats[d, 5] = bwd_range(lo, end, dev, order, succ_ptr, succ_idx, succ_eid, edge_bytes, bwd,
                                link_upper, link_coef, grad, finish, bfinish, dev_free, link_free, gtime, gbytes,
                                btouched, busy, acc, False, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
        if full:
            stats[d, 4] = stats[d, 5]
        else:
            stats[d, 4] = acc[1]
        if memo:
            for j in range(stats.shape[1]):
                memo_stats[d, j] = stats[d, j]
            memo_i[1 + d] = 1
        # undo
        for i in range(nu - 1, -1, -1):
            slot = undo_slot[i]
            arrive[slot] = undo_val[i, 0]
            sent[slot] = undo_val[i, 1]
        for s in range(t, end):
            x = order[s]
            dev[x] = -1
            finish[x] = 0.0
        for j in range(nd):
            dev_free[j] = save[j]
            busy[j] = save[nd + j]
            mem[j] = save[2 * nd + j]
            bload[j] = save[3 * nd + j]
        for j in range(nd * nd):
            link_free[j] = save[4 * nd + j]
        acc[0] = save[4 * nd + nd * nd]
        acc[1] = save[4 * nd + nd * nd + 1]


@njit(cache=True, nogil=True)
def window_write(stats, allowed, full, inv_scale, out, col, col_step):
    """The window and step columns of ``out`` [D, F] from ``window_stats``' rows: gaps to the best allowed
    device over the task's time scale, the overflow flag, and ``la_full`` (``full``: the window reached the end)."""
    nd = out.shape[0]
    for c in (0, 1, 2, 4, 5):
        best = np.inf
        for d in range(nd):
            if allowed[d] and stats[d, c] < best:
                best = stats[d, c]
        at = col + c if c < 4 else (col_step if c == 4 else col_step + 2)
        for d in range(nd):
            out[d, at] = (stats[d, c] - best) * inv_scale if allowed[d] else 0.0
    for d in range(nd):
        out[d, col + 3] = stats[d, 3] if allowed[d] else 0.0
        out[d, col_step + 1] = 1.0 if (full and allowed[d]) else 0.0


@njit(cache=True, nogil=True)
def topology_features(v, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, tpb, conn,
                      out, col):
    """Fill ``out[:, col:col + 3]`` with node ``v``'s topology-position features (see the module doc).
    ``tpb`` [D, D]: time per byte of each link over the fastest link's (1 = the fastest, 0 on the diagonal)."""
    nd = tpb.shape[0]
    for d in range(nd):
        out[d, col] = conn[d]
        pw, pt = 0.0, 0.0
        for p in range(pred_ptr[v], pred_ptr[v + 1]):
            du = dev[pred_idx[p]]
            if du >= 0:
                b = edge_bytes[pred_eid[p]]
                pw += b
                pt += b * tpb[du, d]
        out[d, col + 1] = np.log1p(pt / pw) if pw > 0.0 else 0.0
        cw, ct = 0.0, 0.0
        for q in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[q]
            for p in range(pred_ptr[w], pred_ptr[w + 1]):
                u = pred_idx[p]
                if u != v and dev[u] >= 0:
                    b = edge_bytes[pred_eid[p]]
                    cw += b
                    ct += b * tpb[d, dev[u]]
        out[d, col + 2] = np.log1p(ct / cw) if cw > 0.0 else 0.0


def link_position(inv_bandwidth: np.ndarray, latency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tpb [D, D], conn [D])`` of a topology: each link's time per MiB over the fastest link's, and each
    device's mean bandwidth to the others over the best-connected device's (1 on a single device)."""
    nd = inv_bandwidth.shape[0]
    per = latency / 2**20 + inv_bandwidth
    np.fill_diagonal(per, 0.0)
    if nd < 2:
        return np.zeros((nd, nd)), np.ones(nd)
    off = ~np.eye(nd, dtype=bool)
    fastest = float(per[off].min())
    tpb = per / max(fastest, 1e-30)
    bw = np.where(off, 1.0 / np.maximum(per, 1e-30), 0.0).sum(axis=1) / (nd - 1)
    return np.ascontiguousarray(tpb), np.ascontiguousarray(bw / bw.max())


def undo_capacity(pred_ptr: np.ndarray, order: np.ndarray, window: int) -> int:
    """The largest in-degree sum of ``window + 1`` consecutive nodes of ``order`` (the undo log's length)."""
    deg = np.diff(pred_ptr)[order]
    if deg.size == 0:
        return 1
    c = np.concatenate([[0], np.cumsum(deg)])
    w = min(window + 1, deg.size)
    return int(max(1, (c[w:] - c[:-w]).max()))
