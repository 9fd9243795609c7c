"""The constructive env and policy: env contract, imitation, any device count, checkpoints, CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl import envs  # noqa: F401 - registers the environments
from placement_rl.agents.constructive import rollout
from placement_rl.agents.constructive_eval import evaluate
from placement_rl.agents.constructive_train import ConstructiveConfig, ConstructiveTrainer, load_policy
from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.envs.topology_sampler import random_topology
from placement_rl.cost import resolve_costs, simulate
from placement_rl.errors import CheckpointError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

ENV_ID = "placement_rl/ConstructivePlacementEnv-v0"


def task(family: str, n: int, seed: int, topo) -> ConstructiveTask:
    g = synthetic.sample(family, num_nodes=n, seed=seed)
    t = load_topology(topo) if isinstance(topo, str) else topo
    return ConstructiveTask.build(g, t, resolve_costs(g, t))


def test_env_contract_and_final_reward() -> None:
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    g = synthetic.sample("layered", num_nodes=24, seed=1)
    env = gym.make(ENV_ID, graph=g, topology="4x_v100_nvlink", disable_env_checker=True).unwrapped
    check_env(env, skip_render_check=True)
    sb3_check_env(env, warn=False)
    runs = []
    for _ in range(2):  # same seed, same episode
        obs, info = env.reset(seed=3)
        rng = np.random.default_rng(0)
        total, done = 0.0, False
        while not done:
            a = int(rng.choice(np.flatnonzero(env.action_masks())))
            obs, r, done, _, info = env.step(a)
            total += r
        runs.append((total, info["placement"].copy()))
    assert runs[0][0] == runs[1][0] and np.array_equal(runs[0][1], runs[1][1])
    t = load_topology("4x_v100_nvlink")
    step = simulate(g, resolve_costs(g, t), t, runs[0][1]).step_time
    assert info["step_time"] == step
    assert total == pytest.approx(np.log(info["reference"] / step))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_imitation_reaches_the_teacher(seed) -> None:
    """Behaviour cloning + DAgger (regret-weighted) on a small fixed set, for three seeds: the student's greedy
    placement is within 1% of its teacher's step time over the set (geometric mean) and within 3% on every task.
    The teacher is the best per task of the one-pass heuristics, sim_eft and the lookahead eft_rollout (here always
    the latter). With the window features the student sees the teacher's criterion (truncated to W nodes), so it
    can fit it; without them seed 0 stalled at 1.20 on one task (measured on an AMD EPYC). The student places these
    30-node graphs with the window over the whole graph (``full_window``), so it is trained on such states too
    (``full_window_train``): trained on W = 16 states and placing with whole-graph ones, all three seeds missed
    layered-30-s0 by 4-8% after the GPU fit's refit with per-class harness floors (1.00 with matching states)."""
    torch.manual_seed(seed)
    tasks = [task("layered", 30, 0, "4x_v100_nvlink"), task("dataflow", 30, 1, "4x_v100_nvlink"),
             task("series_parallel", 30, 2, "2x4_v100_ib"), task("transformer_like", 30, 3, "cpu_2gpu")]
    cfg = ConstructiveConfig(hidden=64, layers=3, bc_epochs=80, dagger_rounds=4, rl_iters=0, seed=seed,
                             full_window_train=True)
    trainer = ConstructiveTrainer(cfg)
    trainer.imitate(tasks)
    ratios = []
    for r in evaluate(trainer.policy, tasks, samples=0):
        name, _ = r.task.teacher()
        ratios.append(r.greedy_time / r.task.refs[name][0])
        assert ratios[-1] <= 1.03, (r.task.graph.name, name, ratios[-1])
    assert float(np.exp(np.mean(np.log(ratios)))) <= 1.01, ratios


