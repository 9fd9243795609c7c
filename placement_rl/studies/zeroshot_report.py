"""Zero-shot study outputs: ``zeroshot.md`` with the per-case table, ``zeroshot_runs.csv``,
``zeroshot_summary.csv``, ``zeroshot_relative.png`` (step time / best baseline per method and case) and
``zeroshot_curves.png`` (fine-tune vs scratch best-so-far, zero-shot and baseline as lines)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from placement_rl.studies.stats import band, mean_std, step_curve
from placement_rl.studies.report import _plt, fmt_pm, pm, save_figure, tied, write_runs
from placement_rl.studies.zeroshot import METHODS, FamilyRun, ZeroShotRow, ZeroShotSpec
from placement_rl.graph.io import atomic_write_text
from placement_rl.report import markdown_table, write_csv

__all__ = ["summarise_zeroshot", "write_zeroshot"]

STEM = "zeroshot"
RUN_COLUMNS = ("case", "held_out", "seed", "method", "placer", "step_time_ms", "feasible", "ratio_to_best_baseline",
               "best_baseline_ms", "sim_calls", "seconds")


def summarise_zeroshot(rows: Sequence[ZeroShotRow], cases: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (case, method): mean and std over seeds."""
    out = []
    for case in cases:
        for method in METHODS:
            rs = [r for r in rows if r.case == case and r.method == method]
            if not rs:
                continue
            row: dict[str, Any] = {"case": case, "held_out": rs[0].held_out, "method": method, "seeds": len(rs),
                                   "seed_list": " ".join(str(r.seed) for r in rs),
                                   "placers": " ".join(sorted(set(r.placer for r in rs))),
                                   "feasible_runs": sum(r.feasible for r in rs)}
            for key, vals in (("step_time_ms", [r.step_time * 1e3 if r.feasible else np.nan for r in rs]),
                              ("ratio", [r.ratio for r in rs]), ("seconds", [r.seconds for r in rs]),
                              ("sim_calls", [r.sim_calls for r in rs])):
                row[f"{key}_mean"], row[f"{key}_std"] = mean_std(vals)
            out.append(row)
    return out


