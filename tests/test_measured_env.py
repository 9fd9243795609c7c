"""``MeasuredReward``: the reward from real runs of the placement (2x_cpu), inside a Gymnasium env."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from placement_rl.envs import PlacementEnv
from placement_rl.envs.measured import MeasuredReward
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.topology import DeviceTopology, load_topology


@pytest.fixture(scope="module")
def tiny():
    module, inputs = zoo.build("mlp", batch_size=8, in_features=16, hidden=16, layers=2)
    return module, inputs, capture(module, inputs, name="mlp")


def test_measured_reward_env_passes_check_env(tiny):
    module, inputs, graph = tiny
    topo = load_topology("2x_cpu")
    src = MeasuredReward(module, inputs, graph, topo, steps=2, warmup=1, timeout_s=30)
    env = PlacementEnv(graph=graph, topology=topo, reward_source=src)
    check_env(env, skip_render_check=True)
    assert src.measurements >= 2 and src.measurements == len(src.cache)
    obs, _ = env.reset(seed=0)
    _, reward, *_ = env.step(1)
    assert np.isfinite(reward)


def test_measurements_are_cached_by_placement(tiny):
    module, inputs, graph = tiny
    src = MeasuredReward(module, inputs, graph, load_topology("2x_cpu"), steps=1, warmup=0)
    place = np.arange(graph.num_nodes) % 2
    t1, ok1 = src.evaluate(place)
    t2, ok2 = src.evaluate(place.copy())
    assert ok1 and ok2 and t1 == t2 > 0 and src.measurements == 1


def test_over_time_limit_or_memory_is_infeasible_and_says_why(tiny, caplog):
    module, inputs, graph = tiny
    slow = MeasuredReward(module, inputs, graph, load_topology("2x_cpu"), steps=3, timeout_s=1e-9)
    assert slow.evaluate(np.zeros(graph.num_nodes, dtype=int)) == (1e-9, False)
    assert slow.last_error.startswith("timeout") and "time limit" in caplog.text
    data = load_topology("2x_cpu").to_dict()
    data["devices"][0]["memory_bytes"] = 100.0
    tight = MeasuredReward(module, inputs, graph, DeviceTopology.from_dict(data), timeout_s=5.0)
    assert tight.evaluate(np.zeros(graph.num_nodes, dtype=int)) == (5.0, False)
    assert "does not fit" in tight.last_error
    assert tight.evaluate(np.ones(graph.num_nodes, dtype=int))[1]
