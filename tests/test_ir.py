"""CompGraph: validation errors name what to fix, exact JSON round trip, structure arrays."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

from placement_rl.graph import CompGraph, GraphError, make_graph, synthetic
from placement_rl.graph.io import graph_to_dict


def diamond(**changes) -> CompGraph:
    nodes = [{"name": "in", "op_type": "placeholder", "fwd_flops": 0.0, "out_bytes": 4096.0},
             {"name": "left", "op_type": "linear", "module_path": "a", "fwd_flops": 1.5e9, "bwd_flops": 3e9,
              "param_bytes": 4e6, "act_bytes": 4096.0, "out_bytes": 2048.0},
             {"name": "right", "op_type": "relu", "module_path": "b", "fwd_flops": 1e3, "bwd_flops": 1e3,
              "act_bytes": 4096.0, "out_bytes": 4096.0},
             {"name": "loss", "op_type": "cross_entropy", "fwd_flops": 10.0, "bwd_flops": 10.0, "out_bytes": 4.0}]
    edges = [[0, 1, 4096.0], [0, 2, 4096.0], [1, 3, 2048.0], [2, 3, 4096.0]]
    g = make_graph(nodes, edges, name="diamond", meta={"source": "test"})
    return g.replace(**changes) if changes else g


def as_json(g: CompGraph) -> dict:
    return json.loads(g.to_json())


def test_structure_arrays():
    g = diamond()
    assert g.num_nodes == 4 and g.num_edges == 4
    assert g.topo_order.tolist() == [0, 1, 2, 3]
    assert sorted(g.predecessors(3).tolist()) == [1, 2]
    assert sorted(g.successors(0).tolist()) == [1, 2]
    for i in range(g.num_nodes):  # edge ids in CSR order point at the right edges
        for k in range(g.pred_ptr[i], g.pred_ptr[i + 1]):
            assert g.edges[g.pred_eid[k]].tolist() == [int(g.pred_idx[k]), i]
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg) and nxg.nodes[1]["op_type"] == "linear"
    assert nxg.edges[0, 1]["bytes"] == 4096.0
    assert g.totals()["fwd_flops"] == pytest.approx(1.5e9 + 1e3 + 10)


def test_json_round_trip_is_exact():
    g = synthetic.sample("layered", num_nodes=300, seed=3)
    text = g.to_json()
    back = CompGraph.from_json(text)
    assert back.to_json() == text
    assert back.fingerprint() == g.fingerprint()
    for key in ("fwd_flops", "bwd_flops", "out_bytes", "param_bytes", "act_bytes", "edge_bytes"):
        assert np.array_equal(getattr(back, key), getattr(g, key))
    assert np.array_equal(back.edges, g.edges) and back.names == g.names and back.meta == g.meta


def test_json_file_round_trip(tmp_path):
    g = diamond()
    path = tmp_path / "g.json"
    g.to_json(path)
    assert CompGraph.from_json(path).to_json() == g.to_json()
    assert not list(tmp_path.glob(".*tmp"))  # atomic write left no temporary file


def test_fingerprint_tracks_structure_and_sizes_not_name():
    g = diamond()
    assert g.replace(name="other").fingerprint() == g.fingerprint()
    assert g.replace(out_bytes=g.out_bytes * 2).fingerprint() != g.fingerprint()


def test_arrays_are_read_only():
    g = diamond()
    with pytest.raises(ValueError):
        g.fwd_flops[0] = 1.0


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["edges"].append([3, 0, 8]), r"cycle: 'in' -> 'left' -> 'loss' -> 'in'|cycle: .*'loss' -> 'in'"),
    (lambda d: d["edges"].append([1, 9, 8]), r"edge #4 \[1, 9\] is dangling"),
    (lambda d: d["edges"].append([0, 1, 8]), r"duplicate edge #4 'in' -> 'left'"),
    (lambda d: d["edges"].append([2, 2, 8]), r"self-loop"),
    (lambda d: d["nodes"][1].__setitem__("fwd_flops", -1.0), r"node 'left' \(#1\) has invalid fwd_flops=-1"),
    (lambda d: d["nodes"][2].__setitem__("act_bytes", float("nan")), r"node 'right' \(#2\) has invalid act_bytes"),
    (lambda d: d["nodes"][2].__setitem__("out_bytes", "big"), r"node 'right' \(#2\) has invalid out_bytes"),
    (lambda d: d["nodes"][0].pop("param_bytes"), r"node 'in' \(#0\) lacks field 'param_bytes'"),
    (lambda d: d["nodes"][3].__setitem__("name", "left"), r"duplicate node name 'left'"),
    (lambda d: d["edges"][0].__setitem__(2, -5), r"edge #0 'in' -> 'left' has invalid edge_bytes"),
    (lambda d: d["edges"].__setitem__(0, [0, 1]), r"edge #0 must be \[src_index, dst_index, bytes\]"),
    (lambda d: d.__setitem__("version", 99), r"unknown schema version 99"),
    (lambda d: d.__setitem__("schema", "something.else"), r"field 'schema' is 'something.else'"),
    (lambda d: d.__setitem__("nodes", {}), r"field 'nodes' must be a list"),
])
def test_each_graph_error_names_what_to_fix(mutate, match):
    data = as_json(diamond())
    mutate(data)
    with pytest.raises(GraphError, match=match):
        CompGraph.from_json(json.dumps(data, allow_nan=True))


def test_malformed_json_and_missing_file(tmp_path):
    with pytest.raises(GraphError, match=r"malformed JSON at line 1"):
        CompGraph.from_json('{"schema": ')
    with pytest.raises(GraphError, match=r"does not exist"):
        CompGraph.from_json(tmp_path / "missing.json")


def test_constructor_validates_too():
    with pytest.raises(GraphError, match="cycle"):
        make_graph([{"name": "a"}, {"name": "b"}], [[0, 1], [1, 0]])
    with pytest.raises(GraphError, match="no nodes"):
        make_graph([], [])
    with pytest.raises(GraphError, match="names no node"):
        make_graph([{"name": "a"}], [["a", "zz"]])
    with pytest.raises(GraphError, match="field 'fwd_flops' has 1 entries, expected 2"):
        diamond().replace(names=("x", "y"), op_types=("o", "o"), module_paths=("", ""), fwd_flops=[1.0],
                          bwd_flops=[0, 0], out_bytes=[0, 0], param_bytes=[0, 0], act_bytes=[0, 0],
                          edges=np.zeros((0, 2)), edge_bytes=[])


def test_members_round_trip():
    g = diamond(members=(("in",), ("left", "x"), ("right",), ("loss",)))
    back = CompGraph.from_json(g.to_json())
    assert back.members == g.members
    assert graph_to_dict(back)["nodes"][1]["members"] == ["left", "x"]


TP_OK = {"version": 1, "nodes": {"left": "column", "right": "sharded"}, "ar_fwd": {"loss": 12.0}, "ar_bwd": {},
         "pairs": [{"columns": ["left"], "row": "loss"}], "divisors": [4], "heads": {"n_heads": 4}, "vocab": None}


@pytest.mark.parametrize("meta, match", [
    ({"batch_size": "two"}, r"field 'meta.batch_size' must be a positive integer .* got 'two'"),
    ({"batch_size": 0}, r"field 'meta.batch_size' must be a positive integer .* got 0"),
    ({"batch_size": True}, r"field 'meta.batch_size'"),
    ({"batch_size": 2.5}, r"field 'meta.batch_size'"),
    ({"zoo_options": {"batch_size": -4}}, r"field 'meta.zoo_options.batch_size'"),
    ({"zoo_options": "mlp"}, r"field 'meta.zoo_options' must be an object"),
    ({"tp": "yes"}, r"field 'meta.tp' must be an object .* got 'yes'"),
    ({"tp": {**TP_OK, "version": 7}}, r"field 'meta.tp.version' is 7, expected 1"),
    ({"tp": {**TP_OK, "nodes": {"ghost": "column"}}}, r"field 'meta.tp.nodes' names op 'ghost', which the graph"),
    ({"tp": {**TP_OK, "ar_bwd": {"ghost": 4.0}}}, r"field 'meta.tp.ar_bwd' names op 'ghost'"),
    ({"tp": {**TP_OK, "pairs": [{"columns": ["left"], "row": "ghost"}]}}, r"field 'meta.tp.pairs' names op 'ghost'"),
    ({"tp": {**TP_OK, "nodes": {"left": "diagonal"}}}, r"gives op 'left' kind 'diagonal'"),
    ({"tp": {**TP_OK, "ar_fwd": {"loss": "lots"}}}, r"field 'meta.tp.ar_fwd' gives op 'loss' 'lots'"),
    ({"tp": {**TP_OK, "nodes": ["left"]}}, r"field 'meta.tp.nodes' must be an object"),
    ({"tp": {**TP_OK, "divisors": ["x"]}}, r"field 'meta.tp.divisors'"),
    ({"tp": {**TP_OK, "heads": {"n_heads": 0}}}, r"field 'meta.tp.heads'"),
    ({"tp": {**TP_OK, "vocab": "big"}}, r"field 'meta.tp.vocab'"),
])
def test_bad_meta_fields_are_graph_errors(meta, match):
    data = as_json(diamond())
    data["meta"].update(meta)
    with pytest.raises(GraphError, match=match):
        CompGraph.from_json(json.dumps(data))
    with pytest.raises(GraphError, match=match):  # the constructor checks them too
        diamond(meta=meta)


@pytest.mark.parametrize("meta, path", [
    ({"member_graph": {"nodes": [{"fwd_flops": 1.0}, {"fwd_flops": float("nan")}]}},
     r"meta\.member_graph\.nodes\[1\]\.fwd_flops is not a finite number"),
    ({"scale": float("-inf")}, r"meta\.scale is not a finite number"),
])
def test_a_non_finite_number_in_meta_is_one_line_naming_it(meta, path):
    """json reads NaN and Infinity, but a graph is written back as strict JSON (graph.json): a traceback there."""
    data = as_json(diamond())
    data["meta"].update(meta)
    with pytest.raises(GraphError, match=path) as err:
        CompGraph.from_json(json.dumps(data))
    assert "\n" not in str(err.value)


def test_good_meta_fields_are_kept():
    g = CompGraph.from_json(diamond(meta={"batch_size": 8, "zoo_options": {"batch_size": 8}, "tp": TP_OK}).to_json())
    assert g.meta["batch_size"] == 8 and g.meta["tp"] == TP_OK
    assert diamond(meta={"batch_size": None, "tp": None}).meta["batch_size"] is None
    # a coarsened graph's TP annotation names its members (the original ops), not the groups
    coarse = diamond(members=(("in",), ("left", "x"), ("right",), ("loss",)),
                     meta={"tp": {**TP_OK, "nodes": {"x": "column"}}})
    assert coarse.meta["tp"]["nodes"] == {"x": "column"}


@pytest.mark.parametrize("members, match", [
    ((("in",), ("left", "x"), ("right", "x"), ("loss",)),
     r"nodes 'left' \(#1\) and 'right' \(#2\) both list member 'x'"),
    ((("in",), ("left", "x"), ("left", "x"), ("loss",)), r"both list member 'left'"),
    ((("in",), ("left", "left"), ("right",), ("loss",)), r"node 'left' \(#1\) lists member 'left' twice"),
    ((("in",), (), ("right",), ("loss",)), r"node 'left' \(#1\) has empty 'members'"),
])
def test_coarse_nodes_must_not_share_members(members, match):
    data = as_json(diamond())
    for nd, grp in zip(data["nodes"], members):
        nd["members"] = list(grp)
    with pytest.raises(GraphError, match=match):
        CompGraph.from_json(json.dumps(data))


def test_atomic_write_gives_the_mode_open_would(tmp_path):
    import os
    import stat

    from placement_rl.graph.io import atomic_write_text

    old = os.umask(0o022)
    try:
        new = atomic_write_text(tmp_path / "g.json", diamond().to_json())
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        os.chmod(new, 0o640)  # an existing file keeps its mode, as open(path, "w") would leave it
        atomic_write_text(new, "{}")
        assert stat.S_IMODE(new.stat().st_mode) == 0o640 and new.read_text() == "{}"
        os.umask(0o077)
        assert stat.S_IMODE(atomic_write_text(tmp_path / "p.json", "{}").stat().st_mode) == 0o600
    finally:
        os.umask(old)
    assert not list(tmp_path.glob(".*.tmp"))
