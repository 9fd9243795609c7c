"""Synthetic DAG families: exact sizes, determinism, one source and one sink, realistic costs."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.errors import GraphError
from placement_rl.graph import CompGraph, coarsen, synthetic

FAMILIES = synthetic.families()


def test_families_listed() -> None:
    assert {"layered", "series_parallel", "transformer_like", "cnn_like"} <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_nodes", [3, 10, 57, 500, 5000])
def test_exact_size_single_source_and_sink(family: str, num_nodes: int) -> None:
    g = synthetic.sample(family, num_nodes=num_nodes, seed=7)
    assert g.num_nodes == num_nodes
    indeg = np.bincount(g.edges[:, 1], minlength=num_nodes)
    outdeg = np.bincount(g.edges[:, 0], minlength=num_nodes)
    assert np.flatnonzero(indeg == 0).tolist() == [0] and g.op_types[0] == "input"
    assert np.flatnonzero(outdeg == 0).tolist() == [num_nodes - 1] and g.op_types[-1] == "cross_entropy"
    # Node indices are a topological (program) order.
    assert (g.edges[:, 0] < g.edges[:, 1]).all()
    g.validate()


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_json_different_seed_differs(family: str) -> None:
    a = synthetic.sample(family, num_nodes=300, seed=3).to_json()
    b = synthetic.sample(family, num_nodes=300, seed=3).to_json()
    c = synthetic.sample(family, num_nodes=300, seed=4).to_json()
    assert a == b
    assert a != c
    assert CompGraph.from_json(a).fingerprint() == synthetic.sample(family, num_nodes=300, seed=3).fingerprint()


@pytest.mark.parametrize("family", FAMILIES)
def test_costs_look_like_captured_models(family: str) -> None:
    g = synthetic.sample(family, num_nodes=2000, seed=11)
    heavy = np.isin(g.op_types, synthetic.HEAVY)
    param_ops = np.isin(g.op_types, synthetic.PARAM_OPS)
    # Parameters only on parameter ops (heavy ops and norms); attention matmuls have none.
    assert (g.param_bytes[~param_ops] == 0).all()
    assert (g.param_bytes[param_ops] > 0).all()
    assert heavy.any() and (~heavy).sum() > heavy.sum() / 2
    pos = g.fwd_flops[g.fwd_flops > 0]
    assert pos.min() >= 1e5 and pos.max() <= 1e11
    # Heavy ops dominate compute.
    assert np.median(g.fwd_flops[heavy]) > 10 * np.median(g.fwd_flops[~heavy & (g.fwd_flops > 0)])
    body = g.out_bytes[:-1]
    assert body.min() >= 1e3 and body.max() <= 1e8 and g.out_bytes[-1] == 4.0
    # Backward ~2x forward for parameter/heavy ops, ~1x otherwise.
    two = heavy | param_ops
    ratio = g.bwd_flops[g.fwd_flops > 0] / g.fwd_flops[g.fwd_flops > 0]
    assert np.allclose(ratio[two[g.fwd_flops > 0]], 2.0, rtol=0.3)
    assert np.allclose(ratio[~two[g.fwd_flops > 0]], 1.0, rtol=0.3)
    # Edges carry the producer's output; act_bytes are the op's input bytes.
    assert np.array_equal(g.edge_bytes, g.out_bytes[g.edges[:, 0]])
    has_act = g.act_bytes > 0
    in_bytes = np.bincount(g.edges[:, 1], weights=g.edge_bytes, minlength=g.num_nodes)
    assert np.allclose(g.act_bytes[has_act], in_bytes[has_act])
    # Hierarchical module paths, so coarsening has something to group by.
    assert sum("." in p for p in g.module_paths) > g.num_nodes // 2


@pytest.mark.parametrize("family", FAMILIES)
def test_sizes_10_to_5000_validate_and_coarsen(family: str) -> None:
    for n in (10, 31, 128, 999, 5000):
        g = synthetic.sample(family, num_nodes=n, seed=n)
        c = coarsen.coarsen(g)
        assert sum(len(m) for m in c.members) == n
        if n >= 30:
            assert 30 <= c.num_nodes <= 500


def test_bad_input_is_a_graph_error() -> None:
    with pytest.raises(GraphError, match="layered"):
        synthetic.sample("nope", num_nodes=10, seed=0)
    with pytest.raises(GraphError, match="num_nodes"):
        synthetic.sample("layered", num_nodes=2, seed=0)
    with pytest.raises(GraphError, match=r"num_nodes must be an integer in \[3, 1000000\]"):  # not minutes of silence
        synthetic.sample("layered", num_nodes=10**8, seed=0)
    with pytest.raises(GraphError, match="seed"):
        synthetic.sample("layered", num_nodes=10, seed=1.5)  # type: ignore[arg-type]
