"""Using a trained policy: sequential rollouts in an env, and fast one-pass decoding for zero-shot placement.

Both PPO policies (SB3) and ``ReinforcePolicy`` expose ``features_extractor`` and ``mlp_extractor`` (the
``NodeHead``), so the functions here accept either.

* ``rollout(policy, env, deterministic=..., rng=...)`` runs one episode exactly as in training.
* ``one_pass_logits(policy, obs)`` embeds the graph once (the env's first observation) and applies the shared
  per-node head to *every* node: ``[num_nodes, D]`` device logits in one forward pass.
* ``zero_shot_place(policy, env, samples=k)`` decodes those logits greedily plus ``k`` sampled candidates
  (Gumbel-max), each through ``decode_with_memory`` (in topological order, a node takes its most preferred
  device that still has room, as the env's memory masks would allow), and lets the simulator pick the best:
  placement of a graph of any size in one forward pass and ``k + 1`` simulations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from placement_rl.agents.reinforce import MASKED, ReinforcePolicy, obs_to_tensors
from placement_rl.errors import CheckpointError


def policy_logits(policy: Any, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    return policy.mlp_extractor.forward_actor(policy.features_extractor(obs))


def sample_rows(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One category per row of ``probs [R, D]`` (rows sum to 1), vectorised inverse-CDF sampling."""
    cum = probs.cumsum(1)
    u = rng.random((probs.shape[0], 1)) * cum[:, -1:]
    return np.minimum((u > cum).sum(1), probs.shape[1] - 1)


@torch.no_grad()
def rollout(policy: Any, env: gym.Env, *, deterministic: bool = True, rng: np.random.Generator | None = None,
            seed: int | None = None) -> dict[str, Any]:
    """One episode; returns the final ``info`` (step_time, feasible, placement or plan)."""
    obs, info = env.reset(seed=seed)
    u = env.unwrapped
    d = policy.mlp_extractor.num_devices
    done = False
    while not done:
        logits = policy_logits(policy, obs_to_tensors(obs)).reshape(-1, d)
        mask = torch.as_tensor(np.asarray(u.action_masks(), dtype=bool)).reshape(logits.shape)
        logits = logits.masked_fill(~mask, MASKED)
        if deterministic or rng is None:
            a = logits.argmax(-1).numpy()
        else:
            a = sample_rows(torch.softmax(logits, -1).double().numpy(), rng)
        obs, _, terminated, truncated, info = env.step(int(a[0]) if a.shape[0] == 1 else a)
        done = terminated or truncated
    return info


@torch.no_grad()
def one_pass_logits(policy: Any, obs: dict[str, np.ndarray]) -> np.ndarray:
    """Device logits ``[num_nodes, D]`` for every node from one embedding pass."""
    t = obs_to_tensors(obs)
    h, gb = policy.features_extractor.encode(t)
    n = int(t["num_nodes"].reshape(-1)[0])
    graph = gb.mean_pool(h).expand(n, -1)
    return policy.mlp_extractor.policy(torch.cat([h[:n], graph], dim=-1)).numpy()


def load_policy_for(env: gym.Env, state_dict: dict[str, torch.Tensor],
                    encoder_kwargs: dict[str, Any]) -> ReinforcePolicy:
    """A policy sized for ``env`` (any graph size) carrying a checkpoint's encoder and head weights."""
    pol = ReinforcePolicy(env.observation_space, env.action_space, encoder_kwargs=encoder_kwargs)
    keep = {k: v for k, v in state_dict.items() if k.startswith(("features_extractor.", "mlp_extractor."))}
    own = pol.state_dict()
    for k, v in keep.items():
        if k in own and own[k].shape != v.shape:
            raise CheckpointError(f"checkpoint weight {k} has shape {tuple(v.shape)}, this policy needs "
                                  f"{tuple(own[k].shape)}: it was trained with other encoder settings or devices")
    missing, _ = pol.load_state_dict(keep, strict=False)
    missing = [k for k in missing if not k.startswith("mlp_extractor.value")]
    if missing:
        raise CheckpointError(f"checkpoint lacks weights for {missing[0]} (and {len(missing) - 1} more): "
                              "it was trained with another encoder")
    pol.eval()
    return pol


def decode_with_memory(scores: np.ndarray, node_mem: np.ndarray, capacity: np.ndarray,
                       order: np.ndarray) -> np.ndarray:
    """Devices ``[n]`` from per-node device scores ``[n, D]``: visiting nodes in ``order``, each takes its
    highest-scoring device whose memory left holds the node (``node_mem``, bytes pinned whatever the placement),
    or the device it overflows least when none does."""
    pref = np.argsort(-scores, axis=1, kind="stable")
    free = np.asarray(capacity, dtype=np.float64).copy()
    out = np.empty(scores.shape[0], dtype=np.int64)
    for i in order.tolist():
        m = node_mem[i]
        for d in pref[i]:
            if free[d] >= m:
                break
        else:
            d = int(np.argmax(free))
        out[i] = d
        free[d] -= m
    return out


@dataclass(frozen=True)
class ZeroShotResult:
    device_of_node: np.ndarray
    step_time: float
    feasible: bool
    chosen: str  # "greedy" or "sample k"
    sim_calls: int
    seconds: float


def zero_shot_place(policy: Any, env: gym.Env, *, samples: int = 8, seed: int = 0,
                    memory_aware: bool = True) -> ZeroShotResult:
    """Place the env's graph (its first task) with one forward pass: the greedy decoding of ``one_pass_logits``
    plus ``samples`` sampled ones (through ``decode_with_memory`` unless ``memory_aware=False``), each scored by
    the env's reward source; the best (feasible first) wins."""
    from placement_rl.envs.base import node_memory

    start = time.perf_counter()
    obs, _ = env.reset(seed=seed)
    st = env.unwrapped.state
    n, d = st.task.graph.num_nodes, st.task.topology.num_devices
    logits = one_pass_logits(policy, obs)[:, :d].astype(np.float64)
    rng = np.random.default_rng(seed)
    scores = [logits] + [logits + rng.gumbel(size=logits.shape) for _ in range(samples)]  # Gumbel-max sampling
    if memory_aware:
        mem, cap, order = node_memory(st.task), st.capacity, st.task.graph.topo_order
        cands = [decode_with_memory(s, mem, cap, order) for s in scores]
    else:
        cands = [s.argmax(1) for s in scores]
    best: tuple[tuple[int, float], int, np.ndarray] | None = None
    for k, c in enumerate(cands):
        c = np.ascontiguousarray(c, dtype=np.int64)
        t, ok = st.source.evaluate(c)
        key = (0 if ok else 1, float(t))
        if best is None or key < best[0]:
            best = (key, k, c)
    assert best is not None
    calls = int(getattr(st.source, "calls", len(cands)))  # env set-up (best single device) + candidates
    return ZeroShotResult(device_of_node=best[2][:n], step_time=best[0][1], feasible=best[0][0] == 0,
                          chosen="greedy" if best[1] == 0 else f"sample {best[1]}", sim_calls=calls,
                          seconds=time.perf_counter() - start)
