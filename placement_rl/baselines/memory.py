"""Memory for the placers: an upper-bound ledger for list schedulers, and a simulator-guided repair.

The cost model charges a device 4 x param_bytes + act_bytes of each node on it, plus every tensor it
receives from another device (once per producer, its largest edge to that device). ``MemoryLedger`` books
the same quantities while nodes are placed in a topological order, bounding a received tensor by its
producer's largest out-edge, so a placement that fits the ledger fits the simulator.

``repair`` takes any placement the simulator finds over memory and moves nodes off the overfull devices —
boundary nodes first (those with a neighbour elsewhere), each to a device already holding one of its
neighbours when it has room, else to the device with the most room — and simulates again, a few rounds.
``fit`` does the same without the simulator, counting the received tensors as it does: where a spread
placement's memory is mostly tensors it receives, moving nodes by their own bytes cannot make it fit, and the
least time per byte of overflow removed picks each move (``_fit_kernel``).
"""

from __future__ import annotations

import time

import numpy as np

from placement_rl.baselines.common import Problem

REPAIR_CALLS = 8
FIT_SHARE = 0.25  # ``fit``'s seconds: this share of a search's seconds left (``FIT_SECONDS`` without seconds)
FIT_SECONDS = 2.0
FIT_CHUNK = 8  # moves per kernel call between two looks at the clock


class MemoryLedger:
    """Bytes booked per device while placing nodes (predecessors always before successors)."""

    def __init__(self, prob: Problem) -> None:
        self.prob = prob
        g = prob.graph
        self.load = np.zeros(prob.d)
        self.received = np.zeros((prob.n, prob.d), dtype=bool)
        self.out_max = np.zeros(prob.n)
        if g.num_edges:
            np.maximum.at(self.out_max, g.edges[:, 0], g.edge_bytes)

    def need(self, u: int, dev: np.ndarray) -> np.ndarray:
        """Bytes that placing ``u`` would add to each device, given where its predecessors are."""
        need = np.full(self.prob.d, self.prob.node_mem[u])
        for p in self.prob.graph.predecessors(u).tolist():
            extra = np.where(self.received[p], 0.0, self.out_max[p])
            extra[dev[p]] = 0.0
            need += extra
        return need

    def fits(self, u: int, dev: np.ndarray) -> np.ndarray:
        return self.load + self.need(u, dev) <= self.prob.capacity

    def place(self, u: int, k: int, dev: np.ndarray) -> None:
        self.load[k] += self.need(u, dev)[k]
        for p in self.prob.graph.predecessors(u).tolist():
            if dev[p] != k:
                self.received[p, k] = True


def repair(prob: Problem, devices: np.ndarray, *, max_rounds: int = REPAIR_CALLS) -> np.ndarray:
    """A placement the simulator finds feasible, moving as few nodes as it can (or the best one tried)."""
    dev = np.array(devices, dtype=np.int64)
    s = prob.score(dev)
    if s is None:
        return dev if prob.estimate_fits(dev) else _move_off(prob, dev, _static_load(prob, dev))
    best, best_s = dev, s
    for _ in range(max_rounds):
        if s is None or s.feasible:
            break
        prob.check_start()
        dev = _move_off(prob, dev.copy(), s.peak_memory)
        s = prob.score(dev)
        if s is not None and s.key < best_s.key:
            best, best_s = dev, s
    return best


def _static_load(prob: Problem, dev: np.ndarray) -> np.ndarray:
    return np.bincount(dev, weights=prob.node_mem, minlength=prob.d)


