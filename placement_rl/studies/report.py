"""Study outputs: per-run and per-cell CSVs, a markdown results page, learning curves with spread and bars of
step time relative to the best baseline.

``write_study(spec, results, out_dir)`` writes ``<stem>.md``, ``<stem>_runs.csv``, ``<stem>_summary.csv``,
``<stem>_curves.png``, ``<stem>_relative.png`` and ``<stem>_runs.json`` (every run with its curve, read back by
``read_runs`` to render a page again) (stem ``ablation_<name>``) and returns the page path. Runs that failed
(``StudyFailed``) are named on the page and kept in ``<stem>_failed.json`` (``read_failures``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.studies.ablation import RunFailure, RunResult, StudySpec
from placement_rl.studies.stats import curve_band, summarise
from placement_rl.errors import ConfigError
from placement_rl.graph.io import atomic_write_text
from placement_rl.report import markdown_table, write_csv

__all__ = ["curves_plot", "fmt_pm", "read_failures", "read_runs", "relative_bars", "save_figure", "study_stem",
           "tied", "write_runs", "write_study"]

RUN_COLUMNS = ("cell", "seed", "step_time_ms", "feasible", "greedy_time_ms", "ratio_to_best_baseline",
               "speedup_over_single", "best_baseline", "best_baseline_ms", "single_device_ms", "sim_calls",
               "budget", "episodes", "train_seconds")


def study_stem(spec: StudySpec) -> str:
    return f"ablation_{spec.name}"


def fmt_pm(mean: float, std: float, digits: int = 3) -> str:
    """``mean ± std`` with ``digits`` significant digits (``n/a`` when not finite)."""
    if not np.isfinite(mean):
        return "n/a"
    return f"{mean:.{digits}g} ± {std:.2g}" if np.isfinite(std) else f"{mean:.{digits}g}"


def pm(row: dict, key: str, digits: int = 3) -> str:
    """A study row's ``key`` as ``mean ± std`` over its seeds; the mean alone for one seed (no spread to show)."""
    return fmt_pm(row[f"{key}_mean"], row[f"{key}_std"] if row.get("seeds", 2) > 1 else float("nan"), digits)


def tied(names: Sequence[str], value: Any, rel: float = 1e-9) -> list[str]:
    """The names whose ``value(name)`` is the least (within ``rel``): one name, or all that tie for it."""
    if not names:
        return []
    low = min(value(n) for n in names)
    return [n for n in names if value(n) <= low + rel * abs(low)]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Save through a temporary file and a rename (never a half-written PNG), then close the figure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)
    _plt().close(fig)
    return path


