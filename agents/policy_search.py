"""Policy-guided search: the constructive policy as the proposal of large moves in simulated annealing.

``policy_search(policy, graph, costs, topology, seconds=...)`` starts from the policy's own greedy placement (at its
placing window; optionally also from ``la_rule``'s, the rule the policy's lookahead feature is, the better one kept,
both charged), then runs one simulated annealing (``baselines.search.anneal``: one temperature schedule over the
seconds, one acceptance test) whose moves are the local search's single-node moves and, for a share of the seconds
(``1 - anneal_share`` at first, then, with ``adapt``, following what the repairs have recently gained per second
against the single-node moves, within 3-60%), large moves proposed by the policy. A large move repairs the current
placement (ruin and recreate): a start step ``s`` of the decision order is drawn, the first ``s`` decisions are
replayed (``decode``'s ``FORCED`` chooser), the next 1..``repair`` decisions are sampled from the policy at a
temperature (``SAMPLE``: Gumbel-max over the device head's scores) and the rest completed by the policy's greedy
(``POLICY``), ``samples`` times as the episodes of one schedule state, all in the compiled kernel; the best of the
batch is the proposal (``repair=0``: the whole suffix sampled). The repaired states read a short window
(``SEARCH_WINDOW``): many cheap proposals. Every sample is counted as one simulator call (a state's step time equals
``simulate()``'s). The temperature of the samples rises while batches reproduce the current placement.
Given ``start`` (``place search_seconds=S`` passes its plan, the best of the policy's greedy placement and its
samples), the search starts there instead (``starts``: ``given``; no decode of its own but ``RATE_DECISIONS``
decisions that time the first repairs) and, where the plan fits, returns nothing slower (a 500-node dataflow graph
on 64 mixed GPUs, 2 s: from its own start 86.9 ms, the plan 72.6 ms).

The result is a search row of its own (``policy_search``), never "learned": its ``meta`` carries ``sim_calls``,
``search_seconds`` and the anytime ``trace`` (``[seconds, calls, best step time]`` at every improvement), the
start's time (``start_time``, the better of the ``starts`` taken), the batches run and how many found a new best.

Within the seconds: the policy's greedy start is the best of its whole decodes at the windows that fit in
``START_SHARE`` of the seconds (``cost.decode.decode_windows``: a 16-node window first, then the placing window and
its halvings, largest first, each when its predicted time fits; ``start_windows`` in the meta; ``la_rule_search``
takes the same start with the rule), then, while they fit there too, the policy's greedy placements on links
``LINK_SCALES`` x slower at the largest window a whole decode ran at (``baselines.eft.link_starts``; "links x..."
in ``starts``). At 2,000 nodes the placing window's decode alone takes 0.3-0.9 s; there the
windows that fit are about as good for the policy as for its rule (five memory-feasible dev graphs of 2,000 nodes,
``scripts/probe_windows.py``: the best of those that fit 0.5 / 1 / 2 s, 0.988 / 0.981 / 0.981 x ``la_rule`` at its
window, the rule's own 0.990 / 0.983 / 0.983). A decode the seconds run out in stops deciding
(the earliest finish places the rest; ``start_cut`` in the meta; then ``sim_eft``'s whole placement, a few
milliseconds, is a start too), a repair is shortened to the longest suffix predicted to take at most ``PACE`` of
the seconds left (``suffix_start``; a batch's seconds per decision as measured, the first from the start's decodes
(their own seconds, not embedding the graph);
when not one decision fits, a single-node move instead), a repair batch the seconds still run out in is dropped, and
``la_rule``'s start is taken only when the greedy took at most ``RULE_START_SHARE`` of the seconds (0: never,
chosen on the dev split; at 2,000 nodes each start takes 0.3-0.9 s on this machine, seconds the annealing needs)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from placement_rl.agents.policy_rollout import student_head
from placement_rl.baselines.eft import link_views, start_cut
from placement_rl.cost.decode import (EARLIEST_FINISH, FORCED, LA_RULE, POLICY, SAMPLE, START_SHARE, _work, decode,
                                      decode_until, decode_windows, state_key)
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.window import completions_until, placing_window, window_completions
from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.errors import ConfigError
from placement_rl.plans import Placement

SAMPLES = 8  # episodes per batch (one schedule state of 8 episodes)
TEMPERATURE = 1.0
ANNEAL_SHARE = 0.8  # share of the annealing's seconds on single-node moves (the rest: the policy's repairs)
ADAPT = True  # the repairs' share of the annealing's seconds follows their recent gain per second against the
# single-node moves' (``baselines.search.anneal(adapt=True)``; from 1 - ANNEAL_SHARE; figures there)
REPAIR = 16  # sampled decisions per repair before the policy's greedy completes it (0: the whole suffix sampled)
COMPLETIONS = ("policy", "la_rule")  # what completes a repair after its sampled decisions (la_rule: an ablation)
RULE_START_SHARE = 0.0  # la_rule's start too only when the policy's greedy took at most this share of the seconds.
# Dev split (8 pairs and three 2,000-node graphs of seed 6, 0.5 / 2 / 10 s, searches held to their seconds): never
# taking it (0) 1.013 / 1.010 / 1.004 and 0.989 / 0.945 / 0.982 x the best search; 0.1: 1.015 / 1.010 / 1.006 and
# 0.994 / 0.945 / 0.990; always: 1.015 / 1.010 / 1.005 and 0.989 / 0.948 / 0.982
PACE = 0.5  # a repair's predicted seconds at most this share of the seconds left (None: any). Dev 2,000-node graphs
# of seeds 6-7 (scratch probe, one process, the same seeds; 7 graphs that fit memory): 0.990 / 1.000 against 1.000 /
# 1.006 x the best search at 0.5 s (before, a batch started there could not end within the seconds), level at 2 s
SEARCH_WINDOW = 16  # the window of the sampled states: a batch of 8 suffixes at W = 16 costs ~10x less than at the
# placing window, and more batches found more (4 synthetic 300-node pairs, 2 s: W 16 / 64 with 80% annealing)


def policy_search(policy: Any, graph, costs, topology, *, seconds: float, seed: int = 0, samples: int = SAMPLES,
                  temperature: float = TEMPERATURE, window: int | None = None, start: np.ndarray | None = None,
                  anneal_share: float = ANNEAL_SHARE,
                  task: ConstructiveTask | None = None, repair: int = REPAIR,
                  completion: str = "policy", adapt: bool = ADAPT, pace: float | None = PACE) -> Placement:
    """The best placement found in ``seconds`` of wall clock (module doc). ``window``: the lookahead window of
    the states the policy reads (default: the policy's own, ``placing_window``); ``start``: an incumbent to start
    from instead of the policy's greedy decode (its own row then; the result is never slower where it fits);
    ``pace``: ``suffix_start``'s share."""
    if not float(seconds) > 0:
        raise ConfigError(f"policy_search needs seconds > 0, got {seconds!r}")
    if completion not in COMPLETIONS:
        raise ConfigError(f"policy_search completion must be one of {', '.join(COMPLETIONS)}, got {completion!r}")
    if int(samples) < 1 or not float(temperature) > 0:
        raise ConfigError(f"policy_search needs samples >= 1 and temperature > 0, got {samples!r}, {temperature!r}")
    t0 = time.perf_counter()
    n, nd = graph.num_nodes, topology.num_devices
    wide = placing_window(n, int(getattr(policy, "window", 256)), int(getattr(policy, "full_window", 0)))
    window = min(SEARCH_WINDOW, wide) if window is None else window
    task = task if task is not None else ConstructiveTask(graph, topology, costs)
    head = student_head(policy, task).arrays()
    rng = np.random.default_rng(seed)
    calls, cut, starts, windows = 0, None, ["given"] if start is not None else ["policy"], []
    rate0 = 0.0  # seconds per node step of the start's decodes (a repair's first prediction)
    pool: list = []  # every start taken: (placement, fits memory)
    share_end = None  # the repairs' share of the seconds when the annealing ended
    deadline = t0 + float(seconds)
    if start is None:  # the policy's own greedy placement: at its placing window, or the windows that fit
        log: list = []
        t_dec = time.perf_counter()  # the decodes' own seconds: not embedding the graph (``student_head``)
        one, c = decode_windows(graph, costs, topology, POLICY, head, window=int(wide), log=log,
                                deadline=t0 + START_SHARE * float(seconds))
        calls += c
        rate0 = (time.perf_counter() - t_dec) / max(sum(_work(int(e[1]), int(e[0])) for e in log), 1.0)
        windows = [list(e[:2]) for e in log]
        done = max(e[1] for e in log)
        cut = start_cut("policy", done, n)
        start_dev = one.devices[0].copy()
        pool.append((start_dev, bool(one.feasible()[0])))
        if done < n:  # cut short: the earliest-finish rule's own placement (milliseconds) may be the better start
            eft = ScheduleState(graph, costs, topology, episodes=1, window=0)
            decode(eft, EARLIEST_FINISH)
            calls += 1
            starts.append("sim_eft")
            pool.append((eft.devices[0].copy(), bool(eft.feasible()[0])))
            if state_key(eft) < state_key(one):
                one, start_dev = eft, eft.devices[0].copy()
        # the policy's greedy on slower views of the links (baselines.eft.link_starts, with the policy's head), at
        # the largest window a whole start decode ran at, while each fits in START_SHARE of the seconds
        done_w = [int(e[0]) for e in log if int(e[1]) >= n]
        if done_w and nd > 1:
            w_, first = max(done_w), time.perf_counter() - t0

            def fits(slowest: float | None) -> bool:  # the next view, predicted by the slowest so far, in the share
                return time.perf_counter() - t0 + max(first, slowest or 0.0) <= START_SHARE * float(seconds)

            for scale, dev_ in link_views(graph, costs, topology, POLICY, head, window=w_, fits=fits):
                st_ = ScheduleState(graph, costs, topology, episodes=1, window=0)
                decode(st_, FORCED, forced=dev_)
                calls += window_completions(n, nd, w_) + 1
                starts.append(f"links x{scale:g}")
                pool.append((dev_.copy(), bool(st_.feasible()[0])))
                if state_key(st_) < state_key(one):
                    one, start_dev = st_, dev_.copy()
        took = time.perf_counter() - t0
        # and the rule the policy's lookahead feature is, when the seconds leave room for a second start
        if took <= RULE_START_SHARE * float(seconds):
            rule = ScheduleState(graph, costs, topology, episodes=1, window=int(wide))
            done = decode_until(rule, LA_RULE, deadline=deadline)
            calls += completions_until(n, nd, wide, done) + 1
            starts.append("la_rule")
            pool.append((rule.devices[0].copy(), bool(rule.feasible()[0])))
            if state_key(rule) < state_key(one):
                one, start_dev = rule, rule.devices[0].copy()
    else:
        start_dev = np.asarray(start, dtype=np.int64).copy()
        one = ScheduleState(graph, costs, topology, episodes=1, window=int(window))
        decode(one, FORCED, forced=start_dev)
        rate0 = _decode_rate(graph, costs, topology, head, int(window))
    inc_t, inc_ok = float(one.finish()[0]), bool(one.feasible()[0])
    start_t = inc_t
    calls += 1
    inc = best = start_dev
    best_t, best_ok = inc_t, inc_ok
    trace = [[time.perf_counter() - t0, calls, best_t]] if best_ok else []
    st = ScheduleState(graph, costs, topology, episodes=int(samples), window=int(window))
    # batches run, batches whose best sample beat every sample before it, the samples' temperature, that best
    stats = {"batches": 0, "improved": 0, "temp": float(temperature), "best": inc_t if inc_ok else np.inf,
             "rate": None, "skipped": 0}

    def large(cur: np.ndarray, rng_: np.random.Generator) -> np.ndarray:
        """The best of ``samples`` repairs of ``cur``: its first ``s`` decisions replayed, the next few sampled from
        the policy at the current temperature, the rest the policy's greedy (ruin and recreate); or, with
        ``repair=0``, the whole suffix sampled."""
        s = int(rng_.integers(n))
        if pace is not None:  # seconds per decision of a batch: as measured, or at first from the start's decodes
            rate = stats["rate"] if stats["rate"] is not None else rate0 * int(samples) * _work(n, int(window)) / n
            s = suffix_start(s, n, rate, deadline - time.perf_counter(), pace)
            if s is None:
                stats["skipped"] += 1
                return None  # anneal makes a single-node move instead
        tb = time.perf_counter()
        st.reset()
        decode(st, FORCED, stop=s, forced=cur)
        seed_ = int(rng_.integers(2**31))
        if repair > 0:
            decode(st, SAMPLE, head, stop=s + int(rng_.integers(1, repair + 1)), temperature=stats["temp"],
                   seed=seed_)
            # the rest by the policy's greedy (or, the ablation, by the rule), within the seconds
            rest = POLICY if completion == "policy" else LA_RULE
            if decode_until(st, rest, head if rest == POLICY else None, deadline=deadline) < n:
                return None  # the seconds ran out inside the batch: no proposal
        else:
            decode(st, SAMPLE, head, temperature=stats["temp"], seed=seed_)
        times, ok = st.finish(), st.feasible()
        r_ = (time.perf_counter() - tb) / max(n - s, 1)  # (the replayed prefix costs ~1% of a batch)
        stats["rate"] = r_ if stats["rate"] is None else 0.7 * stats["rate"] + 0.3 * r_
        prob.charge(int(samples) - 1)  # the batch's samples; the chosen one is scored (one more call) by anneal
        stats["batches"] += 1
        k = int(np.argmin(np.where(ok, times, np.inf) if ok.any() else times))
        same = bool(np.array_equal(st.devices[k], cur))
        if ok[k] and times[k] < stats["best"] * (1 - 1e-12):
            stats["improved"] += 1
            stats["best"] = float(times[k])
        # the temperature rises while batches reproduce the incumbent
        stats["temp"] = (min(stats["temp"] * 1.25, 4.0 * temperature) if same
                         else max(temperature, stats["temp"] * 0.9))
        return st.devices[k].copy()

    left = float(seconds) - (time.perf_counter() - t0)
    if left > 0 and n > 0 and nd > 1:
        from placement_rl.baselines.common import Problem
        from placement_rl.baselines.memory import best_start
        from placement_rl.baselines.search import anneal as _anneal

        prob = Problem(graph, costs, topology, budget=10**12, seed=int(rng.integers(2**31)), seconds=left)
        s0 = prob.score(inc)
        if s0 is not None and any(not ok_ for _, ok_ in pool):  # starts over memory weighed as memory.fit makes
            others = [(d_, prob.score(d_)) for d_, _ in pool if not np.array_equal(d_, inc)]  # them fit (the
            inc, s0 = best_start(prob, [(inc, s0), *others])  # fits share one fit's seconds), as other searches do
        if s0 is not None:
            dev = _anneal(prob, inc, s0, large=large, large_share=1.0 - float(anneal_share),
                          adapt=adapt)
            sd = prob.score(dev)
            # a faster placement that fits; or, while nothing fits, one that overflows less (as every search returns)
            if sd is not None and ((sd.feasible and (not inc_ok or sd.step_time < inc_t * (1 - 1e-12)))
                                   or (not sd.feasible and not inc_ok and sd.key < s0.key)):
                best, best_t, best_ok = dev.copy(), sd.step_time, bool(sd.feasible)
        off = time.perf_counter() - t0 - prob.elapsed  # the start's seconds before the search's clock began
        trace += [[off + float(x[0]), calls + int(x[1]), float(x[2])] for x in prob.trace]
        calls += prob.calls
        share_end = prob.meta.get("large_share_end")
    meta = {"placer": "policy_search", "seed": int(seed), "sim_calls": calls,
            "search_seconds": time.perf_counter() - t0, "seconds_budget": float(seconds), "trace": trace,
            "start_time": start_t, "starts": starts, "batches": stats["batches"], "improved": stats["improved"],
            "skipped": stats["skipped"],
            "large_share_end": share_end,
            "samples": int(samples), "window": int(window), "repair": int(repair), "completion": completion,
            "step_time": best_t,
            "feasible": best_ok, "start_windows": windows, **({"start_cut": cut} if cut else {})}
    return Placement(best, meta=meta).validate(graph, topology)


RATE_DECISIONS = 32  # decisions the policy makes to measure its decode's seconds per node step, given a start


def _decode_rate(graph, costs, topology, head: tuple, window: int) -> float:
    """Seconds per node step of the policy's greedy decode at ``window``, from its first ``RATE_DECISIONS``
    decisions (milliseconds): what paces the first repairs from a given start, which no decode of its own timed
    (unpaced, the first repair of 500 nodes on 64 devices ran the 2 s search to 2.9 s and was dropped)."""
    n = graph.num_nodes
    st = ScheduleState(graph, costs, topology, episodes=1, window=window)
    k = min(n, RATE_DECISIONS)
    t0 = time.perf_counter()
    decode(st, POLICY, head, stop=k)
    return (time.perf_counter() - t0) / max(_work(n, window) - _work(n - k, window), 1.0)  # the first k decisions


def suffix_start(s: int, n: int, seconds_per_decision: float, left: float, pace: float = PACE) -> int | None:
    """A repair's start step: the drawn ``s`` when the ``n - s`` decisions after it are predicted to take at most
    ``pace`` of the ``left`` seconds, else the earliest start whose suffix is; ``None`` when not one decision is."""
    most = int(pace * max(left, 0.0) / max(seconds_per_decision, 1e-12))
    return None if most < 1 else max(int(s), int(n) - most)


__all__ = ["policy_search", "suffix_start"]
