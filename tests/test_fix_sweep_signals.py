"""Sweeps on Ray under a scheduler: SIGTERM ends them as Ctrl-C does, a long job shows the run is alive, the
comparison of two sweeps leaves every wall-clock column out, and a failed join names the key the user set and a
hint that fits what answers at the address."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from placement_rl import scale, scale_ray
from placement_rl.cli import sweep
from placement_rl.errors import ConfigError


# --------------------------------------------------------------------------- 1: SIGTERM as Ctrl-C
def _send_sigterm_to_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(500):  # Python runs the handler at the next instruction; never reached once it raises
        time.sleep(0.01)


def test_sigterm_raises_keyboard_interrupt_inside_the_block_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)

    def mine(signum, frame):  # what the block must put back
        raise AssertionError("the earlier handler ran inside the block")

    signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(KeyboardInterrupt):
            with scale.sigterm_as_interrupt():
                _send_sigterm_to_self()
        assert signal.getsignal(signal.SIGTERM) is mine
        with scale.sigterm_as_interrupt(restore=signal.SIG_DFL):  # the handler from before ray.init
            assert signal.getsignal(signal.SIGTERM) is scale._raise_interrupt
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_cli_and_workers_share_one_sigterm_rule():
    """One rule in one place: the CLI's train / place (``cli.signals``) apply ``scale``'s (two copies had drifted:
    only the CLI's kept an ignored SIGTERM ignored and left a launcher's job worker alone)."""
    from placement_rl.cli import signals

    assert signals.sigterm_as_interrupt is scale.sigterm_as_interrupt
    assert signals._raise_interrupt is scale._raise_interrupt


def test_a_sigterm_ignored_before_ray_init_stays_ignored_and_a_job_worker_is_left_alone():
    """A process started with SIGTERM ignored (``restore``: the handler before ``ray.init``) keeps ignoring it while
    Ray runs, instead of Ray's handler or an interrupt; a launcher's job worker changes nothing."""
    before = signal.getsignal(signal.SIGTERM)

    def rays(signum, frame):  # what ray.init installs
        raise AssertionError("Ray's handler ran")

    try:
        signal.signal(signal.SIGTERM, rays)
        with scale.sigterm_as_interrupt(restore=signal.SIG_IGN):
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            signal.raise_signal(signal.SIGTERM)  # nothing happens
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        signal.signal(signal.SIGTERM, rays)
        with scale.sigterm_as_interrupt(worker=True):
            assert signal.getsignal(signal.SIGTERM) is rays
        assert signal.getsignal(signal.SIGTERM) is rays
    finally:
        signal.signal(signal.SIGTERM, before)


def _fake_ray_start(monkeypatch, check_code) -> list[str]:
    """``Workers`` on a fake connection (no Ray started): the keys ``connect`` was called with."""
    pytest.importorskip("ray")
    keys = []
    conn = scale_ray.Connection("private", "a private local Ray instance", 2, 1, True, "", {})

    def connect(requested, address, *, ship=None, key="ray.address"):
        signal.signal(signal.SIGTERM, lambda *a: None)  # as ray.init does
        keys.append(key)
        return conn

    monkeypatch.setattr(scale, "ray_available", lambda: True)
    monkeypatch.setattr(scale_ray, "connect", connect)
    monkeypatch.setattr(scale_ray, "check_code", check_code)
    monkeypatch.setattr(scale_ray, "disconnect", lambda c: None)
    return keys


def test_workers_on_ray_turn_sigterm_into_an_interrupt_until_closed(monkeypatch):
    keys = _fake_ray_start(monkeypatch, lambda conn: 1)
    before = signal.getsignal(signal.SIGTERM)
    try:
        with scale.Workers(2, address="10.0.0.1:6379", address_key="hydra.launcher.address") as w:
            assert w.on_ray and signal.getsignal(signal.SIGTERM) is scale._raise_interrupt
        assert signal.getsignal(signal.SIGTERM) is before  # not Ray's: the one before ray.init
        assert keys == ["hydra.launcher.address"]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_sigterm_while_the_code_is_checked_closes_ray_and_restores_the_handler(monkeypatch):
    _fake_ray_start(monkeypatch, lambda conn: _send_sigterm_to_self())
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            scale.Workers(2)
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, before)


DRIVER = textwrap.dedent("""
    import sys, time
    from placement_rl.scale import Workers

    def job(x):
        time.sleep(120)

    try:
        with Workers(2) as w:
            print("ready", flush=True)
            w.map(job, [0, 1, 2])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


@pytest.mark.slow
def test_sigterm_to_a_ray_driver_takes_the_interrupt_path_not_ray_s_abort(tmp_path):
    """Before the fix: Ray's failure handler, a C++ stack dump and exit code 134."""
    pytest.importorskip("ray")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=tmp_path, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(2)  # the jobs dispatched
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and out.strip() == "interrupted", (p.returncode, out, err[-2000:])
    assert "SIGTERM received" not in err, err[-2000:]


