"""TP groups by links where links split equal GPUs (the NVLink mesh of a DGX-1 quad).

On the ``4x_v100_nvlink`` preset GPU pairs 0-3, 1-2 and 2-3 have two NVLinks (50 GB/s), pairs 0-1, 0-2 and 1-3 one
(25 GB/s). ``tp``, ``megatron`` and ``exact`` formed TP groups by device index: TP 2 x DP 2 on (0, 1) and (2, 3),
one NVLink each. They now also plan on TP groups picked by links (``pipe_tp.link_order``) and keep the faster
simulated plan; where links do not split equal devices their plans are as before.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from placement_rl import baselines
from placement_rl.baselines import pipe_tp
from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.cost import PipelineSimulator, resolve_costs
from placement_rl.graph import coarsen
from placement_rl.graph.capture import capture_zoo
from placement_rl.topology import load_topology

torch.set_num_threads(1)


def gpt(n_heads: int):
    return coarsen.coarsen(capture_zoo("gpt", batch_size=8, seq_len=128, vocab_size=4096, d_model=512, n_layers=2,
                                       n_heads=n_heads), max_nodes=8)


def step(graph, costs, topo, plan) -> float:
    return float(PipelineSimulator(graph, costs, topo).run(plan).step_time)


def by_index(plan):
    """The same plan with each stage's devices in index order (TP groups of consecutive devices, as before)."""
    return dataclasses.replace(plan, stage_devices=tuple(tuple(sorted(g)) for g in plan.stage_devices), meta={})


def tp_groups(plan):
    return {frozenset(plan.tp_groups(k)[i]) for k in range(len(plan.stage_devices))
            for i in range(len(plan.tp_groups(k)))}


def problem(graph, costs, topo):
    return PipeProblem(graph, costs, topo, budget=3000, seed=0, num_microbatches=2, schedule="1f1b", batch_size=8)


def test_link_order_pairs_devices_with_two_nvlinks():
    topo = load_topology("4x_v100_nvlink")
    graph = gpt(2)
    pp = problem(graph, resolve_costs(graph, topo), topo)
    assert pp.devs.tolist() == [0, 1, 2, 3]
    assert pipe_tp.link_order(pp, 2, 4).tolist() == [0, 3, 1, 2]
    assert pipe_tp.link_order(pp, 4, 4) is None  # one group of all four: nothing to regroup
    assert pipe_tp.link_order(pp, 1, 4) is None


@pytest.mark.parametrize("name", ["tp", "exact"])
def test_tp_planners_take_two_nvlink_pairs_where_faster(name):
    """GPT with 2 heads (TP at most 2) on 4 V100s: ``tp`` runs TP 2 x DP 2, which took (0, 1), (2, 3); now TP pairs
    (0, 3), (1, 2) (two NVLinks each) where that simulates faster, and never slower than the index grouping."""
    topo = load_topology("4x_v100_nvlink")
    graph = gpt(2)
    costs = resolve_costs(graph, topo)
    pairs = {frozenset((0, 3)), frozenset((1, 2))}
    index_pairs = {frozenset((0, 1)), frozenset((2, 3))}
    plan = baselines.get_pipeline(name)(graph, costs, topo, budget=3000, seed=0, num_microbatches=2, batch_size=8)
    old = by_index(plan)
    assert step(graph, costs, topo, plan) <= step(graph, costs, topo, old) * (1 + 1e-12)
    if name == "tp":
        assert plan.tp == (2,) and tp_groups(old) == index_pairs
    if max(plan.tp) == 2 and step(graph, costs, topo, old) > step(graph, costs, topo, plan):
        assert tp_groups(plan) == pairs
    if name == "tp":  # TP 2 x DP 2 is faster over the two-NVLink pairs
        assert tp_groups(plan) == pairs
        assert step(graph, costs, topo, plan) < step(graph, costs, topo, old)


def test_exact_tp2_dp2_over_two_nvlink_pairs():
    """The 8-head GPT: ``exact`` chose TP 2 x DP 2 on (0, 1), (2, 3) at 3.80 ms; on (0, 3), (1, 2) it is 3.59 ms."""
    topo = load_topology("4x_v100_nvlink")
    graph = gpt(8)
    costs = resolve_costs(graph, topo)
    for fn in (pipe_tp.exact, baselines.pipeline.PARTITIONERS["exact"]):
        pp = problem(graph, costs, topo)
        plan = pp.finish(fn(pp), "exact")
        assert plan.tp == (2,) and tp_groups(plan) == {frozenset((0, 3)), frozenset((1, 2))}
        assert step(graph, costs, topo, plan) < step(graph, costs, topo, by_index(plan))


@pytest.mark.parametrize("topo", ["8x_a100_dgx", "4x_h100_nvlink", "2x_cpu", "cpu_2gpu"])
def test_no_regrouping_where_links_are_alike(topo):
    """Alike links between equal devices: index order only, so the plans are as before."""
    topo = load_topology(topo)
    graph = gpt(8)
    pp = problem(graph, resolve_costs(graph, topo), topo)
    assert len(pipe_tp.tp_choices(pp)) > 1
    for t in pipe_tp.tp_choices(pp):
        assert pipe_tp.tp_orders(pp, t, pipe_tp.usable(pp, t)) == [None]


def test_dgx1_regroups_pairs_not_its_quads():
    """On a DGX-1 (8 V100s) the quads 0-3 and 4-7 are already the best-connected TP 4 groups; TP 2 pairs are not."""
    topo = load_topology("8x_v100_dgx1")
    graph = gpt(8)
    pp = problem(graph, resolve_costs(graph, topo), topo)
    assert pipe_tp.link_order(pp, 4, 8) is None and pipe_tp.link_order(pp, 8, 8) is None
    assert pipe_tp.link_order(pp, 2, 8).tolist() == [0, 3, 1, 2, 4, 7, 5, 6]
