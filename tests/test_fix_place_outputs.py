"""place / train outputs: the cost source on every summary, a launcher-independent checkpoint identity, notes for
keys a run ignores, the memory refusal pointing at stage plans, and the learned row being the policy's own output."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from placement_rl.cli import place, train
from placement_rl.cli.common import _compose
from placement_rl.errors import PlanError

torch.set_num_threads(1)

SMALL = ("graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "progress=false")


def _cfg(command: str, *overrides: str):
    cfg, _ = _compose(command, list(overrides), [])
    return OmegaConf.create(cfg)


def test_place_prints_and_writes_which_costs_priced_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    m = place.run(_cfg("place", *SMALL, "samples=0", "compare=false"))
    assert "costs: calibrated:neusight-v2" in capsys.readouterr().out.splitlines()
    assert m["cost_source"].endswith("calibrated:neusight-v2")
    # comparison.md (written by evaluate's compare_learned) gets the same line under its title
    (tmp_path / "comparison.md").write_text("# title\n\n| a |\n")

    class Costs:
        source = ("measured:p.json:cpu", "calibrated:neusight-v2", "measured:p.json:cpu")

    place.label_costs(tmp_path, Costs())
    assert (tmp_path / "comparison.md").read_text() == \
        "# title\n\ncosts: calibrated:neusight-v2, measured:p.json:cpu\n\n| a |\n"


def test_shipped_checkpoint_is_recorded_the_same_from_a_copy_of_the_package(tmp_path, monkeypatch):
    """A Ray worker runs from a temporary copy of the package: the record names the file inside the package."""
    import placement_rl
    from placement_rl.agents.constructive_train import default_checkpoint

    here = place.checkpoint_id(str(default_checkpoint()))
    assert here["checkpoint"] == "shipped:placement_rl/data/policy/pretrained.pt" and len(here["checkpoint_sha"]) == 16
    copy = tmp_path / "_ray_pkg_0123" / "placement_rl"
    (copy / "data" / "policy").mkdir(parents=True)
    shutil.copy(default_checkpoint(), copy / "data" / "policy" / "pretrained.pt")
    monkeypatch.setattr(placement_rl, "__file__", str(copy / "__init__.py"))
    assert place.checkpoint_id(str(copy / "data" / "policy" / "pretrained.pt")) == here
    other = tmp_path / "mine.pt"
    shutil.copy(default_checkpoint(), other)
    assert place.checkpoint_id(str(other)) == {"checkpoint": str(other), "checkpoint_sha": here["checkpoint_sha"]}


def test_workers_outside_pretraining_says_it_has_no_effect():
    assert train.workers_note(_cfg("train", "workers=4")) == \
        "note: workers=4 applies to trainer=pretrain only: this run trains in this process"
    assert train.workers_note(_cfg("train")) is None and train.workers_note(_cfg("train", "workers=1")) is None
    assert "workers=2 and ray.address=auto apply" in train.workers_note(_cfg("train", "workers=2", "ray.address=auto"))


def test_place_memory_refusal_names_the_stage_plans(tmp_path, monkeypatch):
    from placement_rl.cli.common import build_graph
    from placement_rl.cost.memory import static_memory
    from placement_rl.topology import load_topology

    graph = build_graph(_cfg("place", *SMALL).graph)
    d = load_topology("2x_k80").to_dict()
    for dev in d["devices"]:
        dev["memory_bytes"] = float(static_memory(graph).sum()) / 3  # two devices: 2/3 of what the model needs
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({**d, "name": "tiny"}))
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    with pytest.raises(PlanError) as err:
        place.run(_cfg("place", *SMALL, f"topology.path={tmp_path / 'tiny.yaml'}", "samples=0", "compare=false"))
    msg = str(err.value)
    assert "use a smaller batch or model" in msg and "`placement-rl evaluate suite=single`" in msg
    assert "micro-batches" in msg and "FSDP" in msg and "\n" not in msg


def test_constructive_fine_tune_names_the_keys_it_ignores(tmp_path, monkeypatch, capsys):
    assert train.constructive_ignores(["encoder=gat", "trainer=quick", "+trainer.total_steps=64",
                                       "trainer.compare=true", "graph=mlp", "agent.rl_iters=2"]) == \
        ["encoder=gat", "trainer=quick", "trainer.total_steps=64"]
    assert train.constructive_ignores(["graph=mlp", "seed=1"]) == []
    import placement_rl.studies.finetune as finetune

    def stop(*args, **kwargs):
        raise RuntimeError("stop before fine-tuning")

    monkeypatch.setattr(finetune, "finetune", stop)
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    monkeypatch.setattr(train, "_task_overrides", lambda: ["encoder=gat", "trainer=quick"])
    with pytest.raises(RuntimeError, match="stop"):
        train.run(_cfg("train", *SMALL, "encoder=gat", "trainer=quick"))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("note: env=constructive"))
    assert "ignores encoder=gat, trainer=quick" in line and "sage encoder" in line and "agent.ft_search_seconds" in line


def test_train_learned_row_is_the_policy_and_place_says_one_pass_is_not_the_rollout(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    m = train.run(_cfg("train", *SMALL, "env=placement", "agent=reinforce", "trainer=quick",
                       "trainer.total_steps=64"))
    out = capsys.readouterr().out
    # the learned figure is the policy's best of greedy + k, never the exploration's best (a row of its own)
    assert m["step_time"] == m["policy_best_of_k_time"] and m["plan_source"].startswith("policy_")
    seen = m["best_seen_in_training"]
    assert seen["step_time"] <= m["step_time"] and (tmp_path / seen["file"]).is_file()
    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.graph import CompGraph
    from placement_rl.plans import load_plan
    from placement_rl.topology import load_topology

    graph, topo = CompGraph.from_json(tmp_path / "graph.json"), load_topology("2x_k80")
    for file, time in (("placement.json", m["step_time"]), (seen["file"], seen["step_time"])):
        plan = load_plan(str(tmp_path / file), topology=topo, graph=graph)
        assert simulate(graph, resolve_costs(graph, topo), topo, plan).step_time == pytest.approx(time, rel=1e-9)
    rows = (tmp_path / "comparison.md").read_text()
    assert "\n\ncosts: calibrated:neusight-v2\n\n" in rows and "| best seen in training" in rows
    assert "| learned:reinforce+sage (best of greedy + 2 samples) |" in rows
    assert f"policy (best of greedy + 2 samples) {m['step_time'] * 1e3:.3f} ms" in out and "costs: " in out
    # place with this PlacementEnv checkpoint: the default one_pass decode says it is not training's rollout
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path / "place")
    (tmp_path / "place").mkdir()
    pm = place.run(_cfg("place", *SMALL, f"checkpoint={tmp_path / 'checkpoint.pt'}", "samples=0", "compare=false"))
    assert place.ONE_PASS_NOTE in capsys.readouterr().out.splitlines()
    assert pm["checkpoint"] == str(tmp_path / "checkpoint.pt") and pm["cost_source"]
    place.run(_cfg("place", *SMALL, f"checkpoint={tmp_path / 'checkpoint.pt'}", "samples=0", "compare=false",
                   "decode=sequential"))
    assert place.ONE_PASS_NOTE not in capsys.readouterr().out


@pytest.mark.slow
def test_constructive_fine_tune_says_which_costs_priced_its_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    m = train.run(_cfg("train", *SMALL, "agent.rl_iters=1", "agent.samples=2", "agent.eval_samples=2",
                       "agent.search_budget=0", "agent.ft_search_rounds=0", "agent.equal_seconds=false",
                       "trainer.compare=false", "trainer.tensorboard=false"))
    out = capsys.readouterr().out
    assert "\n\ncosts: calibrated:neusight-v2\n\n|" in (tmp_path / "learned.md").read_text()
    assert "costs: calibrated:neusight-v2" in out.splitlines()
    assert "`vs best one-pass`: step time over the best of HEFT, m-ETF, m-SCT and METIS" in out  # the column's legend
    assert m["checkpoint"] == "shipped:placement_rl/data/policy/pretrained.pt" and m["checkpoint_sha"]


def test_train_says_when_no_training_episode_finished(tmp_path, monkeypatch, capsys):
    """PipelineEnv with maskable PPO at 64 steps: one rollout of 16 envs x 32 steps, shorter than an episode of a
    34-node graph, so the policy saw no reward and its rows were an untrained policy's, without a word."""
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    m = train.run(_cfg("train", "graph=mlp", "topology=2x_k80", "progress=false", "env=pipeline",
                       "agent=maskable_ppo", "trainer=quick", "trainer.total_steps=64", "trainer.compare=false"))
    assert m["training_episodes"] == 0 and m["episodes"] > 0  # the final rollouts' episodes only
    assert "note: no training episode finished in 512 steps" in capsys.readouterr().out
    # nothing was explored in training: no "best seen in training" row (it was the final rollouts' best)
    assert "best_seen_in_training" not in m and not (tmp_path / "training_best").exists()


