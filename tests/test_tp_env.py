"""PipelineEnv with the TP degree in its action and observation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env as gym_check_env

from placement_rl.envs import PipelineEnv
from placement_rl.cost import simulate_pipeline
from placement_rl.graph.capture import capture_zoo
from placement_rl.topology import load_topology

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def case():
    g = capture_zoo("gpt", batch_size=8, seq_len=16, vocab_size=96, d_model=32, n_layers=2, n_heads=4)
    return g, load_topology("4x_v100_nvlink")


def rollout(env, seed):
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    done, phases, actions = False, [], []
    while not done:
        mask = env.action_masks()
        phases.append(int(obs["phase"][0]))
        if phases[-1] == 4:
            assert mask[0] and all((k + 1) in (1, 2, 4) for k in np.flatnonzero(mask))  # 3 splits neither 4 heads
        a = int(rng.choice(np.flatnonzero(mask)))
        if phases[-1] == 0 and rng.random() > 0.03:
            a = 0  # few cuts, so that devices are left for TP
        actions.append(a)
        obs, r, done, _, info = env.step(a)
    return obs, r, info, phases, actions


def test_tp_phase_plans_and_rewards(case):
    g, topo = case
    env = PipelineEnv(graph=g, topology=topo, max_devices=4)
    seen = set()
    for ep in range(20):
        obs, r, info, phases, _ = rollout(env, ep)
        plan = info["plan"]
        plan.validate(g, topo)
        assert phases == sorted(phases) and obs["tp"][0] == plan.tp[0]
        assert plan.world_size <= 4
        assert info["step_time"] == pytest.approx(simulate_pipeline(g, env.state.task.costs, topo, plan).step_time)
        seen.add(plan.tp[0])
    assert {1, 2} <= seen


def test_fixed_tp_and_seeded_rollouts_repeat(case):
    g, topo = case
    env = PipelineEnv(graph=g, topology=topo, max_devices=4, tp=2)
    _, _, info, phases, _ = rollout(env, 3)
    assert 4 not in phases and set(info["plan"].tp) == {2}
    env2 = PipelineEnv(graph=g, topology=topo, max_devices=4)
    a, b = rollout(env2, 7), rollout(env2, 7)
    assert a[4] == b[4] and a[2]["step_time"] == b[2]["step_time"]


def test_env_checker(case):
    g, topo = case
    gym_check_env(PipelineEnv(graph=g, topology=topo, max_devices=4), skip_render_check=True)
