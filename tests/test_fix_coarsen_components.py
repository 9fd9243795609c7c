"""A graph of pieces that no edge joins (independent chains, isolated nodes) coarsens to its group cap.

The merges along edges never join two pieces, so 600 two-node chains stayed 600 groups at ``max_nodes=8`` (and
over the automatic target's 500), with nothing said. The groups left are now packed into the cap; graphs that the
edge merges bring within it never reach that step, so their groups are unchanged.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from placement_rl.graph import CompGraph, coarsen, make_graph, synthetic
from placement_rl.graph._coarsen_reach import GroupOrder
from tests.test_fix_coarsen_scale import OPTIONS, _graphs


def _chains(pieces: int, length: int = 2) -> CompGraph:
    """``pieces`` independent chains of ``length`` equal nodes, each chain its own module."""
    n = pieces * length
    nodes = [{"name": f"n{i}", "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 1e6, "module_path": f"m{i // length}"}
             for i in range(n)]
    edges = [[i, i + 1, 1e3] for i in range(n - 1) if (i + 1) % length]
    return make_graph(nodes, edges, name="pieces")


def _forest(n: int, seed: int, *, paths: bool = False) -> CompGraph:
    """Small random DAGs (1 to 12 nodes, branching, a third of them single nodes) side by side, their nodes
    interleaved in the file; optionally with module paths (a module per piece, sub-modules inside it)."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    edges: set[tuple[int, int]] = set()
    path = [""] * n
    i = 0
    while i < n:
        size = rng.choice([1, 1, 1, 2, 3, 5, 8, 12])
        piece = sorted(order[i:i + size])
        for k, v in enumerate(piece):
            path[v] = f"p{i}.l{k // 3}" if paths else ""
            edges |= {(piece[rng.randrange(k)], v) for _ in range(rng.randint(1, 2) if k else 0)}
        i += size
    nodes = [{"name": f"op{j}", "fwd_flops": (f := rng.choice([1e6, 1e8, 1e9, 5e9])), "bwd_flops": 2 * f,
              "param_bytes": rng.choice([0.0, 1e6]), "out_bytes": 1e4, "act_bytes": 1e3, "module_path": path[j]}
             for j in range(n)]
    return make_graph(nodes, [[a, b, 1e4] for a, b in sorted(edges)], name=f"forest{n}")


def _check_groups(fine: CompGraph, coarse: CompGraph) -> None:
    """Every node in exactly one group, work conserved, and the group graph acyclic (edges run forward in the
    output's topological order, which assembling it checked)."""
    members = [m for grp in coarse.members for m in grp]
    assert sorted(members) == sorted(fine.names) and len(members) == len(set(members))
    assert np.isclose(coarse.fwd_flops.sum(), fine.fwd_flops.sum())
    assert (coarse.edges[:, 0] < coarse.edges[:, 1]).all()


@pytest.fixture
def packed(monkeypatch) -> list[bool]:
    """Records, per call of the packing step, whether the groups it was given shared no edge."""
    calls: list[bool] = []
    pack = coarsen._Quotient.merge_pieces

    def spy(q, max_nodes: int) -> None:
        calls.append(not any(q.succ[a] for a in range(len(q.alive)) if q.alive[a]))
        pack(q, max_nodes)

    monkeypatch.setattr(coarsen._Quotient, "merge_pieces", spy)
    return calls


def test_independent_chains_meet_max_nodes_and_the_target(packed) -> None:
    g = _chains(600)
    capped, auto = coarsen.coarsen(g, max_nodes=8), coarsen.coarsen(g)
    assert capped.num_nodes == 8 and auto.num_nodes == 500  # were 600 and 600
    for c in (capped, auto):
        _check_groups(g, c)
    assert len(set((capped.fwd_flops + capped.bwd_flops).tolist())) == 1  # 75 chains each: compute balanced
    assert packed == [True, True]


@pytest.mark.parametrize("seed", range(6))
def test_pieces_of_random_dags_meet_the_cap_and_stay_acyclic(seed: int, packed) -> None:
    g = _forest(400, seed, paths=seed % 2 == 1)
    for opts, want in [({"max_nodes": 5}, 5), ({"max_nodes": 40}, 40), ({"target": (10, 30)}, 30),
                       ({"depth": 1, "max_nodes": 12}, 12)]:
        c = coarsen.coarsen(g, **opts)
        assert c.num_nodes == want, opts
        _check_groups(g, c)
    assert packed and all(packed)  # the edge merges had left only groups without edges


def test_graphs_the_edge_merges_bring_within_the_cap_never_reach_the_packing(monkeypatch) -> None:
    """Their groups are the ones coarsening gave before: the packing step is the only change, and it never runs.
    (Some of these graphs have pieces too: resnet18's in-place counter updates, the first layer of a layered DAG.
    Their module groups or the caps here absorb them; a layered DAG of 4 pieces at ``max_nodes=3`` stayed at 4.)"""
    from placement_rl.graph.capture import capture_zoo

    def refuse(q, max_nodes: int) -> None:
        raise AssertionError("packing ran on a graph the edge merges bring within the cap")

    monkeypatch.setattr(coarsen._Quotient, "merge_pieces", refuse)
    graphs = list(_graphs()) + [capture_zoo("mlp"), capture_zoo("resnet18")]
    graphs += [synthetic.sample(f, num_nodes=300, seed=1) for f in synthetic.families()]
    for g in graphs:
        for opts in [*OPTIONS, {"max_nodes": 8}, {"target": (5, 12)}, {"target": (100, 200)}]:
            coarsen.coarsen(g, **opts)


def test_fifty_thousand_nodes_of_pieces_pack_in_a_pass(monkeypatch) -> None:
    """The packing does one merge per group over the cap and no cycle search; the searches of the whole run stay a
    few per node."""
    orders: list[GroupOrder] = []
    merges = {"packing": 0}

    class Counted(GroupOrder):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            orders.append(self)

    pack = coarsen._Quotient.merge_pieces

    def counted(q, max_nodes: int) -> None:
        before = q.count
        visits = sum(o.visits for o in orders)
        pack(q, max_nodes)
        merges["packing"] += before - q.count
        assert sum(o.visits for o in orders) == visits  # no search

    monkeypatch.setattr(coarsen, "GroupOrder", Counted)
    monkeypatch.setattr(coarsen._Quotient, "merge_pieces", counted)
    g = _chains(25_000)
    c = coarsen.coarsen(g, max_nodes=64)
    assert c.num_nodes == 64 and merges["packing"] == 25_000 - 64
    assert sum(o.visits for o in orders) < 4 * g.num_nodes
