"""The main job, timed: ``placement-rl train`` on the built-in default, its table as data.

    python scripts/bench_train.py                       # the default graph and cluster
    python scripts/bench_train.py graph=gpt topology=8x_a100_nvswitch

Runs the command (any overrides are passed on) in a child process, measures its wall-clock seconds and the load
while it ran, and writes ``results/train_default.json`` (``--stem``): every row of its table (kind, step time,
calls, seconds), the wall seconds, whether a learned row is ahead of every heuristic row and of ``local_search``
at the same seconds, and the pair's lower bound.
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
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    from placement_rl.results import write_result

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
    local = next((r for r in rows if r["row"].startswith("local_search at")), None)
    bound = next((r for r in rows if r["kind"] == "bound"), None)
    figures = {"wall_seconds": wall, "load_before": list(load0), "load_after": list(load1),
               "overrides": args.overrides, "graph": metrics["graph"], "topology": metrics["topology"],
               "rows": rows, "best_learned_row": best_learned["row"], "best_learned_ms": best_learned["step_time_ms"],
               "best_heuristic_ms": min(r["step_time_ms"] for r in heur),
               "learned_ahead_of_every_heuristic": best_learned["step_time_ms"] < min(r["step_time_ms"] for r in heur),
               "local_search_same_seconds_ms": local["step_time_ms"] if local else None,
               "learned_ahead_of_local_search": (best_learned["step_time_ms"] < local["step_time_ms"]) if local else None,
               "lower_bound_ms": bound["step_time_ms"] if bound else None}
    path = write_result(args.stem, figures, seconds=wall,
                        command="python scripts/bench_train.py " + " ".join(args.overrides))
    print(f"placement-rl train: {wall:.1f} s wall (load {load0[0]:.1f} -> {load1[0]:.1f}); best learned "
          f"{best_learned['step_time_ms']:.3f} ms ({best_learned['row']}); local search at the same seconds "
          f"{figures['local_search_same_seconds_ms']}; wrote {path}")


if __name__ == "__main__":
    main()
