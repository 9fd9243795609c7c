"""Planners with tensor parallelism: ``tp``, ``megatron`` and ``exact`` (DP x TP x PP, DDP or FSDP).

Every plan has one DP degree and one TP degree for all its stages (the 3-D ``pp x dp x tp`` mesh the executor
runs); stage ``k`` takes the next ``dp x tp`` devices of ``PipeProblem.devs`` (fastest first, index order on
homogeneous presets), TP innermost; where links split equal devices (a DGX-1's NVLink mesh) every planner also
plans on the TP groups picked by links (``link_order``: on ``4x_v100_nvlink`` TP 2 on (0, 3) and (1, 2), two
NVLinks each, beside (0, 1) and (2, 3)), the simulator keeping the faster. A TP degree is offered on the devices
of that order whose hosts take whole TP groups (``usable``: TP groups never span hosts; on hosts of 8 + 1 GPUs TP 8
runs on the 8) where it divides the graph's split sizes (``graph.tp.check_degree``).

* ``tp``: all devices of a host in one TP group (the largest degree <= the host size that the graph allows),
  DP across hosts, one stage; micro-batch count and DDP / FSDP searched. On the GPUs of a cluster that also has
  CPUs (``accelerators``), as ``megatron``.
* ``megatron``: the usual Megatron-LM rule -- TP within a host (as ``tp``), PP across hosts (every divisor of
  the host count), DP for the rest; time-balanced cuts; micro-batches searched; DDP.
* ``exact``: every ``(pp, dp, tp)`` with ``pp x dp x tp <= D`` (also plans on fewer devices: a DP plan over 8
  GPUs can be slower than one GPU), every micro-batch count the batch allows, DDP and FSDP; for each, the cuts
  come from a dynamic program over cut points (Alpa's inter-operator pass): for a bound ``t_max`` on a stage's
  per-micro-batch time, minimise ``sum_k tau_k + (m - 1) t_max`` over stage splits with every ``tau_k <=
  t_max`` and every stage within its devices' memory, over the candidate bounds in increasing order until
  ``(m - 1) t_max + min sum`` cannot win. Each resulting plan (and the minimax-bottleneck cuts) is then simulated
  and the best simulated plan is kept. Activation recomputation is one more per-stage dimension: each candidate
  stage takes the fastest of ``none`` / ``selective`` / ``full`` (``cost.recompute``) that fits its memory, so a
  plan recomputes only where memory forces it (GPipe and 1F1B; interleaved plans do not recompute). A stage's
  memory is the simulator's peak (``_stage_memory``: state, the activations and received buffers of the
  micro-batches in flight, a region cut by a stage boundary counted as its part in the stage, recomputation's
  transient): exact under DDP where each tensor has one size, never above it otherwise (see there). Where TP > 1,
  sequence parallelism (Megatron-SP, ``cost.tensor_parallel``) is searched too: every configuration with and
  without it.

``tau_k`` (one micro-batch, forward + backward, on the ``k``-th device group, by the simulator's rules): variable
node time / (m dp) + fixed (launch) time + the TP all-reduces at the micro-batch's bytes over the stage's own first
TP group (``tensor_parallel.collective_counts`` of them per node; with sequence parallelism: a reduce-scatter and
an all-gather of the same bytes, and the token-wise ops on 1/t of the sequence), each node at the time of the
slowest rank of its TP group (unequal devices), forward and backward each paced by the slowest TP group of the
stage, + both directions of the boundary transfer (every tensor produced before the cut and consumed after it, skip
connections passed along, on the slowest link between the two groups). Tied parameters (``graph.meta["tied"]``,
priced as the simulator does): a stage's copies (``PipeProblem.copy_bytes``) count in its memory as its own
parameters, and a plan's objective ends no earlier than its tied gradient all-reduces, each started once its stages
are done (``PipelineSimulator.tied_sync``; a stage ends when the stages before it have run their backward after it);
the cut search's dynamic program does not see these all-reduces (they depend on the whole plan), the candidates'
estimates and the simulated ranking do. With one micro-batch and DP degree 1 the objective *is* the simulated step
time (``cut_objective``; tested on every plan of a brute force). Limits of ``exact``: it is exact over the discrete
choices and over cuts *for that analytic objective* (with m > 1 the simulator's event-level schedule, and DP / FSDP
collectives and their overlap, are only in the final simulated ranking: on the brute force's small GPT the objective
is 0-25% above the simulated step at m = 2-4); cut points are ``cut_grid(n, 128)`` (every position up to 128 nodes,
evenly spaced beyond: coarsen big graphs or accept the grid); at most ``MAX_BOUNDS`` bounds per configuration are
tried (``meta["bounds_capped"]`` counts configurations that hit it). Candidates are simulated best analytic estimate
first; a budget smaller than the candidate count simulates only the first ones, and seconds that run out (a
planner's ``seconds``) end the configurations and the simulations where they are (``meta["exhaustive"]`` is then
false).
"""

