"""Research studies: sweeps of training cells x seeds under an equal simulator-call budget, with honest statistics.

A study is a list of ``Cell``s (one training configuration each: graph, topology, env, agent, encoder) run with
every seed of ``StudySpec.seeds``. Every run trains until its envs have made ``budget`` simulator calls
(``train_to_budget``); the result is the best placement found within that budget, judged on the cell's graph
or, for coarsening studies (``judge="original"``), expanded to the uncoarsened graph and simulated there. The
non-learned baselines run on the same judged graph with the same budget and seed (``placement_rl.evaluate``).

``run_study(spec)`` returns ``RunResult``s; ``placement_rl.studies.stats`` aggregates them (mean and sample standard
deviation over seeds, learning curves with spread). Building specs from ``conf/experiment/*.yaml`` lives in ``placement_rl.studies.config``; the zero-shot
study in ``placement_rl.studies.zeroshot``; tables, plots and pages in ``placement_rl.studies.report``.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

# Agent modules are imported here, not inside functions: a long study must not mix module versions when
# files change while it runs.
from placement_rl.agents.rollout import rollout
from placement_rl.agents.train import AgentSpec, EncoderSpec, Trainer
from placement_rl.cost import resolve_costs, simulate
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError, PlacementRLError
from placement_rl.evaluate import best_row, compare
from placement_rl.graph.coarsen import expand_placement
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.spec import graph_from_spec
from placement_rl.plans import Placement
from placement_rl.topology import DeviceTopology, load_topology

__all__ = ["BaselineRef", "Cell", "Problem", "RunFailure", "RunResult", "StudyFailed", "StudySpec", "TrainOutcome",
           "baseline_reference", "build_problem", "run_cell", "run_study", "train_to_budget"]

JUDGES = ("cell", "original")
STEP_CAP = 3  # env steps per simulator call of the budget before a run is stopped (see train_to_budget)


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One training configuration of a study. ``graph`` is a graph spec (``placement_rl.graph.spec``),
    ``topology`` a preset name or YAML path, ``env_options`` the env's keyword options."""

    name: str
    graph: Mapping[str, Any]
    topology: str
    env_id: str
    env_options: Mapping[str, Any] = field(default_factory=dict)
    agent: AgentSpec = AgentSpec()
    encoder: EncoderSpec = EncoderSpec()


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    """A sweep: every cell with every seed, ``budget`` simulator calls per run, baselines with the same budget.

    name / title / question: file stem, page title and the question the study answers.
    factor: what the cells vary (the table's first column).
    judge: ``cell`` (judge on the cell's graph) or ``original`` (expand a coarsened placement to the
        uncoarsened graph and simulate it there; baselines run on that graph too).
    mode: ``quick`` or ``full`` (recorded on the page).
    command: the exact command that reproduces the study (written on its page).
    workers: Ray workers running (cell, seed) jobs in parallel (1: in this process; ``placement_rl.scale``).
    """

    name: str
    factor: str
    cells: tuple[Cell, ...]
    seeds: tuple[int, ...]
    budget: int
    title: str = ""
    question: str = ""
    judge: str = "cell"
    mode: str = "quick"
    command: str = ""
    workers: int = 1

    def __post_init__(self) -> None:
        if not self.cells:
            raise ConfigError(f"study '{self.name}' has no cells: sweep at least one value")
        names = [c.name for c in self.cells]
        if len(set(names)) != len(names):
            raise ConfigError(f"study '{self.name}' has duplicate cell names: {names}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"study '{self.name}' needs distinct seeds, got {list(self.seeds)}")
        if isinstance(self.budget, bool) or not isinstance(self.budget, (int, np.integer)) or self.budget < 1:
            raise ConfigError(f"study budget must be a positive number of simulator calls, got {self.budget!r}")
        if self.judge not in JUDGES:
            raise ConfigError(f"study judge must be one of {', '.join(JUDGES)}, got {self.judge!r}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")


@dataclass(frozen=True)
class TrainOutcome:
    """What one run reached within its budget. ``curve`` holds ``(sim_calls, judged best step time)`` at every
    improvement (NaN while nothing feasible was found)."""

    step_time: float
    feasible: bool
    value: np.ndarray | None
    sim_calls: int  # simulator calls made in training (may pass the budget by the last rollout)
    episodes: int
    seconds: float  # wall-clock time of training until the budget was spent
    curve: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class RunResult:
    """One (cell, seed) run next to the best baseline of the same case, budget and seed."""

    cell: str
    seed: int
    step_time: float
    feasible: bool
    greedy_time: float  # the trained policy's greedy rollout (after training, not charged to the budget)
    sim_calls: int
    budget: int
    seconds: float
    episodes: int
    baseline: str
    baseline_time: float
    single_time: float
    curve: tuple[tuple[int, float], ...] = ()

    @property
    def ratio(self) -> float:
        """Step time relative to the best baseline (< 1: the learned placement is faster)."""
        return self.step_time / self.baseline_time if self.feasible else float("nan")

    @property
    def speedup(self) -> float:
        """Speed-up over the best single device (> 1: faster than one device)."""
        return self.single_time / self.step_time if self.feasible else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, "seed": self.seed, "step_time_ms": self.step_time * 1e3,
                "feasible": self.feasible, "greedy_time_ms": self.greedy_time * 1e3,
                "ratio_to_best_baseline": self.ratio, "speedup_over_single": self.speedup,
                "best_baseline": self.baseline, "best_baseline_ms": self.baseline_time * 1e3,
                "single_device_ms": self.single_time * 1e3, "sim_calls": self.sim_calls, "budget": self.budget,
                "episodes": self.episodes, "train_seconds": self.seconds}


