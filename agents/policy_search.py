"""Policy-guided search: the constructive policy as the proposal of a large-neighbourhood search.

``policy_search(policy, graph, costs, topology, seconds=...)`` keeps an incumbent placement (the policy's own
greedy decode to start) and, until the wall clock is spent, alternates large moves proposed by the policy with
annealing moves (``baselines.search.anneal`` for ``anneal_share`` of the time, an iterated local search). A large
move repairs a suffix of the incumbent: a start step ``s`` of the
decision order is drawn, the incumbent's first ``s`` decisions are replayed (``decode``'s ``FORCED`` chooser), and
the rest is sampled ``samples`` times from the policy at ``temperature`` (``SAMPLE``: Gumbel-max over the device
head's scores, batched as episodes of one schedule state, all in the compiled kernel). The best sample replaces
the incumbent when it is faster (or, with ``anneal``, with a small probability when slower, as simulated
annealing accepts). The sampled states read a short window (``SEARCH_WINDOW``): many cheap proposals. The state's step time of each sample equals ``simulate()`` of its placement, so every sample
is counted as one simulator call. Start steps are drawn uniformly over the decisions, so short repairs of the
tail and whole re-samples both happen; the temperature rises when a batch reproduces the incumbent.

The result is a search row of its own (``policy_search``), never "learned": its ``meta`` carries ``sim_calls``,
``search_seconds`` and the anytime ``trace`` (``[seconds, calls, best step time]`` at every improvement), the
greedy start's time (``start_time``) and how many batches improved.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from placement_rl.agents.constructive import graph_tensors
from placement_rl.agents.fast_decode import Head
from placement_rl.cost.decode import FORCED, POLICY, SAMPLE, decode
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.window import placing_window
from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.errors import ConfigError
from placement_rl.plans import Placement

SAMPLES = 8  # episodes per batch (one schedule state of 8 episodes)
TEMPERATURE = 1.0
ANNEAL_SHARE = 0.8  # share of the seconds spent on annealing moves between policy batches (0: the policy alone)
SEARCH_WINDOW = 16  # the window of the sampled states: a batch of 8 suffixes at W = 16 costs ~10x less than at the
# placing window, and more batches found more (4 synthetic 300-node pairs, 2 s: W 16 / 64 with 80% annealing)


def _head(policy: Any, task: ConstructiveTask) -> Head:
    import torch

    with torch.no_grad():
        h = policy.embed(*graph_tensors(task)).double().numpy()
    return Head(policy, h)


def policy_search(policy: Any, graph, costs, topology, *, seconds: float, seed: int = 0, samples: int = SAMPLES,
                  temperature: float = TEMPERATURE, window: int | None = None, start: np.ndarray | None = None,
                  anneal: bool = True, anneal_share: float = ANNEAL_SHARE,
                  task: ConstructiveTask | None = None) -> Placement:
    """The best placement found in ``seconds`` of wall clock (module doc). ``window``: the lookahead window of
    the states the policy reads (default: the policy's own, ``placing_window``); ``start``: an incumbent to start
    from instead of the policy's greedy decode (its own row then)."""
    if not float(seconds) > 0:
        raise ConfigError(f"policy_search needs seconds > 0, got {seconds!r}")
    if int(samples) < 1 or not float(temperature) > 0:
        raise ConfigError(f"policy_search needs samples >= 1 and temperature > 0, got {samples!r}, {temperature!r}")
    t0 = time.perf_counter()
    n, nd = graph.num_nodes, topology.num_devices
    if window is None:
        window = min(SEARCH_WINDOW, placing_window(n, int(getattr(policy, "window", 256)),
                                                   int(getattr(policy, "full_window", 0))))
    task = task if task is not None else ConstructiveTask(graph, topology, costs)
    head = _head(policy, task).arrays()
    rng = np.random.default_rng(seed)
    one = ScheduleState(graph, costs, topology, episodes=1, window=int(window))
    calls = 0
    if start is None:
        decode(one, POLICY, head)
        start_dev = one.devices[0].copy()
    else:
        start_dev = np.asarray(start, dtype=np.int64).copy()
        one.reset()
        decode(one, FORCED, forced=start_dev)
    inc_t, inc_ok = float(one.finish()[0]), bool(one.feasible()[0])
    start_t = inc_t
    calls += 1
    inc = start_dev
    best, best_t, best_ok = inc.copy(), inc_t, inc_ok
    trace = [[time.perf_counter() - t0, calls, best_t]] if best_ok else []
    st = ScheduleState(graph, costs, topology, episodes=int(samples), window=int(window))
    temp, batches, improved = float(temperature), 0, 0
    if anneal_share > 0:
        from placement_rl.baselines.common import Problem
        from placement_rl.baselines.search import anneal as _anneal

    while time.perf_counter() - t0 < float(seconds) and n > 0 and nd > 1:
        if anneal_share > 0 and batches > 0:  # local moves between the policy's large ones (iterated local search)
            left = float(seconds) - (time.perf_counter() - t0)
            span = min(left, last_batch * anneal_share / (1.0 - anneal_share))
            if span > 1e-3:
                prob = Problem(graph, costs, topology, budget=10**12, seed=int(rng.integers(2**31)), seconds=span)
                s0 = prob.score(inc)
                if s0 is not None:
                    dev = _anneal(prob, inc, s0)
                    sd = prob.score(dev)
                    calls += prob.calls
                    if sd is not None and sd.feasible and (not inc_ok or sd.step_time < inc_t * (1 - 1e-12)):
                        inc, inc_t, inc_ok = dev.copy(), sd.step_time, True
                    if inc_ok and (inc_t < best_t * (1 - 1e-12) or not best_ok):
                        best, best_t, best_ok = inc.copy(), inc_t, True
                        trace.append([time.perf_counter() - t0, calls, best_t])
            if time.perf_counter() - t0 >= float(seconds):
                break
        tb = time.perf_counter()
        s = int(rng.integers(n))
        st.reset()
        decode(st, FORCED, stop=s, forced=inc)
        decode(st, SAMPLE, head, temperature=temp, seed=int(rng.integers(2**31)))
        times, ok = st.finish(), st.feasible()
        calls += int(samples)
        batches += 1
        key = np.where(ok, times, np.inf) if inc_ok or ok.any() else times
        k = int(np.argmin(key))
        cand_t, cand_ok = float(times[k]), bool(ok[k])
        same = bool(np.array_equal(st.devices[k], inc))
        better = (cand_ok and not inc_ok) or (cand_ok == inc_ok and cand_t < inc_t * (1 - 1e-12))
        # annealing: accept a slower batch best with a probability falling over the run (0.2% of the step time at
        # the start, 0.01% at the end, as the local search's schedule)
        frac = min(1.0, (time.perf_counter() - t0) / float(seconds))
        tau = 0.002 * (0.05 ** frac) * max(inc_t, 1e-12)
        worse_ok = (anneal and cand_ok and inc_ok and not same
                    and rng.random() < np.exp(-(cand_t - inc_t) / max(tau, 1e-30)))
        if better or worse_ok:
            inc, inc_t, inc_ok = st.devices[k].copy(), cand_t, cand_ok
        if cand_ok and (cand_t < best_t * (1 - 1e-12) or not best_ok):
            best, best_t, best_ok = st.devices[k].copy(), cand_t, True
            improved += 1
            trace.append([time.perf_counter() - t0, calls, best_t])
        temp = min(temp * 1.25, 4.0 * temperature) if same else max(temperature, temp * 0.9)
        last_batch = time.perf_counter() - tb
    meta = {"placer": "policy_search", "seed": int(seed), "sim_calls": calls,
            "search_seconds": time.perf_counter() - t0, "seconds_budget": float(seconds), "trace": trace,
            "start_time": start_t,
            "batches": batches, "improved": improved, "samples": int(samples), "window": int(window),
            "step_time": best_t, "feasible": best_ok}
    return Placement(best, meta=meta).validate(graph, topology)


__all__ = ["policy_search"]
