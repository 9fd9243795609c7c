"""Held-out check of the calibrated GPU cost model on a GPU this project measured itself (no fit has seen it).

    python scripts/fidelity_measured_gpu.py [--gpu nvidia_h200 | path/to/folder] [--data ../shared/gpu-measurements]
                                            [--fit extra_fit.json ...] [--out docs/fidelity_<gpu>.md]

Reads ``placement_rl/data/measured/<gpu>/``, or a folder of the same layout anywhere (written by
``scripts/measure_gpu.py`` on the GPU; see its README):
single-kernel tables per op class, whole-model forward / forward + backward times of the NeuSight workloads, an
AdamW step per model and the executor's CPU + GPU fidelity run. Prices the same kernels and workloads on the
GPU's datasheet with the roofline, the two-GPU fit (v1), the shipped fit and any ``--fit`` given, and writes a
Markdown report; tables measured with ``--dtype tf32|bf16`` (``kernels_<dtype>/``) get a section each, priced at
the preset's datasheet tensor-core peak (``--preset``). The whole-model part needs NeuSight's label files
(``neusight/labels/``, for the workloads'
graphs: ``--data`` or ``$PLACEMENT_RL_GPU_DATA``); without them only the kernel part is written. Seconds. The
figures go to ``results/fidelity_<folder name without nvidia_>.json`` for the default ``--out``, else beside
``--out`` under that name.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from placement_rl.cost.calibrated import CLASSES, HARNESS_CLASSES, GpuFit, GpuSpec, harness_offset, shipped_fit
from placement_rl.cost.gpu_fit import conv_issue
from placement_rl.errors import PlacementRLError
from placement_rl.graph.io import atomic_write_text
from placement_rl.profiling import calibrate, neusight
from placement_rl.results import read_result, write_result
from placement_rl.profiling.measured_gpu import (MEASURED_DIR, check_kernels, gpu_of, harness_floor, kernel_bins,
                                                 measured_folders, predict_whole, read_whole_runs, whole_mape)

ROOT = Path(__file__).resolve().parent.parent
PRESETS = {"nvidia_h100": "1x_h100_sxm", "nvidia_h200": "1x_h200"}  # datasheet tensor-core peaks of each folder
CONV_ISSUE_FROM = ("H100", "H200")  # the families whose measured conv tables set ``issue_conv`` (calibrate.family)
SAME_SIZE = 1.25  # two MAPEs within this factor of each other are "the same size of error"
TOO_FAST = 0.95   # a mean predicted / measured below it: the model predicts the GPU too fast


def tensor_sections(folder: Path, gpu_dir: str, preset: str | None, fit: GpuFit) -> list[str]:
    """Kernel tables measured with ``scripts/measure_gpu.py --dtype tf32|bf16`` (``kernels_<dtype>/``) against
    the model at that dtype: GEMM classes at the preset's datasheet tensor-core peak, bf16 moving half the bytes."""
    from placement_rl.topology import load_topology

    out = []
    for dtype in ("tf32", "bf16"):
        if not (folder / f"kernels_{dtype}").is_dir():
            continue
        name = preset or PRESETS.get(gpu_dir)
        peak = getattr(load_topology(name).devices[0], f"peak_flops_{dtype}", 0.0) if name else 0.0
        out += ["", f"## Single kernels, {dtype} (tensor cores; rows of at least 50 us)", ""]
        if not peak:
            out.append(f"(not priced: no {dtype} datasheet peak; pass --preset <topology with peak_flops_{dtype}>)")
            continue
        checks = check_kernels(folder, {"roofline": None, "calibrated": fit}, dtype=dtype, tensor_peak=peak)
        out += [f"GEMM classes at the datasheet's dense {dtype} peak ({peak / 1e12:.0f} TFLOP/s, preset `{name}`); "
                "the fit was made on fp32 tables only (its tile and operand-traffic terms are fp32 SIMT's).", ""]
        out += kernel_lines(checks, ["roofline", "calibrated"])
        for c in checks:
            print(f"kernel {dtype} {c.op:8s} rows {c.rows:6d} " + "  ".join(f"{m} {c.mape[m]:5.1f}%" for m in c.mape))
    return out
V1_FIT = ROOT / "placement_rl" / "data" / "gpu_fit_two_gpu_v1.json"
SPAN_FROM = 2e-4  # s: the bias ranges quoted per class start at kernels this long


