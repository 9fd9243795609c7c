"""``exact`` on an uncoarsened graph of thousands of nodes holds to its seconds: the listing of ideals stops as soon
as it passes its limit (not after a whole level), the chain-cover bound is computed on bit masks over topological
positions (its note printable past floats), and a prefix family over the DP's work limit is counted, not built (at
20,000 nodes its N^2 matrix and the DP's arrays over it took over a minute before the DP was skipped anyway)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from placement_rl import baselines
from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.baselines.pipe_ideals import IdealSearch
from placement_rl.cost import resolve_costs
from placement_rl.graph import ideals, synthetic
from placement_rl.graph.ir import make_graph
from placement_rl.topology import load_topology

torch.set_num_threads(1)


class CountedReads(list):
    """A list of predecessor masks that counts its reads: the listing reads a mask twice per set it builds."""

    reads = 0

    def __getitem__(self, k):
        self.reads += 1
        return super().__getitem__(k)


def chain(n: int):
    nodes = [{"name": f"n{i}", "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
              "out_bytes": 1e5} for i in range(n)]
    return make_graph(nodes, [[i, i + 1, 1e5] for i in range(n - 1)], name=f"chain{n}")


def fan(width: int):
    """A source, ``width`` parallel branches, a sink: 2^width + 2 ideals."""
    nodes = [{"name": f"n{i}", "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
              "out_bytes": 1e5} for i in range(width + 2)]
    edges = [[0, k, 1e5] for k in range(1, width + 1)] + [[k, width + 1, 1e5] for k in range(1, width + 1)]
    return make_graph(nodes, [tuple(e) for e in edges], name=f"fan{width}")


def test_listing_stops_as_soon_as_it_passes_the_limit():
    n = 1000  # n sources and a sink under them all: a level of n sets, then one of n (n - 1) / 2
    preds = CountedReads([0] * n + [(1 << n) - 1])
    assert ideals.enumerate_ideals_masks(preds, n + 1, limit=n + 10) is None
    # setup reads each mask twice; then two reads per set built: the first level and ~10 sets of the second
    # (the whole second level, about a million reads, before)
    assert preds.reads < 10 * n


def test_bound_past_floats_is_written_as_a_power_of_ten():
    fam = ideals.ideal_family(fan(1100), limit=100)  # chain-cover bound ~2^1100: past 1e308
    assert not fam.complete and "chain-cover bound ~1e331" in fam.note
    assert ideals.magnitude(10**400) == "~1e400" and ideals.magnitude(12345) == "1.23e+04"


def _greedy_cover_bound(graph) -> int:
    """The chain-cover bound as it was first written: every chain end tested against each node's ancestors."""
    ends: dict[int, int] = {}
    rank = {v: k for k, v in enumerate(graph.topo_order.tolist())}
    anc = [0] * graph.num_nodes
    for v in graph.topo_order.tolist():
        for u in graph.pred_idx[graph.pred_ptr[v]:graph.pred_ptr[v + 1]].tolist():
            anc[v] |= anc[u] | (1 << u)
        tails = [u for u in ends if anc[v] >> u & 1]
        tail = max(tails, key=rank.__getitem__) if tails else None
        ends[v] = (ends.pop(tail) + 1) if tail is not None else 1
    return int(np.prod([x + 1 for x in ends.values()], dtype=object))


@pytest.mark.parametrize("seed", range(5))
def test_bound_is_the_same_greedy_chain_cover(seed):
    for n in (6, 30, 120):
        g = synthetic.sample("dataflow", num_nodes=n, seed=seed)
        assert ideals.ideal_bound(g) == _greedy_cover_bound(g)
    assert ideals.ideal_bound(fan(1100)) == _greedy_cover_bound(fan(1100)) > 10**330


def test_prefix_count_matches_the_prefixes_kept():
    g = synthetic.sample("dataflow", num_nodes=30, seed=1)
    order = g.topo_order.tolist()
    for colocate in ([], [[order[3], order[7]]], [[order[3], order[7]], [order[5], order[12], order[1]]]):
        assert ideals.prefix_count(g, colocate) == ideals.prefix_ideals(g, colocate).shape[0]


def _problem(graph, seconds=None) -> PipeProblem:
    topo = load_topology("4x_v100_pcie")
    return PipeProblem(graph, resolve_costs(graph, topo), topo, budget=10**6, seed=0, num_microbatches=4,
                       schedule="1f1b", batch_size=None, seconds=seconds)


def test_prefix_family_over_the_work_limit_is_counted_not_built():
    g = chain(200)  # 201 ideals, over a limit of 50 listed; 201 prefixes over the work limit
    over = IdealSearch(_problem(g), enum_limit=50, work_limit=1e5)
    assert over.over_limit and over.family.members is None and over.family.count == g.num_nodes + 1
    assert not hasattr(over, "fv")  # the DP's arrays are not built either
    assert "the prefix family is over the work limit too (201 prefixes" in over.family.note
    within = IdealSearch(_problem(g), enum_limit=50)
    assert not within.over_limit and within.family.members.shape == (g.num_nodes + 1, g.num_nodes)


def test_exact_on_a_long_chain_skips_the_prefix_family_and_says_so():
    g = chain(4000)  # 4001 prefixes x 600 DP steps a pair on 4 equal GPUs: over the work limit
    t0 = time.perf_counter()
    plan = baselines.get_pipeline("exact")(g, resolve_costs(g, load_topology("4x_v100_pcie")),
                                           load_topology("4x_v100_pcie"), budget=10**8, seed=0, seconds=1)
    assert time.perf_counter() - t0 < 60.0  # very generous: the point is the meta below
    assert plan.meta["ideals"] == g.num_nodes + 1 and plan.meta["ideals_complete"] is False
    assert "skipped" in plan.meta["ideal_note"] and "over the limit" in plan.meta["ideal_note"]
