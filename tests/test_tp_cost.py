"""Tensor parallelism: split detection on captured graphs, StagePlan.tp, and its pricing in simulate_pipeline."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.cost.collectives import collective_time
from placement_rl.cost.tensor_parallel import collective_counts, tp_cost_table
from placement_rl.errors import PlanError
from placement_rl.graph import coarsen, tp, zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan, graph_batch_size
from placement_rl.topology import load_topology

torch.set_num_threads(1)
TINY_LM = dict(batch_size=4, seq_len=16, vocab_size=96, d_model=32, n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **TINY_LM)


def whole(graph, devices, t, **kw):
    return StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), (tuple(devices),), tp=(t,), **kw)


# ------------------------------------------------------------------------------------------ detection
def test_gpt_pairs_vocab_and_replicated_norms(gpt):
    d = gpt.meta["tp"]
    pairs = {(tuple(gpt.module_paths[gpt.index[c]] for c in p["columns"]), gpt.module_paths[gpt.index[p["row"]]])
             for p in d["pairs"]}
    assert pairs == {(("blocks.0.attn.qkv",), "blocks.0.attn.proj"), (("blocks.0.ffn.fc1",), "blocks.0.ffn.fc2"),
                     (("blocks.1.attn.qkv",), "blocks.1.attn.proj"), (("blocks.1.ffn.fc1",), "blocks.1.ffn.fc2")}
    kinds = d["nodes"]
    assert {gpt.module_paths[gpt.index[k]] for k, v in kinds.items() if v == "vocab_embedding"} == {"wte"}
    assert [v for k, v in kinds.items() if gpt.module_paths[gpt.index[k]] == "lm_head"] == ["vocab_head"]
    assert all(gpt.names[i] not in kinds for i in range(gpt.num_nodes) if gpt.op_types[i] == "layer_norm")
    assert d["heads"] == {"n_heads": 4} and d["vocab"] == 96 and d["pairs"][0]["head_dim"] == 8
    assert graph_batch_size(gpt) == 4
    # each row all-reduces its output in forward; each pair's input gradient is all-reduced once in backward
    for p in d["pairs"]:
        assert d["ar_fwd"][p["row"]] == gpt.out_bytes[gpt.index[p["row"]]]
        assert d["ar_bwd"][p["columns"][0]] == 4 * 16 * 32 * 4


def test_llama_groups_q_k_v_and_gate_up():
    g = capture_zoo("llama_hf", **dict(zoo.tiny("llama_hf"), vocab_size=96))
    cols = sorted(len(p["columns"]) for p in g.meta["tp"]["pairs"])
    assert cols == [2, 2, 3, 3]  # gate+up -> down, q+k+v -> o
    assert g.meta["tp"]["heads"] == {"n_heads": 4, "n_kv_heads": 2}


def test_a_model_with_nothing_to_split_says_so():
    g = capture_zoo("resnet18", **zoo.tiny("resnet18"))
    assert not g.meta["tp"]["pairs"] and "nothing to split" in g.meta["tp"]["note"]
    topo = load_topology("4x_v100_nvlink")
    with pytest.raises(PlanError, match="nothing to split"):
        whole(g, (0, 1), 2).validate(g, topo)


def test_annotation_survives_coarsening_and_json(gpt):
    coarse = coarsen.coarsen(gpt, max_nodes=12)
    ann = tp.annotation(coarse)
    assert ann.splittable and 0 < ann.frac_flops.max() <= 1
    fine = tp.annotation(gpt)
    assert ann.ar_fwd.sum() == pytest.approx(fine.ar_fwd.sum()) and ann.ar_bwd.sum() == pytest.approx(fine.ar_bwd.sum())
    back = type(gpt).from_json(gpt.to_json())
    assert back.meta["tp"] == json.loads(json.dumps(gpt.meta["tp"]))


def test_collective_counts_come_from_the_op_kinds_a_graph_file_holds(gpt):
    """The parallel cross-entropy's bytes are three all-reduces, every other op's one: counted from the op kinds
    ``meta["tp"]`` already held (no new field, schema version 1), so a graph file written before reads the same,
    coarsened or not."""
    ann = tp.annotation(gpt)
    n_f, n_b = collective_counts(gpt, ann)
    loss = ann.kind == tp.VOCAB_LOSS
    assert n_f[loss].tolist() == [3.0] and (n_f[~loss] == 1).all() and (n_b == 1).all()
    assert gpt.meta["tp"]["version"] == 1
    back = type(gpt).from_json(gpt.to_json())
    np.testing.assert_array_equal(collective_counts(back, tp.annotation(back))[0], n_f)
    coarse = coarsen.coarsen(back, max_nodes=12)
    c_ann = tp.annotation(coarse)
    c_f, c_b = collective_counts(coarse, c_ann)
    assert c_f[c_ann.ar_fwd > 0].sum() == n_f[ann.ar_fwd > 0].sum()
    assert c_b[c_ann.ar_bwd > 0].sum() == n_b[ann.ar_bwd > 0].sum()


def test_shard_graph_divides_split_ops_only(gpt):
    half = tp.shard_graph(gpt, 2)
    ann = tp.annotation(gpt)
    col = int(np.flatnonzero(ann.kind == tp.COLUMN)[0])
    ln = gpt.index[next(n for n, t in zip(gpt.names, gpt.op_types) if t == "layer_norm")]
    assert half.fwd_flops[col] == gpt.fwd_flops[col] / 2 and half.param_bytes[col] == gpt.param_bytes[col] / 2
    assert half.fwd_flops[ln] == gpt.fwd_flops[ln] and half.param_bytes[ln] == gpt.param_bytes[ln]
    assert half.num_nodes == gpt.num_nodes and half.num_edges == gpt.num_edges


def test_a_coarsened_shard_is_priced_as_its_members_shards(gpt):
    """A TP rank of a coarsened graph: its members are sharded with their own split kinds and each group is
    priced as its sharded members' sum, so a coarse plan's TP stage costs what the uncoarsened plan's does
    (counting members, a group's split share was off by up to 20%, and the shard fell back to group pricing)."""
    coarse = coarsen.coarsen(gpt, max_nodes=12)
    topo = load_topology("4x_v100_nvlink")
    for t in (2, 4):
        shard = tp.shard_graph(coarse, t)
        got = coarsen.member_graph(shard)
        assert got is not None, t
        fine_shard, gof = got
        assert fine_shard.fingerprint() == tp.shard_graph(gpt, t).fingerprint()
        want = resolve_costs(tp.shard_graph(gpt, t), topo).fwd_time[:, 0]
        have = resolve_costs(shard, topo).fwd_time[:, 0]
        assert np.allclose(have, np.bincount(gof, weights=want, minlength=coarse.num_nodes), rtol=1e-12)
        assert shard.fwd_flops.sum() == pytest.approx(tp.shard_graph(gpt, t).fwd_flops.sum(), rel=1e-9)


# ------------------------------------------------------------------------------------------ plans
def test_tp_field_defaults_validates_and_round_trips(gpt):
    topo = load_topology("4x_v100_nvlink")
    plain = StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0, 1, 2, 3),))
    assert plain.tp == (1,) and plain.dp_degrees == (4,)
    p = whole(gpt, (0, 1, 2, 3), 2, num_microbatches=2).validate(gpt, topo)
    assert p.dp_degrees == (2,) and p.tp_groups(0) == ((0, 1), (2, 3)) and p.dp_groups(0) == ((0, 2), (1, 3))
    back = StagePlan.from_json(p.to_json(graph=gpt, topology=topo), topology=topo, graph=gpt)
    assert back.tp == (2,)
    old = json.loads(plain.to_json(topology=topo))
    del old["tp"]  # a plan written before the field existed
    assert StagePlan.from_json(json.dumps(old), topology=topo).tp == (1,)
    for bad, msg in (((0,), "positive integer"), ((2, 2), "one per stage"), ((3,), "not a multiple")):
        with pytest.raises(PlanError, match=msg):
            whole(gpt, (0, 1, 2, 3), 1).__class__(np.zeros(gpt.num_nodes, dtype=np.int64), ((0, 1, 2, 3),), tp=bad)