@dataclass(frozen=True)
class RunFailure:
    """A (cell, seed) run that raised: its error in one line (the exception's type too, unless a domain error)."""

    cell: str
    seed: int
    error: str

    @staticmethod
    def of(cell: str, seed: int, exc: BaseException) -> "RunFailure":
        text = (str(exc).splitlines() or [""])[0]
        return RunFailure(cell, seed, text if isinstance(exc, PlacementRLError) else f"{type(exc).__name__}: {text}")

    def describe(self) -> str:
        return f"cell '{self.cell}' seed {self.seed} failed: {self.error}"


class StudyFailed(PlacementRLError):
    """Some runs of a study raised; the others finished. ``results``: the finished runs (cell x seed order),
    ``failures``: the failed ones, so a caller can still write the finished runs and name the failed cells."""

    def __init__(self, results: Sequence["RunResult"], failures: Sequence[RunFailure]) -> None:
        self.results, self.failures = list(results), list(failures)
        more = f" (and {len(failures) - 1} more failed runs)" if len(failures) > 1 else ""
        super().__init__(f"{failures[0].describe()}{more}; {len(results)} runs finished")


# ------------------------------------------------------------------------------------------------ problems
@dataclass(frozen=True)
class Problem:
    """What a cell trains on (``graph``) and what its placements are judged on (``judge_graph``)."""

    graph: CompGraph
    topology: DeviceTopology
    judge_graph: CompGraph
    judge_costs: CostTable

    def judge(self, value: np.ndarray) -> tuple[float, bool]:
        """Step time and feasibility of a placement of ``graph``'s nodes, on ``judge_graph``."""
        dev = np.asarray(value, dtype=np.int64)[: self.graph.num_nodes]
        if self.judge_graph is not self.graph:
            dev = expand_placement(self.graph, dev)
        res = simulate(self.judge_graph, self.judge_costs, self.topology, Placement(dev))
        return float(res.step_time), bool(res.feasible)


def build_problem(cell: Cell, *, judge: str = "cell",
                  graphs: dict[str, CompGraph] | None = None) -> Problem:
    """The cell's graph and topology (graphs built once per distinct spec when ``graphs`` is shared)."""
    memo = graphs if graphs is not None else {}

    def get(spec: Mapping[str, Any]) -> CompGraph:
        key = repr(sorted((k, repr(v)) for k, v in spec.items()))
        if key not in memo:
            memo[key] = graph_from_spec(spec)
        return memo[key]

    graph = get(cell.graph)
    judge_graph = graph
    if judge == "original" and graph.members is not None:
        judge_graph = get({**dict(cell.graph), "coarsen": {"enabled": False}})
    topology = load_topology(cell.topology)
    return Problem(graph=graph, topology=topology, judge_graph=judge_graph,
                   judge_costs=resolve_costs(judge_graph, topology))


@dataclass(frozen=True)
class BaselineRef:
    """The best non-learned placer on a case (same budget and seed as the learned runs)."""

    name: str
    step_time: float
    single_time: float  # all nodes on the best single device
    seconds: float  # the best placer's search wall-clock time
    sim_calls: int = 0  # simulator calls the best placer made


