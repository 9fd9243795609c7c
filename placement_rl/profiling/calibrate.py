"""Fit the calibrated GPU cost model (``placement_rl.cost.calibrated``) on measured GPU data.

Data: NeuSight label files (per-node fwd / bwd of one transformer layer plus embedding and head, and
the whole model end to end) and single-kernel forward timings, each tagged with the GPU it ran on and
that GPU's datasheet (``GpuSpec``). The fitted parameters are shared by every GPU: the residuals are
``log(predicted / measured)``, weighted so that the ops that dominate a training step dominate the fit,
plus a weak prior on the memory-bound classes' byte and kernel counts. The whole-model times enter with a
tiny weight only (``w_whole``): they are predicted, not fitted (the end-to-end runs carry host effects that
differ between the machines, see docs/fidelity_gpu.md). ``fit(..., exclude=gpu)`` leaves a GPU out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from placement_rl.cost.calibrated import (CLASSES, HARNESS_CLASSES, MEM_CLASSES, GpuFit, GpuSpec, NodeFeatures,
                                          features, node_times, table_times)
from placement_rl.cost.gemm_time import wino_tiles
from placement_rl.errors import ProfileError

# name, initial value, lower, upper
PARAMS: list[tuple[str, float, float, float]] = [
    ("launch", 4e-6, 5e-7, 3e-5), ("kernel_offset", 2e-5, 0.0, 6e-5), ("node_offset", 8e-6, 0.0, 3e-5), ("tile", 128 * 128, 1024, 65536), ("w_wave", 0.5, 0.0, 1.0),
    ("e_mem_gemm", 0.7, 0.1, 1.5), ("e_bw", 0.8, 0.2, 1.5), ("l2_gain", 0.5, 0.0, 4.0), ("acc", 3.0, 0.0, 10.0),
    ("e_max_linear", 0.9, 0.2, 1.2), ("k0_linear", 32.0, 0.0, 2048.0),
    ("e_max_bmm", 0.9, 0.2, 1.2), ("k0_bmm", 32.0, 0.0, 2048.0),
    ("e_max_conv", 0.8, 0.05, 3.0), ("k0_conv", 32.0, 0.0, 4096.0),
] + [(f"kf_{c}", 1.0, 0.05, 10.0) for c in MEM_CLASSES] + [(f"kb_{c}", 2.0, 0.0, 20.0) for c in MEM_CLASSES] \
  + [(f"nb_{c}", 1.0, 0.0, 4.0) for c in MEM_CLASSES] \
  + [("g_old_gemm", 0.0, -2.0, 2.0), ("g_lp_gemm", 0.0, -2.0, 2.0), ("lp_slow", 0.3, 0.0, 3.0),
     ("lp_tau", 2e-3, 1e-5, 0.1), ("g_old_mem", -0.2, -2.0, 2.0),  # (min-form memory terms: start off their kink at 0)
     ("g_gddr_mem", -0.2, -2.0, 2.0), ("l2_reuse", 8.0, 1.0, 64.0), ("tile_area", 16384.0, 4096.0, 65536.0),
     ("wino", 1.5, 0.2, 5.0)] \
  + [(f"koff_{c}", 2e-5, 0.0, 8e-5) for c in HARNESS_CLASSES]
FIXED = {"kb_ew_pass": 0.0, "nb_ew_pass": 0.0, "tile": 128 * 128, "e_bw": 1.0, "issue_ffma": 0.85, "mem_terms": 1.0,
         "issue_conv": 0.5}


@dataclass
class GraphSample:
    """A label graph on one GPU: features, measured per-node times, whole-model multiplicity and time."""

    gpu: str
    spec: GpuSpec
    feat: NodeFeatures
    fwd: np.ndarray
    bwd: np.ndarray
    weights: np.ndarray
    whole: float
    train: bool
    key: str = ""


@dataclass
class KernelSample:
    gpu: str
    spec: GpuSpec
    feat: NodeFeatures
    fwd: np.ndarray
    op: str = ""


@dataclass
class FitData:
    graphs: list[GraphSample] = field(default_factory=list)
    kernels: list[KernelSample] = field(default_factory=list)

    def gpus(self) -> list[str]:
        return sorted({s.gpu for s in self.graphs} | {k.gpu for k in self.kernels})


def _vec_to_fit(x: np.ndarray, names: Sequence[str], name: str) -> GpuFit:
    params = dict(FIXED)
    params.update({k: float(v) for k, v in zip(names, x)})
    return GpuFit(name=name, params=params, meta={})


def kernel_features(op: str, cols: dict[str, np.ndarray]) -> tuple[NodeFeatures, str]:
    """Features of single-kernel rows (NeuSight ``kernels/<op>/<GPU>.csv`` columns as float arrays)."""
    def f(*keys: str) -> np.ndarray:
        return np.prod([cols[k] for k in keys], axis=0)
    if op in ("linear", "bmm"):
        # NeuSight's naming: (B, M, N) @ (N, K) -> (B, M, K); N is the reduced dimension, K the output's columns
        # (the tables' launch grids confirm it: ceil(K / tile_m) x ceil(B M / tile_n) CTAs for linear)
        b, m, n, k = (cols[c] for c in ("B", "M", "N", "K"))
        flops, out, inp = 2 * b * m * n * k, 4 * b * m * k, 4 * b * m * n
        params = 4 * (n * k + k) if op == "linear" else np.zeros_like(b)
        if op == "bmm":
            inp = inp + 4 * b * n * k
        cls = op
    elif op == "conv":
        b, ci, co = cols["B"], cols["Input_Channel"], cols["Output_Channel"]
        ks, hs, st, pd = cols["Kernel_Szie"], cols["Input_Size"], cols["Stride"], cols["Padding"]
        ho = np.floor((hs + 2 * pd - ks) / st) + 1
        out = 4 * b * co * ho * ho
        flops = 2 * b * co * ho * ho * ci * ks * ks
        inp, params, cls = 4 * b * ci * hs * hs, 4 * co * ci * ks * ks, "conv"
    else:
        size = f("B", "H")
        out, flops, params = 4 * size, np.zeros_like(size), np.zeros_like(size)
        cls = {"ln": "norm", "softmax": "softmax", "gelu": "ew", "add": "ew_pass"}[op]
        inp = out * (2 if op == "add" else 1)
        params = 8 * cols["H"] if op == "ln" else params
    n_rows = len(out)
    if op == "linear":  # one GEMM over the flattened rows (the weight is shared by the batch)
        dims = np.stack([np.ones(n_rows), b * m, k, n], axis=1).astype(float)
    elif op == "bmm":
        dims = np.stack([b, m, k, n], axis=1).astype(float)
    elif op == "conv":
        dims = np.stack([np.ones(n_rows), b * ho * ho, co, ci * ks * ks], axis=1).astype(float)
    else:
        dims = np.zeros((n_rows, 4))
    wino = None
    if op == "conv":  # a 3x3 stride-1 convolution can run as Winograd F(4x4, 3x3) (``gemm_time._wino_time``)
        wino = np.where((ks == 3) & (st == 1), wino_tiles(b, ho, ho), 0.0).astype(float)
    feat = NodeFeatures(cls=np.full(n_rows, CLASSES.index(cls)), flops=flops.astype(float), in_bytes=inp.astype(float),
                        out_bytes=out.astype(float), param_bytes=params.astype(float), grad=np.zeros(n_rows, bool),
                        edge_dst=np.zeros(0, np.int64), edge_bytes=np.zeros(0), dims=dims, wino=wino)
    return feat, cls


# physical defaults the memory-class parameters are pulled toward (a weak prior: one GPU's data alone
# must not drive a class's byte count or kernel count far from what the op does)
PRIOR = {**{f"kf_{c}": 1.0 for c in MEM_CLASSES}, **{f"kb_{c}": 2.0 for c in MEM_CLASSES if c != "ew_pass"},
         **{f"nb_{c}": 1.0 for c in MEM_CLASSES if c != "ew_pass"}}


def residuals(fit: GpuFit, data: FitData, *, w_whole: float = 1.0, w_kernel: float = 0.3,
              w_prior: float = 0.0) -> np.ndarray:
    parts = []
    if w_prior > 0:
        parts.append(np.array([np.sqrt(w_prior) * np.log((fit.p(k) + 0.05) / (v + 0.05)) for k, v in PRIOR.items()]))
    for s in data.graphs:
        f0, b0, _ = node_times(s.feat, s.spec, fit)
        pred_whole = float(s.weights @ (f0 + (b0 if s.train else 0)))
        f, b, _ = node_times(s.feat, s.spec, fit, isolated=True)
        contrib_f = s.weights * s.fwd
        contrib_b = s.weights * s.bwd
        tot = contrib_f.sum() + (contrib_b.sum() if s.train else 0)
        for pred, meas, c in ((f, s.fwd, contrib_f), (b, s.bwd, contrib_b)):
            if pred is b and not s.train:
                continue
            m = meas > 0
            w = np.sqrt(c[m] / tot)
            parts.append(w * np.log(np.maximum(pred[m], 1e-9) / meas[m]))
        parts.append(np.array([np.sqrt(w_whole) * np.log(pred_whole / s.whole)]))
    for k in data.kernels:
        f = table_times(k.feat, k.spec, fit)  # with the kernel files' harness floor (not a GPU cost)
        parts.append(np.sqrt(w_kernel / len(f)) * np.log(np.maximum(f, 1e-9) / k.fwd))
    return np.concatenate(parts)


def fit(data: FitData, *, exclude: Iterable[str] = (), name: str = "neusight", max_nfev: int = 200,
        w_whole: float = 0.01, w_kernel: float = 1.0, w_prior: float = 0.2) -> GpuFit:
    """Least-squares fit of the shared parameters on every sample whose GPU is not in ``exclude``."""
    from scipy.optimize import least_squares

    ex = set(exclude)
    sub = FitData(graphs=[s for s in data.graphs if s.gpu not in ex],
                  kernels=[k for k in data.kernels if k.gpu not in ex])
    if not sub.graphs and not sub.kernels:
        raise ProfileError("no measurements left to fit after leaving out " + ", ".join(sorted(ex)))
    free = [(n, x0, lo, hi) for n, x0, lo, hi in PARAMS if n not in FIXED]
    names = [p[0] for p in free]
    x0 = np.array([p[1] for p in free])
    lo = np.array([p[2] for p in free])
    hi = np.array([p[3] for p in free])
    res = least_squares(lambda x: residuals(_vec_to_fit(x, names, name), sub, w_whole=w_whole, w_kernel=w_kernel,
                                          w_prior=w_prior), x0, bounds=(lo, hi),
                        x_scale=np.maximum(np.abs(x0), 1e-6), max_nfev=max_nfev, diff_step=1e-3)
    out = _vec_to_fit(res.x, names, name)
    return GpuFit(name=name, params=out.params,
                  meta={"trained_on": sub.gpus(), "left_out": sorted(ex), "cost": float(res.cost),
                        "graphs": len(sub.graphs), "kernel_rows": int(sum(len(k.fwd) for k in sub.kernels))})


def graph_sample(gpu: str, spec: GpuSpec, graph, fwd: np.ndarray, bwd: np.ndarray, weights: np.ndarray,
                 whole: float, train: bool, key: str = "") -> GraphSample:
    return GraphSample(gpu=gpu, spec=spec, feat=features(graph), fwd=fwd, bwd=bwd, weights=weights, whole=whole,
                       train=train, key=key)


def load_kernels(path: str | Path, op: str, gpu: str, spec: GpuSpec, *, max_rows: int = 2000,
                 seed: int = 0, min_latency: float = 5e-5) -> KernelSample:
    """Read a NeuSight kernel CSV (``Latency`` ms and the shape columns) into a ``KernelSample``."""
    import csv

    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"NeuSight kernel file '{p}' does not exist")
    need = {"linear": ("B", "M", "N", "K"), "bmm": ("B", "M", "N", "K"),
            "conv": ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding")
            }.get(op, ("B", "H"))
    try:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        lat = np.array([float(r["Latency"]) for r in rows]) * 1e-3
        cols = {c: np.array([float(r[c]) for r in rows]) for c in need}
    except KeyError as exc:
        raise ProfileError(f"{p}: column {exc} missing; expected a NeuSight kernel file") from None
    except (ValueError, TypeError, csv.Error, UnicodeDecodeError):
        raise ProfileError(f"{p}: a Latency or shape value is not a number; expected a NeuSight kernel file"
                           ) from None
    if not len(lat) or not np.all(np.isfinite(lat) & (lat > 0)):
        raise ProfileError(f"{p}: Latency must be positive numbers")
    rng = np.random.default_rng(seed)
    big = np.flatnonzero(lat >= min_latency)  # below it the harness floor dominates the timing
    idx = np.sort(rng.choice(big, size=min(max_rows, len(big)), replace=False))
    feat, _ = kernel_features(op, {c: v[idx] for c, v in cols.items()})
    return KernelSample(gpu=gpu, spec=spec, feat=feat, fwd=lat[idx], op=op)


KERNEL_OPS = ("linear", "bmm", "conv", "ln", "softmax", "gelu", "add")
FIT_GPUS = ("NVIDIA_A100-PCIE-40GB", "NVIDIA_A100_80GB_PCIe", "Tesla_V100-PCIE-32GB", "Tesla_P100-PCIE-16GB",
            "Tesla_P4", "Tesla_T4")  # the five GPUs (the A100 as its 40GB and 80GB PCIe cards)
LABEL_RUNS = {"NVIDIA_A100_80GB_PCIe": ("bert_large-train-512-2", "bert_large-train-512-8", "gpt2_large-train-1024-1",
                                        "gpt2_large-train-1024-4", "gpt3_27-train-2048-1", "gpt3_xl-train-2048-1",
                                        "opt_13-train-2048-1", "opt_13-train-2048-2"),
              "Tesla_V100-PCIE-32GB": ("bert_large-inf-512-16", "bert_large-inf-512-8", "bert_large-train-512-2",
                                       "bert_large-train-512-8", "gpt2_large-inf-1024-4", "gpt2_large-inf-1024-8",
                                       "gpt2_large-train-1024-1", "gpt3_27-inf-2048-2", "gpt3_xl-inf-2048-2",
                                       "opt_13-inf-2048-2", "opt_13-inf-2048-8"),
              "Tesla_P100-PCIE-16GB": ("bert_large-inf-512-16", "bert_large-inf-512-8", "gpt2_large-inf-1024-4",
                                       "gpt2_large-inf-1024-8", "opt_13-inf-2048-2"),
              "Tesla_P4": ("bert_large-inf-512-16", "bert_large-inf-512-8", "gpt2_large-inf-1024-4"),
              "Tesla_T4": ("bert_large-inf-512-16", "bert_large-inf-512-8", "gpt2_large-inf-1024-4",
                           "gpt2_large-inf-1024-8", "opt_13-inf-2048-2")}
FIT_KERNEL_ROWS = 400  # rows sampled (seeded) per kernel table for the fit
FIT_NFEV = 60


def needed_files() -> list[str]:
    """Paths (relative to the gpu-measurements folder) of the NeuSight files the shipped fit is fitted on."""
    out = [f"neusight/device_configs/{g}.json" for g in FIT_GPUS]
    for op in KERNEL_OPS:
        gpus = [g for g in FIT_GPUS if (g != "NVIDIA_A100_80GB_PCIe") == (op != "conv")
                or (g not in ("NVIDIA_A100-PCIE-40GB", "NVIDIA_A100_80GB_PCIe"))]
        out += [f"neusight/kernels/{op}/{g}.csv" for g in gpus]
    for g, runs in LABEL_RUNS.items():
        for r in runs:
            out += [f"neusight/labels/{g}/{r}.csv", f"neusight/labels/{g}/{r}.json"]
    return out


def spec_of(config) -> GpuSpec:
    """A ``GpuSpec`` from a NeuSight ``DeviceConfig`` (its datasheet figures)."""
    from placement_rl.cost.gpu_spec import datasheet

    arch, gddr, _, low = datasheet(config.name)
    lanes = int(round(config.peak_flops / (2e6 * config.sm_count * config.clock_mhz))) if config.clock_mhz else 0
    return GpuSpec(peak_flops=config.peak_flops, mem_bandwidth=config.mem_bandwidth, sm_count=config.sm_count,
                   l2_bytes=config.l2_bytes, arch=arch, gddr=gddr, fp32_lanes=lanes, low_power=low)


def load_neusight(root: str | Path, *, kernels: bool = True, max_kernel_rows: int = 1500,
                  kernel_ops: Sequence[str] = KERNEL_OPS) -> FitData:
    """Every NeuSight label file (train and inference) and kernel table under ``root`` as ``FitData``."""
    from placement_rl.profiling import neusight as ns

    root = Path(root)
    configs = {p.stem: ns.read_device_config(p) for p in sorted((root / "device_configs").glob("*.json"))}
    data = FitData()
    for path in ns.label_files(root):
        w = ns.read_labels(path)
        cfg = _config_for(configs, w.gpu, path)
        g = ns.label_graph(w)
        fwd, bwd = ns.measured_times(w, g)
        data.graphs.append(graph_sample(w.gpu, spec_of(cfg), g, fwd, bwd, ns.layer_weights(g, w.num_layer),
                                        w.e2e, w.mode == "train", key=w.key))
    if kernels:
        for op in kernel_ops:
            for path in sorted((root / "kernels" / op).glob("*.csv")):
                cfg = _config_for(configs, path.stem, path)
                data.kernels.append(load_kernels(path, op, path.stem, spec_of(cfg), max_rows=max_kernel_rows))
    return data


def _config_for(configs: dict, gpu: str, path: Path):
    got = configs.get(gpu) or configs.get(gpu.replace("-", "_")) or \
        next((c for k, c in configs.items() if k.replace("-", "_") == gpu.replace("-", "_")), None)
    if got is None:
        raise ProfileError(f"{path}: no device config for GPU '{gpu}' in device_configs/ "
                           f"(have: {', '.join(sorted(configs))})")
    return got


# a GPU's model number as NeuSight / Sailor / Vidur names spell it (``A100``, ``L40S``, ``GH200``, a bare ``4090``)
# and the tokens beside it that are not one (memory size, form factor, memory kind)
_MODEL = re.compile(r"[A-Za-z]+\d+[A-Za-z]*|\d{3,}[A-Za-z]*")
_NOT_MODEL = re.compile(r"\d+GB|SXM\d*|PCIE\d*|HBM\d*e?|GDDR\d*X?", re.IGNORECASE)


def family(gpu: str) -> str:
    """GPU family of a NeuSight GPU folder name, for leave-one-out: its model number, the first ``_`` / ``-`` /
    space separated word that is one, in capitals (``NVIDIA_A100-PCIE-40GB`` and ``NVIDIA_A100_80GB_PCIe``:
    ``A100``; ``NVIDIA_L40S``: ``L40S``, not the L4's family). A whole word, never a part of one; a name without a
    model number is its own family."""
    for word in re.split(r"[\s_-]+", gpu):
        if _MODEL.fullmatch(word) and not _NOT_MODEL.fullmatch(word):
            return word.upper()
    return gpu