def draw_anytime(ax: Any, traces: Mapping[str, Sequence], seconds: float) -> None:
    """On ``ax``: best step time (ms) found over wall-clock seconds (log scale), one step line per method
    (``traces``: method -> ``[seconds, calls, best step time]`` at each improvement, as
    ``baselines.common.Problem`` records them), each held to its last value until ``seconds``."""
    for name, tr in traces.items():
        if not len(tr):
            continue
        x = [max(float(e[0]), 1e-4) for e in tr] + [max(float(seconds), float(tr[-1][0]))]
        y = [float(e[2]) * 1e3 for e in tr] + [float(tr[-1][2]) * 1e3]
        ax.step(x, y, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("seconds")


def anytime_plot(traces: dict[str, Sequence], seconds: float, path: str | os.PathLike, *, title: str = "",
                 reference: tuple[str, float] | None = None) -> Path:
    """``draw_anytime`` in a figure of its own, with ``reference`` (a label and a step time, e.g. the learned
    plan's) dashed and the y range on the end game (a poor first start would flatten it)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    draw_anytime(ax, traces, seconds)
    ref = reference[1] * 1e3 if reference is not None and np.isfinite(reference[1]) else None
    if ref is not None:
        ax.axhline(ref, color="grey", ls="--", lw=1, label=reference[0])
    finals = [float(tr[-1][2]) * 1e3 for tr in traces.values() if len(tr)]
    if finals:
        ax.set_ylim(0.98 * min(finals), max(1.15 * min(finals), 1.05 * (ref or 0.0)))
    ax.set_ylabel("best step time (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def curves_plot(results: Sequence[RunResult], cells: Sequence[str], budget: int, path: str | os.PathLike, *,
                title: str = "") -> Path:
    """Best-so-far step time (mean ± std over seeds) against simulator calls, one line per cell, with each
    case's best baseline (same budget) dashed. Cells on different cases get a panel each."""
    plt = _plt()
    grid = np.linspace(0, budget, 201)
    base = {c: float(np.nanmean([r.baseline_time for r in results if r.cell == c])) for c in cells}
    shared = len({round(b, 12) for b in base.values() if np.isfinite(b)}) <= 1
    panels = [list(cells)] if shared else [[c] for c in cells]
    cols = min(3, len(panels))
    rows_n = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.2 * cols if not shared else 8, 3.6 * rows_n if not shared else 4.5),
                             squeeze=False)
    for k, group in enumerate(panels):
        ax = axes[k // cols][k % cols]
        for j, c in enumerate(group):
            i = list(cells).index(c)
            mean, std = curve_band(results, c, grid)
            ax.plot(grid, mean * 1e3, color=f"C{i % 10}", lw=1.6, label=c)
            ax.fill_between(grid, (mean - std) * 1e3, (mean + std) * 1e3, color=f"C{i % 10}", alpha=0.18, lw=0)
        b = base[group[0]]
        if np.isfinite(b):
            name = next(r.baseline for r in results if r.cell == group[0])
            ax.axhline(b * 1e3, color="k", ls="--", lw=1, label=f"best baseline ({name})")
        ax.set_xlim(0, budget)
        ax.set_xlabel("simulator calls")
        ax.set_ylabel("best step time so far (ms)")
        ax.set_title(group[0] if not shared else (title or ""), fontsize=9)
        ax.legend(fontsize=7)
    for k in range(len(panels), rows_n * cols):
        axes[k // cols][k % cols].axis("off")
    if not shared and title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def relative_bars(results: Sequence[RunResult], cells: Sequence[str], path: str | os.PathLike, *,
                  title: str = "", ylabel: str = "step time / best baseline (same budget)") -> Path:
    """Mean ± std over seeds of each cell's step time relative to the best baseline; dots are seeds."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(cells) + 2), 4))
    for i, c in enumerate(cells):
        vals = np.array([r.ratio for r in results if r.cell == c], dtype=float)
        ok = vals[np.isfinite(vals)]
        if ok.size:
            # bars grow from 1 (the baseline) so above / below the baseline reads at a glance
            ax.bar(i, ok.mean() - 1.0, bottom=1.0, yerr=ok.std(ddof=1) if ok.size > 1 else 0.0, color=f"C{i % 10}",
                   alpha=0.75, capsize=4)
            ax.plot(np.full(ok.size, i) + np.linspace(-0.15, 0.15, ok.size), ok, "k.", ms=4)
        if ok.size < vals.size:
            ax.text(i, 1.0, f"{vals.size - ok.size} infeasible", ha="center", fontsize=7, rotation=90)
    ax.axhline(1.0, color="k", lw=0.9)
    ax.set_xticks(range(len(cells)), list(cells), rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title or "below 1: faster than the best baseline")
    lo = min([r.ratio for r in results if np.isfinite(r.ratio)] + [1.0])
    hi = max([r.ratio for r in results if np.isfinite(r.ratio)] + [1.0])
    pad = 0.05 * max(hi - lo, 0.02)
    ax.set_ylim(max(0.0, lo - pad), hi + pad)
    return save_figure(fig, path)


def findings(rows: Sequence[Mapping[str, Any]], budget: int | None = None) -> list[str]:
    """Plain statements read off the summary (no interpretation)."""
    ok = [r for r in rows if np.isfinite(r["ratio_mean"])]
    if not rows:
        return ["No run finished."]
    if not ok:
        return ["No run found a feasible placement."]
    by = {r["cell"]: r for r in ok}
    best = tied(list(by), lambda c: by[c]["ratio_mean"])
    worst = tied(list(by), lambda c: -by[c]["ratio_mean"])
    b = by[best[0]]
    base = f"({b['best_baseline']}, {b['baseline_ms_mean']:.4g} ms)"
    names = " and ".join(f"**{c}**" for c in best)
    if len(ok) == 1:
        which = "Only cell with a result" if len(rows) == 1 else "Only cell with a feasible placement"
        first = f"{which}: {names}, {pm(b, 'ratio')} x the best baseline {base}."
    elif len(best) == len(ok):
        first = f"All {len(ok)} cells tie: {pm(b, 'ratio')} x the best baseline {base}."
    else:
        first = (f"Best cell{'s (tied)' if len(best) > 1 else ''}: {names}, {pm(b, 'ratio')} x the best baseline "
                 f"{base}; worst{' (tied)' if len(worst) > 1 else ''}: {' and '.join(f'**{c}**' for c in worst)}, "
                 f"{pm(by[worst[0]], 'ratio')} x.")
    runs = sum(r["seeds"] for r in rows)
    wins = sum(r["beats_baseline"] for r in rows)
    out = [first,
           f"{wins} of {runs} runs ({sum(r['ratio_mean'] < 1 for r in ok)} of {len(rows)} cells on average) beat the "
           f"best baseline under the same simulator-call budget.",
           "Speed-up over the best single device: "
           + ", ".join(f"{r['cell']} {r['speedup_mean']:.3g}x" for r in ok) + "."]
    greedy = [r for r in ok if np.isfinite(r["greedy_time_ms_mean"])]
    if greedy:
        gap = np.mean([r["greedy_time_ms_mean"] / r["step_time_ms_mean"] for r in greedy])
        out.append(f"The trained policy's greedy rollout is {gap:.3g}x the best placement seen in training on "
                   "average (above 1: the policy alone does not reproduce its best sample).")
    short = [r for r in rows if budget is not None and r["sim_calls_mean"] < budget]
    if short:
        out.append("Stopped at the env-step cap before spending the budget (the policy stopped moving nodes, and "
                   "unmoved nodes cost no simulator call): " + ", ".join(
                       f"{r['cell']} ({r['sim_calls_mean']:.0f} calls on average)" for r in short) + ".")
    return out


def _case_lines(spec: StudySpec) -> list[str]:
    lines = []
    for c in spec.cells:
        g = dict(c.graph)
        gname = g.get("name") or g.get("family") or g.get("path")
        coarse = g.get("coarsen") or {}
        extra = f", coarsen max_nodes={coarse.get('max_nodes')}" if coarse.get("enabled") else ""
        opts = ", ".join(f"{k}={v}" for k, v in dict(c.env_options).items())
        lines.append(f"| {c.name} | {gname}{extra} | {c.topology} | {c.env_id.split('/')[-1]}"
                     f"{f' ({opts})' if opts else ''} | {c.agent.algo} | {c.encoder.name} "
                     f"(hidden {c.encoder.hidden}, {c.encoder.layers} layers) |")
    return ["| cell | graph | topology | env | agent | encoder |", "|---|---|---|---|---|---|", *lines]


def write_runs(path: str | os.PathLike, results: Sequence[Any]) -> Path:
    """Every run (dataclass) with its learning curve as JSON, so pages can be rendered again without training."""
    def plain(x: Any) -> Any:
        return x.item() if isinstance(x, np.generic) else str(x)

    return atomic_write_text(path, json.dumps([dataclasses.asdict(r) for r in results], indent=0, default=plain))


def read_runs(path: str | os.PathLike, cls: type = RunResult) -> list[Any]:
    """Runs written by ``write_runs`` (``cls``: ``RunResult`` or ``ZeroShotRow``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"no saved runs at '{p}': run the study first")
    try:
        items = json.loads(p.read_text())
        return [cls(**({**d, "curve": tuple((int(c), float(v)) for c, v in d["curve"])} if "curve" in d else d))
                for d in items]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"'{p}' does not hold saved study runs ({exc})") from None


def read_failures(path: str | os.PathLike) -> list[RunFailure]:
    """The failed runs ``write_study`` kept beside the runs (none when the file is absent: every run finished)."""
    p = Path(path)
    if not p.is_file():
        return []
    try:
        return [RunFailure(**d) for d in json.loads(p.read_text())]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"'{p}' does not hold failed study runs ({exc})") from None


