"""Activation recomputation per stage: priced by hand (time: the forward again in the backward, as far as the
checkpoint's early stop runs it; memory: the checkpointed regions' inputs plus one micro-batch's transient), the
deployed checkpoint repeating exactly the priced ops, searched by exact and chosen by the learned pipeline policy,
round-tripped through JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.cost.recompute import kept_bytes, regions, repeated
from placement_rl.errors import PlanError
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

torch.set_num_threads(1)
GPT = dict(batch_size=8, seq_len=256, vocab_size=512, d_model=128, n_layers=4, n_heads=4, dropout=0.0)


@pytest.fixture(scope="module")
def case():
    g = capture_zoo("gpt", **GPT)
    topo = load_topology("4x_v100_nvlink")
    return g, resolve_costs(g, topo), topo


def one_stage(g, mode, m=4, schedule="gpipe"):
    return StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0,),), num_microbatches=m, schedule=schedule,
                     recompute=(mode,))


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_time_and_memory_by_hand(case, mode):
    g, c, topo = case
    m = 4
    base = simulate_pipeline(g, c, topo, one_stage(g, "none", m))
    got = simulate_pipeline(g, c, topo, one_stage(g, mode, m))
    rid = regions(g, mode)
    inside = rid >= 0
    assert len(np.unique(rid[inside])) == GPT["n_layers"]  # one region per layer (its attention core, or itself)
    # time: each repeated node's forward again in the backward (per micro-batch: variable part / m + fixed); the
    # early stop leaves out each region's last GEMM (it saves only its inputs) and what follows it
    rep = repeated(g, rid)
    assert (rep <= inside).all()
    per_layer = [sorted(g.op_types[v] for v in np.flatnonzero(inside & ~rep & (rid == r))) for r in range(4)]
    assert per_layer == [(["add", "dropout", "linear"] if mode == "full" else ["matmul", "reshape", "transpose"])] * 4
    fix = np.minimum(c.launch_overhead, c.fwd_time)[:, 0]
    again = float(((c.fwd_time[:, 0] - fix) / m + fix)[rep].sum())
    assert got.meta["stage_fwd_time"][0] == pytest.approx(base.meta["stage_fwd_time"][0], rel=1e-12)
    assert got.meta["stage_bwd_time"][0] == pytest.approx(base.meta["stage_bwd_time"][0] + again, rel=1e-12)
    # memory (GPipe: m micro-batches in flight): the regions' inputs instead of their activations, plus one
    # micro-batch's activations of the largest region while it is recomputed (here more than any backward's gradient
    # buffers, ``cost.backward_memory``, which the plan without recomputation adds instead: the loss's)
    kept = kept_bytes(g, rid)
    freed = np.bincount(rid[inside], weights=g.act_bytes[inside])
    saved = float(g.act_bytes.sum())
    logits = GPT["batch_size"] * GPT["seq_len"] * GPT["vocab_size"] * 4.0
    assert base.meta["backward_transient_bytes"] == [pytest.approx((2 * logits + 4) / m, rel=1e-12)]
    assert got.meta["backward_transient_bytes"] == [pytest.approx(freed.max() / m, rel=1e-12)]
    state = base.peak_memory[0] - saved - (2 * logits + 4) / m
    want = state + (saved - freed.sum() + kept.sum()) + freed.max() / m
    assert got.peak_memory[0] == pytest.approx(want, rel=1e-12)
    assert got.peak_memory[0] < base.peak_memory[0] and got.step_time > base.step_time
    if mode == "full":  # a layer keeps its input hidden state: batch x seq x d_model floats
        assert np.allclose(kept, GPT["batch_size"] * GPT["seq_len"] * GPT["d_model"] * 4)


def test_field_validates_and_round_trips(case):
    g, _, topo = case
    p = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0,),), recompute=("full",))
    back = StagePlan.from_json(p.to_json(topology=topo), topology=topo)
    assert back.recompute == ("full",)
    old = json.loads(p.to_json(topology=topo))
    del old["recompute"]
    assert StagePlan.from_json(json.dumps(old), topology=topo).recompute == ("none",)
    for bad, msg in ((("some",), "unknown recompute 'some'"), (("full", "none"), "one per stage")):
        with pytest.raises(PlanError, match=msg):
            StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0,),), recompute=bad)
    old["recompute"] = "full"
    with pytest.raises(PlanError, match="list of strings"):
        StagePlan.from_json(json.dumps(old), topology=topo)
    with pytest.raises(PlanError, match="interleaved1f1b"):
        inter = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0,),), num_microbatches=2,
                          schedule="interleaved1f1b", recompute=("full",))
        simulate_pipeline(g, resolve_costs(g, topo), topo, inter)


def test_exact_finds_a_recomputing_plan_where_nothing_fits_without(monkeypatch):
    """Long sequences on two 2 GiB GPUs with GPipe: no plan of exact's space fits without recomputation; with it in
    the space (the fastest mode that fits, per stage), exact returns a feasible plan that recomputes."""
    from placement_rl import baselines
    from placement_rl.baselines import pipe_tp

    g = capture_zoo("gpt", batch_size=8, seq_len=2048, vocab_size=4096, d_model=256, n_layers=4, n_heads=8)
    topo = load_topology("2x_small_gpu")
    c = resolve_costs(g, topo)
    plan = baselines.get_pipeline("exact")(g, c, topo, budget=4000, seed=0, schedule="gpipe")
    res = simulate_pipeline(g, c, topo, plan)
    assert res.feasible and set(plan.recompute) != {"none"}
    assert plan.meta["step_time"] == pytest.approx(res.step_time, rel=1e-12)
    monkeypatch.setattr(pipe_tp, "RECOMPUTE", ("none",))
    without = baselines.get_pipeline("exact")(g, c, topo, budget=4000, seed=0, schedule="gpipe")
    assert not simulate_pipeline(g, c, topo, without).feasible


# ------------------------------------------------------------------------------------------------ deployed
def test_checkpointed_regions_keep_only_their_inputs():
    """The executor's rewrite (``executor._recompute``) on the exported step: one checkpointed submodule per layer
    (full) or attention core (selective); the same loss and gradients; the bytes autograd saves in forward drop
    to what the cost model keeps (each region's inputs instead of its activations), measured with saved-tensor
    hooks."""
    from placement_rl.executor._recompute import Checkpointed, apply_recompute, regions_of
    from placement_rl.executor._stages import export_step, program_module
    from placement_rl.graph import zoo

    ov = dict(batch_size=4, seq_len=64, vocab_size=128, d_model=32, n_layers=2, n_heads=4, dropout=0.0)
    g = capture_zoo("gpt", **ov)
    module, inputs = zoo.build("gpt", **ov)

    def run(gm):
        saved = []

        def pack(t):
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = gm(*inputs)
        loss = loss[0] if isinstance(loss, (tuple, list)) else loss
        loss.backward()
        params = {p.untyped_storage().data_ptr() for p in gm.parameters()}
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
        grads = {n: p.grad.clone() for n, p in gm.named_parameters()}
        return float(loss), sum(v for k, v in storages.items() if k not in params), grads

    base_gm = program_module(export_step(module, inputs))
    loss0, bytes0, grads0 = run(base_gm)
    assert bytes0 == pytest.approx(g.act_bytes.sum(), rel=1e-9)  # what the cost model counts as saved
    for mode in ("selective", "full"):
        gm = program_module(export_step(module, inputs))
        for p in gm.parameters():
            p.grad = None
        plan = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0,),), recompute=(mode,))
        count = apply_recompute(gm, regions_of(plan, g)["0"])
        assert count == ov["n_layers"] and sum(isinstance(m, Checkpointed) for m in gm.modules()) == count
        loss, nbytes, grads = run(gm)
        assert loss == pytest.approx(loss0, abs=1e-6)
        for k, ref in grads0.items():
            torch.testing.assert_close(grads[k], ref, atol=1e-5, rtol=1e-5)
        rid = regions(g, mode)
        model = g.act_bytes[rid < 0].sum() + kept_bytes(g, rid).sum()  # priced: other ops' + the regions' inputs
        assert nbytes < bytes0 and nbytes == pytest.approx(model, rel=0.05), mode


def test_the_checkpoint_repeats_the_priced_ops():
    """What the deployed non-reentrant checkpoint runs again in the backward (aten ops counted with a dispatch mode,
    against the same step without recomputation): as many GEMMs, softmaxes, norms and GELUs as the repeated nodes
    of ``cost.recompute.repeated`` -- not the whole region (its last GEMM and what follows are not run again)."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    from placement_rl.executor._recompute import apply_recompute, regions_of
    from placement_rl.executor._stages import export_step, program_module
    from placement_rl.graph import zoo

    ov = dict(batch_size=2, seq_len=16, vocab_size=64, d_model=32, n_layers=2, n_heads=4, dropout=0.0)
    g = capture_zoo("gpt", **ov)
    module, inputs = zoo.build("gpt", **ov)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func).split(".")[1]] += 1
            return func(*args, **(kwargs or {}))

    def backward_ops(mode):
        gm = program_module(export_step(module, inputs))
        if mode != "none":
            apply_recompute(gm, regions_of(StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0,),),
                                                     recompute=(mode,)), g)["0"])
        out = gm(*inputs)
        with Count() as c:
            (out[0] if isinstance(out, (tuple, list)) else out).backward()
        return c.ops

    base = backward_ops("none")
    for mode in ("selective", "full"):
        extra = backward_ops(mode) - base
        rep = repeated(g, regions(g, mode))
        want = collections.Counter(g.op_types[v] for v in np.flatnonzero(rep))
        assert extra["addmm"] + extra["bmm"] + extra["mm"] == want["linear"] + want["matmul"], (mode, extra, want)
        for op in ("softmax", "layer_norm", "gelu"):
            assert extra[f"_{op}" if op == "softmax" else (f"native_{op}" if op == "layer_norm" else op)] == want[op]
        whole = collections.Counter(g.op_types[v] for v in np.flatnonzero(regions(g, mode) >= 0))
        assert want["linear"] + want["matmul"] < whole["linear"] + whole["matmul"]


