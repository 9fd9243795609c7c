"""``solve``: the max-load model's whole search (``placement_rl.baselines.maxload``): the contiguous dynamic
program, local search from its split, then CP-SAT (``maxload_cp``) for a split of any shape and a bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from placement_rl.baselines import maxload_cp
from placement_rl.baselines.maxload import Split, fewer_devices, improve, lower_bound, widen
from placement_rl.baselines.maxload_blocks import blocks_of
from placement_rl.baselines.maxload_dp import IDEAL_LIMIT, contiguous_dp
from placement_rl.errors import GraphError
from placement_rl.graph.maxload_file import MaxLoadInstance


@dataclass
class MaxLoadResult:
    """What ``solve`` found: the best contiguous split (``contiguous``; None where none fits), the best split of any
    shape (``best``, the contiguous one when nothing beat it), a lower bound on every split's max-load, whether
    ``best`` is proven optimal, notes (what was not run, and why), and the block counts (for contiguous splits, for
    splits of any shape)."""

    contiguous: Split | None
    best: Split
    lower_bound: float
    optimal: bool
    notes: list[str]
    blocks: tuple[int, int]


def solve(inst: MaxLoadInstance, *, ideal_limit: int = IDEAL_LIMIT, seconds: float = 10.0,
          progress: Callable[[str], None] | None = None) -> MaxLoadResult:
    """The contiguous DP, then local search and CP-SAT on the colour classes for a better split of any shape and a
    bound (``seconds`` in all, half each; CP-SAT only where OR-Tools is installed and its model builds in half its
    share, else the local search takes them all). All of them run on at most one device of each kind per colour
    class (``fewer_devices``: more cannot help, and would only slow them); the splits come back on ``inst``'s."""
    classes, blocks = blocks_of(inst, contiguous=False), blocks_of(inst)
    notes: list[str] = []
    full, inst = inst, fewer_devices(inst, classes.count)
    try:
        dp = contiguous_dp(inst, blocks, ideal_limit=ideal_limit, progress=progress)
    except GraphError as exc:
        if seconds <= 0 or not maxload_cp.available():
            raise
        dp = None
        notes.append(str(exc).split(": ", 1)[-1])
    best, bound = dp, lower_bound(inst, classes)
    if seconds > 0:
        cp_seconds = seconds * (0.5 if dp is not None else 1.0)
        build = maxload_cp.build_seconds(inst, classes) if maxload_cp.available() else 0.0
        run_cp = maxload_cp.available() and build <= 0.5 * cp_seconds
        if dp is not None:
            search_seconds = seconds - cp_seconds if run_cp else seconds
            if progress is not None and search_seconds >= 2:
                progress(f"local search on {classes.count} colour classes for {search_seconds:.3g} s")
            moved = improve(inst, classes, dp, seconds=search_seconds)
            if moved.max_load < dp.max_load * (1 - 1e-12):
                best = moved
        if not maxload_cp.available():
            notes.append("OR-Tools is not installed: no CP-SAT search or bound (pip install 'placement-rl[exact]')")
        elif not run_cp:
            notes.append(f"CP-SAT not run: its model ({classes.count} classes on {inst.accelerators + inst.cpus} "
                         f"devices) takes about {build:.1f} s to build, over half of its {cp_seconds:.3g} s (raise "
                         "--seconds)")
        else:
            if progress is not None:
                progress(f"CP-SAT on {classes.count} colour classes for up to {cp_seconds:.3g} s")
            found, cp_bound, _ = maxload_cp.cp_split(inst, classes, best, seconds=cp_seconds)
            best, bound = found or best, max(bound, cp_bound)
    if best is None:
        raise GraphError(f"{inst.path}: no split found: " + "; ".join(notes))
    optimal = maxload_cp.proven(best.max_load, bound)
    if dp is not None and dp.contiguous_optimum and dp.max_load <= best.max_load * (1 + 1e-12):
        best = dp
    if inst is not full:
        notes.append(f"searched on {inst.accelerators} accelerators and {inst.cpus} CPU cores of the "
                     f"{full.accelerators} and {full.cpus}: a split of {classes.count} colour classes uses no more of "
                     "a kind")
    wide_dp = widen(full, inst, dp) if dp is not None else None
    best = wide_dp if best is dp else widen(full, inst, best)
    return MaxLoadResult(wide_dp, best, min(bound, best.max_load), optimal, notes, (blocks.count, classes.count))


__all__ = ["MaxLoadResult", "solve"]