def kernel_lines(checks, models) -> list[str]:
    out = ["| op class | rows | " + " | ".join(f"{m} MAPE" for m in models) + " | "
           + " | ".join(f"{m} pred/meas" for m in models) + " |", "|---|---:|" + "---:|" * (2 * len(models))]
    for c in checks:
        out.append(f"| {c.op} | {c.rows} | " + " | ".join(f"{c.mape[m]:.1f}%" for m in models) + " | "
                   + " | ".join(f"{c.ratio[m]:.2f}" for m in models) + " |")
    return out


def whole_lines(runs, models) -> list[str]:
    out = ["| workload | measured ms | " + " | ".join(f"{m} ms (ratio)" for m in models) + " |",
           "|---|---:|" + "---:|" * len(models)]
    for r in sorted(runs, key=lambda r: (not r.train, r.key)):
        out.append(f"| {r.key} | {1e3 * r.measured:.1f} | " + " | ".join(
            f"{1e3 * r.predicted[m]:.1f} ({r.predicted[m] / r.measured:.3f})" for m in models) + " |")
    modes = run_modes(runs)
    out += ["", "| model | " + " | ".join(f"{w} MAPE | {w} mean ratio" for w in modes.values()) + " |",
            "|---|" + "---:|---:|" * len(modes)]
    for m in models:
        out.append(f"| {m} | " + " | ".join("{:.1f}% | {:.3f}".format(*whole_mape(runs, m, t)) for t in modes) + " |")
    return out


def run_modes(runs) -> dict[bool, str]:
    """The modes the whole-model runs hold (``train`` flag -> word), training first; a mode without runs is left
    out of every table and sentence."""
    return {t: w for t, w in ((True, "training"), (False, "inference")) if any(r.train == t for r in runs)}


