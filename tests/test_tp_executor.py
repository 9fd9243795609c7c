"""Deploying TP plans: Megatron TP through parallelize_module on gloo, gradients equal to one process (TP, TP x DP,
TP x PP, TP x FSDP), and bad TP plans refused in one line before any process starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from placement_rl.errors import PlanError
from placement_rl.executor._mesh import parallel_dims
from placement_rl.executor.distributed import DeployConfig, DeploySpec, deploy_stage_plans, prepare_job, reference_step
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

torch.set_num_threads(1)
GPT = dict(batch_size=8, seq_len=8, vocab_size=32, d_model=16, n_layers=2, n_heads=2, dropout=0.0)


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **GPT)


def whole(g, devices, t, **kw):
    return StagePlan(np.zeros(g.num_nodes, dtype=np.int64), (tuple(devices),), tp=(t,), **kw)


def two_stages(g, t, **kw):
    cut = g.index["add_2"] + 1  # the residual stream after block 0: outside any TP region
    son = np.array([0 if i < cut else 1 for i in range(g.num_nodes)])
    return StagePlan(son, (tuple(range(t)), tuple(range(t, 2 * t))), tp=(t, t), **kw)


def check(plan, result):
    module, inputs = zoo.build("gpt", **GPT)
    loss, grads = reference_step(module, inputs, chunks=plan.dp_degrees[0] * plan.num_microbatches)
    assert result.losses[0] == pytest.approx(loss, abs=1e-5)
    assert set(result.grads) == set(grads)
    for key, ref in grads.items():
        torch.testing.assert_close(result.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


# ----------------------------------------------------------------------------- no processes
def test_tp_mesh_layout(gpt):
    d = parallel_dims(two_stages(gpt, 2, num_microbatches=2, schedule="gpipe"))
    assert (d.dp, d.pp, d.tp, d.world_size) == (1, 2, 2, 4)
    assert d.coords(3) == (0, 1) and d.tp_rank(3) == 1 and d.rank(0, 1, 1) == 3
    with pytest.raises(PlanError, match="unequal TP degrees"):
        parallel_dims(StagePlan(two_stages(gpt, 2).stage_of_node, ((0, 1), (2,)), tp=(2, 1)))


def test_bad_tp_plans_refused_before_any_process(gpt, tmp_path):
    heads = capture_zoo("gpt", **dict(GPT, n_heads=2, d_model=16))
    with pytest.raises(PlanError, match="n_heads=2"):
        prepare_job([DeploySpec(plan=whole(heads, range(4), 4), graph=heads, model="gpt", overrides=GPT)],
                    job_dir=tmp_path / "a")
    son = np.zeros(gpt.num_nodes, dtype=np.int64)
    son[gpt.index["gelu"]:] = 1  # cuts between the MLP's column and row GEMMs
    inside = StagePlan(son, ((0, 1), (2, 3)), tp=(2, 2), num_microbatches=2, schedule="gpipe")
    with pytest.raises(PlanError, match="TP-sharded tensor"):
        prepare_job([DeploySpec(plan=inside, graph=gpt, model="gpt", overrides=GPT)], job_dir=tmp_path / "b")
    hf = capture_zoo("gpt2_hf", **dict(zoo.tiny("gpt2_hf"), vocab_size=96, batch_size=4))
    with pytest.raises(PlanError, match="Conv1D"):
        prepare_job([DeploySpec(plan=whole(hf, (0, 1), 2), graph=hf, model="gpt2_hf",
                                overrides=dict(zoo.tiny("gpt2_hf"), vocab_size=96, batch_size=4))],
                    job_dir=tmp_path / "c")
    assert not any((tmp_path / x / "job.json").exists() for x in "abc")


@pytest.mark.slow
def test_cli_refuses_tp_across_hosts_and_bad_vocab_with_exit_2(tmp_path):
    topo = load_topology("2x4_v100_ib")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    four = capture_zoo("gpt", **dict(GPT, n_heads=4, d_model=32))
    odd = capture_zoo("gpt", **dict(GPT, vocab_size=33))
    cases = {"hosts": (four, whole(four, (2, 3, 4, 5), 4), "spans hosts"),
             "vocab": (odd, whole(odd, (0, 1), 2, make_vocab_size_divisible_by=0), "does not divide vocab=33")}
    for name, (g, plan, msg) in cases.items():
        (tmp_path / name).mkdir()
        g.to_json(tmp_path / name / "graph.json")  # deploy reads the graph beside the plan
        (tmp_path / name / "plan.json").write_text(json.dumps(plan.to_dict(topology=topo)))
        r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "deploy",
                            f"plan={tmp_path / name / 'plan.json'}", "topology=2x4_v100_ib",
                            f"hydra.run.dir={tmp_path}/{name}/run"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=env)
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], (name, r.stderr)
        assert not (tmp_path / name / "run" / "deploy.json").exists()


# ----------------------------------------------------------------------------- real gloo process groups
@pytest.mark.slow
@pytest.mark.distributed
def test_tp_gradients_equal_one_process(gpt):
    """GPT (fused QKV, tied head) and Llama (separate q / k / v with GQA, gated MLP, RMSNorm, RoPE) in one launch."""
    llama_ov = dict(zoo.tiny("llama_hf"), vocab_size=96, batch_size=4)
    llama = capture_zoo("llama_hf", **llama_ov)
    plan = whole(gpt, (0, 1), 2, num_microbatches=2)
    lplan = whole(llama, (0, 1), 2)
    res, lres = deploy_stage_plans([DeploySpec(plan=plan, graph=gpt, model="gpt", overrides=GPT),
                                    DeploySpec(plan=lplan, graph=llama, model="llama_hf", overrides=llama_ov)],
                                   config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=120))
    assert (res.tp, res.dp, res.pp) == (2, 1, 1)
    check(plan, res)
    # each TP rank holds half of every split weight
    assert all(r["local_params"] < r["num_params"] for r in res.ranks)
    module, inputs = zoo.build("llama_hf", **llama_ov)
    loss, grads = reference_step(module, inputs, chunks=1)
    assert lres.losses[0] == pytest.approx(loss, abs=1e-5) and set(lres.grads) == set(grads)
    for key, ref in grads.items():
        torch.testing.assert_close(lres.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.slow
@pytest.mark.distributed
def test_tp_x_dp_tp_x_pp_tp_x_fsdp_gradients_equal_one_process(gpt):
    plans = [whole(gpt, range(4), 2, num_microbatches=1),
             two_stages(gpt, 2, num_microbatches=2, schedule="gpipe"),
             whole(gpt, range(4), 2, num_microbatches=1, sharding="fsdp")]
    results = deploy_stage_plans([DeploySpec(plan=p, graph=gpt, model="gpt", overrides=GPT) for p in plans],
                                 config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=180))
    for plan, res in zip(plans, results):
        assert res.tp == 2 and res.world_size == 4
        check(plan, res)


@pytest.mark.distributed
def test_gpt2_vocabulary_padded_at_tp2_gradients_equal_one_process_on_the_real_vocabulary():
    """GPT-2's 50,257 tokens at TP 2: the tied embedding / LM head padded to 50,432 rows (Megatron's 128 x TP), the
    padded logits masked out of the loss; loss and gradients equal one unpadded process (the padded rows sliced off:
    they get exactly zero gradient)."""
    ov = dict(GPT, vocab_size=50257)
    g = capture_zoo("gpt", **ov)
    plan = whole(g, (0, 1), 2, num_microbatches=2)
    res, = deploy_stage_plans([DeploySpec(plan=plan, graph=g, model="gpt", overrides=ov)],
                              config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=180))
    module, inputs = zoo.build("gpt", **ov)
    loss, grads = reference_step(module, inputs, chunks=2)
    assert res.losses[0] == pytest.approx(loss, abs=1e-5) and set(res.grads) == set(grads)
    for key, ref in grads.items():
        torch.testing.assert_close(res.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    d = ov["d_model"]
    assert all(r["local_params"] >= 50432 * d // 2 for r in res.ranks)  # each rank holds half the padded table


def test_fused_qkv_region_runs_on_local_shards(gpt):
    """The fused QKV projection's region (split, per-head views, scores, softmax, weighted sum, merge) gets local
    shapes at TP 2, so the heads run split as the cost model prices them; the MLP's region (no split: k = 1, nothing
    to rewrite) runs on local shards too. The interleaved row order puts each rank's q, k and v rows in its
    contiguous shard."""
    from placement_rl.executor._tp import _interleave
    from placement_rl.executor._tp_region import local_region, node_kinds

    module, inputs = zoo.build("gpt", **GPT)
    gm = torch.export.export(module, tuple(inputs), strict=False).module()
    kinds = node_kinds(gpt)
    nodes = {n.name: n for n in gm.graph.nodes}
    cols = [n for n in gm.graph.nodes if kinds.get(n.name) == "column"]
    got = {n.name: local_region(gm, n, kinds, 2) for n in cols}
    assert all(r is not None for r in got.values())  # every region runs on local shards
    fused = [name for name, r in got.items() if r[1] > 1]
    assert len(fused) == GPT["n_layers"] and all(got[name][1] == 3 for name in fused)
    assert all(got[name] == ({}, 1) for name in got if name not in fused)  # the MLPs: nothing to rewrite
    rewrites, _ = got[fused[0]]
    d, h = GPT["d_model"], GPT["n_heads"]
    split = next(n for n in rewrites if "split" in str(n.target))
    assert rewrites[split][1] == d // 2
    views = [a[1] for n, a in rewrites.items() if "view" in str(n.target) or "reshape" in str(n.target)]
    b, t = GPT["batch_size"], GPT["seq_len"]
    assert views.count([b, t, h // 2, d // h]) == 3 and [b, t, d // 2] in views
    assert local_region(gm, nodes[fused[0]], kinds, 4) is None  # 4 ranks do not divide 2 heads
    perm = _interleave(torch.zeros(3 * d, d), 3, 2)
    half = d // 2
    assert perm[:3 * half].tolist() == (list(range(0, half)) + list(range(d, d + half))
                                        + list(range(2 * d, 2 * d + half)))


@pytest.mark.slow
@pytest.mark.distributed
def test_sequence_parallel_gradients_equal_one_process(gpt, tmp_path):
    """Megatron-SP through DTensor: norms under SequenceParallel on the sequence-sharded residual stream, columns
    all-gather, rows reduce-scatter; TP 2 (two micro-batches) and TP 2 x DP 2 equal one process."""
    plans = [whole(gpt, (0, 1), 2, num_microbatches=2, sequence_parallel=True),
             whole(gpt, range(4), 2, sequence_parallel=True)]
    norms = _first_part_then_check_all(plans, gpt, tmp_path)["tp_seq_norms"]
    assert len(norms) == 2 * GPT["n_layers"] + 1  # ln1, ln2 per block and ln_f


def _first_part_then_check_all(plans, gpt, tmp_path) -> dict:
    """The first plan's prepared ``part.json``, after every plan is deployed (one step, gradients collected) and
    checked against one process."""
    job = prepare_job([DeploySpec(plan=plans[0], graph=gpt, model="gpt", overrides=GPT)], job_dir=tmp_path / "a")
    part = json.loads((job.job_dir / "part0" / "part.json").read_text())
    for plan in plans:
        res, = deploy_stage_plans([DeploySpec(plan=plan, graph=gpt, model="gpt", overrides=GPT)],
                                  config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=180))
        check(plan, res)
    return part


@pytest.mark.slow
@pytest.mark.distributed
def test_sequence_parallel_with_pipeline_stages_gradients_equal_one_process(gpt, tmp_path):
    """Megatron-SP inside the TP stages of a pipeline: a stage sends its sequence-sharded residual stream whole (as
    the cost model prices the boundary) and the next stage takes its rank's slice of the sequence again
    (``_tp.SeqShard``); TP 2 x PP 2 with GPipe, and with 1F1B and full / selective recomputation: loss and
    gradients equal one process."""
    plans = [two_stages(gpt, 2, num_microbatches=2, schedule="gpipe", sequence_parallel=True),
             two_stages(gpt, 2, num_microbatches=2, schedule="1f1b", sequence_parallel=True,
                        recompute=("full", "selective"))]
    part = _first_part_then_check_all(plans, gpt, tmp_path)
    assert "add_2" in part["tp_seq_values"] and len(part["tp_seq_norms"]) == 2 * GPT["n_layers"] + 1


@pytest.mark.distributed
def test_tp_probe_measures_dtensor_cost_per_stage_on_a_one_rank_mesh(gpt, tmp_path):
    """``measure_tp_dispatch`` builds each stage of a TP plan as the runner does, over a one-rank mesh, in this
    process: one record per stage at the plan's micro-batch, finite non-negative costs; a plan without TP is refused."""
    from placement_rl.executor.tp_probe import measure_tp_dispatch

    plans = [whole(gpt, (0, 1), 2, num_microbatches=2), two_stages(gpt, 2, num_microbatches=2, schedule="gpipe")]
    for k, plan in enumerate(plans):
        prepare_job([DeploySpec(plan=plan, graph=gpt, model="gpt", overrides=GPT)], job_dir=tmp_path / f"j{k}")
        got = measure_tp_dispatch(tmp_path / f"j{k}" / "part0", repeats=2, warmup=1)
        assert [r["stage"] for r in got] == list(range(plan.num_stages))
        for r in got:
            assert r["micro_batch"] == GPT["batch_size"] // 2
            assert r["plain_pass_s"] > 0 and r["plain_adam_s"] > 0
            assert all(np.isfinite(r[key]) and r[key] >= 0 for key in ("pass_s", "adam_s"))
    plain = StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0,),))
    prepare_job([DeploySpec(plan=plain, graph=gpt, model="gpt", overrides=GPT)], job_dir=tmp_path / "plain")
    with pytest.raises(PlanError, match="no tensor parallelism"):
        measure_tp_dispatch(tmp_path / "plain" / "part0")


