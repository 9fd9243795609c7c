"""``placement-rl evaluate``: compare every placer on a benchmark suite (or one case, or a given plan)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig

from placement_rl.baselines.pipeline import FASTEST_FIRST_ONLY
from placement_rl.cli.common import build_graph, build_topology, hydra_app, output_dir, write_json
from placement_rl.cli.costs import build_costs, costs_path
from placement_rl.cost import simulate, simulate_pipeline
from placement_rl.errors import ConfigError
from placement_rl.evaluate import (DEFAULT_PIPELINE_CASES, DEFAULT_SUITE, Row, best_row, compare, pipeline_summary,
                                   priced, run_suite, shown_speedups, with_speedups)
from placement_rl.graph.io import atomic_write_text
from placement_rl.plans import Placement, StagePlan
from placement_rl.report import gantt, markdown_table, speedup_bars, write_csv

COLUMNS = ("case", "kind", "placer", "step_time_ms", "speedup", "feasible", "search_seconds", "sim_calls", "note")
HEADERS = ("case", "kind", "placer", "step time (ms)", "speed-up", "feasible", "search s", "sim calls", "note")
CSV_COLUMNS = (*COLUMNS, "cost_source")  # comparison.csv: each row's case's cost source (``cost_sources``)
PIPE_COLUMNS = ("case", "dp", "fsdp", "hybrid", "best_pipeline", "learned", "exhaustive", "best_no_tp", "best_tp",
                "exact")
PIPE_HEADERS = ("case", "DP (DDP)", "FSDP", "best hybrid DP x PP", "best pipeline partitioner", "learned or given",
                "exhaustive optimum", "best without TP", "best with TP", "exact DP x TP x PP")


def table_rows(rows: list[Row]) -> list[dict]:
    """The rows as the tables show them: step time in ms, the speed-up n/a where the row or the case's single
    device does not fit (``evaluate.shown_speedups``)."""
    out = []
    for r, speedup in zip(rows, shown_speedups(rows)):
        d = r.as_dict()
        d["step_time_ms"] = r.step_time * 1e3
        d["speedup"] = speedup
        d["note"] = r.note or ""  # whole: a note says what to change
        out.append(d)
    return out


def _marked_partial(summary: list[dict], rows: list[Row]) -> list[dict]:
    """The pipeline summary with the exhaustive cell marked where ``pp_exhaustive`` searched the fastest-first
    device runs alone (unequal devices whose every order needs more than the budget): not the optimum there."""
    partial = {r.case for r in rows if r.placer == "pp_exhaustive" and FASTEST_FIRST_ONLY in (r.note or "")}
    return [{**s, "exhaustive": f"{s['exhaustive']} ({FASTEST_FIRST_ONLY})"} if s["case"] in partial else s
            for s in summary]


def comparison_tables(rows: list[Row]) -> tuple[str, str]:
    """``(full, pipeline)``: comparison.md's tables as markdown, every row and the pipeline cases' summary (empty
    without stage plans); ``scripts/bench_suite.py`` records both for docs/evaluate_suite.md."""
    summary = _marked_partial(pipeline_summary(rows), rows)
    return (markdown_table(table_rows(rows), COLUMNS, HEADERS),
            markdown_table(summary, PIPE_COLUMNS, PIPE_HEADERS) if summary else "")


def cost_sources(problems: dict) -> dict[str, str]:
    """Each case's cost source, device by device (``CostTable.describe_source``: ``gpu0=measured:c.yaml, ...``)."""
    return {case: costs.describe_source(topology.device_names) for case, (_, costs, topology) in problems.items()}


def _sources_line(problems: dict) -> str:
    """The cost sources for comparison.md's title: each distinct one, and device by device where a case's devices
    are priced by different sources (a profile for the CPU, the model for the GPUs)."""
    described = {costs.source[0] if len(set(costs.source)) == 1 else costs.describe_source(topology.device_names)
                 for (_, costs, topology) in problems.values()}
    return ", ".join(sorted(described))


