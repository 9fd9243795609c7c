"""``PipelineEnv`` on unequal clusters: devices fastest first (a slow device left out), inference, throughput."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from placement_rl.envs.pipeline import PipelineEnv
from placement_rl.errors import ConfigError

from tests.test_pipe_hetero import slow_cpu_case


def episode(env: PipelineEnv, degrees: list[int]) -> dict:
    """No cuts (one stage), then the given DP degree, then 0 for every flag."""
    obs, info = env.reset(seed=0)
    done, k = False, 0
    while not done:
        if info["phase"] == 1:
            action, k = degrees[k] - 1, k + 1
        else:
            action = 0
        obs, reward, done, _, info = env.step(action)
    return info


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_fastest_device_order_leaves_the_slow_cpu_out(mode: str) -> None:
    g, costs, topo = slow_cpu_case(n=6)
    order = [6, 0, 1, 2, 3, 4, 5]  # the CPU (23x slower) listed first
    topo = topo.subset(order)
    costs = dataclasses.replace(costs, fwd_time=costs.fwd_time[:, order], bwd_time=costs.bwd_time[:, order],
                                launch_overhead=costs.launch_overhead[:, order],
                                link_latency=costs.link_latency[np.ix_(order, order)],
                                link_bandwidth=costs.link_bandwidth[np.ix_(order, order)])
    kw = dict(graph=g, topology=topo, cost_fn=lambda *_: costs, mode=mode, num_microbatches=1, sharding="dp")
    info = episode(PipelineEnv(device_order="fastest", **kw), [6])
    assert info["plan"].stage_devices == ((1, 2, 3, 4, 5, 6),) and info["feasible"]
    slow = episode(PipelineEnv(**kw), [6])  # index order hands the CPU out first
    assert 0 in slow["plan"].stage_devices[0] and slow["step_time"] > 5 * info["step_time"]


def test_throughput_objective_rewards_the_steady_time() -> None:
    g, costs, topo = slow_cpu_case(n=6)
    env = PipelineEnv(graph=g, topology=topo, cost_fn=lambda *_: costs, device_order="fastest",
                      objective="throughput", num_microbatches=2, sharding="dp")
    info = episode(env, [3])
    res = env.state.source.run(info["plan"])
    assert info["objective_value"] == pytest.approx(res.meta["steady_time"])
    with pytest.raises(ConfigError, match="device_order"):
        PipelineEnv(graph=g, topology=topo, cost_fn=lambda *_: costs, device_order="slowest")


def test_op_level_env_with_inference_costs_ends_where_simulate_does() -> None:
    """``PlacementEnv`` scores with ``simulate``: forward-only costs give a forward-only step and memory."""
    from placement_rl.cost import simulate
    from placement_rl.cost.modes import inference_costs
    from placement_rl.envs.placement import PlacementEnv

    g, costs, topo = slow_cpu_case(n=6)
    inf = inference_costs(costs)
    env = PlacementEnv(graph=g, topology=topo, cost_fn=lambda *_: inf)
    obs, info = env.reset(seed=0)
    done = False
    while not done:
        obs, _, done, _, info = env.step(0)
    res = simulate(g, inf, topo, info["placement"])
    assert info["step_time"] == pytest.approx(res.step_time)
    assert res.step_time == pytest.approx(float(inf.fwd_time[:, 0].sum()))  # forward only, one device
    assert res.peak_memory[0] == pytest.approx(float(g.param_bytes.sum()))  # parameters alone
    assert np.allclose(env.state.node_mem, g.param_bytes)
