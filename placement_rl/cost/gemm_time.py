"""The time of a GEMM-like node (linear, bmm, conv) on a GPU: its (batch, M, N, K) shape from FLOPs and bytes
(``gemm_dims``), CTA tiles and waves over the SMs, split-K, the datasheet trend (``placement_rl.cost.gpu_fit``), and
the version-1 model that older fits are priced with. ``placement_rl.cost.calibrated.node_times`` calls it.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from placement_rl.cost.gpu_fit import GpuFit, conv_issue, throttle
from placement_rl.cost.gpu_spec import GpuSpec
from placement_rl.graph.op_classes import CLASSES, GEMM_CLASSES


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


def sm_estimate(spec: GpuSpec) -> float:
    """SM count of a GPU whose datasheet does not give it: the FP32 peak (never a tensor-core peak, which would
    count thousands of SMs) over its FP32 lanes per SM (64 if unknown) at 1.4 GHz (A100: 108)."""
    lanes = spec.fp32_lanes if spec.fp32_lanes > 0 else 64
    return max(spec.peak_flops / (2 * lanes * 1.4e9), 1.0)


TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128))  # CTA output tiles of SIMT GEMMs
SPLITS = (1, 4)  # split-K factors


def _gemm_time(flops: np.ndarray, dims: np.ndarray, cls: np.ndarray, fit: GpuFit, spec: GpuSpec, peak: float,
               elem: float, gpu: tuple[float, float], *, tiles: Sequence[tuple[int, int]] = TILES,
               splits: Sequence[int] = SPLITS, simt: bool = True) -> np.ndarray:
    """Time of GEMM-like nodes ``batch x (M x K) @ (K x N)`` (``dims`` rows; 0 = unknown shape).

    Per candidate CTA tile ``tm x tn`` and split-K factor ``s`` (the library picks the fastest, so does the
    model): ``ctas = batch ceil(M/tm) ceil(N/tn) s``, an SM holds ``tile_area / (tm tn)`` of them at once, so a
    wave is ``SMs x that`` CTAs; a wave takes ``tile_area 2 (K/s + k0) / (peak / SMs x e)`` (``k0``: the
    prologue / epilogue in K-steps), a last partial wave ``frac ** w_wave`` of a full one. Memory: the operand
    tiles (A read once per column of tiles, B once per row, ``/ l2_reuse``) plus the output, at ``bw x
    e_mem_gemm``; split-K adds writing and reading ``s`` partial outputs. Time = max(compute, memory).
    ``e = e_max[class] x trend(GPU)``. ``tiles`` / ``splits``: the candidates (a diagnostic prices one named
    kernel's tile, ``placement_rl.profiling.kernel_choice``). ``simt``: the GEMM runs on the FP32 lanes (False:
    on the tensor cores, whatever their peak: a GeForce card's TF32 peak is its FP32 one)."""
    e_max = np.ones_like(flops)
    k0 = np.ones_like(flops)
    for c in GEMM_CLASSES:
        m = cls == CLASSES.index(c)
        e_max[m], k0[m] = fit.p(f"e_max_{c}"), fit.p(f"k0_{c}")
    conv = cls == CLASSES.index("conv")
    lp = math.exp(fit.q("g_lp_gemm")) if spec.low_power else 1.0
    # cuDNN's conv algorithms: no low-power term (see trend), the issue rate of 64 FP32 lanes (conv_issue)
    e = e_max * gpu[0] / np.where(conv, lp / conv_issue(spec, fit, simt=simt), 1.0)
    bw = spec.mem_bandwidth * gpu[1]
    e_mem = fit.p("e_mem_gemm")
    reuse = fit.q("l2_reuse")
    area = fit.q("tile_area")
    sm = float(spec.sm_count) if spec.sm_count > 0 else sm_estimate(spec)
    w = fit.p("w_wave")
    known = dims[:, 3] > 0
    side = np.sqrt(np.maximum(flops, 2.0) / 2.0) ** (2.0 / 3.0)  # unknown: a cube of the same FLOPs
    bt = np.where(known, dims[:, 0], 1.0)
    mm = np.where(known, dims[:, 1], side)
    nn = np.where(known, dims[:, 2], side)
    kk = np.where(known, dims[:, 3], np.maximum(flops / (2.0 * side * side), 1.0))
    best = np.full(flops.shape, np.inf)
    for tm, tn in tiles:
        gm = np.where(known, np.ceil(mm / tm), mm / tm)
        gn = np.where(known, np.ceil(nn / tn), nn / tn)
        per_sm = max(1.0, math.floor(area / (tm * tn)))
        for s in splits:
            ks = np.ceil(kk / s) if s > 1 else kk
            waves = bt * gm * gn * s / (sm * per_sm)
            full = np.floor(waves)
            wq = full + np.where(known, (waves - full) ** w, waves - full)
            t_c = wq * per_sm * tm * tn * 2.0 * (ks + k0) * sm / (peak * e)
            traffic = bt * (gn * mm * kk + gm * nn * kk) / reuse + bt * mm * nn * (1.0 + 2.0 * (s - 1))
            t = np.maximum(t_c, traffic * elem / (bw * e_mem))
            best = np.minimum(best, t)
    return np.where(flops > 0, np.where(conv, best, throttle(best, spec, fit)), 0.0)


WINO_OUT, WINO_IN = 4, 6  # Winograd F(4x4, 3x3): a 6 x 6 transformed input tile per 4 x 4 output tile


def wino_tiles(batch: np.ndarray, h_out: np.ndarray, w_out: np.ndarray) -> np.ndarray:
    """Output tiles of a Winograd F(4x4, 3x3) convolution: ``batch x ceil(h / 4) x ceil(w / 4)``."""
    return batch * np.ceil(h_out / WINO_OUT) * np.ceil(w_out / WINO_OUT)


def _wino_time(tiles: np.ndarray, dims: np.ndarray, fit: GpuFit, spec: GpuSpec, peak: float, elem: float,
               gpu: tuple[float, float]) -> np.ndarray:
    """Time of 3x3 stride-1 convolutions (``dims`` rows: 1, M, C_out, 9 C_in) by Winograd F(4x4, 3x3), the
    algorithm cuDNN picks on most such rows of every fitted GPU: 36 GEMMs ``(tiles x C_in) @ (C_in x C_out)``
    (a quarter of the direct convolution's multiplies, priced by the same tile / wave model) times ``wino``, plus
    the transforms' memory traffic (the input read and its 36 / 16 transformed copy written, the GEMMs' outputs
    read and the output written, the filter transformed) at the memory-bound classes' bandwidth. ``tiles`` 0:
    not a 3x3 stride-1 convolution (inf)."""
    ok = (tiles > 0) & (dims[:, 3] > 0)
    t_n = np.where(ok, tiles, 1.0)
    ci = np.maximum(dims[:, 3] / 9.0, 1.0)
    co = np.maximum(dims[:, 2], 1.0)
    sq = WINO_IN * WINO_IN
    wd = np.stack([np.full_like(t_n, sq), t_n, co, ci], axis=1)
    flops = 2.0 * sq * t_n * ci * co
    t_g = _gemm_time(flops, wd, np.full(t_n.shape, CLASSES.index("conv")), fit, spec, peak, elem, gpu)
    m = dims[:, 1]
    moved = ci * m + sq * t_n * ci + sq * t_n * co + co * m + sq * ci * co + 9.0 * ci * co
    bw = spec.mem_bandwidth * fit.p("e_bw") * gpu[1]
    t = t_g * fit.q("wino") + moved * elem / bw
    return np.where(ok, t, np.inf)


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
