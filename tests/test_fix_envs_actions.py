"""The one-shot env refuses actions outside its ``MultiDiscrete`` space (and keeps every legal one working); the
constructive env refuses a NaN or negative ``infeasible_penalty`` and unknown options, with one line each."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from placement_rl.envs import OneShotPlacementEnv
from placement_rl.envs.constructive import ConstructivePlacementEnv
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import make_graph

torch.set_num_threads(1)

CONS = "placement_rl/ConstructivePlacementEnv-v0"


@pytest.fixture(scope="module")
def chain():
    """Four linear nodes in a chain."""
    return make_graph([dict(name=f"n{i}", op_type="linear", fwd_flops=1e10, bwd_flops=2e10) for i in range(4)],
                      [[0, 1, 1e6], [1, 2, 1e6], [2, 3, 1e6]], name="chain4")


def _padded_oneshot(graph) -> OneShotPlacementEnv:
    """Four nodes on two devices, padded to six nodes and three devices: ``MultiDiscrete([3] * 6)``."""
    env = OneShotPlacementEnv(graph=graph, topology="2x_k80", max_nodes=6, max_devices=3)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize("action, match", [
    ([99] * 6, r"action entry #0: 99 is outside the action space MultiDiscrete\(\[3\] \* 6\) \(integers 0\.\.2\)"),
    ([0, 1, -1, 0, 0, 0], r"action entry #2: -1 is outside"),
    ([0, 1, 0, 0, 0, 3], r"action entry #5: 3 is outside"),  # a padded node's entry must be in the space too
    ([1.9, 1.0, 0.5, 0, 0, 0], r"action entry #0: 1.9 is outside"),
    ([0, 1, float("nan"), 0, 0, 0], r"action entry #2: nan is outside"),
    ([0, 1, 0], r"action must hold 6 device indices .*MultiDiscrete\(\[3\] \* 6\), got 3"),
    ("abcdef", r"an action of MultiDiscrete\(\[3\] \* 6\) is 6 device indices, got str"),
])
def test_oneshot_refuses_actions_outside_the_space(chain, action, match):
    env = _padded_oneshot(chain)
    with pytest.raises(ConfigError, match=match) as err:
        env.step(np.array(action) if not isinstance(action, str) else action)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("action, placement", [
    (np.array([0, 1, 2, 1, 2, 0], dtype=np.int64), [0, 1, 0, 1]),  # padded device 2 reads as 2 mod 2 = 0
    ([1, 1, 0, 0, 2, 2], [1, 1, 0, 0]),  # padded nodes' entries are ignored
    (np.array([1.0, 0.0, 1.0, 2.0, 0.0, 0.0]), [1, 0, 1, 0]),  # floats with integer values
    (np.array([[1, 0, 1, 1, 0, 0]], dtype=np.int32), [1, 0, 1, 1]),  # a batch of one
    (np.array([True, False, True, False, False, False]), [1, 0, 1, 0]),
])
def test_oneshot_accepts_legal_actions(chain, action, placement):
    _, _, terminated, _, info = _padded_oneshot(chain).step(action)
    assert terminated and info["placement"].tolist() == placement + [-1, -1]


def test_oneshot_accepts_sampled_actions(chain):
    env = _padded_oneshot(chain)
    env.action_space.seed(0)
    for _ in range(20):
        action = env.action_space.sample()
        env.reset(seed=0)
        _, _, _, _, info = env.step(action)
        assert info["placement"][:4].tolist() == (action[:4] % 2).tolist()


@pytest.mark.parametrize("penalty", [float("nan"), -5.0, float("inf"), "1"])
def test_constructive_refuses_bad_penalty(chain, penalty):
    with pytest.raises(ConfigError, match=r"^infeasible_penalty must be a non-negative number, got "):
        ConstructivePlacementEnv(graph=chain, topology="2x_k80", infeasible_penalty=penalty)


@pytest.mark.parametrize("penalty", [0, 2.5, np.float32(0.5)])
def test_constructive_accepts_penalty(chain, penalty):
    env = ConstructivePlacementEnv(graph=chain, topology="2x_k80", infeasible_penalty=penalty)
    assert env.infeasible_penalty == float(penalty)


def test_constructive_refuses_unknown_option(chain):
    with pytest.raises(ConfigError) as err:
        ConstructivePlacementEnv(graph=chain, topology="2x_k80", banana=1)
    assert str(err.value) == ("unknown option 'banana' for ConstructivePlacementEnv (options: graph, "
                              "infeasible_penalty, max_devices, max_edges, max_nodes, render_mode, topology, window)")


def test_constructive_gym_make_refuses_unknown_option(chain):
    with pytest.raises(ConfigError, match=r"^unknown option 'banana' for ConstructivePlacementEnv \(options: "):
        gym.make(CONS, graph=chain, topology="2x_k80", banana=1)
