"""SB3's ``make_vec_env`` builds every registered env (it asks for render_mode='rgb_array'), and
ConstructivePlacementEnv takes the same default graph and topology as the others."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from placement_rl.envs import ENV_IDS  # importing it registers the ids

torch.set_num_threads(1)


@pytest.mark.parametrize("env_id", list(ENV_IDS))
def test_make_vec_env_builds_every_env(env_id):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    kwargs = {"graph": "synthetic:layered", "topology": "2x_k80"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium.make warns that 'rgb_array' is not a render mode of these envs
        vec = make_vec_env(env_id, n_envs=2, seed=7, vec_env_cls=DummyVecEnv, env_kwargs=kwargs)
    try:
        obs = vec.reset()
        assert all(len(v) == 2 for v in obs.values())
        vec.step(np.array([vec.action_space.sample() for _ in range(2)]))
    finally:
        vec.close()


def test_render_mode_ansi_still_renders_and_others_render_nothing():
    from placement_rl.envs import PlacementEnv

    env = PlacementEnv(graph="synthetic:layered", topology="2x_k80", render_mode="ansi")
    env.reset(seed=0)
    assert "on 2x_k80" in env.render()
    other = PlacementEnv(graph="synthetic:layered", topology="2x_k80", render_mode="rgb_array")
    other.reset(seed=0)
    assert other.render() is None


def test_constructive_env_defaults_to_a_synthetic_graph():
    env = gym.make("placement_rl/ConstructivePlacementEnv-v0")
    try:
        env.reset(seed=0)
        task = env.unwrapped.task
        assert task.graph.name.startswith("layered") and task.topology.name == "4x_v100_nvlink"
    finally:
        env.close()
