"""The main job, timed: ``placement-rl train`` on the built-in default, its table as data.

    python scripts/bench_train.py                       # the default graph and cluster
    python scripts/bench_train.py graph=gpt topology=8x_a100_nvswitch
    python scripts/bench_train.py --cold --stem train_cold   # as the first run after an install: numba compiles

Runs the command (any overrides are passed on) in a child process, measures its wall-clock seconds and the load
while it ran, and writes ``results/train_default.json`` (``--stem``): every row of its table (kind, step time,
calls, seconds), the wall seconds, each learned row against the searches run for its seconds (``local_search``,
``la_rule_search``; ``policy_search`` too at the fine-tuned policy's), which learned rows are ahead of every
heuristic row and of ``local_search`` at their seconds, and the pair's lower bound. ``--cold`` drops the package's
numba kernel caches first (as a fresh install has none), so the run compiles every kernel: its warm-up (reported
as ``warm_up_seconds``, no row's seconds) and its wall time are the first run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stem", default="train_default")
    ap.add_argument("--cold", action="store_true", help="drop numba's kernel caches first (the first run after an install)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    from placement_rl.results import write_result

    if args.cold:  # no stamp: the child's first import drops every cached kernel (``placement_rl._jit_cache``)
        from placement_rl._jit_cache import PKG, STAMP

        (PKG / "__pycache__" / STAMP).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "placement_rl.cli.main", "train", f"hydra.run.dir={out}", *args.overrides]
        res = subprocess.run(cmd, text=True)
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()
        if res.returncode != 0:
            raise SystemExit(f"placement-rl train exited {res.returncode}")
        metrics = json.loads((out / "metrics.json").read_text())
    rows = metrics["rows"]
    learned = [r for r in rows if r["kind"] == "learned" and r["feasible"]]
    heur = [r for r in rows if r["kind"] == "heuristic" and r["feasible"]]
    best_learned = min(learned, key=lambda r: r["step_time_ms"])
    best_heur = min(r["step_time_ms"] for r in heur)
    bound = next((r for r in rows if r["kind"] == "bound"), None)
    same = []  # each learned row against the searches run for its seconds
    for r in learned:
        searches = {s["search"]: s["step_time_ms"] for s in rows
                    if s.get("same_seconds_as") == r["row"] and s["feasible"]}
        if searches:
            same.append({"learned_row": r["row"], "learned_ms": r["step_time_ms"], "seconds": r["seconds"],
                         **{f"{k}_ms": v for k, v in searches.items()},
                         "ahead_of_every_heuristic": r["step_time_ms"] < best_heur,
                         "ahead_of_local_search": r["step_time_ms"] < searches.get("local_search", float("inf")),
                         "ahead_of_every_search": r["step_time_ms"] < min(searches.values())})
    both = [x for x in same if x["ahead_of_every_heuristic"] and x["ahead_of_local_search"]]
    figures = {"wall_seconds": wall, "cold": bool(args.cold), "warm_up_seconds": metrics.get("warm_up_seconds"),
               "load_before": list(load0), "load_after": list(load1),
               "overrides": args.overrides, "graph": metrics["graph"], "topology": metrics["topology"],
               "rows": rows, "best_learned_row": best_learned["row"], "best_learned_ms": best_learned["step_time_ms"],
               "best_heuristic_ms": best_heur,
               "learned_ahead_of_every_heuristic": best_learned["step_time_ms"] < best_heur,
               "same_seconds": same,
               # a learned row ahead of every heuristic row and of local_search at its own seconds (the minimum bar),
               # and one ahead of every search run at its seconds (the project's: la_rule_search, policy_search too)
               "learned_ahead_of_heuristics_and_local_search": [x["learned_row"] for x in both],
               "learned_ahead_of_every_search": [x["learned_row"] for x in same if x["ahead_of_every_search"]],
               "lower_bound_ms": bound["step_time_ms"] if bound else None}
    path = write_result(args.stem, figures, seconds=wall,
                        command="python scripts/bench_train.py " + " ".join(
                            (["--cold", "--stem", args.stem] if args.cold else []) + args.overrides))
    print(f"placement-rl train: {wall:.1f} s wall (load {load0[0]:.1f} -> {load1[0]:.1f}); best learned "
          f"{best_learned['step_time_ms']:.3f} ms ({best_learned['row']}), best heuristic {best_heur:.3f} ms")
    for x in same:
        print(f"  {x['learned_row']} ({x['seconds']:.2f} s): {x['learned_ms']:.3f} ms; at its seconds "
              + ", ".join(f"{k[:-3]} {v:.3f} ms" for k, v in x.items() if k.endswith("_ms") and k != "learned_ms"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