def optimizer_lines(folder: Path, env: dict) -> list[str]:
    p = folder / "optimizer.json"
    if not p.is_file():
        return []
    rows = json.loads(p.read_text())
    copy = float(env.get("copy_bytes_per_s", 0.0))
    out = ["| model | parameters | AdamW step ms | bytes moved (28 per parameter) | achieved GB/s | of the copy rate |",
           "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        moved = 28.0 * r["params"]  # read p, g, m, v; write p, m, v (fp32)
        rate = moved / (r["adamw_step_ms"] * 1e-3)
        out.append(f"| {name} | {r['params'] / 1e6:.0f} M | {r['adamw_step_ms']:.1f} | {moved / 1e9:.1f} GB | "
                   f"{rate / 1e9:.0f} | {100 * rate / copy:.0f}% |" if copy else "| - |")
    return out


def optimizer_fraction(folder: Path, env: dict) -> tuple[float, float]:
    """Lowest and highest fraction of the measured copy rate an AdamW step reaches (28 bytes per parameter)."""
    rows = json.loads((folder / "optimizer.json").read_text())
    copy = float(env.get("copy_bytes_per_s", 0.0)) or float("nan")
    f = [28.0 * r["params"] / (r["adamw_step_ms"] * 1e-3) / copy for r in rows.values()]
    return (min(f), max(f)) if f else (float("nan"), float("nan"))


def span(folder: Path, fit: GpuFit, op: str) -> str:
    """Range of the shipped fit's predicted / measured over an op class's kernels of 200 us and longer."""
    r = [g for lo, hi, n, e, g in kernel_bins(folder, fit, op) if lo >= SPAN_FROM and n >= 5]
    return f"{min(r):.2f}-{max(r):.2f}" if r else "-"


def executor_split(folder: Path) -> tuple[float, int, float, int]:
    """MAPE of the executor fidelity run over single-device and over multi-device placements."""
    import csv

    p = folder / "executor" / "fidelity.csv"
    if not p.is_file():
        return float("nan"), 0, float("nan"), 0
    rows = list(csv.DictReader(p.open()))
    one = [abs(float(r["error_pct"])) for r in rows if int(r["devices_used"]) == 1]
    two = [abs(float(r["error_pct"])) for r in rows if int(r["devices_used"]) > 1]
    return (sum(one) / max(len(one), 1), len(one), sum(two) / max(len(two), 1), len(two))


def findings(checks, runs, folder: Path, env: dict, fit: GpuFit) -> list[str]:
    """What the measurements say about the model, with the figures computed above; each claim is made only where
    those figures bear it out."""
    k = {c.op: c for c in checks}
    gpu, spec = gpu_of(folder)
    out = ["## What this GPU shows", ""]
    if {"linear", "bmm", "conv"} <= set(k):
        out.append(gemm_text(k, folder, fit, gpu, spec))
    if {"gelu", "add", "ln"} <= set(k):
        out.append(memory_text(k, env, fit, spec))
    if runs:
        out.append(whole_text(runs, fit))
    if (folder / "optimizer.json").is_file() and env.get("copy_bytes_per_s"):
        frac = optimizer_fraction(folder, env)
        pct = (f"{100 * frac[0]:.0f}" if round(100 * frac[0]) == round(100 * frac[1])
               else f"{100 * frac[0]:.0f}-{100 * frac[1]:.0f}")
        out.append(f"* **Optimizer step:** AdamW (foreach, fp32) moves 28 bytes per parameter at {pct}% of the copy "
                   "rate on every model size: a bandwidth-bound step at a fixed low "
                   "efficiency (the multi-tensor kernels). The simulator's step time leaves the optimizer out today; "
                   f"this is the measured rule for adding it (28 B per parameter / ({frac[0]:.2f} x copy rate) on this "
                   "GPU).")
    e1, n1, e2, n2 = executor_split(folder)
    if n1:
        out.append(f"* **Our executor on CPU + GPU:** single-device placements {e1:.1f}% MAPE ({n1}), placements "
                   f"that cross the CPU-GPU boundary {e2:.1f}% ({n2}), all under-predicted as measured: a CPU-GPU "
                   "transfer in the executor synchronises the two devices and costs more than the copy benchmark's "
                   "bandwidth and latency say. The prediction now puts such placements on one host timeline with a "
                   "cost per crossing (docs/fidelity_crossing.md, `scripts/fidelity.py --replay`).")
    return out + [""]


def gemm_text(k: dict, folder: Path, fit: GpuFit, gpu: str, spec: GpuSpec) -> str:
    """The GEMM classes' bullet: held-out errors, where they sit by duration, bmm / conv bias, ``issue_conv``."""
    g = [k[o] for o in ("linear", "bmm", "conv")]
    same = same_size_as_logo(g)
    return ("* **GEMM classes, held out:** calibrated " + " / ".join(f"{c.mape['calibrated']:.1f}%" for c in g)
            + " (linear / bmm / conv) against the roofline's " + " / ".join(f"{c.mape['roofline']:.1f}%" for c in g)
            + ("; the same size of error as leave-one-GPU-out on the five fit GPUs (docs/fidelity_gpu.md)" if same
               else "") + ". " + duration_text(folder, fit)
            + "With this harness's own floor in its place the GPU part alone gives "
            + " / ".join(f"{c.mape['calibrated, our floor']:.1f}%" for c in g)
            + f". bmm stays {span(folder, fit, 'bmm')}x predicted / measured from {SPAN_FROM * 1e6:g} us up "
            f"(cuBLAS's batched fp32 GEMMs here against the tile model), conv {span(folder, fit, 'conv')}x (cuDNN's "
            "fp32 convolutions here)." + conv_lanes_text(folder, fit, k["conv"], gpu, spec))


def same_size_as_logo(gemm_checks) -> bool:
    """Whether the calibrated MAPE of linear / bmm / conv is within ``SAME_SIZE`` of leave-one-GPU-out's on the five
    fit GPUs (``results/fidelity_gpu.json`` of the checkout; False without it)."""
    try:
        logo = read_result("fidelity_gpu", folder=ROOT / "results")["figures"]["kernels"]
        return all(1 / SAME_SIZE <= c.mape["calibrated"] / logo[c.op]["leave-one-GPU-out"] <= SAME_SIZE
                   for c in gemm_checks)
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return False


def duration_text(folder: Path, fit: GpuFit) -> str:
    """Linear kernels' error by duration bin; "sits in the short kernels" only where the short bin's is largest."""
    binned = kernel_bins(folder, fit, "linear")
    short = binned[0] if binned and binned[0][0] < 2e-4 else None
    long = [b for b in binned if b[0] >= 1e-3]
    if not long and short is None:
        return ""
    in_short = short is not None and all(short[3] > b[3] for b in long)
    text = ("By duration the error sits in the short kernels: " if in_short else "By duration: ")
    text += "linear kernels by duration bin " + ", ".join(f"{_span(lo, hi)} {e:.1f}% (bias {r:.2f})"
                                                           for lo, hi, n, e, r in long)
    if short:
        text += (f"; those of {_span(short[0], short[1])} {short[4]:.2f}x too {'slow' if short[4] > 1 else 'fast'}"
                 ", where the fixed per-kernel cost (the fit's launch cost + NeuSight's harness offset for a GEMM "
                 "library call) is as large as the kernel")
    return text + ". "


def memory_text(k: dict, env: dict, fit: GpuFit, spec: GpuSpec) -> str:
    """The memory-bound classes' bullet."""
    roof = sorted((k["add"].mape["roofline"], k["gelu"].mape["roofline"]))
    gelu, add = k["gelu"].ratio["calibrated, our floor"], k["add"].ratio["calibrated, our floor"]
    text = (f"* **Memory-bound kernels:** the roofline is within {roof[0]:.0f}-{roof[1]:.0f}% on add / gelu, the "
            f"calibrated model {k['gelu'].mape['calibrated']:.1f} / {k['add'].mape['calibrated']:.1f}% (ratio "
            f"{k['gelu'].ratio['calibrated']:.2f} / {k['add'].ratio['calibrated']:.2f}) with NeuSight's per-class "
            f"harness floors ({harness_text(fit)}, launch included), and "
            f"{k['gelu'].mape['calibrated, our floor']:.1f} / {k['add'].mape['calibrated, our floor']:.1f}% "
            f"with this harness's floor in their place ({k['ln'].mape['calibrated, our floor']:.1f}% on "
            "layer norm).")
    if env.get("copy_bytes_per_s"):
        text += f" The largest rows stream near the measured copy rate ({env['copy_bytes_per_s'] / 1e12:.2f} TB/s)."
    if not spec.gddr and spec.arch >= 7 and min(gelu, add) > 1:
        text += (" What is left with our floor is the achieved fraction of bandwidth the five fit GPUs give an HBM "
                 "card of Volta or later (NeuSight's V100 and A100 stream element-wise kernels below their datasheet "
                 "bandwidth): this GPU streams them closer to its datasheet bandwidth (gelu / add predicted "
                 f"{gelu:.2f} / {add:.2f}x too slow).")
    else:
        text += f" With our floor gelu / add are predicted / measured {gelu:.2f} / {add:.2f}."
    return text + (" The launch cost belongs to the host CPU and framework version, not to the GPU's datasheet, and "
                   "the fit carries NeuSight's hosts'.")


def whole_text(runs, fit: GpuFit) -> str:
    """The whole-model bullet, over the modes the runs hold; the two-GPU fit's symptom (too fast) is called gone
    only where no mode's mean ratio is below ``TOO_FAST``."""
    modes = run_modes(runs)
    ratio = {t: whole_mape(runs, "calibrated", t) for t in modes}
    gone = all(r >= TOO_FAST for _, r in ratio.values())
    parts = []
    if False in modes:
        v, rv = whole_mape(runs, "two-GPU fit (v1)", False)
        parts.append(f"inference {ratio[False][0]:.1f}% (mean ratio {ratio[False][1]:.3f}; the two-GPU fit {v:.1f}%, "
                     f"ratio {rv:.3f})")
    if True in modes:
        a, ra = ratio[True]
        parts.append(f"training {a:.1f}% (mean ratio {ra:.3f}; {'too slow' if ra > 1 else 'too fast'} on average)")
    text = (f"* **Whole models:** the two-GPU fit's symptom (a newer GPU predicted too fast) "
            f"{'is gone' if gone else 'remains'}: " + "; ".join(parts) + ".")
    if True in modes:
        c, rc = whole_mape(runs, "calibrated, launch 0", True)
        text += f" With the per-kernel launch cost at 0 training is {c:.1f}% (ratio {rc:.3f})."
    return text + (f" The current fit's launch cost is {1e6 * fit.p('launch'):.1f} us (earlier fits and what they "
                   "gave here: CHANGELOG.md).")


def _span(lo: float, hi: float) -> str:
    """A duration bin in words: ``50-200 us``, ``>= 10 ms``."""
    def t(x: float) -> str:
        return f"{x * 1e3:g} ms" if x >= 1e-3 else f"{x * 1e6:g} us"
    return f">= {t(lo)}" if hi == float("inf") else f"{t(lo)}-{t(hi)}"


def conv_lanes_text(folder: Path, fit: GpuFit, conv, gpu: str, spec: GpuSpec) -> str:
    """The conv class with and without ``issue_conv`` where it changes the price (an SM of more than 64 FP32 lanes);
    not held out on a GPU of a family whose conv tables set it (``CONV_ISSUE_FROM``). ``conv``: the folder's conv
    ``KernelCheck`` with the shipped fit at this harness's floor."""
    if conv_issue(spec, fit) == 1.0:
        return ""
    old = GpuFit(name="no issue_conv", params={k: v for k, v in fit.params.items() if k != "issue_conv"},
                 meta=fit.meta)
    c = check_kernels(folder, {}, ops=("conv",), floor_fits={"old": old})[0]
    new = (conv.mape["calibrated, our floor"], conv.ratio["calibrated, our floor"])
    source = ("a term set from this GPU's and the other Hopper's conv tables, so conv is not held out here"
              if calibrate.family(gpu) in CONV_ISSUE_FROM else
              "a term set from the H100 and H200 conv tables we measured, not from this GPU's")
    return (f" The conv figures carry `issue_conv` = {fit.q('issue_conv'):g} (cuDNN's fp32 convolutions on an SM of "
            f"128 FP32 lanes at the rate of 64: `gpu_fit.conv_issue`), {source}: without it {c.mape['old']:.1f}% MAPE "
            f"(predicted / measured {c.ratio['old']:.2f}) with this harness's floor, with it "
            f"{new[0]:.1f}% ({new[1]:.2f}).")


def harness_text(fit) -> str:
    """The fit's fixed cost per kernel row (launch + harness offset), per class where it has per-class floors."""
    names = {"norm": "ln", "softmax": "softmax", "ew": "gelu", "ew_pass": "add"}
    cls = np.array([CLASSES.index("linear")] + [CLASSES.index(c) for c in HARNESS_CLASSES])
    us = 1e6 * (fit.p("launch") + harness_offset(cls, fit))
    if np.all(us == us[0]):
        return f"{us[0]:.0f} us"
    return "GEMMs " + f"{us[0]:.0f} us, " + ", ".join(f"{names[c]} {u:.0f}"
                                                      for c, u in zip(HARNESS_CLASSES, us[1:])) + " us"


def figures(gpu: str, checks, runs, models: list[str], folder: Path) -> dict:
    """This check's figures as data (``results/fidelity_<gpu>.json``): per kernel class the rows, MAPE % and
    predicted / measured of every model; per model the whole-model training / inference MAPE % and mean ratio (of
    the modes the runs hold); the executor run's MAPE % over single-device and over crossing placements."""
    whole, modes = {}, run_modes(runs)
    for m in models:
        w = {}
        for t, word in modes.items():
            a, b = whole_mape(runs, m, t)
            w.update({f"{word}_mape": round(a, 2), f"{word}_ratio": round(b, 4)})
        whole[m] = {**w, **{f"{word}_runs": sum(r.train == t for r in runs) for t, word in modes.items()}}
    e1, n1, e2, n2 = executor_split(folder)
    return {"gpu": gpu, "kernels": {c.op: {"rows": c.rows, "mape": {m: round(v, 2) for m, v in c.mape.items()},
                                           "ratio": {m: round(v, 4) for m, v in c.ratio.items()}} for c in checks},
            "whole": whole, "executor": {"single_device_mape": round(e1, 2) if n1 else None, "single_device": n1,
                                         "crossing_mape": round(e2, 2) if n2 else None, "crossing": n2}}


def measured_folder(gpu: str) -> Path:
    """The measured GPU folder ``--gpu`` names: a folder under placement_rl/data/measured/, or a path (absolute,
    or relative to the working directory) to one of the same layout anywhere."""
    plain = gpu not in (".", "..") and Path(gpu).name == gpu  # a bare folder name, not a path
    folder = MEASURED_DIR / gpu if plain and (MEASURED_DIR / gpu).is_dir() else Path(gpu)
    if not folder.is_dir():
        have = ", ".join(p.name for p in measured_folders())
        raise PlacementRLError(f"--gpu {gpu}: no such folder; give a path to a measured GPU folder or one of "
                               f"{have or 'none'} under {MEASURED_DIR}")
    return folder.resolve()


def result_name(folder: Path) -> str:
    """``fidelity_<the folder's name without a leading nvidia_>``: the results JSON's name and the default report's."""
    name = folder.name
    return "fidelity_" + (name[len("nvidia_"):] if name.lower().startswith("nvidia_") else name)


def report_paths(out: str | None, folder: Path) -> tuple[Path, Path | None]:
    """The report and the results JSON's folder: docs/<name>.md and results/ (``$PLACEMENT_RL_RESULTS``) by
    default, else ``--out`` and its folder."""
    default = ROOT / "docs" / f"{result_name(folder)}.md"
    path = Path(out) if out else default
    if path.resolve() == default.resolve():
        return path, None
    if path.suffix == ".json":
        raise PlacementRLError(f"--out {out}: give the Markdown report's name (.md); its results JSON goes beside it")
    return path, path.parent


def data_name(folder: Path) -> str:
    """The folder as the report names it: relative to the checkout when inside it, else its absolute path."""
    return str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)


