"""Registered searches run side by side for the same seconds: each in its own process, on its own core.

A comparison at equal seconds (``placement-rl train``'s searches at each learned row's seconds, ``place
search_seconds=S compare=true``, ``evaluate seconds=S``) gives every search the same wall clock. Run one after
another, those seconds add up (three searches at a fine-tuned policy's 7 s were 23 s of the 37 s a ``train`` took
on 2 cores); each search is serial, so on a machine with idle cores nothing is lost by running them at once, one
process each.

``run(graph, costs, topology, jobs, processes=None)`` runs ``jobs`` (``(placer name, seconds, seed)``): those of
``FROM_SECONDS`` or more at most ``processes`` at once (default: the cores this process may use), the shorter ones
first in the caller's process, where a worker's start would cost more than it saves (with one process, or one
such job, all of them there, in order); it returns their ``Placement`` in input order (``processes_for``: how many
processes). Each worker is a fresh interpreter (``python -c``, importing this module only: not the caller's script,
which a ``multiprocessing`` spawn would run again in every worker, top-level code and all, and where that code
starts this very pool, hang on) that receives the problem once and loads its searches' compiled kernels from numba's
cache before any job's clock starts (about 1 s in all; the caller compiles them first,
``agents.constructive_eval.warm_kernels``); a worker never uses the threaded decode (``PLACEMENT_RL_DECODE_THREADS=1``
in its environment), which only a policy's decode uses (the registered searches' starts are serial anywhere:
``la_rule`` on 1,000 nodes 0.91 s with threads asked or not), so callers keep ``policy_search`` in their own process.
Each worker is given the next job when it returns one. A job's exception is raised here; where a worker cannot
start, dies, or has not returned a job long after its seconds (``_deadline``), the jobs not yet returned run here
instead, one after another (one line on stderr says so): never a hang.
"""

from __future__ import annotations

import os
from typing import Sequence

from placement_rl.cost.types import CostTable
from placement_rl.decode_env import THREADS_ENV
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement
from placement_rl.topology import DeviceTopology

Job = tuple[str, float, int]  # (registered placer, seconds of wall clock, seed)
# the anytime searches that spend the whole of their seconds (``cp_sat`` runs CP-SAT's own threads, ``exhaustive``
# its enumeration: those stay in the caller's process)
SEARCHES = ("local_search", "la_rule_search", "eft_rollout_search")
# searches of at least these seconds run side by side, shorter ones here: a worker takes about 1-1.3 s to start (a fresh
# interpreter, the problem, the kernels loaded), so two searches of S seconds take about S + 1.3 s side by side
# against 2 S one after another (two pairs at 0.07 and 1.1 s: 3.0 s side by side, 2.35 s one after another)
FROM_SECONDS = 2.0
MAX_WAIT = 3600.0  # seconds of one wait for the workers: a job's deadline may be further off (its seconds are any
# number), and ``select`` raises ``OverflowError`` for a wait past about 24 days
MAX_MESSAGE = 1 << 36  # bytes: a length above this is not one of the messages the workers and the caller send
_PROBLEM: tuple | None = None  # (graph, costs, topology) in a worker


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _one(graph: CompGraph, costs: CostTable, topology: DeviceTopology, job: Job, budget: int = 10**12,
         objective: str = "step", refusals: bool = False) -> Placement | ConfigError:
    from placement_rl import baselines

    name, seconds, seed = job
    try:
        return baselines.get(name)(graph, costs, topology, budget=int(budget), seed=int(seed),
                                   seconds=float(seconds), objective=objective)
    except ConfigError as exc:
        if refusals:
            return exc
        raise


def _init(graph: CompGraph, costs: CostTable, topology: DeviceTopology, names: Sequence[str], budget: int,
          objective: str) -> None:
    """Keep the problem; load each search's kernels (a first call loads them from numba's cache: about 0.2 s that
    would otherwise come off the first job's seconds) on a 48-node graph, untimed, and the memory fit's, which a
    search runs only where a start overflows a device (not on that graph: loaded inside a job's seconds, it made
    ``local_search`` at 3 s return after 5.2 s with 19 simulator calls on a 7-billion-parameter model)."""
    global _PROBLEM
    import numpy as np

    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.memory import fit
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic

    small = synthetic.sample("layered", num_nodes=48, seed=0)
    small_costs = resolve_costs(small, topology)
    for name in names:  # a search that refuses this graph (``exhaustive``) is told apart here, not a dead worker
        _one(small, small_costs, topology, (name, 0.01, 0), objective=objective, refusals=True)
    fit(Problem(small, small_costs, topology, budget=1, seed=0),
        np.arange(small.num_nodes, dtype=np.int64) % topology.num_devices)
    _PROBLEM = (graph, costs, topology, budget, objective)


