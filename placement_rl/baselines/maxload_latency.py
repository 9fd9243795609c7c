"""The latency objective of the max-load model (Tarnawski et al., NeurIPS 2020, their latency IP): the time one
sample takes through an inference graph split over accelerators and CPU cores.

Each accelerator runs one contiguous subgraph as one call: it starts when every output it reads from outside is
ready and takes its nodes' accelerator times plus its transfers (each crossing output once, sent or received, as in
the max-load model); every node in it is ready when it ends. A node on a CPU starts when its inputs are ready and
takes its CPU time (the CPU cores are as many as needed: the model ignores ``maxCPUs``). The latency is when the
last node is ready. A split whose subgraphs feed each other in a cycle has none (infinite).

``latency_of(inst, device)`` scores a split (device per node: accelerators ``0 .. A-1``, any larger id a CPU);
``solve_latency(inst, seconds)`` returns the best of: every node on a CPU, the max-load dynamic program's contiguous
split (the paper's baseline; its dynamic program's time comes on top of ``seconds``), a local search from the better
of those (``maxload.search_blocks``, half the seconds) and CP-SAT on the paper's integer program (the other half,
hinted with the best so far), with CP-SAT's bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from placement_rl.baselines._maxload_kernel import latency_score
from placement_rl.baselines._maxload_search import LATENCY
from placement_rl.baselines.maxload import _sorted_edges, fewer_devices, search_blocks, widen_devices
from placement_rl.baselines.maxload_blocks import blocks_of
from placement_rl.baselines.maxload_dp import contiguous_dp
from placement_rl.errors import GraphError
from placement_rl.graph.maxload_file import MaxLoadInstance


def check_inference(inst: MaxLoadInstance) -> None:
    if inst.backward.any():
        raise GraphError(f"{inst.path}: the latency objective is for inference graphs; this one has "
                         f"{int(inst.backward.sum())} backward nodes (use the max-load objective)")


def latency_of(inst: MaxLoadInstance, device: np.ndarray) -> float:
    """The latency of a split (module doc); inf where its subgraphs feed each other in a cycle."""
    device = np.asarray(device, dtype=np.int64)
    return float(latency_score(device, inst.accelerators, inst.acc, inst.cpu, _sorted_edges(inst), inst.out_cost)[0])


@dataclass
class LatencyResult:
    """Each candidate's latency (``all_cpu``, ``maxload_split``, ``cp_sat``: None where it found none or did not run,
    ``notes`` saying why), the best split, its latency, the lower bound and whether the best meets it."""

    candidates: dict[str, float | None]
    device: np.ndarray
    latency: float
    bound: float
    optimal: bool
    method: str
    seconds: float
    notes: list[str]


def path_bound(inst: MaxLoadInstance) -> float:
    """The longest path with every node at its cheaper time (its CPU time, or its accelerator time where an
    accelerator may run it): a subgraph's call ends after all its nodes' times, so no split is faster."""
    import networkx as nx

    cheap = inst.cpu.copy()
    if inst.accelerators:
        cheap = np.where(inst.supported & (inst.size <= inst.max_size), np.minimum(cheap, inst.acc), cheap)
    g = nx.DiGraph()
    g.add_nodes_from(range(inst.num_nodes))
    g.add_edges_from(inst.edges.tolist())
    ready = np.zeros(inst.num_nodes)
    for v in nx.topological_sort(g):
        ready[v] = max((ready[u] for u in g.predecessors(v)), default=0.0) + cheap[v]
    return float(ready.max(initial=0.0))


def build_seconds(inst: MaxLoadInstance) -> float:
    """About how long building the latency program takes, from its size (``maxload_cp.BUILD_SECONDS``)."""
    from placement_rl.baselines.maxload_cp import BUILD_SECONDS

    na = inst.accelerators
    return BUILD_SECONDS * (inst.num_nodes * (4 * na + 3) + 5 * len(inst.edges) * na)


def solve_latency(inst: MaxLoadInstance, *, seconds: float = 10.0, ideal_limit: int | None = None,
                  progress: Callable[[str], None] | None = None) -> LatencyResult:
    """The best split for latency (module doc); ``ideal_limit`` for the max-load split's dynamic program, which runs
    before the ``seconds`` of search and reports to ``progress`` as in ``maxload_solve.solve`` (so do the searches
    as they start). The searches run on at most one accelerator per colour class (``maxload.fewer_devices``: more
    cannot help)."""
    from placement_rl.baselines import maxload_cp
    from placement_rl.baselines.maxload_dp import IDEAL_LIMIT

    check_inference(inst)
    t0 = time.perf_counter()
    full, inst = inst, fewer_devices(inst, blocks_of(inst, contiguous=False).count)
    cpu_all = np.full(inst.num_nodes, inst.accelerators, dtype=np.int64)
    cands: dict[str, tuple[float, np.ndarray] | None] = {"all_cpu": None, "maxload_split": None,
                                                         "local_search": None, "cp_sat": None}
    cands["all_cpu"] = (latency_of(inst, cpu_all), cpu_all)
    notes = [] if inst.accelerators else ["the max-load split: not run: no accelerator"]
    if inst.accelerators:
        try:
            dp = contiguous_dp(inst, blocks_of(inst), ideal_limit=ideal_limit or IDEAL_LIMIT, progress=progress)
            cands["maxload_split"] = (latency_of(inst, dp.device), dp.device)
        except GraphError as exc:
            notes.append(f"the max-load split: {str(exc).split(': ', 1)[-1]}")
    bound = path_bound(inst)
    run_cp = False
    if not inst.accelerators:
        notes.append("CP-SAT not run: no accelerator (every node on a CPU is the only split)")
    elif seconds <= 0:
        notes.append("CP-SAT not run: --seconds 0")
    elif not maxload_cp.available():
        notes.append("CP-SAT not run: OR-Tools is not installed (pip install 'placement-rl[exact]')")
    elif build_seconds(inst) > 0.25 * seconds:
        notes.append(f"CP-SAT not run: its program ({inst.num_nodes} nodes on {inst.accelerators} accelerators) "
                     f"takes about {build_seconds(inst):.1f} s to build, over half of its {seconds / 2:g} s (raise "
                     "--seconds)")
    else:
        run_cp = True
    hint = min((c for c in cands.values() if c is not None and np.isfinite(c[0])), key=lambda c: c[0])
    if not inst.accelerators or seconds <= 0:
        notes.append("local search not run: " + ("no accelerator" if not inst.accelerators else "--seconds 0"))
    else:  # local search from the better start, then CP-SAT from its split
        start = np.minimum(hint[1], inst.accelerators)
        classes = blocks_of(inst, contiguous=False)
        search_seconds = seconds / 2 if run_cp else seconds
        if progress is not None and search_seconds >= 2:
            progress(f"local search on {classes.count} colour classes for {search_seconds:.3g} s")
        found, _ = search_blocks(inst, classes, start, inst.accelerators + 1, LATENCY, seconds=search_seconds)
        cands["local_search"] = (latency_of(inst, found), found)
        hint = min(hint, cands["local_search"], key=lambda c: c[0])
    if run_cp:
        if progress is not None:
            progress(f"CP-SAT on the latency program ({inst.num_nodes} nodes) for up to {seconds / 2:.3g} s")
        got = _cp_latency(inst, hint, seconds=seconds / 2)
        if got is not None:
            device, cp_bound = got
            bound = max(bound, cp_bound)
            cands["cp_sat"] = (latency_of(inst, device), device) if device is not None else None
    name, (best, device) = min(((k, v) for k, v in cands.items() if v is not None and np.isfinite(v[0])),
                               key=lambda kv: kv[1][0])
    return LatencyResult({k: (None if v is None else v[0]) for k, v in cands.items()},
                         widen_devices(full, inst, device), best,
                         min(bound, best), maxload_cp.proven(best, bound), name, time.perf_counter() - t0, notes)


def _cp_latency(inst: MaxLoadInstance, hint: tuple[float, np.ndarray], *, seconds: float):
    """The paper's latency program for CP-SAT (one subgraph per accelerator; times in ticks of the hint's latency,
    rounded down, so the bound stays valid: ``maxload_cp.ticks``): (device per node or None, bound), or None where
    CP-SAT found out nothing."""
    from ortools.sat.python import cp_model

    from placement_rl.baselines.maxload_cp import HORIZON, TICKS, _memory_units, run_model, ticks

    n, na = inst.num_nodes, inst.accelerators
    scale = TICKS / max(hint[0], 1e-30)
    acc_t, cpu_t, out_t = (ticks(x, scale) for x in (inst.acc, inst.cpu, inst.out_cost))
    size_u, cap_u = _memory_units(inst.size, inst.max_size)
    horizon = HORIZON * 3
    hint = hint[1]
    m = cp_model.CpModel()
    x = [[m.NewBoolVar(f"x{v}_{d}") for d in range(na + 1)] for v in range(n)]  # d = na: the CPUs
    for v in range(n):
        m.AddExactlyOne(x[v])
        if not inst.supported[v]:
            for d in range(na):
                m.Add(x[v][d] == 0)
    for d in range(na):
        m.Add(sum(int(size_u[v]) * x[v][d] for v in range(n)) <= cap_u)
    by_class = np.argsort(inst.colour, kind="stable").tolist()
    for a, b in zip(by_class, by_class[1:]):  # consecutive members of one colour class share a device
        if inst.colour[a] == inst.colour[b]:
            for d in range(na + 1):
                m.Add(x[a][d] == x[b][d])
    edges = inst.edges.tolist()
    lat = [m.NewIntVar(0, horizon, f"l{v}") for v in range(n)]
    top_var = m.NewIntVar(0, horizon, "latency")
    for d in range(na):
        z = [m.NewBoolVar(f"z{v}_{d}") for v in range(n)]
        comm_in = [m.NewBoolVar(f"ci{v}_{d}") for v in range(n)]
        comm_out = [m.NewBoolVar(f"co{v}_{d}") for v in range(n)]
        for v in range(n):
            m.AddImplication(x[v][d], z[v])
        for u, v in edges:  # contiguity: no path leaves the subgraph and comes back
            m.AddImplication(z[v], z[u])
            m.Add(z[v] <= x[v][d] - x[u][d] + 1)
            m.Add(comm_in[u] >= x[v][d] - x[u][d])
            m.Add(comm_out[u] >= x[u][d] - x[v][d])
        start = m.NewIntVar(0, horizon, f"s{d}")
        finish = m.NewIntVar(0, horizon, f"f{d}")
        for u in range(n):
            m.Add(start >= lat[u]).OnlyEnforceIf(comm_in[u])
        m.Add(finish == start + sum(int(acc_t[v]) * x[v][d] + int(out_t[v]) * (comm_in[v] + comm_out[v])
                                    for v in range(n)))
        for v in range(n):
            m.Add(lat[v] >= finish).OnlyEnforceIf(x[v][d])
    for v in range(n):
        m.Add(lat[v] >= int(cpu_t[v])).OnlyEnforceIf(x[v][na])
    for u, v in edges:
        m.Add(lat[v] >= lat[u] + int(cpu_t[v])).OnlyEnforceIf(x[v][na])
        m.Add(lat[v] >= lat[u])
    for v in range(n):
        m.Add(top_var >= lat[v])
    for v in range(n):
        h = int(min(hint[v], na))
        for d in range(na + 1):
            m.AddHint(x[v][d], d == h)
    m.Minimize(top_var)
    solver, status = run_model(m, seconds)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    device = np.array([next(d for d in range(na + 1) if solver.Value(x[v][d])) for v in range(n)], dtype=np.int64)
    return device, float(solver.BestObjectiveBound()) / scale


__all__ = ["LatencyResult", "build_seconds", "check_inference", "latency_of", "path_bound", "solve_latency"]
