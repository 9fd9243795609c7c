"""DP x PP executor: stage splitting, plan validation before launch, gradients equal to a single-process
reference on CPU/gloo (GPT-style and CNN zoo models), and fault handling (a killed or hung rank).

Distributed tests share one launch per world size (several plans run in the same processes) to keep
the suite fast on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
import torch

from placement_rl.errors import ConfigError, ExecutionError, PlanError
from placement_rl.executor import _launch
from placement_rl.executor._mesh import parallel_dims
from placement_rl.executor._stages import (assign_stages, export_step, program_module, retarget, split_stages,
                                           stage_parameters, tied_parameters, untie)
from placement_rl.executor.distributed import (DeployConfig, DeploySpec, build_torchrun_command, deploy_stage_plan,
                                               deploy_stage_plans, launch_local, prepare_job, reference_step)
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

GPT = dict(batch_size=8, seq_len=8, vocab_size=32, d_model=16, n_layers=2, n_heads=2, dropout=0.0)
CNN = dict(batch_size=8, image_size=16, num_classes=5, width=4)
MLP = dict(batch_size=4, in_features=8, hidden=8, layers=2, num_classes=3)
MODELS = {"gpt": GPT, "resnet18": CNN, "mlp": MLP}


@pytest.fixture(scope="module")
def graphs():
    out = {}
    for name, ov in MODELS.items():
        module, inputs = zoo.build(name, **ov)
        out[name] = capture(module, inputs, name=name)
    return out


def make_plan(graph, *, stages: int, dp: int, m: int, schedule: str, layout: str = "loop",
              sharding: str = "dp") -> StagePlan:
    n = graph.num_nodes
    pp = stages if layout == "single" else stages // 2
    cols = [s if layout == "single" else (s % pp if layout == "loop" else min(s, 2 * pp - 1 - s))
            for s in range(stages)]
    return StagePlan(stage_of_node=np.minimum(np.arange(n) * stages // n, stages - 1),
                     stage_devices=tuple(tuple(d * pp + c for d in range(dp)) for c in cols),
                     num_microbatches=m, schedule=schedule, sharding=sharding)


def check_against_reference(name: str, plan: StagePlan, result) -> None:
    module, inputs = zoo.build(name, **MODELS[name])
    loss, grads = reference_step(module, inputs, chunks=plan.dp_degrees[0] * plan.num_microbatches)
    assert result.losses[0] == pytest.approx(loss, abs=1e-5)
    assert set(result.grads) == set(grads)
    for key, ref in grads.items():  # rtol covers float32 sums over DP of grads of magnitude ~100 (tiny BN nets)
        torch.testing.assert_close(result.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


# ----------------------------------------------------------------------------- no processes
def test_parallel_dims_layouts(graphs):
    g = graphs["gpt"]
    d = parallel_dims(make_plan(g, stages=2, dp=2, m=2, schedule="1f1b", layout="single"))
    assert (d.dp, d.pp, d.world_size, d.layout) == (2, 2, 4, "single")
    assert d.coords(3) == (1, 1) and d.rank(1, 0) == 2
    loop = parallel_dims(make_plan(g, stages=4, dp=1, m=2, schedule="interleaved1f1b"))
    assert (loop.pp, loop.layout, loop.stages_of(0)) == (2, "loop", (0, 2))
    v = parallel_dims(make_plan(g, stages=4, dp=1, m=2, schedule="zb1p", layout="v"))
    assert v.schedule_class_name() == "ScheduleZBVZeroBubble" and v.stages_of(0) == (0, 3)


def test_unequal_dp_degrees_rejected(graphs):
    g = graphs["mlp"]
    son = np.minimum(np.arange(g.num_nodes) * 2 // g.num_nodes, 1)
    plan = StagePlan(stage_of_node=son, stage_devices=((0, 1), (2,)), num_microbatches=2, schedule="gpipe")
    with pytest.raises(PlanError, match="unequal DP degrees"):
        parallel_dims(plan)


@pytest.mark.parametrize("case, error, pattern", [
    ("batch", PlanError, "not divisible"),
    ("1f1b_microbatches", PlanError, "num_microbatches >= number of stages"),
    ("interleaved_layout", PlanError, "loop layout"),
    ("other_model", PlanError, "do not match"),
    ("backwards", PlanError, "not contiguous"),
    ("config", ConfigError, "steps >= 1"),
    ("dp_batch", PlanError, r"batch size 4 is not divisible by DP degree \(3\)"),
    ("fsdp_memory", PlanError, r"fsdp plan does not fit topology 'tiny': .* needs .* (MiB|KiB|GiB), has .* (KiB|B)\b"),
    ("unequal_dp", PlanError, "unequal DP degrees"),
    ("fsdp_tied", PlanError, "tied parameters"),
])
def test_bad_plan_fails_before_launch(graphs, tmp_path, case, error, pattern):
    g = graphs["mlp"]
    plan = make_plan(g, stages=2, dp=1, m=2, schedule="gpipe", layout="single")
    graph, config, topology = g, DeployConfig(steps=1), None
    if case == "batch":
        plan = make_plan(g, stages=2, dp=1, m=3, schedule="gpipe", layout="single")
    elif case == "1f1b_microbatches":
        plan = make_plan(g, stages=2, dp=1, m=1, schedule="1f1b", layout="single")
    elif case == "interleaved_layout":
        plan = make_plan(g, stages=4, dp=1, m=2, schedule="interleaved1f1b", layout="v")
    elif case == "other_model":
        graph = graphs["gpt"]
        plan = make_plan(graph, stages=2, dp=1, m=2, schedule="gpipe", layout="single")
    elif case == "backwards":
        son = plan.stage_of_node[::-1].copy()
        plan = StagePlan(stage_of_node=son, stage_devices=plan.stage_devices, num_microbatches=2, schedule="gpipe")
    elif case == "dp_batch":
        plan = make_plan(g, stages=1, dp=3, m=1, schedule="1f1b", layout="single")
    elif case == "fsdp_memory":
        plan = make_plan(g, stages=1, dp=2, m=1, schedule="1f1b", layout="single", sharding="fsdp")
        topology = DeviceTopology.from_dict({"name": "tiny", "devices": [
            {"name": "gpu", "count": 2, "kind": "gpu", "peak_flops": 1e12, "mem_bandwidth": 1e12,
             "memory_bytes": 1000}], "links": {"intra_host": {"bandwidth": 1e9, "latency": 1e-6}}})
    elif case == "unequal_dp":
        son = np.minimum(np.arange(g.num_nodes) * 2 // g.num_nodes, 1)
        plan = StagePlan(stage_of_node=son, stage_devices=((0, 1), (2,)), num_microbatches=2, schedule="gpipe")
    elif case == "fsdp_tied":
        graph = graphs["gpt"]
        plan = make_plan(graph, stages=2, dp=2, m=2, schedule="1f1b", layout="single", sharding="fsdp")
    else:
        config = DeployConfig(steps=0)
    start = time.monotonic()
    name, overrides = ("gpt", GPT) if case == "fsdp_tied" else ("mlp", MLP)
    with pytest.raises(error, match=pattern):
        deploy_stage_plan(plan, graph, model=name, overrides=overrides, config=config, job_dir=tmp_path,
                          topology=topology)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "logs").exists()  # no rank was started


def test_plan_batch_must_match_module_inputs(graphs, tmp_path):
    g = graphs["mlp"]
    plan = make_plan(g, stages=2, dp=1, m=2, schedule="gpipe", layout="single")
    plan = StagePlan(stage_of_node=plan.stage_of_node, stage_devices=plan.stage_devices, num_microbatches=2,
                     schedule="gpipe", batch_size=6)
    module, inputs = zoo.build("mlp", **MLP)  # batch 4 (a zoo name would be rebuilt at the plan's batch)
    with pytest.raises(PlanError, match="differs"):
        prepare_job([DeploySpec(plan=plan, graph=g, module=module, inputs=inputs)], job_dir=tmp_path)


def test_wrong_process_count_rejected(graphs, tmp_path):
    plan = make_plan(graphs["mlp"], stages=2, dp=1, m=2, schedule="gpipe", layout="single")
    job = prepare_job([DeploySpec(plan=plan, graph=graphs["mlp"], model="mlp", overrides=MLP)], job_dir=tmp_path)
    with pytest.raises(ConfigError, match="needs 2 processes"):
        launch_local(job, nprocs=3)


@pytest.mark.parametrize("name, stages", [("gpt", 3), ("resnet18", 2)])
def test_split_stages_reproduce_the_step(graphs, name, stages):
    module, inputs = zoo.build(name, **MODELS[name])
    gm = program_module(export_step(module, inputs))
    g = graphs[name]
    son = np.minimum(np.arange(g.num_nodes) * stages // g.num_nodes, stages - 1)
    splits = split_stages(gm, assign_stages(gm, g, son), stages)
    ties = tied_parameters(splits)
    assert ties == ({"wte.weight": (0, stages - 1)} if name == "gpt" else {})
    for sp in splits:
        untie(sp, list(ties))
    values = tuple(inputs)
    for sp in splits:
        values = sp.module(*values)
        values = values if isinstance(values, tuple) else (values,)
    (loss,) = values
    loss.backward()
    ref_module, _ = zoo.build(name, **MODELS[name])
    ref_loss, ref_grads = reference_step(ref_module, inputs, chunks=1)
    assert float(loss.detach()) == pytest.approx(ref_loss, abs=1e-6)
    got: dict[str, torch.Tensor] = {}
    for sp in splits:
        for key, p in stage_parameters(sp).items():
            got[key] = got.get(key, 0) + p.grad
    assert set(got) == set(ref_grads)
    for key in ref_grads:
        torch.testing.assert_close(got[key], ref_grads[key], atol=1e-5, rtol=1e-5)


def test_retarget_moves_explicit_devices(graphs):
    module, inputs = zoo.build("gpt", **GPT)
    gm = program_module(export_step(module, inputs))
    g = graphs["gpt"]
    (sp,) = split_stages(gm, assign_stages(gm, g, np.zeros(g.num_nodes, dtype=np.int64)), 1)
    assert "device(type='cpu')" in sp.module.code  # arange(..., device=cpu) of the exported program
    retarget(sp.module, torch.device("cuda", 0))
    assert "device(type='cpu')" not in sp.module.code and "device(type='cuda', index=0)" in sp.module.code


def test_blame_names_the_culprit():
    S = _launch.RankState
    died = [S(0, None, 5, "step 0 begin"), S(1, 3, 3, "built")]
    assert _launch.blame(died, hung=False, timeout_s=5).startswith("rank 1 (at 'built') died with exit code 3")
    hung = [S(0, None, 5, "step 0 begin"), S(1, None, 3, "built")]
    assert "rank 1 (at 'built') made no progress for 5 s" in _launch.blame(hung, hung=True, timeout_s=5)
    waited = [S(0, 1, 5, "step 0 begin", error="RuntimeError: timeout", error_time=1.0),
              S(1, None, 3, "built")]
    assert _launch.blame(waited, hung=False, timeout_s=5).startswith("rank 1 (at 'built') fell behind")
    failed = [S(0, 1, 5, "x", error="RuntimeError: boom", error_time=2.0),
              S(1, 1, 5, "x", error="RuntimeError: Connection closed", error_time=3.0)]
    assert _launch.blame(failed, hung=False, timeout_s=5) == "rank 0 (at 'x') failed: RuntimeError: boom"


def test_torchrun_command(tmp_path):
    one = build_torchrun_command(tmp_path, nproc_per_node=4, python="python")
    assert one == ["python", "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=4", "--standalone",
                   "-m", "placement_rl.executor.distributed_worker", str(tmp_path)]
    many = build_torchrun_command(tmp_path, nproc_per_node=2, nnodes=2, rdzv_endpoint="h0:29500", node_rank=1)
    assert "--rdzv-endpoint=h0:29500" in many and "--node-rank=1" in many and "--standalone" not in many
    with pytest.raises(ConfigError, match="rdzv_endpoint"):
        build_torchrun_command(tmp_path, nproc_per_node=2, nnodes=2)


# ------------------------------------------------------------------------- distributed (gloo)
TWO_RANKS = [("gpt", dict(stages=1, dp=2, m=1, schedule="gpipe", layout="single")),
             ("gpt", dict(stages=2, dp=1, m=2, schedule="gpipe", layout="single")),
             ("gpt", dict(stages=2, dp=1, m=2, schedule="1f1b", layout="single")),
             ("resnet18", dict(stages=1, dp=2, m=1, schedule="gpipe", layout="single")),
             ("resnet18", dict(stages=2, dp=1, m=2, schedule="gpipe", layout="single")),
             ("resnet18", dict(stages=2, dp=1, m=2, schedule="1f1b", layout="single")),
             ("gpt", dict(stages=4, dp=1, m=2, schedule="interleaved1f1b", layout="loop")),
             ("gpt", dict(stages=4, dp=1, m=2, schedule="zb1p", layout="v")),
             # one stage: plain DDP with gradient accumulation, and FSDP2 (fully_shard over dp)
             ("gpt", dict(stages=1, dp=2, m=2, schedule="1f1b", layout="single")),
             ("gpt", dict(stages=1, dp=2, m=2, schedule="1f1b", layout="single", sharding="fsdp")),
             ("resnet18", dict(stages=1, dp=2, m=1, schedule="1f1b", layout="single", sharding="fsdp"))]
FOUR_RANKS = [("gpt", dict(stages=2, dp=2, m=2, schedule="1f1b", layout="single")),
              ("resnet18", dict(stages=2, dp=2, m=2, schedule="gpipe", layout="single")),
              ("gpt", dict(stages=2, dp=2, m=2, schedule="zb1p", layout="single")),
              ("resnet18", dict(stages=2, dp=2, m=2, schedule="1f1b", layout="single", sharding="fsdp"))]


def _run(cases, graphs):
    plans = [make_plan(graphs[name], **kw) for name, kw in cases]
    specs = [DeploySpec(plan=p, graph=graphs[name], model=name, overrides=MODELS[name])
             for p, (name, _) in zip(plans, cases)]
    results = deploy_stage_plans(specs, config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=120))
    return plans, results


@pytest.fixture(scope="module")
def two_rank_runs(graphs):
    return _run(TWO_RANKS, graphs)


@pytest.fixture(scope="module")
def four_rank_runs(graphs):
    return _run(FOUR_RANKS, graphs)


def _case_id(case):
    name, kw = case
    return f"{name}-{kw.get('sharding', 'dp')}{kw['dp']}-s{kw['stages']}-m{kw['m']}-{kw['schedule']}"


@pytest.mark.distributed
@pytest.mark.parametrize("index", range(len(TWO_RANKS)), ids=[_case_id(c) for c in TWO_RANKS])
def test_two_ranks_equal_reference(two_rank_runs, index):
    plans, results = two_rank_runs
    res = results[index]
    assert res.world_size == 2 and res.backend == "gloo" and res.step_time > 0 and res.throughput > 0
    assert json.loads(json.dumps(res.to_dict()))["schema"] == "placement_rl.deploy_result"
    if TWO_RANKS[index][0] == "gpt" and plans[index].num_stages > 1:
        assert res.tied_parameters == ("wte.weight",)
    _check_sharding(plans[index], res)
    check_against_reference(TWO_RANKS[index][0], plans[index], res)


def _check_sharding(plan, res):
    assert res.sharding == plan.sharding
    for r in res.ranks:  # FSDP2 keeps about 1/dp of the parameters per rank, DDP all of them
        if plan.sharding == "fsdp":
            assert r["local_params"] <= r["num_params"] // res.dp + 64
        else:
            assert r["local_params"] == r["num_params"]


@pytest.mark.distributed
@pytest.mark.parametrize("index", range(len(FOUR_RANKS)), ids=[_case_id(c) for c in FOUR_RANKS])
def test_dp_x_pp_equal_reference(four_rank_runs, index):
    plans, results = four_rank_runs
    res = results[index]
    assert (res.dp, res.pp, res.world_size) == (2, 2, 4)
    assert all(r["peak_memory_bytes"] > 0 for r in res.ranks)
    _check_sharding(plans[index], res)
    check_against_reference(FOUR_RANKS[index][0], plans[index], res)


def _workers_of(job_dir) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "distributed_worker" in line and str(job_dir) in line]


@pytest.mark.distributed
@pytest.mark.parametrize("kind, timeout_s, pattern", [("exit", 60.0, "rank 1 .* died with exit code 3"),
                                                       pytest.param("hang", 25.0, "rank 1 .*(made no progress|fell behind)",
                                                                    marks=pytest.mark.slow)])
def test_faulty_rank_ends_the_job(graphs, tmp_path, kind, timeout_s, pattern):
    plan = make_plan(graphs["mlp"], stages=2, dp=1, m=2, schedule="gpipe", layout="single")
    start = time.monotonic()
    with pytest.raises(ExecutionError, match=pattern):
        deploy_stage_plan(plan, graphs["mlp"], model="mlp", overrides=MLP, job_dir=tmp_path,
                          config=DeployConfig(steps=1, warmup=0, timeout_s=timeout_s),
                          extra_env={"PLACEMENT_RL_FAULT": f"{kind}:1"})
    elapsed = time.monotonic() - start
    startup_allowance = 45.0  # importing torch in 2 processes on a loaded 2-core machine
    assert elapsed < (timeout_s if kind == "hang" else 0) + startup_allowance
    assert _workers_of(tmp_path) == []


@pytest.mark.distributed
def test_a_crash_in_teardown_after_the_results_loses_nothing(graphs, tmp_path):
    """A rank that aborts after it wrote every result (gloo's threads can abort the interpreter's teardown) ends a
    finished job: the results stand; a signal before ``done`` still fails the job."""
    plan = make_plan(graphs["mlp"], stages=2, dp=1, m=2, schedule="gpipe", layout="single")
    res = deploy_stage_plan(plan, graphs["mlp"], model="mlp", overrides=MLP, job_dir=tmp_path,
                            config=DeployConfig(steps=1, warmup=0, timeout_s=60.0),
                            extra_env={"PLACEMENT_RL_FAULT": "abort_at_exit:1"})
    assert len(res.ranks) == 2 and all(r["step_times"] for r in res.ranks)
    (tmp_path / "progress").mkdir(exist_ok=True)
    (tmp_path / "progress" / "rank0").write_text("7 part0 step 0 end")
    assert not _launch._finished(tmp_path, 0, -6) and _launch._finished(tmp_path, 0, 0)
    (tmp_path / "progress" / "rank0").write_text("8 done")
    assert _launch._finished(tmp_path, 0, -6) and not _launch._finished(tmp_path, 0, 3)


@pytest.mark.gpu
@pytest.mark.distributed
def test_nccl_single_gpu_matches_reference(graphs):
    """The CUDA/NCCL path as far as one GPU allows: one rank, two micro-batches, grads vs reference."""
    plan = make_plan(graphs["gpt"], stages=1, dp=1, m=2, schedule="gpipe", layout="single")
    res = deploy_stage_plan(plan, graphs["gpt"], model="gpt", overrides=GPT,
                            config=DeployConfig(steps=1, warmup=0, device="cuda", collect_grads=True, timeout_s=120))
    assert res.backend == "nccl" and res.memory_kind == "cuda_max_allocated"
    check_against_reference("gpt", plan, res)
