"""Hydra multiruns on the scale-out engine (``hydra/launcher=ray_workers``, ``placement_rl.cli.sweep``): the job
folders and results of Hydra's basic launcher, a private Ray instance beside another one on the machine (or a
deliberate join), one progress line per job, and one line with exit code 2 for a bad launcher config or a failed
job. Real Hydra, real Ray, the real command line (subprocesses); relative sweep folders, as users write them."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from placement_rl.cli.common import OWN_LAUNCHERS, JobFailed
from placement_rl.cli.sweep import TARGET, check_launcher, sweep_results
from placement_rl.errors import ConfigError
from tests.test_scale_ray import ray_on_machine  # noqa: F401 (fixture)

# a small fine-tuning of the shipped policy (a few seconds a job; no wall-clock budgets: the search rounds and the
# equal-seconds rows are off): seeds change its sampling, so the jobs differ
TRAIN = ["graph=synthetic", "graph.family=dataflow", "graph.num_nodes=30", "topology=4x_v100_nvlink",
         "agent.rl_iters=2", "agent.samples=4", "agent.eval_samples=4", "agent.search_budget=20",
         "agent.ft_search_rounds=0", "agent.equal_seconds=false",
         "trainer.compare=false", "trainer.tensorboard=false", "progress=false"]


def sweep(cwd: Path, command: str, *args: str, launcher: str = "ray_workers", folder: str = "sweep",
          timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", command, "-m", *args,
                           f"hydra/launcher={launcher}", f"hydra.sweep.dir={folder}"],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r.stdout


# ------------------------------------------------------------------------------------------- units
def test_launcher_config_is_checked_in_one_line():
    assert check_launcher("2", None) == (2, None) and check_launcher("auto", " ") == ("auto", None)
    assert check_launcher(3, "auto") == (3, "auto")
    with pytest.raises(ConfigError, match=r"^hydra\.launcher\.workers must be a positive integer or auto, got 0$"):
        check_launcher(0, None)
    with pytest.raises(ConfigError, match="hydra.launcher.address=auto is set but hydra.launcher.workers=1"):
        check_launcher(1, "auto")


def test_a_failed_job_travels_as_one_picklable_line():
    assert TARGET.startswith(OWN_LAUNCHERS)  # how a job knows its failure is reported by the launcher
    e = pickle.loads(pickle.dumps(JobFailed("graph.path=x.json: no such file", domain=False)))
    assert isinstance(e, JobFailed) and str(e) == "graph.path=x.json: no such file" and e.domain is False


def test_sweep_results_leave_out_measured_seconds_and_the_launcher_record(tmp_path):
    def job(folder, seconds, launcher, step):
        (folder / "0" / ".hydra").mkdir(parents=True)
        (folder / "0" / "metrics.json").write_text(json.dumps({"rows": [{"row": "x", "seconds": seconds,
                                                                         "step_time_ms": step}],
                                                               "warm_up_seconds": seconds}))
        (folder / "0" / "learned.md").write_text(f"# t\n\n| row | step time (ms) | s |\n|---|---|---|\n"
                                                 f"| x | {step} | {seconds} |\n")
        (folder / "0" / ".hydra" / "hydra.yaml").write_text(f"launcher: {launcher}\n")
        (folder / "0" / "train.log").write_text(f"{seconds}\n")
        (folder / "multirun.yaml").write_text(f"launcher: {launcher}\n")

    job(tmp_path / "a", 1.5, "basic", 3.25)
    job(tmp_path / "b", 2.5, "ray_workers", 3.25)
    job(tmp_path / "c", 1.5, "basic", 3.5)
    a, b, c = (sweep_results(tmp_path / x) for x in "abc")
    assert sorted(a) == ["0/learned.md", "0/metrics.json"] and a == b
    assert a["0/metrics.json"] != c["0/metrics.json"] and a["0/learned.md"] != c["0/learned.md"]


# ------------------------------------------------------------------------------------ the command line
@pytest.mark.slow
def test_two_seeds_on_two_workers_write_what_the_basic_launcher_writes(tmp_path):
    """``train -m seed=0,1``: the same files in the same folders, the same placements, checkpoints and tables
    (every figure that is not a measured time) as Hydra's basic launcher running the jobs one by one here."""
    basic = ok(sweep(tmp_path, "train", "seed=0,1", *TRAIN, launcher="basic", folder="basic"))
    ray = ok(sweep(tmp_path, "train", "seed=0,1", *TRAIN, "hydra.launcher.workers=2", folder="ray"))
    assert basic.count("artifacts in ") == 2
    lines = ray.splitlines()
    first = next(x for x in lines if x.startswith("sweep of 2 jobs in ray on 2 workers on a private local Ray"))
    assert "checked on 1 node" in first, first
    done = [x.split(":")[0].split(" ", 1) for x in lines if x.startswith("[") and ": done in " in x]
    assert sorted(c for c, _ in done) == ["[1/2]", "[2/2]"] and sorted(j for _, j in done) == ["#0 seed=0",
                                                                                              "#1 seed=1"], done
    a, b = sweep_results(tmp_path / "basic"), sweep_results(tmp_path / "ray")
    assert sorted(a) == sorted(b) and {"0/checkpoint.pt", "1/placement.json", "0/.hydra/config.yaml"} <= set(a)
    assert a == b, [k for k in a if a[k] != b.get(k)]
    assert a["0/checkpoint.pt"] != a["1/checkpoint.pt"]  # the seeds' jobs differ (their placements may not)


