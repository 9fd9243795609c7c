"""GPU measurements this project made itself (``placement_rl/data/measured/<gpu>/``, written by
``scripts/measure_gpu.py``), read in NeuSight's formats, and the held-out check of the calibrated cost model on
them: single-kernel tables per op class and whole-model times against the model's predictions for a GPU that no
fit has seen.

A measured folder holds ``device_configs/<GPU>.json`` (datasheet figures), ``kernels/<op>/<GPU>.csv``
(``Latency`` ms and the shape columns of NeuSight's tables) and ``labels/<GPU>/<workload>.json`` (whole-model
``fw_latency`` / ``bwall_latency`` / ``e2e_latency`` ms, no per-node file: the whole-model prediction prices the
workload's graph from NeuSight's label files, whose shapes do not depend on the GPU).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from placement_rl.cost.calibrated import GpuFit, GpuSpec, harness_offset, node_times
from placement_rl.errors import ProfileError
from placement_rl.profiling import calibrate, neusight
from placement_rl.profiling.gpu_fidelity import kernel_times

MEASURED_DIR = Path(__file__).resolve().parents[1] / "data" / "measured"


def measured_folders(base: str | Path = MEASURED_DIR) -> list[Path]:
    """Every measured GPU folder under ``base`` (one with a ``device_configs/`` folder)."""
    b = Path(base)
    return sorted(p for p in b.iterdir() if (p / "device_configs").is_dir()) if b.is_dir() else []


def gpu_of(folder: str | Path) -> tuple[str, GpuSpec]:
    """``(GPU file name, GpuSpec)`` of a measured folder's single device config."""
    configs = sorted((Path(folder) / "device_configs").glob("*.json"))
    if len(configs) != 1:
        raise ProfileError(f"{folder}: expected one device_configs/<GPU>.json, found {len(configs)}")
    return configs[0].stem, calibrate.spec_of(neusight.read_device_config(configs[0]))


@dataclass
class WholeRun:
    key: str            # <model>-<train|inf>-<seq>-<batch>
    train: bool
    measured: float     # seconds, forward (+ backward for training)
    predicted: dict[str, float] = field(default_factory=dict)


def read_whole_runs(folder: str | Path) -> list[WholeRun]:
    """The whole-model runs of a measured folder (``labels/<GPU>/*.json``)."""
    gpu, _ = gpu_of(folder)
    out = []
    for p in sorted((Path(folder) / "labels" / gpu).glob("*.json")):
        try:
            d = json.loads(p.read_text())
            e2e = float(d["e2e_latency"]) * 1e-3
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
            raise ProfileError(f"{p}: expected a JSON object with a numeric e2e_latency (ms)") from None
        parts = p.stem.split("-")
        if len(parts) != 4 or parts[1] not in ("train", "inf") or not math.isfinite(e2e) or e2e <= 0:
            raise ProfileError(f"{p}: expected <model>-<train|inf>-<seq>-<batch>.json with e2e_latency > 0")
        out.append(WholeRun(key=p.stem, train=parts[1] == "train", measured=e2e))
    return out


def predict_whole(runs: Sequence[WholeRun], graphs: Sequence, spec: GpuSpec,
                  fits: Mapping[str, GpuFit]) -> list[WholeRun]:
    """Fill each run's ``predicted`` with every fit's whole-model time on ``spec``, pricing the workload's graph
    (``calibrate.GraphSample`` of the same key, from any GPU's label files). Runs without a graph are dropped."""
    by_key = {}
    for s in graphs:
        by_key.setdefault(s.key, s)
    out = []
    for r in runs:
        s = by_key.get(r.key)
        if s is None:
            continue
        for label, fit in fits.items():
            f, b, _ = node_times(s.feat, spec, fit)
            r.predicted[label] = float(s.weights @ (f + b if r.train else f))
        out.append(r)
    return out


def whole_mape(runs: Sequence[WholeRun], model: str, train: bool | None = None) -> tuple[float, float]:
    """``(MAPE %, mean predicted / measured)`` of one model over the runs (``train`` None: all)."""
    sel = [r for r in runs if train is None or r.train == train]
    if not sel:
        return float("nan"), float("nan")
    ratio = np.array([r.predicted[model] / r.measured for r in sel])
    return float(100 * np.mean(np.abs(ratio - 1))), float(ratio.mean())


@dataclass
class KernelCheck:
    op: str
    rows: int
    mape: dict[str, float]
    ratio: dict[str, float]   # geometric mean of predicted / measured


