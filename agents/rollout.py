"""Using a trained policy: sequential rollouts in an env, and fast one-pass decoding for zero-shot placement.

Both PPO policies (SB3) and ``ReinforcePolicy`` expose ``features_extractor`` and ``mlp_extractor`` (the
``NodeHead``), so the functions here accept either.

* ``rollout(policy, env, deterministic=..., rng=...)`` runs one episode exactly as in training.
* ``one_pass_logits(policy, env)`` embeds the graph once (the env's first observation) and applies the shared
  per-node head to *every* node: ``[num_nodes, D]`` device logits in one forward pass. Zero-shot placement of
  large graphs decodes greedily / samples from these and lets the simulator pick the best candidate.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from agents.reinforce import ReinforcePolicy, obs_to_tensors


def policy_logits(policy: Any, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    return policy.mlp_extractor.forward_actor(policy.features_extractor(obs))


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
        logits = logits.masked_fill(~mask, -1e9)
        if deterministic or rng is None:
            a = logits.argmax(-1).numpy()
        else:
            p = torch.softmax(logits, -1).numpy().astype(np.float64)
            a = np.array([rng.choice(d, p=row / row.sum()) for row in p])
        obs, _, terminated, truncated, info = env.step(int(a[0]) if a.shape[0] == 1 else a)
        done = terminated or truncated
    return info


@torch.no_grad()
def one_pass_logits(policy: Any, obs: dict[str, np.ndarray]) -> np.ndarray:
    """Device logits ``[num_nodes, D]`` for every node from one embedding pass."""
    t = obs_to_tensors(obs)
    fx, head = policy.features_extractor, policy.mlp_extractor
    dense, graph, mask = fx.embed(t)
    n = int(t["num_nodes"].reshape(-1)[0])
    nodes = dense[0, :n]
    g = graph.expand(n, -1)
    return head.policy(torch.cat([nodes, g], dim=-1)).numpy()


def load_policy_for(env: gym.Env, state_dict: dict[str, torch.Tensor], encoder_kwargs: dict[str, Any]) -> ReinforcePolicy:
    """A policy sized for ``env`` (any graph size) carrying a checkpoint's encoder and head weights."""
    pol = ReinforcePolicy(env.observation_space, env.action_space, encoder_kwargs=encoder_kwargs)
    keep = {k: v for k, v in state_dict.items() if k.startswith(("features_extractor.", "mlp_extractor."))}
    missing, unexpected = pol.load_state_dict(keep, strict=False)
    missing = [k for k in missing if not k.startswith("mlp_extractor.value")]
    if missing:
        from placement_rl.errors import CheckpointError

        raise CheckpointError(f"checkpoint lacks weights for {missing[0]} (and {len(missing) - 1} more): "
                              "it was trained with another encoder")
    pol.eval()
    return pol
