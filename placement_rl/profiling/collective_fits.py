"""Fitted models of NCCL point-to-point and collective times, from the Sailor and Vidur tables.

Each measured series (system, collective, GPU count, devices per node) is fitted by a piecewise-linear
curve of ``log(time)`` against ``log2(bytes)`` with a knot every quarter octave (least squares over the
series), which follows the latency floor of small messages and the bandwidth ramp of large ones. The
knots ship as package data (``placement_rl/data/collective_fit.json``, written by
``scripts/fit_gpu_costs.py``; sources in ``placement_rl/data/NOTICE``).

``fitted_collective_time(kind, nbytes, n_gpus, system)`` answers in seconds, or None for a system or
collective the tables do not hold. Above the largest measured size the last octave's bandwidth
continues linearly; below the smallest, the smallest time. A GPU count that was not measured scales the
nearest measured count by the ring factor (``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather and
reduce-scatter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from placement_rl.cost.comm_fit import KINDS, SCHEMA, evaluate_fit, select_fit, shipped, systems
from placement_rl.errors import ProfileError
from placement_rl.profiling.sailor import Series


KNOT_STEP = 0.25  # knots per quarter octave: NCCL switches algorithm / protocol at fixed sizes


def fit_series(s: Series, step: float = KNOT_STEP) -> dict[str, Any]:
    """Knots ``log2(bytes)`` and fitted ``log(seconds)`` of one series."""
    x = np.log2(s.sizes)
    y = np.log(s.times)
    lo, hi = np.floor(x.min() / step) * step, np.ceil(x.max() / step) * step
    knots = np.arange(lo, hi + step / 2, step)
    if knots.size < 2:
        knots = np.array([lo, lo + step])
    basis = np.maximum(0.0, 1.0 - np.abs(x[:, None] - knots[None, :]) / step)  # hat functions
    used = basis.sum(axis=0) > 0
    coef = np.full(knots.size, np.nan)
    coef[used] = np.linalg.lstsq(basis[:, used], y, rcond=None)[0]
    good = ~np.isnan(coef)
    coef = np.interp(knots, knots[good], coef[good])  # knots without data: interpolate neighbours
    return {"system": s.system, "source": s.source, "kind": s.kind, "n_gpus": s.n_gpus,
            "devices_per_node": s.devices_per_node, "log2_bytes": [round(float(k), 4) for k in knots],
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