@pytest.mark.slow
@pytest.mark.distributed
def test_tp_ranks_drop_the_same_elements_of_the_replicated_stream(tmp_path):
    """Dropout 0.5 under TP 2: the two TP ranks built their stages with different draws of the default generator, so
    the replicated residual stream dropped other elements on each, and the replicated parameters (row biases, norms,
    position embeddings) got different gradients (0.40 apart): the replicas drifted from the first step. Each
    replica's ranks now draw from one stream."""
    from placement_rl.executor.distributed import deploy_stage_plan

    over = {**GPT, "dropout": 0.5, "batch_size": 4}
    g = capture_zoo("gpt", **over)
    deploy_stage_plan(whole(g, (0, 1), 2, schedule="gpipe"), g, model="gpt", overrides=over, job_dir=tmp_path / "j",
                      config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=180, device="cpu"))
    g0, g1 = (torch.load(tmp_path / "j" / "part0" / "result" / f"rank{r}_grads.pt") for r in (0, 1))
    assert set(g0) == set(g1) and {"wpe.weight", "blocks.0.attn.proj.bias", "ln_f.weight"} <= set(g0)
    for key in g0:
        torch.testing.assert_close(g0[key], g1[key], atol=0, rtol=0, msg=lambda m, k=key: f"{k}: {m}")
