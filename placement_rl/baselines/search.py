"""Search over the simulator: simulated annealing from the best heuristic, and exhaustive enumeration.

* ``local_search``: starts from the best of the cheap heuristics (single device, HEFT, m-ETF, m-SCT,
  m-TOPO, METIS, round robin; given seconds, the first and those that finish within them: one that runs past
  them is dropped, ``starts_cut`` in the meta; where no single device holds the graph, m-TOPO first, so the start
  the seconds never cut fits memory where m-TOPO's does), then simulated annealing with four moves (move a region:
  up to 16 connected nodes of one device to another; reassign one node to the device of one of its graph
  neighbours; reassign it to a random other device; swap the devices of two nodes on different devices), a geometric
  temperature from 0.05% of the start's step time down to 0.01% over the budget, infeasible moves rejected once
  feasible (each start that overflows memory is weighed as ``memory.fit`` makes it fit, the fits sharing one
  fit's seconds; the annealing's start goes through the memory repair and the fit first). Where its moves keep
  finding only placements simulated already (``STALE_MOVES``; on a tiny graph after a few hundred calls) it
  restarts from the best, until the budget or the seconds are spent or every placement has been a restart (the
  best is then the optimum). Returns the best placement simulated, so never worse than its start.
* ``exhaustive``: every placement of the ``N`` nodes on the ``D`` devices up to relabelling of
  interchangeable devices (two devices are interchangeable when swapping them leaves the costs, memory
  and links unchanged): within each class, a new device is always the lowest unused one. That is the true
  optimum under the simulator. Too many placements for the budget -> ``ConfigError`` naming the count. Given
  seconds that end first, the best placement simulated by then, ``meta["exhaustive"]`` false and a ``note``
  (``meta["exhaustive"]`` true: the optimum). Where every placement is over memory, the one least over (bytes over
  capacity summed over the devices, then step time: ``Score.key``), a ``note`` saying none fits.
* ``refine(graph, costs, topology, start, budget=, seed=)``: the same annealing from a given placement (e.g. a
  learned one), as its own placer: a result it improves is reported as the search's, not the start's.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator

import numpy as np

import placement_rl.baselines.baechi as baechi
import placement_rl.baselines.heft as heft
import placement_rl.baselines.metis as metis
import placement_rl.baselines.simple as simple
from placement_rl.baselines.common import Problem, Score, StartCut
from placement_rl.baselines.memory import best_start, fit, fit_seconds, repair
from placement_rl.baselines.search_exhaustive import count_placements, device_classes, exhaustive, size_text

T0_FRAC = 0.0005  # start temperature / start step time. At 0.002 the walk drifted uphill and on some dev pairs
# never returned below its start in 10 s; 0.0005 with region moves: 0.971 / 0.951 x la_rule against 0.976 / 0.961
# at 2 / 10 s from la_rule (dev split, 8 pairs x 3 seeds; scripts/bench_anneal.py, results/anneal_dev.json)
REGION_SHARE = 0.3  # share of the moves that move a connected region (the rest: the single-node moves)
REGION_MAX = 16  # nodes in a region, drawn uniformly from 2..REGION_MAX
ADAPT_GAIN = 1e-3  # ``anneal(adapt=True)``: the recent relative gain of the best (both kinds of move) at which the
# observed rates and the prior share weigh the same
ADAPT_TAU = 0.25  # the credit decays over this share of the span
ADAPT_MIN, ADAPT_MAX = 0.03, 0.6  # the large moves' share stays within these. Dev (policy_search adapted over
# itself with the fixed 0.2, ``adapt_gain`` of scripts/bench_learned.py --ablate at 0.5 / 2 / 10 s): 8 dev-split pairs
# 1.000 / 0.999 / 0.998 (results/search_dev.json), the dev 2,000-node graphs of seeds 6-7 1.000 / 1.001 / 0.994
# (search_scale2000_dev.json), with an earlier form whose share drifted to about a third on walks where neither kind
# gains; this one keeps the prior there (the four dev 2,000-node graphs of seed 6, adapted over fixed: 1.001 / 1.000
# at 2 / 10 s). Level, within the run-to-run noise of single pairs
STALE_MOVES = 20  # moves in a row that find no placement not yet simulated, per node and device (plus 100): the
# walk's neighbourhood is spent and it restarts (``anneal``). It used to stop there: on 7- and 8-node graphs after
# a few hundred of 20,000 calls, 2-9% above the optimum
KICK_MAX = 16  # nodes a restart's kick moves at most (2, 3, ... while the restarts find nothing better, then again)
RESTART_MOVES = 1  # after the first restart, the patience per node and device before the next (the walk from a kick
# descends into ground mostly simulated already: at 20 x, a 7-node graph on 4 devices ran the walk into its bound of
# iterations at 8,444 of 20,000 calls)
RESTARTS = True  # False: the walk stops where its moves find nothing new (as it did before the restarts)
FORMER_SETTINGS = {"T0_FRAC": 0.002, "REGION_SHARE": 0.0, "RESTARTS": False}  # before region moves and restarts
# (placements made then rebuild with it)
START_HEURISTICS = (simple.single_device, heft.heft_devices, baechi.m_etf, baechi.m_sct, baechi.m_topo, metis.metis,
                    simple.round_robin)


def local_search(prob: Problem) -> np.ndarray:
    best, best_s, scored = None, None, []
    starts = _starts(prob)
    for fn in starts:
        if prob.left <= 0 and best is not None:
            break
        # once one start is scored, the next must finish within the seconds (the list schedulers take 1-2 s at
        # 2,000 nodes): one that runs past them is dropped, with the starts after it (``starts_cut`` in the meta)
        prob.start_deadline = prob.deadline if best is not None else None
        try:
            cand = fn(prob)
        except StartCut:
            prob.meta["starts_cut"] = [f.__name__ for f in starts[starts.index(fn):]]
            break
        finally:
            prob.start_deadline = None
        s = prob.score(cand)
        scored.append((START_HEURISTICS.index(fn), cand, s))
        if s is not None and (best_s is None or s.key < best_s.key):
            best, best_s = cand, s
    if best_s is not None:  # each start over memory weighed as ``memory.fit`` makes it fit; equal scores go to the
        scored.sort(key=lambda x: x[0])  # start listed first in START_HEURISTICS, whatever order they ran in
        best, best_s = best_start(prob, [(cand, s) for _, cand, s in scored])
    if best is None:
        return simple.single_device(prob)
    if best_s is None:
        return best
    return anneal(prob, best, best_s)


def _starts(prob: Problem) -> tuple:
    """The start heuristics in the order ``local_search`` runs them: ``START_HEURISTICS``, but given seconds where no
    single device holds the graph's memory, ``m_topo`` first (Baechi's memory-constrained placement: one linear pass
    and a few repair calls, and it fits memory where its ledger does). The seconds never cut the first start, and the
    single-device start cannot fit there: it was what a search whose other starts were cut returned (at 5,000 nodes
    on 64 GPUs in 2 s). Where every start runs, the order changes nothing: ``local_search`` weighs the starts in
    ``START_HEURISTICS``' order (equal scores go to the one listed first)."""
    if prob.seconds is None or not float(prob.node_mem.sum()) > float(prob.capacity.max()):
        return START_HEURISTICS
    return tuple(sorted(START_HEURISTICS, key=lambda fn: fn is not baechi.m_topo))