from __future__ import annotations

import itertools

import numpy as np

from placement_rl.baselines.pipe_common import PipeProblem, Plan, Stages, cut_grid, microbatch_choices
from placement_rl.baselines.pipe_tp_groups import (_host_runs, accelerators, host_size, link_order, tp_choices, tp_orders,
                                                   usable)
from placement_rl.baselines.pipe_tp_memory import _kept, _size_ratio
from placement_rl.cost.comm_fit import inverse_bandwidth
from placement_rl.cost.memory import BUCKET_BYTES, FSDP_GATHER_FACTOR, STATE_FACTOR
from placement_rl.cost.tensor_parallel import collective_times
from placement_rl.errors import ConfigError, PlanError
from placement_rl.graph import tp as tpmod
from placement_rl.plans import RECOMPUTE, SHARDINGS

EXACT_GRID = 128
MAX_BOUNDS = 1024


def _on(pp: PipeProblem, cuts: list[int], devs: np.ndarray | None, widths: list[int]) -> list[int] | Stages:
    """``cuts`` (positions in ``pp.order``) as a plan's first field: the cuts themselves on ``pp.devs`` (None), else
    explicit stages on consecutive runs of ``devs`` of the given ``widths`` (dp x tp each)."""
    if devs is None:
        return list(cuts)
    stage = np.empty(pp.n, dtype=np.int64)
    for k in range(len(cuts) - 1):
        stage[pp.order[cuts[k]:cuts[k + 1]]] = k
    bounds = np.cumsum([0, *widths])
    groups = tuple(tuple(int(x) for x in devs[bounds[k]:bounds[k + 1]]) for k in range(len(widths)))
    return Stages(tuple(int(x) for x in stage), groups)


def _plans_whole(pp: PipeProblem, t: int, shardings=SHARDINGS) -> list[Plan]:
    count = usable(pp, t, accelerators(pp))
    d = count // t
    return [(_on(pp, [0, pp.n], devs, [d * t]), (d,), m, sh, (t,)) for devs in tp_orders(pp, t, count)
            for m in microbatch_choices(1, d, pp.batch_size, schedule=pp.schedule) for sh in shardings]


def tp_preference(pp: PipeProblem, count: int) -> list[int]:
    """The TP degrees of ``tp_choices`` in the order Megatron's usual plans take them: > 1 first, the fewest of the
    first ``count`` devices idle, then the largest."""
    return sorted(tp_choices(pp, count=count), key=lambda d: (d > 1, usable(pp, d, count), d), reverse=True)


def tp_planner(pp: PipeProblem) -> Plan:
    """Megatron's usual plan: one stage at the largest TP degree > 1 among those that leave the fewest devices idle
    (on 8 GPUs GPT-2 large's 20 heads take TP 4 x DP 2, not TP 5 with three GPUs idle), DP over the rest; the next
    degree in that order where the batch does not split over its DP degree."""
    count = accelerators(pp)
    order = tp_preference(pp, count)
    if order[0] == 1:  # plain data parallelism, saying why
        note = tpmod.annotation(pp.graph).note
        pp.extra_meta = {"note": f"no TP degree > 1 for graph '{pp.graph.name}' on topology '{pp.topology.name}' "
                                 f"({note or 'no degree divides both the host size and the split sizes'})"}
    for t in order:
        cands = _plans_whole(pp, t)
        if cands:
            return pp.best_of(cands)
    t = order[0]
    dp = usable(pp, t, count) // t
    raise ConfigError(f"batch_size {pp.batch_size} does not split over DP degree {dp} (TP {t}): no tp plan")