# the files write_comparison writes (and timeline_<case>.png per case)
COMPARISON_FILES = ("comparison.md", "comparison.csv", "speedup.png")


def write_comparison(rows: list[Row], problems: dict, out: Path, *, title: str,
                     files: list[str] | None = None) -> str:
    """comparison.md / comparison.csv (its rows with their case's ``cost_source``) / speedup.png /
    timeline_<case>.png; returns the markdown and appends the names of the files it wrote to ``files``."""
    written = list(COMPARISON_FILES)
    trows = table_rows(rows)
    full, pipe = comparison_tables(rows)
    md = f"# {title}\n\n" + full
    if pipe:
        md += ("\n## Pipeline cases: data parallelism, sharding, DP x PP, TP\n\nms (plan: stages x DP degree x TP "
               "degree, micro-batches, dp = DDP / fsdp = sharded)\n\n" + pipe)
    atomic_write_text(out / "comparison.md", md)
    sources = cost_sources(problems)
    write_csv(out / "comparison.csv", [{**r, "cost_source": sources.get(r["case"], "")} for r in trows], CSV_COLUMNS)
    speedup_bars([r for r in trows if r["kind"] == "placement"], out / "speedup.png")
    for case, (graph, costs, topology) in problems.items():
        best = best_row([r for r in rows if r.case == case], kind=None)
        if best is None:
            continue
        sim = simulate if isinstance(best.plan, Placement) else simulate_pipeline
        res = sim(graph, costs, topology, best.plan, timeline=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in case)
        gantt(res.timeline or (), out / f"timeline_{safe}.png",
              title=f"{case}: best = {best.placer} ({best.step_time * 1e3:.3f} ms)")
        written.append(f"timeline_{safe}.png")
    if files is not None:
        files.extend(written)
    return md


@dataclass(frozen=True)
class ExtraRow:
    """A row the caller computed: its label, step time, feasibility, own seconds, simulator calls and plan."""

    label: str
    step_time: float
    feasible: bool
    seconds: float
    sim_calls: int
    plan: Any = None


