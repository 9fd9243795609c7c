"""Environments: Gymnasium/SB3 checkers, seeded determinism, masks, rewards, graph sources."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from placement_rl import envs
from placement_rl.cost import simulate_pipeline
from placement_rl.envs import GraphSource, OneShotPlacementEnv, PipelineEnv, PlacementEnv, SimulatedReward
from placement_rl.envs.base import node_memory
from placement_rl.cost import Simulator, resolve_costs
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.graph import make_graph, synthetic
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology


def _topology(memory: float = 16e9, count: int = 2, name: str = "t") -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": name,
        "devices": [{"name": "fast", "kind": "gpu", "peak_flops": 2e12, "mem_bandwidth": 4e11, "memory_bytes": memory}]
        + [{"name": "slow", "count": count - 1, "numbered": True, "kind": "gpu", "peak_flops": 1e12,
            "mem_bandwidth": 2e11, "memory_bytes": memory}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})


@pytest.fixture
def graph():
    """A 6-node DAG: two branches joined by an add, each node 100 param bytes, tiny edges."""
    nodes = [{"name": f"n{i}", "op_type": op, "fwd_flops": f, "bwd_flops": 2 * f, "param_bytes": 100.0,
              "out_bytes": 8.0, "act_bytes": 0.0}
             for i, (op, f) in enumerate([("linear", 4e9), ("linear", 3e9), ("relu", 1e9), ("linear", 5e9),
                                          ("add", 1e8), ("linear", 2e9)])]
    edges = [[0, 1, 1.0], [0, 3, 1.0], [1, 2, 1.0], [2, 4, 1.0], [3, 4, 1.0], [4, 5, 1.0]]
    return make_graph(nodes, edges, name="tiny")


@pytest.fixture
def topo():
    return _topology()


def _masked_action(env, rng: np.random.Generator):
    mask = env.unwrapped.action_masks()
    if isinstance(env.unwrapped, OneShotPlacementEnv):
        rows = mask.reshape(env.unwrapped.layout.max_nodes, env.unwrapped.layout.max_devices)
        return np.array([rng.choice(np.flatnonzero(r)) for r in rows], dtype=np.int64)
    return int(rng.choice(np.flatnonzero(mask)))


def _rollout(env, seed: int, episodes: int = 3):
    rng = np.random.default_rng(seed)
    trace = []
    obs, info = env.reset(seed=seed)
    for _ in range(episodes):
        done = False
        while not done:
            obs, reward, term, trunc, info = env.step(_masked_action(env, rng))
            trace.append((obs, reward, {k: v for k, v in info.items() if k not in ("plan", "best_plan")}))
            done = term or trunc
        obs, info = env.reset()
        trace.append((obs, 0.0, info))
    return trace


# ------------------------------------------------------------------ checkers
@pytest.mark.parametrize("env_id", list(envs.ENV_IDS))
def test_registered_envs_pass_gymnasium_and_sb3_checkers(env_id, graph, topo):
    env = gym.make(env_id, graph=graph, topology=topo, max_devices=3)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*unconventional shape.*")
        gym_check_env(env.unwrapped, skip_render_check=False)
        sb3_check_env(env.unwrapped, warn=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert (obs["edge_index"][:, graph.num_edges:] == -1).all()
    assert (obs["edge_index"][:, :graph.num_edges] == graph.edges.T).all()
    assert int(obs["num_nodes"][0]) == graph.num_nodes


@pytest.mark.parametrize("env_id", list(envs.ENV_IDS))
def test_seeded_rollouts_are_identical(env_id, topo):
    def make():
        return gym.make(env_id, graph=GraphSource.synthetic(["layered", "cnn_like"], [topo, _topology(count=3)],
                                                            num_nodes=(8, 14)))

    a, b = _rollout(make(), seed=7), _rollout(make(), seed=7)
    assert len(a) == len(b)
    for (oa, ra, ia), (ob, rb, ib) in zip(a, b):
        assert ra == rb
        for k in oa:
            np.testing.assert_array_equal(oa[k], ob[k])
        assert ia.keys() == ib.keys()
        for k in ia:
            np.testing.assert_array_equal(ia[k], ib[k])
    c = _rollout(make(), seed=8)
    assert any(not np.array_equal(x[0]["node_features"], y[0]["node_features"]) for x, y in zip(a, c))


# -------------------------------------------------------------------- masks
def test_oneshot_masks_cover_padding(graph, topo):
    env = OneShotPlacementEnv(graph=graph, topology=topo, max_nodes=9, max_devices=4)
    env.reset(seed=0)
    m = env.action_masks().reshape(9, 4)
    n = graph.num_nodes
    assert m[:n, :2].all() and not m[:, 2:].any()  # padded devices never
    assert m[n:, 0].all() and not m[n:, 1:].any()  # padded nodes: device 0 only
    assert env.action_space.nvec.tolist() == [4] * 9


def test_oneshot_reward_matches_simulator(graph, topo):
    env = OneShotPlacementEnv(graph=graph, topology=topo, max_devices=3)
    _, info0 = env.reset(seed=0)
    action = np.array([0, 1, 1, 0, 0, 2], dtype=np.int64)  # device 2 is padding: read as 2 mod 2 = 0
    _, reward, term, trunc, info = env.step(action)
    sim = Simulator(graph, resolve_costs(graph, topo), topo)
    res = sim.run(np.array([0, 1, 1, 0, 0, 0]))
    t1 = min(sim.step_time(np.full(6, d)) for d in range(2))
    assert term and not trunc
    assert info["step_time"] == pytest.approx(res.step_time) and info["feasible"] == res.feasible
    assert info0["best_single_time"] == pytest.approx(t1)
    assert reward == pytest.approx((t1 - res.step_time) / t1)
    assert info["placement"].tolist() == [0, 1, 1, 0, 0, 0]


def test_placement_masks_never_allow_overflow_when_a_device_fits(graph):
    # 6 nodes x (4 x 100 B) = 2400 B; 1500 B per device: one device can not hold the model, two can.
    topo = _topology(memory=1500.0)
    env = PlacementEnv(graph=graph, topology=topo, max_devices=3)
    mem = 4 * graph.param_bytes
    rng = np.random.default_rng(0)
    for ep in range(20):
        _, info = env.reset(seed=ep)
        assert not info["feasible"]  # all on the best single device overflows
        done = False
        while not done:
            mask = env.action_masks()
            assert mask.shape == (3,) and not mask[2]
            i = int(env.buf.current_node[0])
            usage = np.bincount(env.devices, weights=mem, minlength=2)
            usage[env.devices[i]] -= mem[i]
            fits = usage + mem[i] <= 1500.0
            if fits.any():
                assert (mask[:2] == fits).all()
            assert mask.any()
            _, reward, done, _, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        assert info["feasible"], "following the masks must end in a placement that fits"


def test_placement_mask_off_and_infeasible_penalty(graph):
    topo = _topology(memory=1500.0)
    env = PlacementEnv(graph=graph, topology=topo, mask_memory=False, infeasible_penalty=2.5, reward="final")
    _, info0 = env.reset(seed=0)
    assert env.action_masks().all()
    rewards = []
    for _ in range(graph.num_nodes):
        _, r, done, _, info = env.step(0)  # keep everything on device 0: overflows
        rewards.append(r)
    assert done and not info["feasible"]
    assert rewards[:-1] == [0.0] * (graph.num_nodes - 1)
    t1 = info["best_single_time"]
    assert rewards[-1] == pytest.approx((t1 - info["step_time"]) / t1 - 2.5)


# ------------------------------------------------------------------ rewards
@pytest.mark.parametrize("initial", ["best_single", "random", 1])
def test_incremental_rewards_sum_to_total_gain(graph, topo, initial):
    env = PlacementEnv(graph=graph, topology=topo, initial_placement=initial, passes=2)
    rng = np.random.default_rng(3)
    for ep in range(5):
        _, info0 = env.reset(seed=ep)
        total, steps, done = 0.0, 0, False
        while not done:
            _, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
            total += r
            steps += 1
        assert steps == 2 * graph.num_nodes and info["feasible"]
        t1 = info["best_single_time"]
        assert total == pytest.approx((info0["step_time"] - info["step_time"]) / t1, rel=1e-9, abs=1e-12)
        assert info["best_step_time"] <= info["step_time"]
        assert SimulatedReward(graph, resolve_costs(graph, topo), topo).evaluate(info["placement"]) == (
            pytest.approx(info["step_time"]), True)


def test_simulated_reward_fast_path_matches_run(graph):
    topo = _topology(memory=1500.0)
    src = SimulatedReward(graph, resolve_costs(graph, topo), topo)
    rng = np.random.default_rng(0)
    for _ in range(20):
        dev = rng.integers(2, size=graph.num_nodes).astype(np.int64)
        res = src.sim.run(dev)
        assert src.evaluate(dev) == (res.step_time, res.feasible)


def test_reward_source_object_and_factory(graph, topo):
    class Counting:
        def __init__(self, g, c, t):
            self.inner, self.calls = SimulatedReward(g, c, t), 0

        def evaluate(self, dev):
            self.calls += 1
            return self.inner.evaluate(dev)

    src = Counting(graph, resolve_costs(graph, topo), topo)
    env = PlacementEnv(graph=graph, topology=topo, reward_source=src)
    env.reset(seed=0)
    assert src.calls == 2  # best single device: one call per device
    env.step(1 - env.devices[env.buf.current_node[0]])
    assert src.calls == 3
    made = []
    env = OneShotPlacementEnv(graph="synthetic:layered", topology=topo,
                              reward_source=lambda g, c, t: made.append(Counting(g, c, t)) or made[-1])
    env.reset(seed=0)
    env.reset(seed=1)
    assert len(made) == 2 and all(m.calls == 2 for m in made)
    with pytest.raises(ConfigError, match="factory"):
        PlacementEnv(graph="synthetic:layered", topology=topo, reward_source=src)


def test_cost_fn_hook(graph, topo):
    def doubled(g, t) -> CostTable:
        c = resolve_costs(g, t)
        return CostTable(fwd_time=2 * c.fwd_time, bwd_time=2 * c.bwd_time, link_latency=c.link_latency,
                         link_bandwidth=c.link_bandwidth, source=c.source, launch_overhead=2 * c.launch_overhead)

    _, base = PlacementEnv(graph=graph, topology=topo).reset(seed=0)
    _, dbl = PlacementEnv(graph=graph, topology=topo, cost_fn=doubled).reset(seed=0)
    assert dbl["best_single_time"] == pytest.approx(2 * base["best_single_time"])


# ----------------------------------------------------------------- pipeline
def test_pipeline_masks_plan_and_reward():
    g = synthetic.sample("transformer_like", num_nodes=16, seed=0)
    topo = _topology(count=4)
    env = PipelineEnv(graph=g, topology=topo, num_microbatches=2, batch_size=8, schedule="gpipe", max_devices=5,
                      sharding="dp")
    rng = np.random.default_rng(0)
    for ep in range(15):
        obs, info = env.reset(seed=ep)
        steps, done = 0, False
        while not done:
            mask = env.action_masks()
            assert mask.shape == (5,) and mask.any()
            if obs["phase"][0] == 0:
                assert not mask[2:].any()
            else:
                degrees = np.flatnonzero(mask) + 1
                assert all(8 % (2 * p) == 0 and p <= 4 for p in degrees)  # p = 3 never (8 % 6)
            obs, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(mask))))
            steps += 1
        plan = info["plan"]
        assert isinstance(plan, StagePlan) and isinstance(info["best_plan"], StagePlan)
        plan.validate(g, topo)
        assert plan.world_size <= 4 and steps == g.num_nodes - 1 + plan.num_stages
        assert plan.num_microbatches == 2 and plan.sharding == "dp"
        assert obs["stage_dp"][:plan.num_stages].tolist() == list(plan.dp_degrees)
        t1 = info["best_single_time"]
        assert r == pytest.approx((t1 - info["step_time"]) / t1 - (0 if info["feasible"] else 1.0))
        assert info["best_step_time"] <= info["step_time"]


def test_pipeline_env_decides_the_whole_plan():
    """Micro-batch count and DP vs FSDP are decisions; one stage over every device is reachable."""
    g = synthetic.sample("transformer_like", num_nodes=12, seed=1)
    topo = _topology(count=4)
    env = PipelineEnv(graph=g, topology=topo, batch_size=32)
    rng = np.random.default_rng(1)
    seen_m, seen_sh = set(), set()
    for ep in range(25):
        obs, info = env.reset(seed=ep)
        done, phases = False, []
        while not done:
            mask = env.action_masks()
            phases.append(int(obs["phase"][0]))
            if obs["phase"][0] >= 2:
                assert mask[0] and not mask[2:].any()
            obs, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        plan = info["plan"]
        plan.validate(g, topo)
        assert all(32 % (plan.num_microbatches * p) == 0 for p in plan.dp_degrees)
        assert plan.num_stages == 1 or plan.num_microbatches >= plan.num_stages
        assert phases[-1] == 3 and phases == sorted(phases)
        assert info["step_time"] == pytest.approx(simulate_pipeline(g, env.state.task.costs, topo, plan).step_time)
        seen_m.add(plan.num_microbatches)
        seen_sh.add(plan.sharding)
    assert len(seen_m) > 2 and seen_sh == {"dp", "fsdp"}
    # never cut, give the one stage all 4 devices, keep m = 1, DDP: plain data parallelism
    env.reset(seed=0)
    for _ in range(g.num_nodes - 1):
        env.step(0)
    env.step(3)
    assert env.action_masks()[:2].tolist() == [True, True]  # micro-batches: keep or double
    env.step(0)
    _, _, done, _, info = env.step(0)
    assert done and info["plan"].dp_degrees == (4,) and info["plan"].num_stages == 1
    assert info["plan"].num_microbatches == 1 and info["plan"].sharding == "dp"


# ------------------------------------------------------------ graph sources
def test_synthetic_source_sizes_and_seeds(topo):
    env = PlacementEnv(graph=GraphSource.synthetic("series_parallel", topo, num_nodes=(10, 20)))
    assert env.layout.max_nodes == 20
    sizes = set()
    for s in range(12):
        obs, _ = env.reset(seed=s)
        sizes.add(int(obs["num_nodes"][0]))
        assert 10 <= obs["num_nodes"][0] <= 20
    assert len(sizes) > 3
    a, _ = env.reset(seed=5)
    b, _ = env.reset(seed=5)
    np.testing.assert_array_equal(a["node_features"], b["node_features"])


def test_folder_source_and_topology_list(tmp_path, graph, topo):
    other = synthetic.sample("layered", num_nodes=12, seed=3)
    graph.to_json(tmp_path / "a.json")
    other.to_json(tmp_path / "b.json")
    t3 = _topology(count=3, name="t3")
    env = OneShotPlacementEnv(graph=str(tmp_path), topology=[topo, t3])
    assert env.layout.max_nodes == 12 and env.layout.max_devices == 3
    seen = set()
    for s in range(20):
        obs, info = env.reset(seed=s)
        seen.add((int(obs["num_nodes"][0]), int(obs["device_mask"].sum())))
    assert seen == {(6, 2), (6, 3), (12, 2), (12, 3)}
    assert len(env.source._tasks) == 4  # costs resolved once per (graph, topology)


def test_fixed_source_caches_costs(graph, topo):
    calls = []

    def counting(g, t):
        calls.append(g.name)
        return resolve_costs(g, t)

    env = PlacementEnv(graph=graph, topology=topo, cost_fn=counting)
    for s in range(3):
        env.reset(seed=s)
    assert calls == ["tiny"]


@pytest.mark.slow
def test_zoo_source(topo):
    src = GraphSource.zoo("mlp", topo)
    env = PlacementEnv(graph=src)
    obs, info = env.reset(seed=0)
    assert int(obs["num_nodes"][0]) == src.graphs[0].num_nodes and info["feasible"]


def test_bad_configuration_is_a_config_error(graph, topo):
    with pytest.raises(ConfigError, match="unknown option 'bogus'"):
        PlacementEnv(graph=graph, topology=topo, bogus=1)
    with pytest.raises(ConfigError, match="max_nodes"):
        PlacementEnv(graph=graph, topology=topo, max_nodes=3)
    with pytest.raises(ConfigError, match="reward"):
        PlacementEnv(graph=graph, topology=topo, reward="sparse")
    with pytest.raises(ConfigError, match="do not pass topology"):
        PlacementEnv(graph=GraphSource.fixed(graph, topo), topology=topo)
    with pytest.raises(ConfigError, match="batch_size"):
        PipelineEnv(graph=graph, topology=topo, num_microbatches=4, batch_size=6)
    with pytest.raises(ConfigError, match="neither"):
        PlacementEnv(graph="no/such/file.json", topology=topo)
    with pytest.raises(ConfigError, match="initial_placement"):
        PlacementEnv(graph=graph, topology=topo, initial_placement=5).reset(seed=0)


def test_observation_features(graph, topo):
    env = PlacementEnv(graph=graph, topology=topo, max_nodes=8, max_devices=3, copy_obs=False)
    obs, _ = env.reset(seed=0)
    lay, nf = env.layout, obs["node_features"]
    assert nf.shape == (8, lay.num_features) and not nf[6:].any()  # padded rows are zero
    assert np.allclose(nf[:6, lay.speed][:, :2].max(axis=1), 1.0) and not nf[:, lay.speed][:, 2].any()
    assert (nf[:6, lay.device][:, env.devices[0]] == 1).all()
    assert nf[0, lay.current] == 1 and nf[:, lay.current].sum() == 1 and not nf[:, lay.placed].any()
    assert obs["op_type"][:6].min() >= 1 and not obs["op_type"][6:].any()
    assert obs["op_type"][0] == obs["op_type"][1]  # both linear
    assert nf[5, 7] == 1.0 and nf[0, 7] == 0.0  # topological depth fraction
    obs, *_ = env.step(1)
    assert nf[0, lay.placed] == 1 and obs["placement"][0] == 1 and nf[0, lay.device][1] == 1
    assert obs["current_node"][0] == graph.topo_order[1]
    assert node_memory(env.state.task).tolist() == [400.0] * 6


@pytest.mark.parametrize("cls", [PlacementEnv, OneShotPlacementEnv])
def test_maskable_ppo_accepts_the_env(cls, graph, topo):
    from sb3_contrib import MaskablePPO

    env = cls(graph=graph, topology=topo, max_devices=3)
    model = MaskablePPO("MultiInputPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.learn(32)
    action, _ = model.predict(env.reset(seed=0)[0], action_masks=env.action_masks(), deterministic=True)
    mask = env.action_masks().reshape(-1, 3) if cls is OneShotPlacementEnv else env.action_masks()[None]
    assert all(mask[i, a] for i, a in enumerate(np.atleast_1d(action)))


# ---------------------------------------------------------------- contract
@pytest.mark.parametrize("env_id", list(envs.ENV_IDS))
def test_actions_outside_the_space_and_steps_out_of_an_episode_are_one_line_errors(env_id, graph, topo):
    """An index past the action space (99 of ``Discrete(3)``, -1) was folded onto a device, a step after the
    episode's end raised an ``IndexError`` (PlacementEnv), an ``AssertionError`` before reset (constructive) or ran
    again (PipelineEnv); each is a ``ConfigError`` naming what to do now."""
    env = gym.make(env_id, graph=graph, topology=topo, max_devices=3).unwrapped
    with pytest.raises(ConfigError, match="reset"):
        env.step(env.action_space.sample())
    env.reset(seed=0)
    if isinstance(env.action_space, gym.spaces.Discrete):
        for bad in (99, -1, 1.5, "a"):
            with pytest.raises(ConfigError, match="action"):
                env.step(bad)
    done = False
    while not done:
        _, _, term, trunc, _ = env.step(_masked_action(env, np.random.default_rng(0)))
        done = term or trunc
    with pytest.raises(ConfigError, match="reset"):  # (no action is allowed now: any one in the space)
        env.step(np.zeros(env.action_space.shape, np.int64) if env.action_space.shape else 0)


@pytest.mark.parametrize("env_id", [e for e in envs.ENV_IDS if "Constructive" not in e])
def test_the_best_result_in_info_is_the_callers_copy(env_id, graph, topo):
    """``info["best_placement"]`` / ``info["best_plan"]`` was the env's own object: a caller's edit changed the
    best the env reported next, beside the best step time of another placement."""
    env = gym.make(env_id, graph=graph, topology=topo, max_devices=3).unwrapped
    key = "best_plan" if isinstance(env, PipelineEnv) else "best_placement"

    def arr(x):
        return x.stage_of_node if key == "best_plan" else x

    def episode():
        env.reset(seed=0)
        rng, done = np.random.default_rng(0), False
        while not done:  # the same actions each time: the same result, so the best stays the first one
            _, _, term, trunc, info = env.step(_masked_action(env, rng))
            done = term or trunc
        return info

    first = episode()
    kept = arr(first[key]).copy()
    if arr(first[key]).flags.writeable:
        arr(first[key])[:] = 1 - kept  # the caller's copy, changed
    else:  # a plan's arrays are read-only, its copies' too: the caller cannot change the env's best through them
        with pytest.raises(ValueError):
            arr(first[key])[:] = 1 - kept
    second = episode()
    assert second["best_step_time"] == first["best_step_time"]
    np.testing.assert_array_equal(arr(second[key]), kept)