class _Stages:
    """Per-micro-batch stage times ``tau(k)[a, b]`` over the cut grid for one (tp, dp, m, sequence parallelism) on
    the ``k``-th device group, stage sizes, and the bytes crossing each cut: the simulator's rules
    (``cost.pipeline``), so that with one micro-batch the objective is the simulated step."""

    def __init__(self, pp: PipeProblem, grid: np.ndarray, t: int, dp: int, m: int, sp: bool = False,
                 devs: np.ndarray | None = None) -> None:
        self.pp, self.grid, self.t, self.dp, self.m = pp, grid, t, dp, m
        self.order_given = devs  # None: ``pp.devs`` (plans keep cuts); else a ``link_order`` (plans as ``Stages``)
        self.devs = pp.devs if devs is None else devs
        self.sp = bool(sp) and t > 1
        self.arrays = pp.sim.node_arrays(t, sequence_parallel=self.sp)
        param, act = self.arrays[4], self.arrays[5]
        order, g = pp.order, grid
        ppar = np.concatenate([[0.0], np.cumsum(param[order])])
        pact = np.concatenate([[0.0], np.cumsum(act[order])])
        self.params = ppar[g][None, :] - ppar[g][:, None]
        if pp.ties:  # each stage's copies of tied parameters (per rank), trained as its own parameters
            self.params = self.params + pp.copy_bytes(g[:, None], g[None, :], t, self.sp)
        # activation bytes per micro-batch and replica, at the plan's batch (the simulator's ``size_ratio``)
        ratio = _size_ratio(pp)
        self.mem_scale = ratio / (m * dp)
        self.act = (pact[g][None, :] - pact[g][:, None]) * self.mem_scale
        self.valid = g[None, :] > g[:, None]
        # a cut carries every tensor produced before it and consumed after it (skip connections passed along);
        # activations out and gradients back, per micro-batch and replica
        self.cross = np.zeros(len(g))
        for b in range(1, len(g) - 1):
            self.cross[b] = pp.crossing_out(int(g[b]))[0] / (m * dp)
        self.recv = self.cross * ratio  # the buffer a stage from cut b holds per micro-batch in flight
        self._tau: dict[tuple[int, ...], np.ndarray] = {}
        self._bwd: dict[tuple[int, ...], np.ndarray] = {}

    def group(self, k: int) -> tuple[int, ...]:
        """Devices of the ``k``-th stage position: ``dp x tp`` of ``self.devs``, TP innermost."""
        w = self.dp * self.t
        return tuple(int(x) for x in self.devs[k * w:(k + 1) * w])

    def cuts(self, cuts: list[int]) -> list[int] | Stages:
        """A plan's first field for ``cuts`` (positions in ``pp.order``) on this group order (``_on``)."""
        return _on(self.pp, cuts, self.order_given, [self.dp * self.t] * (len(cuts) - 1))

    def tau(self, k: int) -> np.ndarray:
        """``[G, G]`` forward + backward time of a stage between grid cuts, one micro-batch, on group ``k``: the
        slowest replica (TP group) of the stage, each node at its TP group's slowest rank, TP all-reduces at the
        slowest of its TP groups, as the simulator prices them (inf where a >= b)."""
        grp = self.group(k)
        if grp not in self._tau:
            fvar, ffix, bvar, bfix, _, _, arf, arb, n_f, n_b = self.arrays
            order, scale = self.pp.order, 1.0 / (self.m * self.dp)
            f_comm = b_comm = 0.0
            if self.t > 1:  # Megatron-SP: a reduce-scatter and an all-gather in place of each all-reduce
                groups = tuple(tuple(grp[i:i + self.t]) for i in range(0, len(grp), self.t))  # the slowest sets it
                tabs = self.pp.sim._sp_collective(groups) if self.sp else self.pp.sim._tp_collective(groups)[:1]
                f_comm = sum(collective_times(tab, arf[order] * scale, n_f[order]) for tab in tabs)
                b_comm = sum(collective_times(tab, arb[order] * scale, n_b[order]) for tab in tabs)
            g = self.grid
            fwd = bwd = None
            for i in range(0, len(grp), self.t):
                ranks = list(grp[i:i + self.t])  # a TP group: its slowest rank sets each node's pace
                nf = (fvar[ranks][:, order] * scale + ffix[ranks][:, order]).max(axis=0)
                nb = (bvar[ranks][:, order] * scale + bfix[ranks][:, order]).max(axis=0)
                pf = np.concatenate([[0.0], np.cumsum(nf + f_comm)])[g]
                pb = np.concatenate([[0.0], np.cumsum(nb + b_comm)])[g]
                f, b = pf[None, :] - pf[:, None], pb[None, :] - pb[:, None]
                fwd, bwd = (f, b) if fwd is None else (np.maximum(fwd, f), np.maximum(bwd, b))
            self._tau[grp] = np.where(self.valid, fwd + bwd, np.inf)
            self._bwd[grp] = bwd
        return self._tau[grp]

    def bwd(self, k: int) -> np.ndarray:
        """``[G, G]`` backward part of ``tau(k)`` (the slowest TP group's)."""
        self.tau(k)
        return self._bwd[self.group(k)]

    def recompute(self, k: int, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(extra, held, transient)`` ``[G, G]`` of recomputation ``mode`` for a stage on group ``k``: its
        checkpointed regions' forward again (one micro-batch, at the slowest rank of the first TP group; a region
        cut by a stage boundary priced as its nodes of the whole region's ``repeated``, of which the simulator may
        repeat fewer) and ``rc_memory``. None where the graph has no such regions."""
        from placement_rl.cost.recompute import regions, repeated_of

        key = ("rc", mode, self.group(k)[:self.t])
        if key not in self._tau:
            try:
                rid = regions(self.pp.graph, mode)
            except PlanError:
                return None
            fvar, ffix = self.arrays[:2]
            order, g, ranks, scale = self.pp.order, self.grid, list(self.group(k)[:self.t]), 1.0 / (self.m * self.dp)
            again = repeated_of(self.pp.graph, mode)[order]  # what the checkpoint runs again (early stop)
            fwd = np.where(again, (fvar[ranks][:, order] * scale + ffix[ranks][:, order]).max(axis=0), 0.0)
            pe = np.concatenate([[0.0], np.cumsum(fwd)])[g]
            self._tau[key] = (pe[None, :] - pe[:, None], *self.rc_memory(mode, rid))
        return self._tau[key]

    def rc_memory(self, mode: str, rid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(held, transient)`` ``[G, G]`` bytes per micro-batch and replica of a stage between grid cuts under
        recomputation ``mode`` (region ids ``rid``), as the simulator counts them (``cost.recompute.apply_recompute``:
        the part of a region inside the stage is the region): the activations of nodes outside every region, plus
        each region part's inputs from outside it (``_kept``), held per micro-batch in flight; and the largest part's
        own activations, recomputed for one micro-batch at a time."""
        key = ("pipe_tp.rc_memory", mode, self.t, self.sp, self.grid.tobytes())
        if key not in self.pp.memo:  # the same for every configuration at this TP degree: kept by the problem
            from placement_rl.graph.tp import shard_graph

            act, order, g = self.arrays[5], self.pp.order, self.grid
            run = self.pp.graph if self.t == 1 else shard_graph(self.pp.graph, self.t, sequence_parallel=self.sp)
            ro = rid[order]
            out = np.concatenate([[0.0], np.cumsum(np.where(ro < 0, act[order], 0.0))])[g]
            pos = np.empty(self.pp.n, dtype=np.int64)
            pos[order] = np.arange(self.pp.n)
            held = out[None, :] - out[:, None] + _kept(run, rid, pos, g)
            trans = np.zeros_like(held)
            for r in np.unique(ro[ro >= 0]):
                own = np.concatenate([[0.0], np.cumsum(np.where(ro == r, act[order], 0.0))])[g]
                np.maximum(trans, own[None, :] - own[:, None], out=trans)
            self.pp.memo[key] = (held, trans)
        held, trans = self.pp.memo[key]
        return held * self.mem_scale, trans * self.mem_scale

    def link(self, k: int) -> tuple[float, float]:
        """Slowest latency and inverse bandwidth between the first DP groups of stage positions k and k + 1."""
        a, b = self.group(k)[::self.t], self.group(k + 1)[::self.t]
        lat, inv = self.pp.costs.link_latency, inverse_bandwidth(self.pp.costs.link_bandwidth)
        return max(float(lat[x, y]) for x in a for y in b), max(float(inv[x, y]) for x in a for y in b)


