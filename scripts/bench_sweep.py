"""Sweeps on the workers: one Hydra multirun of ``placement-rl train`` (``--seeds`` seeds of a small fine-tuning of
the shipped policy) with Hydra's basic launcher (the jobs one by one in one process) and with
``hydra/launcher=ray_workers`` on ``--workers`` Ray workers (``placement_rl.cli.sweep``).

    python scripts/bench_sweep.py                 # 4 seeds, 2 workers: a few minutes on 2 cores
    python scripts/bench_sweep.py --joblib        # Hydra's joblib launcher as well (train's default for -m)

Each sweep is the real command line in a subprocess, timed from start to exit (so the Ray side pays its start,
the workers' imports and the code check), on one snapshot of the package (``scale_code.stage_package``). The results of every job are compared file by file
(``placement_rl.cli.sweep.sweep_results``: every file but logs, Hydra's own launcher record and measured
seconds). The last line reads ``speed-up <x>`` and ``identical`` (or ``NOT identical``); the figures go to
``results/bench_sweep.json`` (``bench_sweep_ray_running`` when a Ray instance was already running on the machine:
the sweep's workers run on a private instance of their own, never on it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from placement_rl.cli.sweep import sweep_results  # noqa: E402
from placement_rl.results import write_result  # noqa: E402
from placement_rl.scale_code import stage_package  # noqa: E402
from placement_rl.scale_ray import other_instances  # noqa: E402

# a small fine-tuning on a 150-node dataflow graph, about 15 s a job on one core of this machine; no wall-clock
# budgets (the search rounds and the equal-seconds rows are off), so the jobs compute the same whatever the load
TRAIN = ["graph=synthetic", "graph.family=dataflow", "graph.num_nodes=150", "topology=4x_v100_nvlink",
         "agent.rl_iters=30", "agent.samples=16", "agent.eval_samples=16", "agent.search_budget=200",
         "agent.ft_search_rounds=0", "agent.equal_seconds=false",
         "trainer.compare=false", "trainer.tensorboard=false", "progress=false"]


def run_sweep(folder: Path, launcher: list[str], seeds: int, code: Path) -> tuple[float, str]:
    """Wall seconds of one multirun (the command line, start to exit, on the package snapshot ``code``) and its
    stdout."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(code))
    cmd = [sys.executable, "-m", "placement_rl.cli.main", "train", "-m", f"seed={','.join(map(str, range(seeds)))}",
           *TRAIN, *launcher, f"hydra.sweep.dir={folder.name}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=folder.parent, capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[3:])} exited {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]}")
    return seconds, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--joblib", action="store_true", help="time Hydra's joblib launcher too")
    a = ap.parse_args()
    t_start = time.perf_counter()
    others = other_instances()
    load_start = [round(x, 2) for x in os.getloadavg()]
    launchers = {"basic": ["hydra/launcher=basic"],
                 "ray_workers": ["hydra/launcher=ray_workers", f"hydra.launcher.workers={a.workers}"]}
    if a.joblib:
        launchers["joblib"] = ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={a.workers}"]
    seconds, results, first, job_s = {}, {}, "", []
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        code = Path(tmp) / "code"  # every sweep runs one copy of the package: edits to a shared checkout while
        stage_package(code)        # the bench runs would make the workers' code check refuse a sweep
        print("warm-up: one job, untimed (numba compiles the snapshot's kernels once, into its caches) ...",
              flush=True)
        run_sweep(Path(tmp) / "warm-up", ["hydra/launcher=basic"], 1, code)
        for name, args in launchers.items():
            print(f"{name}: {a.seeds} seeds ...", flush=True)
            seconds[name], out = run_sweep(Path(tmp) / name, args, a.seeds, code)
            results[name] = sweep_results(Path(tmp) / name)
            if name == "ray_workers":
                first = next((x for x in out.splitlines() if x.startswith("sweep of ")), "")
                print(f"  {first}")
                job_s = [float(x.rsplit("done in ", 1)[1].split()[0]) for x in out.splitlines()
                         if x.startswith("[") and ": done in " in x]
            print(f"{name}: {seconds[name]:.1f} s", flush=True)
    same = {name: results[name] == results["basic"] for name in launchers if name != "basic"}
    speed = seconds["basic"] / seconds["ray_workers"]
    load_end = [round(x, 2) for x in os.getloadavg()]
    name = "bench_sweep" + ("_ray_running" if others else "")
    write_result(name, {"jobs": a.seeds, "workers": a.workers, "config": TRAIN, "seconds": seconds,
                        "speed_up": speed, "identical": same, "files_compared": len(results["basic"]),
                        "ray_job_seconds": job_s,
                        "where": first, "ray_already_running": others, "load_start": load_start,
                        "load_end": load_end, **({"speed_up_joblib": seconds["basic"] / seconds["joblib"]}
                                                 if "joblib" in seconds else {})},
                 seconds=time.perf_counter() - t_start)
    verdict = "identical" if all(same.values()) else "NOT identical"
    print(f"sweep of {a.seeds} jobs, ray_workers on {a.workers} workers vs basic: speed-up {speed:.2f}, {verdict} "
          f"(load {load_start[0]} at start, {load_end[0]} at end)")


if __name__ == "__main__":
    main()
