"""The max-load model (``placement_rl.baselines.maxload``) for CP-SAT: the best split of the blocks over the devices,
contiguous or not, with a proven lower bound when stopped early.

Variables: ``x[b, d]`` (block ``b`` on device ``d``; accelerators ``0 .. A-1``, CPU cores after) and, per source
node ``s`` and accelerator ``d``, ``y[s, d]`` (``d`` pays ``s``'s output: ``s`` is on ``d`` and a consumer is not, or
the reverse). Each accelerator's load (times plus paid outputs) and each core's (times) is at most ``L``, which is
minimised; an accelerator holds at most ``max_size`` bytes and no block it cannot run. Devices of one kind are
interchangeable, so block ``b`` may use only devices ``0 .. b`` of each kind (the ``k``-th device of a kind, in
order of first use, holds no block before ``b = k``). Times are integer ticks of the hint's max-load, rounded down
(``ticks``: the bound stays valid; every split is scored again exactly; ``proven`` allows for the rounding), sizes
in whole bytes (else rounded up, and capacities down: a split the model admits fits).
"""

from __future__ import annotations

import math
import time

import numpy as np

from placement_rl.baselines.maxload import Split, evaluate
from placement_rl.baselines.maxload_blocks import Blocks
from placement_rl.baselines.maxload_dp import _sources
from placement_rl.graph.maxload_file import MaxLoadInstance

TICKS = 10_000_000  # integer ticks of the best value known (or the largest possible one)
HORIZON = 4 * TICKS
OPTIMAL_TOL = 1e-5  # a value within this of a bound is optimal: the ticks' rounding (a few per term) is below it
MEM_UNITS = 10_000_000


def _require_ortools():
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        return None
    return cp_model


def available() -> bool:
    return _require_ortools() is not None


BUILD_SECONDS = 1.2e-5  # per variable or constraint term, building the model here (a 2,000-block chain on 64
# accelerators: 510,000 in 5.6 s)


def build_seconds(inst: MaxLoadInstance, blocks: Blocks) -> float:
    """About how long building the model takes, from its size."""
    na, nd = inst.accelerators, inst.accelerators + inst.cpus
    _, _, ptr, _ = _sources(inst, blocks, np.arange(blocks.count))
    terms = blocks.count * nd + (len(ptr) - 1) * na + 2 * int(ptr[-1]) * na
    return BUILD_SECONDS * terms


def cp_split(inst: MaxLoadInstance, blocks: Blocks, hint: Split | None, *,
             seconds: float) -> tuple[Split | None, float, bool]:
    """(CP-SAT's split where it beats ``hint``, else None; a lower bound on every split's max-load; whether the
    better of the two meets it). Times are ticks of the hint's max-load (``ticks``)."""
    cp_model = _require_ortools()
    t0 = time.perf_counter()
    na, nc = inst.accelerators, inst.cpus
    nb = blocks.count
    src_block, src_cost, ptr, cons = _sources(inst, blocks, np.arange(nb))
    top = hint.max_load if hint is not None else max(float(blocks.acc.sum() + src_cost.sum()),
                                                      float(blocks.cpu.sum()))
    scale = TICKS / max(top, 1e-30)
    acc_t, cpu_t, cost_t = (ticks(x, scale) for x in (blocks.acc, blocks.cpu, src_cost))
    size_u, cap_u = _memory_units(blocks.size, inst.max_size)
    m = cp_model.CpModel()
    fits = (blocks.bad < 0.5) & (size_u <= cap_u)
    x = {}
    for b in range(nb):
        options = []
        for d in range(min(na, b + 1)):
            if fits[b]:
                x[b, d] = m.NewBoolVar(f"x{b}_{d}")
                options.append(x[b, d])
        for k in range(min(nc, b + 1)):
            x[b, na + k] = m.NewBoolVar(f"x{b}_{na + k}")
            options.append(x[b, na + k])
        m.AddExactlyOne(options)
    zero = m.NewConstant(0)

    def on(b, d):
        return x.get((b, d), zero)

    big = m.NewIntVar(0, HORIZON, "L")
    for d in range(na):
        terms = [(int(acc_t[b]), x[b, d]) for b in range(nb) if (b, d) in x]
        if not terms:
            continue
        m.Add(sum(int(size_u[b]) * x[b, d] for b in range(nb) if (b, d) in x) <= cap_u)
        for s in range(len(src_block)):
            bs = int(src_block[s])
            y = m.NewBoolVar(f"y{s}_{d}")
            for q in range(ptr[s], ptr[s + 1]):
                c = int(cons[q])
                m.Add(y >= on(bs, d) - on(c, d))
                m.Add(y >= on(c, d) - on(bs, d))
            terms.append((int(cost_t[s]), y))
        m.Add(big >= sum(w * v for w, v in terms))
    for k in range(nc):
        d = na + k
        m.Add(big >= sum(int(cpu_t[b]) * x[b, d] for b in range(nb) if (b, d) in x))
    if hint is not None:
        _hint(m, x, blocks, hint, na, na + nc)
    m.Minimize(big)
    solver, status = run_model(m, seconds)
    bound = max(0.0, float(solver.BestObjectiveBound()) / scale) if status != cp_model.UNKNOWN else 0.0
    found = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        dev_block = np.array([next(d for d in range(na + nc) if (b, d) in x and solver.Value(x[b, d]))
                              for b in range(nb)], dtype=np.int64)
        device = dev_block[blocks.block]
        loads, broken = evaluate(inst, device)
        if not broken and (hint is None or float(loads.max()) < hint.max_load * (1 - 1e-12)):
            stats = {"seconds": time.perf_counter() - t0, "cp_bound": bound}
            found = Split(device, loads, float(loads.max()), "CP-SAT", False, [], stats)
    best = found.max_load if found is not None else hint.max_load if hint is not None else np.inf
    return found, bound, proven(best, bound)