def _job(job: Job) -> Placement:
    assert _PROBLEM is not None, "worker not initialised"
    graph, costs, topology, budget, objective = _PROBLEM
    return _one(graph, costs, topology, job, budget, objective)


def processes_for(jobs: Sequence[Job], processes: int | None = None) -> int:
    """How many processes ``run`` uses for ``jobs``: one per job of ``FROM_SECONDS`` or more, at most ``processes``
    (default: the cores this process may use); 1 when every job runs here."""
    if os.name != "posix":  # the workers' pipes are waited on with ``selectors``, which takes sockets only on Windows
        return 1
    n = min(sum(float(j[1]) >= FROM_SECONDS for j in jobs), cores() if processes is None else int(processes))
    return max(1, n)


def run(graph: CompGraph, costs: CostTable, topology: DeviceTopology, jobs: Sequence[Job], *,
        processes: int | None = None, budget: int = 10**12, objective: str = "step",
        refusals: bool = False) -> list[Placement | ConfigError]:
    """Each job's ``Placement`` (input order); every job with ``budget`` simulator calls (default: no limit but its
    seconds) and ``objective``. Where ``processes_for`` gives two or more, the jobs of ``FROM_SECONDS`` or more run
    side by side, one process each, and the shorter ones here first; otherwise all here, one after another. With
    ``refusals``, a search that refuses its problem (a ``ConfigError``: ``eft_rollout_search`` above
    ``eft.ROLLOUT_MAX_NODES`` nodes, ``exhaustive`` on all but tiny graphs) leaves that error in its place and the
    other jobs run on; without, it is raised (an unknown name always is, before anything runs)."""
    from placement_rl import baselines

    jobs = [(str(n), float(s), int(seed)) for n, s, seed in jobs]
    for name in {j[0] for j in jobs}:
        baselines.get(name)  # an unknown name is a ConfigError here, not a worker that fails to start
    n = processes_for(jobs, processes)
    if n <= 1:
        return [_one(graph, costs, topology, j, budget, objective, refusals) for j in jobs]
    out = {i: _one(graph, costs, topology, j, budget, objective, refusals) for i, j in enumerate(jobs)
           if j[1] < FROM_SECONDS}
    aside = [i for i in range(len(jobs)) if i not in out]
    out.update(zip(aside, _pool(graph, costs, topology, [jobs[i] for i in aside], n, budget, objective, refusals)))
    return [out[i] for i in range(len(jobs))]


def _pool(graph: CompGraph, costs: CostTable, topology: DeviceTopology, jobs: list[Job], n: int, budget: int,
          objective: str, refusals: bool = False) -> list[Placement | ConfigError]:
    """``jobs`` on ``n`` worker processes, each given the next job when it returns one; where a worker cannot
    start, dies or overruns a job by far (``_deadline``), the jobs not yet returned run here (one line on stderr)."""
    import pickle
    import selectors
    import subprocess
    import sys
    import time

    from placement_rl import baselines as pkg

    env = dict(os.environ, **{THREADS_ENV: "1"})  # a worker decodes serially (its search is serial anyway)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    head = pickle.dumps((graph, costs, topology, sorted({j[0] for j in jobs}), int(budget), objective),
                        protocol=pickle.HIGHEST_PROTOCOL)
    out: dict[int, Placement] = {}
    procs: list[subprocess.Popen] = []
    sel = selectors.DefaultSelector()
    clean = False  # every worker was told to exit
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", f"{PROLOGUE}from {__name__} import _serve; _serve()",
                                           str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env))
        for w, p in enumerate(procs):
            _send(p.stdin, head)
            sel.register(p.stdout, selectors.EVENT_READ, w)
        todo = list(range(len(jobs)))
        busy: dict[int, tuple[int, float]] = {}  # worker -> (its job, when it is given up)

        def give(w: int, first: bool) -> None:
            if todo:
                i = todo.pop(0)
                _send(procs[w].stdin, pickle.dumps(jobs[i], protocol=pickle.HIGHEST_PROTOCOL))
                busy[w] = (i, time.monotonic() + _deadline(jobs[i][1], first))
            else:  # nothing left for it: it exits
                sel.unregister(procs[w].stdout)
                _send(procs[w].stdin, b"")

        for w in range(len(procs)):
            give(w, True)
        while busy:
            due = min(d for _, d in busy.values()) - time.monotonic()
            ready = sel.select(timeout=min(max(due, 0.0), MAX_WAIT))
            if not ready and due > MAX_WAIT:  # waited MAX_WAIT of a longer wait: wait on
                continue
            if not ready:
                i = min(busy.values(), key=lambda x: x[1])[0]
                raise TimeoutError(f"{jobs[i][0]} ran far past its {jobs[i][1]:g} s in a worker process")
            for key, _ in ready:
                w = key.data
                kind, value = pickle.loads(_recv(procs[w].stdout))
                if w not in busy:
                    raise EOFError("a worker process sent what it was not asked for")
                i, _ = busy.pop(w)
                if kind == "err" and not (refusals and isinstance(value, ConfigError)):
                    raise value
                out[i] = value
                give(w, False)
        clean = True
    except (OSError, EOFError, TimeoutError, pickle.UnpicklingError) as exc:
        for p in procs:  # their results would be thrown away: they end before the jobs run here
            _close(p, kill=True)
        procs.clear()
        why = str(exc) or type(exc).__name__
        left = [i for i in range(len(jobs)) if i not in out]
        print(f"side by side: {why}; running the {len(left)} searches left here, one after another", file=sys.stderr)
        for i in left:
            out[i] = _one(graph, costs, topology, jobs[i], budget, objective, refusals)
    finally:
        sel.close()
        for p in procs:
            _close(p, kill=not clean)  # a job's error on its way up: the others' searches are not waited for
    return [out[i] for i in range(len(jobs))]


