"""``placement-rl train``'s fine-tuning, run again and stopped: the fine-tuned best-of-k draws the zero-shot
samples (equal weights, equal rows) and says when fine-tuning left the weights unchanged; ``learned + local
search`` puts its seconds on its calls' basis; a Ctrl-C after fine-tuning keeps the checkpoint and says which files
were written; and the messages of a bad ``agent.ft_search_seconds``, a checkpoint without code hashes and a policy
fine-tuned on another graph."""

from __future__ import annotations

import itertools
import sys
import types

import pytest
import torch
from omegaconf import OmegaConf

from placement_rl.agents.constructive_train import ConstructiveConfig, ConstructiveTrainer, build_policy, load_policy
from placement_rl.cli import common, train
from placement_rl.cost import resolve_costs
from placement_rl.errors import CheckpointError, ConfigError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

torch.set_num_threads(1)

TINY = {"hidden": 16, "layers": 1, "window": 4}
NOTHING = {"ft_search_rounds": 0, "pi_rounds": 0, "rl_iters": 0}  # fine-tuning that changes no weight


def _case():
    """A 20-node graph whose best of 6 samples differs between the draws of seed 0 and seed 1 (32.6 vs 35.9 ms)."""
    g = synthetic.sample("dataflow", num_nodes=20, seed=3)
    topo = load_topology("4x_v100_nvlink")
    return g, topo, resolve_costs(g, topo)


def _finetune(full_window: int = 0, **cfg):
    from placement_rl.studies.finetune import finetune

    g, topo, costs = _case()
    torch.manual_seed(0)
    policy = build_policy(ConstructiveConfig(**TINY, full_window=full_window))
    config = ConstructiveConfig(**TINY, full_window=full_window, **{**NOTHING, **cfg})
    res = finetune(g, topo, costs, policy, config, samples=6, seed=0, search_budget=20, log=lambda _: None)
    return res, {r.label: r for r in res.rows}


def test_equal_weights_give_equal_fine_tuned_rows_and_a_note():
    """Before the fix the fine-tuned best-of-k drew with seed + 1: with the zero-shot weights its row was another
    (here slower) placement, read as fine-tuning making the policy worse."""
    res, rows = _finetune()
    for kind in ("greedy", "best of 6"):
        zs, ft = rows[f"policy zero-shot ({kind})"], rows[f"policy fine-tuned ({kind})"]
        assert ft.step_time == zs.step_time and (ft.devices == zs.devices).all(), kind
    assert res.note == ("fine-tuning left the policy's weights unchanged: the fine-tuned rows are the zero-shot "
                        "policy's placements, sampled with the same seed")
    wide, _ = _finetune(full_window=1536)  # the zero-shot rows read the whole graph, the fine-tuned ones W = 4
    assert "placing at its trained window of 4 nodes (the zero-shot rows read the whole graph)" in wide.note
    changed, _ = _finetune(rl_iters=1, samples=4)
    assert changed.note == ""


def test_learned_plus_local_search_counts_seconds_as_it_counts_calls(monkeypatch):
    """Its calls were the whole learned run's plus the refine's, its seconds the refine's alone. A clock that
    ticks once a reading makes the seconds exact."""
    import placement_rl.studies.finetune as finetune

    ticks = itertools.count()
    monkeypatch.setattr(finetune, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    _, rows = _finetune()
    ls, ft = rows["learned + local search"], rows["policy fine-tuned (best of 6)"]
    assert ls.sim_calls > ft.sim_calls and ls.seconds > ft.seconds


def _cfg(*overrides: str):
    cfg, _ = common._compose("train", list(overrides), [])
    return OmegaConf.create(cfg)


SMALL = ("graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "progress=false", "agent.ft_search_rounds=0",
         "agent.search_budget=20", "agent.eval_samples=2", "trainer.compare=false")


def test_ctrl_c_in_the_searches_after_fine_tuning_keeps_the_checkpoint_and_says_so(tmp_path, monkeypatch):
    """Before the fix the checkpoint was saved after every comparison row: a Ctrl-C there lost the fine-tuning
    and printed only ``interrupted``."""
    import placement_rl.studies.finetune as finetune

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune, "equal_seconds_rows", ctrl_c)
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    with pytest.raises(KeyboardInterrupt) as exc:
        train.run(_cfg(*SMALL))
    assert isinstance(exc.value, common.Interrupted) and str(exc.value) == (
        "interrupted: wrote checkpoint.pt, graph.json, placement.json; search/placement.json, learned.md, "
        "training.png, metrics.json not written")
    _, _, data = load_policy(tmp_path / "checkpoint.pt")
    assert data["config"]["finetuned_on"].endswith("@2x_k80") and not (tmp_path / "metrics.json").exists()


