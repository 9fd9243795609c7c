"""Pipeline partitioners and data-parallel planners: the whole stage plan (stages, cuts, DP degree per
stage, micro-batches, DP or sharded DP), as users choose it.

All share one search space, so ``pp_exhaustive`` bounds the others: stage ``k`` is the ``k``-th contiguous
segment of ``graph.topo_order`` (so no edge goes backwards), and the device groups are consecutive runs of
the devices sorted fastest first (ties by index), a run's length being the stage's DP degree (``pp_exhaustive``
and ``exact`` also try every order and choice of devices that differ in speed, memory or links, ``pipe_orders``,
where their budgets hold it; ``hybrid`` and ``pipedream`` also each plan on the best-connected devices where links
differ between equal devices, as on a DGX-1's NVLink mesh). Candidates are scored with the ``PipelineSimulator``
(feasible first, then step time), and ``batch_size`` (when given) rules out DP degrees x micro-batch counts that do
not divide it.

Fixed micro-batch count (the ``num_microbatches`` argument), DDP replication; under 1F1B at most as many stages as
micro-batches (``stage_cap``: torch's ``Schedule1F1B``, which ``deploy`` runs, refuses fewer):

* ``pp_uniform``: stages = devices, equal node counts per stage, DP degree 1; also every smaller stage count
  on the fastest devices (a slow device need not be a stage), the best simulated shape wins.
* ``pp_params``: as ``pp_uniform`` with parameter bytes balanced (DeepSpeed ``partition_method="parameters"``:
  the contiguous split minimising the largest stage's parameters).
* ``pp_time_dp``: for each stage count ``S <= D`` a dynamic program over cut points minimising the slowest
  stage (fwd + bwd time on its device + its outgoing boundary transfers, both directions), once on time alone
  and once with every stage kept to its device's memory; the plan with the best simulated step time wins.
* ``pipedream``: PipeDream's planner -- a DP over (prefix of the order, devices used) whose last stage may be
  replicated over ``r`` devices (compute / r, plus the ring all-reduce of its parameters), on time alone and with
  every stage kept to its devices' memory (as PipeDream's optimizer); the best plan for
  every device count is simulated, and so is full replication of the whole model over all devices (plain
  DP, which PipeDream's planner also weighs) at every micro-batch count; the best is kept. Where links differ
  between equal devices each plan is simulated first on the best-connected of them (``_best_connected``).

Whole-plan searches (they choose the micro-batch count among ``microbatch_choices``, ignoring
``num_microbatches``):

* ``dp``: DDP -- one stage, the whole model replicated on every device, gradients all-reduced in buckets
  that overlap the backward; the best micro-batch count (gradient accumulation) is kept.
* ``fsdp``: sharded DP (FSDP2 / ZeRO-3) over every device: one stage, ``sharding="fsdp"``.
* ``hybrid``: DP x PP -- every ``pp x dp = n`` on the ``n`` fastest devices (equal DP degree per stage, as the
  executor's 2-D mesh runs it), every micro-batch count, DDP or FSDP inside each stage, cuts from the time-balanced
  DP for that stage count; ``n = D`` and, on unequal devices, on a ``D`` that is not a power of two or where the
  batch does not split over all ``D``, also fewer devices (``device_counts``: ``D - 1``, the powers of two, every
  count where the next device is slower); ``dp`` and ``fsdp`` are among its candidates, simulated first. Where links
  differ between equal devices each plan is simulated first on the best-connected of them (``_best_connected``).
* ``pp_exhaustive``: every stage count x cut set x DP-degree vector (sum <= D) x micro-batch count x
  sharding; ``ConfigError`` when that is more than the budget. On devices that differ (in speed, memory or links)
  also every order and choice of their classes (a pipeline may start on a slower GPU, a DDP pair may have two
  NVLinks: ``pipe_orders``) where the budget holds it, else the fastest-first runs alone (where links split equal
  devices: also on the best-connected ones) and ``meta["note"]`` says so.

With tensor parallelism (``pipe_tp``; TP degree per stage, TP groups inside a host): ``tp`` (a host's devices
in one TP group, DP across hosts), ``megatron`` (TP within a host, PP across hosts, DP for the rest) and
``exact`` (every pp x dp x tp x micro-batch count x sharding, cuts by Alpa's dynamic program; see its limits), and
``exact`` also searches the full stage-plan space (``pipe_ideals``: stages any ideal differences of the DAG, any
device group per stage, any subset of the devices; a DP over ideals, exact for time per sample); its best
configurations' cuts are then moved while the simulator prefers it (``pipe_refine``).

``objective`` (every partitioner): ``step`` (default: the simulated step time) or ``throughput`` (steady-state time
per batch, ``cost.throughput``): candidates are ranked by it. ``seconds`` (every partitioner): a wall-clock budget
beside the simulations' (``evaluate seconds=``): the simulations stop when it is spent and the best plan so far
wins; ``exact`` also stops its configurations and its DP's micro-batch counts there (``meta`` says so), and
``pp_exhaustive``, whose row is the optimum or nothing, is then a note.

The dynamic programs are O(P^2 D) (``pp_time_dp``) and O(P^2 D^2) (``pipedream``) over P candidate cut
points: every position up to ``MAX_CUT_POINTS`` nodes, evenly spaced positions beyond (coarsen big graphs).

The fixed micro-batch planners and the shape rules the planners share live in ``pipe_fixed``, ``pp_exhaustive`` and
its space in ``pipe_exhaustive``; ``dp``, ``fsdp``, ``hybrid``, ``exact`` and the registry (``PARTITIONERS``,
``get``) here.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import placement_rl.baselines.pipe_tp as pipe_tp
from placement_rl.baselines.common import Score
from placement_rl.baselines.pipe_common import (NO_FIT_SIMULATED, Plan, PipeProblem, microbatch_choices,
                                                minmax_partition, plan_of)
from placement_rl.baselines.pipe_exhaustive import (FASTEST_FIRST_ONLY, _exhaustive_space, compositions,
                                                     count_compositions, pp_exhaustive)
from placement_rl.baselines.pipe_fixed import (_best_connected, _replicated, device_counts, pipedream, pp_params,
                                                pp_time_dp, pp_uniform, stage_cap)
from placement_rl.plans import SHARDINGS
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError, PlanError, fmt_bytes
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

Segments = list[int]  # cut positions: stage k covers topo positions [cuts[k], cuts[k + 1])
EXACT_ENUMERATE = 2000  # ``exact`` also simulates every plan of ``pp_exhaustive``'s space when it has no more
EXACT_ORDERS = 20000  # and on unequal devices, with every order of their classes (``pipe_orders``), this many
OTHERS_SHARE = 0.6  # of given seconds, after which exact takes no more of the other planners' plans
EXACT_OTHERS_DEVICES = 16  # and takes pipedream's, hybrid's and pp_time_dp's plans up to this many devices (their
# dynamic programs grow as D^2: at 512 devices pipedream's alone would run for hours)


def _whole_model(pp: PipeProblem, sharding: str) -> Plan:
    cands = _replicated(pp, sharding)
    if not cands:
        raise ConfigError(f"batch_size {pp.batch_size} is not divisible by the {pp.d} devices of topology "
                          f"'{pp.topology.name}': no data-parallel plan over all of them")
    return pp.best_of(cands)


def dp(pp: PipeProblem) -> Plan:
    return _whole_model(pp, "dp")


def fsdp(pp: PipeProblem) -> Plan:
    return _whole_model(pp, "fsdp")


def hybrid(pp: PipeProblem) -> Plan:
    """Every ``pp x dp = n`` on the ``n`` fastest devices for each count ``n`` of ``device_counts``: ``n = D``; on
    unequal devices, on a ``D`` that is not a power of two (a prime D need not force a shape) or where the batch does
    not split over all ``D`` devices, also ``D - 1``, the powers of two below ``D`` and every count where the next
    device is slower (a slow device need not be a stage or a replica)."""
    cands = _replicated(pp, "dp") + _replicated(pp, "fsdp")  # pp = 1 first: never worse than dp / fsdp
    fewer = not cands or pp.d & (pp.d - 1) != 0  # on equal devices: no DP over them all, or a D of few shapes
    rest = _hybrid_shapes(pp, device_counts(pp, fallback=fewer))
    if not cands and not rest:  # nothing over every device fits the batch: fewer devices
        rest = _hybrid_shapes(pp, device_counts(pp, fallback=True))
    return pp.best_of(_best_connected(pp, cands + [c for _, c in rest]))


def _hybrid_shapes(pp: PipeProblem, counts: list[int]) -> list[tuple[float, Plan]]:
    """``hybrid``'s pipelined and partly replicated shapes on ``counts`` devices, best estimate first."""
    n, d = pp.n, pp.d
    rest = []
    for r, s in ((r, s) for used in counts for r in range(used, 0, -1) if used % r == 0 for s in [used // r]):
        if (s == 1 and r == d) or s > n:
            continue
        if rest and pp.out_of_time(0.5):  # given seconds: the shapes so far, the rest of them to simulate
            break
        for m in microbatch_choices(s, r, pp.batch_size, schedule=pp.schedule):
            for sh in SHARDINGS:
                got = _fitting_cuts(pp, s, r, m, sh)
                if got is not None:
                    rest.append((got[0] * (m + s - 1) / m, (got[1], (r,) * s, m, sh)))  # with the pipeline bubble
    rest.sort(key=lambda c: c[0])
    return rest


def _fitting_cuts(pp: PipeProblem, s: int, r: int, m: int, sharding: str) -> tuple[float, list[int]] | None:
    """``hybrid``'s time-balanced cuts for ``s`` stages of DP degree ``r``: the least bottleneck among the cuts
    whose stages fit their devices' memory (``PipeProblem.stage_fits``; a slow or small device need not take more
    than it holds), else the unconstrained ones (simulated as not fitting); None for fewer positions than stages."""
    inflight = (lambda k: m) if pp.schedule == "gpipe" else (lambda k: min(m, s - k))

    def timed(j: int, k: int) -> np.ndarray:
        return pp.stage_time_vec(j, k * r, (k + 1) * r, r, m)

    def fitting(j: int, k: int) -> np.ndarray:
        return np.where(pp.stage_fits(j, k * r, (k + 1) * r, r, m, inflight(k), sharding), timed(j, k), np.inf)

    for cost in (fitting, timed):
        all_cuts = minmax_partition(pp.n, s, cost)
        if len(all_cuts) < s:
            return None
        cuts = all_cuts[s - 1]
        if any(b <= a for a, b in zip(cuts, cuts[1:])):  # no split fits (the DP's argmin over inf): go on
            continue
        est = max(float(cost(cuts[k + 1], k)[cuts[k]]) for k in range(s))
        if np.isfinite(est):
            return est, cuts
    return None


def exact(pp: PipeProblem) -> Plan:
    """The full stage-plan space (``pipe_ideals``: any ideal differences as stages, any device group per stage,
    any subset of devices) plus the DP x TP x PP configurations of ``pipe_tp.exact``; the best simulated plan
    (by ``pp.objective``) wins, ties going to ``pipe_tp.exact``'s plan; then the cuts of the best configurations'
    plans moved while the simulator prefers it (``pipe_refine``).

    What ``meta`` proves: ``exhaustive``, every DP x TP x PP configuration of ``pipe_tp.exact`` searched and its
    candidates simulated; ``ideals_complete``, the DP over ideals saw every ideal (its estimate's optimum is exact,
    but only its best estimates are simulated); ``contiguous_enumerated``, every contiguous plan (TP 1, no
    recomputation) was simulated, on the fastest-first runs and, on devices that differ (speed, memory or links), on
    every order and choice of their classes (``pipe_orders``): the plan is then at least as fast as each of them.
    Only the last bounds the simulated step time, and only over that space (``pipe_tp.exact``'s configurations
    take the devices in ``pp.devs`` order and, where links split equal devices, in groups by links:
    ``pipe_tp.tp_orders``). No flag covers a plan that recomputes with a DP degree per stage (a first stage
    recomputing on one device, the next on two): ``pipe_tp.exact`` recomputes with one DP degree for every stage,
    the enumeration and ``pipe_ideals`` do not recompute. Where no plan simulated fits memory, the simulated plans
    are tried again at the least memory their shapes take (``_least_over``): the best of all, and where none fits,
    ``note`` says so."""
    from placement_rl.baselines.pipe_ideals import ideal_candidates
    from placement_rl.baselines.pipe_orders import device_orders
    from placement_rl.baselines.pipe_refine import refine

    cands, info = ideal_candidates(pp)
    head = pp.best_of([c for _, c in cands[:1]]) if cands else None  # the DP's best is simulated whatever the budget
    legacy = pipe_tp.exact(pp)
    pp.extra_meta = {**pp.extra_meta, **info}
    # the closed-form planners' plans (their DPs are cheap; a DP degree per stage, which the configurations lack)
    # and, where it is small, the whole contiguous space: exact is never behind them (it was on 1.7% of random
    # small problems: analytic objectives rank plans otherwise than the simulator)
    others = []
    for fn in (pp_time_dp, pipedream, hybrid) if pp.d <= EXACT_OTHERS_DEVICES else ():  # cheapest first
        if pp.out_of_time(OTHERS_SHARE):  # given seconds: what is left simulates the candidates
            pp.extra_meta["others_cut_short"] = True
            break
        try:
            others.append(fn(pp))
        except ConfigError:  # no plan of that planner's shape (the batch does not split): the others go on
            pass
    pp.extra_meta.pop("note", None)  # the other planners' notes (a stage cap at their micro-batch count) are theirs
    left = max(pp.left, 0)
    limit = min(EXACT_ENUMERATE, left // 2)  # fastest-first runs: every device order where the devices are equal
    wide = min(EXACT_ORDERS, left)  # with every order of unequal device classes (``pipe_orders``): all of what is
    # left, if need be (the climbs below then only move the cuts of plans with TP or recomputation)
    total, every = _exhaustive_space(pp, cap=max(limit, wide))
    # (0 on equal devices on alike links; not every order where links split many classes: best-connected picks)
    more, orders, every_order = device_orders(pp, cap=max(wide - total, 0))
    full = more > 0 and total + more <= wide
    listed = (list(every) if total <= limit or full else []) + (list(orders) if full else [])
    best = pp.best_of([legacy] + ([head] if head else []) + [c for _, c in cands[1:]] + others + listed)
    pp.extra_meta["contiguous_enumerated"] = ((full and every_order) or (more == 0 and total <= limit)) \
        and not pp.cut_short
    notes = []
    # the order search's size: what the budget left, or the fixed cap a larger budget does not lift
    limit_words = (f"the {wide} simulations left" if wide < EXACT_ORDERS else
                   f"the fixed cap of {EXACT_ORDERS} simulations on the order search (EXACT_ORDERS in "
                   "placement_rl/baselines/pipeline.py; a larger budget does not raise it)")
    if more > 0 and not pp.extra_meta["contiguous_enumerated"]:  # devices that differ: a better order may exist
        notes.append("not every contiguous plan simulated: " + (
            "the budget or seconds ran out" if full and every_order else
            f"with every order and choice of the devices (their links differ) they are more than {limit_words}; "
            "over fastest-first runs, also on best-connected devices" if full else
            f"with every order of the devices that differ they are more than {limit_words}"))
    climbed, moved = refine(pp)  # the cuts the simulator prefers near the best configurations' plans
    pp.extra_meta.update(moved)
    best = best if climbed is None else pp.best_of([best, climbed])
    if not any(s.feasible for _, s in pp.scored_items()):  # none fits: also at the least memory of each shape
        best, over = _least_over(pp, best)
        if over is None or not over.feasible:
            by = "" if over is None else f" ({fmt_bytes(over.overflow)} over capacity in all)"
            notes.append(f"{NO_FIT_SIMULATED}: the least over it of the {len(pp.scored_items())} "
                         f"simulated returned{by}; exact's space gives every stage one TP degree (what deploy "
                         "runs): a plan with a degree per stage (e.g. TP 1 then 3) may fit in the simulator")
    if len(best) > 5 and "full" in (best[5] or ()) and pp.graph.members is not None:
        notes.append(f"selective recomputation not weighed: graph '{pp.graph.name}' is coarsened (its attention "
                     "cores merged away; graph.coarsen.enabled=false keeps them)")
    if notes:
        pp.extra_meta["note"] = "; ".join(notes)
    return best


def _least_over(pp: PipeProblem, best: Plan) -> tuple[Plan, Score | None]:
    """``(plan, its score)`` where no plan simulated fits memory: ``best`` (the least over memory of them:
    ``Score.key``, bytes over capacity then time) or, better, one of them again at the least memory its shape takes,
    which ``pipe_tp``'s cut search leaves untried where no recomputation fits a stage: every stage recomputing (each
    mode of ``pipe_tp.RECOMPUTE``, ``full`` first: training under GPipe or 1F1B; a mode the graph refuses is
    dropped) and, with TP, sequence parallelism; the least over first, while the simulations and seconds last."""
    train = pp.sim.mode == "train" and pp.schedule in ("gpipe", "1f1b")
    modes = sorted((x for x in pipe_tp.RECOMPUTE if x != "none" and train), key=lambda x: x != "full")
    best_s = pp.score(*best, past_seconds=True)
    for key, _ in sorted(pp.scored_items(), key=lambda ks: ks[1].key):
        cuts, degrees, m, sharding, tp = plan_of(key)[:5]
        sp = bool(tp) and max(tp) > 1
        for rc in [(mode,) * len(degrees) for mode in modes] + [None]:
            try:
                s = pp.score(cuts, degrees, m, sharding, tp, rc, sp)
            except PlanError:  # the graph has no layers (full) or no attention cores (selective)
                if rc is not None:
                    modes.remove(rc[0])
                continue
            if s is None:  # the simulations or seconds are spent
                return best, best_s
            if best_s is None or s.key < best_s.key:
                best, best_s = (cuts, degrees, m, sharding, tp, rc, sp), s
    return best, best_s


PARTITIONERS: dict[str, Callable[[PipeProblem], Plan]] = {
    "dp": dp,
    "fsdp": fsdp,
    "hybrid": hybrid,
    "pp_uniform": pp_uniform,
    "pp_params": pp_params,
    "pp_time_dp": pp_time_dp,
    "pipedream": pipedream,
    "pp_exhaustive": pp_exhaustive,
    "tp": pipe_tp.tp_planner,
    "megatron": pipe_tp.megatron,
    "exact": exact,
}


def get(name: str):
    if name not in PARTITIONERS:
        raise ConfigError(f"unknown pipeline partitioner '{name}' (choose one of {', '.join(PARTITIONERS)})")
    fn = PARTITIONERS[name]

    def partitioner(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, budget: int, seed: int,
                    num_microbatches: int = 4, schedule: str = "1f1b", batch_size: int | None = None,
                    objective: str = "step", seconds: float | None = None) -> StagePlan:
        pp = PipeProblem(graph, costs, topology, budget=budget, seed=seed, num_microbatches=num_microbatches,
                         schedule=schedule, batch_size=batch_size, objective=objective, seconds=seconds)
        return pp.finish(fn(pp), name)

    partitioner.__name__ = partitioner.__qualname__ = name
    partitioner.__doc__ = fn.__doc__ or __doc__
    return partitioner


__all__ = ["FASTEST_FIRST_ONLY", "PARTITIONERS", "compositions", "count_compositions", "device_counts", "get",
           "pipedream", "pp_exhaustive", "pp_params", "pp_time_dp", "pp_uniform", "stage_cap"]