def test_searched_teacher_is_never_worse_and_is_what_cloning_sees() -> None:
    """``teacher_search``: annealing from each task's best teacher with its own budget; a task's demo is the
    searched placement only where it is strictly better, the same for 1 worker and any seed of the same draw."""
    from placement_rl.agents.scaleout import refine_teachers
    from placement_rl.cost import simulate

    tasks = [task("layered", 30, 0, "4x_v100_nvlink"), task("dataflow", 30, 1, "2x4_v100_ib"),
             task("layered", 30, 2, "2x4_v100_ib")]  # three: whether annealing improves one task is luck
    starts = [(t, t.teacher()[1]) for t in tasks]
    got = refine_teachers(starts, 300, seed=0)
    assert [np.array_equal(a[0], b[0]) for a, b in zip(got, refine_teachers(starts, 300, seed=0))] == [True] * 3
    for t, (dev, step, feasible) in zip(tasks, got):
        name, _ = t.teacher()
        assert feasible and step <= t.refs[name][0] * (1 + 1e-9)
        assert step == pytest.approx(simulate(t.graph, t.costs, t.topology, dev).step_time, rel=1e-12)
    assert any(step < t.refs[t.teacher()[0]][0] * (1 - 1e-9) for t, (_, step, _) in zip(tasks, got))
    trainer = ConstructiveTrainer(ConstructiveConfig(hidden=16, layers=1, bc_epochs=1, dagger_rounds=0, rl_iters=0,
                                                     teacher_search=300))
    trainer.imitate(tasks)
    rec = [h for h in trainer.history if h["phase"] == "teacher_search"]
    assert rec == [{"phase": "teacher_search", "budget": 300, "tasks": 3,
                    "improved": sum(step < t.refs[t.teacher()[0]][0] * (1 - 1e-9) for t, (_, step, _) in
                                    zip(tasks, got))}]


def test_one_checkpoint_places_on_any_device_count(tmp_path) -> None:
    cfg = ConstructiveConfig(hidden=16, layers=1, bc_epochs=1, dagger_rounds=0, rl_iters=0)
    trainer = ConstructiveTrainer(cfg)
    trainer.imitate([task("layered", 20, 0, "4x_v100_nvlink")])
    path = trainer.save(tmp_path / "ck.pt")
    policy, loaded, _ = load_policy(path)
    assert loaded == cfg
    rng = np.random.default_rng(0)
    g = synthetic.sample("dataflow", num_nodes=60, seed=5)
    for d in (2, 4, 8, 16):
        topo = random_topology(rng, (d, d))
        assert topo.num_devices == d
        t = ConstructiveTask(g, topo, resolve_costs(g, topo))
        ro = rollout(policy, t, samples=2, greedy=False, generator=torch.Generator().manual_seed(0))
        assert ro.devices.min() >= 0 and ro.devices.max() < d
        for k in range(2):
            assert ro.times[k] == simulate(g, t.costs, topo, ro.devices[k]).step_time


def test_bad_checkpoints_are_one_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="is not a PyTorch file, not a checkpoint"):
        load_policy(bad)
    from placement_rl.agents.checkpoint import save_checkpoint

    other = save_checkpoint(tmp_path / "ppo.pt", algo="maskable_ppo", config={}, obs={}, num_timesteps=0, policy={},
                            optimizer=None)
    with pytest.raises(CheckpointError, match="damaged|trained with agent 'maskable_ppo'"):
        load_policy(other)
    trainer = ConstructiveTrainer(ConstructiveConfig(hidden=16, layers=1))
    path = trainer.save(tmp_path / "ck.pt")
    data = torch.load(path, weights_only=True)
    data["policy"] = {k: v[..., :1] for k, v in data["policy"].items()}  # wrong shapes
    torch.save(data, tmp_path / "mangled.pt")
    with pytest.raises(CheckpointError, match="does not hold a constructive policy"):
        load_policy(tmp_path / "mangled.pt")
    data["policy"] = torch.load(path, weights_only=True)["policy"]
    data["obs"]["num_device_features"] = 3
    torch.save(data, tmp_path / "mismatch.pt")
    with pytest.raises(CheckpointError, match="num_device_features"):
        load_policy(tmp_path / "mismatch.pt")


def test_compiled_greedy_decode_matches_torch() -> None:
    """The numba greedy decoder and the torch head choose the same devices."""
    from placement_rl.agents.constructive import graph_tensors
    from placement_rl.agents.constructive_train import build_policy

    torch.manual_seed(0)
    policy = build_policy(ConstructiveConfig(hidden=16, layers=1))
    t = task("dataflow", 80, 4, "2x4_v100_ib")
    fast = rollout(policy, t, samples=1, greedy=True)
    slow = rollout(policy, t, samples=2, greedy=True)  # two episodes take the torch path (same window: placing)
    assert np.array_equal(fast.devices[0], slow.devices[0]) and fast.times[0] == slow.times[0]
    policy.full_window = 0  # and at the trained window, as the recorded (torch) path reads it
    fast = rollout(policy, t, samples=1, greedy=True)
    slow = rollout(policy, t, samples=1, greedy=True, record=True)
    assert np.array_equal(fast.devices, slow.devices) and fast.times[0] == slow.times[0]
    assert graph_tensors(t)[0].shape == (80, t.x.shape[1])


