"""``solve``: the max-load model's whole search (``placement_rl.baselines.maxload``): the contiguous dynamic
program, single moves from its split, then CP-SAT (``maxload_cp``) for a split of any shape and a bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from placement_rl.baselines import maxload_cp
from placement_rl.baselines.maxload import IDEAL_LIMIT, Split, blocks_of, contiguous_dp, improve, lower_bound
from placement_rl.graph.maxload_file import MaxLoadInstance


@dataclass
class MaxLoadResult:
    """What ``solve`` found: the best contiguous split (``contiguous``), the best split of any shape (``best``, the
    same when nothing beat it), a lower bound on every split's max-load and whether ``best`` is proven optimal."""

    contiguous: Split
    best: Split
    lower_bound: float
    optimal: bool
    notes: list[str]


def solve(inst: MaxLoadInstance, *, ideal_limit: int = IDEAL_LIMIT, seconds: float = 10.0,
          progress: Callable[[str], None] | None = None) -> MaxLoadResult:
    """The contiguous DP, then single moves and CP-SAT (``seconds`` in all; CP-SAT only where OR-Tools is
    installed) for a better split of any shape and a bound."""
    blocks = blocks_of(inst)
    dp = contiguous_dp(inst, blocks, ideal_limit=ideal_limit, progress=progress)
    best, bound, optimal, notes = dp, lower_bound(inst, blocks), False, []
    if seconds > 0:
        moved = improve(inst, blocks, dp, seconds=seconds * 0.2)
        if moved.max_load < best.max_load * (1 - 1e-12):
            best = moved
        if maxload_cp.available():
            if progress is not None:
                progress(f"CP-SAT on {blocks.count} blocks for up to {seconds * 0.8:.3g} s")
            found, cp_bound, optimal = maxload_cp.cp_split(inst, blocks, best, seconds=seconds * 0.8)
            best, bound = found or best, max(bound, cp_bound)
        else:
            notes.append("OR-Tools is not installed: no CP-SAT search or bound (pip install 'placement-rl[exact]')")
    if best.max_load <= bound * (1 + 1e-9):
        optimal = True
    if dp.contiguous_optimum and dp.max_load <= bound * (1 + 1e-9):
        best = dp
    return MaxLoadResult(dp, best, min(bound, best.max_load), optimal, notes)


__all__ = ["MaxLoadResult", "solve"]
