"""Multiruns and Ray joins that end in one line: an unreachable Ray address is refused within seconds, a failed job
of a sweep on Hydra's basic or joblib launcher is reported by number while the other jobs finish, Ctrl-C on a
sweep says how many jobs finished (exit 130), a key of another option of a group names that option, Hydra's
conflicting flags are one line, and more workers than CPUs says how many run at a time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from placement_rl.cli import sweep
from placement_rl.cli.common import JobFailed, SweepExit, multirun_first, preflight
from placement_rl.errors import ConfigError

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def cli(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


# ------------------------------------------------------------------------------ 1: unreachable address
def test_an_address_where_nothing_listens_is_one_reason():
    from placement_rl.scale_ray import probe

    port = closed_port()
    why = probe(f"127.0.0.1:{port}", timeout=3)
    assert why is not None and why.startswith(f"nothing answers at 127.0.0.1:{port}"), why
    assert probe(f"ray://127.0.0.1:{port}", timeout=3).startswith("nothing answers")
    with socket.socket() as s:  # something listening that speaks no gRPC: ray.init waited on it without end
        s.bind(("127.0.0.1", 0))
        s.listen()
        why = probe(f"127.0.0.1:{s.getsockname()[1]}", timeout=2)
        assert why is not None and "answers but not as a Ray head" in why, why
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # a gRPC server, as a Ray head's GCS is
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert probe(f"127.0.0.1:{port}", timeout=5) is None
    finally:
        server.stop(0)
    assert probe("not-an-address", timeout=3) is None  # a form Ray itself refuses


@pytest.mark.timeout(60)  # before the fix: ray.init retried the address forever
def test_joining_a_dead_address_is_refused_not_retried_forever():
    pytest.importorskip("ray")
    from placement_rl.scale import Workers

    port = closed_port()
    with pytest.raises(ConfigError, match=rf"^cannot join the Ray cluster at ray\.address=127\.0\.0\.1:{port} "
                                          r"\(nothing answers at 127\.0\.0\.1:\d+: .*\): start it with `ray start"):
        Workers(2, address=f"127.0.0.1:{port}")


@pytest.mark.slow
def test_a_sweep_on_a_dead_address_ends_in_one_line_and_exit_2(tmp_path):
    pytest.importorskip("ray")
    port = closed_port()
    r = cli(tmp_path, "inspect", "-m", "graph=synthetic", "graph.num_nodes=10,12", "hydra/launcher=ray_workers",
            "hydra.launcher.workers=2", f"hydra.launcher.address=127.0.0.1:{port}", "hydra.sweep.dir=sweep",
            timeout=120)  # before the fix: Ray's GCS warnings every 30 s, forever
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: cannot join the Ray cluster at hydra.launcher.address=127.0.0.1:{port}")


# ------------------------------------------------------------------- 2: failed jobs on other launchers
def _ret(status: JobStatus, value=None) -> JobReturn:
    ret = JobReturn(overrides=[], status=status)
    ret.return_value = value
    return ret


def test_a_failed_job_of_another_launcher_is_named_and_the_sweep_exits_2(capsys):
    jobs = [["graph.path=g.json", "seed=0"], ["graph.path=missing.json", "seed=0"], ["graph.path=h.json", "seed=0"]]
    rets = [_ret(JobStatus.COMPLETED), _ret(JobStatus.FAILED, JobFailed("graph file 'missing.json' does not exist")),
            _ret(JobStatus.COMPLETED)]
    launch = sweep._report_failures(lambda overrides, idx: rets)
    with pytest.raises(SweepExit) as exc:
        launch(jobs, 0)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out.strip() == "#1 graph.path=missing.json: failed: graph file 'missing.json' does not exist"
    assert err.strip().startswith("error: 1 of 3 sweep jobs failed in ") and err.strip().endswith(
        "s; #1 graph.path=missing.json: graph file 'missing.json' does not exist")
    rets[1] = _ret(JobStatus.COMPLETED)
    assert launch(jobs, 0) is rets and capsys.readouterr() == ("", "")  # all done: nothing said, Hydra goes on


def test_a_bug_in_a_job_of_another_launcher_exits_1_with_its_line(capsys):
    try:
        raise KeyError("x")
    except KeyError as e:
        bug = e
    rets = [_ret(JobStatus.FAILED, bug), _ret(JobStatus.FAILED, JobFailed("bad input"))]
    with pytest.raises(SweepExit) as exc:
        sweep._report_failures(lambda overrides, idx: rets)([["seed=0"], ["seed=1"]], 4)
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert "#4 seed=0: failed: KeyError: 'x' (test_fix_scale_sweep.py:" in out and "#5 seed=1: failed: bad input" in out
    assert err.strip().splitlines()[-1].startswith("error: 2 of 2 sweep jobs failed") and "KeyError" in err


def test_ctrl_c_on_another_launcher_is_one_line_and_130(capsys):
    def launch(overrides, idx):
        raise KeyboardInterrupt

    with pytest.raises(SweepExit) as exc:
        sweep._report_failures(launch)([["seed=0"], ["seed=1"]], 0)
    assert exc.value.code == 130 and capsys.readouterr().err.strip() == "interrupted: 0 of 2 sweep jobs finished"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_failed_job_does_not_take_the_sweep_down(tmp_path, launcher):
    """The failing job comes first: before the fix the basic launcher stopped there (exit 2 naming no job) and
    joblib's worker exit took the whole sweep down."""
    from placement_rl.graph import synthetic

    synthetic.sample("layered", num_nodes=12, seed=0).to_json(tmp_path / "g.json")
    r = cli(tmp_path, "inspect", "-m", "graph.path=missing.json,g.json", f"hydra/launcher={launcher}",
            "hydra.sweep.dir=sweep")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert "#0 graph.path=missing.json: failed: graph file 'missing.json' does not exist" in r.stdout
    err = r.stderr.strip().splitlines()
    assert err[-1].startswith("error: 1 of 2 sweep jobs failed") and "#0 graph.path=missing.json" in err[-1], err
    assert (tmp_path / "sweep" / "1" / "graph.json").is_file()


