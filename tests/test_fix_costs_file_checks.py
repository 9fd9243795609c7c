"""Checks on a costs file (``cost.costs_file``) and a profile read as one: parameters kept with ``memory``, names
that are not names, duplicate keys and edges, edge times on one device, implausible times, and a profile of the
same model at another batch size."""

from __future__ import annotations

import json

import numpy as np
import pytest

from placement_rl.cost.costs_file import load_costs
from placement_rl.errors import ProfileError
from placement_rl.topology import load_topology

from tests.test_costs_file import costs_doc, graph4, write
from tests.test_pipe_hetero import mixed_topology


def _refused(path, graph, topo, *parts: str) -> str:
    """The one-line error ``load_costs`` gives, checked to name the file and each of ``parts``."""
    with pytest.raises(ProfileError) as exc:
        load_costs(path, graph, topo)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg, msg
    for part in parts:
        assert part in msg, msg
    return msg


def test_memory_keeps_the_graphs_parameters_for_the_gradient_sync(tmp_path):
    doc = costs_doc()
    doc["nodes"]["a"]["memory"] = {"gpu": 2.0e6}
    g, _ = load_costs(write(tmp_path, doc), graph4(), mixed_topology(2))
    assert g.act_bytes[0] == 2.0e6
    np.testing.assert_array_equal(g.param_bytes, graph4().param_bytes)  # was 0 for 'a': DP synced no gradient


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["edges"].append({"src": ["a"], "dst": "b", "bytes": 1}), "edges[2]: 'src' must be a node name"),
    (lambda d: d["edges"].append({"src": "a", "dst": {"b": 1}, "bytes": 1}), "edges[2]: 'dst' must be a node name"),
    (lambda d: d.update(colocate=[[["a"]]]), "colocate[0]: each entry must be a node name"),
    (lambda d: d.update(colocate="a"), "'colocate' must be a list of node-name lists"),
])
def test_a_list_where_a_name_belongs_is_one_line(tmp_path, edit, field):
    doc = costs_doc()
    edit(doc)
    _refused(write(tmp_path, doc), graph4(), mixed_topology(2), field)


def test_duplicate_keys_and_edges_are_refused(tmp_path):
    topo, g = mixed_topology(2), graph4()
    text = json.dumps(costs_doc())
    node = '"a": {"fwd": {"gpu": 1.0, "cpu": 10.0}, "bwd": {"gpu": 2.0, "cpu": 20.0}}'
    assert node in text
    dup_node = tmp_path / "dup_node.json"
    dup_node.write_text(text.replace(node, node + ", " + node.replace("1.0", "99.0"), 1))
    _refused(dup_node, g, topo, "key 'a' is given twice")
    dup_inner = tmp_path / "dup_inner.json"
    dup_inner.write_text(text.replace('"gpu": 1.0,', '"gpu": 1.0, "gpu": 99999,', 1))
    _refused(dup_inner, g, topo, "key 'gpu' is given twice")
    yml = write(tmp_path, costs_doc(), "c.yaml")
    lines = yml.read_text().splitlines(keepends=True)
    at = lines.index("  a:\n")
    dup_yaml = tmp_path / "dup.yaml"
    dup_yaml.write_text("".join(lines[:at + 6] + lines[at:]))  # node 'a' (6 lines in safe_dump's layout) twice
    _refused(dup_yaml, g, topo, "key 'a' is given twice")
    doc = costs_doc()
    doc["edges"].append({"src": "a", "dst": "b", "bytes": 9e9})
    _refused(write(tmp_path, doc), g, topo, "edges[2]: edge a -> b is given twice (also edges[0])")


def test_an_edge_time_on_one_device_keeps_the_graphs_bytes(tmp_path):
    """No transfers on one device: the time is checked, not turned into infinite bytes."""
    topo, g = load_topology("1x_v100_pcie_32gb"), graph4()
    g2, c = load_costs(write(tmp_path, costs_doc()), g, topo)
    assert g2.edge_bytes[0] == 3e5 and g2.edge_bytes[2] == g.edge_bytes[2] and np.isfinite(g2.edge_bytes).all()
    doc = costs_doc()
    doc["edges"][1]["time"] = -1
    _refused(write(tmp_path, doc), g, topo, "edges[1]", "time must be a number >= 0")