def compare_learned(graph, costs, topology, out: Path, *, label: str, plan, step_time: float, feasible: bool,
                    seconds: float, sim_calls: int, seed: int, what: str, files: list[str] | None = None,
                    progress: bool = False, learned: Sequence[ExtraRow] = (), after: Sequence[ExtraRow] = (),
                    timed: Sequence[ExtraRow] = (), found: dict | None = None) -> dict:
    """Run the baselines with the learned result's simulator-call budget, append its row, write the comparison
    files (their names appended to ``files``; ``progress``: a bar over the baselines, as ``evaluate`` shows);
    return metrics (best single device, best baseline and the ratio to it, and under ``heuristics`` the step
    time, calls and seconds of ``sim_eft`` and ``eft_rollout``: the bar of a constructive policy). ``learned``:
    more of the learned result's rows (the greedy placement beside the best of k), listed before it; ``after``:
    rows listed after it that spent more calls (a search seeded by it): the baselines then get the most calls any
    row spent; ``timed``: searches held to seconds instead of calls, listed last (they do not set the budget);
    ``found``: where given, each baseline's placement or stage plan is added to it as ``<name> (baseline)`` ->
    ``step_time``, ``feasible``, ``devices`` (what ``place`` picks its fastest plan from)."""
    from tqdm.auto import tqdm

    from placement_rl import baselines

    case = f"{graph.name}/{topology.name}"
    pipeline = isinstance(plan, StagePlan)
    sim_calls_all = max([int(sim_calls)] + [int(x.sim_calls) for x in after])
    names = baselines.names()
    partitioners = baselines.pipeline_names() if pipeline else ()
    total = len(names) + ("single_device" not in names) + len(partitioners)
    with tqdm(total=total, desc=f"baselines ({max(sim_calls_all, 1)} simulator calls each)", unit="placer",
              disable=not progress, dynamic_ncols=True) as bar:
        def done(row: Row) -> None:
            bar.set_postfix_str(f"{row.placer} {row.step_time * 1e3:.3f} ms")
            bar.update(1)

        rows = compare(graph, costs, topology, budget=max(sim_calls_all, 1), seed=seed, case=case,
                       partitioners=partitioners, on_done=done)
        bar.update(total - bar.n)  # placers that cannot run on this case report no row to on_done
    single = next((r for r in rows if r.placer == "single_device"), None)
    kind = "pipeline" if pipeline else "placement"
    if found is not None:
        found.update({f"{r.placer} (baseline)": {"step_time": r.step_time, "feasible": r.feasible, "devices":
                                                 r.plan.device_of_node if isinstance(r.plan, Placement) else r.plan}
                      for r in rows if isinstance(r.plan, (Placement, StagePlan)) and math.isfinite(r.step_time)})

    def row(x: ExtraRow) -> Row:  # its speed-up: with_speedups below
        return Row(case, x.label, kind, x.step_time, float("nan"), x.feasible, x.seconds, x.sim_calls, plan=x.plan)

    base = best_row(rows, kind=None)
    own = {r.placer: {"step_time": r.step_time, "feasible": r.feasible, "sim_calls": r.sim_calls,
                      "seconds": r.search_seconds} for r in rows
           if r.placer in ("sim_eft", "eft_rollout") and math.isfinite(r.step_time)}
    rows += [row(x) for x in learned]
    rows.append(row(ExtraRow(label, step_time, feasible, seconds, sim_calls, plan)))
    rows += [row(x) for x in (*after, *timed)]
    rows = with_speedups(rows)
    write_comparison(rows, {case: (graph, costs, topology)}, out,
                     title=f"{what} vs baselines on {case} (budget {sim_calls_all} simulator calls)", files=files)
    metrics = {"best_single_device_time": float("nan") if single is None else single.step_time,
               "best_single_device_feasible": None if single is None else bool(single.feasible), "heuristics": own}
    if base is not None:
        # a placement that overflows memory has no ratio to one that fits (its step time is not one it can run at)
        metrics.update(best_baseline=base.placer, best_baseline_time=base.step_time,
                       ratio_to_best_baseline=step_time / base.step_time if feasible else None)
    return metrics


def batch_note(plan, graph) -> str:
    """A given stage plan's note where it runs another batch than its graph's (the single device's row runs the
    graph's): its step time is for its own batch, so the speed-up compares steps, not samples."""
    from placement_rl.plans import graph_batch_size

    own, at = getattr(plan, "batch_size", None), graph_batch_size(graph)
    if own is None or at is None or int(own) == int(at):
        return ""
    return (f"runs batch {int(own)}, the graph's is {at} (the single device's): the speed-up compares steps, "
            f"{int(own) / at:g} x the samples here")


def chosen_placers(placers: Sequence[str] | None, pipeline: bool) -> tuple[list[str] | None, list[str], str]:
    """``placers=`` split into the op-level placers to run (None: every one) and the stage planners, and where
    ``placers=`` is given, the line that says which planners run and why: ``placers=`` names op-level placers and
    stage planners alike; naming no planner leaves them to ``pipeline`` (true: every planner, as the suite runs;
    false: none)."""
    from placement_rl import baselines

    chosen = list(placers) if placers else None  # each kind to its own table
    planners = baselines.pipeline_names()
    ops = None if chosen is None else [p for p in chosen if p not in planners]
    named = [p for p in planners if p in (chosen or ())]
    parts = (named or planners) if pipeline else []
    if chosen is None:
        return ops, parts, ""
    if not pipeline:
        return ops, parts, "stage planners: none (pipeline=false" + (
            f"; {', '.join(named)} named in placers= not run)" if named else ")")
    if named:
        return ops, parts, f"stage planners: {', '.join(named)} (named in placers=)"
    return ops, parts, (f"stage planners: all {len(planners)} (placers= names none of them, and pipeline=true runs "
                        "every one; pipeline=false runs none, or name those to run in placers=)")


