"""Calibrated GPU cost model: achieved per-op time from op features and GPU datasheet figures.

A model of GPUs, not a table of measurements: every fitted parameter is shared by all GPUs, and a GPU
enters only through its datasheet (peak FLOP/s for the run's dtype, memory bandwidth, SM count, L2 size).
The parameters ship as package data (``placement_rl/data/gpu_fit.json``, fitted by
``scripts/fit_gpu_costs.py`` on public measurements, see ``placement_rl/data/NOTICE``).

Per node ``v`` of class ``c`` (from its ``op_type``; see ``op_class``), on device ``d``::

    GEMM-like (linear, bmm, conv):  t = max(F / (peak * util), bytes / (bw * e_mem)) + launch
        util  = e_max[c] * wave_eff ** w_wave * k / (k + k0[c])
        tiles = out_elems / tile;  waves = tiles / SMs;  wave_eff = waves / ceil(waves)
        k     = F / (2 * out_elems)   (inner dimension)
        backward: one GEMM per input that needs a gradient (dX, out = that input) and one for the
        weights (dW, out = the parameters), each with the forward's FLOPs
    memory-bound (norm, softmax, element-wise, embedding, loss, pool):
        t_fwd = kf[c] * (in + out) / bw_eff + launch,   t_bwd = kb[c] * (in + out) / bw_eff + nb[c] * launch
        (embedding: in + 2 out, the gathered table rows are read as well as the output written)
        bw_eff = bw * e_bw * (1 + l2_gain / (1 + (working set / L2) ** 2))
    views (view, reshape, transpose, ...): no kernel, 0
    parameter gradients: + acc * param_bytes / bw on the backward of the node holding them

Backward is 0 where ``needs_grad`` says no gradient flows. dtype: ``fp32`` (default) uses ``peak_flops``;
``tf32`` / ``bf16`` use the tensor-core peaks (``peak_flops_tf32`` / ``peak_flops_bf16`` of the device or
topology) for GEMM-like ops, and ``bf16`` halves the bytes moved. Only fp32 is measured in the fit data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from placement_rl.errors import ProfileError

FIT_SCHEMA = "placement_rl.gpu_fit"
FIT_VERSION = 1
DTYPES = ("fp32", "tf32", "bf16")
BWD_SLACK = 2.0  # a GEMM-like backward may run at half the forward's achieved rate, no slower
CLASSES = ("view", "linear", "bmm", "conv", "norm", "softmax", "ew", "ew_pass", "embedding", "loss", "pool")
GEMM_CLASSES = ("linear", "bmm", "conv")
MEM_CLASSES = ("norm", "softmax", "ew", "ew_pass", "embedding", "loss", "pool")

_VIEW = {"view", "reshape", "_reshape_alias", "transpose", "permute", "unsqueeze", "squeeze", "expand", "alias",
         "split", "split_with_sizes", "slice", "select", "t", "detach", "size", "getitem", "getattr", "flatten",
         "chunk", "unbind", "unflatten", "view_as", "expand_as", "to", "type", "type_as", "long", "bool", "float",
         "contiguous_view", "input", "placeholder", "output", "get_attr", "dim", "finfo", "numel", "lift_fresh_copy",
         "_assert_tensor_metadata", "_assert_scalar", "sym_size", "_unsafe_view", "movedim", "as_strided", "identity",
         "dropout_eval", "setitem", "masked_fill_", "zero_", "new_zeros", "tensor", "scalar_tensor"}
_LINEAR = {"linear", "addmm", "mm", "matmul_param", "conv1d_hf"}
_BMM = {"bmm", "baddbmm", "matmul", "einsum", "scaled_dot_product_attention"}
_CONV = {"conv", "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution",
         "conv_transpose2d"}
_NORM = {"layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
         "_native_batch_norm_legit_no_training", "group_norm", "native_group_norm", "instance_norm", "rms_norm",
         "local_response_norm", "lrn"}
_SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
_EMBED = {"embedding", "embedding_bag"}
_LOSS = {"cross_entropy_loss", "cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss_forward", "mse_loss",
         "l1_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "smooth_l1_loss"}
_POOL = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
         "adaptive_avg_pool2d", "adaptive_max_pool2d", "max_pool2d_with_indices", "mean", "sum"}
# element-wise ops whose backward is a pass-through (no kernel) or a view
_EW_PASS = {"add", "add_", "sub", "rsub", "neg", "iadd", "cat", "concat", "stack", "pad", "constant_pad_nd",
            "clone", "contiguous", "copy", "copy_", "repeat"}


def op_class(op_type: str, param_bytes: float = 0.0, flops: float = 0.0) -> str:
    """The cost class of an op type (``aten``-style name as captured, e.g. ``addmm``, ``layer_norm``).

    An unknown op type (hand-written or synthetic graphs) that carries FLOPs is priced as a GEMM
    (``linear``); without FLOPs it is element-wise."""
    name = op_type.rsplit(".", 1)[-1].lower()
    if name.endswith("_default") or name.endswith(".default"):
        name = name[:-8]
    if name in _VIEW or name.startswith("_assert"):
        return "view"
    if name in _BMM:
        return "linear" if (name == "matmul" and param_bytes > 0) else "bmm"
    for cls, names in (("linear", _LINEAR), ("conv", _CONV), ("norm", _NORM), ("softmax", _SOFTMAX),
                       ("embedding", _EMBED), ("loss", _LOSS), ("pool", _POOL), ("ew_pass", _EW_PASS)):
        if name in names:
            return cls
    if "conv" in name:
        return "conv"
    if "pool" in name:
        return "pool"
    if "norm" in name:
        return "norm"
    return "linear" if flops > 0 else "ew"


@dataclass(frozen=True)
class GpuFit:
    """Fitted parameters (shared by every GPU). ``params`` maps a name to a float; see the module docstring."""

    name: str
    params: Mapping[str, float]
    meta: Mapping[str, Any]

    def p(self, key: str) -> float:
        return float(self.params[key])

    def to_dict(self) -> dict[str, Any]:
        return {"schema": FIT_SCHEMA, "version": FIT_VERSION, "name": self.name,
                "params": {k: float(v) for k, v in self.params.items()}, "meta": dict(self.meta)}

    @staticmethod
    def from_dict(data: Any, where: str = "fit") -> "GpuFit":
        if not isinstance(data, dict) or data.get("schema") != FIT_SCHEMA:
            raise ProfileError(f"{where}: not a GPU cost fit (field 'schema' must be '{FIT_SCHEMA}')")
        if data.get("version") != FIT_VERSION:
            raise ProfileError(f"{where}: unknown fit version {data.get('version')!r} (this release reads "
                               f"{FIT_VERSION}); re-run scripts/fit_gpu_costs.py")
        params = data.get("params")
        if not isinstance(params, dict):
            raise ProfileError(f"{where}: field 'params' must be an object")
        missing = [k for k in required_params() if k not in params]
        if missing:
            raise ProfileError(f"{where}: fit lacks parameter '{missing[0]}'; re-run scripts/fit_gpu_costs.py")
        for k, v in params.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ProfileError(f"{where}: parameter '{k}' must be a finite number, got {v!r}")
        return GpuFit(name=str(data.get("name", "fit")), params=dict(params), meta=dict(data.get("meta", {})))

    @staticmethod
    def load(path: str | Path) -> "GpuFit":
        p = Path(path)
        if not p.is_file():
            raise ProfileError(f"GPU cost fit '{p}' does not exist; run scripts/fit_gpu_costs.py")
        try:
            data = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProfileError(f"{p}: malformed GPU cost fit ({exc.__class__.__name__}); re-run "
                               "scripts/fit_gpu_costs.py") from None
        return GpuFit.from_dict(data, str(p))


def required_params() -> tuple[str, ...]:
    keys = ["launch", "node_offset", "tile", "w_wave", "e_mem_gemm", "e_bw", "l2_gain", "acc"]
    for c in GEMM_CLASSES:
        keys += [f"e_max_{c}", f"k0_{c}"]
    for c in MEM_CLASSES:
        keys += [f"kf_{c}", f"kb_{c}", f"nb_{c}"]
    return tuple(keys)


SHIPPED_FIT = "gpu_fit.json"


@lru_cache(maxsize=1)
def shipped_fit() -> GpuFit | None:
    """The fit shipped as package data, or None when the package carries none (then GPUs use the roofline)."""
    path = Path(__file__).resolve().parent.parent / "data" / SHIPPED_FIT
    if not path.is_file():
        return None
    return GpuFit.load(path)


@dataclass(frozen=True)
class GpuSpec:
    """The datasheet figures the model uses (FLOP/s, bytes/s, count, bytes)."""

    peak_flops: float
    mem_bandwidth: float
    sm_count: int = 0
    l2_bytes: float = 0.0


@dataclass(frozen=True, eq=False)
class NodeFeatures:
    """Per-node arrays the model needs, computed once per graph (N nodes, E edges)."""

    cls: np.ndarray          # int [N], index into CLASSES
    flops: np.ndarray        # [N] forward FLOPs
    in_bytes: np.ndarray     # [N] sum of input edge bytes
    out_bytes: np.ndarray    # [N]
    param_bytes: np.ndarray  # [N]
    grad: np.ndarray         # bool [N] backward runs
    edge_dst: np.ndarray     # [E'] gemm node of each gradient-carrying input edge
    edge_bytes: np.ndarray   # [E'] bytes of that input (the dX output)
    ops: np.ndarray | None = None  # [N] original ops per node (coarsened groups), None = 1 each
    bwd_flops: np.ndarray | None = None  # [N] measured backward FLOPs (0 / None: unknown)


def features(graph: Any) -> NodeFeatures:
    """``NodeFeatures`` of a ``CompGraph``."""
    from placement_rl.cost.resolve import needs_grad

    n = graph.num_nodes
    cls = np.array([CLASSES.index(op_class(t, p, f)) for t, p, f in
                    zip(graph.op_types, graph.param_bytes, graph.fwd_flops)], dtype=np.int64)
    ops = np.ones(n)
    if graph.members is not None:  # a coarsened group is priced by its dominant member's class
        ops = np.array([max(len(m), 1) for m in graph.members], dtype=np.float64)
        cls[(ops > 1) & (cls == CLASSES.index("view"))] = CLASSES.index("ew")
    in_b = np.zeros(n)
    grad = needs_grad(graph)
    src = graph.edges[:, 0] if graph.num_edges else np.zeros(0, dtype=np.int64)
    dst = graph.edges[:, 1] if graph.num_edges else np.zeros(0, dtype=np.int64)
    if graph.num_edges:
        np.add.at(in_b, dst, graph.edge_bytes)
    gemm = np.isin(cls, [CLASSES.index(c) for c in GEMM_CLASSES])
    keep = gemm[dst] & grad[src] if graph.num_edges else np.zeros(0, dtype=bool)
    return NodeFeatures(cls=cls, flops=np.asarray(graph.fwd_flops, dtype=np.float64), in_bytes=in_b,
                        out_bytes=np.asarray(graph.out_bytes, dtype=np.float64),
                        param_bytes=np.asarray(graph.param_bytes, dtype=np.float64), grad=grad,
                        edge_dst=dst[keep], edge_bytes=np.asarray(graph.edge_bytes)[keep],
                        ops=ops if graph.members is not None else None,
                        bwd_flops=np.asarray(graph.bwd_flops, dtype=np.float64))


def _gemm_time(flops: np.ndarray, out_bytes: np.ndarray, moved: np.ndarray, cls: np.ndarray, fit: GpuFit,
               spec: GpuSpec, peak: float, elem: float) -> np.ndarray:
    out_el = np.maximum(out_bytes / elem, 1.0)
    k = np.maximum(flops / (2.0 * out_el), 1.0)
    e_max = np.ones_like(flops)
    k0 = np.ones_like(flops)
    for c in GEMM_CLASSES:
        m = cls == CLASSES.index(c)
        e_max[m], k0[m] = fit.p(f"e_max_{c}"), fit.p(f"k0_{c}")
    if spec.sm_count > 0:
        waves = np.maximum(out_el / fit.p("tile"), 1e-9) / spec.sm_count
        wave_eff = waves / np.ceil(waves)
    else:
        wave_eff = np.ones_like(flops)
    util = e_max * wave_eff ** fit.p("w_wave") * k / (k + k0)
    t = np.maximum(flops / (peak * util), moved / (spec.mem_bandwidth * fit.p("e_mem_gemm")))
    return np.where(flops > 0, t, 0.0)


def _weight_bytes(flops: np.ndarray, in_b: np.ndarray, out_b: np.ndarray, p_b: np.ndarray, cls: np.ndarray,
                  elem: float) -> np.ndarray:
    """Bytes of the weight a GEMM-like node multiplies by (its dW output). For ``linear`` it follows from the
    FLOPs and shapes (``K = F / 2MN``, ``M = in / K``, ``W = F / 2M``), so a tied or shared weight held by
    another node still gets its gradient GEMM; conv uses its parameters; bmm has none."""
    out_el = np.maximum(out_b / elem, 1.0)
    k = flops / (2.0 * out_el)
    m = np.where(k > 0, (in_b / elem) / np.maximum(k, 1e-30), 0.0)
    derived = np.where(m >= 1.0, elem * flops / (2.0 * np.maximum(m, 1.0)), 0.0)
    lin = cls == CLASSES.index("linear")
    conv = cls == CLASSES.index("conv")
    return np.where(lin, np.maximum(derived, p_b * (p_b > derived)), np.where(conv, p_b, 0.0))


def node_times(feat: NodeFeatures, spec: GpuSpec, fit: GpuFit, *, dtype: str = "fp32",
               tensor_peak: float | None = None, isolated: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fwd [N], bwd [N], launch [N])`` seconds of every node on a GPU described by ``spec``.

    ``isolated=True`` predicts an op timed on its own (as per-op profilers do): inputs warm in L2 and the
    timing harness's floor ``node_offset`` added; the default predicts the op inside a training step.
    """
    if dtype not in DTYPES:
        raise ProfileError(f"unknown dtype '{dtype}' (valid: {', '.join(DTYPES)})")
    scale = 0.5 if dtype == "bf16" else 1.0
    elem = 4.0 * scale
    peak = spec.peak_flops if dtype == "fp32" or not tensor_peak else float(tensor_peak)
    cls = feat.cls
    i_b, o_b, p_b = feat.in_bytes * scale, feat.out_bytes * scale, feat.param_bytes * scale
    launch = fit.p("launch")
    n = cls.shape[0]
    fwd = np.zeros(n)
    bwd = np.zeros(n)
    over = np.full(n, launch)
    view = cls == CLASSES.index("view")
    over[view] = 0.0
    # memory-bound classes
    ws = i_b + o_b
    ws = ws + np.where(cls == CLASSES.index("embedding"), o_b, 0.0)  # a gather also reads its rows of the table
    l2 = spec.l2_bytes
    boost = 1.0 + fit.p("l2_gain") / (1.0 + (ws / l2) ** 2) if (l2 > 0 and isolated) else np.ones(n)
    bw = spec.mem_bandwidth * fit.p("e_bw") * boost
    nb = np.zeros(n)
    for c in MEM_CLASSES:
        m = cls == CLASSES.index(c)
        if not m.any():
            continue
        fwd[m] = fit.p(f"kf_{c}") * ws[m] / bw[m] + launch
        bwd[m] = fit.p(f"kb_{c}") * ws[m] / bw[m]
        nb[m] = fit.p(f"nb_{c}")
    # GEMM-like classes: forward, then dX per gradient-carrying input and dW for the parameters
    g = np.isin(cls, [CLASSES.index(c) for c in GEMM_CLASSES])
    gi = np.flatnonzero(g)
    if gi.size:
        moved = i_b + o_b + p_b
        fwd[gi] = _gemm_time(feat.flops[gi], o_b[gi], moved[gi], cls[gi], fit, spec, peak, elem) + launch
        w_b = _weight_bytes(feat.flops[gi], i_b[gi], o_b[gi], p_b[gi], cls[gi], elem)
        dw = _gemm_time(feat.flops[gi] * (w_b > 0), w_b, moved[gi], cls[gi], fit, spec, peak, elem)
        bwd[gi] = dw
        nb[gi] = (w_b > 0).astype(np.float64)
        if feat.edge_dst.size:
            d = feat.edge_dst
            eb = feat.edge_bytes * scale
            dx = _gemm_time(feat.flops[d], eb, moved[d], cls[d], fit, spec, peak, elem)
            np.add.at(bwd, d, dx)
            np.add.at(nb, d, 1.0)
        if feat.bwd_flops is not None:
            # The per-input dX / derived dW GEMMs assume one op's shapes; for a coarsened group (summed
            # shapes, several inputs) they can price far more work than the backward has. Bound the backward
            # by the forward's achieved rate times the measured backward / forward FLOPs (x BWD_SLACK).
            bf, ff = feat.bwd_flops[gi], feat.flops[gi]
            cap = np.where((bf > 0) & (ff > 0), BWD_SLACK * (fwd[gi] - launch) * bf / np.maximum(ff, 1e-30), np.inf)
            bwd[gi] = np.minimum(bwd[gi], cap)
    bwd += fit.p("acc") * p_b / spec.mem_bandwidth
    bwd += nb * launch
    fwd[view] = 0.0
    bwd[view] = 0.0
    bwd = np.where(feat.grad, bwd, 0.0)
    if feat.ops is not None:  # the other members of a group launch their own kernels
        extra = (feat.ops - 1.0) * launch
        fwd, over = fwd + extra, over + extra
        bwd = np.where(bwd > 0, bwd + extra, 0.0)
    if isolated:
        fwd = fwd + fit.p("node_offset")  # a view costs the harness floor alone
        bwd = np.where(bwd > 0, bwd + fit.p("node_offset"), 0.0)
    return fwd, bwd, over
