"""REINFORCE with a moving-average baseline and an entropy bonus (ColocRL / HDP), in plain torch.

It reuses the PPO policy's pieces — ``GraphFeatures`` (encoder) and ``NodeHead`` (shared per-node head) — and
works on the one-shot env (one step per episode) and the sequential envs (one step per node).

For each batch of episodes:
    G_t = sum of rewards from step t to the end (reward-to-go)
    b_t = exponential moving average of G_t at step index t (the baseline)
    loss = -mean_t[(G_t - b_t) * log pi(a_t | s_t)] - entropy_coef * mean_t[H(pi(. | s_t))]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from agents.policy import GraphFeatures, NodeHead, action_mode, num_devices_of


@dataclass(frozen=True, kw_only=True)
class ReinforceConfig:
    learning_rate: float = 3e-3
    batch_episodes: int = 8
    entropy_coef: float = 0.01
    baseline_decay: float = 0.9
    max_grad_norm: float = 1.0


def obs_to_tensors(obs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """One observation -> a batch of one (tensors share the arrays' memory when possible)."""
    return {k: torch.as_tensor(np.asarray(v)).unsqueeze(0) for k, v in obs.items()}


class ReinforcePolicy(nn.Module):
    """Encoder + per-node head; ``distribution(obs, mask)`` gives a masked categorical over devices (``node``
    mode, ``[1, D]``) or over devices of every node (``all`` mode, ``[N, D]``)."""

    def __init__(self, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, *,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        enc = dict(encoder_kwargs or {})
        self.mode = action_mode(action_space)
        enc["mode"] = self.mode
        self.features_extractor = GraphFeatures(observation_space, **enc)
        self.mlp_extractor = NodeHead(hidden=enc.get("hidden", 64), num_devices=num_devices_of(action_space),
                                      mode=self.mode, n_max=observation_space["node_features"].shape[0])
        self.num_devices = num_devices_of(action_space)

    def distribution(self, obs: dict[str, torch.Tensor], mask: np.ndarray | None) -> torch.distributions.Categorical:
        logits = self.mlp_extractor.forward_actor(self.features_extractor(obs)).reshape(-1, self.num_devices)
        if mask is not None:
            m = torch.as_tensor(np.asarray(mask, dtype=bool)).reshape(logits.shape)
            logits = logits.masked_fill(~m, -1e9)
        return torch.distributions.Categorical(logits=logits)


class Reinforce:
    """``learn(total_steps, on_episode=...)`` trains on one env; ``on_episode(info, steps)`` sees each episode's
    last ``info`` (the env's step time, placement ...)."""

    def __init__(self, env: gym.Env, *, encoder_kwargs: dict[str, Any] | None = None,
                 config: ReinforceConfig | None = None, seed: int = 0) -> None:
        self.env, self.config, self.seed = env, config or ReinforceConfig(), seed
        torch.manual_seed(seed)  # parameter init only; sampling uses self.gen
        self.policy = ReinforcePolicy(env.observation_space, env.action_space, encoder_kwargs=encoder_kwargs)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.config.learning_rate)
        self.gen = torch.Generator().manual_seed(seed)
        self.baseline: dict[int, float] = {}
        self.num_timesteps = 0
        self._first_reset = True

    def _episode(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float], dict[str, Any]]:
        obs, info = self.env.reset(seed=self.seed if self._first_reset else None)
        self._first_reset = False
        logps, ents, rewards = [], [], []
        done = False
        while not done:
            mask = self.env.unwrapped.action_masks() if hasattr(self.env.unwrapped, "action_masks") else None
            dist = self.policy.distribution(obs_to_tensors(obs), mask)
            u = torch.rand(dist.probs.shape[0], 1, generator=self.gen)
            action = torch.searchsorted(dist.probs.detach().cumsum(-1), u).clamp(max=dist.probs.shape[-1] - 1)
            action = action.squeeze(-1)
            logps.append(dist.log_prob(action).sum())
            ents.append(dist.entropy().mean())
            act = int(action.item()) if self.policy.mode == "node" else action.numpy()
            obs, reward, terminated, truncated, info = self.env.step(act)
            rewards.append(float(reward))
            self.num_timesteps += 1
            done = terminated or truncated
        return logps, ents, rewards, info

    def learn(self, total_steps: int, *, on_episode: Callable[[dict[str, Any], int], None] | None = None,
              on_update: Callable[[dict[str, float]], None] | None = None) -> "Reinforce":
        cfg = self.config
        target = self.num_timesteps + total_steps
        while self.num_timesteps < target:
            losses, returns = [], []
            for _ in range(cfg.batch_episodes):
                logps, ents, rewards, info = self._episode()
                if on_episode is not None:
                    on_episode(info, self.num_timesteps)
                togo = np.cumsum(rewards[::-1])[::-1]
                returns.append(float(togo[0]))
                for t, (lp, ent, g) in enumerate(zip(logps, ents, togo)):
                    b = self.baseline.get(t, float(g))
                    losses.append(-(float(g) - b) * lp - cfg.entropy_coef * ent)
                    self.baseline[t] = cfg.baseline_decay * b + (1 - cfg.baseline_decay) * float(g)
                if self.num_timesteps >= target:
                    break
            loss = torch.stack(losses).mean()
            self.optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            if on_update is not None:
                on_update({"loss": float(loss.detach()), "mean_return": float(np.mean(returns))})
        return self