def run(cfg: DictConfig) -> list[Row]:
    out = output_dir()
    budget, seed = int(cfg.budget), int(cfg.seed)
    seconds = None if cfg.get("seconds") is None else float(cfg.seconds)
    placers, parts, line = chosen_placers(cfg.placers, bool(cfg.pipeline))
    if line:
        print(line, flush=True)
    objective = str(cfg.get("objective") or "step")
    if cfg.suite == "default" and not cfg.plan and (costs_path(cfg) or str(cfg.get("mode") or "train") != "train"
                                                     or objective != "step"):
        raise ConfigError("costs.path, mode and objective apply to one case: add suite=single (with graph=... or "
                          "graph.path=... and topology=...)")
    if cfg.suite == "default" and not cfg.plan:
        rows, problems = run_suite(DEFAULT_SUITE, budget=budget, seed=seed, placers=placers,
                                   pipeline_cases=DEFAULT_PIPELINE_CASES if parts else (), partitioners=parts,
                                   num_microbatches=int(cfg.num_microbatches), progress=bool(cfg.progress),
                                   seconds=seconds)
    elif cfg.suite in ("single", "default"):
        from placement_rl.cli.schema import check_not_files

        check_not_files(out, ("best_placement", "best_plan"), "evaluate writes the case's best plans")
        mode = str(cfg.get("mode") or "train")
        if cfg.plan:  # a plan brings its graph (graph.json beside it), topology preset and mode unless told otherwise
            from placement_rl.cli.given import (load_given, plan_graph, plan_mode, plan_objective, plan_topology,
                                                 task_overrides)
            from placement_rl.plan_files import naming_file, read_plan_file

            data, overrides = read_plan_file(str(cfg.plan)), task_overrides()
            graph = plan_graph(cfg, str(cfg.plan), overrides)
            topology, line = plan_topology(cfg, data, overrides, verb=("evaluating", "evaluates"))
            mode, mode_line = plan_mode(cfg, data, overrides)
            objective, objective_line = plan_objective(cfg, data, overrides)
            for text in (line, mode_line, objective_line):
                if text:
                    print(text)
        else:
            graph, topology = build_graph(cfg.graph), build_topology(cfg.topology)
        case = f"{graph.name}/{topology.name}"
        extra = None
        graph, costs = build_costs({"costs": cfg.get("costs"), "mode": mode}, graph, topology)
        if cfg.plan:
            plan = load_given(str(cfg.plan), data, graph, topology, line, verb="evaluate")
            with naming_file(str(cfg.plan)):  # what only pricing refuses (zb1p, interleaved rules) names the file too
                extra = (plan, priced(graph, costs, topology, plan, objective=objective))
        rows = compare(graph, costs, topology, budget=budget, seed=seed, case=case, placers=placers,
                       partitioners=parts, num_microbatches=int(cfg.num_microbatches), objective=objective,
                       seconds=seconds, progress=bool(cfg.progress))
        if extra is not None:
            plan, res = extra
            rows = with_speedups(rows + [Row(case, f"given:{Path(str(cfg.plan)).name}",
                                             "placement" if isinstance(plan, Placement) else "pipeline",
                                             float(res.step_time), float("nan"), bool(res.feasible), 0.0, 1,
                                             note=batch_note(plan, graph), plan=plan)])
        problems = {case: (graph, costs, topology)}
    else:
        raise ConfigError(f"suite is '{cfg.suite}': choose default or single")
    files: list[str] = []
    what = "" if objective == "step" else ", times are steady-state time per batch"
    modes = sorted({str(c.meta.get("mode", "train")) for (_, c, _) in problems.values()})
    held = "" if seconds is None else f" and {seconds:g} s"
    md = write_comparison(rows, problems, out, title=f"placer comparison (budget {budget} simulator calls{held}, "
                                                     f"seed {seed}, costs: {_sources_line(problems)}, mode "
                                                     f"{'/'.join(modes)}{what})", files=files)
    sources = cost_sources(problems)  # one case: its line, as `place` writes it; the suite: case -> line
    metrics = {"budget": budget, "seconds": seconds, "seed": seed, "mode": modes, "objective": objective,
               "cost_source": next(iter(sources.values())) if len(sources) == 1 else sources,
               "rows": table_rows(rows)}
    if len(problems) == 1:  # one case: its best plans as files `placement-rl deploy plan=<file>` takes
        metrics["best"] = _write_best(rows, *next(iter(problems.values())), out, files, objective=objective)
    write_json(out / "metrics.json", metrics)  # a placer that cannot run has step time NaN: null here
    print(md)
    print(f"wrote {out}: {', '.join([*files, 'metrics.json'])}")
    return rows