def kernel_dir(dtype: str = "fp32") -> str:
    """The folder of a dtype's kernel tables (``scripts/measure_gpu.py --dtype``): fp32 in ``kernels``."""
    return "kernels" if dtype == "fp32" else f"kernels_{dtype}"


def load_table(folder: str | Path, op: str, min_latency: float = 5e-5,
               dtype: str = "fp32") -> calibrate.KernelSample | None:
    """Every row of at least ``min_latency`` seconds of the folder's ``op`` kernel table (None: no table)."""
    gpu, spec = gpu_of(folder)
    p = Path(folder) / kernel_dir(dtype) / op / f"{gpu}.csv"
    if not p.is_file():
        return None
    return calibrate.load_kernels(p, op, gpu, spec, max_rows=10**7, min_latency=min_latency)


def harness_floor(folder: str | Path, max_elements: int = 100_000) -> float:
    """Seconds the folder's timing harness reads for a kernel that does almost nothing: the median of its ``add``
    rows of fewer than ``max_elements`` elements (the host's dispatch interval between timed calls)."""
    import csv

    gpu, _ = gpu_of(folder)
    p = Path(folder) / "kernels" / "add" / f"{gpu}.csv"
    try:
        with p.open(newline="") as fh:
            lat = [float(r["Latency"]) for r in csv.DictReader(fh) if float(r["B"]) * float(r["H"]) < max_elements]
    except (OSError, KeyError, ValueError) as exc:
        raise ProfileError(f"{p}: cannot read the tiny add kernels for the harness floor ({exc})") from None
    if not lat:
        raise ProfileError(f"{p}: no add kernel under {max_elements} elements to read the harness floor from")
    return float(np.median(lat)) * 1e-3


def check_kernels(folder: str | Path, fits: Mapping[str, GpuFit | None], *, min_latency: float = 5e-5,
                  ops: Sequence[str] = calibrate.KERNEL_OPS,
                  floor_fits: Mapping[str, GpuFit] | None = None, floor: float | None = None,
                  dtype: str = "fp32", tensor_peak: float | None = None) -> list[KernelCheck]:
    """Per op class: MAPE and geometric-mean ratio of each model (``None``: the roofline) over the measured
    kernel rows of at least ``min_latency`` seconds (below it the timing harness's floor dominates).
    ``floor_fits``: models priced with this folder's own harness floor (``harness_floor``) as each kernel's fixed
    cost, in place of the fit's launch cost and kernel-harness offset (both fitted on NeuSight's harness);
    ``floor``: that floor if already read. ``dtype`` tf32 / bf16: the folder's tables of that dtype
    (``kernels_<dtype>/``), priced at ``tensor_peak`` for the GEMM classes (bf16 moving half the bytes)."""
    if floor_fits and floor is None:
        floor = harness_floor(folder)
    out = []
    for op in ops:
        k = load_table(folder, op, min_latency, dtype)
        if k is None:
            continue
        mape, ratio = {}, {}
        kw = dict(dtype=dtype, tensor_peak=tensor_peak)
        preds = {label: kernel_times(k, fit, **kw) for label, fit in fits.items()}
        for label, fit in (floor_fits or {}).items():
            preds[label] = kernel_times(k, fit, **kw) - fit.p("launch") - harness_offset(k.feat.cls, fit) + floor
        for label, pred in preds.items():
            r = pred / k.fwd
            mape[label] = float(100 * np.mean(np.abs(r - 1)))
            ratio[label] = float(np.exp(np.mean(np.log(r))))
        out.append(KernelCheck(op=op, rows=len(k.fwd), mape=mape, ratio=ratio))
    return out


def kernel_bins(folder: str | Path, fit: GpuFit, op: str,
                edges: Sequence[float] = (5e-5, 2e-4, 1e-3, 1e-2, math.inf)
                ) -> list[tuple[float, float, int, float, float]]:
    """One op class's kernels by measured duration: ``(low s, high s, rows, MAPE %, geometric-mean predicted /
    measured)`` of ``fit`` per bin (empty bins left out)."""
    k = load_table(folder, op, edges[0])
    if k is None:
        return []
    r = kernel_times(k, fit) / k.fwd
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (k.fwd >= lo) & (k.fwd < hi)
        if m.any():
            out.append((lo, hi, int(m.sum()), float(100 * np.mean(np.abs(r[m] - 1))),
                        float(np.exp(np.mean(np.log(r[m]))))))
    return out
