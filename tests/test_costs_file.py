"""Measured costs from a file (``cost.costs_file``): reading, validation, restrictions, and the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from placement_rl import baselines
from placement_rl.cost import simulate, simulate_pipeline
from placement_rl.cost.costs_file import load_costs
from placement_rl.errors import ProfileError
from placement_rl.graph.ir import make_graph
from placement_rl.plans import StagePlan

from tests.test_cli import _one_line, cli
from tests.test_pipe_hetero import mixed_topology


def graph4():
    nodes = [dict(name=n, fwd_flops=1e9, bwd_flops=2e9, param_bytes=1e6, act_bytes=1e5) for n in "abcd"]
    return make_graph(nodes, [("a", "b", 1e5), ("a", "c", 1e5), ("b", "d", 2e5), ("c", "d", 2e5)], name="g4")


def costs_doc(**over):
    doc = {"schema": "placement_rl.costs", "version": 1, "time_unit": "ms",
           "nodes": {n: {"fwd": {"gpu": 1.0 + k, "cpu": 10.0 + k}, "bwd": {"gpu": 2.0, "cpu": 20.0}}
                     for k, n in enumerate("abcd")},
           "edges": [{"src": "a", "dst": "b", "bytes": 3e5}, {"src": "b", "dst": "d", "time": 0.5}]}
    doc.update(over)
    return doc


def write(tmp_path: Path, doc, name: str = "costs.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    return p


def test_costs_file_gives_per_kind_times_edge_bytes_and_units(tmp_path):
    topo = mixed_topology(2)
    g, c = load_costs(write(tmp_path, costs_doc()), graph4(), topo)
    np.testing.assert_allclose(c.fwd_time[:, 0], [1e-3, 2e-3, 3e-3, 4e-3])
    np.testing.assert_allclose(c.fwd_time[:, 2], [10e-3, 11e-3, 12e-3, 13e-3])
    np.testing.assert_allclose(c.bwd_time[1], [2e-3, 2e-3, 20e-3])
    assert g.edge_bytes[0] == 3e5
    lat, bw = topo.link_latency[0, 1], topo.link_bandwidth[0, 1]
    assert g.edge_bytes[2] == pytest.approx((0.5e-3 - lat) * bw)  # a measured time becomes bytes on time_link
    assert c.source[0].startswith("measured:costs.json")
    gy, cy = load_costs(write(tmp_path, costs_doc(), "costs.yaml"), graph4(), topo)  # YAML reads the same
    np.testing.assert_allclose(cy.fwd_time, c.fwd_time)


def test_restrictions_and_colocation_are_kept_by_simulators_and_exact(tmp_path):
    topo = mixed_topology(2)
    doc = costs_doc(colocate=[["b", "c"]])
    doc["nodes"]["a"]["devices"] = ["gpu0"]
    g, c = load_costs(write(tmp_path, doc), graph4(), topo)
    bad = simulate(g, c, topo, [1, 0, 0, 0])
    assert not bad.feasible and "may run only on gpu0" in bad.meta["restriction_errors"][0]
    split = simulate(g, c, topo, [0, 0, 1, 1])
    assert not split.feasible and "colocated nodes b, c" in split.meta["restriction_errors"][0]
    assert simulate(g, c, topo, [0, 1, 1, 1]).feasible
    plan = StagePlan(stage_of_node=[0, 1, 0, 1], stage_devices=((0,), (1,)), num_microbatches=1)
    assert not simulate_pipeline(g, c, topo, plan).feasible
    best = baselines.get_pipeline("exact")(g, c, topo, budget=500, seed=0)
    assert best.meta["feasible"] and best.stage_of_node[1] == best.stage_of_node[2]
    assert all(d == 0 for d in best.stage_devices[best.stage_of_node[0]])


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema="other"), "field 'schema' is 'other'"),
    (lambda d: d.update(time_unit="h"), "time_unit is 'h'"),
    (lambda d: d["nodes"].pop("c"), "node 'c' of graph 'g4' has no entry"),
    (lambda d: d["nodes"].update(z={"fwd": 1.0, "bwd": 1.0}), "node 'z' is not in graph 'g4'"),
    (lambda d: d["nodes"]["a"].update(fwd={"gpu": 1.0}), "has no entry for device 'cpu'"),
    (lambda d: d["nodes"]["a"].pop("bwd"), "has no 'bwd' time"),
    (lambda d: d["nodes"]["a"].update(fwd={"gpu": -1, "cpu": 1}), "must be a number >= 0"),
    (lambda d: d["edges"].append({"src": "a", "dst": "d", "bytes": 1}), "has no edge a -> d"),
    (lambda d: d["edges"].append({"src": "a", "dst": "b"}), "exactly one of 'bytes' or 'time'"),
    (lambda d: d.update(colocate=[["a", "q"]]), "colocate[0] names 'q'"),
    (lambda d: d["nodes"]["a"].update(devices=["tpu0"]), "device 'tpu0' is not in topology"),
])
def test_bad_costs_file_is_one_line(tmp_path, edit, message):
    doc = costs_doc()
    edit(doc)
    with pytest.raises(ProfileError, match=None) as exc:
        load_costs(write(tmp_path, doc), graph4(), mixed_topology(2))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_inference_costs_file_needs_no_backward(tmp_path):
    doc = costs_doc(mode="inference")
    for entry in doc["nodes"].values():
        entry.pop("bwd")
    g, c = load_costs(write(tmp_path, doc), graph4(), mixed_topology(2))
    assert c.meta["mode"] == "inference" and not c.bwd_time.any()


@pytest.fixture
def case_files(tmp_path):
    graph_path = tmp_path / "g.json"
    graph4().to_json(graph_path)
    topo_path = tmp_path / "t.yaml"
    topo_path.write_text(yaml.safe_dump(mixed_topology(2).to_dict()))
    doc = costs_doc()
    return graph_path, write(tmp_path, doc, "c.json"), topo_path


@pytest.mark.slow
def test_cli_evaluate_inference_with_a_costs_file_end_to_end(tmp_path, case_files):
    g, c, t = case_files
    r = cli(tmp_path, "evaluate", f"graph.path={g}", f"costs.path={c}", f"topology.path={t}", "mode=inference",
            "placers=[single_device,round_robin]", "budget=50", "progress=false")
    assert r.returncode == 0, r.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["mode"] == ["inference"]
    rows = {row["placer"]: row for row in metrics["rows"]}
    assert rows["single_device"]["step_time_ms"] == pytest.approx(1 + 2 + 3 + 4)  # forward only, on a GPU
    assert rows["exact"]["feasible"] and "measured:c.json" in (tmp_path / "run" / "comparison.md").read_text()
    r2 = cli(tmp_path, "evaluate", f"graph.path={g}", f"costs.path={c}", f"topology.path={t}",
             "objective=throughput", "placers=[single_device]", "budget=50", "progress=false", run="thr")
    assert r2.returncode == 0, r2.stderr


def test_cli_bad_costs_file_is_one_line_exit_2(tmp_path, case_files):
    g, c, t = case_files
    doc = json.loads(c.read_text())
    doc["nodes"].pop("b")
    c.write_text(json.dumps(doc))
    line = _one_line(cli(tmp_path, "evaluate", f"graph.path={g}", f"costs.path={c}", f"topology.path={t}"))
    assert "node 'b' of graph 'g4' has no entry" in line
    assert not (tmp_path / "run" / "metrics.json").exists()
    line = _one_line(cli(tmp_path, "evaluate", f"graph.path={g}", f"costs.path={tmp_path}/none.json",
                         f"topology.path={t}", run="none"))
    assert "does not exist" in line


def test_a_profile_written_by_placement_rl_profile_is_a_costs_file(tmp_path):
    """A ``placement_rl.profile`` file (what ``placement-rl profile`` writes) read through ``load_costs``."""
    from placement_rl.profiling.db import ProfileDB

    topo = mixed_topology(2)
    g = graph4()
    db = ProfileDB()
    for k, dev in enumerate(topo.devices):  # recorded on another host: resolved by name and kind
        db.data["devices"][dev.name] = {"torch_device": dev.torch_device, "kind": dev.kind, "host": "elsewhere",
                                        "threads": 1, "model": dev.name}
        for i, node in enumerate(g.names):
            db.put_node(g, dev.name, node, [1e-3 * (i + 1) * (k + 1)], [2e-3 * (i + 1)])
    path = db.save(tmp_path / "profile.json")
    g2, c = load_costs(path, g, topo)
    assert g2 is g and c.source[0].startswith("measured:")
    np.testing.assert_allclose(c.fwd_time[:, 1], 2e-3 * np.arange(1, 5))
    # a profile of another graph gives none of its times: a one-line error, never the estimates in silence
    other = g.replace(fwd_flops=g.fwd_flops * 2, name="other")
    with pytest.raises(ProfileError,
                       match=r"the profile has no times for graph 'other' .* \(it holds graph g4 on") as err:
        load_costs(path, other, topo)
    assert "\n" not in str(err.value)


def test_build_costs_reads_costs_path_and_mode_for_every_command(tmp_path):
    """The helper ``evaluate``, ``place``, ``train`` and ``deploy`` price plans with."""
    from omegaconf import OmegaConf

    from placement_rl.cli.costs import build_costs

    topo, g = mixed_topology(2), graph4()
    path = write(tmp_path, costs_doc())
    g2, c = build_costs(OmegaConf.create({"costs": {"path": str(path)}, "mode": "inference"}), g, topo)
    assert c.meta["mode"] == "inference" and not c.bwd_time.any() and c.fwd_time[0, 0] == pytest.approx(1e-3)
    assert g2.edge_bytes[0] == 3e5
    g3, est = build_costs(OmegaConf.create({"costs": {"path": None}}), g, topo)
    assert g3 is g and est.meta.get("mode", "train") == "train" and est.bwd_time.any()


def test_yaml_as_the_docs_write_it(tmp_path):
    """docs/costs_file.md writes ``param_bytes: 4.0e6``, which YAML 1.1 reads as a string (refused: "must be a number
    >= 0, got '4.0e6'"), and ``memory: {gpu: 2.0e6}`` on a cluster with a CPU (refused: no entry for the CPU, though
    the largest entry given is what counts)."""
    text = write(tmp_path, costs_doc(), "c.yaml").read_text()
    p = tmp_path / "doc.yaml"
    p.write_text(text.replace("  a:\n", "  a:\n    param_bytes: 4.0e6\n    memory: {gpu: 2.0e6}\n", 1))
    assert yaml.safe_load(p.read_text())["nodes"]["a"]["param_bytes"] == "4.0e6"  # the case: a string
    g, _ = load_costs(p, graph4(), mixed_topology(2))
    assert g.param_bytes[0] == 4.0e6 and g.act_bytes[0] == 2.0e6
    with pytest.raises(ProfileError, match="param_bytes must be a number >= 0, got 'lots'"):
        p.write_text(text.replace("  a:\n", "  a:\n    param_bytes: lots\n", 1))
        load_costs(p, graph4(), mixed_topology(2))


def test_a_costs_file_of_the_captured_graph_on_a_coarsened_one_says_so(tmp_path):
    """The CLI coarsens by default, so a file keyed by the graph file's node names met a graph of groups: the error
    named a missing node and not why."""
    from placement_rl.graph.coarsen import coarsen

    g = graph4()
    merged = coarsen(g, max_nodes=2)
    assert merged.members is not None and set(merged.names) != set(g.names)
    with pytest.raises(ProfileError, match="this graph is coarsened.*graph.coarsen.enabled=false"):
        load_costs(write(tmp_path, costs_doc()), merged, mixed_topology(2))


def test_a_coarsening_that_only_renamed_nodes_is_said_too(tmp_path):
    """Coarsening by module path renames a lone node after its module (``layer0`` -> ``encoder``) without merging
    it: the file's names are missing all the same."""
    g = graph4()
    renamed = make_graph([{"name": f"group{i}", "members": [nm], "fwd_flops": float(g.fwd_flops[i])}
                          for i, nm in enumerate(g.names)], [(int(u), int(v), float(b)) for (u, v), b in
                                                            zip(g.edges.tolist(), g.edge_bytes)])
    with pytest.raises(ProfileError, match="this graph is coarsened.*graph.coarsen.enabled=false"):
        load_costs(write(tmp_path, costs_doc()), renamed, mixed_topology(2))
