"""Compare placers on (graph, topology) cases under an equal simulator-call budget.

``compare(graph, costs, topology, budget=..., seed=...)`` runs every op-level placer (and optionally the pipeline
partitioners) on one case and returns ``Row``s; ``run_suite(cases, ...)`` does it for a list of ``Case``s.
``DEFAULT_SUITE`` is the benchmark suite of ``placement-rl evaluate``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from placement_rl import baselines
from placement_rl.cost import resolve_costs, simulate, simulate_pipeline
from placement_rl.cost.throughput import op_steady_time
from placement_rl.cost.types import CostTable, SimResult
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement, StagePlan
from placement_rl.topology import DeviceTopology, load_topology


@dataclass(frozen=True)
class Case:
    """One benchmark case: a graph spec (see ``placement_rl.graph.spec``) on a topology preset."""

    name: str
    graph: Mapping[str, Any]
    topology: str
    note: str = ""


def _zoo(name: str, *, max_nodes: int | None = None, **overrides: Any) -> dict[str, Any]:
    return {"source": "zoo", "name": name, "overrides": overrides,
            "coarsen": {"enabled": True, "depth": None, "max_nodes": max_nodes}}


DEFAULT_SUITE: tuple[Case, ...] = (
    Case("gpt/4xV100-NVLink", _zoo("gpt"), "4x_v100_nvlink", "GPT decoder, default coarsening"),
    Case("resnet50/4xV100-PCIe", _zoo("resnet50"), "4x_v100_pcie", "ResNet-50, one group per block part"),
    Case("inception/2xK80", _zoo("inception"), "2x_k80", "Placeto's testbed"),
    Case("nmt/2xK80", _zoo("nmt"), "2x_k80", "LSTM seq2seq with attention (ColocRL's workload)"),
    Case("moe/8xA100", _zoo("moe"), "8x_a100_nvswitch", "mixture-of-experts transformer"),
    Case("gpt-large/2xsmallGPU", _zoo("gpt", n_layers=8, d_model=1024, seq_len=128), "2x_small_gpu",
         "memory forces a split: the model does not fit one device"),
    Case("gpt/2x4V100-IB", _zoo("gpt"), "2x4_v100_ib", "two nodes over InfiniBand"),
    Case("resnet18/CPU+2GPU", _zoo("resnet18"), "cpu_2gpu", "heterogeneous host"),
    Case("gpt-coarse12/2xK80", _zoo("gpt", max_nodes=12), "2x_k80",
         "coarsened to 12 groups: exhaustive search gives the true optimum"),
    Case("gpt-xl/2xsmallGPU", _zoo("gpt", n_layers=12, d_model=1024, seq_len=128), "2x_small_gpu",
         "training state (4x params) does not fit one device: DDP cannot run, sharding or a pipeline must"),
)

# cases where the pipeline planners (DP, FSDP, DP x PP) run too
DEFAULT_PIPELINE_CASES = ("gpt/4xV100-NVLink", "gpt/2x4V100-IB", "resnet50/4xV100-PCIe", "moe/8xA100",
                          "gpt-large/2xsmallGPU", "gpt-xl/2xsmallGPU", "gpt-coarse12/2xK80")


@dataclass
class Row:
    case: str
    placer: str
    kind: str  # "placement" | "pipeline"
    step_time: float
    speedup: float  # over the best single device, whether or not either fits (``shown_speedups``: the tables')
    feasible: bool
    search_seconds: float
    sim_calls: int
    note: str = ""
    plan: Any = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("plan")
        return d


def _row(case: str, name: str, kind: str, plan: Placement | StagePlan, res: SimResult, seconds: float) -> Row:
    """A placer's row; its speed-up is set by ``with_speedups`` once the case's rows are all in."""
    return Row(case=case, placer=name, kind=kind, step_time=float(res.step_time), speedup=float("nan"),
               feasible=bool(res.feasible), search_seconds=seconds, sim_calls=int(plan.meta.get("sim_calls", 0)),
               plan=plan)


def _ratio(single: float, step_time: float) -> float:
    return float(single / step_time) if step_time > 0 and np.isfinite(single) else float("nan")


def _single_devices(rows: list[Row]) -> dict[str, Row]:
    return {r.case: r for r in rows if r.placer == "single_device" and r.kind == "placement"}


def with_speedups(rows: list[Row]) -> list[Row]:
    """``rows`` with each speed-up over its case's ``single_device`` row, wherever that row is listed (NaN in a
    case without one)."""
    single = _single_devices(rows)
    return [dataclasses.replace(r, speedup=_ratio(single[r.case].step_time if r.case in single else float("nan"),
                                                  r.step_time)) for r in rows]


def shown_speedups(rows: list[Row]) -> list[float]:
    """The speed-up each table shows: NaN (``n/a``) where the row or its case's single device does not fit in
    memory (a step time it cannot run at has no ratio to one it can)."""
    single = _single_devices(rows)
    return [r.speedup if r.feasible and r.case in single and single[r.case].feasible else float("nan")
            for r in rows]


def _as_steady(res: SimResult, steady: float) -> SimResult:
    """``res`` with its steady-state time per batch in place of the step time (kept in ``meta``)."""
    return dataclasses.replace(res, step_time=float(steady), meta={**dict(res.meta), "one_step_time": res.step_time})


def priced(graph: CompGraph, costs: CostTable, topology: DeviceTopology, plan: Placement | StagePlan, *,
           objective: str = "step") -> SimResult:
    """The plan simulated; with ``objective="throughput"`` its steady-state time per batch as the step time."""
    if isinstance(plan, Placement):
        res = simulate(graph, costs, topology, plan)
        return _as_steady(res, op_steady_time(graph, costs, plan)) if objective == "throughput" else res
    res = simulate_pipeline(graph, costs, topology, plan)
    return _as_steady(res, res.meta["steady_time"]) if objective == "throughput" else res


def _side_by_side(graph: CompGraph, costs: CostTable, topology: DeviceTopology, names: list[str], *, budget: int,
                  seed: int, seconds: float | None, objective: str = "step") -> dict[str, Placement | ConfigError]:
    """With ``seconds`` of at least ``side_by_side.FROM_SECONDS``, the anytime searches among ``names``
    (``side_by_side.SEARCHES``) run side by side, one process and core each, on a machine with two cores or more;
    their placements by name, or the ``ConfigError`` of one that refuses the case (empty otherwise)."""
    from placement_rl.baselines import side_by_side

    todo = [n for n in names if n in side_by_side.SEARCHES]
    jobs = [(n, float(seconds), seed) for n in todo] if seconds is not None else []
    if side_by_side.processes_for(jobs) < 2:
        return {}
    return dict(zip(todo, side_by_side.run(graph, costs, topology, jobs, budget=budget, objective=objective,
                                           refusals=True)))


def _placer_names(placers: Iterable[str] | None) -> list[str]:
    """``placers`` as a list of names (default: every registered placer); ``ConfigError`` for an entry that is no
    name, such as a function: ``baselines.register`` it and pass its name."""
    if placers is None:
        return baselines.names()
    if isinstance(placers, str):
        placers = [placers]
    names = list(placers)
    for p in names:
        if not isinstance(p, str):
            raise ConfigError(f"placers lists names, got {p!r}: register a placer of your own with "
                              f"placement_rl.baselines.register(name, fn) and pass its name"[:300])
    return names


def compare(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, budget: int, seed: int = 0,
            case: str = "", placers: Iterable[str] | None = None, partitioners: Iterable[str] | None = (),
            num_microbatches: int = 4, on_done: Callable[[Row], None] | None = None,
            objective: str = "step", seconds: float | None = None, progress: bool = False) -> list[Row]:
    """Run each placer (default: all) with ``budget`` simulator calls (and ``seconds`` of wall clock each, when
    given: the op-level searches stop at whichever ends first; from ``baselines.side_by_side.FROM_SECONDS`` the
    anytime searches run side by side, one process and core each, their seconds their own clock's);
    ``single_device`` is the reference.
    A placer that cannot run on this case (e.g. exhaustive search on a large graph) gets a row with
    ``note`` saying why and ``step_time`` NaN. ``objective="throughput"``: the partitioners and the op-level
    searches minimise, and every row's ``step_time`` holds, the steady-state time per batch (``cost.throughput``;
    the constructive heuristics still build for the step time, ``cp_sat`` refuses it: a note row). ``progress``: a
    bar over the placers and partitioners."""
    from tqdm.auto import tqdm

    names = _placer_names(placers)
    if "single_device" not in names:
        names.insert(0, "single_device")
    partitioners = list(partitioners or ())
    rows: list[Row] = []
    held = "" if seconds is None else f" and {seconds:g} s"
    bar = tqdm(total=len(names) + len(partitioners), desc=f"placers ({budget} simulator calls{held} each)",
               unit="placer", disable=not progress, dynamic_ncols=True)
    bar.set_postfix_str("the anytime searches, side by side" if seconds is not None else "")
    aside = _side_by_side(graph, costs, topology, names, budget=budget, seed=seed, seconds=seconds,
                          objective=objective)
    for name in names:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        try:
            p = aside[name] if name in aside else baselines.get(name)(graph, costs, topology, budget=budget,
                                                                        seed=seed, seconds=seconds,
                                                                        objective=objective)
            if isinstance(p, ConfigError):  # refused in its worker: the same note row as here
                raise p
        except ConfigError as exc:
            spent = 0.0 if name in aside else time.perf_counter() - t0  # a worker's refusal says no seconds
            rows.append(Row(case, name, "placement", float("nan"), float("nan"), False, spent, 0, note=str(exc)))
            bar.update(1)
            continue
        dt = float(p.meta["search_seconds"]) if name in aside else time.perf_counter() - t0
        res = priced(graph, costs, topology, p, objective=objective)
        rows.append(_row(case, name, "placement", p, res, dt))
        if p.meta.get("note"):  # what the placer says of its result (exhaustive cut short, CP-SAT not run)
            rows[-1] = dataclasses.replace(rows[-1], note=str(p.meta["note"]))
        bar.update(1)
        if on_done:
            on_done(rows[-1])
    for name in partitioners:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        try:
            plan = baselines.get_pipeline(name)(graph, costs, topology, budget=budget, seed=seed,
                                                num_microbatches=num_microbatches, objective=objective,
                                                seconds=seconds)
        except ConfigError as exc:
            rows.append(Row(case, name, "pipeline", float("nan"), float("nan"), False, time.perf_counter() - t0, 0,
                            note=str(exc)))
            bar.update(1)
            continue
        dt = time.perf_counter() - t0
        res = priced(graph, costs, topology, plan, objective=objective)
        rows.append(_row(case, name, "pipeline", plan, res, dt))
        note = _search_note(plan.meta)
        if note:
            rows[-1] = dataclasses.replace(rows[-1], note=note)
        bar.update(1)
        if on_done:
            on_done(rows[-1])
    bar.close()
    return with_speedups(rows)  # a single_device listed after other placers is their reference too


def _search_note(meta: dict[str, Any]) -> str:
    """A planner's own note (``tp``: why no TP degree > 1), and what ``exact`` did not search: the full stage-plan
    space when too large (its ideals), and configurations or simulations left when its budget or seconds ran out
    (``meta["exhaustive"]`` false)."""
    notes = [str(meta.get("note", ""))]
    if not meta.get("ideals_complete", True):
        notes.append(str(meta.get("ideal_note", "")))
    if meta.get("exhaustive") is False:
        done, total = meta.get('configurations_searched', '?'), meta.get('configurations', '?')
        reached = (f"every one of the {total} DP x TP x PP configurations reached, not every plan in them"
                   if done == total else f"{done} of {total} DP x TP x PP configurations searched")
        notes.append(f"not exhaustive: {reached}, {meta.get('sim_calls', '?')} plans simulated before the budget or "
                     "seconds ran out")
    return "; ".join(n for n in notes if n)


def describe_plan(plan: StagePlan) -> str:
    """``S=2 x dp(4,4) x tp2 m=8 fsdp``: stages, DP degree per stage, TP degree (when > 1), micro-batches,
    sharding."""
    tp = ""
    if plan.uses_tp:
        tp = f" x tp{plan.tp[0] if len(set(plan.tp)) == 1 else tuple(plan.tp)}"
    return (f"S={plan.num_stages} x dp{tuple(plan.dp_degrees) if plan.num_stages > 1 else plan.dp_degrees[0]}{tp} "
            f"m={plan.num_microbatches} {plan.sharding}")


PIPELINE_PARTITIONERS = ("pp_uniform", "pp_params", "pp_time_dp", "pipedream")  # fixed micro-batch count


def pipeline_summary(rows: list[Row]) -> list[dict[str, Any]]:
    """Per case with pipeline rows: DP, FSDP, best hybrid, best pipeline partitioner, learned (rows whose
    placer starts with ``learned``; else a given plan, as ``given:<file>: ms (plan)``), the exhaustive optimum, the
    best plan without and with tensor parallelism over every pipeline row (``planner: ms (plan)``) and the exact
    DP x TP x PP search, each as ``ms (plan)``."""
    def cell(r: Row | None) -> str:
        if r is None:
            return "-"
        if not np.isfinite(r.step_time):
            return "too large" if r.placer == "pp_exhaustive" else "n/a"
        text = f"{r.step_time * 1e3:.2f}"
        if isinstance(r.plan, StagePlan):
            text += f" ({describe_plan(r.plan)})"
        return text + ("" if r.feasible else " does not fit")

    out = []
    for case in dict.fromkeys(r.case for r in rows if r.kind == "pipeline"):
        pipe = {r.placer: r for r in rows if r.case == case and r.kind == "pipeline"}
        parts = [pipe[n] for n in PIPELINE_PARTITIONERS if n in pipe]
        best = best_row(parts, kind="pipeline")
        learned = [r for r in pipe.values() if r.placer.startswith("learned")]
        given = [r for r in pipe.values() if r.placer.startswith("given:")]
        out.append({"case": case, "dp": cell(pipe.get("dp")), "fsdp": cell(pipe.get("fsdp")),
                    "hybrid": cell(pipe.get("hybrid")),
                    "best_pipeline": (f"{best.placer}: {cell(best)}" if best is not None else "-"),
                    "learned": cell(learned[0]) if learned else _named(given[0], cell) if given else "not run",
                    "exhaustive": cell(pipe.get("pp_exhaustive")),
                    "best_no_tp": _named(best_row([r for r in pipe.values() if not _uses_tp(r)], kind="pipeline"),
                                         cell),
                    "best_tp": _named(best_row([r for r in pipe.values() if _uses_tp(r)], kind="pipeline"), cell),
                    "exact": cell(pipe.get("exact"))})
    return out


def _uses_tp(r: Row) -> bool:
    return isinstance(r.plan, StagePlan) and r.plan.uses_tp


def _named(r: Row | None, cell: Callable[[Row | None], str]) -> str:
    return "-" if r is None else f"{r.placer}: {cell(r)}"


def best_row(rows: list[Row], kind: str | None = "placement") -> Row | None:
    """Fastest feasible row (of ``kind``), or None."""
    ok = [r for r in rows if r.feasible and np.isfinite(r.step_time) and (kind is None or r.kind == kind)]
    return min(ok, key=lambda r: r.step_time) if ok else None


def load_case(case: Case) -> tuple[CompGraph, DeviceTopology]:
    from placement_rl.graph.spec import graph_from_spec

    return graph_from_spec(case.graph), load_topology(case.topology)


def run_suite(cases: Iterable[Case], *, budget: int, seed: int = 0, placers: Iterable[str] | None = None,
              pipeline_cases: Iterable[str] = DEFAULT_PIPELINE_CASES, num_microbatches: int = 4,
              progress: bool = True, seconds: float | None = None, partitioners: Iterable[str] | None = None
              ) -> tuple[list[Row], dict[str, tuple[CompGraph, CostTable, DeviceTopology]]]:
    """Every case x every placer (and on ``pipeline_cases`` every stage planner of ``partitioners``, default
    all); returns the rows and each case's (graph, costs, topology)."""
    from tqdm.auto import tqdm

    cases = list(cases)
    pipe = set(pipeline_cases)
    rows: list[Row] = []
    problems: dict[str, tuple[CompGraph, CostTable, DeviceTopology]] = {}
    bar = tqdm(cases, desc="evaluate", unit="case", disable=not progress, dynamic_ncols=True)
    for case in bar:
        bar.set_postfix_str(case.name)
        graph, topology = load_case(case)
        costs = resolve_costs(graph, topology)
        problems[case.name] = (graph, costs, topology)
        parts = (baselines.pipeline_names() if partitioners is None else list(partitioners)) \
            if case.name in pipe else ()
        rows += compare(graph, costs, topology, budget=budget, seed=seed, case=case.name, placers=placers,
                        partitioners=parts, num_microbatches=num_microbatches, seconds=seconds)
    return rows, problems
