"""The one decode kernel of constructive placement: from any step, for every episode, with a chooser.

``decode(state, chooser, head=None)`` places ``state``'s remaining nodes (from ``state.step``) in every episode:

* ``EARLIEST_FINISH``: the device where the node's forward ends first among those it fits on, counting the
  node's backward time there too (``sim_eft``: a node with no forward time and a real backward does not go to a
  slow idle device);
* ``POLICY``: the argmax of a device head's scores (``device_scores``: the constructive policy's head as float64
  arrays, ``DevicePolicy.logits`` without its constant output bias; parity-tested against torch), over the full
  feature block (window and topology features included);
* ``SAMPLE``: a sample of the same head's softmax at ``temperature`` (Gumbel-max with numba's generator seeded by
  ``seed``: the same seed, the same samples), independently per episode (``agents.policy_search``);
* ``LA_RULE``: the device with the smallest ``la_step`` (the completed step of each device's earliest-finish
  completion once the window reaches the end of the graph; ``la_end`` before), near-ties (1e-9 of the time unit)
  by the earliest finish: the rule the lookahead feature is, with no network (``baselines.eft.la_rule``);
* ``FORCED``: the device ``forced[node]`` (a given placement replayed, e.g. the prefix an incumbent fixes).

``stop`` ends the decode at that step (default: the last), so a prefix can be replayed and the rest decoded by
another chooser. ``decode_until(state, chooser, head, deadline=)`` decodes in chunks and, once the wall clock
passes ``deadline``, places the rest by ``EARLIEST_FINISH`` (a one-pass start that fits a search's seconds).
``decode_windows(graph, costs, topology, chooser, head, window=, deadline=)`` is the start a search with seconds
takes: whole decodes at the windows that fit before ``deadline`` (a ``SMALL_WINDOW`` one first, which times the
kernel, then ``window`` and its halvings, largest first, each only when its predicted time fits), the best kept.
At 2,000 nodes the lookahead at ``window`` takes 0.3-0.9 s on this machine: cut by a short deadline, it leaves
most of the graph to the earliest finish (the benchmark's 2,000-node graphs, 0.5 s: ``la_rule_search`` 1.071 x
``la_rule`` with its start cut, 0.975 with this one).

Rollout over a base policy (``placement_rl.cost.lookahead.eft_rollout`` over ``EARLIEST_FINISH``,
``agents.policy_rollout`` over ``POLICY``) branches a state with ``ScheduleState.branch_from`` and completes each
branch with this kernel. Everything runs on the same state arrays and the same per-node kernels as ``simulate()``.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from placement_rl.cost.schedule import (_NO_REC, DEVICE_FEATURES, ScheduleState, _batch_extra, _batch_features,
                                        _batch_place)

EARLIEST_FINISH, POLICY, SAMPLE, FORCED, LA_RULE = 0, 1, 2, 3, 4
LA_STEP_COL = DEVICE_FEATURES.index("la_step")
_M, _V = np.zeros((1, 1)), np.zeros(1)
_NO_FORCED = np.zeros(1, np.int64)
CHUNK = 32  # decisions between two looks at the clock in ``decode_until``
SMALL_WINDOW = 16  # ``decode_windows``' first window: whole in 0.01-0.09 s up to 2,000 nodes on this machine
START_SHARE = 0.5  # the share of a search's seconds its one-pass start may take (policy_search, la_rule_search).
# Dev (5 memory-feasible 2,000-node graphs of seeds 6-7, 8 dev pairs; 0.5 / 2 / 10 s), policy_search over the best
# other search: 0.5: 1.005 / 1.000 / 1.004 and 0.998 / 1.002 / 1.008; 1.0: 0.999 / 1.001 / 1.006 and 0.999 / 1.004 /
# 1.012. Level within the noise; half leaves the annealing more of the seconds.
OVERHEAD = 12  # a decision at window W costs ~ (min(W, decisions left) + OVERHEAD) node steps (2,000-node graphs,
# W 16..256: decode seconds over W + 12 within 20%)
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
def _decode(start, stop, chooser, temperature, seed, forced, order, window, node_h, w1, b1, w2, b2, w3, b3, w4a,
            w4b, b4, w5, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, fwd, bwd,
            link_upper, link_coef, grad, static_mem, capacity, speed, inv_scale, inv_scale_w, tpb, conn, finish,
            arrive, sent, dev_free, link_free, busy, mem, acc, bload, memo_i, memo_stats, scratch, est, eft, nb, lb,
            feats, mask, save, undo_slot, undo_val, stats, bfinish, rec_n, rec_kind, rec_res, rec_start, rec_end,
            rec_label):
    n = order.shape[0]
    k_eps, nd = dev_free.shape
    act = np.zeros(k_eps, np.int64)
    z = np.zeros(nd)
    if chooser == 2:
        np.random.seed(seed)
    inv_t = 1.0 / temperature
    for t in range(start, stop):
        v = order[t]
        _batch_features(v, t / n, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                        static_mem, capacity, speed, inv_scale, finish, arrive, sent, dev_free, link_free, busy, mem,
                        acc, bload, scratch, est, eft, nb, lb, feats, mask)
        if chooser == 1 or chooser == 2 or chooser == 4:
            _batch_extra(t, order, window, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid,
                         edge_bytes, fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, inv_scale_w, tpb,
                         conn, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload, memo_i,
                         memo_stats, mask, save, undo_slot, undo_val, scratch, est, eft, nb, lb, stats, bfinish, feats,
                         rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)
        for k in range(k_eps):
            if chooser == 1 or chooser == 2:
                device_scores(feats[k], node_h[v], mask[k], w1, b1, w2, b2, w3, b3, w4a, w4b, b4, w5, z)
                if chooser == 2:
                    for d in range(nd):
                        z[d] = z[d] * inv_t - np.log(-np.log(np.random.random() * (1.0 - 1e-12) + 1e-12))
            elif chooser == 4:
                lo = np.inf
                for d in range(nd):
                    if mask[k, d] and feats[k, d, LA_STEP_COL] < lo:
                        lo = feats[k, d, LA_STEP_COL]
                for d in range(nd):
                    near = mask[k, d] and feats[k, d, LA_STEP_COL] <= lo + 1e-9
                    z[d] = -feats[k, d, 1] if near else -np.inf
            elif chooser == 3:
                for d in range(nd):
                    z[d] = 1.0 if d == forced[v] else 0.0
            else:
                for d in range(nd):
                    z[d] = -(feats[k, d, 1] + feats[k, d, 4])  # earliest finish of the whole step: eft + bwd
            best, arg = -np.inf, 0
            for d in range(nd):
                if mask[k, d] and z[d] > best:
                    best, arg = z[d], d
            act[k] = arg
        _batch_place(v, act, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                     static_mem, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload, rec_n, rec_kind,
                     rec_res, rec_start, rec_end, rec_label)


def decode(st: ScheduleState, chooser: int, head: tuple | None = None, *, stop: int | None = None,
           temperature: float = 1.0, seed: int = 0, forced: np.ndarray | None = None) -> None:
    """Place ``st``'s nodes from ``st.step`` up to step ``stop`` (default: all) in every episode by ``chooser``;
    ``head`` = ``(node_h [N, H], weights)`` for ``POLICY`` / ``SAMPLE`` (``agents.fast_decode.Head.arrays()``),
    ``forced`` [N] (a device per node) for ``FORCED``."""
    if chooser in (POLICY, SAMPLE):
        if head is None:
            raise ValueError("the POLICY and SAMPLE choosers need a head (node embeddings and weights)")
        node_h, weights = head
    elif chooser in (EARLIEST_FINISH, FORCED, LA_RULE):
        node_h, weights = _NO_HEAD[0], _NO_HEAD[1:]
    else:
        raise ValueError(f"unknown chooser {chooser!r}")
    if chooser == FORCED:
        if forced is None or len(forced) != st.num_nodes:
            raise ValueError("the FORCED chooser needs a device per node")
        forced = np.ascontiguousarray(forced, dtype=np.int64)
    else:
        forced = _NO_FORCED
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    end = st.num_nodes if stop is None else max(st.step, min(int(stop), st.num_nodes))
    _decode(st.step, end, chooser, float(temperature), int(seed) % (2**32), forced, st.order, st.window, node_h,
            *weights, *st.kernel_state())
    st.step = end


def decode_until(st: ScheduleState, chooser: int, head: tuple | None = None, *, deadline: float | None = None,
                 chunk: int = CHUNK) -> int:
    """``decode`` the rest of ``st`` by ``chooser`` while ``time.perf_counter()`` is before ``deadline`` (checked
    every ``chunk`` decisions), the rest by ``EARLIEST_FINISH`` once it has passed; returns the number of decisions
    ``chooser`` made (``st.num_nodes`` when the deadline never came)."""
    if deadline is None:
        decode(st, chooser, head)
        return st.num_nodes
    while st.step < st.num_nodes:
        if time.perf_counter() >= deadline:
            done = st.step
            decode(st, EARLIEST_FINISH)
            return done
        decode(st, chooser, head, stop=st.step + int(chunk))
    return st.num_nodes


def _work(n: int, w: int) -> float:
    """Node steps of a decode of ``n`` decisions at window ``w``: sum over decisions of min(w, decisions left)."""
    w = max(0, min(int(w), n - 1))
    return w * (w - 1) / 2 + (n - w) * w + OVERHEAD * n


def decode_windows(graph, costs, topology, chooser: int, head: tuple | None = None, *, window: int,
                   deadline: float | None = None, small: int = SMALL_WINDOW,
                   log: list | None = None) -> tuple[ScheduleState, int]:
    """``(state, completions)``: the best of whole decodes of a fresh state by ``chooser`` at the windows that fit
    before ``deadline`` (module doc), and the completed placements they evaluated (``window_completions`` each,
    plus one step time per decode after the first: the caller scores the state it keeps). With no deadline, the
    one decode at ``window``. ``log`` gets ``(window, decisions the chooser made, step time)`` per decode."""
    from placement_rl.cost.window import completions_until

    n, nd = graph.num_nodes, topology.num_devices
    window = min(int(window), max(n, 1))  # a window past the last decision decodes as the whole rest
    todo = [window] if deadline is None else [min(int(small), window), *_halvings(window, int(small))]
    best, calls, rate = None, 0, None
    for w in todo:
        if best is not None:
            if rate is None or time.perf_counter() + rate * _work(n, w) > deadline:
                continue
            calls += 1
        t = time.perf_counter()
        st = ScheduleState(graph, costs, topology, episodes=1, window=w)
        done = decode_until(st, chooser, head, deadline=deadline)
        calls += completions_until(n, nd, w, done)
        if done == n:  # a whole decode times the kernel for the next prediction
            rate = (time.perf_counter() - t) / max(_work(n, w), 1.0)
        if log is not None:
            log.append((w, done, float(st.finish()[0])))
        if best is None or state_key(st) < state_key(best):
            best = st
    return best, calls


def _halvings(window: int, small: int) -> list[int]:
    """``window`` when larger than ``small`` (``small`` is decoded first), then its halvings while at least twice
    ``small``."""
    out, w = [], int(window)
    while w > small:
        out.append(w)
        w //= 2
        if w < 2 * small:
            break
    return out


def state_key(st: ScheduleState) -> tuple[bool, float]:
    """Order of a one-episode state's placement: feasible first, then the shorter step."""
    return (not bool(st.feasible()[0]), float(st.finish()[0]))
