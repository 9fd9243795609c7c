"""The environments over a graph family in gymnasium's vector envs (placements in ``info`` keep one shape), the
constructive env's draws that do not fit in memory and its ``render_mode``, every ``info`` key documented, and
``place decode=sequential`` replaying the greedy rollout training scored."""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv
from omegaconf import OmegaConf

from placement_rl.cost.memory import pinned_memory
from placement_rl.envs import OneShotPlacementEnv, PipelineEnv, PlacementEnv
from placement_rl.envs.constructive import MAX_DRAWS, ConstructivePlacementEnv
from placement_rl.envs.warm_start import HeuristicStartPlacementEnv
from placement_rl.errors import ConfigError, PlanError
from placement_rl.graph import synthetic
from placement_rl.topology import DeviceTopology, load_topology

torch.set_num_threads(1)

PLACE, ONESHOT = "placement_rl/PlacementEnv-v0", "placement_rl/OneShotPlacementEnv-v0"
PIPE, CONS = "placement_rl/PipelineEnv-v0", "placement_rl/ConstructivePlacementEnv-v0"


def _small_memory(mib: float) -> DeviceTopology:
    d = load_topology("2x_k80").to_dict()
    for dev in d["devices"]:
        dev["memory_bytes"] = mib * 2**20
    return DeviceTopology.from_dict({**d, "name": f"k80_{mib:g}mib"})


def _valid_action(env: gym.Env, rng: np.random.Generator):
    u = env.unwrapped
    mask = np.asarray(u.action_masks(), dtype=bool)
    if isinstance(u, OneShotPlacementEnv):
        rows = mask.reshape(u.layout.max_nodes, u.layout.max_devices)
        return np.array([rng.choice(np.flatnonzero(r)) for r in rows], dtype=np.int64)
    return int(rng.choice(np.flatnonzero(mask))) if mask.any() else 0  # none: the episode ended (autoreset next)


def _is_padded_placement(row: np.ndarray) -> bool:
    n = int((row >= 0).sum())
    return n >= 3 and bool((row[:n] >= 0).all() and (row[n:] == -1).all())


@pytest.mark.parametrize("env_id", [PLACE, ONESHOT, PIPE, CONS])
def test_sync_vector_env_batches_a_graph_family(env_id):
    """Graphs of 16-32 nodes in three sub-envs: the placements in ``info`` are stacked, not refused."""
    v = SyncVectorEnv([lambda: gym.make(env_id, graph="synthetic:layered", topology="2x_k80",
                                        disable_env_checker=True) for _ in range(3)])
    _, infos = v.reset(seed=[1, 2, 3])
    sizes = {e.unwrapped.task.graph.num_nodes for e in v.envs}
    assert len(sizes) > 1  # the family draws graphs of different sizes
    rng = np.random.default_rng(0)
    seen = 0
    for _ in range(40):
        acts = [_valid_action(e, rng) for e in v.envs]
        _, _, term, _, infos = v.step(np.stack(acts))
        for key in ("placement", "best_placement"):
            if key in infos:
                rows = infos[key][infos[f"_{key}"]]
                assert rows.shape[1] == 32 and all(_is_padded_placement(r) for r in rows)
                seen += len(rows)
    assert seen > 0 or env_id == PIPE  # PipelineEnv's info holds plans (objects), no placement
    v.close()


def test_placement_info_is_padded_to_max_nodes_and_the_warm_start_reads_its_nodes():
    g = synthetic.sample("layered", num_nodes=10, seed=0)
    env = PlacementEnv(graph=g, topology="2x_k80", max_nodes=14)
    _, info = env.reset(seed=0)
    assert info["placement"].shape == (14,) and (info["placement"][10:] == -1).all()
    assert np.array_equal(info["placement"][:10], env.devices)
    done = False
    while not done:
        _, _, done, _, info = env.step(0)
    assert info["best_placement"].shape == (14,) and (info["best_placement"][:10] >= 0).all()
    one = OneShotPlacementEnv(graph=g, topology="2x_k80", max_nodes=14)
    _, info = one.reset(seed=0)
    assert info["placement"].shape == (14,) and (info["placement"][10:] == -1).all()
    warm = HeuristicStartPlacementEnv(start="incumbent", graph=g, topology="2x_k80", max_nodes=14)
    for ep in range(2):  # the incumbent (from a padded info) starts the next episode: the task's 10 nodes
        warm.reset(seed=ep)
        assert warm.devices.shape == (10,)
        done = False
        while not done:
            _, _, done, _, info = warm.step(1)
    assert warm.state.extra["incumbent"].shape == (10,)


def test_a_given_start_must_place_the_tasks_nodes():
    g = synthetic.sample("layered", num_nodes=10, seed=0)
    env = HeuristicStartPlacementEnv(start="incumbent", start_devices=[0, 1] * 5, graph=g, topology="2x_k80")
    _, info = env.reset(seed=0)
    assert info["placement"].tolist() == [0, 1] * 5 and env.state.extra["start_calls"] == 0
    bad = HeuristicStartPlacementEnv(start="incumbent", start_devices=[0, 1, 2], graph=g, topology="2x_k80")
    with pytest.raises(ConfigError, match="start_devices has shape \\(3,\\); graph 'layered-10-s0' has 10 nodes"):
        bad.reset(seed=0)