@pytest.mark.parametrize("greedy_fits,sample_fits,times,want", [
    (True, [True, True], (5.0, [6.0, 4.0]), (4.0, 1, True)),     # a faster sample that fits
    (True, [False, True], (5.0, [3.0, 6.0]), (5.0, -1, True)),   # a faster sample that overflows never counts
    (False, [False, True], (5.0, [3.0, 6.0]), (6.0, 1, True)),   # an overflowing greedy never counts either
    (False, [False, False], (5.0, [3.0, 6.0]), (5.0, -1, False)),  # none fits: the greedy one, said not to fit
])
def test_the_best_learned_placement_is_the_fastest_that_fits_and_says_which(greedy_fits, sample_fits, times,
                                                                            want) -> None:
    """``TaskResult``'s best of greedy and samples: its time, its devices, which one it is and whether it fits agree
    (``place`` writes ``best_devices`` and reports ``best_time``, ``best_index`` and ``best_feasible``)."""
    from placement_rl.agents.constructive import Rollout
    from placement_rl.agents.constructive_eval import TaskResult

    n = 3
    greedy = Rollout(np.zeros((1, n), np.int64), np.array([times[0]]), np.array([greedy_fits]))
    sampled = Rollout(np.arange(1, 3)[:, None].repeat(n, 1), np.array(times[1]), np.array(sample_fits))
    res = TaskResult(None, greedy, sampled)
    assert (res.best_time, res.best_index, res.best_feasible) == want
    assert np.array_equal(res.best_devices, greedy.devices[0] if want[1] < 0 else sampled.devices[want[1]])


def test_best_of_k_takes_the_greedy_placements_on_slower_links_first() -> None:
    """The first of the k placements of best-of-k are the policy's greedy ones deciding on links ``LINK_SCALES`` x
    slower (each scored on the true links), the rest sampled; ``best_label`` says which one won."""
    from placement_rl.agents.constructive import graph_tensors, state_window
    from placement_rl.agents.constructive_train import build_policy
    from placement_rl.agents.fast_decode import Head
    from placement_rl.baselines.eft import LINK_SCALES, link_scaled_devices
    from placement_rl.cost.decode import POLICY

    torch.manual_seed(0)
    policy = build_policy(ConstructiveConfig(hidden=16, layers=1))
    t = task("dataflow", 60, 4, "2x4_v100_ib")
    res = evaluate(policy, [t], samples=len(LINK_SCALES) + 2)[0]
    assert res.link_scales == LINK_SCALES and len(res.sampled.times) == len(LINK_SCALES) + 2
    with torch.no_grad():
        head = Head(policy, policy.embed(*graph_tensors(t)).double().numpy()).arrays()
    for k, scale in enumerate(LINK_SCALES):
        want = link_scaled_devices(t.graph, t.costs, t.topology, POLICY, head, window=state_window(policy, 60),
                                   scale=scale)
        assert np.array_equal(res.sampled.devices[k], want)
        assert res.sampled.times[k] == pytest.approx(simulate(t.graph, t.costs, t.topology, want).step_time)
    # at scale 1 the decode is the greedy placement itself
    one = link_scaled_devices(t.graph, t.costs, t.topology, POLICY, head, window=state_window(policy, 60), scale=1.0)
    assert np.array_equal(one, res.greedy.devices[0])
    few = evaluate(policy, [t], samples=2)[0]  # fewer than the scales: only the first scales, nothing sampled
    assert few.link_scales == LINK_SCALES[:2] and np.array_equal(few.sampled.devices, res.sampled.devices[:2])
    label = res.best_label
    k = res.best_index
    assert label == ("greedy" if k < 0 else f"greedy on links {LINK_SCALES[k]:g} x slower" if k < len(LINK_SCALES)
                     else f"sample {k - len(LINK_SCALES) + 1}")
