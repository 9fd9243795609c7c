"""Measured costs files, what a user sweep left: a file at another batch than the graph's priced every row the
same way, keys for kinds the topology lacks, edge times below the latency, the cost source in ``evaluate``'s
outputs, ``deploy`` given both a profile and a costs file, and a profile's CPU pricing a CPU of unnamed model."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from placement_rl.cost import simulate, simulate_pipeline
from placement_rl.cost.costs_file import _profile_label, load_costs
from placement_rl.devices import Device
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import make_graph
from placement_rl.plans import Placement, StagePlan
from placement_rl.topology import load_topology

from tests.test_fix_scale_profile import profile_of

torch.set_num_threads(1)

TOPOLOGY = {"name": "my2", "devices": [{"name": "gpu", "count": 2, "kind": "gpu", "torch_device": "cuda",
                                        "model": "V100-PCIe-32GB", "host": 0, "peak_flops": 14.0e12,
                                        "mem_bandwidth": 900.0e9, "memory_bytes": 34359738368}],
            "links": {"intra_host": {"bandwidth": 1.0e9, "latency": 1.0e-3, "kind": "pcie"}}}


def chain():
    """a -> b -> c, captured at batch 8."""
    g = make_graph([{"name": n, "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 1e6, "act_bytes": 1e6,
                     "out_bytes": 1e6} for n in "abc"], [[0, 1, 1e6], [1, 2, 1e6]], name="chain3")
    return dataclasses.replace(g, meta={"batch_size": 8})


def costs_doc(**over) -> dict:
    """The sweep's chain file in ms: fwd 10 / 30 / 5, bwd twice that, edge bytes a -> b, edge time b -> c."""
    doc = {"schema": "placement_rl.costs", "version": 1, "time_unit": "ms",
           "nodes": {n: {"fwd": {"gpu": t}, "bwd": {"gpu": 2 * t}} for n, t in zip("abc", (10, 30, 5))},
           "edges": [{"src": "a", "dst": "b", "bytes": 4e6}, {"src": "b", "dst": "c", "time": 3}]}
    doc.update(over)
    return doc


@pytest.fixture
def files(tmp_path):
    """(graph.json, topology.yaml) of the sweep's chain on two V100s joined by 1 GB/s, 1 ms."""
    chain().to_json(tmp_path / "chain.json")
    (tmp_path / "topo2.yaml").write_text(yaml.safe_dump(TOPOLOGY))
    return tmp_path / "chain.json", tmp_path / "topo2.yaml"


def write(tmp_path: Path, doc: dict, name: str = "c.json") -> Path:
    (tmp_path / name).write_text(json.dumps(doc))
    return tmp_path / name


def topo2(files):
    return load_topology(files[1])


# ------------------------------------------------------------------------ 2: batch_size != the graph's batch
def test_a_file_of_another_batch_prices_placements_and_stage_plans_at_the_graph_s(tmp_path, files, capsys):
    """Op placements took the batch-4 times as they were while stage plans rescaled them to batch 8, so the speed-up
    column compared a batch-8 DP step with a batch-4 single-device step (0.96 x instead of 1.93 x)."""
    topo = topo2(files)
    g, c = load_costs(write(tmp_path, costs_doc(batch_size=4)), chain(), topo)
    assert "scaled by 2 to batch 8" in capsys.readouterr().err
    assert c.meta["batch_size"] == 8 and c.meta["measured_batch_size"] == 4
    single = simulate(g, c, topo, Placement([0, 0, 0])).step_time
    assert single == pytest.approx(0.270)  # (45 + 90) ms at batch 4, twice that at 8
    dp = StagePlan(stage_of_node=[0, 0, 0], stage_devices=((0, 1),), num_microbatches=1, batch_size=8)
    step = simulate_pipeline(g, c, topo, dp).step_time
    assert step == pytest.approx(0.140)  # as before: two batch-4 replicas (135 ms) + the 5 ms gradient sync
    assert single / step == pytest.approx(1.93, abs=0.01)
    same, at8 = load_costs(write(tmp_path, costs_doc(batch_size=8)), chain(), topo)
    assert simulate(same, at8, topo, Placement([0, 0, 0])).step_time == pytest.approx(0.135)


def test_evaluate_s_speed_up_compares_one_batch(tmp_path, files, monkeypatch):
    rows, _ = _evaluate(tmp_path, files, costs_doc(batch_size=4), ["placers=[single_device,dp]"], monkeypatch)
    got = {r.placer: r for r in rows}
    assert got["single_device"].step_time == pytest.approx(0.270)
    assert got["dp"].speedup == pytest.approx(1.93, abs=0.01)