def test_the_command_prints_the_interrupt_line_it_was_given(tmp_path, monkeypatch, capsys):
    """``hydra_app`` prints an ``Interrupted``'s own line, a bare Ctrl-C's ``interrupted`` as before; exit 130."""
    monkeypatch.setenv(common.DRIVER_PID, "0")  # main() sets it: put back after the test
    monkeypatch.setattr(common, "_TASK_STARTED", False)
    for raised, line in ((common.Interrupted("interrupted: wrote a.pt; b.json not written"),
                          "interrupted: wrote a.pt; b.json not written"), (KeyboardInterrupt(), "interrupted")):
        def run(cfg, raised=raised):
            raise raised

        monkeypatch.setattr(sys, "argv", ["placement-rl", f"hydra.run.dir={tmp_path}/run", "progress=false"])
        with pytest.raises(SystemExit) as exc:
            common.hydra_app("train")(run)()
        assert exc.value.code == 130 and capsys.readouterr().err.strip().splitlines()[-1] == line


def test_a_bad_ft_search_seconds_names_the_key_as_typed():
    with pytest.raises(ConfigError) as exc:
        train.constructive_config(_cfg("agent.ft_search_seconds=0"))
    assert str(exc.value) == "agent.ft_search_seconds=0: must be a number > 0"
    with pytest.raises(ConfigError, match=r"^ft_search_seconds must be a number > 0, got 0$"):
        ConstructiveConfig(ft_search_seconds=0)  # the Python API: its argument's name


def _checkpoint(tmp_path, name: str, **extra) -> str:
    path = ConstructiveTrainer(ConstructiveConfig(hidden=16, layers=1)).save(tmp_path / name, extra=extra)
    return str(path)


def test_a_checkpoint_without_code_hashes_says_so(tmp_path):
    path = _checkpoint(tmp_path, "ck.pt")
    data = torch.load(path, weights_only=True)
    del data["config"]["provenance"]
    torch.save(data, path)
    said: list[str] = []
    load_policy(path, log=said.append)
    assert said == [f"note: checkpoint '{path}' records no code hashes, so it may have been trained with other code: "
                    "its placements are valid, its figures may not be this release's (strict_checkpoint=true refuses "
                    "it)"]
    with pytest.raises(CheckpointError) as exc:
        load_policy(path, strict=True)
    assert str(exc.value) == (f"checkpoint '{path}' records no code hashes, so it may have been trained with other "
                              "code: retrain it, or drop strict_checkpoint")


def test_place_graph_says_a_checkpoint_was_fine_tuned_on_another_graph(tmp_path, capsys):
    from placement_rl.agents.place_graph import place_graph

    g, topo, costs = _case()
    here = f"{g.name}@{topo.name}"
    for tuned, said in (("mlp@2x_k80", True), (here, False)):
        path = _checkpoint(tmp_path, f"{said}.pt", finetuned_on=tuned)
        place_graph(g, topo, costs, checkpoint=path)
        note = f"note: {path} was fine-tuned on mlp@2x_k80, not {here}: a fine-tuned policy places what it was " \
               "fitted to and other graphs or clusters worse than the shipped one (leave checkpoint out for that)"
        assert (note in capsys.readouterr().out.splitlines()) is said


def test_a_checkpoint_of_another_agent_is_named_as_such_not_damaged(tmp_path) -> None:
    """The shipped constructive checkpoint relabelled as another agent's: its loader names the agent that wrote
    it, not a damaged field (the other agent's fields are checked only once the agent matches)."""
    from placement_rl.agents.checkpoint import CheckpointError
    from placement_rl.agents.constructive_config import default_checkpoint

    data = torch.load(default_checkpoint(), map_location="cpu", weights_only=True)
    data["algo"] = "maskable_ppo"
    path = tmp_path / "other.pt"
    torch.save(data, path)
    with pytest.raises(CheckpointError, match="trained with agent 'maskable_ppo', not 'constructive'"):
        load_policy(path)
