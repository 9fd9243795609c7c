"""Zero-shot study (conf/experiment/zeroshot.yaml): train a family policy, place held-out models and topologies
zero-shot, fine-tuned and from scratch, next to the best baseline; write the results page.

    python scripts/zeroshot.py --mode full                     # -> docs/zeroshot.md (+ csv, png)
    python scripts/zeroshot.py --mode quick --seeds 0,1        # -> outputs/studies/quick/zeroshot.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement_rl.studies.report import read_runs  # noqa: E402
from placement_rl.studies.zeroshot import FamilyRun, ZeroShotRow, load_zeroshot, run_zeroshot  # noqa: E402
from placement_rl.studies.zeroshot_report import write_zeroshot  # noqa: E402
from placement_rl.errors import PlacementRLError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="zeroshot", help="conf/experiment/<name>.yaml")
    ap.add_argument("--mode", choices=("quick", "full"), default="quick")
    ap.add_argument("--out", default=None, help="output folder (default: docs/ for full, outputs/studies/quick/)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the mode's)")
    ap.add_argument("--budget", type=int, default=None, help="simulator calls per held-out case (default: the mode's)")
    ap.add_argument("--family-budget", type=int, default=None, help="simulator calls of the family policy")
    ap.add_argument("--work-dir", default=None, help="where family checkpoints go")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="Hydra override of the agent / encoder / env (repeatable)")
    ap.add_argument("--render-only", action="store_true",
                    help="write the page again from the saved <out>/zeroshot_runs.json (no training)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out or ("docs" if args.mode == "full" else "outputs/studies/quick"))
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--render-only"]
    command = "python scripts/zeroshot.py " + " ".join(shlex.quote(a) for a in given)
    try:
        t0 = time.perf_counter()
        spec = load_zeroshot(args.experiment, mode=args.mode, overrides=args.overrides, command=command,
                             seeds=[int(s) for s in args.seeds.split(",")] if args.seeds else None,
                             work_dir=args.work_dir, budget=args.budget, family_budget=args.family_budget)
        if args.render_only:
            rows = read_runs(out / "zeroshot_runs.json", ZeroShotRow)
            families = read_runs(out / "zeroshot_families.json", FamilyRun)
        else:
            rows, families = run_zeroshot(spec, progress=not args.no_progress)
        page = write_zeroshot(spec, rows, families, out)
        print(f"zeroshot: {len(rows)} rows in {time.perf_counter() - t0:.0f} s -> {page}", flush=True)
    except PlacementRLError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
