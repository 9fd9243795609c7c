"""scripts/fidelity_gpu.py and scripts/fidelity_measured_gpu.py aimed at data of GPUs the repo has not seen.

No full fit runs here: the leave-one-GPU-out fit is replaced by the shipped fit where a script would fit, and the
data are a few rows copied into NeuSight's layout under new GPU names. What is checked: the family rule of the
leave-one-out groups, the input checks that come before any fit, where the reports and results JSON go, and that
the measured-GPU report's prose says only what its figures bear out.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from placement_rl.cost.calibrated import shipped_fit
from placement_rl.errors import PlacementRLError
from placement_rl.profiling import neusight
from placement_rl.profiling.calibrate import family
from placement_rl.profiling.measured_gpu import MEASURED_DIR, KernelCheck, WholeRun, gpu_of

ROOT = Path(__file__).resolve().parents[1]
DATA = neusight.default_data_dir()
needs_data = pytest.mark.skipif(DATA is None or not (Path(DATA) / "neusight" / "labels").is_dir(),
                                reason="needs the public GPU measurements (PLACEMENT_RL_GPU_DATA)")
H100 = MEASURED_DIR / "nvidia_h100"

torch.set_num_threads(1)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fidgpu():
    return _script("fidelity_gpu")


@pytest.fixture(scope="module")
def measured():
    return _script("fidelity_measured_gpu")


# ---- the family rule: whole model numbers, never a part of one


def test_family_is_the_whole_model_number():
    assert family("NVIDIA_L40S") == "L40S" != family("NVIDIA_L4") == "L4"
    assert family("Tesla_P40") == "P40" != family("Tesla_P4")
    assert family("NVIDIA_A100-PCIE-40GB") == family("NVIDIA_A100_80GB_PCIe") == family("NVIDIA_A100-SXM4-40GB")
    assert family("NVIDIA_H100_80GB_HBM3") == family("NVIDIA_H100") == family("h100_dgx") == "H100"
    assert [family(g) for g in ("Tesla_V100-PCIE-32GB", "Tesla_P100-PCIE-16GB", "Tesla_T4")] == ["V100", "P100", "T4"]
    assert family("NVIDIA_GH200_480GB") == "GH200" and family("GH-96") == "GH-96"


def test_every_gpu_of_the_data_is_in_a_leave_out_group(fidgpu):
    gpus = ["NVIDIA_A100-PCIE-40GB", "NVIDIA_A100_80GB_PCIe", "NVIDIA_H100_80GB_HBM3", "NVIDIA_L4", "NVIDIA_L40S",
            "Tesla_T4"]
    groups = fidgpu.leave_out_groups(gpus)
    assert groups == {"A100": gpus[:2], "H100": [gpus[2]], "L4": [gpus[3]], "L40S": [gpus[4]], "T4": [gpus[5]]}
    with pytest.raises(PlacementRLError, match="two families"):
        fidgpu.leave_out_groups(["NVIDIA_A100-PCIE-40GB", "NVIDIA_A100_80GB_PCIe"])


# ---- scripts/fidelity_gpu.py: inputs checked before any fit, results beside --out


def _neusight_tree(dest: Path, gpus: dict[str, str]) -> Path:
    """``dest/neusight`` holding, per new name, the device config and rows of the add table of an existing GPU
    (``gpus``: new name -> source name) and one inference label run."""
    src = Path(DATA) / "neusight"
    for new, old in gpus.items():
        (dest / "neusight" / "device_configs").mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "device_configs" / f"{old}.json", dest / "neusight" / "device_configs" / f"{new}.json")
        (dest / "neusight" / "kernels" / "add").mkdir(parents=True, exist_ok=True)
        with (src / "kernels" / "add" / f"{old}.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        with (dest / "neusight" / "kernels" / "add" / f"{new}.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows([r for r in rows if float(r["Latency"]) >= 0.05][:200])  # rows of at least 50 us
        (dest / "neusight" / "labels" / new).mkdir(parents=True)
        for ext in ("csv", "json"):
            shutil.copy(src / "labels" / old / f"bert_large-inf-512-8.{ext}", dest / "neusight" / "labels" / new)
    return dest


def _run_fidgpu(mod, monkeypatch, capsys, *args: str) -> tuple[int, list[list[str]], str]:
    """``main()`` with ``args``; the leave-one-GPU-out fits replaced by the shipped fit (their exclusions kept)."""
    left_out = []
    monkeypatch.setattr(mod.calibrate, "fit", lambda data, exclude=(), **kw: left_out.append(sorted(exclude))
                        or shipped_fit())
    monkeypatch.setattr(sys, "argv", ["fidelity_gpu.py", *args])
    rc = mod.main()
    return rc, left_out, capsys.readouterr().err


def test_fidelity_gpu_names_a_missing_input_before_fitting(fidgpu, tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "r.md")
    rc, fits, err = _run_fidgpu(fidgpu, monkeypatch, capsys, "--data", str(tmp_path / "nope"), "--quick", "--out", out)
    assert (rc, fits) == (2, []) and err.count("\n") == 1 and "no such folder" in err
    rc, fits, err = _run_fidgpu(fidgpu, monkeypatch, capsys, "--data", str(tmp_path), "--quick", "--out", out)
    assert (rc, fits) == (2, []) and err.count("\n") == 1 and "no neusight/ folder" in err
    shutil.copytree(H100 / "device_configs", tmp_path / "neusight" / "device_configs")
    rc, fits, err = _run_fidgpu(fidgpu, monkeypatch, capsys, "--data", str(tmp_path), "--quick", "--out", out)
    assert (rc, fits) == (2, []) and err.count("\n") == 1 and "no kernel tables" in err
    rc, fits, err = _run_fidgpu(fidgpu, monkeypatch, capsys, "--data", str(tmp_path), "--out", str(tmp_path / "r.json"))
    assert (rc, fits) == (2, []) and "(.md)" in err and not (tmp_path / "r.json").exists()


@needs_data
def test_fidelity_gpu_without_a_second_family_or_a_device_config_fails_before_fitting(fidgpu, tmp_path,
                                                                                       monkeypatch, capsys):
    one = _neusight_tree(tmp_path / "one", {"NVIDIA_L4": "Tesla_T4"})
    rc, fits, err = _run_fidgpu(fidgpu, monkeypatch, capsys, "--data", str(one), "--quick", "--out",
                                str(tmp_path / "r.md"))
    assert (rc, fits) == (2, []) and err.count("\n") == 1 and "two families" in err
    two = _neusight_tree(tmp_path / "two", {"NVIDIA_L4": "Tesla_T4", "Tesla_T4": "Tesla_T4"})
    (two / "neusight" / "device_configs" / "NVIDIA_L4.json").unlink()
    rc, fits, err = _run_fidgpu(fidgpu, monkeypatch, capsys, "--data", str(two), "--quick", "--out",
                                str(tmp_path / "r.md"))
    assert (rc, fits) == (2, []) and err.count("\n") == 1 and "no device config for GPU 'NVIDIA_L4'" in err


@needs_data
def test_fidelity_gpu_scores_a_new_gpu_and_writes_beside_out(fidgpu, tmp_path, monkeypatch, capsys):
    data = _neusight_tree(tmp_path / "data", {"NVIDIA_L40S": "Tesla_T4", "Tesla_T4": "Tesla_T4"})
    results = tmp_path / "results_env"
    monkeypatch.setenv("PLACEMENT_RL_RESULTS", str(results))
    out = tmp_path / "reports" / "unseen.md"
    rc, fits, err = _run_fidgpu(fidgpu, monkeypatch, capsys, "--data", str(data), "--quick", "--out", str(out))
    assert rc == 0, err
    assert sorted(fits) == [["NVIDIA_L40S"], ["Tesla_T4"]]  # the L40S is a family of its own
    text = out.read_text()
    assert "| NVIDIA_L40S | add (ew_pass) | 200 |" in text
    h100 = [ln for ln in text.splitlines() if "NVIDIA_H100_80GB_HBM3.json" in ln]
    assert len(h100) == 1 and "## A newer GPU" not in text  # no H100 config: one line instead of the section
    doc = json.loads((tmp_path / "reports" / "unseen.json").read_text())
    assert doc["figures"]["tables"] == 2 and not results.exists()


def test_fidelity_gpu_results_go_to_results_only_for_the_default_report(fidgpu, tmp_path):
    assert fidgpu.result_target(fidgpu.DEFAULT_OUT) == ("fidelity_gpu", None)
    assert fidgpu.result_target(tmp_path / "x" / "mine.md") == ("mine", tmp_path / "x")
    with pytest.raises(PlacementRLError, match="results JSON goes beside it"):
        fidgpu.result_target(tmp_path / "mine.json")


def test_fidelity_gpu_leaves_the_h100_section_out_without_its_config(fidgpu, tmp_path):
    assert fidgpu.newer_section(tmp_path, [], shipped_fit(), shipped_fit()) is None
    lines = [ln for ln in fidgpu.newer_lines(None) if ln]
    assert len(lines) == 1 and f"neusight/device_configs/{fidgpu.NEWER}.json" in lines[0]


# ---- scripts/fidelity_measured_gpu.py: a folder anywhere


def _measured_copy(dest: Path, gpu: str, rows: int = 400) -> Path:
    """The shipped H100 folder's device config and the first rows of its fp32 kernel tables under ``gpu``'s name
    (no labels, env.json, optimizer or executor files)."""
    (dest / "device_configs").mkdir(parents=True)
    shutil.copy(H100 / "device_configs" / "NVIDIA_H100.json", dest / "device_configs" / f"{gpu}.json")
    for table in sorted((H100 / "kernels").glob("*/NVIDIA_H100.csv")):
        (dest / "kernels" / table.parent.name).mkdir(parents=True)
        text = table.read_text().splitlines()[:rows]
        (dest / "kernels" / table.parent.name / f"{gpu}.csv").write_text("\n".join(text) + "\n")
    return dest


def test_measured_folder_is_a_name_or_a_path(measured, tmp_path, monkeypatch):
    assert measured.measured_folder("nvidia_h100") == H100.resolve()
    here = _measured_copy(tmp_path / "evals" / "NVIDIA_L40S", "NVIDIA_L40S", rows=2)
    monkeypatch.chdir(tmp_path)
    assert measured.measured_folder("evals/NVIDIA_L40S") == here.resolve()
    assert measured.measured_folder(str(here)) == here.resolve()
    with pytest.raises(PlacementRLError, match="no such folder"):
        measured.measured_folder("evals/nothing")
    monkeypatch.chdir(here)
    assert measured.measured_folder(".") == here.resolve()  # not the package's measured/ folder itself
    assert [measured.result_name(Path(p)) for p in ("/a/nvidia_h200", "/a/NVIDIA_L4", "/a/measured_L4")] == \
        ["fidelity_h200", "fidelity_L4", "fidelity_measured_L4"]
    assert measured.data_name(H100.resolve()) == "placement_rl/data/measured/nvidia_h100"
    assert measured.data_name(here.resolve()) == str(here.resolve())


def test_measured_script_on_a_folder_elsewhere(measured, tmp_path, monkeypatch, capsys):
    folder = _measured_copy(tmp_path / "evals" / "NVIDIA_L40S", "NVIDIA_L40S")
    results = tmp_path / "results_env"
    monkeypatch.setenv("PLACEMENT_RL_RESULTS", str(results))
    monkeypatch.setenv("PLACEMENT_RL_GPU_DATA", str(tmp_path / "none"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fidelity_measured_gpu.py", "--gpu", "evals/NVIDIA_L40S", "--out",
                                      "out/report.md"])
    assert measured.main() == 0, capsys.readouterr().err
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"the data is `{folder.resolve()}/`." in text.splitlines()[2]
    assert "nan" not in text and "0.00 TB/s" not in text and "No `env.json` in the folder" in text
    assert "issue_conv" in text and "not held out" not in text  # an L40S's conv tables set nothing
    doc = json.loads((tmp_path / "out" / "fidelity_L40S.json").read_text())  # named after the folder, beside --out
    assert doc["name"] == "fidelity_L40S" and not results.exists()


# ---- the measured-GPU report's prose follows its own figures


def _runs(ratio: float, train: bool | None) -> list[WholeRun]:
    modes = (True, False) if train is None else (train,)
    return [WholeRun(key=f"m-{'train' if t else 'inf'}-1-1", train=t, measured=1.0,
                     predicted={"calibrated": ratio, "two-GPU fit (v1)": ratio, "calibrated, launch 0": ratio})
            for t in modes]


def test_whole_model_prose_and_tables_leave_out_modes_without_runs(measured):
    fit = shipped_fit()
    inf = _runs(0.35, train=False)
    text = measured.whole_text(inf, fit)
    assert "remains" in text and "is gone" not in text and "training" not in text and "nan" not in text
    table = "\n".join(measured.whole_lines(inf, ["calibrated"]))
    assert "nan" not in table and "training" not in table
    whole = measured.figures("X", [], inf, ["calibrated"], H100)["whole"]["calibrated"]
    assert set(whole) == {"inference_mape", "inference_ratio", "inference_runs"}
    assert "is gone" in measured.whole_text(_runs(1.02, train=None), fit)


def _check(op: str, cal: float, ratio: float = 1.0) -> KernelCheck:
    models = ("roofline", "calibrated", "calibrated, our floor")
    return KernelCheck(op=op, rows=10, mape={m: cal for m in models}, ratio={m: ratio for m in models})


def test_same_size_sentence_only_when_the_errors_are(measured):
    logo = json.loads((ROOT / "results" / "fidelity_gpu.json").read_text())["figures"]["kernels"]
    near = [_check(op, logo[op]["leave-one-GPU-out"] * 1.1) for op in ("linear", "bmm", "conv")]
    far = [_check(op, logo[op]["leave-one-GPU-out"] * 2.5) for op in ("linear", "bmm", "conv")]
    assert measured.same_size_as_logo(near) and not measured.same_size_as_logo(far)


def test_memory_prose_without_env_or_on_gddr(measured):
    fit = shipped_fit()
    _, hbm = gpu_of(H100)
    k = {op: _check(op, 10.0, ratio=1.1) for op in ("gelu", "add", "ln")}
    assert "copy rate" in measured.memory_text(k, {"copy_bytes_per_s": 3e12}, fit, hbm)
    bare = measured.memory_text(k, {}, fit, hbm)
    assert "copy rate" not in bare and "streams them closer" in bare
    fast = {op: _check(op, 10.0, ratio=0.6) for op in ("gelu", "add", "ln")}
    assert "streams them closer" not in measured.memory_text(fast, {}, fit, hbm)


def test_conv_not_held_out_only_for_the_gpus_that_set_issue_conv(measured, tmp_path):
    folder = _measured_copy(tmp_path / "g", "NVIDIA_H100_80GB_HBM3")
    fit = shipped_fit()
    _, spec = gpu_of(folder)
    conv = _check("conv", 20.0, ratio=0.9)
    assert "not held out" in measured.conv_lanes_text(folder, fit, conv, "NVIDIA_H100_80GB_HBM3", spec)
    other = measured.conv_lanes_text(folder, fit, conv, "NVIDIA_L40S", spec)
    assert "issue_conv" in other and "not held out" not in other
    lanes64 = dataclasses.replace(spec, fp32_lanes=64)
    assert measured.conv_lanes_text(folder, fit, conv, "NVIDIA_L40S", lanes64) == ""
