"""Activation recomputation per stage: priced by hand (time: the forward again in the backward; memory: the
checkpointed regions' inputs plus one micro-batch's transient), searched by exact, round-tripped through JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.cost.recompute import kept_bytes, regions
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
    # time: each checkpointed node's forward again in the backward (per micro-batch: variable part / m + fixed)
    fix = np.minimum(c.launch_overhead, c.fwd_time)[:, 0]
    again = float(((c.fwd_time[:, 0] - fix) / m + fix)[inside].sum())
    assert got.meta["stage_fwd_time"][0] == pytest.approx(base.meta["stage_fwd_time"][0], rel=1e-12)
    assert got.meta["stage_bwd_time"][0] == pytest.approx(base.meta["stage_bwd_time"][0] + again, rel=1e-12)
    # memory (GPipe: m micro-batches in flight): the regions' inputs instead of their activations, plus one
    # micro-batch's activations of the largest region while it is recomputed
    kept = kept_bytes(g, rid)
    freed = np.bincount(rid[inside], weights=g.act_bytes[inside])
    saved = float(g.act_bytes.sum())
    want = base.peak_memory[0] - saved + (saved - freed.sum() + kept.sum()) + freed.max() / m
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
