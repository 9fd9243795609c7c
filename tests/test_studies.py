"""Studies: every ablation's quick mode and the zero-shot study on a tiny budget, aggregation, curves, errors."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest

from placement_rl.studies.ablation import Cell, RunResult, StudySpec, build_problem, run_study, train_to_budget
from placement_rl.studies.config import experiment_names, load_study
from placement_rl.studies.report import read_runs, write_study
from placement_rl.studies.stats import curve_band, mean_std, step_curve, summarise
from placement_rl.agents.train import AgentSpec, Trainer
from placement_rl.errors import ConfigError

# Tiny budgets: a 12-node synthetic graph and one short rollout per PPO update. The swept key of each study
# still comes from its experiment file (a cell override wins over these).
TINY = ["graph=synthetic", "graph.num_nodes=12", "graph.coarsen.enabled=true", "topology=4x_v100_nvlink",
        "++agent.n_envs=1", "++agent.n_steps=16", "++agent.batch_size=16", "++agent.n_epochs=1",
        "++agent.reinforce.batch_episodes=2", "encoder.hidden=16", "encoder.layers=2"]
SEEDS = (0, 1)
ABLATIONS = [n for n in experiment_names() if n.startswith("ablation_")]


def test_every_issue_ablation_has_an_experiment():
    for name in ("encoder", "agent", "env", "reward", "coarsening", "topology"):
        assert f"ablation_{name}" in ABLATIONS
    assert "zeroshot" in experiment_names()


@pytest.mark.parametrize("name", ABLATIONS)
def test_quick_mode_tiny_budget_has_every_cell_and_seed(name, tmp_path):
    spec = load_study(name, mode="quick", budget=24, seeds=SEEDS, overrides=TINY)
    quick = load_study(name, mode="quick")
    assert [c.name for c in spec.cells] == [c.name for c in quick.cells] and len(quick.seeds) >= 3
    assert load_study(name, mode="full").budget > quick.budget
    results = run_study(spec, progress=False)
    assert {(r.cell, r.seed) for r in results} == {(c.name, s) for c in spec.cells for s in SEEDS}
    for r in results:
        assert r.sim_calls <= spec.budget and all(c <= spec.budget for c, _ in r.curve)
        assert r.feasible and r.step_time > 0 and np.isfinite(r.ratio) and r.baseline_time > 0
    page = write_study(spec, results, tmp_path)
    stem = f"ablation_{spec.name}"
    with open(tmp_path / f"{stem}_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["cell"] for r in rows] == [c.name for c in spec.cells]
    assert all(r["seeds"] == str(len(SEEDS)) and r["seed_list"] == "0 1" for r in rows)
    with open(tmp_path / f"{stem}_runs.csv") as f:
        assert len(list(csv.DictReader(f))) == len(spec.cells) * len(SEEDS)
    text = page.read_text()
    assert all(f"| {c.name} |" in text for c in spec.cells) and "±" in text
    for png in ("curves", "relative"):
        assert (tmp_path / f"{stem}_{png}.png").stat().st_size > 1000
    saved = read_runs(tmp_path / f"{stem}_runs.json")  # pages can be rendered again from the saved runs
    assert [(r.cell, r.seed, r.step_time, r.curve) for r in saved] == [(r.cell, r.seed, r.step_time, r.curve)
                                                                      for r in results]


def test_cells_differ_only_in_the_swept_key():
    spec = load_study("ablation_encoder", mode="full")
    assert [c.encoder.name for c in spec.cells] == ["sage", "gat", "gcn", "placeto", "mlp", "gdp"]
    assert len({(c.env_id, c.topology, repr(c.graph), c.agent) for c in spec.cells}) == 1
    env = load_study("ablation_env", mode="quick")
    assert [c.env_id.split("/")[1] for c in env.cells] == ["PlacementEnv-v0", "OneShotPlacementEnv-v0"]
    reward = load_study("ablation_reward", mode="quick")
    assert [c.env_options["reward"] for c in reward.cells] == ["incremental", "final"]
    coarse = load_study("ablation_coarsening", mode="quick")
    assert coarse.judge == "original" and [c.graph["coarsen"]["max_nodes"] for c in coarse.cells] == [8, 16, 32, None]


def test_train_to_budget_stops_at_the_budget_and_judges_on_the_original_graph():
    spec = load_study("ablation_coarsening", mode="quick", budget=40, seeds=(0,), overrides=TINY)
    cell = spec.cells[0]
    problem = build_problem(cell, judge="original")
    assert problem.judge_graph.num_nodes == 12 and problem.graph.num_nodes <= 8
    trainer = Trainer(env_id=cell.env_id, env_kwargs={"graph": problem.graph, "topology": problem.topology},
                      agent=cell.agent, encoder=cell.encoder, seed=0)
    out = train_to_budget(trainer, 40, judge=problem.judge)
    assert trainer.tracker.sim_calls >= 40 and out.curve and all(c <= 40 for c, _ in out.curve)
    assert out.step_time == pytest.approx(problem.judge(out.value)[0])
    assert out.curve[-1][1] == pytest.approx(out.step_time)
    # a run that cannot spend its budget stops at the env-step cap instead of training forever
    before = trainer.num_timesteps
    capped = train_to_budget(trainer, 10**9, judge=problem.judge, max_steps=48)
    assert capped.sim_calls < 10**9 and 48 <= trainer.num_timesteps - before < 48 + 16  # one rollout = 16 steps


def test_aggregation_mean_std_and_curves():
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(np.sqrt(2.0)))
    assert mean_std([5.0]) == (5.0, 0.0)
    assert np.isnan(mean_std([float("nan")])[0])
    grid = np.array([0.0, 5.0, 10.0, 20.0])
    assert np.allclose(step_curve([(5, 2.0), (12, 1.0)], grid), [np.nan, 2.0, 2.0, 1.0], equal_nan=True)

    def res(seed, t, curve):
        return RunResult(cell="a", seed=seed, step_time=t, feasible=True, greedy_time=t, sim_calls=10, budget=10,
                         seconds=1.0, episodes=1, baseline="heft", baseline_time=2.0, single_time=4.0, curve=curve)

    rs = [res(0, 1.0, ((2, 1.5), (8, 1.0))), res(1, 3.0, ((4, 3.0),))]
    (row,) = summarise(rs)
    assert row["seeds"] == 2 and row["ratio_mean"] == pytest.approx(1.0) and row["beats_baseline"] == 1
    assert row["speedup_mean"] == pytest.approx((4.0 + 4 / 3) / 2)
    mean, std = curve_band(rs, "a", np.array([3.0, 4.0, 9.0]))  # seed 1 has no value before 4 calls
    assert np.isnan(mean[0]) and mean[1:] == pytest.approx([2.25, 2.0])
    assert std[2] == pytest.approx(np.std([1.0, 3.0], ddof=1))


def test_bad_study_inputs_raise_config_errors():
    with pytest.raises(ConfigError, match="unknown experiment"):
        load_study("ablation_nope")
    with pytest.raises(ConfigError, match="mode"):
        load_study("ablation_encoder", mode="huge")
    cell = Cell(name="a", graph={"source": "synthetic", "family": "layered", "num_nodes": 8}, topology="2x_k80",
                env_id="placement_rl/PlacementEnv-v0", agent=AgentSpec())
    with pytest.raises(ConfigError, match="distinct seeds"):
        StudySpec(name="x", factor="f", cells=(cell,), seeds=(0, 0), budget=10)
    with pytest.raises(ConfigError, match="budget"):
        StudySpec(name="x", factor="f", cells=(cell,), seeds=(0,), budget=0)
    with pytest.raises(ConfigError, match="duplicate"):
        StudySpec(name="x", factor="f", cells=(cell, cell), seeds=(0,), budget=10)


def test_zeroshot_quick_mode_tiny_budget(tmp_path):
    from placement_rl.studies.zeroshot import HeldOutCase, ZeroShotRow, load_zeroshot, run_zeroshot
    from placement_rl.studies.zeroshot_report import write_zeroshot

    spec = load_zeroshot(mode="quick", seeds=SEEDS, overrides=TINY[4:], budget=24, family_budget=40,
                         work_dir=str(tmp_path / "work"))
    quick = load_zeroshot(mode="quick")
    assert len(quick.seeds) >= 3 and {c.held_out for c in quick.cases} >= {"model", "topology"}
    # Zoo captures take seconds each: the tiny run swaps them for synthetic graphs (same code path).
    cases = (HeldOutCase(name="cnn/4xV100-PCIe", graph={"source": "synthetic", "family": "cnn_like",
                                                        "num_nodes": 14, "seed": 3},
                         topology="4x_v100_pcie", held_out="model+topology"),
             HeldOutCase(name="tf/2xK80", graph={"source": "synthetic", "family": "transformer_like",
                                                 "num_nodes": 10, "seed": 5}, topology="2x_k80", held_out="model"))
    spec = dataclasses.replace(spec, family_zoo=(), family_count=4, family_nodes=(8, 12), samples=1, cases=cases)
    rows, families = run_zeroshot(spec, progress=False)
    assert [f.seed for f in families] == list(SEEDS) and all(f.checkpoint.is_file() for f in families)
    expected = {(c.name, m, s) for c in cases for m in ("zero-shot", "fine-tune", "scratch", "baseline") for s in SEEDS}
    assert {(r.case, r.method, r.seed) for r in rows} == expected
    assert all(r.feasible and r.step_time > 0 and r.seconds >= 0 for r in rows)
    assert all(r.sim_calls <= 24 for r in rows if r.method in ("fine-tune", "scratch"))
    page = write_zeroshot(spec, rows, families, tmp_path)
    with open(tmp_path / "zeroshot_summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert len(summary) == len(cases) * 4 and all(r["seeds"] == "2" for r in summary)
    assert "zero-shot" in page.read_text() and (tmp_path / "zeroshot_curves.png").is_file()
    assert len(read_runs(tmp_path / "zeroshot_runs.json", ZeroShotRow)) == len(rows)


def test_budgeted_finetune_keeps_every_learned_row_within_the_budget():
    """A graph within the lookahead window pays N x D + 1 calls per placement: the evaluations shrink and every
    sampled episode is charged, so no learned row passes the budget (moe on 8 GPUs: 15,213 calls before)."""
    import torch

    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.cost import resolve_costs
    from placement_rl.studies.finetune import finetune
    from placement_rl.studies.pretrain import _graph, _topology

    torch.set_num_threads(1)
    graph, topo = _graph({"zoo": "moe"}), _topology("8x_a100_nvswitch")
    policy, cfg, _ = load_policy(default_checkpoint())
    budget = 5000
    res = finetune(graph, topo, resolve_costs(graph, topo), policy, dataclasses.replace(cfg, rl_iters=budget),
                   samples=16, budget=budget, log=lambda _: None)
    learned = [r for r in res.rows if r.kind == "learned"]
    assert graph.num_nodes * topo.num_devices + 1 > budget // 34  # 16 samples twice would not fit here
    assert learned and max(r.sim_calls for r in learned) <= budget


def test_a_study_row_of_one_seed_shows_no_spread():
    """One seed has no standard deviation: its cells read "1.02", not "1.02 ± 0"."""
    from placement_rl.studies.report import pm

    assert pm({"seeds": 1, "ratio_mean": 1.02, "ratio_std": 0.0}, "ratio") == "1.02"
    assert pm({"seeds": 3, "ratio_mean": 1.02, "ratio_std": 0.01}, "ratio") == "1.02 ± 0.01"
