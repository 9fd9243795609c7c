"""Coarsening is near-linear: its cycle checks search only between two groups' places in a topological order.

Each merge and join used to run a depth-first search over the whole group graph (50,000 random nodes did not
coarsen in 5 minutes). The pruned search must give exactly the groups the unbounded one gave: the reference
below is that search, patched in for ``GroupOrder.reaches``, and both results must serialise identically.
"""

from __future__ import annotations

import random

import pytest

from placement_rl.graph import CompGraph, coarsen, make_graph, synthetic
from placement_rl.graph._coarsen_reach import GroupOrder


def _unbounded_reaches(self: GroupOrder, a: int, targets, *, skip: int = -1) -> bool:
    """The reference: the search coarsening used before, over every group reachable from ``a``."""
    targets = set(targets)
    stack = [x for x in self.succ[a] if x != skip]
    seen = set(stack)
    while stack:
        x = stack.pop()
        if x in targets:
            return True
        for y in self.succ[x]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return False


def _random_dag(n: int, seed: int, *, kind: str, paths: str = "", span: int = 0) -> CompGraph:
    """A foreign-style DAG: ``local`` (each node fed by 1-3 of the ``span`` before it), ``layered`` (fed from the
    previous layer) or ``wide`` (one source, parallel short chains, one sink); half the ops hold no parameters.
    ``span`` 0 draws one of 3, 10 and 40.
    ``paths``: "" (none), ``blocks`` (consecutive blocks of 25) or ``scrambled`` (modules used all over)."""
    rng = random.Random(seed)
    edges: set[tuple[int, int]] = set()
    if kind == "local":
        span = span or rng.choice([3, 10, 40])
        edges = {(rng.randrange(max(0, j - span), j), j) for j in range(1, n) for _ in range(rng.randint(1, 3))}
    elif kind == "layered":
        width = rng.randint(3, 30)
        for j in range(width, n):
            lo = (j // width - 1) * width
            edges |= {(rng.randrange(lo, lo + width), j) for _ in range(rng.randint(1, 3))}
    else:
        chain = rng.randint(1, 3)
        for j in range(1, n - 1):
            edges.add((0 if (j - 1) % chain == 0 else j - 1, j))
            if j % chain == 0 or j == n - 2:
                edges.add((j, n - 1))
    nodes = []
    for i in range(n):
        f = rng.choice([0.0, 1e6, 1e8, 1e9, 5e9])
        path = {"": "", "blocks": f"b{i // 25}.l{i % 25 // 5}",
                "scrambled": f"m{rng.randrange(6)}.s{rng.randrange(4)}"}[paths]
        nodes.append({"name": f"op{i}", "module_path": path, "fwd_flops": f, "bwd_flops": 2 * f,
                      "out_bytes": rng.choice([0.0, 1e3, 1e5, 4e6]), "param_bytes": rng.choice([0.0, 0.0, 1e6]),
                      "act_bytes": 1e3})
    return make_graph(nodes, [[a, b, rng.choice([1e3, 1e5, 4e6])] for a, b in sorted(edges)], name=f"{kind}{n}")


def _graphs():
    """Many small graphs: random (with and without module paths) and every synthetic family."""
    kinds = [("local", ""), ("layered", ""), ("wide", ""), ("local", "blocks"), ("layered", "scrambled"),
             ("local", "scrambled")]
    for seed in range(18):
        kind, paths = kinds[seed % len(kinds)]
        yield _random_dag(random.Random(seed).randint(50, 500), seed, kind=kind, paths=paths)
    for seed, family in enumerate(synthetic.families()):
        yield synthetic.sample(family, num_nodes=[60, 250, 500][seed % 3], seed=seed)


OPTIONS = [{}, {"max_nodes": 7}, {"depth": 1}, {"depth": 2, "fold_param_free": False, "max_nodes": 25}]


def _results(graphs: list[CompGraph]) -> list[str]:
    return [coarsen.coarsen(g, **opts).to_json() for g in graphs for opts in OPTIONS]


def test_pruned_search_gives_the_same_groups_as_the_unbounded_one(monkeypatch) -> None:
    graphs = list(_graphs())
    pruned = _results(graphs)
    monkeypatch.setattr(GroupOrder, "reaches", _unbounded_reaches)
    assert pruned == _results(graphs)  # names, members, module paths, edges, bytes and meta alike


@pytest.mark.parametrize("name", ["mlp", "resnet18"])
def test_zoo_graphs_coarsen_to_the_same_groups(name: str, monkeypatch) -> None:
    from placement_rl.graph.capture import capture_zoo

    g = capture_zoo(name)
    pruned = _results([g])
    monkeypatch.setattr(GroupOrder, "reaches", _unbounded_reaches)
    assert pruned == _results([g])


class _CheckedOrder(GroupOrder):
    """A ``GroupOrder`` that checks after every reordering that each edge runs forward in it, and counts them."""

    moved = {"after": 0, "before": 0}

    def place_after(self, c, feeders) -> None:
        self._checked("after", super().place_after, c, feeders)

    def place_before(self, c, consumers) -> None:
        self._checked("before", super().place_before, c, consumers)

    def _checked(self, side: str, repair, c, groups) -> None:
        old = list(self.pos)
        repair(c, groups)
        if self.pos != old:
            self.moved[side] += 1
        bad = [(x, y) for x in range(len(self.succ)) for y in self.succ[x] if self.pos[x] >= self.pos[y]]
        assert not bad, f"edges against the order: {bad[:5]}"


def test_the_order_stays_topological_through_joins_folds_and_merges(monkeypatch) -> None:
    monkeypatch.setattr(coarsen, "GroupOrder", _CheckedOrder)
    monkeypatch.setattr(_CheckedOrder, "moved", {"after": 0, "before": 0})
    for g in list(_graphs())[:8]:
        for opts in OPTIONS:
            coarsen.coarsen(g, **opts)
    assert min(_CheckedOrder.moved.values()) > 5, _CheckedOrder.moved  # both repairs were needed and checked


def test_searches_visit_far_fewer_groups_than_one_sweep_per_merge(monkeypatch) -> None:
    """5,000 random nodes without module paths, merged down to 500 groups: the unbounded search visited 770,000
    groups here, a count that grows with V * merges; the pruned searches and the order's repairs together visit a
    few per node (about 12,000)."""
    orders: list[GroupOrder] = []

    class Counted(GroupOrder):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            orders.append(self)

    monkeypatch.setattr(coarsen, "GroupOrder", Counted)
    g = _random_dag(5000, 0, kind="local", span=40)  # as the 50,000-node file that did not coarsen in 5 minutes
    c = coarsen.coarsen(g)
    merges = g.num_nodes - c.num_nodes
    visits = sum(o.visits for o in orders)
    assert merges > 4000
    assert visits < 10 * g.num_nodes, (visits, merges)  # V * merges is 22 million
