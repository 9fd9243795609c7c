"""Run ablation studies from ``conf/experiment/ablation_<study>.yaml`` under equal simulator-call budgets and
write their results pages (markdown, CSV, plots).

    python scripts/ablate.py encoder --mode full                  # -> docs/ablation_encoder.md (+ csv, png)
    python scripts/ablate.py all --mode quick                     # every ablation, quick budgets -> outputs/
    python scripts/ablate.py agent --mode quick --budget 300 --seeds 0,1 --set agent.n_steps=32 \
        --set agent.batch_size=32 --workers 2                   # a rollout of n_envs x 32 steps, batches of 32
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement_rl.studies.ablation import StudyFailed, run_study  # noqa: E402
from placement_rl.studies.config import experiment_names, load_study  # noqa: E402
from placement_rl.studies.report import read_failures, read_runs, study_stem, write_study  # noqa: E402
from placement_rl.errors import PlacementRLError  # noqa: E402

PREFIX = "ablation_"


def main(argv: list[str] | None = None) -> int:
    studies = [n[len(PREFIX):] for n in experiment_names() if n.startswith(PREFIX)]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", choices=[*studies, "all"], help="which ablation (conf/experiment/ablation_<study>.yaml)")
    ap.add_argument("--mode", choices=("quick", "full"), default="quick")
    ap.add_argument("--out", default=None, help="output folder (default: docs/ for full, outputs/studies/quick/)")
    ap.add_argument("--budget", type=int, default=None, help="simulator calls per run (default: the mode's)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the mode's)")
    ap.add_argument("--workers", type=int, default=1, help="parallel training processes")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="Hydra override applied to every cell (repeatable)")
    ap.add_argument("--render-only", action="store_true",
                    help="write the page again from the saved <out>/ablation_<study>_runs.json (no training)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out or ("docs" if args.mode == "full" else "outputs/studies/quick"))
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--render-only"]
    command = "python scripts/ablate.py " + " ".join(shlex.quote(a) for a in given)
    try:
        for name in studies if args.study == "all" else [args.study]:
            t0 = time.perf_counter()
            spec = load_study(PREFIX + name, mode=args.mode, budget=args.budget, seeds=seeds,
                              overrides=args.overrides, workers=args.workers,
                              command=command.replace(" all ", f" {name} ", 1))
            failures = []
            if args.render_only:
                results = read_runs(out / f"{study_stem(spec)}_runs.json")
                failures = read_failures(out / f"{study_stem(spec)}_failed.json")
            else:
                try:
                    results = run_study(spec, progress=not args.no_progress)
                except StudyFailed as exc:  # the finished runs are still written, the failed ones named
                    results, failures = exc.results, exc.failures
            page = write_study(spec, results, out, failures)
            print(f"{name}: {len(results)} runs in {time.perf_counter() - t0:.0f} s -> {page}", flush=True)
            if failures:
                more = f" (and {len(failures) - 1} more failed runs)" if len(failures) > 1 else ""
                text = f"study '{name}': {failures[0].describe()}{more}; the {len(results)} finished runs are on {page}"
                if not args.render_only:
                    raise PlacementRLError(text)
                print(f"note: {text}", file=sys.stderr)
    except PlacementRLError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