def baseline_reference(problem: Problem, *, budget: int, seed: int,
                       placers: Sequence[str] | None = None) -> BaselineRef:
    """The best baseline on the judged graph with ``budget`` simulator calls."""
    g, t = problem.judge_graph, problem.topology
    rows = compare(g, problem.judge_costs, t, budget=budget, seed=seed, placers=placers)
    best = best_row(rows)
    single = next(r.step_time for r in rows if r.placer == "single_device")
    if best is None:
        return BaselineRef("none feasible", float("nan"), single, float("nan"))
    return BaselineRef(best.placer, best.step_time, single, best.search_seconds, best.sim_calls)


# ------------------------------------------------------------------------------------------------ training
def _min_chunk(agent: AgentSpec) -> int:
    return 1 if agent.algo == "reinforce" else agent.n_envs * agent.n_steps


def train_to_budget(trainer: Trainer, budget: int, *,
                    judge: Callable[[np.ndarray], tuple[float, bool]] | None = None,
                    max_steps: int | None = None) -> TrainOutcome:
    """Train until the trainer's envs have made ``budget`` simulator calls; return the best result found
    within the budget. ``judge(value) -> (step_time, feasible)`` re-scores each new best (default: as the env
    scored it). Learning runs in chunks sized from the measured steps per simulator call.

    A sequential env only simulates a step that moves a node, so a policy that stops moving nodes spends env
    steps without simulator calls: training also stops after ``max_steps`` env steps (default
    ``STEP_CAP x budget``), and the outcome then reports fewer simulator calls than the budget."""
    tracker = trainer.tracker
    snaps: list[tuple[int, float, bool, np.ndarray | None]] = []
    last: list[Any] = [None]

    def check() -> None:
        if tracker.best_value is not None and tracker.best_value is not last[0]:
            last[0] = tracker.best_value
            value = np.asarray(tracker.best_value).copy()
            t, ok = judge(value) if judge is not None else (tracker.best_time, tracker.best_feasible)
            snaps.append((tracker.sim_calls, float(t), bool(ok), value))

    # Instance hook on the tracker method the counting wrappers call with every evaluated plan (``offer``; older
    # trackers only saw episode ends), so each new best is recorded with the simulator calls spent so far.
    hook = "offer" if hasattr(tracker, "offer") else "episode_end"
    inner = getattr(tracker, hook)

    def hooked(*args: Any, **kwargs: Any) -> None:
        inner(*args, **kwargs)
        check()

    setattr(tracker, hook, hooked)
    check()  # a best found before this call (e.g. an earlier chunk of training)
    start = time.perf_counter()
    steps_per_call, stalls = 1.0, 0
    step_cap = trainer.num_timesteps + (max_steps if max_steps is not None else STEP_CAP * budget)
    try:
        while tracker.sim_calls < budget and trainer.num_timesteps < step_cap:
            before = tracker.sim_calls
            chunk = max(_min_chunk(trainer.agent), int(np.ceil((budget - before) * steps_per_call)))
            trainer.learn(min(chunk, max(1, step_cap - trainer.num_timesteps)), progress=False)
            if tracker.sim_calls > 0:
                steps_per_call = max(trainer.num_timesteps / tracker.sim_calls, 1e-3)
            stalls = stalls + 1 if tracker.sim_calls == before else 0
            if stalls >= 3:
                raise ConfigError(f"training made no simulator calls in 3 chunks of {chunk} steps: "
                                  f"check the env '{trainer.env_id}' and its reward source")
    finally:
        vars(tracker).pop(hook, None)
    seconds = time.perf_counter() - start
    within = [s for s in snaps if s[0] <= budget]
    best: tuple[int, float, bool, np.ndarray | None] = (0, float("nan"), False, None)
    curve: list[tuple[int, float]] = []
    for s in within:  # the judged best so far (a judge may disagree with the env's ranking)
        if (s[2], -s[1]) > (best[2], -best[1] if np.isfinite(best[1]) else -np.inf):
            best = s
        curve.append((s[0], best[1] if best[2] else float("nan")))
    return TrainOutcome(step_time=best[1], feasible=best[2], value=best[3], sim_calls=int(tracker.sim_calls),
                        episodes=int(tracker.episodes), seconds=seconds, curve=tuple(curve))


def greedy_time(trainer: Trainer, problem: Problem, *, seed: int) -> float:
    """Step time of the trained policy's greedy rollout on a fresh env (judged like the training results)."""
    env = trainer.make_eval_env()
    try:
        info = rollout(trainer.policy, env, deterministic=True, seed=seed)
    finally:
        env.close()
    value = info.get("placement")
    if value is None:
        return float(info["step_time"])
    t, ok = problem.judge(value)
    return t if ok else float("nan")


