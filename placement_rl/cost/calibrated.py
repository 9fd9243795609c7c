"""Calibrated GPU cost model: achieved per-op time from op features and GPU datasheet figures.

A model of GPUs, not a table of measurements: every fitted parameter is shared by all GPUs, and a GPU
enters only through its datasheet (peak FLOP/s for the run's dtype, memory bandwidth, SM count, L2 size).
The parameters ship as package data (``placement_rl/data/gpu_fit.json``, fitted by
``scripts/fit_gpu_costs.py`` on public measurements, see ``placement_rl/data/NOTICE``).

Per node ``v`` of class ``c`` (``placement_rl.graph.op_classes.op_class``), on a GPU described by its datasheet
(``placement_rl.cost.gpu_spec.GpuSpec``)::

    GEMM-like (linear, bmm, conv): batch x (M x K) @ (K x N) from the node's FLOPs and bytes (``gemm_dims``);
        the fastest CTA tile / split-K configuration of a wave model over the SMs (``_gemm_time``), at
        e_max[c] x trend(GPU) of peak, memory traffic of the operand tiles at bw x e_mem_gemm; + launch.
        backward: one GEMM per input that needs a gradient (dX) and one for the weights (dW), at their shapes
        a 3x3 stride-1 conv (``wino`` tiles > 0) and its dX: the faster of that and Winograd F(4x4, 3x3)
        (``gemm_time._wino_time``: 36 GEMMs over the output's 4x4 tiles x ``wino`` + the transforms' traffic);
        a 1x1 stride-1 conv (``pointwise``) is a plain GEMM priced with linear's terms (the conv terms are fitted on
        3x3 convolutions only); a conv on an SM of 128 FP32 lanes runs at the 64-lane rate (``gpu_fit.conv_issue``)
    memory-bound (norm, softmax, element-wise, embedding, loss, pool):
        t_fwd = kf[c] * (in + out) / bw_eff + launch,   t_bwd = kb[c] * (in + out) / bw_eff + nb[c] * launch
        (embedding: in + 2 out, the gathered table rows are read as well as the output written)
        bw_eff = bw * e_bw * trend(GPU) (isolated timings: x (1 + l2_gain / (1 + (working set / L2) ** 2)))
    views (view, reshape, transpose, ...): no kernel, 0
    parameter gradients: + acc * param_bytes / bw on the backward of the node holding them
    isolated timings (per-op profiles, single-kernel tables): + the timing harness's floor (``node_offset`` for
        per-op profiles; ``harness_offset`` per class for NeuSight's kernel tables), never part of a step

``trend`` makes a GPU's achieved fraction of its peaks a function of its architecture (slopes shared by every
GPU); a version-1 fit (no tiles, no trend) is still read and priced by ``_gemm_time_v1``.
Backward is 0 where ``needs_grad`` says no gradient flows. dtype: ``fp32`` (default) uses ``peak_flops``;
``tf32`` / ``bf16`` / ``fp16`` use the tensor-core peaks (``peak_flops_tf32`` / ``peak_flops_bf16`` /
``peak_flops_fp16`` of the device or topology) for GEMM-like ops, and ``bf16`` / ``fp16`` halve the bytes moved.
``fp64`` moves twice the bytes at ``peak_flops_fp64`` where the device gives it (else the FP32 peak, which
``resolve`` warns is optimistic). Only fp32 is measured in the fit data. A graph captured in bf16 / fp16 / fp64
(``meta["dtype"]``: its ops' outputs;
``meta["param_dtype"]`` where the parameters differ, as under autocast) is read in fp32 bytes (``features``) and
runs in its own dtype by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl.cost.gemm_time import _bwd_dims, _gemm_time, _gemm_time_v1, _weight_bytes, _wino_time, gemm_dims, \
    wino_tiles
from placement_rl.cost.gpu_fit import OPTIONAL, GpuFit, required_params, shipped_fit, trend
from placement_rl.cost.gpu_spec import GpuSpec, arch_of, datasheet, spec_of_device
from placement_rl.cost.grad import needs_grad
from placement_rl.graph.op_classes import CLASSES, GEMM_CLASSES, MEM_CLASSES, op_class
from placement_rl.errors import ProfileError

# the calibrated model's public names, whichever module defines them (importers read them from here)
__all__ = ["BWD_SLACK", "CLASSES", "DTYPES", "GEMM_CLASSES", "HARNESS_CLASSES", "MEM_CLASSES", "OPTIONAL", "GpuFit",
           "GpuSpec", "NodeFeatures", "arch_of", "datasheet", "features", "gemm_dims", "harness_offset", "node_times",
           "op_class", "required_params", "shipped_fit", "spec_of_device", "table_times", "trend"]

# memory-bound classes whose kernel tables carry a harness floor of their own (``koff_<class>``; see ``harness_offset``)
HARNESS_CLASSES = ("norm", "softmax", "ew", "ew_pass")
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp64")
CAPTURED_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp64": 8.0}  # element bytes of a graph captured in each
ELEMENT_SCALE = {k: b / 4.0 for k, b in CAPTURED_BYTES.items() if k != "fp32"}  # bytes moved per fp32 byte
BWD_SLACK = 2.0  # a GEMM-like backward may run at half the forward's achieved rate, no slower


def harness_offset(cls: np.ndarray, fit: "GpuFit") -> np.ndarray:
    """[rows] the fixed time a single-kernel table's timing harness adds to each row of class ``cls`` (not a GPU
    cost, so never part of a training step's prediction): ``kernel_offset`` for a GEMM library call, and for the
    memory-bound classes of ``HARNESS_CLASSES`` their own ``koff_<class>`` where the fit has one. NeuSight's
    tables show per-class floors (an affine fit of time on bytes per GPU: 14-23 us for gelu / add, 22-52 us for
    softmax, 42-51 us for layer norm, over 45 us for GEMMs); one shared offset priced the element-wise rows near
    50 us up to twice too slow."""
    off = np.full(np.shape(cls), fit.p("kernel_offset"), dtype=np.float64)
    for c in HARNESS_CLASSES:
        key = f"koff_{c}"
        if key in fit.params:
            off[np.asarray(cls) == CLASSES.index(c)] = fit.p(key)
    return off


def table_times(feat: "NodeFeatures", spec: GpuSpec, fit: "GpuFit", *, dtype: str = "fp32",
                tensor_peak: float | None = None) -> np.ndarray:
    """[rows] a single-kernel table's times as its harness reads them: the isolated forward time with the kernel
    tables' harness floor (``harness_offset``) in place of the per-op profiles' (``node_offset``); ``dtype`` /
    ``tensor_peak`` as in ``node_times`` (a table measured on tf32 / bf16 kernels)."""
    t, _, _ = node_times(feat, spec, fit, isolated=True, dtype=dtype, tensor_peak=tensor_peak)
    return t - fit.p("node_offset") + harness_offset(feat.cls, fit)


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
    dims: np.ndarray | None = None  # [N, 4] batch, M, N, K of each GEMM-like node (elements; see gemm_dims)
    wino: np.ndarray | None = None  # [N] Winograd F(4x4, 3x3) output tiles of a 3x3 stride-1 conv (0: not one)
    pointwise: np.ndarray | None = None  # bool [N] a 1x1 stride-1 conv: a plain GEMM, priced with linear's terms


def features(graph: Any, captured: str | None = None, params: str | None = None) -> NodeFeatures:
    """``NodeFeatures`` of a ``CompGraph``, its bytes in fp32 (the model's unit; ``node_times`` scales them to
    the run's dtype): a graph captured in bf16 / fp16 (``captured``, else its ``meta["dtype"]``) has its output and
    edge bytes doubled (fp64: halved), and its parameter bytes where they are in that precision too (``params``, else
    ``meta["param_dtype"]``, else ``captured``: under autocast they are fp32). An edge of no bytes is a pure
    dependency: no data gradient flows along it."""
    captured = captured or graph.meta.get("dtype") or "fp32"
    params = params or graph.meta.get("param_dtype") or captured
    for name in (captured, params):
        if name not in CAPTURED_BYTES:
            raise ProfileError(f"graph dtype '{name}' is not priced (valid: {', '.join(CAPTURED_BYTES)})")
    if captured != "fp32" or params != "fp32":
        wide, wide_p = 4.0 / CAPTURED_BYTES[captured], 4.0 / CAPTURED_BYTES[params]
        graph = graph.replace(out_bytes=np.asarray(graph.out_bytes, dtype=np.float64) * wide,
                              param_bytes=np.asarray(graph.param_bytes, dtype=np.float64) * wide_p,
                              edge_bytes=np.asarray(graph.edge_bytes, dtype=np.float64) * wide)
    n = graph.num_nodes
    cls = np.array([CLASSES.index(op_class(t, p, f)) for t, p, f in
                    zip(graph.op_types, graph.param_bytes, graph.fwd_flops)], dtype=np.int64)
    ops = np.ones(n)
    if graph.members is not None:  # a group without its members' graph (resolve): its dominant member's class
        ops = np.array([max(len(m), 1) for m in graph.members], dtype=np.float64)
        cls[(ops > 1) & (cls == CLASSES.index("view"))] = CLASSES.index("ew")
    in_b = np.zeros(n)
    grad = needs_grad(graph)
    src = graph.edges[:, 0] if graph.num_edges else np.zeros(0, dtype=np.int64)
    dst = graph.edges[:, 1] if graph.num_edges else np.zeros(0, dtype=np.int64)
    if graph.num_edges:
        np.add.at(in_b, dst, graph.edge_bytes)
    gemm = np.isin(cls, [CLASSES.index(c) for c in GEMM_CLASSES])
    keep = gemm[dst] & grad[src] & (np.asarray(graph.edge_bytes) > 0) if graph.num_edges else np.zeros(0, dtype=bool)
    first = np.zeros(n)  # bytes of a GEMM's first and second input edge (bmm: the two operands)
    second = np.zeros(n)
    for e in np.flatnonzero(gemm[dst]) if graph.num_edges else ():
        v = dst[e]
        if first[v] == 0:
            first[v] = graph.edge_bytes[e]
        elif second[v] == 0:
            second[v] = graph.edge_bytes[e]
    flops = np.asarray(graph.fwd_flops, dtype=np.float64)
    dims = gemm_dims(cls, flops, in_b, np.asarray(graph.out_bytes, dtype=np.float64),
                     np.asarray(graph.param_bytes, dtype=np.float64), first, second)
    if graph.members is not None:
        dims[ops > 1] = 0.0  # a group's summed shapes are no GEMM's: priced without tile quantisation
    area = conv_kernel_area(cls, dims, in_b)
    wino = conv_wino_tiles(area, dims, graph.meta.get("batch_size"))
    pointwise = area == 1.0
    return NodeFeatures(cls=cls, flops=np.asarray(graph.fwd_flops, dtype=np.float64), in_bytes=in_b,
                        out_bytes=np.asarray(graph.out_bytes, dtype=np.float64),
                        param_bytes=np.asarray(graph.param_bytes, dtype=np.float64), grad=grad,
                        edge_dst=dst[keep], edge_bytes=np.asarray(graph.edge_bytes)[keep],
                        ops=ops if graph.members is not None else None,
                        bwd_flops=np.asarray(graph.bwd_flops, dtype=np.float64), dims=dims, wino=wino,
                        pointwise=pointwise)


def conv_kernel_area(cls: np.ndarray, dims: np.ndarray, in_b: np.ndarray) -> np.ndarray:
    """[N] k^2 of each conv node that is a stride-1, same-padding convolution (1 for 1x1, 9 for 3x3, ...), else 0.
    A graph node knows M = batch x H x W (output), K = C_in x k^2 and its input bytes = 4 x batch x C_in x H_in x
    W_in: with stride 1 and same padding H_in W_in = H W, so C_in = in / 4M and k^2 = K / C_in (a strided
    convolution gives a k^2 below its kernel's, not a whole square: 0)."""
    out = np.zeros(cls.shape[0])
    conv = (cls == CLASSES.index("conv")) & (dims[:, 3] > 0) & (dims[:, 1] > 0)
    if not conv.any():
        return out
    m, k = dims[:, 1], dims[:, 3]
    ci = np.where(conv, in_b / 4.0 / np.maximum(m, 1.0), 0.0)
    k2 = np.where(ci > 0, k / np.maximum(ci, 1e-30), 0.0)
    side = np.round(np.sqrt(np.maximum(k2, 0.0)))
    area = side * side
    whole = np.abs(k / np.maximum(area, 1.0) - np.round(k / np.maximum(area, 1.0))) < 1e-6
    ok = conv & (side >= 1) & (np.abs(k2 - area) < 0.05 * np.maximum(area, 1.0)) & whole
    out[ok] = area[ok]
    return out


def conv_wino_tiles(area: np.ndarray, dims: np.ndarray, batch: Any = None) -> np.ndarray:
    """[N] Winograd output tiles of each conv node that is a 3x3 stride-1 convolution with same padding (``area``
    9: ``conv_kernel_area``), else 0. The tiles need H and W: from ``batch`` (the graph's ``batch_size``) as a
    square image, else M / 16 (no partial tiles)."""
    out = np.zeros(area.shape[0])
    ok = area == 9.0
    if not ok.any():
        return out
    m = dims[:, 1]
    try:
        b = float(batch) if batch is not None else 0.0
    except (TypeError, ValueError):
        b = 0.0
    if b >= 1:
        side = np.sqrt(np.maximum(m / b, 1.0))
        tiles = wino_tiles(np.full_like(m, b), side, side)
    else:
        tiles = m / 16.0
    out[ok] = tiles[ok]
    return out


def node_times(feat: NodeFeatures, spec: GpuSpec, fit: GpuFit, *, dtype: str = "fp32",
               tensor_peak: float | None = None, isolated: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fwd [N], bwd [N], launch [N])`` seconds of every node on a GPU described by ``spec``.

    ``isolated=True`` predicts an op timed on its own (as per-op profilers do): inputs warm in L2 and the
    timing harness's floor ``node_offset`` added; the default predicts the op inside a training step.
    ``tensor_peak``: the peak of ``dtype`` (the tensor cores' for tf32 / bf16 / fp16, the FP64 units' for fp64).
    """
    if dtype not in DTYPES:
        raise ProfileError(f"unknown dtype '{dtype}' (valid: {', '.join(DTYPES)})")
    scale = ELEMENT_SCALE.get(dtype, 1.0)
    elem = 4.0 * scale
    tensor = dtype in ("tf32", "bf16", "fp16") and bool(tensor_peak)  # tensor cores (at any peak, even the FP32 one)
    peak = float(tensor_peak) if tensor_peak and dtype != "fp32" else spec.peak_flops  # fp64: its own SIMT peak
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
    gpu = trend(spec, fit, simt=not tensor)
    bw = spec.mem_bandwidth * fit.p("e_bw") * gpu[1] * boost
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
        w_b = _weight_bytes(feat.flops[gi], i_b[gi], o_b[gi], p_b[gi], cls[gi], elem)
        tiled = "tile_area" in fit.params and feat.dims is not None
        # a 1x1 stride-1 conv is a plain GEMM: the conv class's terms are fitted on 3x3 convolutions (cuDNN's
        # implicit GEMM and Winograd), so a fit that has the Winograd term prices it with linear's
        gcls = cls.copy()
        if feat.pointwise is not None and fit.q("wino") > 0:
            gcls[feat.pointwise] = CLASSES.index("linear")
        # a 3x3 stride-1 conv and its data gradient: the faster of the direct (implicit GEMM) and Winograd
        wino = feat.wino is not None and fit.q("wino") > 0 and not tensor
        if tiled:
            dims = feat.dims[gi]
            fwd[gi] = _gemm_time(feat.flops[gi], dims, gcls[gi], fit, spec, peak, elem, gpu, simt=not tensor) + launch
            if wino:
                fwd[gi] = np.minimum(fwd[gi], _wino_time(feat.wino[gi], dims, fit, spec, peak, elem, gpu) + launch)
            _, dwd = _bwd_dims(dims, cls[gi], np.zeros(gi.size))
            dw = _gemm_time(feat.flops[gi] * (w_b > 0), dwd, gcls[gi], fit, spec, peak, elem, gpu,
                            simt=not tensor)
        else:
            fwd[gi] = _gemm_time_v1(feat.flops[gi], o_b[gi], moved[gi], cls[gi], fit, spec, peak, elem) + launch
            dw = _gemm_time_v1(feat.flops[gi] * (w_b > 0), w_b, moved[gi], cls[gi], fit, spec, peak, elem)
        bwd[gi] = dw
        nb[gi] = (w_b > 0).astype(np.float64)
        if feat.edge_dst.size:
            d = feat.edge_dst
            eb = feat.edge_bytes * scale
            if tiled:
                dxd, _ = _bwd_dims(feat.dims[d], cls[d], feat.edge_bytes / 4.0)
                dx = _gemm_time(feat.flops[d], dxd, gcls[d], fit, spec, peak, elem, gpu, simt=not tensor)
                if wino:  # the data gradient of a 3x3 stride-1 conv is one too, C_in and C_out swapped
                    fd = feat.dims[d]
                    swapped = np.stack([fd[:, 0], fd[:, 1], fd[:, 3] / 9.0, 9.0 * fd[:, 2]], axis=1)
                    dx = np.minimum(dx, _wino_time(feat.wino[d], swapped, fit, spec, peak, elem, gpu))
            else:
                dx = _gemm_time_v1(feat.flops[d], eb, moved[d], cls[d], fit, spec, peak, elem)
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
