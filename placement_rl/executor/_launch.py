"""Start the ranks of a prepared job on this machine, watch them, and end the whole job on a fault.

Every rank is ``python -m placement_rl.executor.distributed_worker JOB_DIR`` with torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so tests run
exactly the code path ``torchrun`` runs. Each rank starts in its own session (process group), so the
watchdog can kill a rank *and anything it started* with ``killpg``; nothing outlives the job.

Watchdog rules (checked every 50 ms):

* a rank exits with a non-zero code -> after a short grace period every other rank is killed and
  ``ExecutionError`` names the culprit (:func:`blame`);
* a rank killed by a signal after it marked ``done`` (every result written; a crash in process teardown)
  counts as finished;
* no rank has made progress for ``timeout_s`` seconds -> every rank is killed and the rank(s) that
  got least far are named as hung. The process groups use the same timeout, so under a bare
  torchrun a hung peer also ends the job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from placement_rl.errors import ConfigError, ExecutionError

GRACE_S = 1.0  # after a rank fails, time for the others to write their error reports
POLL_S = 0.05


@dataclass(frozen=True)
class RankState:
    """What the launcher knows about one rank when the job ends."""

    rank: int
    exit_code: int | None  # None: still running (then killed)
    progress: int
    phase: str
    error: str | None = None
    error_time: float | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_progress(job_dir: Path, rank: int) -> tuple[int, str]:
    try:
        value, _, phase = (job_dir / "progress" / f"rank{rank}").read_text().partition(" ")
        return int(value), phase
    except (OSError, ValueError):
        return 0, "not started"


def read_error(job_dir: Path, rank: int) -> tuple[str | None, float | None]:
    try:
        data = json.loads((job_dir / "result" / f"rank{rank}.error.json").read_text())
        return str(data["error"]), float(data["time"])
    except (OSError, ValueError, KeyError):
        return None, None


def blame(states: Sequence[RankState], *, hung: bool, timeout_s: float) -> str:
    """One line naming the rank(s) that ended the job, from the states of all ranks.

    Order of suspicion: a rank that died without reporting an error (killed, ``os._exit``, crash);
    then, for a stall, the rank(s) that got least far; then the rank that reported an error first
    (the others' errors are usually the broken connections that followed it) -- unless live ranks
    are behind it, which means it timed out waiting for them.
    """
    def where(s: RankState) -> str:
        return f"rank {s.rank} (at '{s.phase}')"

    silent = [s for s in states if s.exit_code not in (None, 0) and s.error is None]
    if silent:
        s = min(silent, key=lambda x: x.rank)
        return f"{where(s)} died with exit code {s.exit_code} without reporting an error; the job was stopped"
    if hung:
        low = min(s.progress for s in states)
        stuck = [s for s in states if s.progress == low]
        names = ", ".join(where(s) for s in stuck)
        many = len(stuck) == len(states)
        return (f"{'all ranks' if many else names} made no progress for {timeout_s:g} s "
                f"({'a deadlock or a step longer than the timeout' if many else 'hung'}); the job was stopped"
                + (f": {names}" if many else ""))
    reported = sorted((s for s in states if s.error is not None), key=lambda x: x.error_time or 0.0)
    if reported:
        s = reported[0]
        behind = [x for x in states if x.exit_code is None and x.progress < s.progress]
        if behind:  # the failure is most likely a communication timeout waiting for a rank that hangs
            names = ", ".join(where(x) for x in behind)
            return f"{names} fell behind and hung ({where(s)} gave up waiting: {s.error}); the job was stopped"
        return f"{where(s)} failed: {s.error}"
    failed = [s for s in states if s.exit_code not in (None, 0)]
    s = failed[0] if failed else states[0]
    return f"{where(s)} ended with exit code {s.exit_code}"


def _finished(job_dir: Path, rank: int, code: int | None) -> bool:
    """Whether a rank ended after its work: exit code 0, or killed by a signal (negative code) after it marked
    ``done``, i.e. after every result file was written (a crash in process teardown loses nothing)."""
    if code == 0:
        return True
    return code is not None and code < 0 and read_progress(job_dir, rank)[1] == "done"


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not time out in practice
            pass


def rank_env(rank: int, world: int, port: int, threads: int, extra: Mapping[str, str] | None) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads),
                "PYTHONPATH": os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])})
    env.update(dict(extra or {}))
    return env


def run_ranks(job_dir: Path, *, nprocs: int, timeout_s: float, threads: int = 1,
              extra_env: Mapping[str, str] | None = None) -> float:
    """Run ``nprocs`` ranks of the job in ``job_dir`` to completion; return the wall time in seconds.

    Raises ``ExecutionError`` naming the rank if one fails or the job stalls for ``timeout_s``.
    """
    (job_dir / "logs").mkdir(exist_ok=True)
    port = free_port()
    procs: list[subprocess.Popen] = []
    logs = []
    start = time.monotonic()
    try:
        for r in range(nprocs):
            log = open(job_dir / "logs" / f"rank{r}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "placement_rl.executor.distributed_worker", str(job_dir)],
                env=rank_env(r, nprocs, port, threads, extra_env), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        last_change, seen = time.monotonic(), [0] * nprocs
        hung = False
        while True:
            codes = [p.poll() for p in procs]
            if all(_finished(job_dir, r, c) for r, c in enumerate(codes)):
                return time.monotonic() - start
            if any(c not in (None, 0) and not _finished(job_dir, r, c) for r, c in enumerate(codes)):
                end = time.monotonic() + GRACE_S
                while time.monotonic() < end and any(p.poll() is None for p in procs):
                    time.sleep(POLL_S)
                break
            now_seen = [read_progress(job_dir, r)[0] for r in range(nprocs)]
            if now_seen != seen:
                seen, last_change = now_seen, time.monotonic()
            elif time.monotonic() - last_change > timeout_s:
                hung = True
                break
            time.sleep(POLL_S)
        codes = [p.poll() for p in procs]
        _kill(procs)
        states = []
        for r in range(nprocs):
            prog, phase = read_progress(job_dir, r)
            err, when = read_error(job_dir, r)
            states.append(RankState(rank=r, exit_code=codes[r], progress=prog, phase=phase, error=err,
                                    error_time=when))
        raise ExecutionError(f"{blame(states, hung=hung, timeout_s=timeout_s)} "
                             f"(logs: {job_dir / 'logs'})")
    finally:
        _kill(procs)
        for log in logs:
            log.close()


def build_torchrun_command(job_dir: str | Path, *, nproc_per_node: int, nnodes: int = 1, node_rank: int | None = None,
                           rdzv_endpoint: str | None = None, rdzv_id: str = "placement-rl",
                           rdzv_backend: str = "c10d", python: str = sys.executable) -> list[str]:
    """The ``torchrun`` command that runs a prepared job (run it on every node; then :func:`collect_results`).

    One node: ``--standalone``. Several: ``rdzv_endpoint="host:port"`` (c10d rendezvous) is required.
    """
    if nproc_per_node < 1 or nnodes < 1:
        raise ConfigError(f"nproc_per_node and nnodes must be >= 1 (got {nproc_per_node}, {nnodes})")
    cmd = [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ConfigError("several nodes need rdzv_endpoint='host:port' (the rendezvous host every node reaches)")
        cmd += [f"--rdzv-backend={rdzv_backend}", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
        if node_rank is not None:
            cmd.append(f"--node-rank={node_rank}")
    return cmd + ["-m", "placement_rl.executor.distributed_worker", str(job_dir)]
