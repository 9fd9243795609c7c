"""The pipelined-throughput objective (``cost.throughput``) for stage plans and op placements."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.cost import CostTable, resolve_costs, simulate_pipeline
from placement_rl.cost.modes import inference_costs
from placement_rl.cost.throughput import op_steady_time
from placement_rl.graph.ir import make_graph
from placement_rl.plans import Placement, StagePlan

from tests.test_pipe_hetero import mixed_topology


def chain3():
    nodes = [dict(name=f"n{i}", bwd_flops=1.0, param_bytes=0.0) for i in range(3)]
    return make_graph(nodes, [(0, 1, 100.0), (1, 2, 300.0)])


def hand_costs(d: int) -> CostTable:
    fwd = np.array([[1.0] * d, [2.0] * d, [3.0] * d])
    lat = np.full((d, d), 0.5)
    np.fill_diagonal(lat, 0.0)
    bw = np.full((d, d), 100.0)
    np.fill_diagonal(bw, np.inf)
    return CostTable(fwd_time=fwd, bwd_time=2 * fwd, link_latency=lat, link_bandwidth=bw, source=("hand",) * d)


def test_pipeline_steady_time_is_the_busiest_resource_per_microbatch_times_m():
    g, costs, topo = chain3(), hand_costs(3), mixed_topology(2)
    plan = StagePlan(stage_of_node=[0, 1, 2], stage_devices=((0,), (1,), (2,)), num_microbatches=4)
    res = simulate_pipeline(g, costs, topo, plan)
    # per micro-batch: stages 3/4, 6/4, 9/4 compute; links 0.5 + 25/100, 0.5 + 75/100
    assert res.meta["steady_time"] == pytest.approx(4 * 9 / 4)
    assert res.meta["steady_time"] < res.step_time
    inf = simulate_pipeline(g, inference_costs(costs), topo, plan)
    assert inf.meta["steady_time"] == pytest.approx(4 * max(3 / 4, 0.5 + 0.75))  # the link 1 -> 2 paces it


def test_op_steady_time_counts_devices_and_links():
    g, costs = chain3(), hand_costs(3)
    # n0 on 0, n1 and n2 on 1: device 1 busy (2 + 3) x 3 = 15, device 0: 3; link 0 -> 1: 0.5 + 1 (and back)
    assert op_steady_time(g, costs, Placement([0, 1, 1])) == pytest.approx(15.0)
    assert op_steady_time(g, costs, np.array([0, 1, 2])) == pytest.approx(9.0)
    assert op_steady_time(g, inference_costs(costs), np.array([0, 1, 2])) == pytest.approx(0.5 + 3.0)  # link 1 -> 2


def test_search_placer_minimises_the_chosen_objective():
    nodes = [dict(name=n, fwd_flops=1e9, bwd_flops=2e9, param_bytes=1e6, act_bytes=1e5) for n in "abcd"]
    g = make_graph(nodes, [("a", "b", 1e5), ("a", "c", 1e5), ("b", "d", 2e5), ("c", "d", 2e5)])
    topo = mixed_topology(2)
    costs = resolve_costs(g, topo)
    step = baselines.get("local_search")(g, costs, topo, budget=300, seed=0)
    thr = baselines.get("local_search")(g, costs, topo, budget=300, seed=0, objective="throughput")
    assert thr.meta["objective"] == "throughput"
    assert thr.meta["steady_time"] == pytest.approx(op_steady_time(g, costs, thr))
    assert op_steady_time(g, costs, thr) <= op_steady_time(g, costs, step) + 1e-12
    assert step.meta["step_time"] <= thr.meta["step_time"] + 1e-12