def _move_off(prob: Problem, dev: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Move nodes off devices whose ``load`` passes capacity (5% margin), updating ``load`` as it goes."""
    g, cap, mem = prob.graph, prob.capacity, prob.node_mem
    load = np.array(load, dtype=np.float64)
    target = 0.95 * cap
    t = prob.node_time
    for src in np.argsort(-(load - cap)).tolist():
        if load[src] <= cap[src]:
            continue
        nodes = np.flatnonzero(dev == src)
        boundary = np.array([np.any(dev[np.concatenate([g.predecessors(i), g.successors(i)])] != src)
                             for i in nodes.tolist()], dtype=bool)
        slow = t[nodes].min(axis=1) - t[nodes, src]  # <= 0: how much faster the best other device is
        for i in nodes[np.lexsort((slow, ~boundary))].tolist():
            if load[src] <= target[src]:
                break
            nbrs = np.concatenate([g.predecessors(i), g.successors(i)])
            room = target - load - mem[i]
            room[src] = -np.inf
            near = np.unique(dev[nbrs])
            near = near[(near != src) & (room[near] >= 0)]
            if near.size:
                dst = int(near[np.argmax(room[near])])
            else:
                dst = int(np.argmax(room))
                if room[dst] < 0:
                    continue
            dev[i] = dst
            load[src] -= mem[i]
            load[dst] += mem[i]
    return dev


def fit(prob: Problem, devices: np.ndarray, *, max_moves: int | None = None,
        seconds: float | None = None) -> tuple[np.ndarray, float]:
    """``(placement, bytes over capacity left)``: ``devices`` with nodes moved off the devices over memory one at a time
    (``_fit_kernel.fit_moves``: each the move, to the device of a neighbour or the one with the most room, adding the
    least time per byte of overflow it removes; received tensors counted exactly as the simulator does), no simulator
    call; at most ``max_moves`` (4 N) moves and ``seconds`` (default ``fit_seconds``). Where the memory a placement
    needs is mostly the tensors it receives (a graph spread over many devices), moving nodes by their own bytes
    (``repair``) cannot make it fit; this can, with the fewest slow moves. Dev (scripts/bench_tight_memory.py
    --first-seed 3200): 400-node graphs on tight clusters, from ``la_rule`` or HEFT where they overflow, 11 of 24 made
    to fit in 0.12 s in all (trying every device as the destination: 12 of 24 in twice the seconds, step times 1.009 x
    these where both fit)."""
    from placement_rl.baselines._fit_kernel import fit_moves

    g, c = prob.graph, prob.costs
    dev = np.array(devices, dtype=np.int64)
    if prob.d == 1 or prob.n == 0:
        load = np.bincount(dev, weights=prob.node_mem, minlength=prob.d)
        return dev, float(np.maximum(load - prob.capacity, 0.0).sum())
    bw = np.asarray(c.link_bandwidth, dtype=np.float64)
    inv_bw = np.where(np.eye(prob.d, dtype=bool) | ~(bw > 0), 0.0, 1.0 / np.where(bw > 0, bw, 1.0))
    i64 = np.int64
    arrays = (g.pred_ptr.astype(i64), g.pred_idx.astype(i64), g.succ_ptr.astype(i64), g.succ_idx.astype(i64),
              g.succ_eid.astype(i64), np.asarray(g.edge_bytes, np.float64), prob.node_mem,
              np.asarray(prob.capacity, np.float64), np.ascontiguousarray(prob.node_time, dtype=np.float64), inv_bw)
    left = 4 * prob.n if max_moves is None else int(max_moves)
    end = time.perf_counter() + (fit_seconds(prob) if seconds is None else float(seconds))
    while True:
        moves, over = fit_moves(dev, *arrays, min(left, FIT_CHUNK))
        left -= moves
        if over == 0.0 or moves < FIT_CHUNK or left <= 0 or time.perf_counter() > end:
            return dev, float(over)


def fit_seconds(prob: Problem) -> float:
    """What one ``fit`` may take: ``FIT_SHARE`` of the search's seconds left (``FIT_SECONDS`` without seconds)."""
    return FIT_SECONDS if prob.seconds is None else FIT_SHARE * max(prob.seconds - prob.elapsed, 0.0)


def best_start(prob: Problem, scored: list) -> tuple:
    """``(devices, score)``: the best of ``scored`` (``(devices, Score)`` pairs, a None score for one the budget did
    not reach) by ``Score.key``, each one over memory weighed as ``fit`` makes it fit (``fitted``; their fits share
    one fit's seconds, ``fit_seconds``): a search's fast one-pass starts that overflow against slow ones that fit."""
    ok = [(d, s) for d, s in scored if s is not None]
    if not ok:
        return scored[0] if scored else (None, None)
    over = [(d, s) for d, s in ok if not s.feasible]
    each = fit_seconds(prob) / max(len(over), 1)
    return min([*ok, *(fitted(prob, d, s, seconds=each) for d, s in over)], key=lambda x: x[1].key)


def fitted(prob: Problem, devices: np.ndarray, score, *, seconds: float | None = None):
    """``(devices, score)``; where ``score`` is over memory and ``fit`` makes the placement fit, the fitted placement
    and its score instead (one simulator call): how a search weighs a fast start that overflows against one that
    fits (a search prefers any start that fits)."""
    if score is None or score.feasible:
        return devices, score
    dev, over = fit(prob, devices, seconds=seconds)
    s = prob.score(dev) if over == 0.0 else None
    return (dev, s) if s is not None and s.key < score.key else (devices, score)