def ticks(values: np.ndarray, scale: float) -> np.ndarray:
    """Times as integer ticks, rounded down and capped at ``HORIZON`` (a term above it makes a split worse than
    the best known, in the model too): every split's value in the model is at most its true value, so the
    model's optimum bounds the true one from below."""
    return np.minimum(np.floor(np.asarray(values, dtype=np.float64) * scale), HORIZON).astype(np.int64)


def proven(best: float, bound: float) -> bool:
    """Whether a value meets a bound, to the ticks' rounding (``OPTIMAL_TOL`` relative)."""
    return best <= bound * (1 + OPTIMAL_TOL)


MAX_WORKERS = 8  # CP-SAT's portfolio: past about eight workers it adds little


def run_model(model, seconds: float):
    """(solver, status) of one CP-SAT run (seed 0) of at most ``seconds``, with a worker per core this process may
    use (at most ``MAX_WORKERS``): on the zoo's operator graphs for latency at 10 s, two workers against one gave
    15.1 / 27.0 / 36.7 ms (proved) against 15.9 / 28.9 / 43.1 (inception, moe, resnet50; the max-load instances
    tried were the same)."""
    import os

    cp_model = _require_ortools()
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(seconds))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    solver.parameters.num_workers = max(1, min(MAX_WORKERS, cores))
    solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the command, not just this search
    solver.parameters.random_seed = 0
    return solver, solver.Solve(model)


def _memory_units(size: np.ndarray, cap: float) -> tuple[np.ndarray, int]:
    """Sizes and the capacity as integers: exact for whole bytes, else ``MEM_UNITS`` units of the capacity, sizes
    rounded up and the capacity down (a split the model admits fits)."""
    total = float(size.sum())
    if np.all(size == np.round(size)) and total < 2**53:
        return size.astype(np.int64), int(min(math.floor(cap), total))
    scale = MEM_UNITS / max(cap, float(size.max(initial=0.0)), 1e-30)
    return np.ceil(size * scale - 1e-9).astype(np.int64), int(math.floor(cap * scale + 1e-9))


def _hint(m, x, blocks: Blocks, hint: Split, na: int, n_dev: int) -> None:
    """The hint relabelled so that devices of a kind are numbered by the first block each holds."""
    dev_block = np.empty(blocks.count, dtype=np.int64)
    dev_block[blocks.block] = hint.device
    relabel: dict[int, int] = {}
    counts = [0, 0]
    for b in range(blocks.count):
        d = int(dev_block[b])
        kind = 0 if d < na else 1
        if d not in relabel:
            relabel[d] = counts[kind] if kind == 0 else na + counts[kind]
            counts[kind] += 1
        for dd in range(n_dev):
            if (b, dd) in x:
                m.AddHint(x[b, dd], dd == relabel[d])


__all__ = ["available", "build_seconds", "cp_split", "proven", "run_model", "ticks"]