def test_constructive_env_redraws_family_tasks_that_do_not_fit_in_memory():
    topo = _small_memory(100)  # 200 MiB in all: about half the family's draws (25-540 MiB) fit
    env = ConstructivePlacementEnv(graph="synthetic:layered", topology=topo)
    for seed in range(8):
        env.reset(seed=seed)
        assert pinned_memory(env.task.graph, env.task.costs).sum() <= 200 * 2**20
    # the same draws as the op-level envs, which give the overflowing tasks a penalised episode instead
    op = PlacementEnv(graph="synthetic:layered", topology=topo)
    drawn = set()
    for seed in range(8):
        op.reset(seed=seed)
        drawn.add(pinned_memory(op.task.graph, op.task.costs).sum() > 200 * 2**20)
    assert drawn == {True, False}
    # a single graph and topology: refused at once, one line naming both
    big = synthetic.sample("layered", num_nodes=24, seed=0)
    with pytest.raises(PlanError) as exc:
        ConstructivePlacementEnv(graph=big, topology=_small_memory(1)).reset(seed=0)
    msg = str(exc.value)
    assert "\n" not in msg and "'layered-24-s0'" in msg and "'k80_1mib'" in msg
    # a family none of whose draws fits: refused after a bounded number of draws
    with pytest.raises(PlanError, match=f"^{MAX_DRAWS} tasks in a row drawn from the graph source do not fit"):
        ConstructivePlacementEnv(graph="synthetic:layered", topology=_small_memory(1)).reset(seed=0)


def test_constructive_env_takes_render_mode():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the passive checker's warnings
        env = gym.make(CONS, graph="synthetic:layered", topology="2x_k80", render_mode="ansi")
    other = ConstructivePlacementEnv(graph="synthetic:layered", topology="2x_k80", render_mode="rgb_array")
    env.reset(seed=0)
    text = env.render()
    g = env.unwrapped.task.graph
    assert text.startswith(f"{g.name} on 2x_k80: current node") and len(text.splitlines()) == g.num_nodes + 1
    env.step(0)
    assert "-> 0" in env.render()
    other.reset(seed=0)
    assert other.render() is None


def _info_keys(env: gym.Env) -> set[str]:
    rng = np.random.default_rng(0)
    _, info = env.reset(seed=0)
    keys, done = set(info), False
    while not done:
        _, _, done, _, info = env.step(_valid_action(env, rng))
        keys |= set(info)
    return keys


@pytest.mark.parametrize("cls", [PlacementEnv, OneShotPlacementEnv, PipelineEnv, ConstructivePlacementEnv])
def test_every_info_key_is_documented(cls):
    g = synthetic.sample("layered", num_nodes=10, seed=0)
    doc = cls.__doc__ if cls is not ConstructivePlacementEnv else sys.modules[cls.__module__].__doc__
    missing = sorted(k for k in _info_keys(cls(graph=g, topology="2x_k80")) if f"``{k}``" not in doc)
    assert not missing, f"{cls.__name__} does not document info keys {missing}"


def _cfg(command: str, *overrides: str):
    from placement_rl.cli.common import _compose

    cfg, _ = _compose(command, list(overrides), [])
    return OmegaConf.create(cfg)


def test_place_sequential_replays_the_greedy_rollout_training_scored(tmp_path, monkeypatch, capsys):
    """Trained from the incumbent (the default): place starts where training's greedy rollout started."""
    from placement_rl.agents.checkpoint import load_checkpoint
    from placement_rl.cli import place, train
    from placement_rl.errors import CheckpointError

    small = ("graph=synthetic", "graph.num_nodes=12", "topology=2x_k80", "progress=false")
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    m = train.run(_cfg("train", *small, "env=placement", "agent=reinforce", "trainer=quick", "trainer.total_steps=64",
                       "trainer.compare=false"))
    ckpt = tmp_path / "checkpoint.pt"
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path / "place")
    (tmp_path / "place").mkdir()
    pm = place.run(_cfg("place", *small, f"checkpoint={ckpt}", "samples=0", "compare=false", "decode=sequential"))
    assert pm["step_time"] == m["policy_greedy_time"]  # from best_single, where place started before, it differs
    config = load_checkpoint(ckpt)["config"]
    assert config["env_options"]["initial_placement"] == "incumbent" and len(config["start"]["devices"]) == 12
    assert pm["start"].endswith("the placement training recorded on this graph and topology")
    # another graph: the episode starts from the best cheap heuristic's placement, as training's would
    other = ("graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "progress=false")
    pm = place.run(_cfg("place", *other, f"checkpoint={ckpt}", "samples=0", "compare=false", "decode=sequential"))
    assert pm["start"] == "initial_placement=incumbent: the best cheap heuristic's placement"
    # a checkpoint of an earlier release (no env options): the env's defaults, and a note saying so
    data = torch.load(ckpt, weights_only=True)
    del data["config"]["env_options"], data["config"]["start"]
    torch.save(data, tmp_path / "old.pt")
    capsys.readouterr()
    pm = place.run(_cfg("place", *small, f"checkpoint={tmp_path / 'old.pt'}", "samples=0", "compare=false",
                        "decode=sequential"))
    assert pm["start"].startswith("initial_placement=best_single (the env's default")
    assert place.unrecorded_note(str(tmp_path / "old.pt")) in capsys.readouterr().out.splitlines()
    # a damaged start record is a one-line refusal
    data = torch.load(ckpt, weights_only=True)
    data["config"]["start"]["devices"] = ["x"]
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="'config.start' must hold graph, topology and devices"):
        load_checkpoint(tmp_path / "bad.pt")