# ------------------------------------------------------------ 8: kinds the topology lacks, times below latency
def test_a_kind_the_topology_lacks_is_ignored_in_times_and_memory_with_one_warning(tmp_path, files, capsys):
    """``memory: {tpu: 1e15}`` made every placement on an all-GPU topology infeasible while ``fwd: {tpu: 1}`` was
    ignored: both are ignored now, and one line names the kind."""
    doc = costs_doc()
    doc["nodes"]["a"]["fwd"]["tpu"] = 1
    doc["nodes"]["b"]["memory"] = {"tpu": 1e15}
    doc["nodes"]["c"]["memory"] = {"tpu": 1e15, "gpu": 3e6}
    topo = topo2(files)
    g, c = load_costs(write(tmp_path, doc), chain(), topo)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(err) == 1 and "'tpu' match no device of topology 'my2'" in err[0] and "ignored" in err[0]
    assert list(g.act_bytes) == [1e6, 1e6, 3e6]  # the graph's where no kind applies; the topology's kind else
    assert simulate(g, c, topo, Placement([0, 0, 0])).feasible
    load_costs(write(tmp_path, costs_doc()), chain(), topo)
    assert "warning" not in capsys.readouterr().err  # keys by kind, name or model of the topology: no line


def test_an_edge_time_below_the_link_latency_warns(tmp_path, files, capsys):
    doc = costs_doc(edges=[{"src": "a", "dst": "b", "bytes": 4e6}, {"src": "b", "dst": "c", "time": 0.5}])
    g, _ = load_costs(write(tmp_path, doc), chain(), topo2(files))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"warning: {tmp_path / 'c.json'}: edges[1] b -> c time 0.5 ms is below time_link's latency (1 ms):"
                   " priced as 0 bytes; give the edge's 'bytes' instead"]
    assert g.edge_bytes[1] == 0.0


# ------------------------------------------------------------------------------- 9: the cost source recorded
def test_evaluate_records_the_cost_source_in_metrics_and_the_csv(tmp_path, files, monkeypatch):
    _, out = _evaluate(tmp_path, files, costs_doc(), ["placers=[single_device]", "pipeline=false"], monkeypatch)
    want = "gpu0=measured:c.json, gpu1=measured:c.json"
    assert json.loads((out / "metrics.json").read_text())["cost_source"] == want
    rows = list(csv.DictReader(open(out / "comparison.csv")))
    assert rows and all(r["cost_source"] == want for r in rows)


def _evaluate(tmp_path, files, doc, extra, monkeypatch):
    """``evaluate suite=single`` on the chain with ``doc`` as costs.path, in this process: (rows, run folder)."""
    from placement_rl.cli import evaluate
    from placement_rl.cli.common import _compose

    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setattr(evaluate, "output_dir", lambda: out)
    cfg, _ = _compose("evaluate", ["suite=single", f"graph.path={files[0]}", f"topology.path={files[1]}",
                                   f"costs.path={write(tmp_path, doc)}", "budget=10", "progress=false", *extra], [])
    return evaluate.run(OmegaConf.create(cfg)), out


# ------------------------------------------------------------------------- 10: deploy given both sources
def test_deploy_refuses_a_profile_and_a_costs_file_together(tmp_path):
    from placement_rl.cli import deploy
    from placement_rl.cli.common import _compose

    cfg, _ = _compose("deploy", [f"plan={tmp_path / 'placement.json'}", "profile=p.json", "costs.path=c.json"], [])
    with pytest.raises(ConfigError, match=r"^profile=p.json and costs.path=c.json both price the prediction: give "
                                          "one of the two$"):
        deploy.run(OmegaConf.create(cfg))


# --------------------------------------------------------------------- 12: a profile's CPU, another CPU
def test_a_profiled_cpu_pricing_a_cpu_of_another_or_no_model_is_said(tmp_path, capsys):
    """A one-thread profile priced cpu_2gpu's 20-core Xeon, which names no model, without a word. Where the topology
    names the model the label says it; where it names none, a note line says when the times are far off the
    topology's estimate (not for a profile that matches it: 2x_cpu on the machine it describes)."""
    from placement_rl.graph import synthetic

    graph = synthetic.sample("layered", num_nodes=6, seed=0)
    db = profile_of(graph, load_topology("2x_cpu"))  # times: 2x_cpu's estimates
    db.data["devices"]["cpu"]["model"] = "AMD EPYC 7B13"
    path = db.save(tmp_path / "p.json")
    _, costs = load_costs(path, graph, load_topology("cpu_2gpu"))  # its CPU names no model
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert len(err) == 1 and "the profile's CPU times (AMD EPYC 7B13) are typically" in err[0], err
    assert "x the estimate for cpu, whose model topology 'cpu_2gpu' does not name: likely another CPU" in err[0]
    assert costs.source[0].startswith("measured:p.json:cpu (AMD EPYC 7B13, 1 thread")
    load_costs(path, graph, load_topology("2x_cpu"))
    assert "note:" not in capsys.readouterr().err
    xeon = Device(name="cpu", kind="cpu", torch_device="cpu", peak_flops=3e12, mem_bandwidth=1.3e11,
                  memory_bytes=2e11, model="Xeon Gold 6148")
    assert _profile_label("measured:p.json:cpu", db, xeon, "topology") == \
        "measured:p.json:cpu (AMD EPYC 7B13, 1 thread, pricing cpu, a Xeon Gold 6148; links: topology)"
