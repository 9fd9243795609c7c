"""The GPU measurements this project made itself (placement_rl/data/measured/), their reader, the held-out
check on them, and scripts/measure_gpu.py (run on the CPU with stand-in models: the format round trip)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from placement_rl.cost.calibrated import shipped_fit
from placement_rl.errors import ProfileError
from placement_rl.profiling import calibrate
from placement_rl.profiling.measured_gpu import (MEASURED_DIR, check_kernels, gpu_of, harness_floor, kernel_bins,
                                                 measured_folders, read_whole_runs)

ROOT = Path(__file__).resolve().parent.parent
H200 = MEASURED_DIR / "nvidia_h200"
H100 = MEASURED_DIR / "nvidia_h100"
MEASURED = [(H200, "NVIDIA_H200", "1x_h200"), (H100, "NVIDIA_H100", "1x_h100_sxm")]


@pytest.mark.parametrize("folder,name,preset", MEASURED, ids=["h200", "h100"])
def test_shipped_measured_folders_read(folder, name, preset):
    assert folder in measured_folders()
    gpu, spec = gpu_of(folder)
    assert gpu == name and spec.sm_count == 132 and spec.arch == 9.0 and spec.fp32_lanes == 128
    runs = read_whole_runs(folder)
    assert len(runs) == 16 and sum(r.train for r in runs) == 8
    assert all(r.measured > 0.01 for r in runs)  # every workload runs for tens of ms or more


@pytest.mark.parametrize("folder", [H200, H100], ids=["h200", "h100"])
def test_held_out_kernels_calibrated_beats_roofline_on_gemm_classes(folder):
    """The shipped fit never saw these GPUs; on their GEMM-class kernels it is far closer than the roofline
    (measured margins are 14-36 points, so the ordering does not hinge on float details)."""
    checks = {c.op: c for c in check_kernels(folder, {"roofline": None, "calibrated": shipped_fit()},
                                             ops=("linear", "bmm", "conv"))}
    assert set(checks) == {"linear", "bmm", "conv"}
    for c in checks.values():
        assert c.rows > 1000
        assert np.isfinite(c.mape["calibrated"]) and c.mape["calibrated"] < c.mape["roofline"] - 5.0


def test_whole_run_reader_rejects_bad_files(tmp_path):
    d = tmp_path / "gpu"
    (d / "device_configs").mkdir(parents=True)
    (d / "labels" / "X").mkdir(parents=True)
    (d / "device_configs" / "X.json").write_text(json.dumps(
        {"Device": "X", "Dev_Mem": 1, "Mem_Bw": 100, "Num_Sm": 8, "Core_Per_SM": 64, "Freq": 1000,
         "SingleFLOPs": 1000, "L2Cache": 1}))
    (d / "labels" / "X" / "m-train-8-1.json").write_text("{not json")
    with pytest.raises(ProfileError, match="e2e_latency"):
        read_whole_runs(d)
    (d / "labels" / "X" / "m-train-8-1.json").write_text(json.dumps({"e2e_latency": 3.0}))
    (d / "labels" / "X" / "badname.json").write_text(json.dumps({"e2e_latency": 3.0}))
    with pytest.raises(ProfileError, match="<model>-<train|inf>"):
        read_whole_runs(d)


@pytest.mark.slow
def test_measure_gpu_script_round_trip_on_cpu(tmp_path):
    """scripts/measure_gpu.py on the CPU with stand-in models: every part writes NeuSight-format files that the
    project's readers load back."""
    shapes = tmp_path / "shapes"
    shapes.mkdir()
    with open(shapes / "shapes_linear.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerows([["B", "M", "N", "K"], [1, 64, 32, 48], [2, 16, 8, 24]])
    with open(shapes / "shapes_ln.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["B", "H"], [8, 128], [4, 64]])
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_gpu.py"), "--out", str(out), "--device",
                        "cpu", "--tiny", "--shapes", str(shapes), "--ops", "linear", "ln", "--models", "gpt2_large",
                        "--steps", "1", "--warmup", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    env = json.loads((out / "env.json").read_text())
    assert env["copy_bytes_per_s"] > 0 and env["fp32_matmul_flops"] > 0
    lab = json.loads((out / "labels" / "gpt2_large-train-1024-1.json").read_text())
    assert lab["e2e_latency"] == pytest.approx(lab["fw_latency"] + lab["bwall_latency"]) and lab["fw_latency"] > 0
    assert json.loads((out / "optimizer.json").read_text())["gpt2_large"]["adamw_step_ms"] > 0
    _, spec = gpu_of(H200)
    k = calibrate.load_kernels(out / "kernels" / "linear.csv", "linear", "cpu", spec, min_latency=0.0)
    assert len(k.fwd) == 2 and np.all(k.fwd > 0)
    assert len(calibrate.load_kernels(out / "kernels" / "ln.csv", "ln", "cpu", spec, min_latency=0.0).fwd) == 2


def test_measure_gpu_records_the_kernels_every_nth_shape(tmp_path):
    """``--kernel-names-every N`` adds NeuSight's ``Kernels`` column (which algorithm the library ran) for every
    N-th timed shape, after its timing; on the CPU it names the aten ops (the plumbing); the readers still load
    the table."""
    shapes = tmp_path / "shapes"
    shapes.mkdir()
    cols = ["B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]
    with open(shapes / "shapes_conv.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([cols] + [[2, 4, 4, 3, 8, 1, 1]] * 5)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_gpu.py"), "--out", str(out), "--device",
                        "cpu", "--shapes", str(shapes), "--parts", "kernels", "--ops", "conv",
                        "--kernel-names-every", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    with open(out / "kernels" / "conv.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 5
    assert ["conv2d" in row["Kernels"] for row in rows] == [True, False, True, False, True]
    _, spec = gpu_of(H200)
    assert len(calibrate.load_kernels(out / "kernels" / "conv.csv", "conv", "cpu", spec, min_latency=0.0).fwd) == 5


def test_measure_gpu_script_without_a_gpu_says_what_to_do():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_gpu.py"), "--out", "unused", "--parts",
                        "env"], capture_output=True, text=True, timeout=120,
                       env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("folder,name,preset", MEASURED, ids=["h200", "h100"])
def test_preset_matches_the_measured_device(folder, name, preset):
    """The GPU's topology preset and the measured folder's device config describe the same GPU (the H100 preset
    states the datasheet's rounded 67 TFLOP/s fp32, the config 132 SMs x 128 lanes x 2 x 1.98 GHz)."""
    from placement_rl.cost.calibrated import spec_of_device
    from placement_rl.topology import load_topology

    _, measured = gpu_of(folder)
    preset = spec_of_device(load_topology(preset).devices[0])
    assert preset.arch == measured.arch == 9.0 and preset.fp32_lanes == measured.fp32_lanes == 128
    assert preset.sm_count == measured.sm_count and preset.l2_bytes == measured.l2_bytes
    assert preset.peak_flops == pytest.approx(measured.peak_flops, rel=2e-3)
    assert preset.mem_bandwidth == pytest.approx(measured.mem_bandwidth, rel=1e-3)


def test_harness_floor_and_duration_bins_of_the_h200():
    floor = harness_floor(H200)
    assert 5e-6 < floor < 4e-5  # the host's dispatch interval between timed calls (15 us measured)
    fit = shipped_fit()
    (c,) = check_kernels(H200, {"calibrated": fit}, ops=("add",), floor_fits={"own floor": fit})
    assert set(c.mape) == {"calibrated", "own floor"} and c.mape["own floor"] < c.mape["calibrated"]
    bins = kernel_bins(H200, fit, "linear")
    assert sum(b[2] for b in bins) == next(k.rows for k in check_kernels(H200, {"c": fit}, ops=("linear",)))
    assert all(lo < hi for lo, hi, *_ in bins)


def test_tensor_core_tables_round_trip_and_are_priced_at_their_dtype(tmp_path):
    """measure_gpu.py --dtype bf16 (on the CPU: the format) writes kernels_bf16/ and the bf16 matmul rate; a
    measured folder holding such a table is checked at that dtype: the GEMM rows at the tensor-core peak and half
    the bytes (the same rows priced as fp32 are slower), the rest at half the bytes."""
    import shutil

    from placement_rl.profiling.gpu_fidelity import kernel_times
    from placement_rl.profiling.measured_gpu import load_table
    from placement_rl.topology import load_topology

    shapes = tmp_path / "shapes"
    shapes.mkdir()
    with open(shapes / "shapes_linear.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["B", "M", "N", "K"], [1, 512, 512, 512], [2, 256, 128, 256]])
    with open(shapes / "shapes_gelu.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["B", "H"], [64, 4096], [8, 1024]])
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_gpu.py"), "--out", str(out), "--device",
                        "cpu", "--shapes", str(shapes), "--ops", "linear", "gelu", "--parts", "env", "kernels",
                        "--dtype", "bf16"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    env = json.loads((out / "env.json").read_text())
    assert env["bf16_matmul_flops"] > 0 and env["fp32_matmul_flops"] > 0
    folder = tmp_path / "gpu"  # the shipped layout: device_configs/<GPU>.json, kernels_<dtype>/<op>/<GPU>.csv
    shutil.copytree(H200 / "device_configs", folder / "device_configs")
    for op in ("linear", "gelu"):
        (folder / "kernels_bf16" / op).mkdir(parents=True)
        shutil.copy(out / "kernels_bf16" / f"{op}.csv", folder / "kernels_bf16" / op / "NVIDIA_H200.csv")
    peak = load_topology("1x_h200").devices[0].peak_flops_bf16
    fit = shipped_fit()
    checks = check_kernels(folder, {"roofline": None, "calibrated": fit}, min_latency=0.0, dtype="bf16",
                           tensor_peak=peak)
    assert [c.op for c in checks] == ["linear", "gelu"] and all(c.rows == 2 for c in checks)
    assert all(np.isfinite(v) for c in checks for v in c.mape.values())
    lin = load_table(folder, "linear", 0.0, "bf16")
    bf16 = kernel_times(lin, fit, dtype="bf16", tensor_peak=peak)
    fp32 = kernel_times(lin, fit)
    assert np.all(bf16 < fp32) and bf16[0] < 0.9 * fp32[0]
    assert load_table(folder, "linear", 0.0) is None  # the fp32 tables are another folder
