"""``place_graph``: the shipped policy's placement of a graph built in Python, as ``placement-rl place`` gives it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl.agents.place_graph import place_graph
from placement_rl.cost import resolve_costs, simulate
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import make_graph
from placement_rl.topology import load_topology

torch.set_num_threads(1)


def _two_towers():
    nodes = [dict(name="in", op_type="linear", fwd_flops=1e9, bwd_flops=2e9, out_bytes=4e6)]
    edges = []
    for t in "ab":
        prev = "in"
        for k in range(4):
            name = f"{t}{k}"
            nodes.append(dict(name=name, op_type="linear", fwd_flops=4e10, bwd_flops=8e10, out_bytes=4e6,
                              param_bytes=1.6e7))
            edges.append([prev, name, 4e6])
            prev = name
    nodes.append(dict(name="out", op_type="add", fwd_flops=1e6, bwd_flops=1e6, out_bytes=4e6))
    edges += [["a3", "out", 4e6], ["b3", "out", 4e6]]
    return make_graph(nodes, edges, name="two_towers")


def test_numpy_integers_are_integers():
    graph, topo = _two_towers(), load_topology("2x_k80")
    a = place_graph(graph, topo, samples=np.int64(2), seed=np.int32(3))
    assert a.meta["step_time"] == place_graph(graph, topo, samples=2, seed=3).meta["step_time"]


def test_greedy_and_best_of_k_are_what_they_simulate_to():
    graph, topo = _two_towers(), load_topology("4x_v100_pcie")
    costs = resolve_costs(graph, topo)
    greedy = place_graph(graph, topo, costs)
    best = place_graph(graph, topo, costs, samples=4, seed=1)
    for p in (greedy, best):
        p.validate(graph, topo)
        assert p.meta["step_time"] == pytest.approx(simulate(graph, costs, topo, p).step_time, rel=1e-12)
    assert greedy.meta["label"] == "greedy" and greedy.meta["feasible"]
    assert best.meta["step_time"] <= greedy.meta["step_time"] == best.meta["greedy_step_time"]
    single = min(simulate(graph, costs, topo, np.full(graph.num_nodes, d)).step_time for d in range(4))
    assert greedy.meta["step_time"] < single  # two independent towers: spread beats one GPU


@pytest.mark.parametrize("kw, says", [(dict(samples=-1), "samples must be"), (dict(samples=1.5), "samples must be"),
                                      (dict(seed="x"), "seed must be")])
def test_bad_arguments_are_one_line(kw, says):
    with pytest.raises(ConfigError, match=says):
        place_graph(_two_towers(), load_topology("2x_k80"), **kw)