def _deadline(seconds: float, first: bool) -> float:
    """Seconds a worker may take to return a job of ``seconds`` before it is given up as hung: the search's own
    seconds and its end (a start or a fit that cannot stop mid-way) several times over, and, for the first job of
    each worker, its start and the kernels it loads (or compiles, on a cold cache: about a minute here)."""
    return 3.0 * float(seconds) + 60.0 + (180.0 if first else 0.0)


def _send(pipe, data: bytes) -> None:
    pipe.write(len(data).to_bytes(8, "little") + data)
    pipe.flush()


def _recv(pipe) -> bytes:
    head = pipe.read(8)
    if len(head) < 8:
        raise EOFError("a worker process ended without its result")
    size = int.from_bytes(head, "little")
    if size > MAX_MESSAGE:
        raise EOFError("a worker process wrote something other than its result")
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("a worker process ended in the middle of its result")
    return data


def _close(proc, kill: bool = False) -> None:
    """Close a worker's pipes and reap it: it exits on the end of its input (given ``kill``, or after 5 s, it is
    killed)."""
    if kill and proc.poll() is None:
        proc.kill()
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except Exception:  # noqa: BLE001 -- still running (hung, or its stdin already gone): it is ended here
        proc.kill()
        proc.wait()


def _serve() -> None:
    """A worker (``python -c``: a fresh interpreter that imports this module only, never the caller's script):
    reads the problem, loads the kernels (``_init``), then runs each job it is sent and writes its ``Placement``
    back, until an empty message or the end of its input. Its results go out on the standard output it started
    with; anything printed goes to the standard error."""
    import pickle
    import sys

    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library's print must not corrupt the results
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    try:
        _init(*pickle.loads(_recv(inp)))
        while data := _recv(inp):
            try:
                reply = ("ok", _job(pickle.loads(data)))
            except Exception as exc:  # noqa: BLE001 -- raised again in the caller's process
                reply = ("err", exc)
            try:
                msg = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 -- an exception that does not pickle: its text does
                msg = pickle.dumps(("err", RuntimeError(repr(reply[1]))), protocol=pickle.HIGHEST_PROTOCOL)
            _send(results, msg)
    except (EOFError, OSError):  # the caller is gone (it ended, or stopped reading after another job's error)
        return
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the caller says it, once
        os._exit(130)


# A worker's first lines, before it imports the package (seconds under load): on Linux it gets SIGKILL when the
# process that started it dies (PR_SET_PDEATHSIG: a caller killed with SIGKILL or by the OOM killer left its workers
# searching on), and it ends at once when that process died before it got there (its parent pid, given as argv[1],
# is no longer its parent); elsewhere it ends at its search's seconds or at the end of its input.
PROLOGUE = ("import os, sys\n"
            "if sys.platform.startswith('linux'):\n"
            "    try:\n"
            "        import ctypes, signal\n"
            "        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
            "    except (OSError, AttributeError):\n"
            "        pass\n"
            "if len(sys.argv) > 1 and os.getppid() != int(sys.argv[1]):\n"
            "    sys.exit(0)\n")


__all__ = ["FROM_SECONDS", "Job", "SEARCHES", "cores", "processes_for", "run"]
