"""Coarsening: acyclic results, conserved totals, cycle refusal, edge bytes, placement expansion."""

from __future__ import annotations

import time

import networkx as nx
import numpy as np
import pytest

from placement_rl.errors import GraphError
from placement_rl.graph import CompGraph, coarsen, make_graph, synthetic
from placement_rl.graph.ir import NODE_ARRAYS

P = 1000.0  # parameter bytes of a "heavy" op in hand-built graphs


def _node(name: str, path: str, *, params: float = P, flops: float = 1e6, out: float = 100.0, op: str = "linear"):
    return {"name": name, "module_path": path, "op_type": op, "fwd_flops": flops, "bwd_flops": 2 * flops,
            "out_bytes": out, "param_bytes": params, "act_bytes": out}


def _assert_conserved(g: CompGraph, c: CompGraph) -> None:
    t, tc = g.totals(), c.totals()
    for key in NODE_ARRAYS:
        assert tc[key] == pytest.approx(t[key], rel=1e-12), key
    flat = [m for grp in c.members for m in grp]
    assert sorted(flat) == sorted(g.names if g.members is None else [m for grp in g.members for m in grp])
    assert len(flat) == len(set(flat))
    assert (c.edges[:, 0] < c.edges[:, 1]).all()  # groups are numbered in a topological order


def _naive_quotient_has_cycle(g: CompGraph, labels: list[str]) -> bool:
    q = nx.DiGraph()
    q.add_nodes_from(set(labels))
    q.add_edges_from((labels[s], labels[d]) for s, d in g.edges.tolist() if labels[s] != labels[d])
    return not nx.is_directed_acyclic_graph(q)


def test_module_used_twice_is_split_not_cyclic() -> None:
    # a (shared) -> b (other) -> c (shared again): grouping {a, c} would make shared <-> other a cycle.
    g = make_graph([_node("a", "shared"), _node("b", "other"), _node("c", "shared")],
                   [["a", "b", 10], ["b", "c", 10]])
    assert _naive_quotient_has_cycle(g, ["shared", "other", "shared"])
    c = coarsen.coarsen(g, depth=1)
    assert c.num_nodes == 3
    assert c.names == ("shared#0", "other", "shared#1")
    assert c.members == (("a",), ("b",), ("c",))
    assert c.module_paths == ("shared", "other", "shared")
    _assert_conserved(g, c)


def test_residual_around_shared_module_refused() -> None:
    # x(A) -> y(B) -> z(A) with residual x -> z: naive A = {x, z} closes A -> B -> A.
    g = make_graph([_node("x", "blk.a.lin"), _node("y", "blk.b.lin"), _node("z", "blk.a.lin"),
                    _node("w", "blk.a.lin")],
                   [["x", "y", 10], ["y", "z", 10], ["x", "z", 10], ["z", "w", 10]])
    assert _naive_quotient_has_cycle(g, ["blk.a", "blk.b", "blk.a", "blk.a"])
    c = coarsen.coarsen(g, depth=2)
    assert c.members == (("x",), ("y",), ("z", "w"))
    # At depth 1 everything is one module and one group.
    assert coarsen.coarsen(g, depth=1).members == (("x", "y", "z", "w"),)


def test_param_free_fold_prefers_producer_but_refuses_cycles() -> None:
    # relu r has producers a (M, sends most bytes) and b (N); M -> N, so r cannot join M.
    g = make_graph([_node("a", "M"), _node("b", "N"), _node("r", "", params=0, op="relu"),
                    _node("s", "", params=0, op="relu"), _node("t", "T")],
                   [["a", "b", 10], ["a", "r", 500], ["b", "r", 10], ["a", "s", 500], ["r", "t", 1], ["s", "t", 1]])
    c = coarsen.coarsen(g, depth=1)
    groups = {m: name for name, grp in zip(c.names, c.members) for m in grp}
    assert groups["r"] == groups["b"] == "N"
    assert groups["s"] == groups["a"] == "M"  # s folds into its only producer
    assert groups["t"] == "T"
    _assert_conserved(g, c)
    # Without folding, parameter-free ops with no module path stay alone.
    assert coarsen.coarsen(g, depth=1, fold_param_free=False).num_nodes == 5


def test_param_free_source_folds_into_consumer() -> None:
    g = make_graph([_node("inp", "", params=0, op="input"), _node("l1", "m1"), _node("l2", "m2")],
                   [["inp", "l1", 8], ["l1", "l2", 8]])
    c = coarsen.coarsen(g, depth=1)
    assert c.members == (("inp", "l1"), ("l2",))
    assert c.op_types == ("linear", "linear")


