"""TP activation memory (a column GEMM's saved input, Korthikanti et al.'s closed form), the vocabulary padded at TP 1,
the plans `evaluate` refuses refused by `export` too, and interleaved 1F1B priced in inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from placement_rl import export as ex
from placement_rl.cost import resolve_costs
from placement_rl.cost._pipe_schedule import GPIPE, INTERLEAVED, schedule_order
from placement_rl.cost.pipeline import simulate_pipeline
from placement_rl.cost.types import CostTable
from placement_rl.errors import PlanError
from placement_rl.graph import make_graph, tp
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology, load_topology

torch.set_num_threads(1)
B, S, H, A = 4, 16, 32, 4  # batch, sequence, hidden, heads
LM = dict(batch_size=B, seq_len=S, vocab_size=96, d_model=H, n_layers=4, n_heads=A, dropout=0.1)


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **LM)


def one_stage(g, t: int, **kw) -> StagePlan:
    return StagePlan(np.zeros(g.num_nodes, dtype=np.int64), (tuple(range(t)),), tp=(t,), **kw)


def cut_after(g, blocks):
    """Stage of every node when stages end after the given blocks' residual adds (node order = program order)."""
    ends = [max(i for i, p in enumerate(g.module_paths) if p == f"blocks.{b}") + 1 for b in blocks]
    return np.searchsorted(np.array(ends), np.arange(g.num_nodes), side="right")


def saved_bytes(fn, *args, skip=()) -> int:
    """Bytes of the storages autograd saves for backward while ``fn(*args)`` runs (``skip``: parameters)."""
    keep = {t.untyped_storage().data_ptr() for t in skip}
    seen: dict[int, int] = {}

    def pack(z):
        ptr = z.untyped_storage().data_ptr()
        if ptr not in keep:
            seen[ptr] = z.untyped_storage().nbytes()
        return z

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda z: z):
        fn(*args)
    return sum(seen.values())