def anneal(prob: Problem, start: np.ndarray, start_score: Score, *, large=None, large_share: float = 0.0,
           adapt: bool = False) -> np.ndarray:
    """Simulated annealing from ``start`` (already scored; a start that overflows memory goes through the memory
    repair first, ``memory.repair``, then ``memory.fit``, and where it still overflows the best of memory-balanced
    splits, ``metis.memory_splits`` made to fit and ``m_topo``'s, is taken when it overflows less) with the rest of
    ``prob``'s budget; returns the best placement simulated (never worse than ``start``). ``large(current, rng)``:
    an optional proposal of large moves (a whole candidate placement, its own simulator calls charged to ``prob``;
    e.g. ``agents.policy_search``'s repairs sampled from a policy), run once the walk fits memory whenever its
    seconds are below ``large_share`` of the seconds spent; its candidates go through the same temperature schedule
    and acceptance test as the single-node moves. ``adapt``: that share follows what each kind of move has
    recently gained (adaptive operator weights, as in adaptive large neighbourhood search): the relative gain of
    the best per second of each kind, decayed over ``ADAPT_TAU`` of the span (1 s without seconds), the large
    moves' share their part of the two rates, weighed against ``large_share`` (the prior) by how much recent gain
    there is (``ADAPT_GAIN``: equal weights; where neither kind gains, the prior), within
    ``ADAPT_MIN``..``ADAPT_MAX``; ``large_share_end`` in the meta.

    Restarts: once ``STALE_MOVES`` x N x D + 100 moves in a row find no placement not yet simulated (the walk's
    neighbourhood is spent: it used to stop there, far below its budget on tiny graphs), the walk goes on from a
    kick of the best (``_kick``: 2, 3, ... up to ``KICK_MAX`` random nodes moved, growing while the restarts find
    nothing better), and from there restarts whenever ``RESTART_MOVES`` x N x D moves in a row find nothing new.
    Where as many kicks in a row find nothing new either (most placements are simulated), each move finding nothing
    new is followed by a kick, and a kick finding nothing new by the next of all ``D^N`` placements in lexicographic
    order; once all have been restarts (each weighed against the best), the best is the optimum and the walk stops
    (a 7-node graph on 4 devices: 16,384 calls in 3 s). On large graphs the moves do not run out of new placements:
    the walk is the one it was."""
    best, best_s = np.asarray(start, dtype=np.int64).copy(), start_score
    if prob.d == 1 or prob.n == 0:
        return best
    if not best_s.feasible and prob.left > 0:  # a start that overflows memory: the memory repair first (a few
        fixed = repair(prob, best)             # calls moving nodes off the devices over capacity), then the walk
        s = prob.score(fixed)
        if s is not None and s.key < best_s.key:
            best, best_s = np.asarray(fixed, dtype=np.int64).copy(), s
    if not best_s.feasible and prob.left > 0:  # still over: the start's nodes moved off the full devices by the
        moved, _ = fit(prob, start)             # least time per byte (``memory.fit``: received tensors counted)
        s = prob.score(moved)
        if s is not None and s.key < best_s.key:
            best, best_s = moved, s
            prob.meta["fitting_start"] = "fit"
    if not best_s.feasible and prob.left > 0:  # still over: memory-balanced splits, METIS's (few tensors cross
        # devices; each through ``memory.fit``) and ``m_topo``'s (in the simulator's order), the best (``fitting_start``
        # in the meta) when it overflows less
        parts = metis.memory_splits(prob)  # their fits together in one fit's seconds
        each = fit_seconds(prob) / max(len(parts), 1)
        splits = [("metis_memory", fit(prob, part, seconds=each)[0]) for part in parts]
        for name, split in [*splits, ("m_topo", baechi.m_topo(prob))]:
            s = prob.score(split)
            if s is not None and s.key < best_s.key:
                best, best_s = np.asarray(split, dtype=np.int64).copy(), s
                prob.meta["fitting_start"] = name
    cur, cur_s = best.copy(), best_s
    calls0, steps = prob.calls, max(prob.left, 1)
    sec0 = prob.elapsed
    span = None if prob.seconds is None else max(prob.seconds - sec0, 1e-9)
    t0 = T0_FRAC * max(best_s.step_time, 1e-12)
    t1 = 1e-4 * max(best_s.step_time, 1e-12)
    rng = prob.rng
    stale, large_time = 0, 0.0
    patience = STALE_MOVES * prob.n * prob.d + 100  # moves in a row finding no new placement before a restart
    kicks, missed, ending = 0, 0, False  # restarts since the best improved; in a row finding no new placement
    every = _every_placement(prob.n, prob.d)  # the last restarts
    share = large_share
    # adapt: each kind of move's recent gain of the best and seconds (decayed over TAU of the span); the large
    # moves' share is their part of the two rates of gain, weighed against ``large_share`` (the prior) by how much
    # recent gain there is to judge by: where neither kind gains, the prior
    credit = {True: [0.0, 0.0], False: [0.0, 0.0]}
    for _ in range(50 * prob.budget + 100):  # bounded even when moves keep hitting cached placements
        if prob.left <= 0:
            break
        frac = (prob.calls - calls0) / steps  # the schedule runs over the calls, or the seconds when they end first
        if span is not None:
            frac = max(frac, (prob.elapsed - sec0) / span)
        temp = t0 * (t1 / t0) ** min(1.0, frac)
        # the large moves only once the walk fits memory (before, its single moves climb towards fitting)
        tm = prob.elapsed
        restart = stale > patience  # the walk's neighbourhood is all simulated: a restart
        if restart and not RESTARTS:
            break
        is_large = not restart and large is not None and cur_s.feasible and large_time < share * (tm - sec0)
        if restart:
            kicks += 1
            ending = ending or missed > patience  # kicks find nothing new either: most placements are simulated
            patience = 0 if ending else RESTART_MOVES * prob.n * prob.d
            if not missed or not ending:  # a kick from the best, growing while the restarts find nothing better
                cand = _kick(best, prob, rng, _kick_size(kicks, prob.n))
            elif (cand := next(every, None)) is None:  # each placement in turn; once all were restarts (each
                break  # weighed against the best), the best is the optimum
        elif is_large:
            cand = large(cur, rng)
            large_time += prob.elapsed - tm
            if cand is None:  # none this time (the seconds ran out, or none fits them): a single-node move
                is_large, cand = False, _move(cur, prob, rng)
        else:
            cand = _move(cur, prob, rng)
        calls_before = prob.calls
        s = prob.score(cand)
        stale = stale + 1 if prob.calls == calls_before else 0
        missed = missed + 1 if restart and stale else 0
        if s is None:
            break
        gain = 0.0
        if restart or _accept(cur_s, s, temp, rng):
            cur, cur_s = cand, s
            if s.key < best_s.key:
                if s.feasible and best_s.feasible:
                    gain = (best_s.step_time - s.step_time) / max(best_s.step_time, 1e-30)
                best, best_s, kicks = cand.copy(), s, 0
        if adapt and large is not None and cur_s.feasible:
            dt = prob.elapsed - tm
            keep = math.exp(-dt / (ADAPT_TAU * (span or 1.0)))
            for c in credit.values():
                c[0] *= keep
                c[1] *= keep
            credit[is_large][0] += gain
            credit[is_large][1] += dt
            share = adapted_share(credit, large_share)
    if large is not None:
        prob.meta["large_share_end"] = share
    return best