def test_edge_bytes_count_a_tensor_once_per_consumer_group() -> None:
    # u's single output (100 B) read by v1 and v2 of one group: 100 B cross, not 200.
    # m is multi-output (300 B = 100 + 200 to different consumers): both parts cross.
    nodes = [_node("u", "A", out=100), _node("m", "A", out=300, params=0, op="split"),
             _node("v1", "B"), _node("v2", "B"), _node("w", "B")]
    g = make_graph(nodes, [["u", "m", 100], ["u", "v1", 100], ["u", "v2", 100], ["m", "v2", 100], ["m", "w", 200],
                           ["v1", "w", 100]])
    c = coarsen.coarsen(g, depth=1)
    assert c.names == ("A", "B")
    assert c.edges.tolist() == [[0, 1]]
    assert c.edge_bytes.tolist() == [100.0 + 300.0]
    # Parallel edges merge into one edge; the op type is the most expensive member's.
    nodes[3] = _node("v2", "B", flops=1e9, op="conv2d")
    c = coarsen.coarsen(make_graph(nodes, [list(e) for e in zip(g.edges[:, 0].tolist(), g.edges[:, 1].tolist(),
                                                                  g.edge_bytes.tolist())]), depth=1)
    assert c.op_types == ("linear", "conv2d")


def test_random_module_paths_stay_acyclic_and_conserve() -> None:
    rng = np.random.default_rng(0)
    for seed in range(15):
        g = synthetic.sample(["layered", "series_parallel"][seed % 2], num_nodes=400, seed=seed)
        # Scramble module paths: modules "used" all over the graph, the worst case for cycles.
        paths = [f"m{rng.integers(6)}.s{rng.integers(4)}.x{rng.integers(3)}" for _ in range(g.num_nodes)]
        g = g.replace(module_paths=tuple(paths))
        for depth in (1, 2, 3):
            for fold in (True, False):
                c = coarsen.coarsen(g, depth=depth, fold_param_free=fold)  # CompGraph validates acyclicity
                _assert_conserved(g, c)


@pytest.mark.parametrize("family", synthetic.families())
def test_synthetic_default_and_max_nodes(family: str) -> None:
    g = synthetic.sample(family, num_nodes=1500, seed=5)
    c = coarsen.coarsen(g)
    assert 30 <= c.num_nodes <= 500
    _assert_conserved(g, c)
    assert c.meta["coarsen"]["source_nodes"] == 1500
    for cap in (40, 7, 1):
        m = coarsen.coarsen(g, max_nodes=cap)
        assert m.num_nodes <= cap
        _assert_conserved(g, m)
    assert coarsen.coarsen(g).to_json() == c.to_json()  # deterministic, stable names


def test_target_controls_automatic_depth() -> None:
    g = synthetic.sample("transformer_like", num_nodes=800, seed=1)
    small = coarsen.coarsen(g, target=(5, 60))
    big = coarsen.coarsen(g, target=(150, 300))
    assert 5 <= small.num_nodes <= 60 and 150 <= big.num_nodes <= 300
    assert small.meta["coarsen"]["depth"] < big.meta["coarsen"]["depth"] or big.meta["coarsen"]["depth"] == "node"


def test_tiny_graph_keeps_one_group_per_node() -> None:
    g = make_graph([_node("a", "x"), _node("b", "x")], [["a", "b", 1]])
    c = coarsen.coarsen(g)
    assert c.num_nodes == 2  # fewer nodes than target[0]: the finest grouping wins
    assert coarsen.coarsen(g, depth=1).num_nodes == 1


def test_expand_placement_round_trip_and_recoarsening() -> None:
    g = synthetic.sample("cnn_like", num_nodes=700, seed=2)
    c = coarsen.coarsen(g)
    dev = np.arange(c.num_nodes) % 3
    full = coarsen.expand_placement(c, dev)
    assert full.shape == (g.num_nodes,)
    for gi, grp in enumerate(c.members):
        assert all(full[g.index[m]] == dev[gi] for m in grp)
    # Survives JSON, and a coarsened graph can be coarsened again (members stay original names).
    c2 = CompGraph.from_json(c.to_json())
    assert np.array_equal(coarsen.expand_placement(c2, dev), full)
    cc = coarsen.coarsen(c, max_nodes=10)
    _assert_conserved(g, cc)
    dev2 = np.arange(cc.num_nodes)
    full2 = coarsen.expand_placement(cc, dev2)
    owner = {m: gi for gi, grp in enumerate(cc.members) for m in grp}
    assert full2.tolist() == [owner[nm] for nm in g.names]
    with pytest.raises(GraphError, match="one device per group"):
        coarsen.expand_placement(c, dev[:-1])
    with pytest.raises(GraphError, match="no members"):
        coarsen.expand_placement(g, np.zeros(g.num_nodes, dtype=int))


