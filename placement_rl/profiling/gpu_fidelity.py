"""Fidelity of the GPU cost model on NeuSight's measurements: whole-model and per-op-class errors.

``evaluate(data, fits)`` predicts every label workload with the plain roofline and with calibrated fits
(the full fit, and leave-one-GPU-out fits that never saw the GPU they predict) and returns rows for
``docs/fidelity_gpu.md`` (written by ``scripts/fidelity_gpu.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from placement_rl.cost.calibrated import (CLASSES, ELEMENT_SCALE, GEMM_CLASSES, GpuFit, GpuSpec, node_times,
                                          table_times)
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
    node_sum: float = 0.0   # the run's own per-node measurements summed (embedding + L x layer + head)
    kernels: float = 0.0    # kernel-launching nodes of the step (forward + backward), layers counted L times
    isolated: dict[str, float] = field(default_factory=dict)    # model label -> per-op (isolated) sum, seconds

    def error(self, model: str) -> float:
        return 100.0 * (self.predicted[model] / self.measured - 1.0)

    def work_error(self, model: str) -> float:
        """Error of the model's per-op (isolated) times summed against the measured per-node sum."""
        return 100.0 * (self.isolated[model] / self.node_sum - 1.0)


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
        row = WorkloadRow(gpu=s.gpu, key=s.key, train=s.train, measured=s.whole, node_sum=whole(s, s.fwd, s.bwd))
        launches = s.feat.cls != CLASSES.index("view")
        row.kernels = float(s.weights @ ((s.fwd > 0) & launches)) + float(s.weights @ ((s.bwd > 0) & launches))
        rf, rb = roofline_node_times(s)
        preds = {"roofline": (rf, rb, rf, rb)}
        for label, fit in fits.items():
            ft = fit[s.gpu] if isinstance(fit, Mapping) else fit
            f, b, _ = node_times(s.feat, s.spec, ft)
            fi, bi, _ = node_times(s.feat, s.spec, ft, isolated=True)
            preds[label] = (f, b, fi, bi)
        for label, (f, b, fi, bi) in preds.items():
            row.predicted[label] = whole(s, f, b)
            row.isolated[label] = whole(s, fi, bi)
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


def mape(rows: list[WorkloadRow], model: str, *, train: bool = True, work: bool = False) -> tuple[float, float]:
    """(MAPE, max) over the training (or inference) rows: against the measured whole model, or with
    ``work=True`` the model's per-op sum against the measured per-node sum (the GPU work, op by op)."""
    errs = [abs(r.work_error(model) if work else r.error(model)) for r in rows if r.train == train]
    return (float(np.mean(errs)), float(np.max(errs))) if errs else (float("nan"), float("nan"))


@dataclass
class FloorRow:
    predictor: str
    knows: str
    mape: float
    max: float


def _best_factor(s: np.ndarray, e: np.ndarray) -> float:
    grid = np.linspace(0.5, 1.5, 1001)
    return float(grid[int(np.argmin([np.mean(np.abs(r * s / e - 1.0)) for r in grid]))])


