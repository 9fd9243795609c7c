"""The benchmark suite's headline figures as data -> results/evaluate_suite.json.

    python scripts/bench_suite.py [--budget 5000] [--seed 0]

Runs what ``placement-rl evaluate`` runs by default (every placer and stage planner on
``placement_rl.evaluate.DEFAULT_SUITE`` under an equal simulator-call budget) and writes, per case, the best single
device, the best op-level placement, the best stage plan and the exhaustive optimum where one exists, each with
its step time (ms), placers and speed-up; ``scripts/render.py`` renders the README's table from it. It also
records ``placement-rl evaluate``'s two comparison tables (every row; the pipeline cases' summary), which
``scripts/render.py`` puts in docs/evaluate_suite.md, and draws docs/evaluate_speedup.png from the same rows.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from placement_rl.cli.evaluate import comparison_tables, table_rows
from placement_rl.evaluate import DEFAULT_PIPELINE_CASES, DEFAULT_SUITE, Row, best_row, run_suite
from placement_rl.report import speedup_bars
from placement_rl.results import write_result


def _ms(x: float) -> float | None:
    return round(1e3 * x, 2) if math.isfinite(x) else None


def case_figures(rows: list[Row]) -> dict:
    """One case's headline: best single device, best op-level placement and stage plan (ms, names, speed-up)."""
    single = next((r for r in rows if r.placer == "single_device"), None)
    out: dict = {"single_device_ms": _ms(single.step_time) if single else None,
                 "single_device_fits": bool(single.feasible) if single else None}
    for kind, key in (("placement", "placement"), ("pipeline", "stage_plan")):
        best = best_row(rows, kind)
        if best is None:
            out[key] = None
            continue
        tied = sorted(r.placer for r in rows if r.kind == kind and r.feasible
                      and math.isclose(r.step_time, best.step_time, rel_tol=1e-9))
        out[key] = {"ms": _ms(best.step_time), "placers": tied, "speedup": round(best.speedup, 3),
                    "sim_calls": int(best.sim_calls)}
    exhaustive = {r.kind: _ms(r.step_time) for r in rows if r.placer in ("exhaustive", "pp_exhaustive")
                  and r.feasible and math.isfinite(r.step_time)}  # NaN: too many plans for the budget
    out["exhaustive_ms"] = exhaustive or None
    out["heuristics"] = {r.placer: {"ms": _ms(r.step_time), "sim_calls": int(r.sim_calls)} for r in rows
                         if r.placer in ("sim_eft", "eft_rollout") and r.kind == "placement"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=5000, help="simulator calls per placer (placement-rl evaluate's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.budget < 1:
        print(f"error: --budget must be >= 1, got {args.budget}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows, problems = run_suite(DEFAULT_SUITE, budget=args.budget, seed=args.seed,
                               pipeline_cases=DEFAULT_PIPELINE_CASES, progress=True)  # a bar over the cases
    cases = {name: case_figures([r for r in rows if r.case == name]) for name in problems}
    sources = sorted({s for (_, costs, _) in problems.values() for s in costs.source})
    full, pipe = comparison_tables(rows)
    path = write_result("evaluate_suite", {"budget": args.budget, "seed": args.seed, "cost_sources": sources,
                                           "cases": cases, "tables": {"full": full, "pipeline": pipe}},
                        seconds=round(time.perf_counter() - start, 1), sim_calls=sum(r.sim_calls for r in rows),
                        command=" ".join(["python scripts/bench_suite.py", *sys.argv[1:]]))
    plot = Path(__file__).resolve().parent.parent / "docs" / "evaluate_speedup.png"
    speedup_bars([r for r in table_rows(rows) if r["kind"] == "placement"], plot)
    print(f"wrote {path} and {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
