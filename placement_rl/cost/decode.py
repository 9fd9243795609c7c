"""The one decode kernel of constructive placement: from any step, for every episode, with a chooser.

``decode(state, chooser, head=None)`` places ``state``'s remaining nodes (from ``state.step``) in every episode:

* ``EARLIEST_FINISH``: the device where the node's forward ends first among those it fits on (``sim_eft``);
* ``POLICY``: the argmax of a device head's scores (``device_scores``: the constructive policy's head as float64
  arrays, ``DevicePolicy.logits`` without its constant output bias; parity-tested against torch), over the full
  feature block (window and topology features included).

Rollout over a base policy (``placement_rl.cost.lookahead.eft_rollout`` over ``EARLIEST_FINISH``,
``agents.policy_rollout`` over ``POLICY``) branches a state with ``ScheduleState.branch_from`` and completes each
branch with this kernel. Everything runs on the same state arrays and the same per-node kernels as ``simulate()``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placement_rl.cost.schedule import _NO_REC, ScheduleState, _batch_extra, _batch_features, _batch_place

EARLIEST_FINISH, POLICY = 0, 1
_M, _V = np.zeros((1, 1)), np.zeros(1)
_NO_HEAD = (_M, _M, _V, _M, _V, _M, _V, _M, _M, _V, _M)  # node_h, w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5


@njit(cache=True, nogil=True)
def device_scores(f, hv, mask, w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5, out):
    """``out[d]``: the head's score of every device from its features ``f`` [D, F] and the node embedding ``hv``
    [H]; masked devices get -inf (``DevicePolicy.logits`` without the constant output bias)."""
    nd = f.shape[0]
    x = np.maximum(f.astype(np.float64) @ w1 + b1, 0.0) @ w2 + b2 + hv
    h = np.maximum(np.maximum(x, 0.0) @ w3 + b3, 0.0)
    ctx = np.zeros(h.shape[1])
    cnt = 0.0
    for d in range(nd):
        if mask[d]:
            ctx += h[d]
            cnt += 1.0
    ctx /= max(cnt, 1.0)
    z = np.maximum(h @ w4a + ctx @ w4b + b4, 0.0) @ w5
    for d in range(nd):
        out[d] = z[d, 0] if mask[d] else -np.inf


@njit(cache=True, nogil=True)
def _decode(start, chooser, order, window, node_h, w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5,
            dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, fwd, bwd, link_upper,
            link_coef, grad, static_mem, capacity, speed, inv_scale, inv_scale_w, tpb, conn, finish, arrive, sent,
            dev_free, link_free, busy, mem, acc, bload, memo_i, memo_stats, scratch, est, eft, nb, lb, feats, mask,
            save, undo_slot, undo_val, stats, bfinish, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    n = order.shape[0]
    k_eps, nd = dev_free.shape
    act = np.zeros(k_eps, np.int64)
    z = np.zeros(nd)
    for t in range(start, n):
        v = order[t]
        _batch_features(v, t / n, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                        static_mem, capacity, speed, inv_scale, finish, arrive, sent, dev_free, link_free, busy, mem,
                        acc, bload, scratch, est, eft, nb, lb, feats, mask)
        if chooser == 1:
            _batch_extra(t, order, window, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid,
                         edge_bytes, fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, inv_scale_w, tpb,
                         conn, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload, memo_i,
                         memo_stats, mask, save, undo_slot, undo_val, scratch, est, eft, nb, lb, stats, bfinish, feats,
                         rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
        for k in range(k_eps):
            if chooser == 1:
                device_scores(feats[k], node_h[v], mask[k], w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5, z)
            else:
                for d in range(nd):
                    z[d] = -feats[k, d, 1]  # earliest finish: the smallest eft gap
            best, arg = -np.inf, 0
            for d in range(nd):
                if mask[k, d] and z[d] > best:
                    best, arg = z[d], d
            act[k] = arg
        _batch_place(v, act, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                     static_mem, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload, rec_n, rec_kind,
                     rec_res, rec_start, rec_end, rec_label)


def decode(st: ScheduleState, chooser: int, head: tuple | None = None) -> None:
    """Place ``st``'s remaining nodes in every episode by ``chooser``; ``head`` = ``(node_h [N, H], weights)`` for
    ``POLICY`` (``agents.fast_decode.Head.arrays()``)."""
    if chooser == POLICY:
        if head is None:
            raise ValueError("the POLICY chooser needs a head (node embeddings and weights)")
        node_h, weights = head
    elif chooser == EARLIEST_FINISH:
        node_h, weights = _NO_HEAD[0], _NO_HEAD[1:]
    else:
        raise ValueError(f"unknown chooser {chooser!r}")
    _decode(st.step, chooser, st.order, st.window, node_h, *weights, *st.kernel_state())
    st.step = st.num_nodes