def header_lines(folder: Path, gpu: str, spec: GpuSpec, env: dict) -> list[str]:
    """The report's title, where its data is, the GPU's datasheet and, from ``env.json``, how it was measured."""
    readme = " (its README says how it was measured)" if (folder / "README.md").is_file() else ""
    smi = env.get("nvidia_smi", {}) if isinstance(env.get("nvidia_smi"), dict) else {}
    how = ("No `env.json` in the folder: the software versions, driver, power limit, copy rate and fp32 matrix "
           "product rate of the measurement are not recorded." if not env else
           f"Measured with torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, "
           f"cuDNN {env.get('cudnn', '?')}, "
           f"driver {smi.get('driver_version', '?')}, power limit {smi.get('power.limit', '?')}; a "
           f"device-to-device copy moved {env.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s (read + write) and an "
           f"8192^3 fp32 matrix product (TF32 off) ran at {env.get('fp32_matmul_flops', 0) / 1e12:.1f} TFLOP/s.")
    return [f"# Held-out check on a GPU we measured: {gpu}", "",
            "Written by `python scripts/fidelity_measured_gpu.py`; the data is "
            f"`{data_name(folder)}/`{readme}. No fit has seen "
            "this GPU: every prediction below uses the GPU's datasheet alone "
            f"({spec.sm_count} SMs, {spec.peak_flops / 1e12:.1f} TFLOP/s fp32, {spec.mem_bandwidth / 1e12:.1f} "
            f"TB/s, {spec.l2_bytes / 2**20:.0f} MiB L2, compute capability {spec.arch}).", "", how]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="nvidia_h200", help="folder under placement_rl/data/measured/, or a path to a "
                    "folder of the same layout")
    ap.add_argument("--data", default=None, help="the public gpu-measurements folder (for the workloads' graphs)")
    ap.add_argument("--fit", nargs="*", default=[], help="more fit files to compare (label = file stem)")
    ap.add_argument("--out", default=None, help="default docs/fidelity_<folder name without 'nvidia_'>.md; the "
                    "results JSON goes beside any other --out (default: results/)")
    ap.add_argument("--preset", default=None, help="topology preset with the GPU's tensor-core peaks, for the "
                    "tf32 / bf16 kernel tables (default: known for nvidia_h100 / nvidia_h200)")
    args = ap.parse_args()
    start = time.perf_counter()
    try:
        folder = measured_folder(args.gpu)
        out, results = report_paths(args.out, folder)
        gpu, spec = gpu_of(folder)
        fit = shipped_fit()
        if fit is None:
            raise PlacementRLError("no shipped fit: run scripts/fit_gpu_costs.py first")
        fits = {"two-GPU fit (v1)": GpuFit.load(V1_FIT), "calibrated": fit}
        for f in args.fit:
            fits[Path(f).stem] = GpuFit.load(f)
        no_launch = GpuFit(name="no-launch", params=dict(fit.params, launch=0.0), meta={})
        floor = harness_floor(folder)
        checks = check_kernels(folder, {"roofline": None, **fits}, floor_fits={"calibrated, our floor": fit},
                               floor=floor)
        root = Path(args.data) if args.data else neusight.default_data_dir()
        labels = root is not None and (root / "neusight" / "labels").is_dir()
        runs = []
        if labels:
            graphs = calibrate.load_neusight(root / "neusight", kernels=False).graphs
            runs = predict_whole(read_whole_runs(folder), graphs, spec,
                                 {**fits, "calibrated, launch 0": no_launch})
    except PlacementRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").is_file() else {}
    lines = header_lines(folder, gpu, spec, env)
    lines += ["", "## Single kernels (rows of at least 50 us; fp32, TF32 off)", "",
              "The kernel shapes are those of NeuSight's tables for the five fit GPUs. Predicted / measured is a "
              "geometric mean; the fits' kernel-harness offsets (`kernel_offset`, and per memory-bound class "
              "`koff_<class>` where the fit has them) are the ones fitted on NeuSight's harness. `calibrated, our "
              f"floor` is the shipped fit with this harness's own floor ({1e6 * floor:.1f} us, "
              "the median of the tiniest add kernels: the host's dispatch interval between two timed calls) as each "
              "kernel's fixed cost in place of the fit's launch cost + NeuSight's harness offset "
              f"({harness_text(fit)}): the GPU part of the model alone.", ""]
    lines += kernel_lines(checks, ["roofline", *fits, "calibrated, our floor"])
    lines += ["", "GEMM classes by measured kernel duration (shipped fit): the short kernels carry the fixed "
              "per-kernel cost, the long ones the GPU model.", "",
              "| op class | duration | rows | MAPE | predicted / measured |", "|---|---|---:|---:|---:|"]
    for op in ("linear", "bmm", "conv"):
        for lo, hi, n, e, g in kernel_bins(folder, fit, op):
            span = f">= {1e6 * lo:.0f} us" if hi == float("inf") else f"{1e6 * lo:.0f}-{1e6 * hi:.0f} us"
            lines.append(f"| {op} | {span} | {n} | {e:.1f}% | {g:.2f} |")
    if runs:
        lines += ["", "## Whole models (NeuSight's workloads, Hugging Face models, eager attention, fp32)", "",
                  "Training is forward + backward (no optimizer step), inference the forward under `no_grad`, "
                  "median of 5 steps after 2 warm-up. `calibrated, launch 0` is the shipped fit with its per-kernel "
                  "launch cost set to 0: the part of the prediction that is host launch overhead.", ""]
        lines += whole_lines(runs, [*fits, "calibrated, launch 0"])
    elif labels:
        lines += ["", f"(Whole-model part skipped: none of `labels/{gpu}/*.json` in the folder is a workload of "
                  "NeuSight's label files.)"]
    else:
        lines += ["", "(Whole-model part skipped: NeuSight's label files were not found; pass --data.)"]
    try:
        lines += tensor_sections(folder, folder.name, args.preset, fit)
    except PlacementRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lines += [""] + findings(checks, runs, folder, env, fit)
    opt = optimizer_lines(folder, env)
    if opt:
        lines += ["", "## Optimizer step (AdamW, PyTorch's default foreach implementation, fp32)", ""] + opt
    ex = folder / "executor" / "fidelity.md"
    if ex.is_file():
        body = ex.read_text().splitlines()
        lines += ["", "## Our executor on CPU + this GPU (`python scripts/fidelity.py --models mlp gpt resnet18 "
                  "gpt2_hf`)", ""] + [ln for ln in body[1:] if not ln.startswith("# ")]
    atomic_write_text(out, "\n".join(lines) + "\n")
    result = write_result(result_name(folder),
                          figures(gpu, checks, runs, [*fits, "calibrated, launch 0"] if runs else [], folder),
                          seconds=round(time.perf_counter() - start, 1),
                          command=" ".join(["python scripts/fidelity_measured_gpu.py", *sys.argv[1:]]), folder=results)
    for c in checks:
        print(f"kernel {c.op:8s} rows {c.rows:6d} " + "  ".join(f"{m} {c.mape[m]:5.1f}%" for m in c.mape))
    for m in [*fits, "calibrated, launch 0"] if runs else []:
        print(f"whole {m:22s} " + "  ".join("{} MAPE {:5.1f}% (ratio {:.3f})".format(w, *whole_mape(runs, m, t))
                                            for t, w in run_modes(runs).items()))
    print(f"wrote {out} and {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