def test_a_joblib_workers_ctrl_c_leaves_the_line_to_the_driver(monkeypatch):
    """Ctrl-C on ``train -m`` (joblib) printed ``interrupted`` from each worker, then the driver's line."""
    import os

    from placement_rl.cli.common import DRIVER_PID, in_job_worker

    monkeypatch.delenv(DRIVER_PID, raising=False)
    assert not in_job_worker()  # a plain run (no command started it): says ``interrupted`` itself
    monkeypatch.setenv(DRIVER_PID, str(os.getpid()))
    assert not in_job_worker()  # the driver, or the basic launcher's job in it
    monkeypatch.setenv(DRIVER_PID, str(os.getpid() + 1))
    assert in_job_worker()  # a worker process the driver started


@pytest.mark.slow
def test_ctrl_c_on_a_joblib_sweep_is_one_line(tmp_path):
    import signal
    import time

    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    # SIGINT as a terminal leaves it (a shell running this in the background ignores it, and the child would too)
    p = subprocess.Popen([sys.executable, "-m", "placement_rl.cli.main", "train", "-m", "seed=0,1",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    logs = [tmp_path / "sweep" / k / "train.log" for k in "01"]
    deadline = time.time() + 180  # until both jobs run their task (their logs written), then Ctrl-C on the group
    while time.time() < deadline and not all(f.is_file() and f.stat().st_size > 0 for f in logs):
        assert p.poll() is None, p.stderr.read()[-3000:]
        time.sleep(0.5)
    time.sleep(2)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip() and "][INFO]" not in ln]
    assert p.returncode == 130 and lines == ["interrupted: 0 of 2 sweep jobs finished"], err[-3000:]


# ------------------------------------------------------------------------- 3: Ctrl-C on ray_workers
def test_ctrl_c_on_a_ray_workers_sweep_says_how_many_jobs_finished(tmp_path, monkeypatch, capsys):
    from placement_rl.scale import Workers

    def interrupted_map(self, fn, items, *, on_result=None, **kwargs):
        on_result(0, sweep.JobOutcome(_ret(JobStatus.COMPLETED), 0.1))
        raise KeyboardInterrupt  # Ctrl-C while the second job runs

    class Loader:
        def load_sweep_config(self, config, overrides):
            return OmegaConf.create({"hydra": {"job": {}}, "seed": overrides[0]})

    class Launcher:
        workers, address, task_function = 1, None, None
        config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "hydra_logging": None,
                                             "verbose": False}})
        hydra_context = type("Context", (), {"config_loader": Loader(), "callbacks": None})()

    monkeypatch.setattr(Workers, "map", interrupted_map)
    with pytest.raises(SweepExit) as exc:
        sweep.launch(Launcher(), [["seed=0"], ["seed=1"]], 0)
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted: 1 of 2 sweep jobs finished"


# --------------------------------------------------------------------------- 4, 5: the override check
def test_a_key_of_another_option_names_the_options_that_have_it():
    with pytest.raises(ConfigError, match=r"^agent\.n_envs is a key of agent=maskable_ppo\|ppo, not of "
                                          r"agent=constructive: choose one of those"):
        preflight("train", ["agent=constructive", "agent.n_envs=2"])
    with pytest.raises(ConfigError, match=r"^agent\.reinforce\.batch_episodes is a key of agent=reinforce, not of "
                                          r"agent=ppo: .*\+\+agent\.reinforce\.batch_episodes="):
        preflight("train", ["-m", "env=placement", "agent=ppo,reinforce", "agent.reinforce.batch_episodes=2"])
    with pytest.raises(ConfigError, match=r"did you mean agent\.n_envs\?"):  # a typo is still a typo
        preflight("train", ["agent=ppo", "agent.n_envz=2"])


def test_conflicting_hydra_flags_are_one_line_and_multirun_may_follow_overrides():
    with pytest.raises(ConfigError, match=r"^--cfg and -m cannot be given together .*drop -m"):
        preflight("inspect", ["-m", "graph=mlp,resnet18", "--cfg", "job"])
    with pytest.raises(ConfigError, match=r"^--info and -m cannot be given together"):
        preflight("inspect", ["--multirun", "--info"])
    assert multirun_first(["+experiment=x", "--multirun", "seed=0,1"]) == ["--multirun", "+experiment=x", "seed=0,1"]


# ------------------------------------------------------------------------- 12: more workers than CPUs
def test_more_workers_than_cpus_says_how_many_run_at_a_time(monkeypatch):
    from placement_rl import scale_ray
    from placement_rl.scale import Workers

    w = Workers(1)
    conn = scale_ray.Connection("joined", "the Ray cluster at 10.0.0.1:6379 (ray.address=auto), joined", 2, 1,
                                True, "", {"placement-rl": "0", "source_sha": "abc"})
    w._ray, w._conn, w.count, w.nodes_checked = True, conn, 6, 1
    monkeypatch.setattr(scale_ray, "cluster_size", lambda: (2, 1))
    assert w.describe().startswith("6 workers requested, 2 CPUs: 2 at a time, on the Ray cluster at 10.0.0.1:6379")
    w.count = 2
    assert w.describe().startswith("2 workers on the Ray cluster")
    w._ray, w._conn = False, None