def _dp_cuts(mats: list[np.ndarray], m: int, alpa: bool = True) -> tuple[list[int] | None, list[int] | None, int]:
    """(Alpa cuts, minimax cuts, 1 if the bound list was capped) over grid indices; None when infeasible."""
    s = len(mats)
    g = mats[0].shape[0] - 1

    def run(bound: float, mode: str) -> tuple[float, list[int]] | None:
        f = np.full(g + 1, np.inf)
        f[0] = 0.0
        arg = np.zeros((s, g + 1), dtype=np.int64)
        for k in range(s):
            tk = np.where(mats[k] <= bound, mats[k], np.inf)
            tot = np.maximum(f[:, None], tk) if mode == "max" else f[:, None] + tk
            arg[k] = np.argmin(tot, axis=0)
            f = tot[arg[k], np.arange(g + 1)]
        if not np.isfinite(f[g]):
            return None
        cuts, b = [g], g
        for k in range(s - 1, 0, -1):
            b = int(arg[k, b])
            cuts.append(b)
        return float(f[g]), [0] + cuts[::-1]

    mm = run(np.inf, "max")
    if mm is None or not alpa:
        return None, None if mm is None else mm[1], 0
    lb, lb_cuts = run(np.inf, "sum")
    if m == 1:  # no (m - 1) t_max term: the least total time is the optimum
        return lb_cuts, mm[1], 0
    vals = np.unique(np.concatenate([x[np.isfinite(x)] for x in mats]))
    vals = vals[vals >= mm[0] - 1e-15]
    best, best_cuts, capped = np.inf, None, 0
    for i, bound in enumerate(vals):
        if (m - 1) * bound + lb >= best:
            break
        if i >= MAX_BOUNDS:
            capped = 1
            break
        got = run(bound, "sum")
        if got is not None and got[0] + (m - 1) * bound < best:
            best, best_cuts = got[0] + (m - 1) * bound, got[1]
    return best_cuts, mm[1], capped


