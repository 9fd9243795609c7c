"""The incremental list-scheduling state that constructive placement steps through.

``ScheduleState(graph, costs, topology, episodes=K)`` holds K partial schedules of one task (K episodes that
place the same graph side by side, e.g. K samples of a policy). Nodes are placed one at a time in the
simulator's priority order (``order``); after each decision the state holds, per episode, every device's ready
time, every directed link's busy time, what each device holds in memory and when each placed node's output
is where. ``features(node)`` prices the next node on every device without changing the state (earliest
start and finish including input transfers over the topology's links, bytes it would receive, memory left)
as a per-device feature block normalised by the task's time scale, with a mask of the devices that can take
it; ``place(node, devices)`` commits one device per episode at O(in-degree) cost. After the last node,
``finish()`` runs the backward pass and returns each episode's step time, which equals
``simulate(graph, costs, topology, placement)`` exactly: both run the kernels of ``_op_kernel``.

Per-device features (``DEVICE_FEATURES``; times divided by ``scale``, the task's critical path on the fastest
devices or its total work over the device count, whichever is larger; the window and step columns, ``la_end`` ..
``la_comm``, ``la_step``, ``la_back``, by ``window_scale``, which is ``scale`` up to ``WINDOW_UNIT_NODES`` nodes and
``scale x WINDOW_UNIT_NODES / N`` above: ``window_time_scale``):

=====================  ==========================================================================
``est_gap``            earliest start on d minus the best earliest start
``eft_gap``            earliest finish on d minus the best earliest finish
``exec``               the node's forward time on d
``slowdown``           forward time on d over the fastest device's, minus 1 (clipped at 10)
``bwd``                the node's backward time on d
``local_frac``         fraction of the node's input bytes already on d
``recv_frac``          bytes it would receive on d over its input bytes
``extends``            finish on d minus the forward pass's current end (> 0: it grows the schedule)
``idle``               d's ready time minus the latest device ready time
``load``               forward work already on d
``mem_after``          d's memory after placing the node, over its capacity
``mem_now``            d's memory now, over its capacity
``best_eft``           1 if d gives the earliest finish (HEFT's choice), else 0
``best_est``           1 if d gives the earliest start, else 0
``empty``              1 if nothing is on d yet
``speed``              d's mean forward time over all nodes relative to the fastest device's (static)
``progress``           fraction of the nodes placed so far (the same for every device)
``bwd_grow``           d's backward work after placing the node minus the busiest device's backward work so far
                       (> 0: the backward pass's most loaded device gets busier; the step time counts backward too)
``bwd_load``           backward work already on d
``la_end``             forward end after placing the node on d and the next W nodes by earliest finish, minus the
                       best device's (``placement_rl.cost.window``; W = ``window``)
``la_load``            the same window's peak forward + backward load of any device, minus the best device's
``la_comm``            the same window's communication time so far, minus the best device's
``la_over``            1 if the window overflows a device's memory
``conn``               d's mean link bandwidth to the other devices over the best-connected device's (static)
``prod_link``          log1p of the byte-weighted time per byte from the node's producers' devices to d (over the
                       fastest link's)
``cons_link``          the same from d to the devices holding the node's consumers' other inputs
``la_step``            once the window reaches the last decision: the completed placement's full step time (forward
                       + backward) minus the best device's, the quantity the lookahead teacher compares; before
                       that, ``la_end`` again
``la_full``            1 once the window reaches the last decision (``la_step`` is then the full step time), else 0
``la_back``            the backward pass of the branch's last placed nodes (the 3 W before the node, the node and its
                       window; ``window.BACK``) from the branch's forward state: its latest finish minus the best
                       device's; once the window reaches the last decision, ``la_step`` again
=====================  ==========================================================================
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placement_rl.cost.episodes import episode_threads, episodes_extra
from placement_rl.cost.features import (BASE_FEATURES, DEVICE_FEATURES, NUM_BASE_FEATURES,  # noqa: F401
                                        NUM_DEVICE_FEATURES, STEP_COL, TOPOLOGY_COL, WINDOW_COL)
from placement_rl.cost._op_kernel import bwd_pass, fwd_candidates, fwd_place, reset_state
from placement_rl.cost.memory import pinned_memory, static_memory
from placement_rl.cost.comm_fit import link_segments, split_segments
from placement_rl.cost.simulate import _grad_and_memory, _owned, check_costs, priority_order
from placement_rl.cost.types import CostTable
from placement_rl.cost.window import link_position, topology_features, undo_capacity, window_features
from placement_rl.errors import PlanError, fmt_bytes
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

DEFAULT_WINDOW = 16
WINDOW_UNIT_NODES = 400  # the window columns' time unit on larger graphs: the task's scale x WINDOW_UNIT_NODES / N
# (``window_time_scale``; 0 switches it off)
_NO_REC = (np.zeros(1, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros(0), np.zeros(0),
           np.zeros(0, np.int64))


@njit(cache=True, nogil=True)
def _batch_features(v, progress, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                    static_mem, capacity, speed, inv_scale, finish, arrive, sent, dev_free, link_free, busy, mem, acc,
                    bload, scratch, est, eft, nb, lb, feats, mask):
    k_eps, nd = dev_free.shape
    in_bytes = 0.0
    for p in range(pred_ptr[v], pred_ptr[v + 1]):
        in_bytes += edge_bytes[pred_eid[p]]
    inv_in = 1.0 / in_bytes if in_bytes > 0.0 else 0.0
    fmin = fwd[v, 0]
    for d in range(1, nd):
        if fwd[v, d] < fmin:
            fmin = fwd[v, d]
    for k in range(k_eps):
        fwd_candidates(v, dev[k], pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef,
                       finish[k], arrive[k], sent[k], dev_free[k], link_free[k], scratch, est, eft, nb, lb)
        best_s, best_f, free_max = est[0], eft[0], dev_free[k, 0]
        arg_f, arg_s = 0, 0
        room_best, room_arg, n_ok = -1e300, 0, 0
        for d in range(nd):
            if eft[d] < best_f:
                best_f, arg_f = eft[d], d
            if est[d] < best_s:
                best_s, arg_s = est[d], d
            if dev_free[k, d] > free_max:
                free_max = dev_free[k, d]
            after = mem[k, d] + static_mem[v] + nb[d]
            ok = after <= capacity[d]
            mask[k, d] = ok
            n_ok += ok
            room = capacity[d] - after
            if room > room_best:
                room_best, room_arg = room, d
        if n_ok == 0:  # fits nowhere: the device with the most room left takes it (the result is infeasible)
            mask[k, room_arg] = True
        bmax = bload[k, 0]
        for d in range(1, nd):
            if bload[k, d] > bmax:
                bmax = bload[k, d]
        for d in range(nd):
            f = feats[k, d]
            f[0] = (est[d] - best_s) * inv_scale
            f[1] = (eft[d] - best_f) * inv_scale
            f[2] = fwd[v, d] * inv_scale
            s = fwd[v, d] / fmin - 1.0 if fmin > 0.0 else 0.0
            f[3] = s if s < 10.0 else 10.0
            f[4] = bwd[v, d] * inv_scale
            f[5] = lb[d] * inv_in
            f[6] = nb[d] * inv_in
            f[7] = (eft[d] - acc[k, 1]) * inv_scale
            f[8] = (dev_free[k, d] - free_max) * inv_scale
            f[9] = busy[k, d] * inv_scale
            f[10] = (mem[k, d] + static_mem[v] + nb[d]) / capacity[d]
            f[11] = mem[k, d] / capacity[d]
            f[12] = 1.0 if d == arg_f else 0.0
            f[13] = 1.0 if d == arg_s else 0.0
            f[14] = 1.0 if busy[k, d] == 0.0 else 0.0
            f[15] = speed[d]
            f[16] = progress
            f[17] = (bload[k, d] + bwd[v, d] - bmax) * inv_scale
            f[18] = bload[k, d] * inv_scale


@njit(cache=True, nogil=True)
def _batch_extra(t, order, window, dev, pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, fwd,
                 bwd, link_upper, link_coef, grad, static_mem, capacity, inv_scale, tpb, conn, finish, arrive, sent,
                 dev_free, link_free, busy, mem, acc, bload, memo_i, memo_stats, mask, save, undo_slot,
                 undo_val, scratch, est, eft, nb, lb, stats, bfinish, feats, rec_n, rec_kind, rec_res, rec_start,
                 rec_end, rec_label):
    """The window, topology-position and step columns of every episode's feature block (after
    ``_batch_features``)."""
    v = order[t]
    for k in range(dev.shape[0]):
        window_features(t, order, window, dev[k], pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid,
                        edge_bytes, fwd, bwd, link_upper, link_coef, grad, static_mem, capacity, inv_scale, finish[k],
                        arrive[k], sent[k], dev_free[k], link_free[k], busy[k], mem[k], acc[k], bload[k], memo_i[k],
                        memo_stats[k], mask[k], save, undo_slot, undo_val, scratch, est, eft, nb, lb,
                        stats, bfinish, feats[k], WINDOW_COL, STEP_COL, rec_n, rec_kind, rec_res, rec_start, rec_end,
                        rec_label)
        topology_features(v, dev[k], pred_ptr, pred_idx, pred_eid, succ_ptr, succ_idx, succ_eid, edge_bytes, tpb, conn,
                          feats[k], TOPOLOGY_COL)


@njit(cache=True, nogil=True)
def _batch_place(v, actions, dev, pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, bwd, link_upper, link_coef,
                 static_mem, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload, rec_n, rec_kind, rec_res,
                 rec_start,
                 rec_end, rec_label):
    for k in range(actions.shape[0]):
        d = actions[k]
        dev[k, v] = d
        bload[k, d] += bwd[v, d]
        fwd_place(v, d, dev[k], pred_ptr, pred_idx, pred_eid, edge_bytes, fwd, link_upper, link_coef, static_mem,
                  finish[k], arrive[k], sent[k], dev_free[k], link_free[k], busy[k], mem[k], acc[k],
                  False, rec_n, rec_kind, rec_res, rec_start, rec_end, rec_label)


@njit(cache=True, nogil=True)
def _batch_reset(dev, finish, arrive, sent, dev_free, link_free, busy, mem, acc, bload):
    for k in range(dev.shape[0]):
        dev[k, :] = -1
        bload[k, :] = 0.0
        reset_state(finish[k], arrive[k], sent[k], dev_free[k], link_free[k], busy[k], mem[k], acc[k])


def time_scale(graph: CompGraph, costs: CostTable) -> float:
    """The task's time unit: its forward critical path on the fastest device per node, or its total fastest
    forward work over the device count, whichever is larger (never zero)."""
    w = costs.fwd_time.min(axis=1)
    return max(longest_path(graph, w), float(w.sum()) / costs.num_devices, 1e-9)


def longest_path(graph: CompGraph, weight: np.ndarray) -> float:
    """The heaviest path of the DAG with node weights ``weight`` [N] (0 for an empty graph)."""
    level = np.asarray(weight, dtype=np.float64).copy()
    pp, pi = graph.pred_ptr, graph.pred_idx
    for v in graph.topo_order.tolist():
        a, b = pp[v], pp[v + 1]
        if b > a:
            level[v] = weight[v] + level[pi[a:b]].max()
    return float(level.max()) if level.size else 0.0


def window_time_scale(scale: float, num_nodes: int) -> float:
    """The time unit of the window and step columns (``la_end``, ``la_load``, ``la_comm``, ``la_step``,
    ``la_back``): the task's ``scale`` on graphs of at most ``WINDOW_UNIT_NODES`` nodes, ``scale x
    WINDOW_UNIT_NODES / N`` on larger ones. ``scale`` grows with the graph (its critical path or its work over D)
    while one decision moves the completed step by about one node's time, so on a large graph the branches' gaps
    over the whole graph's unit are squeezed towards 0 (and a W-node window covers only W / N of the graph): the
    policy then leaves the completed-step argmin on 13.4% of the decisions of a 1,200-node transformer on
    ``cpu_2gpu``, against 6.5% at 400 nodes (6.1% at 1,200 with this unit). The unit of a 400-node graph keeps
    them in range (chosen on dev graphs: greedy / ``eft_rollout`` 1.0095 -> 1.0008 on 1,200-node transformers,
    1.0033 -> 1.0004 on 1,300-node CNNs, the dev split 1.0018 -> 1.0005; at 10,000 nodes greedy / ``sim_eft``
    0.973-0.988 -> 0.938-0.963)."""
    ref = int(WINDOW_UNIT_NODES)
    if ref <= 0 or num_nodes <= ref:
        return scale
    return scale * ref / num_nodes


def check_fits(graph: CompGraph, topology: DeviceTopology, costs: CostTable | None = None) -> None:
    """``PlanError`` when the graph's placement-independent memory exceeds all devices' memory together: under
    ``costs`` what the simulator pins (``pinned_memory``: the parameters alone for inference, which training's
    state refused), else the training state."""
    from placement_rl.cost.modes import mode_of

    infer = costs is not None and mode_of(costs) == "inference"
    need = float((pinned_memory(graph, costs) if costs is not None else static_memory(graph)).sum())
    have = float(topology.array("memory_bytes").sum())
    if need > have:
        what = "its parameters" if infer else "parameters, optimizer state and activations"
        raise PlanError(f"graph '{graph.name}' needs {fmt_bytes(need)} for {what} but topology '{topology.name}' "
                        f"has {fmt_bytes(have)} in all ({fmt_bytes(need - have)} short): use a smaller batch or model, "
                        "or a topology with more memory")


class ScheduleState:
    """K partial forward schedules of one (graph, costs, topology) task, placed node by node (see module doc).

    ``order`` is the node order of the decisions (the simulator's priority order). ``devices`` [K, N] is the
    placement so far (-1 where unplaced).
    """

    def __init__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, episodes: int = 1,
                 order: str = "program", window: int = DEFAULT_WINDOW) -> None:
        check_costs(graph, costs, topology)
        check_fits(graph, topology, costs)
        n, d, k = graph.num_nodes, topology.num_devices, int(episodes)
        if k < 1:
            raise PlanError(f"episodes must be >= 1, got {episodes}")
        self.graph, self.costs, self.topology, self.episodes = graph, costs, topology, k
        self.order = priority_order(graph, costs, order)
        self.scale = time_scale(graph, costs)
        self.window_scale = window_time_scale(self.scale, n)  # the window columns' unit (== scale up to 400 nodes)
        i64 = np.int64
        self._g = (_owned(graph.pred_ptr, i64), _owned(graph.pred_idx, i64), _owned(graph.pred_eid, i64),
                   _owned(graph.edge_bytes))
        self._succ = (_owned(graph.succ_ptr, i64), _owned(graph.succ_idx, i64), _owned(graph.succ_eid, i64))
        self._fwd, self._bwd = _owned(costs.fwd_time), _owned(costs.bwd_time)
        # the per-link segment tables (comm_fit)
        self._link_upper, self._link_coef = split_segments(link_segments(topology, costs))
        grad, static = _grad_and_memory(graph, costs)  # training, or inference costs (cost.modes): as simulate()
        self._static = np.asarray(static, dtype=np.float64)
        self._grad = np.asarray(grad, dtype=np.uint8)
        self.capacity = _owned(topology.array("memory_bytes"))
        mean_fwd = costs.fwd_time.mean(axis=0)
        self._speed = _owned(mean_fwd / max(float(mean_fwd.min()), 1e-30))
        self.devices = np.full((k, n), -1, dtype=i64)
        self._finish, self._arrive, self._sent = np.zeros((k, n)), np.zeros((k, n * d)), np.zeros((k, n * d))
        self._dev_free, self._link_free = np.zeros((k, d)), np.zeros((k, d * d))
        self.busy, self.memory, self._acc = np.zeros((k, d)), np.zeros((k, d)), np.zeros((k, 2))
        self.bwd_busy = np.zeros((k, d))
        self._scratch, self._est, self._eft = np.zeros(d), np.zeros(d), np.zeros(d)
        self._nb, self._lb = np.zeros(d), np.zeros(d)
        self.feats = np.zeros((k, d, NUM_DEVICE_FEATURES), dtype=np.float32)
        self.mask = np.zeros((k, d), dtype=np.bool_)
        self.window = int(window)
        if self.window < 0:
            raise PlanError(f"window must be >= 0, got {window}")
        from placement_rl.cost.simulate import _inverse_bandwidth

        self._tpb, self._conn = link_position(_inverse_bandwidth(costs), np.asarray(costs.link_latency, np.float64))
        self._save = np.zeros(4 * d + d * d + 2)
        cap = undo_capacity(graph.pred_ptr, self.order, self.window)
        self._undo_slot, self._undo_val = np.zeros(cap, i64), np.zeros((cap, 2))
        self._stats, self._bfinish = np.zeros((d, 6)), np.zeros(n)
        # each episode's branch memo (window.window_stats): the window branches of its last step, when they reached
        # the end of the order; one of them is the next step's branch of the device the episode then took
        memo = self.window > 0  # (any window reaches the end in the last W + 1 steps)
        self._memo_i = np.full((k, 1 + d if memo else 0), -1, i64)
        self._memo_stats = np.zeros((k, d if memo else 0, 6))
        self.step = 0
        self.reset()

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def done(self) -> bool:
        return self.step >= self.graph.num_nodes

    @property
    def node(self) -> int:
        """The node the next decision places."""
        return int(self.order[self.step])

    @property
    def forward_end(self) -> np.ndarray:
        """[K] end of the forward pass scheduled so far."""
        return self._acc[:, 1].copy()

    def node_finish(self, node: int) -> np.ndarray:
        """[K] forward finish time of a placed ``node`` in each episode."""
        return self._finish[:, int(node)].copy()

    def reset(self) -> None:
        _batch_reset(self.devices, self._finish, self._arrive, self._sent, self._dev_free, self._link_free,
                     self.busy, self.memory, self._acc, self.bwd_busy)
        if self._memo_i.shape[1]:
            self._memo_i[:, 0] = -1
        self.step = 0

    def features(self) -> tuple[np.ndarray, np.ndarray]:
        """``(feats [K, D, F] float32, mask [K, D] bool)`` for the next node (buffers reused between calls)."""
        v = self.node
        _batch_features(v, self.step / self.graph.num_nodes, self.devices, *self._g, self._fwd, self._bwd,
                        self._link_upper, self._link_coef, self._static, self.capacity, self._speed, 1.0 / self.scale,
                        self._finish, self._arrive, self._sent, self._dev_free, self._link_free, self.busy,
                        self.memory, self._acc, self.bwd_busy, self._scratch, self._est, self._eft, self._nb, self._lb,
                        self.feats, self.mask)
        if self.window > 0 and self.episodes > 1:
            if episode_threads(self) > 1:  # asked for threads (PLACEMENT_RL_DECODE_THREADS)
                episodes_extra(self)
                return self.feats, self.mask
        _batch_extra(*self.extra_args())
        return self.feats, self.mask

    _EPISODE_ARRAYS = ("devices", "_finish", "_arrive", "_sent", "_dev_free", "_link_free", "busy", "memory", "_acc",
                       "bwd_busy", "_memo_i", "_memo_stats")

    def branch_from(self, other: "ScheduleState", k: int = 0) -> None:
        """Copy episode ``k`` of ``other`` (same task) into every episode of this state, at its step."""
        for name in self._EPISODE_ARRAYS:
            getattr(self, name)[:] = getattr(other, name)[k]
        self.step = other.step

    def kernel_state(self) -> tuple:
        """The state's arrays in the order the decode kernel (``placement_rl.cost.decode``) takes them."""
        return (self.devices, *self._g[:3], *self._succ, self._g[3], self._fwd, self._bwd, self._link_upper,
                self._link_coef, self._grad, self._static, self.capacity, self._speed, 1.0 / self.scale,
                1.0 / self.window_scale, self._tpb,
                self._conn, self._finish, self._arrive, self._sent, self._dev_free, self._link_free, self.busy,
                self.memory, self._acc, self.bwd_busy, self._memo_i, self._memo_stats, self._scratch,
                self._est, self._eft, self._nb, self._lb, self.feats, self.mask, self._save, self._undo_slot,
                self._undo_val, self._stats, self._bfinish, *_NO_REC)

    def extra_args(self) -> tuple:
        """The arguments of ``_batch_extra`` at the current step (the compiled decoders pass them on)."""
        return (self.step, self.order, self.window, self.devices, *self._g[:3], *self._succ, self._g[3], self._fwd,
                self._bwd, self._link_upper, self._link_coef, self._grad, self._static, self.capacity,
                1.0 / self.window_scale,
                self._tpb, self._conn, self._finish, self._arrive, self._sent, self._dev_free, self._link_free,
                self.busy, self.memory, self._acc, self.bwd_busy, self._memo_i, self._memo_stats,
                self.mask, self._save, self._undo_slot,
                self._undo_val, self._scratch, self._est, self._eft, self._nb, self._lb, self._stats, self._bfinish,
                self.feats, *_NO_REC)

    def place(self, actions) -> None:
        """Put the next node on ``actions[k]`` in episode k (an int applies to every episode)."""
        if self.done:
            raise PlanError("every node is already placed")
        acts = np.broadcast_to(np.asarray(actions, dtype=np.int64), (self.episodes,))
        if acts.min() < 0 or acts.max() >= self.topology.num_devices:
            raise PlanError(f"device index out of range 0..{self.topology.num_devices - 1}: {acts.tolist()}")
        _batch_place(self.node, np.ascontiguousarray(acts), self.devices, *self._g, self._fwd, self._bwd,
                     self._link_upper, self._link_coef, self._static, self._finish, self._arrive, self._sent,
                     self._dev_free, self._link_free, self.busy, self.memory, self._acc, self.bwd_busy, *_NO_REC)
        self.step += 1

    def finish(self) -> np.ndarray:
        """[K] step times (forward + backward) of the finished placements; the state stays as it was."""
        if not self.done:
            raise PlanError(f"{self.graph.num_nodes - self.step} nodes are still unplaced")
        d = self.topology.num_devices
        out = np.zeros(self.episodes)
        gtime, gbytes, touched = np.zeros(d), np.zeros(d), np.zeros(d, np.int64)
        for k in range(self.episodes):
            dev_free, link_free, busy, acc = (self._dev_free[k].copy(), self._link_free[k].copy(),
                                              self.busy[k].copy(), self._acc[k].copy())
            out[k] = bwd_pass(self.devices[k], self.order, *self._succ, self._g[3], self._bwd, self._link_upper,
                              self._link_coef, self._grad, self._finish[k], self._bfinish, dev_free, link_free, gtime,
                              gbytes, touched, busy, acc, False, *_NO_REC)
        return out

    def feasible(self) -> np.ndarray:
        """[K] whether every device's memory stays within capacity (valid once every node is placed)."""
        return np.all(self.memory <= self.capacity, axis=1)


assert (NUM_BASE_FEATURES == WINDOW_COL and TOPOLOGY_COL == WINDOW_COL + 4 and STEP_COL == TOPOLOGY_COL + 3
        and DEVICE_FEATURES.index("la_back") == STEP_COL + 2), \
    "window_features writes 4 window columns at WINDOW_COL and 3 step columns at STEP_COL (la_step, la_full, la_back)"
