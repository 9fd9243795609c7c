"""Notes and errors that say why: ``exact``'s note names its fixed cap on the order search as a cap (a larger budget
does not lift it), ``deploy`` of a plan made on a topology file that does not fit the default says it fell back and
how to give the file, and the docs say which rank order ``deploy.json`` and ``export`` use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from placement_rl import baselines
from placement_rl.cost import resolve_costs
from placement_rl.errors import PlanError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

torch.set_num_threads(1)

import tests.test_fix_deploy_report as deploy_report  # noqa: E402

_deploy_cfg = deploy_report._deploy_cfg
mlp = deploy_report.mlp  # the tiny mlp's DP 2 x PP 2 plan on 4x_cpu.yaml (a file, not a preset)

DOCS = Path(__file__).resolve().parents[1] / "docs"


# ------------------------------------------------------------------------------------------ exact's order cap
def test_exact_names_its_fixed_order_cap_as_a_cap_not_as_the_simulations_left(monkeypatch):
    """Every GPU of the DGX-1 is its own class, so every order is over the cap: when the cap, not the budget, bounds
    the order search the note says so (it gave the cap as "the simulations left")."""
    import placement_rl.baselines.pipeline as pipeline

    topo = load_topology("8x_v100_dgx1")
    graph = synthetic.sample("layered", num_nodes=4, seed=0)
    costs = resolve_costs(graph, topo)
    monkeypatch.setattr(pipeline, "EXACT_ORDERS", 300)
    exact = baselines.get_pipeline("exact")(graph, costs, topo, budget=20000, seed=0)
    note = exact.meta["note"]
    assert exact.meta["contiguous_enumerated"] is False and exact.meta["sim_calls"] < 20000 - 300
    assert "fixed cap of 300 simulations" in note and "EXACT_ORDERS" in note and "budget does not raise" in note
    assert "300 simulations left" not in note


def test_exact_gives_the_real_remainder_when_the_budget_bounds_the_order_search():
    topo = load_topology("8x_v100_dgx1")
    graph = synthetic.sample("layered", num_nodes=4, seed=0)
    costs = resolve_costs(graph, topo)
    exact = baselines.get_pipeline("exact")(graph, costs, topo, budget=2000, seed=0)
    note = exact.meta["note"]
    assert "simulations left" in note and "fixed cap" not in note


# ------------------------------------------------------------------------------- deploy's topology fallback
def test_a_plan_on_a_topology_file_that_misfits_the_default_says_why_the_default_was_used(mlp, monkeypatch):
    """The plan names '4x_cpu' (a file, not a preset) and uses cpu2 and cpu3: deploy falls back to 2x_cpu, and the
    one-line error now says so and asks for topology.path=<its YAML>."""
    import placement_rl.cli.deploy as deploy

    folder, _ = mlp
    monkeypatch.setattr(deploy, "task_overrides", lambda: [f"plan={folder / 'plan.json'}"])
    with pytest.raises(PlanError) as err:
        deploy.run(_deploy_cfg(f"plan={folder / 'plan.json'}", "steps=2", "warmup=0"))
    text = str(err.value)
    assert "which topology '2x_cpu' lacks" in text and "\n" not in text
    assert "'4x_cpu', which is not a preset, so deploy fell back to the default '2x_cpu'" in text
    assert "topology.path=<its YAML>" in text


def test_a_topology_the_user_gave_gets_no_fallback_hint(mlp, monkeypatch):
    import placement_rl.cli.deploy as deploy

    folder, _ = mlp
    given = [f"plan={folder / 'plan.json'}", "topology=2x_cpu"]
    monkeypatch.setattr(deploy, "task_overrides", lambda: given)
    with pytest.raises(PlanError) as err:
        deploy.run(_deploy_cfg(*given, "steps=2", "warmup=0"))
    assert "lacks" in str(err.value) and "fell back" not in str(err.value)


# ----------------------------------------------------------------------------------------- rank orders, docs
def test_the_docs_say_which_rank_order_deploy_and_export_use(mlp):
    """deploy.json's rank_devices is replica-major, export's header pipeline-rank-major; both docs say so, and the
    replica-major order is what plan_layout writes for the DP 2 x PP 2 plan [[cpu3, cpu1], [cpu2, cpu0]]."""
    from placement_rl.cli.deploy import plan_layout
    from placement_rl.graph.ir import CompGraph
    from placement_rl.plans import load_plan

    folder, topo_path = mlp
    topo = load_topology(str(topo_path))
    graph = CompGraph.from_json(folder / "graph.json")
    plan = load_plan(str(folder / "plan.json"), topology=topo, graph=graph)
    assert plan_layout(plan, graph, topo)["rank_devices"] == ["cpu3", "cpu2", "cpu1", "cpu0"]
    deploy_md = " ".join((DOCS / "deploy.md").read_text().split())
    export_md = " ".join((DOCS / "export.md").read_text().split())
    assert "in deploy's rank order: DP replica outermost, then the pipeline rank, TP innermost" in deploy_md
    assert "header lists the same plan's devices in the trainers' order instead (pipeline rank outermost" in deploy_md
    assert "`plan_layout.rank_devices` lists the same plan's devices in another order" in export_md
    assert "DP replica outermost, then the pipeline rank" in export_md


def test_evaluate_of_a_plan_on_a_topology_file_says_it_fell_back_too(mlp, monkeypatch, tmp_path):
    from omegaconf import OmegaConf

    import placement_rl.cli.evaluate as evaluate
    import placement_rl.cli.given as given
    from placement_rl.cli.common import _compose

    folder, _ = mlp
    args = [f"plan={folder / 'plan.json'}", "placers=[single_device]", "pipeline=false", "budget=8",
            "progress=false"]
    monkeypatch.setattr(given, "task_overrides", lambda: args[:1])
    monkeypatch.setattr(evaluate, "output_dir", lambda: tmp_path)
    cfg, _ = _compose("evaluate", args, [])
    with pytest.raises(PlanError) as err:
        evaluate.run(OmegaConf.create(cfg))
    text = str(err.value)
    assert "lacks" in text and "\n" not in text
    assert "which is not a preset, so evaluate fell back to the default" in text