def per_node_floor(rows: list[WorkloadRow]) -> list[FloorRow]:
    """What the files allow a per-op predictor on the whole-model training times.

    Oracles that know every per-node time the runs measured, exactly, and turn it into a whole-model time:
    the plain sum; the sum times the one factor that fits all runs best (chosen on the very runs it is scored
    on); that, plus a per-kernel term (both chosen in-sample); the factor a leave-one-GPU-out fit can learn
    (from the other GPU's runs); and a factor per GPU chosen on that GPU's own whole-model times (knowledge no
    model of an unseen GPU has). A model of GPUs and ops predicts the per-node times at best, so the first
    four bound what it can reach; the last shows how much of the rest is one host's offset.
    """
    tr = [r for r in rows if r.train]
    s = np.array([r.node_sum for r in tr])
    e = np.array([r.measured for r in tr])
    k = np.array([r.kernels for r in tr])
    gpu = np.array([r.gpu for r in tr])

    def row(name: str, knows: str, p: np.ndarray) -> FloorRow:
        err = 100.0 * np.abs(p / e - 1.0)
        return FloorRow(name, knows, float(err.mean()), float(err.max()))

    out = [row("per-node sum", "every measured per-node time", s)]
    r = _best_factor(s, e)
    out.append(row(f"per-node sum x {r:.3f}", "+ the best single factor, chosen on these runs", r * s))
    if k.any():
        best = None
        for f in np.linspace(0.8, 1.2, 81):
            for d in np.linspace(-60e-6, 60e-6, 121):
                p = f * s + d * k
                if np.all(p > 0):
                    m = float(np.mean(np.abs(p / e - 1.0)))
                    if best is None or m < best[0]:
                        best = (m, f, d)
        if best is not None:
            _, f, d = best
            out.append(row(f"per-node sum x {f:.3f} {1e6 * d:+.0f} us per kernel",
                           "+ the best factor and per-kernel term, chosen on these runs", f * s + d * k))
    logo = np.zeros_like(s)
    own = np.zeros_like(s)
    for g in sorted(set(gpu)):
        m = gpu == g
        logo[m] = _best_factor(s[~m], e[~m]) * s[m] if (~m).any() else s[m]
        own[m] = _best_factor(s[m], e[m]) * s[m]
    out.append(row("per-node sum x the other GPU's factor", "+ a factor learned without the predicted GPU "
                   "(what leave-one-GPU-out can learn)", logo))
    out.append(row("per-node sum x its own GPU's factor", "+ a factor per GPU chosen on that GPU's own whole-model "
                   "times (not available for an unseen GPU)", own))
    return out


@dataclass
class KernelRow:
    """One kernel table (an op on one GPU): rows, measured total, and each model's per-kernel MAPE."""

    gpu: str
    op: str
    rows: int
    mape: dict[str, float] = field(default_factory=dict)


def kernel_times(k, fit: GpuFit | None, *, dtype: str = "fp32", tensor_peak: float | None = None) -> np.ndarray:
    """Predicted times of a kernel table's rows: the roofline (``fit`` None, ``+ 8 us``) or a fit's isolated
    time with the kernel files' harness floor (``harness_offset``, per class) instead of the label files'.
    ``dtype`` tf32 / bf16 with ``tensor_peak``: GEMM classes at that peak, bf16 moving half the bytes."""
    f = k.feat
    if fit is None:
        scale = ELEMENT_SCALE.get(dtype, 1.0)
        peak = np.full(f.cls.shape, k.spec.peak_flops)
        if dtype != "fp32" and tensor_peak:  # GEMM classes on the tensor cores
            peak[np.isin(f.cls, [CLASSES.index(c) for c in GEMM_CLASSES])] = tensor_peak
        moved = (f.in_bytes + f.out_bytes + f.param_bytes) * scale
        return np.maximum(f.flops / peak, moved / k.spec.mem_bandwidth) + 8e-6
    return table_times(f, k.spec, fit, dtype=dtype, tensor_peak=tensor_peak)


def kernel_errors(kernels, fits: Mapping[str, GpuFit | None | Mapping[str, GpuFit]]) -> list[KernelRow]:
    """Per kernel table: MAPE of each model over its rows (``fits``: label -> fit, None = roofline, or
    label -> {gpu: fit} for leave-one-out)."""
    out = []
    for k in kernels:
        row = KernelRow(gpu=k.gpu, op=k.op, rows=len(k.fwd))
        for label, fit in fits.items():
            ft = fit[k.gpu] if isinstance(fit, Mapping) else fit
            row.mape[label] = float(100.0 * np.mean(np.abs(kernel_times(k, ft) / k.fwd - 1.0)))
        out.append(row)
    return out


def spearman(rows: list[WorkloadRow], model: str) -> float:
    from scipy.stats import spearmanr

    meas = [r.measured for r in rows]
    pred = [r.predicted[model] for r in rows]
    return float(spearmanr(meas, pred).statistic) if len(rows) > 2 else float("nan")


def spec_table(data: FitData) -> dict[str, GpuSpec]:
    return {s.gpu: s.spec for s in data.graphs} | {k.gpu: k.spec for k in data.kernels}