def relative_plot(rows: Sequence[ZeroShotRow], cases: Sequence[str], path: str | os.PathLike) -> Path:
    plt = _plt()
    methods = [m for m in METHODS if m != "baseline"]
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(cases)), 4))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        for i, c in enumerate(cases):
            vals = np.array([r.ratio for r in rows if r.case == c and r.method == m], dtype=float)
            ok = vals[np.isfinite(vals)]
            if not ok.size:
                continue
            x = i + (j - (len(methods) - 1) / 2) * width
            ax.bar(x, ok.mean() - 1.0, width, bottom=1.0, yerr=ok.std(ddof=1) if ok.size > 1 else 0, color=f"C{j}", alpha=0.8,
                   capsize=3, label=m if i == 0 else None)
            ax.plot(np.full(ok.size, x), ok, "k.", ms=3)
    ax.axhline(1.0, color="k", lw=0.9)
    ax.set_xticks(range(len(cases)), list(cases), fontsize=8)
    ax.set_ylabel("step time / best baseline (same budget)")
    ax.set_title("held-out cases: below 1 is faster than the best baseline (mean ± std; dots: seeds)", fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def curves_plot(rows: Sequence[ZeroShotRow], cases: Sequence[str], budget: int, path: str | os.PathLike) -> Path:
    plt = _plt()
    grid = np.linspace(0, budget, 201)
    cols = min(2, len(cases))
    nrows = int(np.ceil(len(cases) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 3.8 * nrows), squeeze=False)
    for k, c in enumerate(cases):
        ax = axes[k // cols][k % cols]
        for j, m in enumerate(("fine-tune", "scratch")):
            runs = [r for r in rows if r.case == c and r.method == m]
            if not runs:
                continue
            mean, std = band(np.stack([step_curve(r.curve, grid) for r in runs]) * 1e3)
            ax.plot(grid, mean, color=f"C{j + 1}", label=m)
            ax.fill_between(grid, mean - std, mean + std, color=f"C{j + 1}", alpha=0.18, lw=0)
        zs = [r.step_time * 1e3 for r in rows if r.case == c and r.method == "zero-shot" and r.feasible]
        if zs:
            ax.axhline(np.mean(zs), color="C0", lw=1.2, label="zero-shot (mean)")
        bs = [r for r in rows if r.case == c and r.method == "baseline" and r.feasible]
        if bs:
            ax.axhline(np.mean([r.step_time for r in bs]) * 1e3, color="k", ls="--", lw=1,
                       label=f"best baseline ({bs[0].placer})")
        ax.set_title(c, fontsize=9)
        ax.set_xlim(0, budget)
        ax.set_xlabel("simulator calls on the case")
        ax.set_ylabel("best step time so far (ms)")
        ax.legend(fontsize=7)
    for k in range(len(cases), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    return save_figure(fig, path)


def write_zeroshot(spec: ZeroShotSpec, rows: Sequence[ZeroShotRow], families: Sequence[FamilyRun],
                   out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    cases = [c.name for c in spec.cases]
    summary = summarise_zeroshot(rows, cases)
    write_runs(out / f"{STEM}_runs.json", rows)
    write_runs(out / f"{STEM}_families.json", families)
    write_csv(out / f"{STEM}_runs.csv", [r.as_dict() for r in rows], RUN_COLUMNS)
    cols = ["case", "held_out", "method", "seeds", "seed_list", "placers", "feasible_runs"] + [
        f"{k}_{s}" for k in ("step_time_ms", "ratio", "seconds", "sim_calls") for s in ("mean", "std")]
    write_csv(out / f"{STEM}_summary.csv", summary, cols)
    relative_plot(rows, cases, out / f"{STEM}_relative.png")
    curves_plot(rows, cases, spec.budget, out / f"{STEM}_curves.png")
    table = [{"case": r["case"], "held": r["held_out"], "method": r["method"] if r["method"] != "baseline"
              else f"best baseline ({r['placers']})", "step": pm(r, "step_time_ms", 4),
              "ratio": pm(r, "ratio"), "secs": pm(r, "seconds"),
              "calls": f"{r['sim_calls_mean']:.0f}", "ok": f"{r['feasible_runs']}/{r['seeds']}"} for r in summary]
    fam_s, fam_sd = mean_std([f.seconds for f in families])
    fam_sd = fam_sd if len(families) > 1 else float("nan")  # one seed: no spread to show
    t = spec.template
    lines = [
        "# Zero-shot placement of unseen models and topologies", "",
        "Does a policy trained on a family of graphs place models and clusters it has never seen? For each seed a "
        "family policy is trained, then every held-out case is placed four ways: **zero-shot** (the family policy, "
        f"one greedy + up to {spec.samples} sampled rollouts while they fit the budget, no training), **fine-tune** "
        f"(the family policy trained on the case for {spec.budget} simulator calls), **scratch** (a fresh policy, "
        "same budget) and the **best baseline** (every non-learned placer with the same budget and seed). The "
        "greedy rollout always runs: where it alone takes more calls than the budget, the *simulator calls* column "
        "shows them.", "",
        f"Mode **{spec.mode}**, seeds {', '.join(map(str, spec.seeds))}. Agent {t.agent.algo}, encoder "
        f"{t.encoder.name} (hidden {t.encoder.hidden}, {t.encoder.layers} layers), env {t.env_id.split('/')[-1]}. "
        "Step times are simulated by the cost model (the calibrated GPU model for GPUs, the roofline for other "
        "devices, measured profiles where given).", "",
        "Reproduce:", "", "```bash", spec.command or f"python scripts/zeroshot.py --mode {spec.mode}", "```", "",
        "## Family", "",
        f"* {spec.family_count} synthetic graphs ({', '.join(spec.family_synthetic)}; {spec.family_nodes[0]}-"
        f"{spec.family_nodes[1]} nodes, drawn per seed) + zoo models {', '.join(spec.family_zoo) or 'none'} "
        "(coarsened).",
        f"* Topologies: {', '.join(spec.train_topologies)}.",
        f"* Budget {spec.family_budget} simulator calls per seed; training wall-clock {fmt_pm(fam_s, fam_sd)} s "
        "(not included in the fine-tune times below).", "",
        "## Findings", "", *[f"* {f}" for f in zeroshot_findings(summary, cases)], "",
        "## Results (mean ± std over seeds)", "",
        markdown_table(table, ["case", "held", "method", "step", "ratio", "secs", "calls", "ok"],
                       ["case", "held out", "method", "step time (ms)", "vs best baseline", "wall-clock to placement (s)",
                        "simulator calls", "feasible"]),
        "*Wall-clock to placement*: zero-shot = loading the policy and its rollouts; fine-tune / scratch = training "
        "on the case until the budget is spent; baseline = the best placer's search time. Below 1 in *vs best "
        "baseline* is faster than the best non-learned placer.", "",
        f"![relative step time]({STEM}_relative.png)", "", f"![curves]({STEM}_curves.png)", "",
        f"Per-run numbers: [{STEM}_runs.csv]({STEM}_runs.csv); summary: [{STEM}_summary.csv]({STEM}_summary.csv).", ""]
    return atomic_write_text(out / f"{STEM}.md", "\n".join(lines))


def zeroshot_findings(summary: Sequence[dict[str, Any]], cases: Sequence[str]) -> list[str]:
    out = []
    for c in cases:
        by = {r["method"]: r for r in summary if r["case"] == c}
        if not by:
            continue
        parts = [f"{m} {by[m]['ratio_mean']:.3g}x" for m in ("zero-shot", "fine-tune", "scratch") if m in by]
        learned = [m for m in ("zero-shot", "fine-tune", "scratch") if m in by and np.isfinite(by[m]["ratio_mean"])]
        first = tied(learned, lambda m: by[m]["ratio_mean"])
        if not learned:
            verdict = "no learned method found a feasible placement"
        elif len(learned) == 1:
            verdict = f"only {learned[0]} found a feasible placement"
        elif len(first) == len(learned):
            verdict = f"the learned methods tie ({' = '.join(first)})"
        else:
            verdict = f"best learned method: {' and '.join(first)}" + (" (tied)" if len(first) > 1 else "")
        out.append(f"**{c}** (held out: {next(iter(by.values()))['held_out']}): {', '.join(parts)} the best baseline; "
                   f"{verdict}.")
    zs = [r["ratio_mean"] for r in summary if r["method"] == "zero-shot" and np.isfinite(r["ratio_mean"])]
    sc = [r["ratio_mean"] for r in summary if r["method"] == "scratch" and np.isfinite(r["ratio_mean"])]
    ft = [r["ratio_mean"] for r in summary if r["method"] == "fine-tune" and np.isfinite(r["ratio_mean"])]
    if zs and sc and ft:
        out.append(f"Averaged over cases: zero-shot {np.mean(zs):.3g}x, fine-tune {np.mean(ft):.3g}x, scratch "
                   f"{np.mean(sc):.3g}x the best baseline; cases where zero-shot beats scratch: "
                   f"{sum(z < s for z, s in zip(zs, sc))} of {len(zs)}; fine-tune beats scratch: "
                   f"{sum(f < s for f, s in zip(ft, sc))} of {len(ft)}.")
    return out
