"""Fitted models of NCCL point-to-point and collective times, from the Sailor and Vidur tables.

Each measured series (system, collective, GPU count, devices per node) is fitted by a piecewise-linear
curve of ``log(time)`` against ``log2(bytes)`` with a knot every quarter octave (Huber least squares over
the series), which follows the latency floor of small messages and the bandwidth ramp of large ones. The
curve never falls as the message grows, except at a protocol switch the table measured (``_steps``: the
time per byte jumps and stays, over rows on both sides), where it falls only as far as the rows do; a knot
in a gap of the table lies between its neighbours. The knots ship as package data
(``placement_rl/data/collective_fit.json``, written by ``scripts/fit_gpu_costs.py``; sources in
``placement_rl/data/NOTICE``).

``fitted_collective_time(kind, nbytes, n_gpus, system)`` answers in seconds, or None for a system,
collective, layout (one node or several) or GPU count the tables do not hold. Above the largest measured
size the last octave's bandwidth continues linearly (``comm_fit._tail_slope``); below the smallest, the
smallest time. A GPU count that was not measured scales the nearest measured count of the same layout by the
ring factor (``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather and reduce-scatter) only where the
system's own measured counts follow that rule (``comm_fit.select_fit`` says where, and how far it missed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from placement_rl.cost.comm_fit import KINDS, SCHEMA, evaluate_fit, select_fit, shipped, systems
from placement_rl.errors import ProfileError
from placement_rl.profiling.sailor import Series


KNOT_STEP = 0.25  # knots per quarter octave: NCCL switches algorithm / protocol at fixed sizes
STEP_JUMP = 0.12  # a change of log(time per byte) this large between two neighbouring sizes, held on both
                  # sides, is a protocol / algorithm switch: the curve breaks there instead of smoothing it
STEP_SIDE = 4     # rows on each side that must agree on the jump
STEP_FROM = 20.0  # log2 bytes: steps only from 1 MiB up (below, the latency floor; the tables flicker there)
HUBER = float(np.log(1.1))  # log time: a row further than 10% from the curve pulls it linearly, not quadratically


def _steps(x: np.ndarray, y: np.ndarray) -> list[int]:
    """Indices ``i`` where the series switches regime between rows ``i`` and ``i + 1`` (dense tables only:
    neighbouring sizes within 25%; in a table of octaves the time per byte changes between rows for real)."""
    n = x.size
    if n < 2 * STEP_SIDE + 2 or np.median(np.diff(x)) > np.log2(1.25):
        return []
    r = y - x * np.log(2.0)  # log(time per byte)
    # a switch stands out of the table's own row-to-row noise (a noisy table gets no steps, only its curve)
    need = max(STEP_JUMP, 4.0 * float(np.median(np.abs(np.diff(r)))))
    cand = []
    for i in range(STEP_SIDE - 1, n - STEP_SIDE):
        if x[i] < STEP_FROM:
            continue
        left = np.median(r[i - STEP_SIDE + 1:i + 1])
        right = np.median(r[i + 1:i + 1 + STEP_SIDE])
        jump = abs(right - left)
        if jump > need and abs(r[i + 1] - r[i]) > need:
            cand.append((jump, i))
    steps: list[int] = []
    for jump, i in sorted(cand, reverse=True):  # the largest jump of a run; every regime spans 2 x STEP_SIDE rows
        if all(abs(i - j) >= 2 * STEP_SIDE for j in steps):
            steps.append(i)
    return sorted(steps)


def _hat_design(x: np.ndarray, y: np.ndarray, step: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(knots, a, b)`` of one regime: knots at every multiple of ``step`` inside the rows' range plus the two end
    rows (table sizes at powers of two land on knots); ``a @ values ~ b`` holds the rows' hat-function weights and a
    faint curvature penalty, so a knot near no row follows its neighbours."""
    lo, hi = float(x.min()), float(x.max())
    if hi - lo < 1e-9:
        tie = np.array([[1e-3, -1e-3]])
        return np.array([lo, lo + step]), np.vstack([np.tile([1.0, 0.0], (x.size, 1)), tie]), np.r_[y, 0.0]
    grid = np.arange(np.ceil(lo / step) * step, hi, step)
    grid = grid[(grid - lo > step / 8) & (hi - grid > step / 8)]
    knots = np.concatenate([[lo], grid, [hi]])
    h = np.diff(knots)
    basis = np.zeros((x.size, knots.size))
    j = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, knots.size - 2)
    w = np.clip((x - knots[j]) / h[j], 0.0, 1.0)
    basis[np.arange(x.size), j] = 1.0 - w
    basis[np.arange(x.size), j + 1] += w
    d2 = np.zeros((knots.size - 2, knots.size))
    i = np.arange(knots.size - 2)
    d2[i, i], d2[i, i + 1], d2[i, i + 2] = 1.0, -2.0, 1.0
    return knots, np.vstack([basis, 1e-3 * d2]), np.r_[y, np.zeros(knots.size - 2)]