def _stage_memory(pp: PipeProblem, st: _Stages, s: int, k: int, sh: str, mode: str) -> np.ndarray | None:
    """``[G, G]`` peak bytes on each device of the ``k``-th of ``s`` stages between grid cuts under recomputation
    ``mode`` (None where the graph or the schedule has none), by the simulator's rule (``cost.pipeline``): training
    state (FSDP: its shard, and for the gathered unit ``min(params, BUCKET_BYTES)``, at most the largest unit the
    simulator counts) plus, per micro-batch in flight (GPipe: m; 1F1B: ``min(m, s - k)``), its activations and the
    buffer received over the stage's first cut, plus recomputation's transient; under inference costs the
    parameters and one micro-batch's received buffer. Exact but for that FSDP unit and a tensor whose edges differ
    in size (the received buffer takes the largest of its edges over that cut, the simulator the largest of all its
    edges out of its stage): never above the simulated peak, so no plan that fits is left out."""
    train = pp.sim.mode == "train"
    factor, gather = (STATE_FACTOR, FSDP_GATHER_FACTOR) if train else (1.0, FSDP_GATHER_FACTOR - 1.0)
    state = factor * st.params
    if sh == "fsdp" and st.dp > 1:
        state = state / st.dp + gather * np.minimum(st.params, BUCKET_BYTES)
    recv = st.recv[:, None]
    if not train:  # no activations kept for a backward: nothing to recompute
        return state + recv if mode == "none" else None
    inflight = st.m if pp.schedule == "gpipe" else min(st.m, s - k)
    if mode == "none":
        return state + (st.act + recv) * inflight
    got = st.recompute(k, mode) if pp.schedule in ("gpipe", "1f1b") else None
    return None if got is None else state + (got[1] + recv) * inflight + got[2]


def _stage_mats(pp: PipeProblem, st: _Stages, s: int, t: int, dp: int, m: int, sh: str,
                modes: tuple[str, ...] = ("none",)) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per stage position ``k`` of ``s``: ``tau[a, b]`` of a stage over grid cuts ``a..b`` on the ``k``-th device
    group, with the boundary to the next group both ways, under the fastest recomputation of ``modes`` that fits
    its memory (``_stage_memory``; ``inf`` where none fits), and that mode's index per cell."""
    cap = pp.topology.array("memory_bytes")[st.devs]
    width = dp * t
    mats, chosen = [], []
    for k in range(s):
        tau = st.tau(k)
        if k + 1 < s:
            lat_n, inv_n = st.link(k)
            tau = tau + 2.0 * (lat_n + st.cross[None, :] * inv_n)
        best, pick = np.full_like(tau, np.inf), np.zeros(tau.shape, dtype=np.int64)
        for i, mode in enumerate(modes):
            mem = _stage_memory(pp, st, s, k, sh, mode)
            if mem is None:
                continue
            tau_r = tau if mode == "none" else tau + st.recompute(k, mode)[0]
            cand = np.where(mem <= cap[k * width:(k + 1) * width].min(), tau_r, np.inf)
            better = cand < best
            best, pick = np.where(better, cand, best), np.where(better, i, pick)
        mats.append(best)
        chosen.append(pick)
    return mats, chosen


