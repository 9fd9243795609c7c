"""Pipeline partitioners at a fixed micro-batch count (``pp_uniform``, ``pp_params``, ``pp_time_dp``, ``pipedream``;
see ``placement_rl.baselines.pipeline``'s module doc) and the shape rules the partitioners share: how many of the
fastest devices a shape may use (``device_counts``), the most stages 1F1B allows (``stage_cap``), one stage replicated
on every device (``_replicated``) and plans moved to the best-connected devices (``_best_connected``)."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from placement_rl.baselines.common import add_note
from placement_rl.baselines.pipe_common import (Plan, PipeProblem, Stages, cut_grid, microbatch_choices,
                                                 minmax_partition)
from placement_rl.errors import ConfigError

DP_SHARE = 0.5  # of given seconds, after which pipedream's DPs stop (the rest simulates their plans)


def device_counts(pp: PipeProblem, *, fallback: bool = False) -> list[int]:
    """How many of the fastest devices a fixed-shape planner may use, most first: all of them (its classic
    shape); on a cluster of unequal devices (or with ``fallback``, when no shape over all of them fits) also
    every count where the next device is slower (so a slow device can be left out), all but one, and the
    powers of two (a prime count need not force a shape). Equal devices keep the classic shape alone."""
    total = (pp.costs.fwd_time + pp.costs.bwd_time).sum(axis=0)[pp.devs]
    slower = [k for k in range(1, pp.d) if total[k] > total[k - 1] * (1 + 1e-9)]
    if not slower and not fallback:
        return [pp.d]
    out = {pp.d, max(pp.d - 1, 1), *slower}
    out.update(2**k for k in range(pp.d.bit_length()) if 2**k <= pp.d)
    return sorted(out, reverse=True)


def stage_cap(pp: PipeProblem) -> int:
    """The most stages a plan at the problem's micro-batch count may have: under 1F1B as many as micro-batches
    (torch's ``Schedule1F1B`` refuses fewer micro-batches than stages, so ``deploy`` and ``export`` did)."""
    return min(pp.d, pp.n, pp.m) if pp.schedule == "1f1b" else min(pp.d, pp.n)


def _note_cap(pp: PipeProblem) -> int:
    """``stage_cap``, saying in the plan's note when it keeps the planner below its stage count."""
    cap = stage_cap(pp)
    if cap < min(pp.d, pp.n):
        pp.extra_meta["note"] = (f"at most {cap} stage{'s' if cap > 1 else ''}: 1F1B needs as many micro-batches as "
                                 f"stages (num_microbatches={pp.m}); raise num_microbatches or use schedule=gpipe")
    return cap


def _stage_counts(pp: PipeProblem) -> list[int]:
    """Stage counts a fixed-shape planner tries: one per device first (its classic shape), then fewer stages on
    the fastest devices (``device_counts``), the best simulated one wins; at most ``stage_cap``."""
    cap = _note_cap(pp)
    return sorted({min(s, cap) for s in device_counts(pp)}, reverse=True)


def pp_uniform(pp: PipeProblem) -> Plan:
    cands = []
    for s in _stage_counts(pp):
        cuts = [int(round(k * pp.n / s)) for k in range(s + 1)]
        cands.append(pp.choice(cuts, pp.fit_degrees((1,) * s)))
    return pp.best_of(cands)


def pp_params(pp: PipeProblem) -> Plan:
    prefix = pp.param_prefix
    all_cuts = minmax_partition(pp.n, min(pp.d, pp.n), lambda j, k: prefix[j] - prefix[:j])
    return pp.best_of([pp.choice(all_cuts[s - 1], pp.fit_degrees((1,) * s)) for s in _stage_counts(pp)
                       if s <= len(all_cuts)])


def pp_time_dp(pp: PipeProblem) -> Plan:
    """For every stage count the cuts of least bottleneck, on time alone and with each stage kept to its device's
    memory (its micro-batches in flight taken at their most over the stage counts); the best simulated wins."""
    s_max = _note_cap(pp)
    inflight = (lambda k: pp.m) if pp.schedule == "gpipe" else (lambda k: min(pp.m, s_max - k))

    def kept(j: int, k: int) -> np.ndarray:
        return np.where(pp.stage_fits(j, k, k + 1, 1, pp.m, inflight(k)), pp.stage_time_vec(j, k, k + 1, 1), np.inf)

    cands = []
    for cost in (lambda j, k: pp.stage_time_vec(j, k, k + 1, 1), kept):
        for s, cuts in enumerate(minmax_partition(pp.n, s_max, cost), start=1):
            if any(b <= a for a, b in zip(cuts, cuts[1:])):  # no split of s stages fits (an argmin over inf)
                continue
            bottleneck = max(float(cost(cuts[k + 1], k)[cuts[k]]) for k in range(s))
            if np.isfinite(bottleneck) and (bottleneck, cuts) not in [c[:2] for c in cands]:
                cands.append((bottleneck, cuts, pp.fit_degrees((1,) * s)))
    cands.sort(key=lambda c: c[0])  # best estimate first (taken when the budget runs out)
    return pp.best_of([pp.choice(cuts, degrees) for _, cuts, degrees in cands])


def _replicated(pp: PipeProblem, sharding: str) -> list[Plan]:
    """One stage on every device, at each micro-batch count the batch allows."""
    return [([0, pp.n], (pp.d,), m, sharding)
            for m in microbatch_choices(1, pp.d, pp.batch_size, schedule=pp.schedule)]


def _best_connected(pp: PipeProblem, plans: list[Plan]) -> Iterator[Plan]:
    """Each plan (TP 1) preceded by the same stages on the best-connected devices of its classes
    (``pipe_ideals.connected_groups``) where links split equal devices: the runs of ``pp.devs`` take ties by
    index, on a DGX-1 the DDP pair (0, 1) joined by one NVLink where (0, 3) has two. Where links split no class (or
    the picks are the plan's own devices) the plans as they are."""
    from placement_rl.baselines.pipe_ideals import connected_groups, link_arrays, split_classes

    classes = split_classes(pp)
    if classes is None:
        yield from plans
        return
    links = link_arrays(pp)
    class_of = {d: k for k, devs in enumerate(classes) for d in devs}
    picked: dict[tuple, tuple[tuple[int, ...], ...]] = {}
    for plan in plans:
        cuts, degrees = plan[0], plan[1]
        if isinstance(cuts, Stages) or (len(plan) > 4 and plan[4] and max(plan[4]) > 1):
            yield plan
            continue
        bounds = np.cumsum([0, *degrees])
        own = [pp.devs[bounds[k]:bounds[k + 1]].tolist() for k in range(len(degrees))]
        seq = tuple(tuple(sum(class_of[x] == k for x in g) for k in range(len(classes))) for g in own)
        if seq not in picked:
            picked[seq] = connected_groups(pp, classes, seq, links)
        if [set(g) for g in picked[seq]] != [set(g) for g in own]:
            stage = np.empty(pp.n, dtype=np.int64)
            for k in range(len(cuts) - 1):
                stage[pp.order[cuts[k]:cuts[k + 1]]] = k
            yield (Stages(tuple(int(x) for x in stage), picked[seq]), *plan[1:])
        yield plan


def pipedream(pp: PipeProblem) -> Plan:
    """PipeDream's DP (``_pipedream_dp``) twice, in one pass: on time alone, and with every stage kept to its devices'
    memory (as PipeDream's optimizer does; a stage's micro-batches in flight taken at their most, ``pp.m``); the best
    simulated of both, and of full replication, wins.

    Given seconds (``pp.seconds``), the DPs stop at ``DP_SHARE`` of them (the rest simulates), though not before one
    device count has a plan: the DPs run by device count, fewest first, so the plans of the counts done by then
    stand; they and full replication are simulated, best estimate first, while the seconds last (else the first is
    taken), and ``meta["note"]`` says on how many devices the DPs planned."""
    kept, timed, done = _pipedream_dp(pp)
    cap = _note_cap(pp) if any(len(c[2]) > stage_cap(pp) for c in kept + timed) else stage_cap(pp)
    if done < pp.d:
        add_note(pp.extra_meta, f"the seconds ran out in PipeDream's DP: its plans use at most {done} of the {pp.d} "
                                "devices besides full replication (more seconds plan on more)")
    cands = sorted((c for c in kept + timed if len(c[2]) <= cap), key=lambda c: c[0])  # best estimate
    if not cands:  # first (taken when the budget runs out)
        raise ConfigError(f"pipedream found no plan: batch_size {pp.batch_size} admits no DP degree with "
                          f"num_microbatches {pp.m}")
    return pp.best_of(_best_connected(pp, _replicated(pp, "dp") + [pp.choice(cuts, degrees)
                                                                   for _, cuts, degrees in cands]))


def _pipedream_dp(pp: PipeProblem) -> tuple[list[tuple], list[tuple], int]:
    """PipeDream's DP on time alone (table 0) and with every stage kept to its devices' memory (table 1): a[b, m],
    the best bottleneck covering positions [0, grid[b]) with stages on the first m devices, the last stage replicated
    over r of them. Column m needs only the columns before it, so the tables fill by device count (``_dp_column``)
    and, given seconds, stop at ``DP_SHARE`` of them once a device count has a plan. Returns (kept, timed, done):
    the plan of every device count up to ``done`` (all ``pp.d`` unless cut) with a finite bottleneck, as
    (bottleneck, cuts, DP degrees)."""
    grid = cut_grid(pp.n)
    g = len(grid) - 1
    a = np.full((2, g + 1, pp.d + 1), np.inf)
    choice = np.zeros((2, g + 1, pp.d + 1, 2), dtype=np.int64)  # (grid index i, r) of the last stage
    a[:, 0, 0] = 0.0
    first = np.full((2, pp.d + 1), g + 1)  # per table and column: the first finite row (g + 1: none)
    first[:, 0] = 0
    done = 0
    for m in range(1, pp.d + 1):
        if not _dp_column(pp, grid, a, choice, first, m, may_stop=bool(np.isfinite(a[:, g, 1:m]).any())):
            break
        done = m
    return _dp_plans(grid, a[1], choice[1], done), _dp_plans(grid, a[0], choice[0], done), done


def _dp_column(pp: PipeProblem, grid: np.ndarray, a: np.ndarray, choice: np.ndarray, first: np.ndarray, m: int, *,
               may_stop: bool) -> bool:
    """Column ``m`` of both of ``_pipedream_dp``'s tables (and of ``first``); False where ``may_stop`` and the
    seconds' ``DP_SHARE`` ran out first. A stage's time is computed once for both tables, and a last stage on
    devices [lo, m) is skipped where no plan of a prefix on the first lo devices is finite (a[i, 0] is finite only at
    i = 0 and a[0, lo > 0] never, so stages stay non-empty)."""
    for b in range(1, len(grid)):
        if may_stop and pp.out_of_time(DP_SHARE):
            return False
        j = int(grid[b])
        for r in range(1, m + 1):
            lo = m - r  # devices [lo, m) replicate this stage
            if first[0, lo] >= b or not pp.degree_ok(r):  # (table 1 is never below table 0)
                continue
            timed = pp.stage_time_vec(j, lo, m, r)[grid[:b]]
            stage = [timed]
            if first[1, lo] < b:
                stage.append(np.where(pp.stage_fits(j, lo, m, r, pp.m, pp.m)[grid[:b]], timed, np.inf))
            for k, cost_k in enumerate(stage):
                cost = np.maximum(a[k, :b, lo], cost_k)
                i = int(np.argmin(cost))
                if cost[i] < a[k, b, m]:
                    a[k, b, m] = cost[i]
                    choice[k, b, m] = (i, r)
    for k in range(2):
        finite = np.flatnonzero(np.isfinite(a[k, :, m]))
        first[k, m] = finite[0] if finite.size else len(grid)
    return True


def _dp_plans(grid: np.ndarray, a: np.ndarray, choice: np.ndarray, done: int) -> list[tuple]:
    """The plan of every device count up to ``done`` with a finite bottleneck in one of ``_pipedream_dp``'s tables,
    as (bottleneck, cuts, DP degrees)."""
    g = len(grid) - 1
    cands = []
    for m in range(1, done + 1):
        if not np.isfinite(a[g, m]):
            continue
        cuts, degrees, b, mm = [int(grid[g])], [], g, m
        while b > 0:
            i, r = choice[b, mm]
            cuts.append(int(grid[i]))
            degrees.append(int(r))
            b, mm = int(i), mm - int(r)
        cands.append((a[g, m], cuts[::-1], tuple(degrees[::-1])))
    return cands
