"""Scale-out in any Ray situation: another Ray instance on the machine is never joined by accident,
``ray.address`` joins deliberately, a worker running other code is refused before any job, stored results and
resumes are keyed by the code, and two trainings started at once both finish with their own results.

Pretraining drivers run as subprocesses on a snapshot of the package (``scale_code.stage_package``), so edits
made to the checkout while the test runs cannot change the code under test halfway."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from placement_rl.scale import Workers
from placement_rl.scale_code import code_identity, mismatch, stage_package

ROOT = Path(__file__).resolve().parent.parent
RAY = Path(sys.executable).parent / "ray"

TINY = dict(train_tasks=4, val_tasks=0, sizes=(20, 20), devices=(2, 4), zoo_frac=0.0, dev=False)
AGENT = dict(bc_epochs=1, dagger_rounds=0, pi_rounds=2, pi_epochs=1, rl_algo="q", rl_iters=2, tasks_per_iter=2)
DRIVER = """
import json, os, signal, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from placement_rl.agents.constructive_train import ConstructiveConfig
from placement_rl.studies.pretrain import PretrainSpec, pretrain

out, workers, address, kill_at, resume = sys.argv[1:6]

def log(line):
    print(line, flush=True)
    if kill_at and kill_at in line:
        os.kill(os.getpid(), signal.SIGKILL)  # the driver dies here

m = pretrain(PretrainSpec(**{tiny}), ConstructiveConfig(**{agent}), Path(out),
             workers=int(workers) if workers.isdigit() else workers, address=address or None, resume=resume == "1",
             log=log)
print("METRICS " + json.dumps({{k: m[k] for k in ("weights_sha", "checkpoint_sha", "resumed_after", "labels_reused",
                                                 "workers")}}), flush=True)
""".format(tiny=repr(TINY), agent=repr(AGENT))


def drive(code: Path | None, out: Path, *, workers: int | str = 1, address: str = "", kill_at: str = "",
          resume: bool = False, background: bool = False):
    """A pretraining driver in a subprocess (on the snapshot ``code`` when given)."""
    where = str(code) if code is not None else str(ROOT)  # the cwd too: ``python -c`` imports from it first
    env = {**os.environ, "PYTHONPATH": where}
    args = [sys.executable, "-c", DRIVER, str(out), str(workers), address, kill_at, "1" if resume else "0"]
    if background:
        return subprocess.Popen(args, env=env, cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(args, env=env, cwd=where, capture_output=True, text=True, timeout=600)


def metrics_of(stdout: str) -> dict:
    lines = [x for x in stdout.splitlines() if x.startswith("METRICS ")]
    assert lines, stdout[-3000:]
    return json.loads(lines[-1][len("METRICS "):])


SNAPSHOT_IDENTITY: dict[str, str] = {}


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """The package as it is now, in a folder of its own."""
    folder = tmp_path_factory.mktemp("code")
    SNAPSHOT_IDENTITY.update(code_identity())
    stage_package(folder)
    return folder


# ------------------------------------------------------------------------------------------- code identity
def test_code_identity_is_the_results_source_sha_and_survives_shipping(snapshot):
    from placement_rl.results import code_hashes

    here = code_identity()
    assert here["source_sha"] == code_hashes()["source_sha"]  # one hash of the code, whoever computes it
    assert {"placement-rl", "python", "conf_sha", "torch", "numpy", "numba"} <= set(here)
    code = ("import json, placement_rl, placement_rl.agents as a; from placement_rl.scale_code import code_identity;"
            "print(json.dumps([placement_rl.__file__, a.__file__, code_identity()]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(snapshot)}, cwd=snapshot)
    assert r.returncode == 0, r.stderr[-2000:]
    core, agents, there = json.loads(r.stdout)
    assert core.startswith(str(snapshot)) and agents.startswith(str(snapshot))  # the copy, not the checkout
    assert mismatch(SNAPSHOT_IDENTITY, there) == ""  # the copy's hashes are the checkout's when it was copied
    assert mismatch({"source_sha": "a", "torch": "2"}, {"source_sha": "b", "torch": "2"}) == \
        "source_sha a here, b there"


def test_store_results_are_keyed_by_the_code(tmp_path):
    """A result stored by other code (its file carries that code's key) is counted stale and recomputed."""
    w = Workers(1, store=tmp_path)
    assert w.map(abs, [-1, -2], keys=["a", "b"]) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"a.{w.code_key}.pkl", f"b.{w.code_key}.pkl"]
    old = tmp_path / f"a.{w.code_key}.pkl"
    old.rename(tmp_path / "a.0123456789abcdef.pkl")  # as the same job stored by other code
    again = Workers(1, store=tmp_path)
    assert again.map(abs, [-1, -2], keys=["a", "b"]) == [1, 2]
    assert again.reused == 1 and again.stale == 1  # b reused; a made by other code, so made again


