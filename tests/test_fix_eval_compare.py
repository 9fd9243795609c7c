"""evaluate: speed-ups over a single device listed anywhere and only between plans that fit, a given plan labelled
as given, and best files that carry their provenance and mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from placement_rl.cli.evaluate import _write_best, table_rows
from placement_rl.cost import resolve_costs
from placement_rl.cost.modes import inference_costs
from placement_rl.evaluate import Row, compare, pipeline_summary, with_speedups
from placement_rl.plans import Placement, StagePlan
from placement_rl.report import markdown_table
from placement_rl.topology import load_topology

from tests.test_cli import tiny_graph_object  # noqa: E402 - three nodes, one fork

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return tiny_graph_object()


def test_speedups_use_a_single_device_listed_after_the_placer(tiny):
    topo = load_topology("2x_k80")
    rows = compare(tiny, resolve_costs(tiny, topo), topo, budget=16, placers=["heft", "single_device"])
    by = {r.placer: r for r in rows}
    assert [r.placer for r in rows] == ["heft", "single_device"]
    assert by["heft"].speedup == pytest.approx(by["single_device"].step_time / by["heft"].step_time)
    assert by["single_device"].speedup == pytest.approx(1.0)


def test_no_speedup_is_shown_where_the_row_or_the_single_device_does_not_fit():
    def row(placer, kind, ms, fits, case="c"):
        return Row(case, placer, kind, ms * 1e-3, float("nan"), fits, 0.0, 1)

    rows = with_speedups([row("single_device", "placement", 1682, False), row("fsdp", "pipeline", 852.3, True),
                          row("local_search", "placement", 1684, False),
                          row("single_device", "placement", 100, True, "d"), row("heft", "placement", 50, True, "d"),
                          row("dp", "pipeline", 40, False, "d")])
    assert rows[1].speedup == pytest.approx(1682 / 852.3)  # the ratio is kept; the tables do not show it
    shown = {(r["case"], r["placer"]): r["speedup"] for r in table_rows(rows)}
    assert all(np.isnan(shown[("c", p)]) for p in ("single_device", "fsdp", "local_search"))
    assert shown[("d", "heft")] == pytest.approx(2.0) and shown[("d", "single_device")] == pytest.approx(1.0)
    assert np.isnan(shown[("d", "dp")])
    md = markdown_table(table_rows(rows), ("placer", "speedup"))
    assert "| fsdp | n/a |" in md and "| heft | 2 |" in md


def test_a_given_plan_is_labelled_given_not_learned(tiny):
    plan = StagePlan(np.zeros(3, dtype=np.int64), ((0, 1),))
    given = Row("c", "given:plan.json", "pipeline", 0.04728, 1.0, True, 0.0, 1, plan=plan)
    cell = pipeline_summary([given])[0]["learned"]
    assert cell.startswith("given:plan.json: 47.28 (S=1 x dp2"), cell
    learned = Row("c", "learned: policy", "pipeline", 0.05, 1.0, True, 0.0, 1, plan=plan)
    assert pipeline_summary([given, learned])[0]["learned"].startswith("50.00 (")


def test_best_files_carry_the_same_provenance_and_the_mode(tiny, tmp_path):
    topo = load_topology("2x_k80")
    train = resolve_costs(tiny, topo)
    for mode, costs in (("train", train), ("inference", inference_costs(train))):
        rows = compare(tiny, costs, topo, budget=16, seed=3, placers=["single_device", "heft"], partitioners=["dp"])
        out = tmp_path / mode
        out.mkdir()
        files: list[str] = []
        got = _write_best(rows, tiny, costs, topo, out, files)
        assert files == ["best_placement/placement.json", "best_plan/plan.json"]
        for kind, name in (("placement", "best_placement/placement.json"), ("pipeline", "best_plan/plan.json")):
            meta = json.loads((out / name).read_text())["meta"]
            best = next(r for r in rows if r.placer == got[kind]["placer"] and r.kind == kind)
            assert meta["placer"] == best.placer and meta["mode"] == mode and meta["feasible"] is True
            assert meta["step_time"] == pytest.approx(best.step_time) and meta["seed"] == 3 and meta["budget"] == 16
            assert "trace" not in meta
        assert Placement.from_json(out / "best_placement" / "placement.json", topology=topo).meta["mode"] == mode


def test_cli_given_plan_is_given_and_its_best_file_says_so(tmp_path, tiny):
    topo = load_topology("2x_k80")
    tiny.to_json(tmp_path / "tiny.json")
    StagePlan(np.zeros(3, dtype=np.int64), ((0, 1),), meta={"placer": "hybrid", "step_time": 1.0}).to_json(
        tmp_path / "plan.json", topology=topo)
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "evaluate", "suite=single",
                        f"graph.path={tmp_path / 'tiny.json'}", "topology=2x_k80", f"plan={tmp_path / 'plan.json'}",
                        "placers=[single_device]", "pipeline=false", "budget=8", "progress=false",
                        f"hydra.run.dir={tmp_path}/run"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "run" / "comparison.md").read_text()
    assert "| learned or given |" in md and "| given:plan.json: " in md
    meta = json.loads((tmp_path / "run" / "best_plan" / "plan.json").read_text())["meta"]
    # the only stage plan, so the best: its own placer kept, priced here
    assert meta["given"] == "plan.json" and meta["placer"] == "hybrid" and meta["step_time"] != 1.0
    assert meta["mode"] == "train" and meta["feasible"] is True


def test_a_given_plan_is_priced_by_the_objective_the_other_rows_use(tiny):
    """objective=throughput: every row holds the steady-state time per batch, the given plan's row too (it had
    held one step's time)."""
    from placement_rl.cost import simulate_pipeline
    from placement_rl.evaluate import priced

    topo = load_topology("2x_k80")
    costs = resolve_costs(tiny, topo)
    plan = StagePlan(np.array([0, 0, 1]), ((0,), (1,)), num_microbatches=4)
    res = simulate_pipeline(tiny, costs, topo, plan)
    assert priced(tiny, costs, topo, plan).step_time == res.step_time
    steady = priced(tiny, costs, topo, plan, objective="throughput")
    assert steady.step_time == pytest.approx(res.meta["steady_time"]) and steady.meta["one_step_time"] == res.step_time