def test_tp_degree_must_divide_heads_vocab_and_stay_on_one_host():
    g = capture_zoo("gpt", **dict(TINY_LM, vocab_size=97))
    topo = load_topology("2x4_v100_ib")
    with pytest.raises(PlanError, match=r"does not divide vocab=97 .*make_vocab_size_divisible_by > 0"):
        whole(g, (0, 1), 2, make_vocab_size_divisible_by=0).validate(g, topo)  # padding off: refused
    whole(g, (0, 1), 2).validate(g, topo)  # padded to 256 (Megatron's default 128 x TP 2)
    g6 = capture_zoo("gpt", **dict(TINY_LM, n_heads=2, d_model=32, vocab_size=96))
    with pytest.raises(PlanError, match=r"n_heads=2"):
        whole(g6, (0, 1, 2, 3), 4).validate(g6, topo)
    g8 = capture_zoo("gpt", **dict(TINY_LM, n_heads=8, d_model=64, batch_size=8))
    with pytest.raises(PlanError, match="spans hosts"):
        whole(g8, (2, 3, 4, 5), 4).validate(g8, topo)
    whole(g8, (2, 3, 4, 5), 4, meta={"tp_across_hosts": True}).validate(g8, topo)


def test_graph_batch_size_is_respected(gpt):
    topo = load_topology("8x_a100_nvswitch")
    with pytest.raises(PlanError, match="graph 'gpt' records it"):
        whole(gpt, range(8), 1).validate(gpt, topo)  # a batch of 4 over 8 replicas
    whole(gpt, range(8), 2).validate(gpt, topo)  # 4 DP replicas x TP 2


