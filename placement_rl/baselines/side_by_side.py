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
processes). Each worker is a fresh interpreter (``spawn``: no torch, no OpenMP state carried over a fork) that
receives the problem once and loads its searches' compiled kernels from numba's cache before any job's clock
starts (about 1 s in all; the caller compiles them first, ``agents.constructive_eval.warm_kernels``); a worker
never uses the threaded decode (``cost.threads``: serial in a ``multiprocessing`` child), which only a policy's
decode uses (the registered searches' starts are serial anywhere: ``la_rule`` on 1,000 nodes 0.91 s with threads
asked or not), so callers keep ``policy_search`` in their own process. A job's exception is raised here; where no
worker process can start, or one dies, every job sent to the workers runs here instead, one after another (one
line on stderr says so).
"""

from __future__ import annotations

import os
from typing import Sequence

from placement_rl.cost.types import CostTable
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
_PROBLEM: tuple | None = None  # (graph, costs, topology) in a worker


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _one(graph: CompGraph, costs: CostTable, topology: DeviceTopology, job: Job, budget: int = 10**12,
         objective: str = "step") -> Placement:
    from placement_rl import baselines

    name, seconds, seed = job
    return baselines.get(name)(graph, costs, topology, budget=int(budget), seed=int(seed), seconds=float(seconds),
                               objective=objective)


def _init(graph: CompGraph, costs: CostTable, topology: DeviceTopology, names: Sequence[str], budget: int,
          objective: str) -> None:
    """Keep the problem; load each search's kernels (a first call loads them from numba's cache: about 0.2 s that
    would otherwise come off the first job's seconds) on a 48-node graph, untimed."""
    global _PROBLEM
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic

    small = synthetic.sample("layered", num_nodes=48, seed=0)
    small_costs = resolve_costs(small, topology)
    for name in names:
        _one(small, small_costs, topology, (name, 0.01, 0), objective=objective)
    _PROBLEM = (graph, costs, topology, budget, objective)


def _job(job: Job) -> Placement:
    assert _PROBLEM is not None, "worker not initialised"
    graph, costs, topology, budget, objective = _PROBLEM
    return _one(graph, costs, topology, job, budget, objective)


def processes_for(jobs: Sequence[Job], processes: int | None = None) -> int:
    """How many processes ``run`` uses for ``jobs``: one per job of ``FROM_SECONDS`` or more, at most ``processes``
    (default: the cores this process may use); 1 when every job runs here."""
    n = min(sum(float(j[1]) >= FROM_SECONDS for j in jobs), cores() if processes is None else int(processes))
    return max(1, n)


def run(graph: CompGraph, costs: CostTable, topology: DeviceTopology, jobs: Sequence[Job], *,
        processes: int | None = None, budget: int = 10**12, objective: str = "step") -> list[Placement]:
    """Each job's ``Placement`` (input order); every job with ``budget`` simulator calls (default: no limit but its
    seconds) and ``objective``. Where ``processes_for`` gives two or more, the jobs of ``FROM_SECONDS`` or more run
    side by side, one process each, and the shorter ones here first; otherwise all here, one after another."""
    from placement_rl import baselines

    jobs = [(str(n), float(s), int(seed)) for n, s, seed in jobs]
    for name in {j[0] for j in jobs}:
        baselines.get(name)  # an unknown name is a ConfigError here, not a worker that fails to start
    n = processes_for(jobs, processes)
    if n <= 1:
        return [_one(graph, costs, topology, j, budget, objective) for j in jobs]
    out = {i: _one(graph, costs, topology, j, budget, objective) for i, j in enumerate(jobs) if j[1] < FROM_SECONDS}
    aside = [i for i in range(len(jobs)) if i not in out]
    out.update(zip(aside, _pool(graph, costs, topology, [jobs[i] for i in aside], n, budget, objective)))
    return [out[i] for i in range(len(jobs))]


def _pool(graph: CompGraph, costs: CostTable, topology: DeviceTopology, jobs: list[Job], n: int, budget: int,
          objective: str) -> list[Placement]:
    import multiprocessing
    import sys
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    names = sorted({j[0] for j in jobs})
    try:
        with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init,
                                 initargs=(graph, costs, topology, names, int(budget), objective)) as pool:
            return [f.result() for f in [pool.submit(_job, j) for j in jobs]]
    except (BrokenProcessPool, OSError) as exc:  # no worker could start, or one died: the jobs run here instead
        why = str(exc) or type(exc).__name__
        print(f"side by side: {why}; running the {len(jobs)} searches here, one after another", file=sys.stderr)
        return [_one(graph, costs, topology, j, budget, objective) for j in jobs]


__all__ = ["FROM_SECONDS", "Job", "SEARCHES", "cores", "processes_for", "run"]
