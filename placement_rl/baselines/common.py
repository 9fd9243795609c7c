"""Shared core of the op-level placers: the budgeted simulator and cost summaries.

Every placer works on a ``Problem`` (graph, costs, topology, budget, seed) and spends simulator calls only
through ``Problem.score`` so that ``sim_calls`` (the prepared ``Simulator``'s own counter) never passes the
budget. Candidates are ranked by ``Score.key``: feasible before infeasible, then by step time (infeasible
ones by memory overflow first), so "best" always prefers a placement that fits.

Shapes (N nodes, D devices):
    node_time: float64 [N, D]  fwd + bwd seconds of each node on each device
    node_mem: float64 [N]      bytes a node pins on its device (``cost.memory.pinned_memory``: training or inference)
    capacity: float64 [D]      device memory in bytes
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from placement_rl.cost import Simulator
from placement_rl.cost.limits import check_devices
from placement_rl.cost.memory import pinned_memory
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError, PlanError, fmt_bytes
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement
from placement_rl.topology import DeviceTopology

NO_FIT = "no placement fits memory"  # how a placement's ``note`` begins where none fits (``Problem.no_fit_text``)


class StartCut(Exception):
    """A search's start heuristic ran past ``Problem.start_deadline`` (``search.local_search`` drops it)."""


@dataclass(frozen=True)
class Score:
    step_time: float
    feasible: bool
    overflow: float  # bytes over capacity summed over devices (0 when feasible)
    peak_memory: np.ndarray = field(repr=False, compare=False)

    @property
    def key(self) -> tuple[int, float, float]:
        return (0, self.step_time, 0.0) if self.feasible else (1, self.overflow, self.step_time)


