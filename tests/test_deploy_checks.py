"""``placement-rl deploy`` checks its arguments before it writes or starts anything, in process (no rank runs):
launch options against the plan, the plan file, the profile against the graph, the header's arithmetic, schedules
the simulator does not model, torchrun that fails or hangs; ``evaluate``'s micro-batches for one case."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from placement_rl.errors import ConfigError, ExecutionError, PlanError, ProfileError
from placement_rl.plans import Placement, StagePlan
from placement_rl.topology import load_topology

CPU4 = """name: 4x_cpu
devices:
  - {name: cpu, count: 4, kind: cpu, torch_device: cpu, host: 0, peak_flops: 1.0e+11, mem_bandwidth: 2.6e+10,
     memory_bytes: 8589934592}
links:
  intra_host: {bandwidth: 1.0e+10, latency: 2.0e-6, kind: shm}
"""


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(folder, graph.json, 4x_cpu.yaml): the tiny zoo gpt (batch 4), coarsened, with a DP 2 x PP 2 plan.json
    (2 micro-batches) beside it."""
    from placement_rl.graph import zoo
    from placement_rl.graph.capture import capture_zoo
    from placement_rl.graph.coarsen import coarsen

    folder = tmp_path_factory.mktemp("gpt")
    graph = coarsen(capture_zoo("gpt", **{**zoo.tiny("gpt"), "batch_size": 4}))
    graph.to_json(folder / "graph.json")
    topo = folder / "4x_cpu.yaml"
    topo.write_text(CPU4)
    n = graph.num_nodes
    plan = StagePlan(stage_of_node=[0 if i < n // 2 else 1 for i in range(n)], stage_devices=[(0, 1), (2, 3)],
                     num_microbatches=2)
    plan.to_json(folder / "plan.json", graph=graph, topology=load_topology(str(topo)))
    return folder, folder / "graph.json", topo


def _deploy_cfg(*overrides: str):
    from placement_rl.cli.common import _compose

    cfg, _ = _compose("deploy", list(overrides), [])
    return OmegaConf.create(cfg)


def _plan(world: int = 4, tp: int = 1) -> StagePlan:
    half = world // 2
    return StagePlan(stage_of_node=[0, 1], stage_devices=[tuple(range(half)), tuple(range(half, world))],
                     tp=(tp, tp))


# ------------------------------------------------------------------------------------------ launch options
@pytest.mark.parametrize("kwargs,message", [
    (dict(nnodes=3, node_rank=0, rdzv_endpoint="127.0.0.1:29611"), "the plan runs 4 processes, which nnodes=3 does "
                                                                   "not divide"),
    (dict(nnodes=2, node_rank=None, rdzv_endpoint=None), "nnodes=2 needs rdzv_endpoint=host:port"),
    (dict(nnodes=2, node_rank=None, rdzv_endpoint="nohost"), "rdzv_endpoint 'nohost' is not host:port"),
    (dict(nnodes=2, node_rank=2, rdzv_endpoint="h:29500"), "node_rank 2 is not in 0..1"),
    (dict(nnodes=1, node_rank=None, rdzv_endpoint="h:29500"), "apply to a run over several machines"),
])
def test_launch_options_that_do_not_fit_the_plan_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        from placement_rl.cli.deploy import check_launch

        check_launch(_plan(4), **kwargs)
    assert "\n" not in str(err.value)


def test_launch_options_that_fit_pass_and_a_placement_stays_on_one_node():
    from placement_rl.cli.deploy import check_launch

    check_launch(_plan(4), nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500")
    check_launch(_plan(4), nnodes=1, node_rank=None, rdzv_endpoint=None)
    with pytest.raises(ConfigError, match="op-level placement runs in one process"):
        check_launch(Placement([0, 1]), nnodes=2, node_rank=0, rdzv_endpoint="h:1")


@pytest.mark.parametrize("overrides,message", [
    (("nnodes=2",), "needs rdzv_endpoint"),
    (("nnodes=3", "node_rank=0", "rdzv_endpoint=127.0.0.1:29611", "timeout_s=20"), "does not divide"),
])
def test_deploy_refuses_bad_launch_options_before_writing_anything(gpt, tmp_path, monkeypatch, overrides, message):
    """No ``job/`` folder (nor anything else) in the run folder, no torchrun started."""
    import placement_rl.cli.deploy as deploy

    folder, _, topo = gpt
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(deploy, "output_dir", lambda: run)
    monkeypatch.setattr(deploy.subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun started"))
    cfg = _deploy_cfg(f"plan={folder / 'plan.json'}", f"topology.path={topo}", *overrides)
    with pytest.raises(ConfigError, match=message):
        deploy.run(cfg)
    assert list(run.iterdir()) == []


def test_a_plan_refused_by_prepare_job_leaves_no_job_folder(gpt, tmp_path):
    from placement_rl.executor.distributed import DeploySpec, prepare_job
    from placement_rl.graph.ir import CompGraph

    folder, graph_path, topo = gpt
    graph = CompGraph.from_json(graph_path)
    plan = StagePlan(stage_of_node=[0] * graph.num_nodes, stage_devices=[(0, 1)], batch_size=3)
    with pytest.raises(PlanError, match="batch size 3 is not divisible"):
        prepare_job([DeploySpec(plan=plan, graph=graph, model="gpt")], job_dir=tmp_path / "job")
    assert not (tmp_path / "job").exists()


# ---------------------------------------------------------------------------------------------- plan file
def test_plan_file_folder_missing_and_bad_field_are_named(gpt, tmp_path):
    from placement_rl.plans import load_plan

    folder, _, topo = gpt
    with pytest.raises(PlanError, match="is a folder, not a plan file"):
        load_plan(str(folder))
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(str(tmp_path / "nope.json"))
    data = json.loads((folder / "plan.json").read_text())
    data["num_microbatches"] = "two"
    bad = tmp_path / "m_str.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=r"field 'num_microbatches' must be an integer, got 'two'"):
        load_plan(str(bad))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PlanError, match="cannot be read as text"):
        load_plan(str(binary))
    load_plan(str(folder / "plan.json"), topology=load_topology(str(topo)))


def test_the_header_counts_per_stage_dp_and_tp():
    from placement_rl.cli.deploy import describe_plan

    assert describe_plan(_plan(4)) == "2 stage(s) x DP 2 = 4 processes"
    assert describe_plan(_plan(4, tp=2)) == "2 stage(s) x DP 1 x TP 2 = 4 processes"
    unequal = StagePlan(stage_of_node=[0, 1], stage_devices=[(0, 1), (2,)])
    assert describe_plan(unequal) == "2 stages (DP per stage 2, 1) = 3 processes"


# ----------------------------------------------------------------------------------------- prediction
def test_a_zb1p_plan_is_deployed_without_a_prediction(gpt):
    """The simulator does not model zb1p; the executor runs it: no prediction, and the memory check passes."""
    from placement_rl.cli.deploy import _predict
    from placement_rl.executor.distributed import check_memory
    from placement_rl.graph.ir import CompGraph

    _, graph_path, topo = gpt
    graph, topology = CompGraph.from_json(graph_path), load_topology(str(topo))
    n = graph.num_nodes
    plan = StagePlan(stage_of_node=[0 if i < n // 2 else 1 for i in range(n)], stage_devices=[(0, 1), (2, 3)],
                     num_microbatches=2, schedule="zb1p")
    predicted, why = _predict(graph, topology, plan, None)
    assert predicted is None and "does not model schedule 'zb1p'" in why
    check_memory(plan, graph, topology)


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    """(uncoarsened mlp, its coarsened graph, a profile of the uncoarsened one as `placement-rl profile` writes)."""
    from placement_rl.graph.capture import capture_zoo
    from placement_rl.graph.coarsen import coarsen
    from placement_rl.profiling import ProfileDB

    raw = capture_zoo("mlp")
    graph = coarsen(raw)
    db = ProfileDB()
    db.data["devices"]["cpu"] = {"torch_device": "cpu", "kind": "cpu", "host": socket.gethostname(), "threads": 1,
                                 "model": "cpu"}
    for i, node in enumerate(raw.names):
        db.put_node(raw, "cpu", node, [1e-4 * (i + 1)], [2e-4 * (i + 1)])
    db.put_step(raw, "cpu", [0.05])
    db.put_optimizer(raw, "cpu", [1e-3], float(raw.param_bytes.sum()))
    db.put_link("cpu", "cpu", "copy", [1e3, 1e6], [1e-6, 1e-4], 1e-6, 1e10)
    path = db.save(tmp_path_factory.mktemp("prof") / "profile.json")
    return raw, graph, path


def test_profile_of_the_uncoarsened_graph_predicts_a_placement_of_the_coarsened_one(mlp_profile):
    """``profile`` records the captured graph, ``place`` writes the coarsened one: a group's times are its
    members' (the optimizer and whole-step times the model's), as ``costs.path`` reads the same file."""
    from placement_rl.cli.deploy import _predict
    from placement_rl.profiling import ProfileDB

    raw, graph, path = mlp_profile
    assert graph.members is not None and ProfileDB.load(path).graph_entry(graph) is None
    topo = load_topology("2x_cpu")
    placement = Placement(np.arange(graph.num_nodes) % 2)
    predicted, source = _predict(graph, topo, placement, str(path))
    assert predicted > 0 and "measured:profile.json" in source


def test_a_profile_without_some_node_times_is_refused_naming_them(mlp_profile, tmp_path):
    """As ``costs.path`` refuses it: never the roofline in silence; the missing node is named."""
    from placement_rl.cli.deploy import _predict
    from placement_rl.cost.costs_file import load_costs

    raw, graph, path = mlp_profile
    data = json.loads(path.read_text())
    entry = next(iter(data["graphs"].values()))
    del entry["times"]["cpu"][raw.names[0]]
    bad = tmp_path / "missing_node.json"
    bad.write_text(json.dumps(data))
    topo = load_topology("2x_cpu")
    plan = StagePlan(stage_of_node=[0] * graph.num_nodes, stage_devices=[(0, 1)])
    for call in (lambda: _predict(graph, topo, plan, str(bad)),
                 lambda: _predict(graph, topo, Placement([0] * graph.num_nodes), str(bad)),
                 lambda: load_costs(bad, graph, topo), lambda: load_costs(bad, raw, topo)):
        with pytest.raises(ProfileError, match=rf"lacks times for 1 node of graph 'mlp' on device 'cpu' "
                                               rf"\({raw.names[0]}\)"):
            call()


def test_a_gpu_plan_run_on_cpus_is_one_warning_line_not_the_warnings_module(monkeypatch):
    """The executor's RuntimeWarning is what ``deploy`` filters (by its start) and says in its own line."""
    import torch

    from placement_rl.cli import deploy
    from placement_rl.executor.distributed import DeployConfig, _resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    topo = load_topology("2x_a100_nvlink_pair")
    plan = StagePlan(stage_of_node=[0], stage_devices=[(0, 1)])
    assert deploy._gpu_plan_on_cpu(plan, topo, "auto")
    assert not deploy._gpu_plan_on_cpu(plan, load_topology("2x_cpu"), "auto")
    with pytest.warns(RuntimeWarning, match=deploy._NO_GPU):
        _resolve_device(DeployConfig(), plan, topo)
    assert "compares a CPU run with the GPU prediction" in deploy._CPU_FOR_GPU and "\n" not in deploy._CPU_FOR_GPU


# ------------------------------------------------------------------------------------------------ torchrun
def test_torchrun_that_outlives_its_time_is_stopped_and_names_the_rendezvous(tmp_path):
    from placement_rl.cli.deploy import _torchrun

    t0 = time.perf_counter()
    with pytest.raises(ExecutionError, match=r"did not finish within 1 s: .* rendezvous at h:29611") as err:
        _torchrun([sys.executable, "-c", "import time; time.sleep(60)"], job_dir=tmp_path, timeout_s=1,
                  endpoint="h:29611")
    assert time.perf_counter() - t0 < 30 and "rank logs are in" not in str(err.value)
    with pytest.raises(ExecutionError, match="exited with code 3; torchrun's output"):
        _torchrun([sys.executable, "-c", "raise SystemExit(3)"], job_dir=tmp_path, timeout_s=30, endpoint="h:1")
    (tmp_path / "result").mkdir()
    (tmp_path / "result" / "rank1.error.json").write_text("{}")
    with pytest.raises(ExecutionError, match=r"errors the ranks raised: .*rank1\.error\.json"):
        _torchrun([sys.executable, "-c", "raise SystemExit(1)"], job_dir=tmp_path, timeout_s=30, endpoint="h:1")


# ---------------------------------------------------------------------------------------- other commands
def test_profile_measurements_names_a_missing_file(tmp_path):
    from placement_rl.profiling.measured_io import read_measurements

    with pytest.raises(ProfileError, match="measurement file '.*nope.json' does not exist"):
        read_measurements(tmp_path / "nope.json")


def test_evaluate_single_case_passes_num_microbatches(tmp_path, monkeypatch):
    from placement_rl.cli import evaluate
    from placement_rl.cli.common import _compose
    from placement_rl.graph import make_graph

    g = make_graph([{"name": n, "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
                     "out_bytes": 1e6} for n in "abcd"], [[0, 1, 1e6], [1, 2, 1e6], [2, 3, 1e6]], name="chain")
    g.to_json(tmp_path / "chain.json")
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(evaluate, "output_dir", lambda: tmp_path / "run")
    cfg, _ = _compose("evaluate", ["suite=single", f"graph.path={tmp_path / 'chain.json'}", "topology=2x_k80",
                                   "placers=[pp_uniform]", "num_microbatches=2", "budget=16", "progress=false"], [])
    rows = evaluate.run(OmegaConf.create(cfg))
    plans = [r.plan for r in rows if r.placer == "pp_uniform"]
    assert plans and plans[0].num_microbatches == 2


def test_a_long_op_level_deploy_says_how_far_it_is(capsys, monkeypatch):
    """``deploy`` of a placement prints a step line at most every 10 s (never the last step)."""
    import time

    from placement_rl.cli.deploy import _every

    clock = iter([0.0, 4.0, 11.0, 12.0, 25.0, 40.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    progress = _every(10.0)
    for done in range(1, 6):
        progress(done, 5)
    assert capsys.readouterr().out.splitlines() == ["  step 2/5 (11 s)", "  step 4/5 (25 s)"]


def test_the_memory_check_takes_the_batch_the_plan_runs():
    """The prediction prices the plan's batch_size; the memory check took the graph's capture batch, so a plan of 64
    x the batch on a graph captured at 8 passed it."""
    from placement_rl.executor.distributed import check_memory
    from placement_rl.graph.capture import capture_zoo

    graph = capture_zoo("gpt", batch_size=8, seq_len=128, vocab_size=256, d_model=128, n_layers=2, n_heads=4)
    topology = load_topology("2x_small_gpu")
    whole = StagePlan(stage_of_node=[0] * graph.num_nodes, stage_devices=[(0, 1)], batch_size=8)
    check_memory(whole, graph, topology)  # fits at its own batch
    with pytest.raises(PlanError, match="does not fit topology '2x_small_gpu'"):
        check_memory(StagePlan(stage_of_node=[0] * graph.num_nodes, stage_devices=[(0, 1)], batch_size=8 * 512),
                     graph, topology)


def test_the_prediction_names_the_sources_of_the_plans_devices_only():
    """A one-device plan on four devices listed all four devices' cost sources."""
    from placement_rl.cli.deploy import _predict
    from placement_rl.graph import make_graph

    g = make_graph([{"name": n, "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
                     "out_bytes": 1e6} for n in "abc"], [[0, 1, 1e6], [1, 2, 1e6]], name="chain")
    topo = load_topology("4x_v100_pcie")
    one = StagePlan(stage_of_node=[0, 0, 0], stage_devices=[(2,)], num_microbatches=1)
    _, source = _predict(g, topo, one, None)
    assert source.count("=") == 1 and source.startswith(f"{topo.device_names[2]}=")
    _, source = _predict(g, topo, Placement([0, 1, 1]), None)
    assert source.count("=") == 2