def adapted_share(credit: dict, prior: float) -> float:
    """The large moves' share of the seconds from ``credit`` (``{is_large: [recent gain of the best, recent
    seconds]}``): their part of the two rates of gain, weighed against ``prior`` by the recent gain of both
    (``ADAPT_GAIN``: equal weights), within ``ADAPT_MIN``..``ADAPT_MAX``."""
    rate = {k: c[0] / max(c[1], 1e-12) for k, c in credit.items()}
    seen = credit[True][0] + credit[False][0]
    weight = seen / (seen + ADAPT_GAIN)
    part = rate[True] / (rate[True] + rate[False]) if rate[True] + rate[False] > 0 else prior
    return min(max(weight * part + (1.0 - weight) * prior, ADAPT_MIN), ADAPT_MAX)


@contextlib.contextmanager
def annealing_settings(**settings: float):
    """Run the block with this module's annealing constants (``T0_FRAC``, ``REGION_SHARE``, ...) set to
    ``settings``, restored after (e.g. the former settings, to compare with or to rebuild placements made with)."""
    g = globals()
    saved = {k: g[k] for k in settings}
    g.update(settings)
    try:
        yield
    finally:
        g.update(saved)


def _move(cur: np.ndarray, prob: Problem, rng: np.random.Generator) -> np.ndarray:
    """Move a connected region of one device to another, reassign one node (half the time to the device of one of
    its neighbours), or swap two nodes."""
    if rng.random() < REGION_SHARE:
        return _region_move(cur, prob, rng)
    cand = cur.copy()
    n, d, g = len(cur), prob.d, prob.graph
    r = rng.random()
    if n >= 2 and r < 0.2:
        i, j = rng.choice(n, size=2, replace=False)
        if cand[i] != cand[j]:
            cand[i], cand[j] = cand[j], cand[i]
            return cand
    i = int(rng.integers(n))
    if r < 0.6:
        nbrs = np.concatenate([g.predecessors(i), g.successors(i)])
        other = nbrs[cand[nbrs] != cand[i]]
        if other.size:
            cand[i] = cand[int(other[rng.integers(other.size)])]
            return cand
    cand[i] = (cand[i] + 1 + int(rng.integers(d - 1))) % d
    return cand


