"""Scale-out (``placement_rl.scale``): one worker runs here without Ray; on Ray, results come back in input order and
equal one worker's (labelling, evaluation, a whole tiny pretraining); a worker killed mid-job is retried; a
pretraining run killed mid-way resumes to the same checkpoint without relabelling; sweeps have a launcher."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from placement_rl.errors import ConfigError
from placement_rl.scale import Workers, check_workers, map_tasks
from tests.test_scale_ray import reference, snapshot  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance for the module (``Workers`` reuses a running instance and leaves it running)."""
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the helpers below, on workers without tests/
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",  # private: never another's
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    yield ray
    ray.shutdown()


# ------------------------------------------------------------------------------------------------ jobs
def _square_after(x: int, base: float) -> int:
    time.sleep(base * (5 - x % 5))  # later items finish first
    return x * x


def _die_once(x: int, marker: str) -> int:
    if x == 2 and not os.path.exists(marker):
        Path(marker).write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies mid-job
    return x + 100


def _refuse(x: int) -> int:
    raise ConfigError(f"job {x} refuses")


# ----------------------------------------------------------------------------------------- in-process
def test_one_worker_runs_in_process_without_importing_ray():
    code = ("import sys; from placement_rl.scale import map_tasks; "
            "assert map_tasks(abs, [-1, 2, -3], workers=1) == [1, 2, 3]; assert 'ray' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr


def test_workers_are_checked_up_front():
    assert check_workers("auto") == "auto" and check_workers(3) == 3 and check_workers("2") == 2
    for bad in (0, -1, "many", 1.5, True):
        with pytest.raises(ConfigError, match="workers"):
            check_workers(bad)
    with pytest.raises(ConfigError, match="ray.address"):
        Workers(1, address="127.0.0.1:6379")


def test_store_reuses_finished_results(tmp_path):
    calls = []

    def job(x):
        calls.append(x)
        return x * 2

    w = Workers(1, store=tmp_path)
    assert w.map(job, [1, 2], keys=["a", "b"]) == [2, 4]
    w2 = Workers(1, store=tmp_path)
    assert w2.map(job, [1, 2, 3], keys=["a", "b", "c"]) == [2, 4, 6]
    assert calls == [1, 2, 3] and w2.reused == 2


# ----------------------------------------------------------------------------------------------- Ray
@pytest.mark.slow
def test_ray_results_in_input_order_equal_one_worker(ray_local):
    items = list(range(10))
    seen = []
    with Workers(2) as w:
        assert w.on_ray and w.count == 2
        got = w.map(_square_after, items, shared=(0.02,), progress=lambda d, n: seen.append((d, n)))
    assert got == map_tasks(_square_after, items, workers=1, shared=(0.0,)) == [x * x for x in items]
    assert seen[-1] == (10, 10) and [d for d, _ in seen] == list(range(1, 11))  # progress over both workers


def test_killed_worker_is_retried(ray_local, tmp_path):
    marker = tmp_path / "killed"
    got = map_tasks(_die_once, list(range(5)), workers=2, shared=(str(marker),))
    assert marker.is_file()  # a worker did die
    assert got == [100, 101, 102, 103, 104]


def test_job_exception_is_raised_here_not_retried(ray_local):
    with pytest.raises(ConfigError, match="refuses"):
        map_tasks(_refuse, [1, 2], workers=2)


def _tiny_tasks(n=3):
    from placement_rl.studies.pretrain import build_tasks, training_specs

    return build_tasks(training_specs(n, seed=5, size=(20, 30), devices=(2, 4), zoo_frac=0.0), workers=1)


@pytest.mark.slow
def test_labelling_and_evaluation_equal_for_1_and_2_workers(ray_local):
    import torch

    from placement_rl.agents.constructive import rollout
    from placement_rl.agents.constructive_train import ConstructiveConfig, build_policy
    from placement_rl.agents.scaleout import LabelJob, _parts, evaluate_tasks, label_states

    tasks = _tiny_tasks()
    torch.manual_seed(0)
    policy = build_policy(ConstructiveConfig())
    jobs = [LabelJob(t, rollout(policy, t, samples=1).devices[0], 2, i % 2) for i, t in enumerate(tasks)]
    assert all(_parts(j, on_ray=True) > 1 for j in jobs)  # on Ray each trajectory is labelled by several jobs
    with Workers(2) as w2:
        assert w2.on_ray
        labs = [label_states(policy, jobs, w) for w in (Workers(1), w2)]
        for t in tasks:
            t.window = 0  # fresh from a cache: never placed (on Ray only a worker's copy is placed)
        from placement_rl.agents.constructive import episode_calls

        on_ray = evaluate_tasks(policy, tasks, samples=4, seed=3, workers=w2)
        ray_calls = [episode_calls(r.task) for r in on_ray]  # before a local run places the tasks themselves
        evals = [evaluate_tasks(policy, tasks, samples=4, seed=3, workers=Workers(1)), on_ray]
    # each row counts the whole-graph window's completions, N x D + 1 per placement, on Ray too
    assert ray_calls == [1 + t.graph.num_nodes * t.topology.num_devices for t in tasks]
    for a, b in zip(*labs):
        assert a.completions == b.completions > 0
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(a.regret, b.regret)
    for a, b in zip(*evals):
        assert a.task is b.task
        np.testing.assert_array_equal(a.greedy.devices, b.greedy.devices)
        np.testing.assert_array_equal(a.sampled.devices, b.sampled.devices)
        assert a.greedy_time == b.greedy_time and a.best_time == b.best_time


def test_dagger_lookahead_labels_on_workers_equal_the_teacher(ray_local):
    """DAgger's relabelling (``eft_rollout`` on the student's trajectories) as jobs: 1 and 2 workers give exactly
    the lookahead teacher's labels and regrets, in task order."""
    from placement_rl.agents.constructive import rollout
    from placement_rl.agents.constructive_train import ConstructiveConfig, build_policy
    from placement_rl.agents.scaleout import lookahead_labels
    from placement_rl.cost.lookahead import eft_rollout

    tasks = _tiny_tasks()
    policy = build_policy(ConstructiveConfig(seed=1))
    trajectories = [(t, rollout(policy, t, samples=1).devices[0]) for t in tasks]
    with Workers(2) as w2:
        got = [lookahead_labels(trajectories, w) for w in (Workers(1), w2)]
    for (t, actions), one, two in zip(trajectories, *got):
        _, lab, reg = eft_rollout(t.graph, t.costs, t.topology, actions=actions)
        for labels, regret in (one, two):
            np.testing.assert_array_equal(labels, lab)
            np.testing.assert_array_equal(regret, reg)
    assert any((r > 0).any() for _, r in got[0])  # some decisions had a better device: the check is not vacuous


# ------------------------------------------------------------------------------------------ pretraining
TINY = dict(train_tasks=4, val_tasks=0, sizes=(20, 20), devices=(2, 4), zoo_frac=0.0, dev=False)
AGENT = dict(bc_epochs=1, dagger_rounds=0, pi_rounds=2, pi_epochs=1, rl_algo="q", rl_iters=2, tasks_per_iter=2)


def _pretrain(out: Path, workers, **kw):
    from placement_rl.agents.constructive_train import ConstructiveConfig
    from placement_rl.studies.pretrain import PretrainSpec, pretrain

    return pretrain(PretrainSpec(**TINY), ConstructiveConfig(**AGENT), out, workers=workers, log=lambda _: None, **kw)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_worker")
    return out, _pretrain(out, 1)


def test_pretraining_checkpoint_equal_for_1_and_2_workers(ray_local, uninterrupted, tmp_path):
    one, m1 = uninterrupted
    m2 = _pretrain(tmp_path, 2)
    assert m2["workers"] == 2 and m1["workers"] == 1
    assert m1["weights_sha"] == m2["weights_sha"]
    for name in ("checkpoint_imitation.pt", "checkpoint_pi.pt", "checkpoint.pt"):
        assert _sha(one / name) == _sha(tmp_path / name), name
    assert not (tmp_path / "resume").exists()  # removed once the run finished


@pytest.mark.slow
def test_killed_pretraining_resumes_without_relabelling(snapshot, reference, tmp_path):
    """Killed in round 2 of policy iteration on 1 worker, resumed on 2 (a private Ray instance): the
    uninterrupted run's checkpoint, every stored label reused. Both drivers run on one snapshot of the package:
    the resume key holds the code, so an edit of the checkout in between would (rightly) recompute."""
    from tests.test_scale_ray import drive, metrics_of

    out = tmp_path / "run"
    r = drive(snapshot, out, kill_at="policy iteration 2 labelling 2/")
    assert r.returncode == -signal.SIGKILL, r.stdout[-2000:] + r.stderr[-2000:]
    assert (out / "resume" / "imitation.pt").is_file() and not (out / "checkpoint.pt").exists()
    made = len(list((out / "resume" / "labels").glob("*.pkl")))
    assert made >= TINY["train_tasks"] + 1  # round 1, and part of round 2
    r = drive(snapshot, out, workers=2, resume=True)  # resumed on another worker count
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    m = metrics_of(r.stdout)
    assert m["resumed_after"] == "imitation" and m["labels_reused"] == made
    assert m["weights_sha"] == reference["weights_sha"] and m["checkpoint_sha"] == reference["checkpoint_sha"]
    assert json.loads((out / "metrics.json").read_text())["labels_reused"] == made


def test_resume_refuses_another_configuration(uninterrupted, tmp_path):
    from placement_rl.agents.constructive_train import ConstructiveConfig
    from placement_rl.studies.pretrain import STATE, PretrainSpec, _save_phase

    class Stub:  # just enough trainer for a state file
        import torch

        policy = torch.nn.Linear(1, 1)
        opt = torch.optim.Adam(policy.parameters())
        decisions, history = 0, []
        gen, rng = torch.Generator(), np.random.default_rng(0)

    _save_phase(tmp_path / STATE / "imitation.pt", Stub(), {}, {"pretrain": {"train_tasks": 99}})
    with pytest.raises(ConfigError, match="another configuration"):
        from placement_rl.studies.pretrain import pretrain

        pretrain(PretrainSpec(**TINY), ConstructiveConfig(**AGENT), tmp_path, workers=1, resume=True,
                 log=lambda _: None)


# ------------------------------------------------------------------------------------------------ sweeps
def test_ablation_runs_on_ray_equal_one_worker(ray_local):
    import dataclasses

    from placement_rl.studies.ablation import run_study
    from placement_rl.studies.config import load_study

    tiny = ["graph=synthetic", "graph.num_nodes=12", "topology=4x_v100_nvlink", "++agent.n_envs=1",
            "++agent.n_steps=16", "++agent.batch_size=16", "++agent.n_epochs=1", "++agent.reinforce.batch_episodes=2",
            "encoder.hidden=16", "encoder.layers=2"]
    spec = load_study("ablation_agent", mode="quick", budget=24, seeds=(0, 1), overrides=tiny)
    seen = []
    one = run_study(spec, progress=False)
    two = run_study(dataclasses.replace(spec, workers=2), progress=False, on_result=seen.append)
    assert [(r.cell, r.seed) for r in seen] == [(c.name, s) for c in spec.cells for s in (0, 1)]  # in order
    assert [(r.cell, r.seed, r.step_time, r.curve) for r in one] == [(r.cell, r.seed, r.step_time, r.curve)
                                                                   for r in two]


def test_multirun_goes_through_the_joblib_launcher():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    assert "joblib" in cfg.hydra.launcher._target_.lower() and cfg.hydra.launcher.n_jobs == -1
    assert cfg.workers == "auto" and cfg.ray.address is None and cfg.resume is False