# ------------------------------------------------------------------------------------------ pricing
def test_tp1_is_the_plain_plan_and_tp_splits_memory(gpt):
    topo = load_topology("4x_v100_nvlink")
    costs = resolve_costs(gpt, topo)
    a = simulate_pipeline(gpt, costs, topo, StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0,),)))
    b = simulate_pipeline(gpt, costs, topo, whole(gpt, (0,), 1))
    assert a.step_time == b.step_time and np.array_equal(a.peak_memory, b.peak_memory)
    t4 = simulate_pipeline(gpt, costs, topo, whole(gpt, (0, 1, 2, 3), 4))
    ann = tp.annotation(gpt)
    split = float((gpt.param_bytes * ann.frac_params).sum())
    vocab = float((gpt.param_bytes * ann.vocab_frac[1]).sum())  # the embedding table (tied with the LM head)
    assert vocab == 96 * 32 * 4
    # parameters + gradients + Adam of split ops are divided by 4, replicated ones kept; the vocabulary is
    # padded to Megatron's multiple of 128 x 4 = 512 rows first
    state_1 = 4 * gpt.param_bytes.sum()
    state_4 = 4 * (gpt.param_bytes.sum() - split + (split - vocab) / 4 + vocab * (512 / 96) / 4)
    act_saved = a.peak_memory[0] - state_1
    assert t4.peak_memory[0] < b.peak_memory[0]
    # plus, at the loss's backward, its two logits-sized gradients on one rank: 512 / 4 vocabulary rows
    # (``cost.backward_memory``)
    loss_grads = 2 * 4 * 16 * (512 / 4) * 4 + 4
    assert t4.meta["backward_transient_bytes"] == [loss_grads]
    assert t4.peak_memory[0] == pytest.approx(state_4 + float((tp.shard_graph(gpt, 4).act_bytes).sum()) + loss_grads,
                                              rel=0.05)
    assert act_saved > 0 and np.all(t4.peak_memory == t4.peak_memory[0]) and t4.meta["tp"] == [4]


def test_split_ops_are_priced_by_the_same_per_op_model_at_their_shapes(gpt):
    topo = load_topology("4x_v100_nvlink")
    costs = resolve_costs(gpt, topo)
    c2, shard = tp_cost_table(gpt, costs, topo, 2)
    direct = resolve_costs(shard, topo)
    assert np.allclose(c2.fwd_time, direct.fwd_time) and np.allclose(c2.bwd_time, direct.bwd_time)
    col = int(np.flatnonzero(tp.annotation(gpt).kind == tp.COLUMN)[0])
    # a GEMM at half its size runs at lower efficiency: more than half its time
    assert costs.fwd_time[col, 0] / 2 < c2.fwd_time[col, 0] < costs.fwd_time[col, 0]


def test_tp_collectives_priced_on_the_tp_group_links():
    g = capture_zoo("gpt", batch_size=8, seq_len=128, vocab_size=4096, d_model=256, n_layers=2, n_heads=8)
    topo = load_topology("2x4_v100_ib")
    costs = resolve_costs(g, topo)
    inside = simulate_pipeline(g, costs, topo, whole(g, (0, 1), 2))
    across = simulate_pipeline(g, costs, topo, whole(g, (3, 4), 2, meta={"tp_across_hosts": True}))
    assert across.step_time > inside.step_time  # InfiniBand all-reduces are slower than NVLink ones
    ann = tp.annotation(g)
    # the step time grows by the TP all-reduces: forward and backward, every micro-batch, on the critical path, each
    # all-reduce its own (the parallel cross-entropy's bytes are three)
    m = 2
    two = simulate_pipeline(g, costs, topo, whole(g, (0, 1), 2, num_microbatches=m))
    comm = sum(k * collective_time("allreduce", b / (k * m), (0, 1), topo, costs)
               for nbytes, count in zip((ann.ar_fwd, ann.ar_bwd), collective_counts(g, ann))
               for b, k in zip(nbytes, count) if b > 0)
    c2, _ = tp_cost_table(g, costs, topo, 2)
    compute = float(c2.fwd_time[:, 0].sum() + c2.bwd_time[:, 0].sum())
    fixed = float(np.minimum(c2.launch_overhead, c2.fwd_time)[:, 0].sum()
                  + np.minimum(c2.launch_overhead, c2.bwd_time)[:, 0].sum())
    expect = compute + (m - 1) * fixed + m * comm  # m micro-batches on one replica, launch overhead per micro-batch
    assert two.step_time == pytest.approx(expect, rel=1e-9)