def test_train_gives_no_speedup_over_a_single_device_that_does_not_fit(tmp_path, monkeypatch, capsys):
    """gpt (8 layers, d 1024) on two 2 GiB GPUs: one device overflows, and train printed a 1.211 x speed-up over it
    (evaluate's tables show n/a)."""
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    m = train.run(_cfg("train", "graph=gpt", "+graph.overrides={n_layers: 8, d_model: 1024, seq_len: 128}",
                       "topology=2x_small_gpu", "progress=false", "env=pipeline", "agent=reinforce",
                       "trainer=quick", "trainer.total_steps=64", "trainer.compare=false"))
    assert m["speedup_over_single_device"] is None
    assert "does not fit" in capsys.readouterr().out


def test_place_says_the_greedy_pass_is_running_on_a_long_decode(tmp_path, monkeypatch, capsys):
    """The greedy decode of 50,000 nodes took 7 minutes without a line: it now beats like the other phases."""
    import re
    import time

    import placement_rl.cli.common as common

    import placement_rl.agents.constructive_eval as ce

    real = ce.greedy_result

    def slow(policy, task):
        end = time.monotonic() + 5.0
        while time.monotonic() < end and "so far" not in capsys.readouterr().out:
            time.sleep(0.01)
        return real(policy, task)

    seen: list[str] = []
    monkeypatch.setattr(ce, "greedy_result", slow)
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    monkeypatch.setattr(common.Phases, "__init__", lambda self, enabled=True, every=10.0: (
        setattr(self, "enabled", enabled), setattr(self, "every", 0.05))[0])
    monkeypatch.setattr(capsys, "readouterr", _keeping(capsys.readouterr, seen))
    place.run(_cfg("place", *SMALL[:-1], "samples=0", "compare=false"))
    out = "".join(seen) + capsys.readouterr().out
    assert re.search(r"^greedy placement \(window \d+\): one pass over 10 nodes running, [\d.]+ s so far$", out, re.M)


def _keeping(read, seen):
    def wrapped():
        got = read()
        seen.append(got.out)
        return got
    return wrapped
