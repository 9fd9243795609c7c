"""Tensor parallelism over unequal GPUs: a TP group runs at its slowest rank's pace, whatever its device order, and
the TP planners estimate it the same way; equal devices keep their step times exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from placement_rl import baselines
from placement_rl.baselines import pipe_tp
from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.cost import pipeline as pipeline_mod
from placement_rl.cost import resolve_costs
from placement_rl.cost.pipeline import PipelineSimulator
from placement_rl.graph import coarsen
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

torch.set_num_threads(1)
PCIE = {"intra_host": {"bandwidth": 25e9, "latency": 1e-5, "kind": "pcie"}}


def _topology(*models, memory=None):
    devs = [{"name": f"g{i}_{m.lower()}", "model": m} for i, m in enumerate(models)]
    for i, b in (memory or {}).items():
        devs[i]["memory_bytes"] = b
    return DeviceTopology.from_dict({"name": "+".join(models), "devices": devs, "links": PCIE})


@pytest.fixture(scope="module")
def graph():
    return coarsen.coarsen(capture_zoo("gpt", batch_size=8, seq_len=128, vocab_size=4096, d_model=512, n_layers=2,
                                       n_heads=8), max_nodes=8)


def _whole(graph, group, t, **kw):
    return StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), (tuple(group),), tp=(t,), batch_size=8, **kw)


def _two(graph, groups, t, **kw):
    stage = np.zeros(graph.num_nodes, dtype=np.int64)
    stage[list(graph.topo_order)[graph.num_nodes // 2:]] = 1
    return StagePlan(stage, tuple(groups), tp=(t, t), batch_size=8, **kw)


def test_tp_group_over_unequal_gpus_is_paced_by_its_slowest_rank_in_either_order(graph):
    """H100 + L4 (+ a second L4 on the same links): the H100-first order was priced as two H100 ranks, far below
    what the L4's share of the work needs; both orders now price alike and at least at two L4 ranks' pace."""
    topo = _topology("H100", "L4", "L4")
    sim = PipelineSimulator(graph, resolve_costs(graph, topo), topo)
    l4_alone = sim.run(_whole(graph, (1,), 1)).step_time
    both_l4 = sim.run(_whole(graph, (1, 2), 2)).step_time
    for kw in ({}, {"sharding": "fsdp"}, {"recompute": ("full",)}, {"sequence_parallel": True},
               {"num_microbatches": 2}):
        fast_first = sim.run(_whole(graph, (0, 1), 2, **kw))
        slow_first = sim.run(_whole(graph, (1, 0), 2, **kw))
        assert fast_first.step_time == pytest.approx(slow_first.step_time, rel=1e-12), kw
        assert np.array_equal(fast_first.peak_memory, slow_first.peak_memory), kw
        assert np.allclose(fast_first.device_busy[[0, 1]], slow_first.device_busy[[0, 1]], rtol=1e-12), kw
        if not kw:
            assert fast_first.step_time >= both_l4 * (1 - 1e-12)
            assert fast_first.step_time > 0.5 * l4_alone
    # two stages, each a TP group listed in either order, one micro-batch per rank
    topo4 = _topology("H100", "L4", "A100-SXM4-80GB", "T4")
    sim4 = PipelineSimulator(graph, resolve_costs(graph, topo4), topo4)
    times = {sim4.run(_two(graph, (a, b), 2, num_microbatches=2)).step_time
             for a in ((0, 1), (1, 0)) for b in ((2, 3), (3, 2))}
    assert max(times) == pytest.approx(min(times), rel=1e-12)


def test_each_rank_checked_against_its_own_memory_in_either_order(graph):
    topo = _topology("H100", "L4")
    sim = PipelineSimulator(graph, resolve_costs(graph, topo), topo)
    need = sim.run(_whole(graph, (0, 1), 2)).peak_memory[1]
    small = _topology("H100", "L4", memory={1: need / 2})
    sim = PipelineSimulator(graph, resolve_costs(graph, small), small)
    for group in ((0, 1), (1, 0)):
        r = sim.run(_whole(graph, group, 2))
        assert not r.feasible and len(r.meta["memory_errors"]) == 1
        assert r.meta["memory_errors"][0].startswith("g1_l4 needs"), r.meta["memory_errors"]


@pytest.mark.parametrize("models", [("V100",) * 4, ("H100",) * 4])
def test_equal_devices_keep_the_first_rank_price_exactly(graph, models, monkeypatch):
    """On equal devices the price is bit for bit the one of timing every TP group on its first rank alone."""
    topo = _topology(*models)
    costs = resolve_costs(graph, topo)
    plans = [_whole(graph, (0, 1), 2), _whole(graph, (3, 2, 1, 0), 4, sequence_parallel=True, recompute=("full",)),
             _whole(graph, (0, 1, 2, 3), 2, sharding="fsdp", num_microbatches=2),
             _two(graph, ((1, 0), (2, 3)), 2, num_microbatches=4, recompute=("full", "none"))]
    now = [PipelineSimulator(graph, costs, topo).run(p) for p in plans]
    monkeypatch.setattr(pipeline_mod, "_pace_tp_groups", lambda *a: None)  # the first-rank path
    first = [PipelineSimulator(graph, costs, topo).run(p) for p in plans]
    for a, b in zip(now, first):
        assert a.step_time == b.step_time
        assert np.array_equal(a.peak_memory, b.peak_memory) and np.array_equal(a.device_busy, b.device_busy)


def test_tp_planners_price_unequal_groups_as_the_simulator(graph):
    """``exact``'s analytic objective is still the simulated step at one micro-batch and DP 1 on unequal devices
    (every cut set, TP 1 / 2 / 4), and its plan prices the same with every TP group reversed."""
    topo = _topology("H100", "A100-SXM4-80GB", "L4", "T4")
    costs = resolve_costs(graph, topo)
    pp = PipeProblem(graph, costs, topo, budget=10**6, seed=0, num_microbatches=1, schedule="1f1b", batch_size=None)
    sim = PipelineSimulator(graph, costs, topo)
    checked = 0
    for t in pipe_tp.tp_choices(pp):
        for s in range(1, pp.d // t + 1):
            for bars in itertools.combinations(range(1, graph.num_nodes), s - 1):
                cuts = [0, *bars, graph.num_nodes]
                est = pipe_tp.cut_objective(pp, cuts, 1, 1, "dp", t)
                got = sim.run(pp.plan(cuts, (1,) * s, m=1, tp=(t,) * s)).step_time
                assert est == pytest.approx(got, rel=1e-12), (t, cuts)
                checked += t > 1
    assert checked > 0
    plan = baselines.get_pipeline("exact")(graph, costs, topo, budget=2000, seed=0)
    flipped = StagePlan(plan.stage_of_node, tuple(tuple(reversed(g)) for g in plan.stage_devices),
                        num_microbatches=plan.num_microbatches, batch_size=plan.batch_size, tp=plan.tp,
                        sharding=plan.sharding, recompute=plan.recompute, sequence_parallel=plan.sequence_parallel)
    assert sim.run(flipped).step_time == pytest.approx(sim.run(plan).step_time, rel=1e-12)
    fastest = int(pp.devs[0])
    assert sim.run(plan).step_time <= sim.run(_whole(graph, (fastest,), 1)).step_time * (1 + 1e-12)