def test_bad_options_are_graph_errors() -> None:
    g = synthetic.sample("layered", num_nodes=20, seed=0)
    for kwargs, word in [({"depth": 0}, "depth"), ({"max_nodes": 0}, "max_nodes"),
                         ({"target": (10, 5)}, "target"), ({"target": "x"}, "target")]:
        with pytest.raises(GraphError, match=word):
            coarsen.coarsen(g, **kwargs)
    with pytest.raises(GraphError, match="CompGraph"):
        coarsen.coarsen("graph.json")  # type: ignore[arg-type]


def test_5000_nodes_in_seconds() -> None:
    """A guard against a quadratic step (about 0.5 s here; the figure is the benchmark's), loose for a loaded CI."""
    g = synthetic.sample("layered", num_nodes=5000, seed=0)
    g.topo_order  # noqa: B018 - CSR/topological caches are the graph's, not coarsening's
    t0 = time.perf_counter()
    c = coarsen.coarsen(g)
    coarsen.coarsen(g, max_nodes=50)
    assert time.perf_counter() - t0 < 10.0
    _assert_conserved(g, c)


def _check_zoo_default(name: str) -> None:
    from placement_rl.graph.capture import capture_zoo

    g = capture_zoo(name)
    c = coarsen.coarsen(g)
    _assert_conserved(g, c)
    assert 30 <= c.num_nodes <= 500, (name, g.num_nodes, c.num_nodes, c.meta["coarsen"])
    dev = np.arange(c.num_nodes) % 2
    assert coarsen.expand_placement(c, dev).shape == (g.num_nodes,)


@pytest.mark.parametrize("name", ["mlp", "resnet18"])
def test_zoo_default_coarsening_small_models(name: str) -> None:
    _check_zoo_default(name)


@pytest.mark.slow
def test_zoo_default_coarsening_every_model() -> None:
    from placement_rl.graph import zoo

    for name in zoo.names():
        _check_zoo_default(name)


@pytest.mark.parametrize("preset", ["1x_h100_sxm", "2x_cpu"])
def test_a_group_is_priced_as_the_sum_of_its_members(preset: str) -> None:
    """A coarsened group costs its members' sum on every device (calibrated GPU model, roofline CPU): priced as
    one op of its dominant class, a transformer block's group came out 1.2-1.6x its members. The record survives
    the JSON round trip; a graph changed since it was coarsened falls back to pricing the groups themselves."""
    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.topology import load_topology

    topo = load_topology(preset)
    g = synthetic.sample("transformer_like", num_nodes=300, seed=3)
    c = coarsen.coarsen(g)
    assert c.num_nodes < g.num_nodes
    fine, gof = coarsen.member_graph(c)
    assert fine.fingerprint() == g.fingerprint()
    cf, cc = resolve_costs(g, topo), resolve_costs(c, topo)
    for j in range(topo.num_devices):
        for what in ("fwd_time", "bwd_time", "launch_overhead"):
            want = np.bincount(gof, weights=getattr(cf, what)[:, j], minlength=c.num_nodes)
            assert np.allclose(getattr(cc, what)[:, j], want, rtol=1e-12), what
    one = simulate(c, cc, topo, np.zeros(c.num_nodes, dtype=np.int64)).step_time
    assert one == pytest.approx(simulate(g, cf, topo, np.zeros(g.num_nodes, dtype=np.int64)).step_time, rel=1e-9)
    back = CompGraph.from_json(c.to_json())
    assert np.array_equal(resolve_costs(back, topo).fwd_time, cc.fwd_time)
    changed = c.replace(fwd_flops=c.fwd_flops * 0.5)  # e.g. split for tensor parallelism
    assert coarsen.member_graph(changed) is None
    assert coarsen.member_graph(g) is None and coarsen.coarsen(c).meta["member_graph"] is c.meta["member_graph"]


def test_a_coarsened_file_is_merged_further_when_max_nodes_asks(tmp_path) -> None:
    """graph.path=<a graph.json the tool wrote> graph.coarsen.max_nodes=10: the groups are merged down to 10 (the
    option was ignored on a coarsened file), members still name the original ops and pricing still sums them."""
    from placement_rl.cost import resolve_costs
    from placement_rl.graph.spec import graph_from_spec
    from placement_rl.topology import load_topology

    g = synthetic.sample("transformer_like", num_nodes=300, seed=3)
    c = coarsen.coarsen(g)
    path = tmp_path / "graph.json"
    c.to_json(path)
    same = graph_from_spec({"path": str(path), "coarsen": {"enabled": True, "max_nodes": None}})
    assert same.num_nodes == c.num_nodes
    m = graph_from_spec({"path": str(path), "coarsen": {"enabled": True, "max_nodes": 10}})
    assert m.num_nodes <= 10
    _assert_conserved(g, m)
    topo = load_topology("1x_h100_sxm")
    assert resolve_costs(m, topo).fwd_time.sum() == pytest.approx(resolve_costs(g, topo).fwd_time.sum(), rel=1e-9)