def _objective(taus: list[float], m: int) -> float:
    """``sum_k tau_k + (m - 1) max_k tau_k`` (``inf`` where a stage is over memory, also at ``m = 1``)."""
    return sum(taus) + (m - 1) * max(taus) if m > 1 else sum(taus)


def _with_ties(pp: PipeProblem, st: _Stages, cuts: list[int], rc: tuple[str, ...], sh: str, obj: float) -> float:
    """``obj`` (the analytic step over grid cuts ``cuts``, recomputation ``rc`` per stage) extended by the tied
    gradient all-reduces as the simulator runs them (``PipelineSimulator.tied_sync``) after each stage's end: the
    step less the backward spans (recomputation and gradient transfer in) of the stages before it."""
    s = len(cuts) - 1
    if not pp.ties or s == 1 or not np.isfinite(obj):
        return obj
    tails = []
    for k in range(s - 1):  # stage k ends once stages 0..k-1 have run their backward after it
        a, b = cuts[k], cuts[k + 1]
        tail = float(st.bwd(k)[a, b])
        if rc[k] != "none":
            tail += float(st.recompute(k, rc[k])[0][a, b])
        lat, inv = st.link(k)
        tails.append(tail + lat + float(st.cross[b]) * inv)
    ends = obj - np.concatenate([[0.0], np.cumsum(tails)])
    plan = pp.plan(st.cuts([int(st.grid[i]) for i in cuts]), (st.dp,) * s, m=st.m, sharding=sh, tp=(st.t,) * s,
                   recompute=rc, sequence_parallel=st.sp)
    syncs = pp.sim.tied_copies(plan)[1]
    return max(obj, pp.sim.tied_sync(plan, ends, syncs)[2]) if syncs else obj


def cut_objective(pp: PipeProblem, cuts: list[int], dp: int, m: int, sharding: str = "dp", tp: int = 1,
                  modes: tuple[str, ...] = ("none",), sequence_parallel: bool = False) -> float:
    """The analytic step time ``exact``'s cut search minimises for one plan (``cuts``: positions in
    ``pp.order``, on ``cut_grid(pp.n, EXACT_GRID)``): ``sum_k tau_k + (m - 1) max_k tau_k``, ``inf`` over memory,
    each stage under the fastest of the recomputation ``modes`` that fits. With one micro-batch and DP degree 1 it
    is the simulated step time (``simulate_pipeline``) of that plan."""
    grid = cut_grid(pp.n, EXACT_GRID)
    where = {int(x): i for i, x in enumerate(grid)}
    if any(int(c) not in where for c in cuts):
        raise ConfigError(f"cuts {list(cuts)} are not on the exact search's grid of {len(grid)} points")
    s = len(cuts) - 1
    st = _Stages(pp, grid, tp, dp, m, sequence_parallel)
    mats, chosen = _stage_mats(pp, st, s, tp, dp, m, sharding, modes)
    at = [where[int(c)] for c in cuts]
    taus = [float(mats[k][at[k], at[k + 1]]) for k in range(s)]
    rc = tuple(modes[int(chosen[k][at[k], at[k + 1]])] for k in range(s))
    return _with_ties(pp, st, at, rc, sharding, _objective(taus, m))


def _pipeline_plans(pp: PipeProblem, grid: np.ndarray, s: int, t: int, dp: int, m: int,
                    shardings=SHARDINGS, alpa: bool = True, modes: tuple[str, ...] = ("none",),
                    sp: bool = False, devs: np.ndarray | None = None) -> tuple[list[tuple[float, Plan]], int]:
    """Plans of ``s`` stages for one (tp, dp, m, sequence parallelism) on the device order ``devs`` (None:
    ``pp.devs``), each with its analytic estimate (inf: over memory) and each stage's recomputation (the fastest of
    ``modes`` that fits)."""
    st = _Stages(pp, grid, t, dp, m, sp, devs)
    out, capped = [], 0
    for sh in shardings:
        mats, chosen = _stage_mats(pp, st, s, t, dp, m, sh, modes)
        if s == 1:
            est = float(mats[0][0, -1])
            out.append((m * est, (st.cuts([0, pp.n]), (dp,), m, sh, (t,), (modes[int(chosen[0][0, -1])],), st.sp)))
            continue
        a_cuts, mm_cuts, c = _dp_cuts(mats, m, alpa)
        capped += c
        for cuts in {tuple(x) for x in (a_cuts, mm_cuts) if x is not None}:
            taus = [float(mats[k][cuts[k], cuts[k + 1]]) for k in range(s)]
            rc = tuple(modes[int(chosen[k][cuts[k], cuts[k + 1]])] for k in range(s))
            out.append((_with_ties(pp, st, list(cuts), rc, sh, _objective(taus, m)),
                        (st.cuts([int(grid[i]) for i in cuts]), (dp,) * s, m, sh, (t,) * s, rc, st.sp)))
    return out, capped


