"""Calibrated GPU cost model: achieved per-op time from op features and GPU datasheet figures.

A model of GPUs, not a table of measurements: every fitted parameter is shared by all GPUs, and a GPU
enters only through its datasheet (peak FLOP/s for the run's dtype, memory bandwidth, SM count, L2 size).
The parameters ship as package data (``placement_rl/data/gpu_fit.json``, fitted by
``scripts/fit_gpu_costs.py`` on public measurements, see ``placement_rl/data/NOTICE``).

Per node ``v`` of class ``c`` (``placement_rl.cost.op_classes.op_class``), on a GPU described by its datasheet
(``placement_rl.cost.gpu_spec.GpuSpec``)::

    GEMM-like (linear, bmm, conv): batch x (M x K) @ (K x N) from the node's FLOPs and bytes (``gemm_dims``);
        the fastest CTA tile / split-K configuration of a wave model over the SMs (``_gemm_time``), at
        e_max[c] x trend(GPU) of peak, memory traffic of the operand tiles at bw x e_mem_gemm; + launch.
        backward: one GEMM per input that needs a gradient (dX) and one for the weights (dW), at their shapes
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

from placement_rl.cost.gpu_spec import GpuSpec, arch_of, datasheet, spec_of_device  # noqa: F401 - re-exported
from placement_rl.cost.op_classes import CLASSES, GEMM_CLASSES, MEM_CLASSES, op_class  # noqa: F401 - re-exported
from placement_rl.errors import ProfileError

FIT_SCHEMA = "placement_rl.gpu_fit"
FIT_VERSION = 2
READS_VERSIONS = (1, 2)  # a version-1 fit is the version-2 model with the datasheet-trend terms at 0
# parameters added after version 1, with the value that reproduces the version-1 model
OPTIONAL = {"g_old_gemm": 0.0, "g_lp_gemm": 0.0, "lp_slow": 0.0, "lp_tau": 1e-3, "g_old_mem": 0.0, "g_gddr_mem": 0.0, "issue_ffma": 1.0,
            "l2_reuse": 8.0, "tile_area": 16384.0, "mem_terms": 0.0}
# memory-bound classes whose kernel tables carry a harness floor of their own (``koff_<class>``; see ``harness_offset``)
HARNESS_CLASSES = ("norm", "softmax", "ew", "ew_pass")
DTYPES = ("fp32", "tf32", "bf16")
BWD_SLACK = 2.0  # a GEMM-like backward may run at half the forward's achieved rate, no slower
@dataclass(frozen=True)
class GpuFit:
    """Fitted parameters (shared by every GPU). ``params`` maps a name to a float; see the module docstring."""

    name: str
    params: Mapping[str, float]
    meta: Mapping[str, Any]

    def p(self, key: str) -> float:
        return float(self.params[key])

    def q(self, key: str) -> float:
        """A parameter newer than fit version 1, at its neutral default where an older fit lacks it."""
        return float(self.params.get(key, OPTIONAL[key]))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": FIT_SCHEMA, "version": FIT_VERSION, "name": self.name,
                "params": {k: float(v) for k, v in self.params.items()}, "meta": dict(self.meta)}

    @staticmethod
    def from_dict(data: Any, where: str = "fit") -> "GpuFit":
        if not isinstance(data, dict) or data.get("schema") != FIT_SCHEMA:
            raise ProfileError(f"{where}: not a GPU cost fit (field 'schema' must be '{FIT_SCHEMA}')")
        if data.get("version") not in READS_VERSIONS:
            raise ProfileError(f"{where}: unknown fit version {data.get('version')!r} (this release reads "
                               f"{', '.join(map(str, READS_VERSIONS))}); re-run scripts/fit_gpu_costs.py")
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


def trend(spec: GpuSpec, fit: "GpuFit", simt: bool = True) -> tuple[float, float]:
    """``(gemm, mem)``: the GPU's achieved fraction of its datasheet peaks relative to the fitted class
    efficiencies -- a function of its architecture alone, with slopes shared by every GPU:
    ``gemm = exp(g_old_gemm [arch < 7] + g_lp_gemm [low power]) * issue``, ``mem = exp(min(0, g_old_mem [arch < 7],
    g_gddr_mem [GDDR]))`` (fits with ``mem_terms = 1``: a Pascal HBM2 card, a GDDR card and a Pascal GDDR card all
    stream element-wise kernels at about 75% of their datasheet bandwidth in NeuSight's tables, against about 92%
    for Volta / Ampere HBM2, so the two penalties do not add; older fits: ``exp(g_old_mem [arch < 7] + g_gddr_mem
    [GDDR])``), where ``issue = min(1, issue_ffma * 128 / fp32_lanes)``: an SM issues 4 x 32 thread
    instructions per cycle, so an SM with 128 FP32 lanes runs a SIMT GEMM at most at the FFMA share of its
    instruction stream (``issue_ffma``), one with 64 lanes has issue slots to spare (``simt=False``: tensor-core
    GEMMs, no such limit). A low-power card also slows down as a GEMM runs on (``throttle``). The low-power terms
    apply to cuBLAS GEMMs (linear, bmm): on the P4 and T4 tables cuDNN's convolutions show neither (fitted with
    them, they made conv worse on both cards), so conv keeps the architecture term alone."""
    old = 1.0 if 0.0 < spec.arch < 7.0 else 0.0
    gddr = 1.0 if spec.gddr else 0.0
    low = 1.0 if spec.low_power else 0.0
    lanes = spec.fp32_lanes if spec.fp32_lanes > 0 else 64
    issue = min(1.0, fit.q("issue_ffma") * 128.0 / lanes) if simt else 1.0
    gemm = math.exp(fit.q("g_old_gemm") * old + fit.q("g_lp_gemm") * low) * issue
    if fit.q("mem_terms") >= 0.5:  # the weaker of the two memory systems bounds the card, the penalties do not add
        mem = math.exp(min(0.0, fit.q("g_old_mem") * old, fit.q("g_gddr_mem") * gddr))
    else:
        mem = math.exp(fit.q("g_old_mem") * old + fit.q("g_gddr_mem") * gddr)
    return gemm, mem


def throttle(t: np.ndarray, spec: GpuSpec, fit: "GpuFit") -> np.ndarray:
    """Compute-bound time ``t`` on a card that cannot hold its boost clock within its board power: it runs at
    boost for a short kernel and ``1 + lp_slow`` times slower for one much longer than ``lp_tau`` seconds
    (``t (1 + lp_slow t / (t + lp_tau))``). Cards with power to spare: ``t``."""
    if not spec.low_power or fit.q("lp_slow") == 0.0:
        return t
    return t * (1.0 + fit.q("lp_slow") * t / (t + fit.q("lp_tau")))


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


def table_times(feat: "NodeFeatures", spec: GpuSpec, fit: "GpuFit") -> np.ndarray:
    """[rows] a single-kernel table's times as its harness reads them: the isolated forward time with the kernel
    tables' harness floor (``harness_offset``) in place of the per-op profiles' (``node_offset``)."""
    t, _, _ = node_times(feat, spec, fit, isolated=True)
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
    return NodeFeatures(cls=cls, flops=np.asarray(graph.fwd_flops, dtype=np.float64), in_bytes=in_b,
                        out_bytes=np.asarray(graph.out_bytes, dtype=np.float64),
                        param_bytes=np.asarray(graph.param_bytes, dtype=np.float64), grad=grad,
                        edge_dst=dst[keep], edge_bytes=np.asarray(graph.edge_bytes)[keep],
                        ops=ops if graph.members is not None else None,
                        bwd_flops=np.asarray(graph.bwd_flops, dtype=np.float64), dims=dims)


def gemm_dims(cls: np.ndarray, flops: np.ndarray, in_b: np.ndarray, out_b: np.ndarray, param_b: np.ndarray,
              a_b: np.ndarray | None = None, b_b: np.ndarray | None = None) -> np.ndarray:
    """``[N, 4]`` (batch, M, N, K) in elements of every GEMM-like node's forward ``(M x K) @ (K x N)``, from its
    FLOPs and fp32 bytes: ``K = F / 2 out``; linear ``M = in / K``; conv (implicit GEMM) ``N = C_out = params /
    K``; bmm from its two operands' bytes (``a_b``, ``b_b``: ``B M K`` and ``B K N``). Rows that do not solve
    (no FLOPs, inconsistent bytes) are 0: priced as a large GEMM without tile quantisation."""
    n = cls.shape[0]
    out = np.zeros((n, 4))
    out_el = out_b / 4.0
    ok = (flops > 0) & (out_el >= 1)
    kd = np.where(ok, flops / (2.0 * np.maximum(out_el, 1.0)), 0.0)
    lin = ok & (cls == CLASSES.index("linear"))
    m = np.where(lin & (kd > 0), in_b / 4.0 / np.maximum(kd, 1e-30), 0.0)
    good = lin & (m >= 1) & (out_el / np.maximum(m, 1e-30) >= 1)
    out[good] = np.stack([np.ones(good.sum()), m[good], out_el[good] / m[good], kd[good]], axis=1)
    conv = ok & (cls == CLASSES.index("conv"))
    co = np.where(conv & (kd > 0), np.floor(param_b / 4.0 / np.maximum(kd, 1e-30)), 0.0)
    good = conv & (co >= 1) & (out_el / np.maximum(co, 1e-30) >= 1)
    out[good] = np.stack([np.ones(good.sum()), out_el[good] / co[good], co[good], kd[good]], axis=1)
    if a_b is not None and b_b is not None:
        bmm = ok & (cls == CLASSES.index("bmm")) & (a_b > 0) & (b_b > 0)
        bm = np.where(bmm, a_b / 4.0 / np.maximum(kd, 1e-30), 0.0)
        bn = np.where(bmm, b_b / 4.0 / np.maximum(kd, 1e-30), 0.0)
        bt = np.where(bmm, np.round(bm * bn / np.maximum(out_el, 1.0)), 0.0)
        good = bmm & (bt >= 1) & (bm / np.maximum(bt, 1) >= 1) & (bn / np.maximum(bt, 1) >= 1)
        out[good] = np.stack([bt[good], bm[good] / bt[good], bn[good] / bt[good], kd[good]], axis=1)
    return out


TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128))  # CTA output tiles of SIMT GEMMs
SPLITS = (1, 4)  # split-K factors


def _gemm_time(flops: np.ndarray, dims: np.ndarray, cls: np.ndarray, fit: GpuFit, spec: GpuSpec, peak: float,
               elem: float, gpu: tuple[float, float]) -> np.ndarray:
    """Time of GEMM-like nodes ``batch x (M x K) @ (K x N)`` (``dims`` rows; 0 = unknown shape).

    Per candidate CTA tile ``tm x tn`` and split-K factor ``s`` (the library picks the fastest, so does the
    model): ``ctas = batch ceil(M/tm) ceil(N/tn) s``, an SM holds ``tile_area / (tm tn)`` of them at once, so a
    wave is ``SMs x that`` CTAs; a wave takes ``tile_area 2 (K/s + k0) / (peak / SMs x e)`` (``k0``: the
    prologue / epilogue in K-steps), a last partial wave ``frac ** w_wave`` of a full one. Memory: the operand
    tiles (A read once per column of tiles, B once per row, ``/ l2_reuse``) plus the output, at ``bw x
    e_mem_gemm``; split-K adds writing and reading ``s`` partial outputs. Time = max(compute, memory).
    ``e = e_max[class] x trend(GPU)``."""
    e_max = np.ones_like(flops)
    k0 = np.ones_like(flops)
    for c in GEMM_CLASSES:
        m = cls == CLASSES.index(c)
        e_max[m], k0[m] = fit.p(f"e_max_{c}"), fit.p(f"k0_{c}")
    conv = cls == CLASSES.index("conv")
    lp = math.exp(fit.q("g_lp_gemm")) if spec.low_power else 1.0
    e = e_max * gpu[0] / np.where(conv, lp, 1.0)  # cuDNN's conv algorithms: no low-power term (see trend)
    bw = spec.mem_bandwidth * gpu[1]
    e_mem = fit.p("e_mem_gemm")
    reuse = fit.q("l2_reuse")
    area = fit.q("tile_area")
    sm = float(spec.sm_count) if spec.sm_count > 0 else max(peak / (2 * 64 * 1.4e9), 1.0)
    w = fit.p("w_wave")
    known = dims[:, 3] > 0
    side = np.sqrt(np.maximum(flops, 2.0) / 2.0) ** (2.0 / 3.0)  # unknown: a cube of the same FLOPs
    bt = np.where(known, dims[:, 0], 1.0)
    mm = np.where(known, dims[:, 1], side)
    nn = np.where(known, dims[:, 2], side)
    kk = np.where(known, dims[:, 3], np.maximum(flops / (2.0 * side * side), 1.0))
    best = np.full(flops.shape, np.inf)
    for tm, tn in TILES:
        gm = np.where(known, np.ceil(mm / tm), mm / tm)
        gn = np.where(known, np.ceil(nn / tn), nn / tn)
        per_sm = max(1.0, math.floor(area / (tm * tn)))
        for s in SPLITS:
            ks = np.ceil(kk / s) if s > 1 else kk
            waves = bt * gm * gn * s / (sm * per_sm)
            full = np.floor(waves)
            wq = full + np.where(known, (waves - full) ** w, waves - full)
            t_c = wq * per_sm * tm * tn * 2.0 * (ks + k0) * sm / (peak * e)
            traffic = bt * (gn * mm * kk + gm * nn * kk) / reuse + bt * mm * nn * (1.0 + 2.0 * (s - 1))
            t = np.maximum(t_c, traffic * elem / (bw * e_mem))
            best = np.minimum(best, t)
    return np.where(flops > 0, np.where(conv, best, throttle(best, spec, fit)), 0.0)


def _gemm_time_v1(flops: np.ndarray, out_bytes: np.ndarray, moved: np.ndarray, cls: np.ndarray, fit: GpuFit,
                  spec: GpuSpec, peak: float, elem: float) -> np.ndarray:
    """The version-1 GEMM model (no tile choice), kept to evaluate a version-1 fit."""
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


def _bwd_dims(dims: np.ndarray, cls: np.ndarray, out_el: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dX, dW)`` dims of a GEMM's backward: ``dX = dY W^T`` is (batch, M, K) with inner N (bmm: the operand
    whose size ``out_el`` matches, ``dB = A^T dY`` is (batch, K, N) with inner M); ``dW = dY^T X`` is (1, N, K)
    with inner batch x M."""
    b, m, n, k = dims.T
    da = np.stack([b, m, k, n], axis=1)
    db = np.stack([b, k, n, m], axis=1)
    is_b = (cls == CLASSES.index("bmm")) & (np.abs(out_el - b * k * n) < np.abs(out_el - b * m * k))
    dx = np.where(is_b[:, None], db, da)
    dw = np.stack([np.ones_like(b), n, k, b * m], axis=1)
    unknown = k <= 0
    dx[unknown] = 0.0
    dw[unknown] = 0.0
    return dx, dw


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
    gpu = trend(spec, fit, simt=peak == spec.peak_flops)
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
        if tiled:
            dims = feat.dims[gi]
            fwd[gi] = _gemm_time(feat.flops[gi], dims, cls[gi], fit, spec, peak, elem, gpu) + launch
            _, dwd = _bwd_dims(dims, cls[gi], np.zeros(gi.size))
            dw = _gemm_time(feat.flops[gi] * (w_b > 0), dwd, cls[gi], fit, spec, peak, elem, gpu)
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
                dx = _gemm_time(feat.flops[d], dxd, cls[d], fit, spec, peak, elem, gpu)
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
