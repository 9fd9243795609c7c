"""deploy runs a plan in the precision that priced it where the executor has it (bf16 autocast on CPU and CUDA for
DDP / FSDP2 / pipelines, fp16 autocast + GradScaler for one-stage DDP on CUDA, TF32 matmuls on CUDA), says so in one
line where it does not, and records both in ``deploy.json``'s ``precision``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from placement_rl.errors import ConfigError
from placement_rl.executor._mesh import ParallelDims
from placement_rl.executor.distributed import (DeployConfig, DeploySpec, deploy_stage_plans, prepare_job,
                                               reference_step, run_precision)
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import Placement, StagePlan
from placement_rl.topology import load_topology

torch.set_num_threads(1)

MLP = dict(batch_size=4, in_features=8, hidden=8, layers=2, num_classes=3)
H100X2 = """name: h100x2_{dtype}
dtype: {dtype}
devices:
  - {{name: h, count: 2, model: H100}}
links:
  intra_host: {{bandwidth: 450e9, latency: 5.0e-6, kind: nvlink}}
"""


def _dims(*, stages: int = 1, dp: int = 2, tp: int = 1, sharding: str = "dp") -> ParallelDims:
    return ParallelDims(dp=dp, pp=stages, num_stages=stages, pp_rank_of_stage=tuple(range(stages)), schedule="1f1b",
                        num_microbatches=2, sharding=sharding, tp=tp)


@pytest.fixture(scope="module")
def mlp():
    return capture_zoo("mlp", **MLP)


def _plain(graph) -> StagePlan:
    return StagePlan(stage_of_node=np.zeros(graph.num_nodes, dtype=np.int64), stage_devices=((0, 1),))


def _pipeline(graph) -> StagePlan:
    n = graph.num_nodes
    return StagePlan(stage_of_node=np.minimum(np.arange(n) * 2 // n, 1), stage_devices=((0,), (1,)),
                     num_microbatches=2, schedule="1f1b")


# ----------------------------------------------------------------------------------------- what runs where
@pytest.mark.parametrize("priced, device, dims, run, why", [
    ("fp32", "cpu", _dims(), "fp32", None),
    ("bf16", "cpu", _dims(), "bf16", None),
    ("bf16", "cpu", _dims(stages=2, dp=1), "bf16", None),
    ("bf16", "cuda", _dims(sharding="fsdp"), "bf16", None),
    ("bf16", "cuda", _dims(tp=2), "fp32", "tensor-parallel"),
    ("fp16", "cuda", _dims(), "fp16", None),
    ("fp16", "cpu", _dims(), "fp32", "needs a CUDA GPU"),
    ("fp16", "cuda", _dims(stages=2, dp=1), "fp32", "one-stage DDP plans only"),
    ("fp16", "cuda", _dims(sharding="fsdp"), "fp32", "one-stage DDP plans only"),
    ("tf32", "cuda", _dims(stages=2, dp=1), "tf32", None),
    ("tf32", "cpu", _dims(), "fp32", "TF32 needs a CUDA GPU"),
    ("fp64", "cuda", _dims(), "fp32", "fp64"),
    ("bf16/fp32", "cuda", _dims(), "fp32", "different precisions"),
])
def test_run_precision_is_the_priced_one_where_the_path_has_it(priced, device, dims, run, why):
    got = run_precision(priced, device, dims)
    assert got["priced"] == priced and got["run"] == run
    assert ("why" not in got) if why is None else why in got["why"]


def test_an_unknown_precision_is_one_line():
    with pytest.raises(ConfigError, match="precision 'fp8' is unknown; choose one of fp32, tf32, bf16, fp16, fp64"):
        run_precision("fp8", "cpu", _dims())


def test_the_job_records_the_priced_and_the_run_precision(mlp, tmp_path):
    prepare_job([DeploySpec(plan=_plain(mlp), graph=mlp, model="mlp", overrides=MLP, precision="fp16"),
                 DeploySpec(plan=_plain(mlp), graph=mlp, model="mlp", overrides=MLP, precision="bf16")],
                config=DeployConfig(device="cpu"), job_dir=tmp_path / "job")
    job = json.loads((tmp_path / "job" / "job.json").read_text())
    assert job["precision"] == [
        {"priced": "fp16", "run": "fp32", "why": "fp16 needs a CUDA GPU for its gradient scaler"},
        {"priced": "bf16", "run": "bf16"}]


# ------------------------------------------------------------------------------------------ deploy's lines
@pytest.mark.parametrize("source, expect", [
    ("h0=calibrated:neusight-v2:bf16, h1=calibrated:neusight-v2:bf16", "bf16"),
    ("v0=calibrated:neusight-v2:fp16", "fp16"),
    ("cpu0=roofline, cpu1=roofline", "fp32"),
    ("a=calibrated:neusight-v2:tf32, b=calibrated:neusight-v2", "fp32/tf32"),
    ("measured:profile:cpu, measured:profile:cpu:ops", "fp32"),
])
def test_the_priced_precision_is_the_cost_source_labels_suffix(mlp, source, expect):
    from placement_rl.cli.deploy import priced_precision

    assert priced_precision(source, mlp, load_topology("2x_cpu")) == expect


def test_without_a_prediction_the_topology_dtype_is_the_priced_one(mlp, tmp_path):
    from placement_rl.cli.deploy import priced_precision

    (tmp_path / "t.yaml").write_text(H100X2.format(dtype="bf16"))
    assert priced_precision(None, mlp, load_topology(str(tmp_path / "t.yaml"))) == "bf16"
    assert priced_precision(None, mlp, load_topology("2x_cpu")) == "fp32"


def test_the_note_says_which_precisions_the_ratio_compares():
    from placement_rl.cli.deploy import precision_note

    assert precision_note({"priced": "bf16", "run": "bf16"}) is None
    line = precision_note(run_precision("fp16", "cpu", _dims()))
    assert line == ("note: the plan was priced in fp16 and ran in fp32 (fp16 needs a CUDA GPU for its gradient "
                    "scaler): the ratio compares a run in fp32 with a prediction in fp16")


def _deploy_cfg(*overrides: str):
    from placement_rl.cli.common import _compose

    cfg, _ = _compose("deploy", list(overrides), [])
    return OmegaConf.create(cfg)


def _write_plan(graph, plan, folder: Path, dtype: str) -> tuple[Path, Path]:
    folder.mkdir()
    topo_path = folder / "topo.yaml"
    topo_path.write_text(H100X2.format(dtype=dtype))
    graph.to_json(folder / "graph.json")
    name = "plan.json" if isinstance(plan, StagePlan) else "placement.json"
    plan.to_json(folder / name, graph=graph, topology=load_topology(str(topo_path)))
    return folder / name, topo_path


def test_an_op_level_placement_runs_fp32_and_says_so(mlp, tmp_path, monkeypatch, capsys):
    import placement_rl.cli.deploy as deploy
    import placement_rl.executor.local as local

    plan_file, topo = _write_plan(mlp, Placement(np.zeros(mlp.num_nodes, dtype=np.int64)), tmp_path / "p", "bf16")
    monkeypatch.setattr(deploy, "output_dir", lambda: tmp_path)
    monkeypatch.setattr(local, "check_devices", lambda topology: None)  # its GPUs, stood in for
    monkeypatch.setattr(local, "run_placement", lambda *a, **k: SimpleNamespace(
        median_step_time=0.02, step_times=(0.02,), peak_memory_per_device=(1.0, 1.0), loss=3.5, losses=(3.5,)))
    deploy.run(_deploy_cfg(f"plan={plan_file}", f"topology.path={topo}", "steps=1", "warmup=0"))
    report = json.loads((tmp_path / "deploy.json").read_text())
    assert report["precision"] == {"priced": "bf16", "run": "fp32",
                                   "why": "the op-level executor runs the model as built, in fp32"}
    assert "note: the plan was priced in bf16 and ran in fp32" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ gloo runs
@pytest.mark.slow
@pytest.mark.distributed
def test_bf16_plans_run_under_autocast_with_ddp_and_a_pipeline(mlp):
    """The loss is the bf16-autocast reference's (the fp32 one differs by ~5e-4); the gradients too, to bf16's
    rounding (the reference sums its chunks' bf16 weight gradients before casting them)."""
    plans = [_plain(mlp), _pipeline(mlp)]
    specs = [DeploySpec(plan=p, graph=mlp, model="mlp", overrides=MLP, precision="bf16") for p in plans]
    results = deploy_stage_plans(specs, config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=120,
                                                            device="cpu"))
    for plan, res in zip(plans, results):
        assert res.precision == {"priced": "bf16", "run": "bf16"}
        chunks = plan.dp_degrees[0] * plan.num_microbatches
        loss32, _ = reference_step(*zoo.build("mlp", **MLP), chunks=chunks)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss16, grads16 = reference_step(*zoo.build("mlp", **MLP), chunks=chunks)
        assert res.losses[0] == pytest.approx(loss16, rel=1e-6, abs=1e-6)
        assert abs(res.losses[0] - loss32) > 1e-4
        for key, ref in grads16.items():
            torch.testing.assert_close(res.grads[key], ref, atol=4e-3, rtol=1e-2, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("dtype, run", [("bf16", "bf16"), ("fp16", "fp32")])
def test_deploy_json_records_the_priced_and_the_run_precision(mlp, tmp_path, monkeypatch, capsys, dtype, run):
    import placement_rl.cli.deploy as deploy

    plan_file, topo = _write_plan(mlp, _plain(mlp), tmp_path / "p", dtype)
    monkeypatch.setattr(deploy, "output_dir", lambda: tmp_path)
    deploy.run(_deploy_cfg(f"plan={plan_file}", f"topology.path={topo}", "steps=1", "warmup=0", "device=cpu"))
    report = json.loads((tmp_path / "deploy.json").read_text())
    assert report["prediction_source"].endswith(f":{dtype}")
    assert report["precision"]["priced"] == dtype and report["precision"]["run"] == run
    assert report["result"]["precision"] == report["precision"]
    said = "note: the plan was priced in fp16 and ran in fp32" in capsys.readouterr().out
    assert said == (dtype != run)
