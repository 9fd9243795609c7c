"""Fidelity of the GPU cost model on NeuSight's measurements: whole-model and per-op-class errors.

``evaluate(data, fits)`` predicts every label workload with the plain roofline and with calibrated fits
(the full fit, and leave-one-GPU-out fits that never saw the GPU they predict) and returns rows for
``docs/fidelity_gpu.md`` (written by ``scripts/fidelity_gpu.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from placement_rl.cost.calibrated import CLASSES, GpuFit, GpuSpec, node_times
from placement_rl.profiling.calibrate import FitData, GraphSample

# NeuSight's published end-to-end training-latency errors on the workloads in shared/ (README of the data)
NEUSIGHT_PUBLISHED = {("NVIDIA_A100_80GB_PCIe", "gpt2_large-train-1024-1"): 5.2,
                      ("NVIDIA_A100_80GB_PCIe", "gpt2_large-train-1024-4"): 9.9,
                      ("Tesla_V100-PCIE-32GB", "gpt2_large-train-1024-1"): 10.0}


def roofline_node_times(s: GraphSample, launch: float = 8e-6) -> tuple[np.ndarray, np.ndarray]:
    """The plain datasheet roofline (``placement_rl.cost.resolve.roofline_times``) on a sample's features."""
    f = s.feat
    moved = f.in_bytes + f.out_bytes + f.param_bytes
    flops_b = np.where(np.isin(f.cls, [CLASSES.index(c) for c in ("linear", "bmm", "conv")]), 2 * f.flops, 0.0)
    fwd = np.maximum(f.flops / s.spec.peak_flops, moved / s.spec.mem_bandwidth) + launch
    bwd = np.maximum(flops_b / s.spec.peak_flops, 2 * moved / s.spec.mem_bandwidth) + launch
    return fwd, np.where(f.grad, bwd, 0.0)


@dataclass
class WorkloadRow:
    gpu: str
    key: str
    train: bool
    measured: float
    predicted: dict[str, float] = field(default_factory=dict)   # model label -> seconds

    def error(self, model: str) -> float:
        return 100.0 * (self.predicted[model] / self.measured - 1.0)


@dataclass
class ClassRow:
    gpu: str
    cls: str
    measured: float
    predicted: dict[str, float] = field(default_factory=dict)


def whole(s: GraphSample, fwd: np.ndarray, bwd: np.ndarray) -> float:
    return float(s.weights @ (fwd + (bwd if s.train else 0.0)))


def evaluate(data: FitData, fits: Mapping[str, GpuFit | Mapping[str, GpuFit]]) -> tuple[list[WorkloadRow], list[ClassRow]]:
    """Rows per workload and per (GPU, op class). ``fits``: label -> a fit, or label -> {gpu: fit} (LOGO)."""
    rows: list[WorkloadRow] = []
    classes: dict[tuple[str, str], ClassRow] = {}
    for s in data.graphs:
        row = WorkloadRow(gpu=s.gpu, key=s.key, train=s.train, measured=s.whole)
        rf, rb = roofline_node_times(s)
        preds = {"roofline": (rf, rb, rf, rb)}
        for label, fit in fits.items():
            ft = fit[s.gpu] if isinstance(fit, Mapping) else fit
            f, b, _ = node_times(s.feat, s.spec, ft)
            fi, bi, _ = node_times(s.feat, s.spec, ft, isolated=True)
            preds[label] = (f, b, fi, bi)
        for label, (f, b, fi, bi) in preds.items():
            row.predicted[label] = whole(s, f, b)
            for c, name in enumerate(CLASSES):
                m = s.feat.cls == c
                meas = float(s.weights[m] @ (s.fwd[m] + (s.bwd[m] if s.train else 0)))
                if meas <= 0:
                    continue
                cr = classes.setdefault((s.gpu, name), ClassRow(gpu=s.gpu, cls=name, measured=0.0))
                if label == "roofline":
                    cr.measured += meas
                cr.predicted[label] = cr.predicted.get(label, 0.0) + float(
                    s.weights[m] @ (fi[m] + (bi[m] if s.train else 0)))
        rows.append(row)
    return rows, list(classes.values())


def mape(rows: list[WorkloadRow], model: str, *, train: bool = True) -> tuple[float, float]:
    errs = [abs(r.error(model)) for r in rows if r.train == train]
    return (float(np.mean(errs)), float(np.max(errs))) if errs else (float("nan"), float("nan"))


def spearman(rows: list[WorkloadRow], model: str) -> float:
    from scipy.stats import spearmanr

    meas = [r.measured for r in rows]
    pred = [r.predicted[model] for r in rows]
    return float(spearmanr(meas, pred).statistic) if len(rows) > 2 else float("nan")


def spec_table(data: FitData) -> dict[str, GpuSpec]:
    return {s.gpu: s.spec for s in data.graphs} | {k.gpu: k.spec for k in data.kernels}
