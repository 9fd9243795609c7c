"""The simulator refuses a cost table resolved for another graph of the same size, and placements a cast to integers
would change (it priced another graph's table 225x off, and simulated [0, 0.7, 1.2] as [0, 0, 1])."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import resolve_costs, simulate
from placement_rl.errors import PlanError, ProfileError
from placement_rl.graph.ir import make_graph
from placement_rl.topology import load_topology


def _chain(names: str, flops: float):
    nodes = [dict(name=n, fwd_flops=flops, bwd_flops=2 * flops) for n in names]
    return make_graph(nodes, [[names[0], names[1], 1e6], [names[1], names[2], 2e6]])


def test_a_table_of_another_graph_of_the_same_size_is_refused():
    topo = load_topology("2x_cpu")
    g, other = _chain("abc", 1e6), _chain("xyz", 1e12)
    costs = resolve_costs(g, topo)
    with pytest.raises(ProfileError, match="resolved for another graph"):
        simulate(other, costs, topo, np.array([0, 1, 0]))
    right = simulate(other, resolve_costs(other, topo), topo, np.array([0, 1, 0])).step_time
    assert right > 100 * simulate(g, costs, topo, np.array([0, 1, 0])).step_time


def test_a_hand_built_table_without_a_record_is_checked_by_shape_only():
    import dataclasses

    topo = load_topology("2x_cpu")
    g = _chain("abc", 1e9)
    bare = dataclasses.replace(resolve_costs(g, topo), graph_fingerprint="", topology_name="")
    assert simulate(_chain("xyz", 1e9), bare, topo, np.array([0, 1, 0])).step_time > 0


@pytest.mark.parametrize("bad, says", [([0, 0.7, 1.2], "not an integer"), ([[0, 1, 0]], "flat list"),
                                       ([0, float("nan"), 1], "not an integer")])
def test_placements_a_cast_would_change_are_refused(bad, says):
    topo = load_topology("2x_cpu")
    g = _chain("abc", 1e9)
    with pytest.raises(PlanError, match=says):
        simulate(g, resolve_costs(g, topo), topo, np.array(bad))


def test_integral_floats_and_lists_price_as_their_integers():
    topo = load_topology("2x_cpu")
    g = _chain("abc", 1e9)
    costs = resolve_costs(g, topo)
    want = simulate(g, costs, topo, np.array([0, 1, 0], dtype=np.int64)).step_time
    assert simulate(g, costs, topo, np.array([0.0, 1.0, 0.0])).step_time == want
    assert simulate(g, costs, topo, [0, 1, 0]).step_time == want


def test_a_cost_table_source_given_as_one_string_is_refused():
    import dataclasses

    topo = load_topology("2x_cpu")
    costs = resolve_costs(_chain("abc", 1e9), topo)
    with pytest.raises(ProfileError, match="'source' must be a list of strings"):
        dataclasses.replace(costs, source="ab")  # was read as ('a', 'b'): one label per character
