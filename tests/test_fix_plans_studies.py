"""Studies: a failed cell leaves the finished runs written and is named (run_study, the page, scripts/ablate.py),
findings say when cells or methods tie, the zero-shot page shows no spread for one seed, and zero-shot keeps to
the simulator-call budget of the other methods."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from placement_rl.errors import ConfigError
from placement_rl.studies import ablation, zeroshot
from placement_rl.studies.ablation import Cell, RunFailure, RunResult, StudyFailed, StudySpec, TrainOutcome
from placement_rl.studies.report import findings, read_failures, write_study
from placement_rl.studies.stats import summarise

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
GRAPH = {"source": "synthetic", "family": "layered", "num_nodes": 8, "seed": 0}


def _run(cell: str, seed: int, step: float) -> RunResult:
    return RunResult(cell=cell, seed=seed, step_time=step, feasible=True, greedy_time=step, sim_calls=10, budget=10,
                     seconds=0.1, episodes=1, baseline="heft", baseline_time=0.04, single_time=0.08,
                     curve=((5, step),))


def _spec(cells=("a", "b"), seeds=(0,)) -> StudySpec:
    return StudySpec(name="t", factor="cell", seeds=seeds, budget=10, title="T", question="Q?",
                     cells=tuple(Cell(name=c, graph=GRAPH, topology="2x_k80", env_id="placement_rl/PlacementEnv-v0")
                                 for c in cells))


def _fake_runs(monkeypatch, failing: str) -> None:
    """run_cell trains nothing (cell ``failing`` raises as a bad env option does); baselines are not run."""
    def run_cell(cell, seed, budget, problem):
        if cell.name == failing:
            raise ConfigError("unknown option 'passes' for OneShotConfig")
        return TrainOutcome(0.05, True, None, budget, 1, 0.1, ((budget, 0.05),)), 0.05

    monkeypatch.setattr(ablation, "run_cell", run_cell)
    monkeypatch.setattr(ablation, "baseline_reference",
                        lambda p, budget, seed: ablation.BaselineRef("heft", 0.04, 0.08, budget, 0.0))


def test_a_failed_cell_keeps_the_finished_runs_and_is_named(monkeypatch, tmp_path):
    _fake_runs(monkeypatch, failing="a")
    spec = _spec(seeds=(0, 1))
    with pytest.raises(StudyFailed, match="cell 'a' seed 0 failed: unknown option 'passes'") as exc:
        ablation.run_study(spec, progress=False)
    assert [(r.cell, r.seed) for r in exc.value.results] == [("b", 0), ("b", 1)]
    assert [(f.cell, f.seed) for f in exc.value.failures] == [("a", 0), ("a", 1)]
    page = write_study(spec, exc.value.results, tmp_path, exc.value.failures).read_text()
    assert "## Failed runs" in page and "cell 'a' seed 1 failed: unknown option 'passes'" in page
    assert read_failures(tmp_path / "ablation_t_failed.json") == exc.value.failures
    assert len(json.loads((tmp_path / "ablation_t_runs.json").read_text())) == 2
    write_study(spec, exc.value.results, tmp_path)  # a later run with no failure drops the stale file
    assert not (tmp_path / "ablation_t_failed.json").exists()


def test_ablate_script_writes_the_finished_runs_and_names_the_failed_cell(monkeypatch, tmp_path, capsys):
    _fake_runs(monkeypatch, failing="final")
    mod_spec = importlib.util.spec_from_file_location("ablate_script", ROOT / "scripts" / "ablate.py")
    script = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(script)
    out = tmp_path / "out"
    rc = script.main(["reward", "--seeds", "0", "--budget", "10", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cell 'final' seed 0 failed: unknown option 'passes'" in err
    page = (out / "ablation_reward.md").read_text()
    assert "cell 'final' seed 0 failed" in page and "| incremental |" in page
    assert [r["cell"] for r in json.loads((out / "ablation_reward_runs.json").read_text())] == ["incremental"]
    assert (out / "ablation_reward_runs.csv").is_file() and (out / "ablation_reward_failed.json").is_file()


def test_findings_say_when_cells_tie():
    tie = summarise([_run("incremental", 0, 0.05722), _run("final", 0, 0.05722)], ["incremental", "final"])
    first = findings(tie)[0]
    assert first.startswith("All 2 cells tie") and "worst" not in first
    apart = summarise([_run("a", 0, 0.05), _run("b", 0, 0.05), _run("c", 0, 0.06)], ["a", "b", "c"])
    first = findings(apart)[0]
    assert "Best cells (tied): **a** and **b**" in first and "worst: **c**" in first


def _zeroshot_spec(samples: int = 4, budget: int = 60):
    case = zeroshot.HeldOutCase(name="nmt/2xK80", graph=GRAPH, topology="2x_k80", held_out="model")
    return zeroshot.ZeroShotSpec(
        template=Cell(name="t", graph=GRAPH, topology="2x_k80", env_id="placement_rl/PlacementEnv-v0"),
        family_synthetic=("layered",), family_count=2, family_nodes=(8, 12), family_zoo=(),
        train_topologies=("2x_k80",), cases=(case,), family_budget=100, budget=budget, samples=samples, seeds=(0,))


def test_zeroshot_page_one_seed_has_no_spread_and_a_tie_is_said(tmp_path):
    from placement_rl.studies.zeroshot_report import write_zeroshot

    spec = _zeroshot_spec()
    rows = [zeroshot.ZeroShotRow("nmt/2xK80", "model", 0, m, m if m != "baseline" else "heft", 0.01, True, 0.01,
                                 60, 0.5, ((30, 0.01),) if m in ("fine-tune", "scratch") else ())
            for m in zeroshot.METHODS]
    fam = [zeroshot.FamilyRun(0, tmp_path / "f.pt", 0.533, 100, 4)]
    text = write_zeroshot(spec, rows, fam, tmp_path).read_text()
    assert "± 0" not in text and "wall-clock 0.533 s" in text
    assert "the learned methods tie (zero-shot = fine-tune = scratch)" in text and "best learned method" not in text


@pytest.mark.parametrize("budget, lengths, rollouts, calls, best", [
    (60, [24] * 5, 2, 48, 0.09),    # a third sample would pass 60: not drawn (it used to run all 5: 120 calls)
    (90, [24, 24, 50], 3, 90, 0.09),  # the third passed the budget after all: drawn, not counted
    (10, [24] * 5, 1, 24, 0.10),    # the greedy rollout alone passes it: counted, its calls shown as they are
])
def test_zero_shot_keeps_to_the_budget(monkeypatch, budget, lengths, rollouts, calls, best):
    done: list[int] = []

    def rollout(policy, env, **kw):
        env.tracker.sim_calls += lengths[len(done)]
        done.append(1)
        return {"placement": len(done)}

    monkeypatch.setattr(zeroshot, "make_env", lambda env_id, kwargs: None)
    monkeypatch.setattr(zeroshot, "SimCallCounter", lambda env, tracker: SimpleNamespace(tracker=tracker,
                                                                                         close=lambda: None))
    monkeypatch.setattr(zeroshot, "load_policy_for", lambda env, state, kwargs: None)
    monkeypatch.setattr(zeroshot, "rollout", rollout)
    steps = {1: 0.10, 2: 0.09, 3: 0.08, 4: 0.07, 5: 0.06}  # each sample better than the one before
    problem = SimpleNamespace(graph=None, topology=None, judge=lambda k: (steps[k], True))
    step, ok, used, _ = zeroshot.zero_shot(problem, _zeroshot_spec(samples=4, budget=budget), {}, {}, seed=0)
    assert (len(done), used, ok) == (rollouts, calls, True) and step == pytest.approx(best)
    assert np.isfinite(step)


def test_run_failure_of_a_bug_names_its_type():
    f = RunFailure.of("a", 3, KeyError("x"))
    assert f.describe() == "cell 'a' seed 3 failed: KeyError: 'x'"
