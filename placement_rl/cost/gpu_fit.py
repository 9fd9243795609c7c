"""The fitted parameters of the calibrated GPU model (``GpuFit``: read, checked, shipped) and the datasheet
trend that makes a GPU's achieved fraction of its peaks a function of its architecture (``trend``, ``throttle``).

The model itself is ``placement_rl.cost.calibrated`` (its docstring lists every parameter); the GEMM time of a
node is ``placement_rl.cost.gemm_time``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from placement_rl.cost.gpu_spec import GpuSpec
from placement_rl.graph.op_classes import GEMM_CLASSES, MEM_CLASSES
from placement_rl.errors import ProfileError

FIT_SCHEMA = "placement_rl.gpu_fit"
FIT_VERSION = 2
READS_VERSIONS = (1, 2)  # a version-1 fit is the version-2 model with the datasheet-trend terms at 0
# parameters added after version 1, with the value that reproduces the version-1 model
OPTIONAL = {"g_old_gemm": 0.0, "g_lp_gemm": 0.0, "lp_slow": 0.0, "lp_tau": 1e-3, "g_old_mem": 0.0, "g_gddr_mem": 0.0, "issue_ffma": 1.0,
            "l2_reuse": 8.0, "tile_area": 16384.0, "mem_terms": 0.0, "wino": 0.0,
            "issue_conv": 0.0}
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
    [GDDR])``), where ``issue = min(1, issue_ffma * slots / fp32_lanes)``: an SM issues 4 x 32 thread
    instructions per cycle (``slots`` = 128; a Kepler SMX dual-issues, 4 x 2 x 32 = 256 for its 192 lanes), so an SM
    with 128 FP32 lanes runs a SIMT GEMM at most at the FFMA share of its
    instruction stream (``issue_ffma``), one with 64 lanes has issue slots to spare (``simt=False``: tensor-core
    GEMMs, no such limit). A low-power card also slows down as a GEMM runs on (``throttle``). The low-power terms
    apply to cuBLAS GEMMs (linear, bmm): on the P4 and T4 tables cuDNN's convolutions show neither (fitted with
    them, they made conv worse on both cards), so conv keeps the architecture term alone. The GDDR term applies
    to GDDR cards on a low-power board only: the fitted GDDR cards (T4, P4) are both <= 75 W boards, so the data
    cannot tell memory kind from board power, and a GDDR6 / GDDR6X card with power to spare (RTX 30 / 40, A10,
    A40, L40S) is priced like HBM (the fit is the same either way; no such card is in the public tables)."""
    old = 1.0 if 0.0 < spec.arch < 7.0 else 0.0
    gddr = 1.0 if spec.gddr and spec.low_power else 0.0  # the only GDDR cards fitted are <= 75 W boards
    low = 1.0 if spec.low_power else 0.0
    issue = _issue(spec, fit.q("issue_ffma")) if simt else 1.0
    gemm = math.exp(fit.q("g_old_gemm") * old + fit.q("g_lp_gemm") * low) * issue
    if fit.q("mem_terms") >= 0.5:  # the weaker of the two memory systems bounds the card, the penalties do not add
        mem = math.exp(min(0.0, fit.q("g_old_mem") * old, fit.q("g_gddr_mem") * gddr))
    else:
        mem = math.exp(fit.q("g_old_mem") * old + fit.q("g_gddr_mem") * gddr)
    return gemm, mem


def conv_issue(spec: GpuSpec, fit: "GpuFit", simt: bool = True) -> float:
    """Factor on the GEMM efficiency of a SIMT convolution (cuDNN's fp32 implicit GEMM and Winograd kernels) over
    that of a cuBLAS GEMM on the same GPU: ``min(1, issue_conv * slots / lanes) / min(1, issue_ffma * slots /
    lanes)``. On an SM of 64 FP32 lanes both are 1 (every fitted GPU). The H100 and H200 we measured (128 lanes,
    docs/fidelity_h100.md) run their fp32 convolutions at the rate 64 lanes would give at the same clock -- their
    long conv kernels measured 1.6-1.8x slower than ``issue_ffma`` prices them, uniformly over durations and on
    both algorithms -- while cuBLAS's GEMMs there reach the ``issue_ffma`` share. ``issue_conv`` = 0.5 states that
    (no gain from the second half of the lanes), not a fitted value; 0 (older fits): conv as the GEMMs."""
    ic = fit.q("issue_conv")
    if not simt or ic <= 0.0:
        return 1.0
    return _issue(spec, ic) / _issue(spec, fit.q("issue_ffma"))


def _issue(spec: GpuSpec, share: float) -> float:
    """Achieved fraction of the FP32 lanes' rate of a SIMT kernel whose instruction stream is ``share`` FFMA:
    ``min(1, share * slots / lanes)`` (an SM issues ``slots`` thread instructions per cycle: 4 x 32, a Kepler
    SMX 4 x 2 x 32)."""
    lanes = spec.fp32_lanes if spec.fp32_lanes > 0 else 64
    slots = 256.0 if 0.0 < spec.arch < 5.0 else 128.0
    return min(1.0, share * slots / lanes)


def throttle(t: np.ndarray, spec: GpuSpec, fit: "GpuFit") -> np.ndarray:
    """Compute-bound time ``t`` on a card that cannot hold its boost clock within its board power: it runs at
    boost for a short kernel and ``1 + lp_slow`` times slower for one much longer than ``lp_tau`` seconds
    (``t (1 + lp_slow t / (t + lp_tau))``). Cards with power to spare: ``t``."""
    if not spec.low_power or fit.q("lp_slow") == 0.0:
        return t
    return t * (1.0 + fit.q("lp_slow") * t / (t + fit.q("lp_tau")))