# ------------------------------------------------------------------------------- another Ray on the machine
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_on_machine(tmp_path_factory):
    """``ray start --head --num-cpus=1`` as a user would run it (it becomes the machine's current cluster);
    stopped at the end by signalling its own ``--block`` process (``ray stop`` would stop every instance)."""
    pytest.importorskip("ray")
    port = _free_port()
    log = tmp_path_factory.mktemp("ray_head") / "head.log"
    head = subprocess.Popen([str(RAY), "start", "--head", "--num-cpus=1", f"--port={port}",
                             "--include-dashboard=false", "--block"], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    current = Path("/tmp/ray/ray_current_cluster")
    try:
        for _ in range(240):
            if current.is_file() and current.read_text().strip().endswith(f":{port}"):
                break
            if head.poll() is not None:
                pytest.fail(f"ray start failed: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        else:
            pytest.fail("ray start did not come up in 120 s")
        yield current.read_text().strip()
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        if current.is_file() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()  # the machine's current cluster named the instance just stopped


@pytest.mark.slow
def test_existing_instance_is_not_joined_by_accident_and_address_joins_it(ray_on_machine, monkeypatch):
    """Before: ``ValueError: When connecting to an existing cluster, num_cpus and num_gpus must not be provided``."""
    with Workers(2) as w:
        first = w.describe()
        assert w.map(abs, [-1, 2, -3]) == [1, 2, 3]
        assert w.count == 2
    assert "private local Ray instance (2 CPUs on 1 node)" in first, first
    assert "another Ray instance runs on this machine" in first and ray_on_machine in first, first
    assert "shipped" not in first and "checked on 1 node" in first  # this machine's install: nothing to ship
    from placement_rl.scale_ray import probe

    assert probe(ray_on_machine) is None  # a real head passes the probe (TCP, then a gRPC channel)
    with Workers(2, address=ray_on_machine) as w:
        joined = w.describe()
        assert w.map(abs, [-4, 5]) == [4, 5]
    assert f"the Ray cluster at {ray_on_machine}" in joined and "joined (1 CPU on 1 node)" in joined, joined
    assert "the driver's package shipped to every worker" in joined, joined
    monkeypatch.setenv("RAY_ADDRESS", ray_on_machine)  # Ray's own variable (``ray job submit`` sets it): a join
    with Workers(2) as w:
        assert f"(RAY_ADDRESS={ray_on_machine}), joined" in w.describe(), w.describe()


@pytest.mark.slow
def test_worker_running_other_code_is_refused_before_any_job(snapshot, tmp_path):
    """A Ray instance whose workers import another copy of the package (one comment added to the cost model):
    ``Workers`` refuses it in one line naming the node and the hashes, and no job runs."""
    import shutil

    import ray

    from placement_rl.scale_ray import CodeMismatchError

    other = tmp_path / "other"
    shutil.copytree(snapshot, other)
    with open(other / "placement_rl" / "cost" / "simulate.py", "a") as fh:
        fh.write("\n# another checkout's edit\n")
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="WARNING",
             runtime_env={"working_dir": str(other)})
    try:
        with pytest.raises(CodeMismatchError) as err:
            Workers(2)
        msg = str(err.value)
        assert "\n" not in msg and "runs other code than this driver" in msg and "source_sha" in msg, msg
        assert "refused before any job ran" in msg
        assert ray.is_initialized()  # the caller's instance is left as it was
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------------------------ pretraining
@pytest.fixture(scope="module")
def reference(snapshot, tmp_path_factory):
    """An uninterrupted 1-worker pretraining on the snapshot."""
    r = drive(snapshot, tmp_path_factory.mktemp("reference"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return metrics_of(r.stdout)


@pytest.mark.slow
def test_two_trainings_at_once_both_finish_with_their_own_results(snapshot, reference, tmp_path):
    runs = [drive(snapshot, tmp_path / f"run{i}", workers=2, background=True) for i in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in runs]
    for p, out in zip(runs, outs):
        assert p.returncode == 0, out[-3000:]
        m = metrics_of(out)
        assert m["workers"] == 2 and m["weights_sha"] == reference["weights_sha"]
        assert m["checkpoint_sha"] == reference["checkpoint_sha"]
        first = next(x for x in out.splitlines() if x.startswith("running on"))
        assert "private local Ray instance (2 CPUs on 1 node)" in first, first


def test_a_phase_saved_by_other_code_is_recomputed_with_a_note(tmp_path):
    """The resume key holds the code: a phase state saved under other hashes is not restored, and every state
    and label of that code is removed, with one line saying so."""
    import numpy as np
    import torch

    from placement_rl.studies.pretrain import STATE, _load_phase, _run_code, _save_phase

    class Trainer:  # just enough trainer for a state file
        policy = torch.nn.Linear(1, 1)
        opt = torch.optim.Adam(policy.parameters())
        decisions, history = 0, []
        gen, rng = torch.Generator(), np.random.default_rng(0)

    run = {"pretrain": {"train_tasks": 4}, "agent": {"seed": 0}, "code": _run_code()}
    state = tmp_path / STATE
    _save_phase(state / "imitation.pt", Trainer(), {}, {**run, "code": {**run["code"], "source_sha": "0" * 16}})
    (state / "labels").mkdir()
    (state / "labels" / "label-x.0123.pkl").write_bytes(b"")
    notes: list[str] = []
    assert _load_phase(state / "imitation.pt", run, notes.append) is None
    assert len(notes) == 1 and notes[0].startswith("resume: the code changed") and "source_sha 0000" in notes[0]
    assert not (state / "imitation.pt").exists() and not (state / "labels").exists()
    _save_phase(state / "imitation.pt", Trainer(), {"imitation": {}}, run)
    assert _load_phase(state / "imitation.pt", run, notes.append)["phases"] == {"imitation": {}}  # same code
    assert len(notes) == 1


@pytest.mark.slow
def test_resume_after_a_code_change_recomputes_with_a_note(snapshot, reference, tmp_path):
    import shutil

    code = tmp_path / "code"
    shutil.copytree(snapshot, code)
    out = tmp_path / "run"
    r = drive(code, out, kill_at="policy iteration 2 labelling 2/")
    assert r.returncode == -signal.SIGKILL, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / "resume" / "imitation.pt").is_file() and list((out / "resume" / "labels").glob("*.pkl"))
    with open(code / "placement_rl" / "cost" / "simulate.py", "a") as fh:
        fh.write("\n# a change to the cost model's source\n")  # no change of behaviour, a change of code
    r = drive(code, out, resume=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    notes = [x for x in r.stdout.splitlines() if x.startswith("resume: the code changed")]
    assert len(notes) == 1 and "cost_model_sha" in notes[0] and "source_sha" in notes[0], r.stdout[-3000:]
    m = metrics_of(r.stdout)
    assert m["resumed_after"] is None and m["labels_reused"] == 0  # nothing of the old code's run reused
    assert m["weights_sha"] == reference["weights_sha"]  # the comment changes nothing computed