class Problem:
    """One placement problem with a simulator-call budget (``budget`` calls at most) and optionally a wall-clock
    budget (``seconds``: once spent, ``left`` is 0 and a search stops at its next call, so searches compare at
    equal seconds). ``trace`` records the anytime curve: ``(seconds since start, calls, best feasible step time)``
    at every improvement."""

    def __init__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, budget: int,
                 seed: int, seconds: float | None = None, objective: str = "step") -> None:
        check_inputs(graph, costs, topology, budget)
        check_seed(seed)
        check_devices(topology)
        from placement_rl.cost.modes import check_objective

        self.objective = check_objective(objective)  # throughput: scores are steady-state times per batch
        if seconds is not None and not float(seconds) > 0:
            raise ConfigError(f"seconds must be > 0, got {seconds!r}")
        self.graph, self.costs, self.topology = graph, costs, topology
        self.budget, self.seed = int(budget), int(seed)
        self.seconds = None if seconds is None else float(seconds)
        self.rng = np.random.default_rng(self.seed)
        self.sim = Simulator(graph, costs, topology)
        self.start = time.perf_counter()
        self._scored: dict[bytes, Score] = {}
        self._charged = 0
        self.trace: list[tuple[float, int, float]] = []
        self._best = float("inf")
        self.meta: dict[str, object] = {}  # what a placer says about its run (e.g. a start cut short by the seconds)
        self.start_deadline: float | None = None  # set by a search around its start heuristics (``check_start``)

    def check_start(self) -> None:
        """Raise ``StartCut`` once ``start_deadline`` (a ``time.perf_counter()`` instant) has passed: the list
        schedulers call it every few nodes, so a search's start does not run past the search's seconds. Without
        a start deadline (the heuristics as placers of their own) it does nothing."""
        if self.start_deadline is not None and time.perf_counter() > self.start_deadline:
            raise StartCut

    # ------------------------------------------------------------ summaries
    @property
    def n(self) -> int:
        return self.graph.num_nodes

    @property
    def d(self) -> int:
        return self.topology.num_devices

    @cached_property
    def node_time(self) -> np.ndarray:
        return self.costs.fwd_time + self.costs.bwd_time

    @cached_property
    def node_mem(self) -> np.ndarray:
        return pinned_memory(self.graph, self.costs)

    @cached_property
    def capacity(self) -> np.ndarray:
        return self.topology.array("memory_bytes")

    @cached_property
    def fits_at_all(self) -> bool:
        """Whether the graph's pinned memory fits all devices' memory together (``cost.schedule.check_fits``'s
        test). Where it does not, no placement fits: the rules on the schedule state, which refuses such a graph,
        decide with memory ignored (``eft.state_topology``), so every placer returns an infeasible placement, whose
        ``note`` says why (``finish``: ``no_fit_text``)."""
        return not float(self.node_mem.sum()) > float(self.capacity.sum())

    def no_fit_text(self) -> str:
        """Why no placement fits where ``fits_at_all`` is false: the note ``finish`` gives (``eft.state_topology``'s
        begins with it)."""
        return (f"{NO_FIT} (the graph pins {fmt_bytes(float(self.node_mem.sum()))}, the devices have "
                f"{fmt_bytes(float(self.capacity.sum()))} in all)")

    @cached_property
    def device_order(self) -> np.ndarray:
        """Devices fastest first (total fwd+bwd time of the whole graph), ties by index."""
        total = self.node_time.sum(axis=0)
        return np.lexsort((np.arange(self.d), total))

    @cached_property
    def mean_comm(self) -> np.ndarray:
        """Per edge: mean transfer seconds over distinct device pairs (HEFT's average communication cost)."""
        if self.d == 1:
            return np.zeros(self.graph.num_edges)
        off = ~np.eye(self.d, dtype=bool)
        lat = self.costs.link_latency[off].mean()
        inv_bw = (1.0 / self.costs.link_bandwidth[off]).mean()
        return lat + self.graph.edge_bytes * inv_bw

    # -------------------------------------------------------------- scoring
    @property
    def calls(self) -> int:
        return int(self.sim.calls) + self._charged

    def charge(self, calls: int) -> None:
        """Count ``calls`` simulations a placer ran outside ``score`` (``eft_rollout``'s completed placements)."""
        self._charged += int(calls)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def deadline(self) -> float | None:
        """The ``time.perf_counter()`` instant the seconds run out (None without seconds): a one-pass start stops
        its lookahead there and completes the rest by the earliest finish."""
        return None if self.seconds is None else self.start + self.seconds

    @property
    def left(self) -> int:
        if self.seconds is not None and self.elapsed >= self.seconds:
            return 0
        return self.budget - self.calls

    def note(self, step_time: float, feasible: bool = True) -> None:
        """Record a placement found outside ``score`` (e.g. a decode that simulated its own) on the anytime trace."""
        if feasible and step_time < self._best:
            self._best = float(step_time)
            self.trace.append((self.elapsed, self.calls, self._best))

    def score(self, devices: np.ndarray, *, after_time: bool = False) -> Score | None:
        """Simulate one placement (cached by content); None when the budget is spent (``after_time``: the call
        budget only, for the result itself once the seconds are spent)."""
        devices = np.ascontiguousarray(devices, dtype=np.int64)
        key = devices.tobytes()
        if key in self._scored:
            return self._scored[key]
        if (self.budget - self.calls if after_time else self.left) <= 0:
            return None
        res = self.sim.run(devices)
        over = float(np.maximum(np.asarray(res.peak_memory) - self.capacity, 0.0).sum())
        value = float(res.step_time)
        if self.objective == "throughput":
            from placement_rl.cost.throughput import op_steady_time

            value = op_steady_time(self.graph, self.costs, devices)
        s = Score(value, bool(res.feasible), 0.0 if res.feasible else max(over, 1.0),
                  np.asarray(res.peak_memory, dtype=np.float64))
        self._scored[key] = s
        self.note(s.step_time, s.feasible)
        return s

    def estimate_fits(self, devices: np.ndarray) -> bool:
        """Whether the placement-independent memory of each device fits (no simulator call)."""
        load = np.bincount(devices, weights=self.node_mem, minlength=self.d)
        return bool((load <= self.capacity).all())

    def checked(self, devices: object, name: str) -> np.ndarray:
        """Placer ``name``'s output as int64 device indices, one per node of this graph: ``PlanError`` naming the
        placer for an entry that is no integer (a cast would turn 0.7 into device 0 in silence), another shape or
        length, or a device the topology lacks; strings and bools are no device indices."""
        try:
            kind = "U" if isinstance(devices, (str, bytes)) else np.asarray(devices).dtype.kind
        except (TypeError, ValueError):  # ragged: Placement says what is wrong
            kind = "i"
        if kind not in "iuf":
            got = (f"{type(devices).__name__} of dtype {np.asarray(devices).dtype}" if kind != "U"
                   else " ".join(repr(devices)[:80].split()))  # one line, whatever the value
            raise PlanError(f"placer '{name}' returned a bad placement: device indices must be integers, got {got}")
        try:
            return Placement(devices).validate(self.graph, self.topology).device_of_node
        except PlanError as exc:
            raise PlanError(f"placer '{name}' returned a bad placement: {exc}") from None

    def finish(self, devices: np.ndarray, name: str, **extra: object) -> Placement:
        """Score placer ``name``'s result (``devices``: a device index per node, ``checked``) and return it as a
        ``Placement`` whose meta records the run (see ``placement_rl.baselines``)."""
        devices = self.checked(devices, name)
        s = self.score(devices, after_time=True)  # the result is scored even when the seconds are spent
        meta: dict[str, object] = {"placer": name, "budget": self.budget, "seed": self.seed,
                                   "sim_calls": self.calls,
                                   "search_seconds": time.perf_counter() - self.start,
                                   "trace": [list(x) for x in self.trace], **self.meta}
        if self.seconds is not None:
            meta["seconds_budget"] = self.seconds
        if s is not None:
            meta.update(step_time=s.step_time, feasible=s.feasible)
            if self.objective != "step":
                meta.update(objective=self.objective, steady_time=s.step_time)
                meta["step_time"] = float(self.sim.run(devices).step_time)
        meta.update(extra)
        if not self.fits_at_all:  # every placement is over memory: the result says why (after any note it has)
            add_note(meta, self.no_fit_text())
        return Placement(devices, meta=meta)