def _kick_size(kicks: int, n: int) -> int:
    """Nodes the ``kicks``-th restart since the best improved moves: 2, 3, ... up to ``KICK_MAX`` or all ``n``, then
    2 again (one node where ``n`` is 1)."""
    top = min(n, KICK_MAX)
    return min(top, 2 + (kicks - 1) % max(top - 1, 1))


def _kick(best: np.ndarray, prob: Problem, rng: np.random.Generator, size: int) -> np.ndarray:
    """``best`` with ``size`` distinct random nodes each moved to a random other device (a placement ``size`` nodes
    away from it): an iterated local search's restart."""
    cand = best.copy()
    nodes = rng.permutation(len(best))[:size]
    cand[nodes] = (cand[nodes] + rng.integers(1, prob.d, size=size)) % prob.d
    return cand


def _every_placement(n: int, d: int) -> Iterator[np.ndarray]:
    """All ``d^n`` placements of ``n`` nodes on ``d`` devices in lexicographic order (nothing built before the
    first is asked for)."""
    for devices in itertools.product(range(d), repeat=n):
        yield np.asarray(devices, dtype=np.int64)


def _region_move(cur: np.ndarray, prob: Problem, rng: np.random.Generator) -> np.ndarray:
    """Up to 2..``REGION_MAX`` nodes connected through graph edges inside one device (breadth first from a random
    node) moved together to another device: half the time the device of a neighbour on another device, else a
    random one. Single-node moves cannot cross the barrier a region pays when only one of its nodes moves (every
    edge to the rest becomes a transfer)."""
    g, n, d = prob.graph, len(cur), prob.d
    i = int(rng.integers(n))
    src = cur[i]
    size = int(rng.integers(2, REGION_MAX + 1))
    nbrs = np.concatenate([g.predecessors(i), g.successors(i)])
    other = nbrs[cur[nbrs] != src]
    if other.size and rng.random() < 0.5:
        dst = int(cur[int(other[rng.integers(other.size)])])
    else:
        dst = int((src + 1 + int(rng.integers(d - 1))) % d)
    region, queue, head = {i}, [i], 0
    while head < len(queue) and len(region) < size:
        v = queue[head]
        head += 1
        for u in np.concatenate([g.predecessors(v), g.successors(v)]).tolist():
            if u not in region and cur[u] == src:
                region.add(u)
                queue.append(u)
                if len(region) >= size:
                    break
    cand = cur.copy()
    cand[list(region)] = dst
    return cand


def _accept(cur: Score, new: Score, temp: float, rng: np.random.Generator) -> bool:
    if new.key <= cur.key:
        return True
    if cur.feasible and not new.feasible:
        return False
    if not cur.feasible:  # climbing towards feasibility: only accept less overflow
        return new.feasible or new.overflow < cur.overflow
    return rng.random() < math.exp(-(new.step_time - cur.step_time) / max(temp, 1e-30))


# --------------------------------------------------------------- exhaustive
def refine(graph, costs, topology, start, *, budget: int, seed: int = 0):
    """``anneal`` from ``start`` (a device per node) with ``budget`` simulator calls; returns a ``Placement``."""
    prob = Problem(graph, costs, topology, budget=budget, seed=seed)
    start = np.asarray(start, dtype=np.int64)
    score = prob.score(start)
    return prob.finish(start if score is None else anneal(prob, start, score), "local_search_from_start")


__all__ = ["FORMER_SETTINGS", "START_HEURISTICS", "adapted_share", "anneal", "annealing_settings", "count_placements",
           "device_classes", "exhaustive", "local_search", "refine", "size_text"]
