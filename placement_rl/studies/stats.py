"""Aggregation of study runs: mean and sample standard deviation over seeds per cell, and best-so-far learning
curves on a common grid of simulator calls (with spread)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from placement_rl.studies.ablation import RunResult

__all__ = ["band", "curve_band", "mean_std", "step_curve", "summarise"]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for one value) of the finite values; NaN when none."""
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def summarise(results: Sequence[RunResult], cells: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per cell (in ``cells`` order): mean and std over seeds of the step time, ratio to the best
    baseline, speed-up over one device, greedy-policy time and wall-clock; counts of seeds and wins."""
    order = list(cells) if cells is not None else list(dict.fromkeys(r.cell for r in results))
    rows = []
    for name in order:
        rs = [r for r in results if r.cell == name]
        if not rs:
            continue
        row: dict[str, Any] = {"cell": name, "seeds": len(rs), "seed_list": " ".join(str(r.seed) for r in rs),
                               "feasible_runs": sum(r.feasible for r in rs),
                               "beats_baseline": sum(bool(r.ratio < 1.0 - 1e-9) for r in rs),
                               "best_baseline": max(set(r.baseline for r in rs), key=[r.baseline for r in rs].count)}
        for key, vals in (("step_time_ms", [r.step_time * 1e3 for r in rs]),
                          ("ratio", [r.ratio for r in rs]), ("speedup", [r.speedup for r in rs]),
                          ("greedy_time_ms", [r.greedy_time * 1e3 for r in rs]),
                          ("baseline_ms", [r.baseline_time * 1e3 for r in rs]),
                          ("single_ms", [r.single_time * 1e3 for r in rs]),
                          ("train_seconds", [r.seconds for r in rs]), ("sim_calls", [r.sim_calls for r in rs])):
            row[f"{key}_mean"], row[f"{key}_std"] = mean_std(vals)
        rows.append(row)
    return rows


def step_curve(curve: Sequence[tuple[int, float]], grid: np.ndarray) -> np.ndarray:
    """Best-so-far value at each grid point (the last curve point at or before it; NaN before the first)."""
    out = np.full(grid.shape, np.nan)
    if not curve:
        return out
    calls = np.array([c[0] for c in curve], dtype=float)
    vals = np.array([c[1] for c in curve], dtype=float)
    idx = np.searchsorted(calls, grid, side="right") - 1
    ok = idx >= 0
    out[ok] = vals[idx[ok]]
    return out


def band(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std over the rows of ``runs [seeds, points]``; NaN at points where a seed has no value
    yet (so the mean never mixes different subsets of seeds)."""
    complete = np.isfinite(runs).all(axis=0)
    mean = np.full(runs.shape[1], np.nan)
    std = np.zeros(runs.shape[1])
    if complete.any():
        mean[complete] = runs[:, complete].mean(axis=0)
        if runs.shape[0] > 1:
            std[complete] = runs[:, complete].std(axis=0, ddof=1)
    return mean, std


def curve_band(results: Sequence[RunResult], cell: str, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std over seeds of a cell's best-so-far step time on ``grid`` (see ``band``)."""
    return band(np.stack([step_curve(r.curve, grid) for r in results if r.cell == cell]))