def _write_best(rows: list[Row], graph, costs, topology, out: Path, files: list[str], *,
                objective: str = "step") -> dict:
    """The fastest feasible op-level placement and stage plan of a single case as ``best_placement/placement.json``
    and ``best_plan/plan.json`` (each beside its ``graph.json``), each with its provenance in ``meta``
    (``_provenance``); returns their placer and step time."""
    from placement_rl.cost.modes import mode_of

    got = {}
    mode = mode_of(costs)
    for kind, folder in (("placement", "best_placement"), ("pipeline", "best_plan")):
        best = best_row([r for r in rows if r.plan is not None], kind=kind)
        if best is None:
            continue
        (out / folder).mkdir(exist_ok=True)
        plan = _provenance(best, graph, costs, topology, mode=mode, objective=objective)
        name = "placement.json" if isinstance(plan, Placement) else "plan.json"
        graph.to_json(out / folder / "graph.json")
        plan.to_json(out / folder / name, graph=graph, topology=topology)
        files.append(f"{folder}/{name}")
        got[kind] = {"placer": best.placer, "step_time": best.step_time, "file": f"{folder}/{name}"}
    return got


def _provenance(best: Row, graph, costs, topology, *, mode: str, objective: str) -> Placement | StagePlan:
    """``best.plan`` with the meta both best files carry: what its placer recorded (budget, seed, calls; a given
    plan keeps its file's, adding ``given``) less the search trace, and as priced here: ``step_time`` (one training
    step, or with ``mode`` inference one forward pass), ``feasible``, ``mode``, ``cost_source`` (what gave
    ``step_time``, device by device as metrics.json's: cost model, profile, precision as in ``calibrated:<fit>:bf16``),
    and under the throughput objective ``objective`` / ``steady_time``."""
    plan = best.plan
    if isinstance(plan, Placement):
        plan = Placement(plan.device_of_node[: graph.num_nodes], meta=plan.meta)
    res = (simulate if isinstance(plan, Placement) else simulate_pipeline)(graph, costs, topology, plan)
    meta = {k: v for k, v in plan.meta.items() if k != "trace"}
    meta.setdefault("placer", best.placer)
    if best.placer.startswith("given:"):
        meta["given"] = best.placer.split(":", 1)[1]
    meta.update(step_time=float(res.step_time), feasible=bool(res.feasible), mode=mode,
                cost_source=costs.describe_source(topology.device_names))
    if objective != "step":
        meta.update(objective=objective, steady_time=float(best.step_time))
    return Placement(plan.device_of_node, meta=meta) if isinstance(plan, Placement) else replace(plan, meta=meta)


main = hydra_app("evaluate", writes=(*COMPARISON_FILES, "metrics.json"))(run)