def add_note(meta: dict, text: str) -> None:
    """``text`` joined to ``meta["note"]`` with "; " (the note alone where there was none; unchanged where it
    already says ``text``)."""
    note = meta.get("note")
    if not note:
        meta["note"] = text
    elif text not in str(note):
        meta["note"] = f"{note}; {text}"


def check_inputs(graph: CompGraph, costs: CostTable, topology: DeviceTopology, budget: int) -> None:
    """Budget check; a cost table of another graph/topology is refused by ``Simulator`` (ProfileError)."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ConfigError(f"budget must be a non-negative integer number of simulator calls, got {budget!r}")


def check_seed(seed: object) -> None:
    """``ConfigError`` unless ``seed`` is an integer >= 0 (a Python or numpy one, not a bool): what every placer's
    random generator takes (CP-SAT takes it modulo 2**31, ``bounds_cp._solve``)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")


def topo_positions(graph: CompGraph) -> np.ndarray:
    """``pos[i]`` = index of node ``i`` in ``graph.topo_order``."""
    pos = np.empty(graph.num_nodes, dtype=np.int64)
    pos[graph.topo_order] = np.arange(graph.num_nodes)
    return pos


def upward_rank(prob: Problem) -> np.ndarray:
    """HEFT upward rank: mean compute time plus the longest (mean comm + rank) path to an exit node."""
    g = prob.graph
    w = prob.node_time.mean(axis=1)
    c = prob.mean_comm
    rank = np.zeros(g.num_nodes)
    sp, si, se = g.succ_ptr, g.succ_idx, g.succ_eid
    for u in g.topo_order[::-1]:
        lo, hi = sp[u], sp[u + 1]
        tail = (c[se[lo:hi]] + rank[si[lo:hi]]).max() if hi > lo else 0.0
        rank[u] = w[u] + tail
    return rank