@pytest.mark.slow
def test_beside_another_ray_instance_and_joining_it(ray_on_machine, tmp_path):
    """Another Ray instance runs on the machine: the sweep starts a private one (its first line says so); with
    ``hydra.launcher.address`` it joins that one deliberately (shipping the package) and the jobs write the same
    folders in the driver's working directory."""
    args = ["graph=synthetic", "graph.num_nodes=10,20"]
    out = ok(sweep(tmp_path, "inspect", *args, "hydra.launcher.workers=2", folder="private"))
    assert "on 2 workers on a private local Ray instance (2 CPUs on 1 node)" in out, out
    assert f"another Ray instance runs on this machine ({ray_on_machine}" in out, out
    # auto: the machine's current cluster (the one just started); an explicit host:port would need
    # RAY_AUTH_MODE=token in a fresh process, Ray's rule for token authentication
    out = ok(sweep(tmp_path, "inspect", *args, "hydra.launcher.address=auto", folder="joined"))
    assert f"the Ray cluster at {ray_on_machine} (hydra.launcher.address=auto), joined (1 CPU on 1 node)" in out, out
    assert "shipped to every worker" in out, out
    basic = ok(sweep(tmp_path, "inspect", *args, launcher="basic", folder="basic"))
    assert basic.count("wrote ") == 2
    ref = sweep_results(tmp_path / "basic")
    assert {"0/graph.json", "1/graph.json"} <= set(ref)
    assert sweep_results(tmp_path / "private") == ref and sweep_results(tmp_path / "joined") == ref


@pytest.mark.parametrize("args, says", [
    (["hydra.launcher.workers=0"], "hydra.launcher.workers must be a positive integer or auto, got 0"),
    (["hydra.launcher.workers=lots"], "hydra.launcher.workers must be a positive integer or auto, got 'lots'"),
    (["hydra.launcher.workers=1", "hydra.launcher.address=auto"], "hydra.launcher.workers=1 runs the jobs in"),
])
def test_a_bad_launcher_config_is_one_line_and_exit_2(tmp_path, args, says):
    r = sweep(tmp_path, "inspect", "graph=synthetic", "graph.num_nodes=10,20", *args)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: hydra.launcher.") and says in err[0], r.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_failed_job_is_one_line_and_the_other_jobs_finish(tmp_path):
    """One job's graph file is missing: its progress line says why, the other job writes its folder, and the sweep
    ends with one line on stderr and exit code 2; no traceback anywhere."""
    from placement_rl.graph import synthetic

    synthetic.sample("layered", num_nodes=12, seed=0).to_json(tmp_path / "g.json")
    r = sweep(tmp_path, "inspect", "graph.path=g.json,missing.json", "hydra.launcher.workers=2")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    err = [x for x in r.stderr.strip().splitlines() if "WARNING" not in x]  # Ray's own start-up warnings
    assert len(err) == 1 and err[0].startswith("error: 1 of 2 sweep jobs failed") and "missing.json" in err[0], err
    failed = [x for x in r.stdout.splitlines() if x.startswith("[") and ": failed in " in x]
    assert len(failed) == 1 and "#1 graph.path=missing.json" in failed[0] and "missing.json" in failed[0], failed
    assert (tmp_path / "sweep" / "0" / "graph.json").is_file() and not (tmp_path / "sweep" / "1").exists()
