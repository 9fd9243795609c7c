"""A plan file brings its graph (the graph.json beside it) and its topology preset to ``evaluate plan=`` as to
``deploy``, unless the command line names others."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import torch
from omegaconf import OmegaConf

from placement_rl.cli.given import overridden, plan_graph
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

from tests.test_cli import tiny_graph_object  # noqa: E402 - three nodes, one fork

torch.set_num_threads(1)


def test_which_overrides_name_a_group():
    assert overridden(["topology=2x_cpu"], "topology") and overridden(["topology.devices.0.count=6"], "topology")
    assert overridden(["+topology@x=y"], "topology") and overridden(None, "topology")
    assert not overridden(["topology_seed=3", "budget=8"], "topology") and not overridden([], "graph")


def test_the_graph_beside_the_plan_unless_one_is_named(tmp_path):
    tiny_graph_object().to_json(tmp_path / "graph.json")
    cfg = OmegaConf.create({"graph": {"source": "zoo", "name": "mlp"}})
    assert plan_graph(cfg, str(tmp_path / "plan.json"), []).num_nodes == 3
    assert plan_graph(cfg, str(tmp_path / "plan.json"), ["graph=mlp"]).num_nodes != 3


def test_evaluate_a_plan_alone_takes_its_graph_and_topology(tmp_path):
    """With only ``plan=``, evaluate priced the default graph on the default topology and refused the plan."""
    topo, tiny = load_topology("2x_k80"), tiny_graph_object()
    tiny.to_json(tmp_path / "graph.json")
    StagePlan(np.zeros(3, dtype=np.int64), ((0, 1),)).to_json(tmp_path / "plan.json", graph=tiny, topology=topo)
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "evaluate", f"plan={tmp_path / 'plan.json'}",
                        "placers=[single_device]", "pipeline=false", "budget=8", "progress=false",
                        f"hydra.run.dir={tmp_path}/run"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "evaluating on topology '2x_k80', the one the plan names" in r.stdout
    md = (tmp_path / "run" / "comparison.md").read_text()
    assert f"| {tiny.name}/2x_k80 |" in md and "| given:plan.json |" in md
