"""The side-by-side search workers: Ctrl-C ends them without a traceback (the caller says ``interrupted``), and on
Linux they die with the process that started them (a caller killed with SIGKILL left them searching on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

SERVE = "from placement_rl.baselines.side_by_side import _serve; _serve()"


def _wait_reading(pid: int) -> None:
    """Until ``pid`` blocks in read(2) (Linux: /proc/<pid>/syscall; elsewhere a few seconds)."""
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/syscall") as f:
                if f.read().split()[0] == "0":  # x86-64's read
                    return
        except (OSError, IndexError):
            time.sleep(5)
            return
        time.sleep(0.1)


def test_ctrl_c_ends_a_worker_quietly():
    p = subprocess.Popen([sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=dict(os.environ, PYTHONWARNINGS="ignore"),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal leaves it
    _wait_reading(p.pid)  # imported and waiting for its problem
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and b"Traceback" not in err, err.decode()[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_the_process_that_started_it(tmp_path):
    pidfile = tmp_path / "worker.pid"
    from placement_rl.baselines.side_by_side import PROLOGUE

    worker = PROLOGUE + f"import time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", f"import os, subprocess, sys, time; subprocess.Popen("
                               f"[sys.executable, '-c', {worker!r}, str(os.getpid())]); time.sleep(120)"])
    deadline = time.time() + 60
    while not pidfile.is_file() or not pidfile.read_text():
        assert time.time() < deadline, "the worker did not start"
        time.sleep(0.2)
    pid = int(pidfile.read_text())
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper has ended too
            if f.read().split(")")[-1].split()[0] == "Z":
                return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the worker outlived the process that started it")


def test_a_worker_whose_starter_died_before_it_began_ends_at_once(tmp_path):
    """The starter killed while the worker imported the package (seconds under load): PR_SET_PDEATHSIG set after
    that came too late, and the orphan searched on for 5-10 s; now the prologue sees its parent is gone."""
    from placement_rl.baselines.side_by_side import PROLOGUE

    marker = tmp_path / "ran"
    code = PROLOGUE + f"open({str(marker)!r}, 'w').write('x')"
    gone = subprocess.run([sys.executable, "-c", code, str(2**22 + 7)], timeout=60)  # a pid that is not its parent
    assert gone.returncode == 0 and not marker.exists()
    subprocess.run([sys.executable, "-c", code, str(os.getpid())], timeout=60, check=True)
    assert marker.read_text() == "x"