# ------------------------------------------------------------------------------------------ vocabulary padding
def test_padded_vocab_is_megatrons_rule():
    assert [tp.padded_vocab(50257, t) for t in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]  # TP 1 too
    assert tp.padded_vocab(50257, 4, 0) == 50257 and tp.padded_vocab(96, 2) == 256 and tp.padded_vocab(512, 4) == 512


def test_gpt2_vocabulary_at_tp_2_4_8_is_padded_and_priced():
    """GPT-2's 50,257 tokens split at TP 2 / 4 / 8 once padded (Megatron: to a multiple of 128 x TP); the vocab ops
    (embedding table, LM head, logits, loss) cost their padded share, the rest is unchanged; padding off: refused."""
    g = capture_zoo("gpt2_hf", **dict(zoo.tiny("gpt2_hf"), vocab_size=50257, batch_size=8, n_heads=8, d_model=64))
    topo = load_topology("8x_a100_nvswitch")
    costs = resolve_costs(g, topo)
    ann = tp.annotation(g)
    assert ann.vocab == 50257
    head = int(np.flatnonzero(ann.kind == tp.VOCAB_HEAD)[0])
    emb = int(np.flatnonzero(ann.kind == tp.VOCAB_EMB)[0])
    col = int(np.flatnonzero(ann.kind == tp.COLUMN)[0])
    steps = {}
    for t in (2, 4, 8):
        pad = tp.padded_vocab(50257, t) / 50257
        shard = tp.shard_graph(g, t)
        assert shard.fwd_flops[head] == pytest.approx(g.fwd_flops[head] * pad / t, rel=1e-12)
        assert shard.param_bytes[emb] == pytest.approx(g.param_bytes[emb] * pad / t, rel=1e-12)
        assert shard.fwd_flops[col] == pytest.approx(g.fwd_flops[col] / t, rel=1e-12)  # not a vocab op
        unpadded = tp.shard_graph(g, t, divisible_by=0)
        assert shard.fwd_flops.sum() > unpadded.fwd_flops.sum()
        plan = whole(g, range(t), t).validate(g, topo)
        res = simulate_pipeline(g, costs, topo, plan)
        assert res.feasible and np.isfinite(res.step_time) and res.step_time > 0
        steps[t] = res
        with pytest.raises(PlanError, match="does not divide vocab=50257"):
            whole(g, range(t), t, make_vocab_size_divisible_by=0).validate(g, topo)
    # memory per rank shrinks with the degree even with the padded table
    assert steps[2].peak_memory[0] > steps[4].peak_memory[0] > steps[8].peak_memory[0]
    # the knob travels with the plan's JSON
    p = whole(g, range(4), 4, make_vocab_size_divisible_by=64)
    assert StagePlan.from_json(p.to_json(topology=topo), topology=topo).make_vocab_size_divisible_by == 64
    with pytest.raises(PlanError, match="make_vocab_size_divisible_by"):
        whole(g, range(4), 4, make_vocab_size_divisible_by=-1)