def _rising_fit(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-decreasing knot values ``c`` with ``a @ c ~ b``: ``c = c0 + cumsum(d)`` with every step ``d >= 0``, fitted
    with a Huber loss (a row more than ``HUBER`` off the curve counts linearly, so the few rows of a table off its
    own trend do not pull the curve halfway to them)."""
    from scipy.optimize import least_squares, lsq_linear

    k = a.shape[1]
    lower = np.tril(np.ones((k, k)))  # c = lower @ (c0, d1, ..., d_{k-1})
    bounds = (np.r_[-np.inf, np.zeros(k - 1)], np.full(k, np.inf))
    al = a @ lower
    start = lsq_linear(al, b, bounds=bounds, method="bvls").x  # the plain least-squares fit
    p = least_squares(lambda q: al @ q - b, np.maximum(start, bounds[0]), jac=lambda q: al, bounds=bounds,
                      loss="huber", f_scale=HUBER, method="trf").x
    return lower @ p


def fit_series(s: Series, step: float = KNOT_STEP) -> dict[str, Any]:
    """Knots ``log2(bytes)`` and fitted ``log(seconds)`` of one series: a non-decreasing piecewise-linear curve per
    regime, regimes split where the table switches protocol (``_steps``), so a switch is a step, not a ramp (where
    NCCL measured the larger message faster, the time falls there, and nowhere else). A ``p2p`` series keeps the
    plain least-squares curve it had before the collectives' curves were made to rise: it prices every link of the
    op-level simulator, whose published figures (the test split's pairs on measured systems) were measured with it,
    and the rising fit scores the same on it (88% of rows within 10% against 88%)."""
    order = np.argsort(s.sizes, kind="stable")
    x = np.log2(s.sizes[order])
    y = np.log(s.times[order])
    cuts = [0] + [i + 1 for i in _steps(x, y)] + [x.size]
    ks, cs = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        k, design, rhs = _hat_design(x[a:b], y[a:b], step)
        c = np.linalg.lstsq(design, rhs, rcond=None)[0] if s.kind == "p2p" else _rising_fit(design, rhs)
        if ks and k[0] <= ks[-1][-1]:
            k, c = k[1:], c[1:]
        ks.append(k)
        cs.append(c)
    knots, coef = np.concatenate(ks), np.concatenate(cs)
    return {"system": s.system, "source": s.source, "kind": s.kind, "n_gpus": s.n_gpus,
            "devices_per_node": s.devices_per_node, "log2_bytes": [round(float(k), 6) for k in knots],
            "log_seconds": [round(float(c), 6) for c in coef],
            "min_bytes": float(s.sizes.min()), "max_bytes": float(s.sizes.max())}


def fit_all(root: str | Path) -> dict[str, Any]:
    """Fit every Sailor and Vidur series under ``root`` (the gpu-measurements folder)."""
    from placement_rl.profiling import sailor, vidur

    root = Path(root)
    series: list[Series] = []
    for d in sorted((root / "sailor").glob("*/")):
        series += sailor.read_system(d)
    for d in sorted((root / "vidur").glob("*/")):
        series += vidur.read_system(d)
    if not series:
        raise ProfileError(f"'{root}' holds no sailor/<GPU>/ or vidur/<system>/ tables")
    return {"schema": SCHEMA, "version": 1, "fits": [fit_series(s) for s in series],
            "units": "bytes, seconds; MB in the Sailor files taken as 2**20 bytes"}


def fit_errors(entry: dict[str, Any], s: Series, min_bytes: float = 2.0 ** 20) -> np.ndarray:
    """Relative errors ``fit / measured - 1`` at the measured sizes >= ``min_bytes``."""
    m = s.sizes >= min_bytes
    return evaluate_fit(entry, s.sizes[m]) / s.times[m] - 1.0


def neighbour_consistency(s: Series, min_bytes: float = 2.0 ** 20, width: int = 2) -> np.ndarray:
    """How far each row (>= ``min_bytes``) is from its own table: ``time/size`` over the median ``time/size`` of
    its ``width`` neighbours on each side (itself excluded), minus 1. The noise floor of any smooth fit: a row
    more than 10% from its neighbours cannot be within 10% of a curve that is within 10% of them. Empty where
    neighbouring sizes are more than 25% apart (there the time per byte may change between rows for real)."""
    m = s.sizes >= min_bytes
    y = s.times[m] / s.sizes[m]
    if y.size < 3 or np.median(s.sizes[m][1:] / s.sizes[m][:-1]) > 1.25:
        return np.zeros(0)
    ref = np.array([np.median(np.delete(y[max(0, i - width):i + width + 1], min(i, width))) for i in range(y.size)])
    return y / ref - 1.0


def fitted_collective_time(kind: str, nbytes: float, n_gpus: int, system: str, *,
                           devices_per_node: int | None = None,
                           fits: Iterable[dict[str, Any]] | None = None) -> float | None:
    """Seconds of one ``kind`` collective of ``nbytes`` over ``n_gpus`` GPUs of ``system``, or None.

    ``devices_per_node``: GPUs per node (default: all ``n_gpus`` on one node; for p2p, 2 = intra-node and
    1 = across nodes). ``system``: a Sailor GPU folder (``A100-40``, ``V100-16``, ``GH-96``) or a Vidur
    system (``a100_dgx``, ``h100_dgx``, ``a100_pairwise_nvlink``, ``h100_pairwise_nvlink``).
    """
    if n_gpus == 1 and kind != "p2p" and kind in KINDS:
        return 0.0
    sel = select_fit(kind, n_gpus, system, devices_per_node, fits=fits)
    if sel is None:
        return None
    entry, factor = sel
    return float(evaluate_fit(entry, nbytes) * factor)


def link_figures(system: str, *, devices_per_node: int = 2, fits: Iterable[dict[str, Any]] | None = None,
                 small: float = 2.0 ** 11, large: tuple[float, float] = (2.0 ** 24, 2.0 ** 26)
                 ) -> tuple[float, float] | None:
    """``(latency s, bandwidth bytes/s)`` of a p2p link from the fit: the small-message time and the slope
    between two large sizes (the ``latency + bytes / bandwidth`` form ``simulate()`` uses)."""
    t = [fitted_collective_time("p2p", s, 2, system, devices_per_node=devices_per_node, fits=fits)
         for s in (small, *large)]
    if any(x is None for x in t):
        return None
    bw = (large[1] - large[0]) / max(t[2] - t[1], 1e-12)
    return float(t[0]), float(bw)


def shipped_fits_for(series: Iterable[Series]) -> list[dict[str, Any]]:
    """The shipped fit of each measured series (same system, collective, GPU count and GPUs per node)."""
    by_key = {(f["system"], f["kind"], f["n_gpus"], f["devices_per_node"]): f for f in shipped()}
    out = []
    for s in series:
        f = by_key.get((s.system, s.kind, s.n_gpus, s.devices_per_node))
        if f is None:
            raise ProfileError(f"no shipped collective fit for {s.key}; re-run scripts/fit_gpu_costs.py")
        out.append(f)
    return out


__all__ = ["fit_all", "fit_errors", "fit_series", "fitted_collective_time", "link_figures", "neighbour_consistency",
           "shipped_fits_for", "systems"]
