"""Greedy decoding of a ``DevicePolicy`` in one compiled loop (zero-shot placement of large graphs).

The node embeddings come from the policy's encoder (torch, once); the per-decision work (the schedule
features, the device head, the argmax and the state update) runs in numba with the head's weights as arrays,
so a decision costs microseconds instead of a torch call. ``greedy_devices(policy, state, node_h)`` gives the
same placement as ``agents.constructive.rollout(..., greedy=True)`` up to float rounding ties.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placement_rl.cost.schedule import ScheduleState, _batch_features, _batch_place


@njit(cache=True, nogil=True)
def _decode(order, node_h, w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5, b5,
            dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef, static_mem, capacity, speed,
            inv_scale, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload, scratch, est, eft, nb, lb,
            feats, mask, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label):
    n = order.shape[0]
    nd = dev_free.shape[1]
    act = np.zeros(1, np.int64)
    for t in range(n):
        v = order[t]
        _batch_features(v, t / n, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                        static_mem, capacity, speed, inv_scale, finish, arrive, sent, dev_free, link_free, busy, mem,
                        acc, bload, scratch, est, eft, nb, lb, feats, mask)
        f = feats[0].astype(np.float64)
        x = np.maximum(f @ w1 + b1, 0.0) @ w2 + b2 + node_h[v]
        h = np.maximum(np.maximum(x, 0.0) @ w3 + b3, 0.0)
        ctx = np.zeros(h.shape[1])
        cnt = 0.0
        for d in range(nd):
            if mask[0, d]:
                ctx += h[d]
                cnt += 1.0
        ctx /= max(cnt, 1.0)
        z = np.maximum(h @ w4a + ctx @ w4b + b4, 0.0) @ w5
        best, arg = -np.inf, 0
        for d in range(nd):
            if mask[0, d] and z[d, 0] > best:
                best, arg = z[d, 0], d
        act[0] = arg
        _batch_place(v, act, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                     static_mem, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload, rec_n, rec_kind,
                     rec_res, rec_start, rec_end, rec_label)


def greedy_devices(policy, st: ScheduleState, node_h: np.ndarray) -> None:
    """Place every node of ``st`` (one episode, freshly reset) greedily; ``node_h`` [N, H] float64."""
    from placement_rl.cost.schedule import _NO_REC

    w = {k: np.ascontiguousarray(v.detach().double().numpy()) for k, v in policy.state_dict().items()
         if not k.startswith("encoder.")}
    hdim = w["phi.1.weight"].shape[0]
    w4 = np.ascontiguousarray(w["rho.0.weight"].T)
    st.reset()
    _decode(st.order, np.ascontiguousarray(node_h), np.ascontiguousarray(w["dev_in.0.weight"].T), w["dev_in.0.bias"],
            np.ascontiguousarray(w["dev_in.2.weight"].T), w["dev_in.2.bias"], np.ascontiguousarray(w["phi.1.weight"].T),
            w["phi.1.bias"], np.ascontiguousarray(w4[:hdim]), np.ascontiguousarray(w4[hdim:]), w["rho.0.bias"],
            np.ascontiguousarray(w["rho.2.weight"].T), w["rho.2.bias"],
            st.devices, *st._g, st._fwd, st._bwd, st._link_upper, st._link_coef, st._static, st.capacity, st._speed,
            1.0 / st.scale, st._finish, st._arrive, st._sent, st._dev_free, st._link_free, st.busy, st.memory,
            st._acc, st.bwd_busy, st._scratch, st._est, st._eft, st._nb, st._lb, st.feats, st.mask, *_NO_REC)
    st.step = st.num_nodes