def test_tp_step_with_dp_computed_by_hand():
    """TP 2 x DP 2, two micro-batches: each replica's micro-batch is batch / (m dp), so its TP all-reduces carry
    that many bytes; forward and backward per micro-batch computed by hand from the TP rank's node costs and the
    all-reduce price over the TP group; the step is the m micro-batches plus at most the DP gradient all-reduce."""
    g = capture_zoo("gpt", batch_size=8, seq_len=128, vocab_size=4096, d_model=256, n_layers=2, n_heads=8)
    topo = load_topology("2x4_v100_ib")
    costs = resolve_costs(g, topo)
    ann = tp.annotation(g)
    m, dp = 2, 2
    plan = whole(g, (0, 1, 2, 3), 2, num_microbatches=m)
    assert plan.dp_degrees == (dp,) and plan.tp_groups(0)[0] == (0, 1)
    res = simulate_pipeline(g, costs, topo, plan)
    c2, _ = tp_cost_table(g, costs, topo, 2)
    fix_f = np.minimum(c2.launch_overhead, c2.fwd_time)[:, 0]
    fix_b = np.minimum(c2.launch_overhead, c2.bwd_time)[:, 0]
    var_f, var_b = c2.fwd_time[:, 0] - fix_f, c2.bwd_time[:, 0] - fix_b

    n_f, n_b = collective_counts(g, ann)  # all-reduces per node: three for the parallel cross-entropy

    def ar(nbytes, count):
        return sum(k * collective_time("allreduce", b / (k * m * dp), (0, 1), topo, costs)
                   for b, k in zip(nbytes, count) if b > 0)

    fwd = var_f.sum() / (m * dp) + fix_f.sum() + ar(ann.ar_fwd, n_f)
    bwd = var_b.sum() / (m * dp) + fix_b.sum() + ar(ann.ar_bwd, n_b)
    assert res.meta["stage_fwd_time"][0] == pytest.approx(fwd, rel=1e-12)
    assert res.meta["stage_bwd_time"][0] == pytest.approx(bwd, rel=1e-12)
    # the TP bytes shrink with the DP degree: priced at batch / m, the same plan's forward would be slower
    assert ar(ann.ar_fwd, n_f) < sum(k * collective_time("allreduce", b / (k * m), (0, 1), topo, costs)
                                     for b, k in zip(ann.ar_fwd, n_f) if b > 0)
    compute = m * (fwd + bwd)
    assert compute <= res.step_time <= compute + res.meta["allreduce_time"][0] + 1e-15


def test_sequence_parallel_splits_the_residual_stream_and_swaps_the_collectives(gpt):
    """Megatron-SP: norms, dropouts and residual adds between TP regions on 1/t of the sequence; each all-reduce a
    reduce-scatter + all-gather of the same bytes (equal in the ring model); position embeddings, attention masks and
    the loss stay as they were; less memory per rank, a shorter step."""
    ann = tp.annotation(gpt)
    seq = {gpt.names[i] for i in np.flatnonzero(ann.seq_frac)}
    paths = {gpt.module_paths[gpt.index[n]] for n in seq}
    assert {"blocks.0.ln1", "blocks.0.ln2", "blocks.1", "ln_f", "drop"} <= paths
    assert not any(gpt.op_types[gpt.index[n]] in ("linear", "embedding", "cross_entropy_loss") for n in seq)
    ln = gpt.index[next(n for n in seq if gpt.op_types[gpt.index[n]] == "layer_norm")]
    sp = tp.shard_graph(gpt, 2, sequence_parallel=True)
    plain = tp.shard_graph(gpt, 2)
    assert sp.fwd_flops[ln] == gpt.fwd_flops[ln] / 2 and plain.fwd_flops[ln] == gpt.fwd_flops[ln]
    assert sp.act_bytes[ln] == gpt.act_bytes[ln] / 2
    rest = np.flatnonzero(ann.seq_frac == 0)
    assert np.array_equal(sp.fwd_flops[rest], plain.fwd_flops[rest])
    topo = load_topology("4x_v100_nvlink")
    costs = resolve_costs(gpt, topo)
    a = simulate_pipeline(gpt, costs, topo, whole(gpt, (0, 1), 2, num_microbatches=2))
    b = simulate_pipeline(gpt, costs, topo, whole(gpt, (0, 1), 2, num_microbatches=2, sequence_parallel=True))
    # less memory; about the same step on this tiny model (its norms are cheap, and an all-reduce of a few KiB may
    # take the tree algorithm where reduce-scatter and all-gather have only the ring)
    assert b.peak_memory[0] < a.peak_memory[0] and b.step_time == pytest.approx(a.step_time, rel=0.01)
    # the collectives: on analytic ring links RS + AG of n bytes cost what the all-reduce of n did
    for n in (1e6, 1e8):
        ar = collective_time("allreduce", n, (0, 1), topo, costs)
        rs_ag = collective_time("reducescatter", n, (0, 1), topo, costs) + collective_time("allgather", n, (0, 1),
                                                                                           topo, costs)
        assert rs_ag == pytest.approx(ar, rel=1e-9)
    p = whole(gpt, (0, 1), 2, sequence_parallel=True)
    assert StagePlan.from_json(p.to_json(topology=topo), topology=topo).sequence_parallel is True
