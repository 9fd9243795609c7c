"""Coarsening that serialises a wide graph (no module paths, merged down to the target) is said: placements and
bounds of the groups were silently 5x slower than the nodes' on a 10,000-node graph file."""

from __future__ import annotations

import json
import logging
import random

from placement_rl.graph.ir import CompGraph
from placement_rl.graph.spec import graph_from_spec, longest_path


def _wide(tmp_path, n: int = 1500) -> str:
    """A random DAG as a graph file from another tool: no module paths, each node fed by 1-3 of the 50 before it."""
    rng = random.Random(n)
    nodes = [{"name": f"op{i}", "fwd_flops": (f := rng.uniform(1e6, 5e9)), "bwd_flops": 2 * f, "param_bytes": 0,
              "act_bytes": 0, "out_bytes": rng.uniform(1e3, 4e7)} for i in range(n)]
    edges = sorted({(rng.randrange(max(0, i - 50), i), i) for i in range(1, n)
                    for _ in range(rng.choice([1, 1, 2, 3]))})
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({"schema": "placement_rl.graph", "version": 1, "name": "wide", "nodes": nodes,
                                "edges": [[a, b, nodes[a]["out_bytes"]] for a, b in edges]}))
    return str(path)


def test_a_coarsening_that_serialises_the_graph_is_said(tmp_path, caplog):
    path = _wide(tmp_path)
    fine = graph_from_spec({"path": path})
    with caplog.at_level(logging.WARNING, logger="placement_rl.graph.spec"):
        coarse = graph_from_spec({"path": path, "coarsen": {"enabled": True}})
    assert coarse.num_nodes <= 500 < fine.num_nodes
    assert longest_path(coarse) >= 2 * longest_path(fine)  # what the warning is about
    said = [r.getMessage() for r in caplog.records if "longest path" in r.getMessage()]
    assert len(said) == 1 and "from 1500 nodes to" in said[0] and "graph.coarsen.enabled=false" in said[0], said


def test_a_zoo_model_coarsened_by_its_modules_is_not_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="placement_rl.graph.spec"):
        graph_from_spec({"source": "zoo", "name": "mlp", "coarsen": {"enabled": True}})
    assert not [r for r in caplog.records if "longest path" in r.getMessage()]


def test_the_longest_path_by_hand():
    nodes = [{"name": x, "fwd_flops": f, "bwd_flops": 0, "param_bytes": 0, "act_bytes": 0, "out_bytes": 1}
             for x, f in (("a", 1), ("b", 5), ("c", 2), ("d", 1))]
    g = CompGraph.from_json(json.dumps({"schema": "placement_rl.graph", "version": 1, "name": "d", "nodes": nodes,
                                        "edges": [[0, 1, 1], [0, 2, 1], [1, 3, 1], [2, 3, 1]]}))
    assert longest_path(g) == 7.0  # a -> b -> d
