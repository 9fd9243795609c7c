"""An ensemble of pretrained constructive policies: one checkpoint, the mean of the members' logits, the compiled
decode and torch agreeing, the shipped paths (place, fine-tune) accepting it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.constructive import rollout
from agents.constructive_train import ConstructiveConfig, ConstructiveTrainer, build_policy, load_policy
from agents.device_policy import EnsemblePolicy
from agents.ensemble import combine
from envs.constructive_task import ConstructiveTask
from placement_rl.cost import resolve_costs
from placement_rl.cost.schedule import DEVICE_FEATURES
from placement_rl.errors import CheckpointError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology


def _task(family: str, n: int, seed: int, topo: str) -> ConstructiveTask:
    g = synthetic.sample(family, num_nodes=n, seed=seed)
    t = load_topology(topo)
    return ConstructiveTask.build(g, t, resolve_costs(g, t))


def _checkpoints(tmp_path, seeds, **kw) -> list:
    """One briefly imitated policy per seed (different weights), saved."""
    t = _task("layered", 20, 0, "4x_v100_nvlink")
    paths = []
    for s in seeds:
        torch.manual_seed(s)
        trainer = ConstructiveTrainer(ConstructiveConfig(hidden=16, layers=1, bc_epochs=1, dagger_rounds=0,
                                                         rl_iters=0, seed=s, **kw))
        trainer.imitate([t])
        paths.append(trainer.save(tmp_path / f"s{s}" / "checkpoint.pt"))
    return paths


@pytest.mark.parametrize("hidden,members", [(16, 3), (64, 2)])
def test_compiled_ensemble_scores_are_the_mean_of_the_members_logits(hidden, members) -> None:
    """``device_scores`` over stacked member weights is ``EnsemblePolicy.logits`` (torch) up to the members' mean
    output bias, at the shipped width too."""
    from agents.fast_decode import Head

    torch.manual_seed(hidden)
    policy = build_policy(ConstructiveConfig(hidden=hidden, layers=1, members=members))
    assert isinstance(policy, EnsemblePolicy) and len(policy.members) == members
    rng = np.random.default_rng(1)
    node_h = rng.normal(size=(4, members * hidden))
    head = Head(policy, node_h)
    bias = float(np.mean([float(m.rho[2].bias.detach()) for m in policy.members]))
    for d in (2, 7):
        feats = rng.normal(size=(d, len(DEVICE_FEATURES))).astype(np.float32)
        mask = rng.random(d) < 0.7
        mask[0] = True
        z = head.scores(feats, 2, mask)
        with torch.no_grad():
            ref = policy.logits(torch.from_numpy(node_h[2]).float()[None], torch.from_numpy(feats)[None],
                                torch.from_numpy(mask)[None])[0].double().numpy()
            each = [m.logits(torch.from_numpy(node_h[2, i * hidden:(i + 1) * hidden]).float()[None],
                             torch.from_numpy(feats)[None], torch.from_numpy(mask)[None])[0].double().numpy()
                    for i, m in enumerate(policy.members)]
        assert np.array_equal(np.isfinite(z), mask)
        assert np.allclose(z[mask] + bias, ref[mask], rtol=1e-4, atol=1e-4)
        assert np.allclose(ref[mask], np.mean(each, axis=0)[mask], atol=1e-5)
        assert not np.allclose(each[0][mask], each[1][mask], atol=1e-3)  # the members do differ


def test_ensemble_checkpoint_round_trip_and_decodes(tmp_path) -> None:
    paths = _checkpoints(tmp_path, (0, 1, 2))
    out = combine(paths, tmp_path / "ens" / "checkpoint.pt")
    policy, cfg, raw = load_policy(out)
    assert isinstance(policy, EnsemblePolicy) and cfg.members == 3
    assert [m["seed"] for m in raw["config"]["provenance"]["members"]] == [0, 1, 2]
    singles = [load_policy(p)[0] for p in paths]
    for m, s in zip(policy.members, singles):  # the members are the checkpoints' weights
        assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), s.state_dict().values()))
    t = _task("dataflow", 70, 3, "2x4_v100_ib")
    fast = rollout(policy, t, samples=1, greedy=True)  # the compiled decode
    slow = rollout(policy, t, samples=2, greedy=True)  # torch: EnsemblePolicy.logits
    assert np.array_equal(fast.devices[0], slow.devices[0]) and fast.times[0] == slow.times[0]
    sampled = rollout(policy, t, samples=3, greedy=False, generator=torch.Generator().manual_seed(0))
    assert sampled.devices.shape == (3, 70) and sampled.devices.max() < t.topology.num_devices


def test_an_ensemble_of_one_policy_twice_places_as_that_policy(tmp_path) -> None:
    """The mean of equal logits is those logits: the ensemble's greedy placement is its member's, exactly."""
    (path,) = _checkpoints(tmp_path, (4,))
    out = combine([path, path], tmp_path / "twice.pt")
    ens, single = load_policy(out)[0], load_policy(path)[0]
    for family, n, seed, topo in (("layered", 90, 1, "4x_v100_nvlink"), ("series_parallel", 60, 2, "cpu_2gpu")):
        t = _task(family, n, seed, topo)
        a, b = rollout(ens, t, samples=1, greedy=True), rollout(single, t, samples=1, greedy=True)
        assert np.array_equal(a.devices, b.devices) and a.times[0] == b.times[0]


def test_combine_refuses_what_cannot_be_one_ensemble(tmp_path) -> None:
    a = _checkpoints(tmp_path / "a", (0,))[0]
    with pytest.raises(CheckpointError, match="at least 2"):
        combine([a], tmp_path / "x.pt")
    b = _checkpoints(tmp_path / "b", (1,), window=8)[0]
    with pytest.raises(CheckpointError, match="window"):
        combine([a, b], tmp_path / "x.pt")
    ens = combine([a, a], tmp_path / "ens.pt")
    with pytest.raises(CheckpointError, match="already an ensemble"):
        combine([ens, a], tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()
