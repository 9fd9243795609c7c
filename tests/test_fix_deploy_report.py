"""``placement-rl deploy``: the prediction prices the batch that runs, ``deploy.json`` says what ran (the plan's
layout, each rank's plan device, units, every step's loss), the topology defaults to the one the plan names, and
the help says which cost model predicts. In process; the executor is replaced by a stub (no rank runs)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

torch.set_num_threads(1)

from tests.test_deploy_checks import CPU4  # noqa: E402 - four CPU devices


def _deploy_cfg(*overrides: str):
    from placement_rl.cli.common import _compose

    cfg, _ = _compose("deploy", list(overrides), [])
    return OmegaConf.create(cfg)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> tuple[Path, Path]:
    """(folder with graph.json, plan.json, placement.json; 4x_cpu.yaml): the tiny zoo mlp (batch 8), a DP 2 x PP 2
    plan with permuted devices [[cpu3, cpu1], [cpu2, cpu0]], 2 micro-batches, and an op-level placement."""
    from placement_rl.graph import zoo
    from placement_rl.graph.capture import capture_zoo
    from placement_rl.plans import Placement

    folder = tmp_path_factory.mktemp("mlp")
    graph = capture_zoo("mlp", **zoo.tiny("mlp"))
    graph.to_json(folder / "graph.json")
    topo_path = folder / "4x_cpu.yaml"
    topo_path.write_text(CPU4)
    topo = load_topology(str(topo_path))
    n = graph.num_nodes
    plan = StagePlan(stage_of_node=[0 if i < n // 2 else 1 for i in range(n)], stage_devices=[(3, 1), (2, 0)],
                     num_microbatches=2, recompute=("full", "none"))
    plan.to_json(folder / "plan.json", graph=graph, topology=topo)
    Placement(device_of_node=[0] * n).to_json(folder / "placement.json", graph=graph, topology=topo)
    return folder, topo_path


# ------------------------------------------------------------------------------------ batch of the prediction
def _chain(batch: int | None):
    from placement_rl.graph import make_graph

    nodes = [{"name": x, "fwd_flops": 4e9, "bwd_flops": 8e9, "param_bytes": 4e6, "act_bytes": 1e6, "out_bytes": 1e6}
             for x in "abcd"]
    return make_graph(nodes, [[0, 1, 1e6], [1, 2, 1e6], [2, 3, 1e6]], name="chain",
                      meta={} if batch is None else {"batch_size": batch})


def test_the_prediction_prices_the_plans_batch_not_the_graphs(capsys):
    """A plan of batch 16 on a graph captured at 8 is priced at 16 (it was the batch-8 figure), with a note."""
    from placement_rl.cli.deploy import _predict
    from placement_rl.cost import resolve_costs, simulate_pipeline

    graph, topo = _chain(8), load_topology("2x_cpu")
    base = dict(stage_of_node=[0, 0, 1, 1], stage_devices=[(0,), (1,)], num_microbatches=2)
    at_graph, _ = _predict(graph, topo, StagePlan(**base), None)
    at_8, _ = _predict(graph, topo, StagePlan(**base, batch_size=8), None)
    assert "note:" not in capsys.readouterr().out
    at_16, _ = _predict(graph, topo, StagePlan(**base, batch_size=16), None)
    line = capsys.readouterr().out
    assert at_graph == pytest.approx(at_8)
    assert at_16 > 1.5 * at_8
    expect = simulate_pipeline(graph, resolve_costs(graph, topo), topo, StagePlan(**base, batch_size=16),
                               cost_batch_size=8).step_time
    assert at_16 == pytest.approx(expect)
    assert "the plan runs batch 16 and the costs are for batch 8" in line and "by 2" in line


def test_a_graph_without_a_batch_is_priced_as_before():
    from placement_rl.cli.deploy import _predict
    from placement_rl.cost import resolve_costs, simulate_pipeline

    graph, topo = _chain(None), load_topology("2x_cpu")
    plan = StagePlan(stage_of_node=[0, 0, 1, 1], stage_devices=[(0,), (1,)], num_microbatches=2, batch_size=16)
    got, _ = _predict(graph, topo, plan, None)
    assert got == pytest.approx(simulate_pipeline(graph, resolve_costs(graph, topo), topo, plan).step_time)


# ------------------------------------------------------------------------------------------------ deploy.json
def _stub_executor(monkeypatch, run_dir: Path) -> None:
    import placement_rl.cli.deploy as deploy
    import placement_rl.executor.distributed as dist
    import placement_rl.executor.local as local
    from placement_rl.executor.local import LocalRunResult

    result = SimpleNamespace(to_dict=lambda: {"step_time": 0.01, "losses": [3.0, 2.0], "throughput": 800.0,
                                              "peak_memory_bytes": 10, "ranks": [{"step_times": [0.01]}]})
    monkeypatch.setattr(deploy, "output_dir", lambda: run_dir)
    monkeypatch.setattr(dist, "prepare_job", lambda specs, config, job_dir: SimpleNamespace(job_dir=Path(job_dir)))
    monkeypatch.setattr(dist, "launch_local", lambda job: [result])
    monkeypatch.setattr(local, "run_placement", lambda *a, **k: LocalRunResult(
        median_step_time=0.02, step_times=(0.02, 0.02), peak_memory_per_device=(1.0,) * 4, loss=3.5,
        losses=(3.5, 3.1, 2.7)))


def test_deploy_json_records_the_plan_layout_rank_devices_and_units(mlp, tmp_path, monkeypatch):
    folder, topo = mlp
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _stub_executor(monkeypatch, run_dir)
    from placement_rl.cli import deploy

    deploy.run(_deploy_cfg(f"plan={folder / 'plan.json'}", f"topology.path={topo}"))
    report = json.loads((run_dir / "deploy.json").read_text())
    layout = report["plan_layout"]
    assert layout["num_microbatches"] == 2 and layout["schedule"] == "1f1b" and layout["sharding"] == "dp"
    assert layout["recompute"] == ["full", "none"] and layout["sequence_parallel"] is False
    assert layout["tp"] == [1, 1] and layout["dp"] == [2, 2]
    assert layout["batch_size"] == 8 and layout["graph_batch_size"] == 8
    assert layout["stage_devices"] == [["cpu3", "cpu1"], ["cpu2", "cpu0"]]
    n = CompGraph.from_json(folder / "graph.json").num_nodes
    assert layout["stage_sizes"] == [n // 2, n - n // 2]
    # the (dp, pp) mesh, row-major: rank 0 = (0, 0) -> stage 0's first device, rank 1 = (0, 1) -> stage 1's first
    assert layout["rank_devices"] == ["cpu3", "cpu2", "cpu1", "cpu0"]
    units = report["units"]
    assert units["measured_step_time"] == "s" and units["predicted_step_time"] == "s"
    assert units["result.throughput"] == "samples/s" and units["result.peak_memory_bytes"] == "bytes"
    # only what the report has: a stage plan's result has no per-device memory, no optimizer times per rank here
    assert "result.peak_memory_per_device" not in units and units["result.ranks[].step_times"] == "s"
    assert "result.ranks[].optimizer_times" not in units
    assert report["measured_step_time"] == 0.01  # existing keys kept
    assert {"predicted_step_time", "prediction_source", "ratio_measured_to_predicted", "result"} <= set(report)


def test_the_op_level_report_keeps_every_steps_loss(mlp, tmp_path, monkeypatch):
    folder, topo = mlp
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _stub_executor(monkeypatch, run_dir)
    from placement_rl.cli import deploy

    deploy.run(_deploy_cfg(f"plan={folder / 'placement.json'}", f"topology.path={topo}", "steps=2", "warmup=1"))
    report = json.loads((run_dir / "deploy.json").read_text())
    assert report["result"]["losses"] == [3.5, 3.1, 2.7] and report["result"]["loss"] == 3.5
    assert report["kind"] == "placement" and report["plan_layout"] is None and report["units"]["result.step_times"]
    assert report["units"]["result.peak_memory_per_device"] == "bytes" and "plan_layout.batch_size" not in report[
        "units"] and "result.ranks[].step_times" not in report["units"]


# ------------------------------------------------------------------------------------------------- topology
@pytest.mark.parametrize("overrides, named, expect, says", [
    ([], "4x_v100_nvlink", "4x_v100_nvlink", "the one the plan names"),
    (["steps=2"], "4x_v100_nvlink", "4x_v100_nvlink", "the one the plan names"),
    (["topology=2x_cpu"], "4x_v100_nvlink", "2x_cpu", None),
    (["topology.devices.0.count=6"], "4x_v100_nvlink", "2x_cpu", None),
    (None, "4x_v100_nvlink", "2x_cpu", None),  # run(cfg) outside Hydra: the composed topology
    ([], "2x_cpu", "2x_cpu", None),
    ([], None, "2x_cpu", None),
    ([], "my_cluster", "2x_cpu", "'my_cluster', which is not a preset"),
])
def test_deploy_takes_the_topology_the_plan_names_unless_one_is_given(overrides, named, expect, says):
    from placement_rl.cli.deploy import choose_topology

    cfg = _deploy_cfg("plan=x.json", *(overrides or ()))
    topology, line = choose_topology(cfg, {} if named is None else {"topology": named}, overrides)
    assert topology.name == expect
    assert (line is None) if says is None else (says in line and "\n" not in line)


def test_outside_hydra_there_are_no_task_overrides():
    from placement_rl.cli.given import task_overrides as _task_overrides

    assert _task_overrides() is None


# ---------------------------------------------------------------------------------------------- the help text
def test_the_help_and_docs_name_the_calibrated_model_for_gpus():
    import dataclasses

    from placement_rl.cli.configs import DeployConfig

    doc = next(f for f in dataclasses.fields(DeployConfig) if f.name == "profile").metadata["doc"]
    assert "calibrated for GPUs" in doc and "roofline for CPUs" in doc and "null = the roofline" not in doc
    text = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    assert "neither: the topology's roofline" not in text and "calibrated GPU model for GPU devices" in text