@pytest.mark.slow
@pytest.mark.distributed
def test_recomputing_plans_deployed_gradients_equal_one_process():
    """GPipe with full / selective per stage, and TP x PP 1F1B with selective / full, on gloo: loss and gradients
    equal one process."""
    from placement_rl.executor.distributed import DeployConfig, DeploySpec, deploy_stage_plans, reference_step
    from placement_rl.graph import zoo

    ov = dict(batch_size=8, seq_len=8, vocab_size=32, d_model=16, n_layers=2, n_heads=2, dropout=0.0)
    g = capture_zoo("gpt", **ov)
    cut = g.index["add_2"] + 1
    son = np.array([0 if i < cut else 1 for i in range(g.num_nodes)])
    plans = [StagePlan(son, ((0,), (1,)), num_microbatches=2, schedule="gpipe", recompute=("full", "selective")),
             StagePlan(son, ((0, 1), (2, 3)), tp=(2, 2), num_microbatches=2, recompute=("selective", "full"))]
    for plan in plans:
        res, = deploy_stage_plans([DeploySpec(plan=plan, graph=g, model="gpt", overrides=ov)],
                                  config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=180))
        module, inputs = zoo.build("gpt", **ov)
        loss, grads = reference_step(module, inputs, chunks=2)
        assert res.losses[0] == pytest.approx(loss, abs=1e-5) and set(res.grads) == set(grads)
        for key, ref in grads.items():
            torch.testing.assert_close(res.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


# ------------------------------------------------------------------------------------------------ learned
@pytest.fixture(scope="module")
def long_sequences():
    """The long sequences above on two such GPUs with 4.5 GiB each and GPipe: no plan of ``exact``'s space fits
    without recomputation, but one GPU fits with full recomputation (so a policy that keeps one device can still
    find a plan that fits): 4.26 GiB, the most at the backward of a layer's attention-weighted sum, with the layer's
    activations up to it recomputed and that node's gradients held (3.83 GiB together, ``cost.backward_memory``);
    3.72 GiB before the gradients were priced, when 4 GiB held it."""
    import yaml

    from placement_rl.topology import DeviceTopology, conf_dir

    g = capture_zoo("gpt", batch_size=8, seq_len=2048, vocab_size=4096, d_model=256, n_layers=4, n_heads=8)
    data = yaml.safe_load((conf_dir() / "topology" / "2x_small_gpu.yaml").read_text())
    data["devices"][0]["memory_bytes"] = 4.5 * 2**30
    data["name"] = "2x_small_gpu_4_5gib"
    return g, DeviceTopology.from_dict(data)


def test_nothing_fits_there_without_recomputation(long_sequences, monkeypatch):
    from placement_rl import baselines
    from placement_rl.baselines import pipe_tp

    g, topo = long_sequences
    c = resolve_costs(g, topo)
    monkeypatch.setattr(pipe_tp, "RECOMPUTE", ("none",))
    without = baselines.get_pipeline("exact")(g, c, topo, budget=4000, seed=0, schedule="gpipe")
    assert not simulate_pipeline(g, c, topo, without).feasible


def scripted(env, *, dp: int, recompute: int):
    """One stage (no cuts), DP degree ``dp``, then ``recompute`` as the recomputation action; flags 0."""
    obs, info = env.reset(seed=0)
    done, phases = False, []
    while not done:
        phases.append(info["phase"])
        if info["phase"] == 5:
            assert env.action_masks().tolist() == [True, True]  # two devices: none / full
        action = {1: dp - 1, 5: recompute}.get(info["phase"], 0)
        obs, reward, done, _, info = env.step(action)
    return obs, reward, info, phases


def test_pipeline_env_reaches_a_recomputing_plan_where_nothing_fits_without(long_sequences):
    """``PipelineEnv`` decides recomputation per stage (phase 5): on a model and cluster where no plan fits without
    it, the same plan with ``none`` is infeasible (reward with the penalty) and with ``full`` fits, and the reward is
    computed from that plan's simulated step (no penalty); a fixed ``recompute`` skips the phase."""
    from placement_rl.envs import PipelineEnv
    from placement_rl.envs.reward import final_reward

    g, topo = long_sequences
    kw = dict(graph=g, topology=topo, schedule="gpipe", num_microbatches=1, sharding="dp", tp=1)
    env = PipelineEnv(**kw)
    for dp in (1, 2):  # one GPU, or data parallel over both
        _, r_none, none, phases = scripted(env, dp=dp, recompute=0)
        obs, r_full, full, _ = scripted(env, dp=dp, recompute=1)
        assert phases[-1] == 5 and phases == sorted(phases)
        assert not none["feasible"] and none["plan"].recompute == ("none",)
        assert full["feasible"] and full["plan"].recompute == ("full",) and obs["recompute"][0] == 2
        res = simulate_pipeline(g, env.state.task.costs, topo, full["plan"])
        assert full["step_time"] == pytest.approx(res.step_time, rel=1e-12)
        t1 = full["best_single_time"]
        assert r_full == pytest.approx(final_reward(t1, res.step_time, True, 1.0)) and r_full > r_none
    fixed = PipelineEnv(**kw, recompute="full")
    _, _, info, phases = scripted(fixed, dp=2, recompute=0)
    assert 5 not in phases and info["plan"].recompute == ("full",) and info["feasible"]


def test_a_short_training_picks_recomputation(long_sequences):
    """MaskablePPO on that case (one stage) for 4,096 steps (about 32 episodes): the greedy policy recomputes and
    its plan fits (the untrained one tries ``full`` as often as ``none``: the cut prior is off in that phase)."""
    from placement_rl.agents.rollout import rollout
    from placement_rl.agents.train import AgentSpec, EncoderSpec, Trainer

    g, topo = long_sequences
    tr = Trainer(env_id="placement_rl/PipelineEnv-v0",
                 env_kwargs=dict(graph=g, topology=topo, schedule="gpipe", num_microbatches=1, sharding="dp", tp=1,
                                 max_stages=1),
                 agent=AgentSpec(algo="maskable_ppo", n_envs=8, n_steps=64, batch_size=128, n_epochs=4,
                                 gamma=1.0, ent_coef=0.0, learning_rate=3e-3),
                 encoder=EncoderSpec(hidden=16, layers=2), seed=0)
    tr.learn(4096, progress=False)
    env = tr.make_eval_env()
    tr.policy.set_training_mode(False)
    info = rollout(tr.policy, env, deterministic=True, rng=np.random.default_rng(0), seed=0)
    assert info["plan"].recompute == ("full",) and info["feasible"]


def test_exact_says_when_a_coarsened_graph_leaves_selective_recomputation_out():
    """On a coarsened graph selective recomputation cannot be priced (the attention cores are merged), so exact's
    plan recomputes whole layers where memory forces it: its note says so (it said nothing)."""
    from placement_rl import baselines
    from placement_rl.graph.coarsen import coarsen

    whole = capture_zoo("gpt", batch_size=8, seq_len=2048, vocab_size=4096, d_model=256, n_layers=4, n_heads=8)
    topo = load_topology("2x_small_gpu")
    for g in (whole, coarsen(whole, depth=2)):
        plan = baselines.get_pipeline("exact")(g, resolve_costs(g, topo), topo, budget=4000, seed=0,
                                               schedule="gpipe")
        noted = "selective recomputation not weighed" in str(plan.meta.get("note", ""))
        assert noted == (g.members is not None and "full" in plan.recompute)
        if g is not whole:
            assert noted


def test_exact_and_the_simulator_take_layer_ids_with_gaps():
    """Coarsened inception's layer regions are 0, 2, 3 (no node of layer 1 left whole): exact's stage tables
    indexed one past their end (``IndexError``: `evaluate suite=single graph=inception` died)."""
    from placement_rl import baselines
    from placement_rl.cost.recompute import regions
    from placement_rl.graph.coarsen import coarsen

    g = coarsen(capture_zoo("inception"))
    ids = set(regions(g, "full").tolist()) - {-1}
    assert ids and ids != set(range(len(ids)))  # the case: ids with a gap
    topo = load_topology("cpu_2gpu")
    c = resolve_costs(g, topo)
    plan = baselines.get_pipeline("exact")(g, c, topo, budget=150, seed=0)
    assert simulate_pipeline(g, c, topo, plan).feasible
    full = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((1,),), recompute=("full",))
    assert simulate_pipeline(g, c, topo, full).step_time > simulate_pipeline(g, c, topo, StagePlan(
        np.zeros(g.num_nodes, dtype=np.int64), ((1,),))).step_time
