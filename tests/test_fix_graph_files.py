"""Graph files: costs a float cannot hold and edge bytes that are not numbers are one-line errors, and the graph's
own checks name the file; ``inspect`` of a coarsened graph counts op types over its ops; ``maxload`` searches on no
more devices of a kind than colour classes (same answers) and summarises long load lists; plot titles in a script
the font lacks draw without glyph warnings."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from placement_rl.errors import GraphError
from placement_rl.graph.ir import CompGraph

COSTS = dict(fwd_flops=1e9, bwd_flops=2e9, out_bytes=4e6, param_bytes=0, act_bytes=4e6)


def _graph(nodes=3, edges=((0, 1, 1e6), (1, 2, 1e6))) -> dict:
    return {"schema": "placement_rl.graph", "version": 1, "name": "g",
            "nodes": [dict(name=f"n{i}", **COSTS) for i in range(nodes)], "edges": [list(e) for e in edges]}


def _write(tmp_path, data, name="g.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_an_integer_cost_too_large_for_a_float_is_a_one_line_error(tmp_path):
    data = _graph()
    data["nodes"][2]["fwd_flops"] = 10**400
    path = _write(tmp_path, data)
    with pytest.raises(GraphError, match=r"node 'n2' \(#2\) has invalid fwd_flops=1000000000.*\(401 digits\): costs "
                                         "must be finite") as exc:
        CompGraph.from_json(path)
    assert str(exc.value).startswith(f"{path}: ") and len(str(exc.value)) < 200
    text = json.dumps(_graph()).replace('"fwd_flops": 1000000000.0', '"fwd_flops": ' + "9" * 5000, 1)
    with pytest.raises(GraphError, match="too many digits"):  # past Python's limit for parsing an integer
        CompGraph.from_json(_write(tmp_path, text, "long.json"))
    with pytest.raises(GraphError, match=r"edge #0 \[100000000000\.\.\. \(31 digits\), 1\] is dangling"):
        CompGraph.from_json(_write(tmp_path, _graph(edges=((10**30, 1, 0),)), "far.json"))


@pytest.mark.parametrize("value", ["1e6", True, None, -5, float("inf")])
def test_edge_bytes_that_are_not_a_finite_number_are_refused(tmp_path, value):
    data = _graph(edges=((0, 1, 1e6), (1, 2, 1e6)))
    data["edges"][1][2] = value
    text = json.dumps(data).replace("Infinity", "1e400")  # JSON's way to write a float too large
    with pytest.raises(GraphError, match=r"edge #1 'n1' -> 'n2' has invalid edge_bytes=.*: edge bytes must be "
                                         "finite and non-negative numbers") as exc:
        CompGraph.from_json(_write(tmp_path, text))
    assert str(exc.value).startswith(str(tmp_path))


@pytest.mark.parametrize("edges, message", [
    (((0, 1, 1), (0, 1, 2)), "duplicate edge #1 'n0' -> 'n1'"),
    (((0, 1, 1), (1, 0, 1)), "graph has a cycle"),
    (((1, 1, 1),), "edge #0 'n1' -> 'n1' is a self-loop"),
])
def test_the_graphs_own_checks_name_the_file(tmp_path, edges, message):
    data = _graph(nodes=2, edges=edges)
    path = _write(tmp_path, data)
    with pytest.raises(GraphError) as exc:
        CompGraph.from_json(path)
    assert str(exc.value).startswith(f"{path}: {message}")
    with pytest.raises(GraphError) as exc:  # a JSON string names no file
        CompGraph.from_json(json.dumps(data))
    assert str(exc.value).startswith(message)
    data = _graph(nodes=2, edges=())
    data["nodes"][1]["name"] = "n0"
    with pytest.raises(GraphError, match=f"^{path}: duplicate node name 'n0'"):
        CompGraph.from_json(_write(tmp_path, data))


def _layered():
    """Four blocks of a linear (9 GFLOP), a matmul (1 GFLOP) and a relu (0.1 GFLOP), module path per block."""
    from placement_rl.graph.ir import make_graph

    nodes, edges = [], []
    for b in range(4):
        for k, (op, flops, params) in enumerate((("linear", 9e9, 1e6), ("matmul", 1e9, 0), ("relu", 1e8, 0))):
            nodes.append(dict(name=f"b{b}.{op}", op_type=op, module_path=f"block{b}", fwd_flops=flops,
                              bwd_flops=2 * flops, out_bytes=1e6, param_bytes=params, act_bytes=1e6))
            if len(nodes) > 1:
                edges.append((len(nodes) - 2, len(nodes) - 1, 1e6))
    return make_graph(nodes, edges, name="layered")


def test_inspect_of_a_coarsened_graph_counts_the_ops_and_both_traffics():
    from placement_rl.cli.inspect import summarize
    from placement_rl.graph.coarsen import coarsen

    g = _layered()
    plain = summarize(g).splitlines()
    assert plain[4] == "  edge traffic 11.00 MB" and plain[5] == "  top op types (by forward FLOPs):"
    assert plain[6].split() == ["linear", "4", "nodes", "89.11%", "of", "FLOPs"]
    c = coarsen(g, depth=1, target=(1, 500))
    assert c.num_nodes == 4 and set(c.op_types) == {"linear"}  # each group is named after its linear
    lines = summarize(c).splitlines()
    assert lines[1:4] == [x.replace("nodes/groups 12   edges 11", "nodes/groups 4   edges 3") for x in plain[1:4]]
    assert lines[4] == "  edge traffic 11.00 MB between the ops, 3.00 MB between the 4 groups"
    assert lines[5] == "  top op types of the 12 ops (by forward FLOPs):"
    assert [x.split()[:3] + [x.split()[3]] for x in lines[6:]] == [
        ["linear", "4", "ops", "89.11%"], ["matmul", "4", "ops", "9.90%"], ["relu", "4", "ops", "0.99%"]]
    bare = c.replace(meta={k: v for k, v in c.meta.items() if k != "member_graph"})  # written before it was kept
    lines = summarize(bare).splitlines()
    assert lines[4] == "  edge traffic 3.00 MB between the 4 groups"
    assert "groups (each counted as its costliest op's type" in lines[5]
    assert lines[6].split()[:4] == ["linear", "4", "groups", "100.00%"]


def _maxload_instance(tmp_path, acc, cpus=1, name="inst.json", seed=3):
    from placement_rl.baselines.maxload_instances import random_instance
    from placement_rl.graph.maxload_file import read_instance

    path = tmp_path / name
    path.write_text(json.dumps(random_instance(seed, n=7, acc=acc, cpus=cpus)))
    return path, read_instance(path)


def test_maxload_searches_on_no_more_devices_than_classes_with_the_same_answer(tmp_path, monkeypatch):
    from placement_rl.baselines import maxload_solve
    from placement_rl.baselines.maxload import evaluate
    from placement_rl.baselines.maxload_blocks import blocks_of
    from placement_rl.baselines.maxload_latency import latency_of, solve_latency

    _, many = _maxload_instance(tmp_path, 1000, cpus=50, name="many.json")
    k = blocks_of(many, contiguous=False).count
    _, few = _maxload_instance(tmp_path, k, cpus=k, name="few.json")
    seen = []
    for name in ("contiguous_dp", "improve"):
        real = getattr(maxload_solve, name)
        monkeypatch.setattr(maxload_solve, name, lambda inst, *a, _real=real, **kw: (
            seen.append((inst.accelerators, inst.cpus)), _real(inst, *a, **kw))[1])
    wide, narrow = maxload_solve.solve(many, seconds=0.2), maxload_solve.solve(few, seconds=0.2)
    assert set(seen) == {(k, k)}  # the search never sees the 1000 accelerators nor the 50 cores
    assert wide.contiguous.max_load == narrow.contiguous.max_load and wide.lower_bound == narrow.lower_bound
    assert wide.best.max_load == pytest.approx(narrow.best.max_load, rel=1e-12)
    assert any("searched on 7 accelerators and 7 CPU cores of the 1000 and 50" in n for n in wide.notes)
    for split in (wide.contiguous, wide.best):  # on the instance's own devices: CPU cores after its accelerators
        loads, broken = evaluate(many, split.device)
        assert len(split.loads) == 1050 and np.array_equal(split.loads, loads) and not broken
        assert ((split.device < k) | (split.device >= 1000)).all()
    assert np.array_equal(np.where(wide.contiguous.device >= 1000, wide.contiguous.device - 1000 + k,
                                   wide.contiguous.device), narrow.contiguous.device)  # the same split
    lat = solve_latency(many, seconds=0)
    assert lat.latency == solve_latency(few, seconds=0).latency == latency_of(many, lat.device)


def test_maxload_summarises_a_long_load_list(tmp_path, capsys):
    from placement_rl.cli.maxload import main

    path, inst = _maxload_instance(tmp_path, 1000)
    main([str(path), "--seconds", "0"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("contiguous split"))
    assert "1000 accelerators: " in line and " at 0, the others [" in line and "0, 0, 0" not in line
    assert len(line) < 300
    path, _ = _maxload_instance(tmp_path, 2, name="two.json")
    main([str(path), "--seconds", "0"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("contiguous split"))
    assert "(accelerators [" in line and "CPU cores [" in line  # short lists as before
    path, _ = _maxload_instance(tmp_path, 0, cpus=2, name="cpus.json")
    main([str(path), "--seconds", "0"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("contiguous split"))
    assert "(CPU cores [" in line and "accelerators" not in line


def test_a_title_the_font_cannot_draw_warns_nothing(tmp_path):
    from placement_rl.cost.types import Interval
    from placement_rl.report import gantt

    timeline = [Interval(kind="fwd", resource="gpu0", start=0.0, end=1e-3)]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        path = gantt(timeline, tmp_path / "t.png", title="模型 on 4x_v100_pcie")
    assert path.is_file() and not [w for w in got if "Glyph" in str(w.message)]
