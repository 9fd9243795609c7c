"""The plan files ``place`` and ``evaluate`` write name the cost source that priced them (``meta.cost_source``, device
by device as metrics.json's), so a plan file says which cost model, profile and precision its step time is for."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from placement_rl.cli import place
from placement_rl.cli.common import _compose
from placement_rl.cli.evaluate import _write_best
from placement_rl.cost import resolve_costs
from placement_rl.evaluate import compare
from placement_rl.topology import load_topology

from tests.test_cli import tiny_graph_object  # noqa: E402 - three nodes, one fork

torch.set_num_threads(1)

H100X2_BF16 = """name: h100x2_bf16
dtype: bf16
devices:
  - {name: h, count: 2, model: H100}
links:
  intra_host: {bandwidth: 450e9, latency: 5.0e-6, kind: nvlink}
"""
BF16 = "h0=calibrated:neusight-v2:bf16, h1=calibrated:neusight-v2:bf16"


@pytest.fixture
def topo_path(tmp_path):
    path = tmp_path / "h100x2_bf16.yaml"
    path.write_text(H100X2_BF16)
    return path


def test_place_writes_the_cost_source_in_its_plan_files(tmp_path, topo_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setattr(place, "output_dir", lambda: out)
    cfg, _ = _compose("place", ["graph=synthetic", "graph.num_nodes=10", f"topology.path={topo_path}",
                                "progress=false", "samples=0", "compare=false", "search_budget=8"], [])
    metrics = place.run(OmegaConf.create(cfg))
    assert metrics["cost_source"] == BF16
    for name in ("placement.json", "search/placement.json"):
        assert json.loads((out / name).read_text())["meta"] == {"cost_source": BF16}, name


def test_evaluate_best_files_name_the_cost_source(tmp_path, topo_path):
    graph, topo = tiny_graph_object(), load_topology(str(topo_path))
    costs = resolve_costs(graph, topo)
    rows = compare(graph, costs, topo, budget=16, seed=3, placers=["single_device", "heft"], partitioners=["dp"])
    files: list[str] = []
    _write_best(rows, graph, costs, topo, tmp_path, files)
    assert files == ["best_placement/placement.json", "best_plan/plan.json"]
    for name in files:
        meta = json.loads((tmp_path / name).read_text())["meta"]
        assert meta["cost_source"] == BF16 and meta["placer"] and meta["mode"] == "train", name
