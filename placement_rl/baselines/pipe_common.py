"""Shared core of the pipeline partitioners: the budgeted pipeline simulator and stage-cost arrays.

Positions are indices into ``graph.topo_order``; a plan is ``(cuts, degrees, m, sharding)`` or, with tensor
parallelism, ``(cuts, degrees, m, sharding, tp)`` with ``cuts[0] = 0``, ``cuts[-1] = N`` and stage ``k`` =
positions ``[cuts[k], cuts[k + 1])`` on the next ``degrees[k] x tp[k]`` devices of ``devs`` (devices fastest
first; ``degrees`` are DP degrees, tp all 1 when absent), ``m`` micro-batches, sharding ``dp`` / ``fsdp``.

Shapes (N nodes, D devices):
    prefix: float64 [D, N + 1]  cumulative fwd + bwd time along the order, per device (in ``devs`` order),
                                without the launch overhead, which ``prefix_fixed`` holds (paid per micro-batch)
    crossing_out(j): float64 [j]  bytes produced in [i, j) and consumed at or after j, for every i < j
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from placement_rl.baselines.common import Score, add_note, check_inputs, check_seed
from placement_rl.cost import PIPELINE_SCHEDULES, PipelineSimulator
from placement_rl.cost.pipeline_tied import tied_parameters
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError, fmt_bytes
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan, graph_batch_size
from placement_rl.topology import DeviceTopology

Plan = tuple  # (cuts, dp degrees, m, sharding[, tp degrees[, recompute per stage[, sequence parallel]]]); cuts
# may be ``Stages``
NO_FIT_SIMULATED = "no plan simulated fits memory"  # how a plan's ``note`` begins where none the planner
# simulated fits, though the devices hold the state together (``PipeProblem.over_text``)
MAX_MICROBATCHES = 32  # planners that choose m try powers of two up to this


@dataclass(frozen=True)
class Stages:
    """Explicit stages in place of cuts of ``graph.topo_order``: a stage per node (stages are ideal differences of
    the DAG, any of them) and the device group of each stage (any devices, in any order of speed)."""

    stage_of_node: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]


def microbatch_choices(num_stages: int, dp: int, batch_size: int | None, *, schedule: str) -> list[int]:
    """Micro-batch counts a whole-plan search tries: powers of two 1..``MAX_MICROBATCHES`` (not every count: a
    search's "optimum" is over these); under the 1F1B schedules a pipeline (more than one stage) at least as many
    as stages (the executor's 1F1B needs it), under GPipe fewer too (one micro-batch through two stages can beat
    four: the per-micro-batch launches); with ``batch_size`` only counts with ``batch_size % (m * dp) == 0``."""
    out = []
    m = 1
    while m <= MAX_MICROBATCHES:
        if (num_stages == 1 or m >= num_stages or schedule == "gpipe") and (batch_size is None
                                                                           or batch_size % (m * dp) == 0):
            out.append(m)
        m *= 2
    return out


class PipeProblem:
    def __init__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, budget: int, seed: int,
                 num_microbatches: int, schedule: str, batch_size: int | None, objective: str = "step",
                 seconds: float | None = None) -> None:
        check_inputs(graph, costs, topology, budget)
        check_seed(seed)
        if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0):
            raise ConfigError(f"seconds must be a number > 0 (a planner's wall-clock budget), got {seconds!r}")
        from placement_rl.cost.modes import check_objective

        self.objective = check_objective(objective)
        if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, (int, np.integer)) \
                or num_microbatches < 1:
            raise ConfigError(f"num_microbatches must be a positive integer, got {num_microbatches!r}")
        if schedule not in PIPELINE_SCHEDULES:
            raise ConfigError(f"unknown pipeline schedule '{schedule}' (choose one of "
                              f"{', '.join(PIPELINE_SCHEDULES)})")
        if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 1
                                       or batch_size % num_microbatches):
            raise ConfigError(f"batch_size {batch_size!r} must be a positive multiple of num_microbatches "
                              f"({num_microbatches})")
        if batch_size is None:  # the graph's own batch (capture records it): every plan must divide it (planners
            batch_size = graph_batch_size(graph)  # with a fixed micro-batch count say so in ``fit_degrees``)
        self.graph, self.costs, self.topology = graph, costs, topology
        self.budget, self.seed = int(budget), int(seed)
        self.seconds = None if seconds is None else float(seconds)
        self.m, self.schedule, self.batch_size = int(num_microbatches), schedule, batch_size
        self.sim = PipelineSimulator(graph, costs, topology)
        self.start = time.perf_counter()
        self.n, self.d = graph.num_nodes, topology.num_devices
        self.order = np.asarray(graph.topo_order, dtype=np.int64)
        node_time = costs.fwd_time + costs.bwd_time
        total = node_time.sum(axis=0)
        self.devs = np.lexsort((np.arange(self.d), total))
        # the launch overhead does not shrink with micro-batches or replicas: keep it apart
        fixed = np.minimum(costs.launch_overhead, costs.fwd_time) + np.minimum(costs.launch_overhead, costs.bwd_time)
        self.prefix = np.zeros((self.d, self.n + 1))
        self.prefix[:, 1:] = np.cumsum((node_time - fixed)[self.order][:, self.devs], axis=0).T
        self.prefix_fixed = np.zeros((self.d, self.n + 1))
        self.prefix_fixed[:, 1:] = np.cumsum(fixed[self.order][:, self.devs], axis=0).T
        self.param_prefix = np.concatenate([[0.0], np.cumsum(graph.param_bytes[self.order])])
        self._pos = np.empty(self.n, dtype=np.int64)
        self._pos[self.order] = np.arange(self.n)
        self._cross: dict[int, np.ndarray] = {}
        self._groups: dict[tuple[int, int], tuple[float, float, float, float, np.ndarray]] = {}
        self._scored: dict[tuple, Score] = {}
        self._step: dict[tuple, float] = {}  # simulated step time per scored plan (the score may be throughput)
        self.extra_meta: dict[str, object] = {}  # what a planner reports about its search (plan.meta)
        self.cut_short = False  # ``best_of`` ran out of budget or seconds before its last candidate
        self._mem_prefix: tuple[np.ndarray, np.ndarray] | None = None  # ``stage_fits``' parameter / activation sums
        self.memo: dict[tuple, object] = {}  # arrays a planner derives from the problem alone, by its own key
        # tied parameters (``cost.pipeline_tied.tied_parameters``): bytes, users' positions sorted, first user (its owner)
        self.ties = [(b, np.sort(self._pos[u]), int(u[0])) for b, u in tied_parameters(graph)]

    # -------------------------------------------------------------- memory
    def state_bytes(self) -> float:
        """Bytes every plan holds at least, over all its devices together: each parameter's training state
        (``cost.memory.STATE_FACTOR`` x its bytes: DP replicates it, FSDP and TP shard it, a stage holds it once);
        under inference costs the parameters alone."""
        from placement_rl.cost.memory import STATE_FACTOR

        params = float(np.sum(self.graph.param_bytes))
        return params if self.sim.mode == "inference" else STATE_FACTOR * params

    def fits_at_all(self) -> bool:
        """Whether ``state_bytes`` fits all devices' memory together: where it does not, no plan fits."""
        return not self.state_bytes() > float(self.topology.array("memory_bytes").sum())

    def no_fit_text(self) -> str:
        """Why no plan fits where ``fits_at_all`` is false (``finish`` notes it)."""
        what = "take" if self.sim.mode == "inference" else "with their gradients and Adam state take"
        return (f"no plan fits memory (the graph's parameters {what} {fmt_bytes(self.state_bytes())}, the devices "
                f"have {fmt_bytes(float(self.topology.array('memory_bytes').sum()))} in all)")

    def over_text(self, s: Score) -> str | None:
        """Where the plan of score ``s`` and every plan simulated are over memory though the devices hold the state
        together (``fits_at_all``; ``finish`` notes it): how far over, and whether it is the least over of them.
        None where it or any plan simulated fits memory."""
        cap = self.topology.array("memory_bytes")
        over = [float(np.maximum(x.peak_memory - cap, 0.0).sum()) for x in self._scored.values()]
        mine = float(np.maximum(s.peak_memory - cap, 0.0).sum())
        if mine <= 0.0 or min(over) <= 0.0:
            return None
        which = "the least over it" if mine <= min(over) else "one over it"
        return (f"{NO_FIT_SIMULATED}: {which} of the {len(over)} simulated returned ({fmt_bytes(mine)} over capacity "
                "in all)")

    # --------------------------------------------------------------- costs
    def degree_ok(self, r: int, m: int | None = None) -> bool:
        return self.batch_size is None or self.batch_size % ((self.m if m is None else m) * r) == 0

    def fit_degrees(self, degrees: tuple[int, ...]) -> tuple[int, ...]:
        if not all(self.degree_ok(r) for r in degrees):
            raise ConfigError(f"batch_size {self.batch_size} is not divisible by num_microbatches ({self.m}) "
                              f"x DP degrees {list(degrees)}")
        return degrees

    def crossing_out(self, j: int) -> np.ndarray:
        if j not in self._cross:
            self._cross[j] = crossing_out(self.graph, self._pos, j)
        return self._cross[j]

    def _group(self, lo: int, hi: int) -> tuple[float, float, float, float, np.ndarray]:
        """Latency and 1/bandwidth to the next group and of the group's ring (slowest links), distinct rows."""
        key = (lo, hi)
        if key not in self._groups:
            lat, bw = self.costs.link_latency, self.costs.link_bandwidth
            group = self.devs[lo:hi]
            if hi < self.d:
                nxt = self.devs[hi]
                lat_n, inv_n = float(lat[group, nxt].max()), float(1.0 / bw[group, nxt].min())
            else:
                lat_n = inv_n = 0.0
            if hi - lo > 1:
                off = ~np.eye(hi - lo, dtype=bool)
                lat_r = float(lat[np.ix_(group, group)][off].max())
                inv_r = float(1.0 / bw[np.ix_(group, group)][off].min())
            else:
                lat_r = inv_r = 0.0
            # devices with identical cost columns need only one row in the max over the group
            _, first = np.unique(np.concatenate([self.prefix[lo:hi], self.prefix_fixed[lo:hi]], axis=1),
                                 axis=0, return_index=True)
            self._groups[key] = (lat_n, inv_n, lat_r, inv_r, lo + np.sort(first))
        return self._groups[key]

    def stage_time_vec(self, j: int, lo: int, hi: int, r: int, m: int | None = None) -> np.ndarray:
        """Cost of stage [i, j) on devices ``devs[lo:hi]`` (DP degree r) for every i < j (full batch)."""
        m = self.m if m is None else m
        lat_n, inv_n, lat_r, inv_r, rows = self._group(lo, hi)
        if rows.size == 1:
            k = int(rows[0])
            cost = (self.prefix[k, j] - self.prefix[k, :j]) / r + m * (self.prefix_fixed[k, j]
                                                                         - self.prefix_fixed[k, :j])
        else:
            var = self.prefix[rows, j:j + 1] - self.prefix[rows, :j]
            fixed = self.prefix_fixed[rows, j:j + 1] - self.prefix_fixed[rows, :j]
            cost = (var / r + m * fixed).max(axis=0)  # each replica runs m micro-batches
        if j < self.n and hi < self.d:  # activations out and gradients back
            cost += 2.0 * (lat_n + self.crossing_out(j) * (inv_n / r))
        if r > 1:  # ring all-reduce of the stage's gradients (its tied copies' too: in its DDP buckets)
            params = self.param_prefix[j] - self.param_prefix[:j]
            if self.ties:
                params = params + self.copy_bytes(np.arange(j), j)
            cost += 2.0 * (r - 1) / r * inv_r * params + 2.0 * (r - 1) * lat_r
        return cost

    def copy_bytes(self, start: np.ndarray, end: np.ndarray, t: int = 1, sequence_parallel: bool = False
                   ) -> np.ndarray | float:
        """Tied-parameter copy bytes (per rank at TP degree ``t``) a stage of positions ``[start, end)`` keeps
        (arrays broadcast): as the simulator (``PipelineSimulator.tied_copies``), a copy of each tied parameter it
        has a user of but not the first user. 0.0 on a graph without ties."""
        out: np.ndarray | float = 0.0
        for nbytes, upos, owner in self.ties:
            p0 = self._pos[owner]
            holds = (upos.searchsorted(end) > upos.searchsorted(start)) & ~((start <= p0) & (p0 < end))
            out = out + holds * (nbytes * self.sim.tied_share(t, owner, sequence_parallel=sequence_parallel))
        return out

    def stage_fits(self, j: int, lo: int, hi: int, r: int, m: int, inflight: int,
                   sharding: str = "dp") -> np.ndarray:
        """For every i < j: whether positions [i, j) fit each device of ``devs[lo:hi]`` (DP degree ``r``, ``m``
        micro-batches, ``inflight`` of them holding activations at once): the parameters' training state (its tied
        copies included, ``copy_bytes``; sharded over ``r`` under FSDP) and the activations of the micro-batches in
        flight: ``exact``'s rule for training without recomputation (``pipe_tp._stage_memory``) less the received
        buffers."""
        from placement_rl.cost.memory import BUCKET_BYTES, FSDP_GATHER_FACTOR, STATE_FACTOR

        if self._mem_prefix is None:
            param, act = self.sim.node_arrays(1)[4:6]
            self._mem_prefix = (np.concatenate([[0.0], np.cumsum(param[self.order])]),
                                np.concatenate([[0.0], np.cumsum(act[self.order])]))
        pp_, pa = self._mem_prefix
        params = pp_[j] - pp_[:j]
        if self.ties:  # a stage's copies of tied parameters are trained as its own
            params = params + self.copy_bytes(np.arange(j), j)
        state = (STATE_FACTOR * params / r + FSDP_GATHER_FACTOR * np.minimum(params, BUCKET_BYTES)
                 if sharding == "fsdp" and r > 1 else STATE_FACTOR * params)
        mem = state + (pa[j] - pa[:j]) / (m * r) * inflight
        cap = float(self.topology.array("memory_bytes")[self.devs[lo:hi]].min())
        return mem <= cap

    # -------------------------------------------------------------- scoring
    def plan(self, cuts: list[int], degrees: tuple[int, ...], meta: dict | None = None, m: int | None = None,
             sharding: str = "dp", tp: tuple[int, ...] | None = None,
             recompute: tuple[str, ...] | None = None, sequence_parallel: bool = False) -> StagePlan:
        tp = tuple(tp) if tp else (1,) * len(degrees)
        if isinstance(cuts, Stages):
            stage, groups = np.array(cuts.stage_of_node, dtype=np.int64), cuts.groups
        else:
            stage = np.empty(self.n, dtype=np.int64)
            for k in range(len(cuts) - 1):
                stage[self.order[cuts[k]:cuts[k + 1]]] = k
            bounds = np.concatenate([[0], np.cumsum([r * t for r, t in zip(degrees, tp)])])
            groups = tuple(tuple(int(x) for x in self.devs[bounds[k]:bounds[k + 1]]) for k in range(len(degrees)))
        return StagePlan(stage_of_node=stage, stage_devices=groups, num_microbatches=self.m if m is None else int(m),
                         schedule=self.schedule, batch_size=self.batch_size, meta=meta or {}, sharding=sharding,
                         tp=tp, recompute=recompute or (), sequence_parallel=bool(sequence_parallel) and max(tp) > 1)

    @property
    def calls(self) -> int:
        return int(self.sim.calls)

    @property
    def left(self) -> int:
        """Simulations left: the budget's, none once ``seconds`` (when given) have passed."""
        if self.out_of_time():
            return 0
        return self.budget - self.calls

    def out_of_time(self, share: float = 1.0) -> bool:
        """``share`` of the seconds (when given) have passed."""
        return self.seconds is not None and time.perf_counter() - self.start >= share * self.seconds

    def choice(self, cuts: list[int], degrees: tuple[int, ...]) -> Plan:
        """A plan at the problem's own micro-batch count with DDP replication."""
        return list(cuts), tuple(degrees), self.m, "dp"

    def score(self, cuts: list[int], degrees: tuple[int, ...], m: int | None = None,
              sharding: str = "dp", tp: tuple[int, ...] | None = None,
              recompute: tuple[str, ...] | None = None, sequence_parallel: bool = False,
              past_seconds: bool = False) -> Score | None:
        """The plan's score (cached), or None when the budget or the seconds (unless ``past_seconds``: the
        chosen plan's own time, reported after them) are spent."""
        m = self.m if m is None else int(m)
        tp = tuple(tp) if tp and any(t > 1 for t in tp) else None
        recompute = tuple(recompute) if recompute and any(r != "none" for r in recompute) else None
        sp = bool(sequence_parallel) and tp is not None
        key = (cuts if isinstance(cuts, Stages) else tuple(cuts), tuple(degrees), m, sharding, tp)
        key += ((recompute,) if recompute else ()) + (("sp",) if sp else ())
        if key in self._scored:
            return self._scored[key]
        if (self.budget - self.calls if past_seconds else self.left) <= 0:
            return None
        res = self.sim.run(self.plan(cuts, degrees, m=m, sharding=sharding, tp=tp, recompute=recompute,
                                     sequence_parallel=sp))
        cap = self.topology.array("memory_bytes")
        over = float(np.maximum(res.peak_memory - cap, 0.0).sum())
        value = float(res.step_time) if self.objective == "step" else float(res.meta["steady_time"])
        s = Score(value, bool(res.feasible), 0.0 if res.feasible else max(over, 1.0), np.asarray(res.peak_memory))
        self._scored[key] = s
        self._step[key] = float(res.step_time)
        return s

    def scored_items(self) -> list[tuple[tuple, Score]]:
        """Every plan simulated so far as (its cache key, its score): ``pipe_refine`` climbs from the best."""
        return list(self._scored.items())

    def best_of(self, cands: Iterable[Plan]) -> Plan:
        """The best simulated candidate (in the given order while the budget and seconds last; else the first);
        ``cands`` may be an iterator (made as they are scored)."""
        it = iter(cands)
        first = next(it, None)
        if first is None:
            raise ConfigError(f"batch_size {self.batch_size} admits no plan of this planner over the {self.d} devices "
                              f"of topology '{self.topology.name}' (every replica needs whole micro-batches, a "
                              f"pipeline at least one per stage): use a batch size with more divisors or fewer devices")
        best, best_key = first, None
        for cand in itertools.chain((first,), it):
            s = self.score(*cand)
            if s is None:
                self.cut_short = True
                break
            if best_key is None or s.key < best_key:
                best, best_key = cand, s.key
        return best

    def finish(self, choice: Plan, name: str) -> StagePlan:
        cuts, degrees, m, sharding = choice[:4]
        tp = choice[4] if len(choice) > 4 else None
        rc = choice[5] if len(choice) > 5 else None
        rc = tuple(rc) if rc and any(r != "none" for r in rc) else None
        sp = bool(choice[6]) if len(choice) > 6 and tp and any(t > 1 for t in tp) else False
        s = self.score(cuts, degrees, m, sharding, tp, rc, sp, past_seconds=True)
        meta: dict[str, object] = {"placer": name, "budget": self.budget, "seed": self.seed,
                                   "sim_calls": self.calls, "search_seconds": time.perf_counter() - self.start,
                                   **self.extra_meta}
        if s is not None:
            key = (cuts if isinstance(cuts, Stages) else tuple(cuts), tuple(degrees), int(m), sharding,
                   tuple(tp) if tp and any(t > 1 for t in tp) else None)
            key += ((rc,) if rc else ()) + (("sp",) if sp else ())
            meta.update(step_time=self._step.get(key, s.step_time), feasible=s.feasible)
            if self.objective != "step":
                meta.update(objective=self.objective, steady_time=s.step_time)
        if not self.fits_at_all():  # every plan is over memory: the plan says why (after any note it has)
            add_note(meta, self.no_fit_text())
        elif s is not None and (over := self.over_text(s)) and NO_FIT_SIMULATED not in str(meta.get("note") or ""):
            add_note(meta, over)  # (exact's own note says it with what else it tried)
        return self.plan(cuts, degrees, meta, m=m, sharding=sharding, tp=tp, recompute=rc,
                         sequence_parallel=sp).validate(self.graph, self.topology)


def plan_of(key: tuple) -> Plan:
    """A ``PipeProblem.score`` cache key as a plan ``(cuts, degrees, m, sharding, tp, recompute, sequence
    parallel)``; cuts a list, or the key's ``Stages``."""
    cuts, degrees, m, sharding, tp = key[:5]
    rc = next((x for x in key[5:] if isinstance(x, tuple)), None)
    cuts = cuts if isinstance(cuts, Stages) else list(cuts)
    return cuts, tuple(degrees), int(m), sharding, tp, rc, "sp" in key[5:]


def crossing_out(graph: CompGraph, pos: np.ndarray, j: int) -> np.ndarray:
    """For every i < j: bytes of tensors produced at positions [i, j) and consumed at or after j.

    A producer's tensor is counted once, with its largest crossing edge (the simulator sends it once).
    """
    if graph.num_edges == 0:
        return np.zeros(j)
    ps, pd = pos[graph.edges[:, 0]], pos[graph.edges[:, 1]]
    cross = (ps < j) & (pd >= j)
    per = np.zeros(j)
    np.maximum.at(per, ps[cross], graph.edge_bytes[cross])
    return np.cumsum(per[::-1])[::-1]


MAX_CUT_POINTS = 512  # DPs consider at most this many evenly spaced cut points (O(points^2) work)


def cut_grid(n: int, max_points: int = MAX_CUT_POINTS) -> np.ndarray:
    """Candidate cut positions ``0 = g[0] < ... < g[-1] = n`` (every position when ``n <= max_points``)."""
    return np.unique(np.rint(np.linspace(0, n, min(n, max_points) + 1)).astype(np.int64))


def minmax_partition(n: int, s_max: int, cost_vec: Callable[[int, int], np.ndarray]) -> list[list[int]]:
    """For every ``S = 1..s_max``: cuts of ``n`` positions into ``S`` non-empty contiguous stages minimising
    the largest stage cost, over the cut points of ``cut_grid(n)`` (the DP rows are shared: row ``k``
    covers ``[0, j)`` with stages ``0..k``).

    ``cost_vec(j, k)`` gives, for every ``i < j``, the cost of positions ``[i, j)`` as stage ``k``.
    """
    grid = cut_grid(n)
    g = len(grid) - 1
    s_max = min(s_max, g)
    dp = np.full((s_max, g + 1), np.inf)
    arg = np.zeros((s_max, g + 1), dtype=np.int64)
    for b in range(1, g + 1):
        dp[0, b] = cost_vec(int(grid[b]), 0)[0]
    for k in range(1, s_max):
        for b in range(k + 1, g + 1):
            cand = np.maximum(dp[k - 1, :b], cost_vec(int(grid[b]), k)[grid[:b]])
            a = int(np.argmin(cand))
            dp[k, b], arg[k, b] = cand[a], a
    out = []
    for s in range(1, s_max + 1):
        cuts, b = [g], g
        for k in range(s - 1, 0, -1):
            b = int(arg[k, b])
            cuts.append(b)
        cuts.append(0)
        out.append([int(grid[x]) for x in cuts[::-1]])
    return out