# ------------------------------------------------------------------------------- 2: the heartbeat
def test_wait_beating_beats_while_nothing_is_ready():
    answers = [[], [], ["b"]]
    asked, beats = [], []

    def wait(refs, timeout):
        asked.append((tuple(refs), timeout))
        return answers.pop(0)

    assert scale.wait_beating(wait, ["a", "b"], every=0.01, beat=lambda: beats.append(1)) == ["b"]
    assert len(beats) == 2 and asked == [(("a", "b"), 0.01)] * 3


def test_the_sweep_line_while_jobs_run(capsys):
    sweep._still_running(4, time.perf_counter() - 95.2)(1, 2)
    assert capsys.readouterr().out == "sweep: 1 of 4 jobs finished, 2 running, 95 s so far\n"


# ------------------------------------------------------------------------- 6: wall-clock columns
@pytest.mark.parametrize("key, timing", [
    ("search s", True), ("s", True), ("seconds", True), ("search_seconds", True), ("train wall (s)", True),
    ("capture s", True), ("step time (ms)", False), ("sim calls", False), ("simulated_s", False),
    ("speed-up", False), ("case", False)])
def test_wall_clock_columns_are_timing(key, timing):
    assert sweep._measured_time(key) is timing


def test_two_place_runs_that_differ_only_in_search_seconds_compare_equal(tmp_path):
    def job(folder, seconds, calls):
        (folder / "0").mkdir(parents=True)
        (folder / "0" / "comparison.md").write_text(
            "| case | placer | step time (ms) | search s | sim calls |\n|---|---|---|---|---|\n"
            f"| mlp | random | 10.9 | {seconds} | {calls} |\n")
        (folder / "0" / "comparison.csv").write_text(
            f"case,placer,step_time_ms,search_seconds,sim_calls\nmlp,random,10.9,{seconds},{calls}\n")

    job(tmp_path / "a", 0.2009, 1173)
    job(tmp_path / "b", 0.3117, 1173)
    job(tmp_path / "c", 0.2009, 1172)
    a, b, c = (sweep.sweep_results(tmp_path / x) for x in "abc")
    assert sorted(a) == ["0/comparison.csv", "0/comparison.md"] and a == b
    assert all(a[k] != c[k] for k in a)


# ------------------------------------------------------------------ 5 and 4: the failed join's line
def test_a_refused_join_names_the_key_the_user_set():
    pytest.importorskip("ray")
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    with pytest.raises(ConfigError, match=rf"^cannot join the Ray cluster at hydra\.launcher\.address=127\.0\.0\.1:"
                                          rf"{port} \(nothing answers"):
        scale_ray.connect(2, f"127.0.0.1:{port}", key="hydra.launcher.address")


def test_the_sweep_names_the_address_key_the_user_set():
    from omegaconf import OmegaConf

    default = OmegaConf.structured(sweep.RayWorkersConf)  # address: the command's ray.address
    config = OmegaConf.create({"ray": {"address": "10.0.0.1:6379"}, "hydra": {"launcher": default}})
    assert sweep._address_key(config) == "ray.address"
    config.hydra.launcher.address = "10.0.0.1:6379"
    assert sweep._address_key(config) == "hydra.launcher.address"


def test_a_grpc_server_that_is_no_ray_head_is_named_as_such():
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # answers gRPC, serves no Ray GCS
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert scale_ray._gcs_status("127.0.0.1", port, 5) == "UNIMPLEMENTED"
        hint = scale_ray._join_hint(f"127.0.0.1:{port}", "hydra.launcher.address")
    finally:
        server.stop(0)
    assert hint.startswith(f"127.0.0.1:{port} answers but is no Ray head") and "token" not in hint, hint


@pytest.mark.parametrize("status, auth_mode, says", [
    ("UNAUTHENTICATED", "", "^a cluster with token authentication .* or on its head with hydra.launcher.address=auto$"),
    (None, "", r"^either no Ray head answers there \(start it with `ray start --head`, or fix the address\), or a "
               r"cluster with token authentication"),
    ("UNAUTHENTICATED", "token", "^the cluster wants a token: check that this one is its head's"),
    (None, "token", "^start it with `ray start --head`$")])
def test_the_join_hint_says_what_answers_or_both_causes(monkeypatch, status, auth_mode, says):
    import re

    monkeypatch.setattr(scale_ray, "_gcs_status", lambda host, port, timeout: status)
    monkeypatch.setenv("RAY_AUTH_MODE", auth_mode)
    hint = scale_ray._join_hint("10.255.255.1:6379", "hydra.launcher.address")
    assert re.search(says, hint), hint