def run_cell(cell: Cell, seed: int, budget: int, problem: Problem) -> tuple[TrainOutcome, float]:
    """Train one cell with one seed under ``budget`` simulator calls; (outcome, greedy-policy step time)."""
    env_kwargs = {"graph": problem.graph, "topology": problem.topology, **dict(cell.env_options)}
    trainer = Trainer(env_id=cell.env_id, env_kwargs=env_kwargs, agent=cell.agent, encoder=cell.encoder, seed=seed)
    judge = problem.judge if problem.judge_graph is not problem.graph else None
    out = train_to_budget(trainer, budget, judge=judge)
    if judge is None and out.value is not None:  # the env's score, re-checked by the cost model
        t, ok = problem.judge(out.value)
        out = TrainOutcome(t, ok, out.value, out.sim_calls, out.episodes, out.seconds, out.curve)
    return out, greedy_time(trainer, problem, seed=seed)


def _job(args: tuple[Cell, int, int, Problem]) -> tuple[TrainOutcome, float] | RunFailure:
    """``run_cell``, with an error returned as a ``RunFailure`` (one run's failure does not end the study)."""
    try:
        return run_cell(*args)
    except Exception as exc:  # noqa: BLE001 - any error of one run: reported with its cell, the others go on
        if not isinstance(exc, PlacementRLError):  # a bug, not bad input: keep its traceback for whoever fixes it
            traceback.print_exc()
        return RunFailure.of(args[0].name, args[1], exc)


def run_study(spec: StudySpec, *, progress: bool = True,
              on_result: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Every cell x seed of ``spec``, each next to the best baseline of its case. With ``spec.workers`` > 1 the
    runs are jobs on Ray workers (``placement_rl.scale``; each run's seed is its own, so the results do not
    depend on the worker count); results are handled here in cell x seed order as they arrive. A run that raises
    does not stop the others: ``StudyFailed`` at the end carries the finished runs and names the failed ones."""
    from tqdm.auto import tqdm

    from placement_rl.scale import Workers

    graphs: dict[str, CompGraph] = {}
    problems = {c.name: build_problem(c, judge=spec.judge, graphs=graphs) for c in spec.cells}
    jobs = [(c, s) for c in spec.cells for s in spec.seeds]
    bar = tqdm(total=len(jobs), desc=f"study {spec.name}", unit="run", disable=not progress, dynamic_ncols=True)
    refs: dict[tuple[int, str, int], BaselineRef] = {}
    results: list[RunResult] = []
    failures: list[RunFailure] = []
    done = 0  # runs handled (in cell x seed order)

    def handle(i: int, got: tuple[TrainOutcome, float] | RunFailure) -> None:
        nonlocal done
        done += 1
        if isinstance(got, RunFailure):
            failures.append(got)
            bar.update(1)
            bar.set_postfix_str(got.describe()[:80])
            return
        (cell, seed), (out, greedy) = jobs[i], got
        p = problems[cell.name]
        key = (id(p.judge_graph), cell.topology, seed)
        if key not in refs:
            refs[key] = baseline_reference(p, budget=spec.budget, seed=seed)
        ref = refs[key]
        res = RunResult(cell=cell.name, seed=seed, step_time=out.step_time, feasible=out.feasible,
                        greedy_time=greedy, sim_calls=min(out.sim_calls, spec.budget), budget=spec.budget,
                        seconds=out.seconds, episodes=out.episodes, baseline=ref.name,
                        baseline_time=ref.step_time, single_time=ref.single_time, curve=out.curve)
        results.append(res)
        bar.update(1)
        bar.set_postfix_str(f"{cell.name} seed {seed}: x{res.ratio:.3f} of {ref.name}")
        if on_result is not None:
            on_result(res)

    try:
        if spec.workers > 1:
            arrived: dict[int, tuple[TrainOutcome, float] | RunFailure] = {}

            def in_order(i: int, got: tuple[TrainOutcome, float] | RunFailure) -> None:
                arrived[i] = got
                while done in arrived:
                    handle(done, arrived.pop(done))

            with Workers(spec.workers) as workers:
                shared = {name: workers.put(p) for name, p in problems.items()}  # each problem shipped once
                workers.map(_job, [(c, s, spec.budget, shared[c.name]) for c, s in jobs], on_result=in_order,
                            cost=[float(spec.budget)] * len(jobs))
        else:
            for i, (c, s) in enumerate(jobs):
                handle(i, _job((c, s, spec.budget, problems[c.name])))
    finally:
        bar.close()
    if failures:
        raise StudyFailed(results, failures)
    return results