# ------------------------------------------------------------------------------------- a column's saved input
def test_column_gemms_and_the_lm_head_keep_their_whole_input_without_sp(gpt):
    """Every TP rank multiplies the whole, replicated input by its weight shard, so autograd keeps that input whole
    (measured: F.linear on one rank's QKV shard); with sequence parallelism Megatron keeps the sequence shard."""
    ann = tp.annotation(gpt)
    qkv = gpt.index[next(n for n in gpt.names if gpt.module_paths[gpt.index[n]] == "blocks.0.attn.qkv")]
    head = int(np.flatnonzero(ann.kind == tp.VOCAB_HEAD)[0])
    x = torch.randn(B, S, H, requires_grad=True)
    w = torch.randn(3 * H // 2, H, requires_grad=True)  # rank 0's rows of the QKV weight at TP 2
    assert gpt.act_bytes[qkv] == x.numel() * 4 == saved_bytes(F.linear, x, w, skip=(w,))
    for t in (2, 4):
        plain, sp = tp.shard_graph(gpt, t), tp.shard_graph(gpt, t, sequence_parallel=True)
        for v in (qkv, head):
            assert plain.act_bytes[v] == gpt.act_bytes[v] > 0
            assert sp.act_bytes[v] == pytest.approx(gpt.act_bytes[v] / t, rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_a_layer_is_priced_at_korthikantis_closed_form(gpt, t):
    """Per layer, Korthikanti et al. 2022: (10 + 24/t) sbh + 5as^2b/t without SP, 34 sbh/t + 5as^2b/t with it (fp16
    values, 1-byte masks). In the captured graph's units (fp32, 4-byte dropout masks off-GPU): (24 + 48/t) sbh +
    12as^2b/t and 72 sbh/t + 12as^2b/t, plus the norms' mean and rstd (16 sb, 1/t with SP) and the causal mask the
    masked fill keeps (s^2 bytes, priced with the split scores at 1/t)."""
    layer = np.array([p == "blocks.1" or p.startswith("blocks.1.") for p in gpt.module_paths])
    sbh, as2b, stats, mask = S * B * H, A * S * S * B, 16 * S * B, S * S
    for sp in (False, True) if t > 1 else (False,):
        got = tp.shard_graph(gpt, t, sequence_parallel=sp).act_bytes[layer].sum()
        split = 48 * sbh / t + 12 * as2b / t + mask / t
        want = split + (24 * sbh + stats) / (t if sp else 1)
        assert got == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------------------------------- vocabulary padding at TP 1
def test_the_vocabulary_is_padded_at_tp_1_as_megatron_pads_it(gpt):
    """Megatron pads to a multiple of make_vocab_size_divisible_by x t at every t: GPT-2's 50,257 is 50,304 at TP 1;
    shard_graph at t = 1 prices the vocabulary ops at padded / V and leaves the rest; padding off: the graph itself."""
    assert tp.padded_vocab(50257, 1) == 50304 and tp.padded_vocab(50257, 1, 0) == 50257
    assert tp.padded_vocab(512, 1) == 512 and tp.padded_vocab(96, 1) == 128
    ann = tp.annotation(gpt)
    head = int(np.flatnonzero(ann.kind == tp.VOCAB_HEAD)[0])
    emb = int(np.flatnonzero(ann.kind == tp.VOCAB_EMB)[0])
    loss = int(np.flatnonzero(ann.kind == tp.VOCAB_LOSS)[0])
    one = tp.shard_graph(gpt, 1)
    pad = 128 / 96
    assert one.fwd_flops[head] == pytest.approx(gpt.fwd_flops[head] * pad, rel=1e-12)
    assert one.param_bytes[emb] == pytest.approx(gpt.param_bytes[emb] * pad, rel=1e-12)
    assert one.act_bytes[loss] == pytest.approx(gpt.act_bytes[loss] * pad, rel=1e-12)
    assert one.act_bytes[head] == gpt.act_bytes[head]  # its input is the hidden state, not the vocabulary
    rest = np.flatnonzero((ann.vocab_frac == 0).all(axis=0))
    assert np.array_equal(one.fwd_flops[rest], gpt.fwd_flops[rest])
    assert tp.shard_graph(gpt, 1, divisible_by=0) is gpt


# ------------------------------------------------------------------------------- export refuses what evaluate does
def test_export_refuses_interleaved_recomputation_as_evaluate_does(gpt):
    four = cut_after(gpt, [0, 1, 2])
    plan = StagePlan(four, ((0,), (1,), (0,), (1,)), num_microbatches=2, schedule="interleaved1f1b",
                     recompute=("full",) * 4)
    said = r"^recomputation with schedule 'interleaved1f1b' is not modelled: use "
    topo = load_topology("2x_k80")
    with pytest.raises(PlanError, match=said):
        simulate_pipeline(gpt, resolve_costs(gpt, topo), topo, plan)
    for fmt in ex.FORMATS:
        with pytest.raises(PlanError, match=said + r"1f1b, or recompute 'none' \(the plan recomputes \['full'"):
            ex.export_plan(plan, gpt, fmt)
    mixed = StagePlan(four, plan.stage_devices, num_microbatches=2, schedule="interleaved1f1b",
                      recompute=("full", "none", "none", "none"))
    with pytest.raises(PlanError, match=said):
        ex.export_plan(mixed, gpt, "megatron", uniform=True)
    plain = StagePlan(four, plan.stage_devices, num_microbatches=2, schedule="interleaved1f1b")
    assert "--pipeline-model-parallel-layout" in ex.export_plan(plain, gpt, "megatron")


def test_sequence_parallel_with_a_sequence_tp_does_not_divide_is_refused():
    """Seq 15 at TP 2 with SP: one line, in deploy's words, from a plan file read with its graph (what `evaluate
    plan=` and the export CLI do) and from export itself; the same plan without SP passes, and `exact` plans on the
    graph without such a plan (it weighs SP only where TP divides the sequence)."""
    from placement_rl import baselines

    g = capture_zoo("gpt", **dict(LM, seq_len=15, n_layers=2, dropout=0.0))
    topo = load_topology("4x_v100_nvlink")
    said = (r"^sequence length 15 of graph '.*' is not divisible by TP 2: sequence_parallel needs it; change the "
            r"sequence length or set sequence_parallel to false$")
    plan = one_stage(g, 2, sequence_parallel=True)
    with pytest.raises(PlanError, match=said):
        StagePlan.from_json(plan.to_json(graph=g, topology=topo), topology=topo, graph=g)
    for fmt in ex.FORMATS:
        with pytest.raises(PlanError, match=said):
            ex.export_plan(plan, g, fmt)
    StagePlan.from_json(one_stage(g, 2).to_json(graph=g, topology=topo), topology=topo, graph=g)
    best = baselines.get_pipeline("exact")(g, resolve_costs(g, topo), topo, budget=50, seed=0)
    assert best.num_stages >= 1
    best.check_sequence(g)  # exact weighs SP only at TP degrees that divide the sequence
    assert tp.sequence_length(g) == 15
    assert tp.sequence_length(g.replace(meta={**g.meta, "zoo_options": {}, "hf": {"task": "causal_lm",
                                                                                 "seq_len": 12}})) == 12
    vit = g.replace(meta={**g.meta, "zoo_options": {}, "hf": {"task": "image_classification", "seq_len": 15}})
    assert tp.sequence_length(vit) is None  # unknown here: deploy checks the program's shapes
    one_stage(vit, 2, sequence_parallel=True).check_sequence(vit)


# ------------------------------------------------------------------------------------- interleaved 1F1B in inference
def _chain(s: int, d: int):
    g = make_graph([{"name": f"n{k}", "fwd_flops": 1e9, "bwd_flops": 2e9, "act_bytes": 1e6} for k in range(s)],
                   [[k, k + 1, 0.0] for k in range(s - 1)], name="chain")
    topo = DeviceTopology.from_dict({
        "name": "two", "devices": [{"name": "gpu", "count": d, "kind": "gpu", "host": 0, "model": "A100-SXM4-80GB"}],
        "links": {"intra_host": {"bandwidth": 1e30, "latency": 0.0, "kind": "nvlink"},
                  "inter_host": {"bandwidth": 1e30, "latency": 0.0, "kind": "ib"}}})
    costs = CostTable(fwd_time=np.full((s, d), 1e-3), bwd_time=np.full((s, d), 2e-3), link_latency=topo.link_latency,
                      link_bandwidth=topo.link_bandwidth, source=("hand",) * d)
    return g, topo, costs


def test_interleaved_1f1b_prices_in_inference_as_torchs_eval_runs_it():
    """Forward only, a group runs the interleaved order's forwards (torch's ScheduleInterleaved1F1B.eval: its training
    order with the backwards skipped), where GPipe's stage-by-stage order deadlocked. 4 virtual stages on 2 groups,
    m = 4 micro-batches of 1 ms / m per stage, free links: group 0 runs s0 mb0-1, s2 mb0-1, s0 mb2-3, s2 mb2-3, and
    the last forward (s3, mb3, on group 1) ends after 9 such slots."""
    g_count, v, m = 2, 2, 4
    s = g_count * v
    kind, stage, mb, group, ok = schedule_order(s, m, GPIPE, np.arange(s) % g_count, g_count)
    assert ok
    train = schedule_order(s, m, INTERLEAVED, np.arange(s) % g_count, g_count)
    for g in range(g_count):
        fwd = [(int(a), int(b)) for k, a, b, gg in zip(kind, stage, mb, group) if k == 0 and gg == g]
        want = [(int(a), int(b)) for k, a, b, gg in zip(*train[:4]) if k == 0 and gg == g]
        assert fwd == want
    graph, topo, costs = _chain(s, g_count)
    plan = StagePlan(list(range(s)), tuple((k % g_count,) for k in range(s)), num_microbatches=m,
                     schedule="interleaved1f1b")
    res = simulate_pipeline(graph, costs, topo, plan, mode="inference")
    assert res.step_time == pytest.approx(9 * 1e-3 / m, rel=1e-9)
    assert simulate_pipeline(graph, costs, topo, plan).step_time > res.step_time