def test_implausible_times_in_a_costs_file_are_a_warning(tmp_path, capsys):
    topo, g = mixed_topology(2), graph4()
    load_costs(write(tmp_path, costs_doc()), g, topo)
    assert "warning" not in capsys.readouterr().err
    load_costs(write(tmp_path, costs_doc(time_unit="s")), g, topo)  # milliseconds read as seconds
    err = capsys.readouterr().err
    assert "times over 10000 x the topology's estimate" in err and "time_unit ('s')" in err
    doc = costs_doc()  # 100 x every forward time: a unit mistake, under 1e4 x the estimate per node
    for entry in doc["nodes"].values():
        entry["fwd"] = {k: v * 100 for k, v in entry["fwd"].items()}
    load_costs(write(tmp_path, doc), g, topo)
    err = capsys.readouterr().err
    assert "most forward times are over 300 x" in err and "a unit mistake?" in err and "over 10000" not in err, err
    doc = costs_doc()
    doc["nodes"]["b"]["fwd"] = {"gpu": 0, "cpu": 0}
    load_costs(write(tmp_path, doc), g, topo)
    assert "a forward time of 0 for a node with FLOPs: b" in capsys.readouterr().err


def _profile(tmp_path, graph, topo, *, batch: bool = True):
    """A profile of ``graph`` on ``topo``'s devices, as ``placement-rl profile`` writes one (on another host)."""
    from placement_rl.profiling.db import ProfileDB

    db = ProfileDB()
    for dev in topo.devices:
        db.data["devices"][dev.name] = {"torch_device": dev.torch_device, "kind": dev.kind, "host": "elsewhere",
                                        "threads": 1, "model": dev.name}
        for i, node in enumerate(graph.names):
            db.put_node(graph, dev.name, node, [1e-3 * (i + 1)], [2e-3 * (i + 1)])
    if not batch:  # written before entries recorded their batch
        for entry in db.data["graphs"].values():
            entry.pop("batch_size")
    return db.save(tmp_path / "profile.json")


def _at_batch(batch: int):
    g = graph4()
    scale = batch / 8
    return g.replace(fwd_flops=g.fwd_flops * scale, bwd_flops=g.bwd_flops * scale, act_bytes=g.act_bytes * scale,
                     meta={**dict(g.meta), "batch_size": batch})


def test_a_profile_at_another_batch_is_refused_for_a_coarsened_graph(tmp_path):
    """Matched by node names alone, a batch-8 profile priced the batch-16 graph with its batch-8 times."""
    from placement_rl.graph.coarsen import coarsen

    topo = mixed_topology(2)
    path = _profile(tmp_path, _at_batch(8), topo)
    same = coarsen(_at_batch(8), max_nodes=2)
    _, c = load_costs(path, same, topo)  # the profiled capture: a group's time is its members' sum
    assert c.source[0].startswith("measured:") and c.fwd_time[:, 0].sum() == pytest.approx(1e-3 * (1 + 2 + 3 + 4))
    double = coarsen(_at_batch(16), max_nodes=2)
    _refused(path, double, topo, "the profile was taken at batch 8, graph", "is at batch 16")
    old = _profile(tmp_path, _at_batch(8), topo, batch=False)
    _refused(old, double, topo, "were taken on another capture", "batch 16")


def test_inference_costs_in_train_mode_name_the_file_and_the_fix():
    import numpy as np

    from placement_rl.cost.modes import for_mode
    from placement_rl.cost.types import CostTable
    from placement_rl.errors import ConfigError

    costs = CostTable(fwd_time=np.ones((2, 1)), bwd_time=np.zeros((2, 1)), link_latency=np.zeros((1, 1)),
                      link_bandwidth=np.full((1, 1), np.inf), source=("measured:c.json",),
                      meta={"mode": "inference", "costs_file": "c.json"})
    with pytest.raises(ConfigError, match=r"these costs \(c.json\) were prepared for inference .* price with "
                                          r"mode=inference"):
        for_mode(costs, "train")