def _failure_lines(spec: StudySpec, failures: Sequence[RunFailure]) -> list[str]:
    if not failures:
        return []
    total = len(spec.cells) * len(spec.seeds)
    return ["## Failed runs", "", f"{len(failures)} of {total} runs failed and are left out of every table and "
            "figure on this page:", "", *[f"* {f.describe()}" for f in failures], ""]


def write_study(spec: StudySpec, results: Sequence[RunResult], out_dir: str | os.PathLike,
                failures: Sequence[RunFailure] = ()) -> Path:
    out = Path(out_dir)
    stem = study_stem(spec)
    write_runs(out / f"{stem}_runs.json", results)
    failed = out / f"{stem}_failed.json"
    if failures:
        write_runs(failed, failures)
    elif failed.exists():
        failed.unlink()  # from an earlier run of the study: every run finished this time
    ran = {r.cell for r in results}
    cells = [c.name for c in spec.cells if c.name in ran]
    rows = summarise(results, cells)
    write_csv(out / f"{stem}_runs.csv", [r.as_dict() for r in results], RUN_COLUMNS)
    summary_cols = ["cell", "seeds", "seed_list", "feasible_runs", "beats_baseline", "best_baseline"] + [
        f"{k}_{s}" for k in ("step_time_ms", "ratio", "speedup", "greedy_time_ms", "baseline_ms", "single_ms",
                             "train_seconds", "sim_calls") for s in ("mean", "std")]
    write_csv(out / f"{stem}_summary.csv", rows, summary_cols)
    figures = []
    if cells:
        curves_plot(results, cells, spec.budget, out / f"{stem}_curves.png",
                    title=f"{spec.title}: best so far, mean ± std over {len(spec.seeds)} seeds")
        relative_bars(results, cells, out / f"{stem}_relative.png", title=f"{spec.title} (mean ± std; dots: seeds)")
        figures = [f"![learning curves]({stem}_curves.png)", "", f"![relative step time]({stem}_relative.png)", ""]
    table = [{"cell": r["cell"], "step": pm(r, "step_time_ms", 4), "ratio": pm(r, "ratio"),
              "speedup": pm(r, "speedup"), "greedy": pm(r, "greedy_time_ms", 4),
              "base": f"{r['best_baseline']} {r['baseline_ms_mean']:.4g}",
              "wins": f"{r['beats_baseline']}/{r['seeds']}", "secs": pm(r, "train_seconds"),
              "seeds": r["seed_list"]} for r in rows]
    judged = ("placements of the coarsened graph are expanded to the uncoarsened graph and simulated there; the "
              "baselines run on the uncoarsened graph" if spec.judge == "original" else
              "placements are simulated on the cell's graph")
    lines = [f"# {spec.title}", "", spec.question, "",
             f"Mode **{spec.mode}**: {len(spec.cells)} cells x {len(spec.seeds)} seeds, an equal budget of "
             f"**{spec.budget} simulator calls** per run (the baselines get the same budget and seed). "
             "Step times are simulated by the cost model (the calibrated GPU model for GPUs, the roofline for "
             f"other devices, measured profiles where given); {judged}.",
             "", "Reproduce:", "", "```bash", spec.command or f"python scripts/ablate.py {spec.name} --mode {spec.mode}",
             "```", "", *_failure_lines(spec, failures),
             "## Findings", "", *[f"* {f}" for f in findings(rows, spec.budget)], "",
             "## Results (mean ± std over seeds)",
             "", markdown_table(table, ["cell", "step", "ratio", "speedup", "greedy", "base", "wins", "secs", "seeds"],
                                [spec.factor, "step time (ms)", "vs best baseline", "speed-up vs 1 device",
                                 "greedy policy (ms)", "best baseline (ms)", "beats baseline", "train wall (s)",
                                 "seeds"]),
             "Columns: *step time* is the best placement found within the budget; *vs best baseline* divides it by "
             "the best non-learned placer's step time for the same seed and budget (below 1 is better); *greedy "
             "policy* is one deterministic rollout of the trained policy afterwards (not charged to the budget); "
             "std is the sample standard deviation over seeds.", "",
             *figures, "## Cells", "", *_case_lines(spec), "",
             f"Per-run numbers: [{stem}_runs.csv]({stem}_runs.csv); per-cell: [{stem}_summary.csv]({stem}_summary.csv).",
             ""]
    return atomic_write_text(out / f"{stem}.md", "\n".join(lines))