def megatron(pp: PipeProblem) -> Plan:
    """Megatron-LM's recipe: TP inside a host at the degree ``tp_preference`` puts first (the next where the batch
    does not split), PP across hosts (a divisor of their number), DP over the rest, DDP."""
    count = accelerators(pp)
    grid = cut_grid(pp.n, EXACT_GRID)
    order = tp_preference(pp, count)
    for t in order:
        acc = usable(pp, t, count)
        hosts = len(_host_runs(pp, acc))
        cands: list[Plan] = []
        for s in (s for s in range(1, hosts + 1) if hosts % s == 0 and s <= len(grid) - 1):
            dp = acc // (t * s)
            for m in microbatch_choices(s, dp, pp.batch_size, schedule=pp.schedule):
                for devs in tp_orders(pp, t, acc):
                    cands += [c for _, c in _pipeline_plans(pp, grid, s, t, dp, m, shardings=("dp",), alpa=False,
                                                            devs=devs)[0]]
        if cands:
            return pp.best_of(cands)
    raise ConfigError(f"megatron found no plan: batch_size {pp.batch_size} does not split over the DP degrees "
                      f"left after TP {order[0]} x PP")


def configurations(pp: PipeProblem) -> list[tuple[int, int, int, int]]:
    """Every ``(pp, dp, tp, m)`` the exact search visits (stages <= cut points, devices <= D)."""
    g = len(cut_grid(pp.n, EXACT_GRID)) - 1
    out = []
    for t in tp_choices(pp):
        d = usable(pp, t)
        for s in range(1, min(d // t, g) + 1):
            for dp in range(1, d // (t * s) + 1):
                for m in microbatch_choices(s, dp, pp.batch_size, schedule=pp.schedule):
                    out.append((s, dp, t, m))
    return out


SEARCH_SHARE = 0.5  # of a planner's seconds for its configurations' DPs: the rest simulates their plans


def exact(pp: PipeProblem) -> Plan:
    confs = configurations(pp)
    grid = cut_grid(pp.n, EXACT_GRID)
    cands: list[tuple[float, Plan]] = []
    capped = 0
    searched = 0
    orders: dict[int, list[np.ndarray | None]] = {}  # per TP degree: ``pp.devs`` and, where it differs, by links
    for s, dp, t, m in confs:
        if cands and pp.out_of_time(SEARCH_SHARE):  # given seconds: the configurations searched so far
            break
        searched += 1
        if t not in orders:
            orders[t] = tp_orders(pp, t, usable(pp, t))
        seq = tpmod.sequence_length(pp.graph)  # SP splits the sequence: only where TP divides it (deploy's rule)
        sps = (False, True) if t > 1 and (seq is None or seq % t == 0) else (False,)
        for sp, devs in itertools.product(sps, orders[t]):
            got, c = _pipeline_plans(pp, grid, s, t, dp, m, modes=RECOMPUTE, sp=sp, devs=devs)
            cands += got
            capped += c
    if not cands:
        raise ConfigError(f"exact found no plan: batch_size {pp.batch_size} admits no DP degree x micro-batch count")
    cands.sort(key=lambda c: c[0])  # best estimate first: what a short budget simulates
    pp.extra_meta = {"configurations": len(confs), "configurations_searched": searched, "candidates": len(cands),
                     "bounds_capped": capped}
    best = pp.best_of([c for _, c in cands])
    pp.extra_meta["exhaustive"] = searched == len(confs) and not pp.cut_short
    return best


__all__ = ["configurations", "cut_objective", "exact", "host_size", "link_order", "megatron", "tp_choices",
           "tp_orders", "tp_planner", "usable"]
