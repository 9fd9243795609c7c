"""REINFORCE with a moving-average baseline and an entropy bonus (ColocRL / HDP), in plain torch.

It reuses the PPO policy's pieces — ``GraphFeatures`` (encoder) and ``NodeHead`` (shared per-node head) — and
works on the one-shot env (one step per episode) and the sequential envs (one step per node).

For each batch of ``batch_episodes`` episodes (sampled without gradients, observations kept):
    G_t = sum of rewards from step t to the end (reward-to-go)
    b_t = exponential moving average of G_t at step index t (the baseline)
    loss = -mean_t[(G_t - b_t) * log pi(a_t | s_t)] - entropy_coef * mean_t[H(pi(. | s_t))]
where the log-probabilities of all steps of the batch come from one batched forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from placement_rl.agents.policy import GraphFeatures, NodeHead, action_mode, num_devices_of, num_phases

MASKED = -1e9


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


def stack_obs(items: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Several observations -> one ``[B, ...]`` batch."""
    return {k: torch.as_tensor(np.stack([o[k] for o in items])) for k in items[0]}


class ReinforcePolicy(nn.Module):
    """Encoder + per-node head; ``distribution(obs, mask)`` gives a masked categorical over devices: ``[B, D]``
    (``node`` mode, one decision per observation) or ``[B, N, D]`` (``all`` mode, a device per node)."""

    def __init__(self, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, *,
                 encoder_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        enc = dict(encoder_kwargs or {})
        self.mode = action_mode(action_space)
        enc["mode"] = self.mode
        self.features_extractor = GraphFeatures(observation_space, **enc)
        self.mlp_extractor = NodeHead(hidden=enc.get("hidden", 32), num_devices=num_devices_of(action_space),
                                      mode=self.mode, n_max=observation_space["node_features"].shape[0],
                                      phases=num_phases(observation_space))
        self.num_devices = num_devices_of(action_space)

    def distribution(self, obs: dict[str, torch.Tensor], mask: np.ndarray | torch.Tensor | None
                     ) -> torch.distributions.Categorical:
        logits = self.mlp_extractor.forward_actor(self.features_extractor(obs))
        b = logits.shape[0]
        logits = logits.reshape(b, -1, self.num_devices) if self.mode == "all" else logits
        if mask is not None:
            m = torch.as_tensor(np.asarray(mask, dtype=bool) if not torch.is_tensor(mask) else mask)
            logits = logits.masked_fill(~m.reshape(logits.shape), MASKED)
        return torch.distributions.Categorical(logits=logits)


class Reinforce:
    """``learn(total_steps, on_episode=...)`` trains on one env; ``on_episode(info, steps)`` sees each episode's
    last ``info`` (the env's step time ...)."""

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

    @torch.no_grad()
    def _episode(self) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray], list[np.ndarray], list[float],
                                dict[str, Any]]:
        """Sample one episode: observations, masks, actions, rewards, last info."""
        obs, info = self.env.reset(seed=self.seed if self._first_reset else None)
        self._first_reset = False
        observations, masks, actions, rewards = [], [], [], []
        done = False
        while not done:
            mask = np.asarray(self.env.unwrapped.action_masks(), dtype=bool)
            dist = self.policy.distribution(obs_to_tensors(obs), mask)
            probs = dist.probs.reshape(-1, dist.probs.shape[-1])
            action = torch.multinomial(probs, 1, generator=self.gen).reshape(-1).numpy()
            observations.append({k: np.array(v, copy=True) for k, v in obs.items()})
            masks.append(mask)
            actions.append(action)
            act = int(action[0]) if self.policy.mode == "node" else action
            obs, reward, terminated, truncated, info = self.env.step(act)
            rewards.append(float(reward))
            self.num_timesteps += 1
            done = terminated or truncated
        return observations, masks, actions, rewards, info

    def learn(self, total_steps: int, *, on_episode: Callable[[dict[str, Any], int], None] | None = None,
              on_update: Callable[[dict[str, float]], None] | None = None) -> "Reinforce":
        cfg = self.config
        target = self.num_timesteps + total_steps
        while self.num_timesteps < target:
            observations, masks, actions, advantages, returns = [], [], [], [], []
            for _ in range(cfg.batch_episodes):
                obs, msk, act, rewards, info = self._episode()
                if on_episode is not None:
                    on_episode(info, self.num_timesteps)
                togo = np.cumsum(rewards[::-1])[::-1]
                returns.append(float(togo[0]))
                for t, g in enumerate(togo):
                    b = self.baseline.get(t, float(g))
                    advantages.append(float(g) - b)
                    self.baseline[t] = cfg.baseline_decay * b + (1 - cfg.baseline_decay) * float(g)
                observations += obs
                masks += msk
                actions += act
                if self.num_timesteps >= target:
                    break
            self.policy.train()
            dist = self.policy.distribution(stack_obs(observations), torch.as_tensor(np.stack(masks)))
            a = torch.as_tensor(np.stack(actions))
            logp = dist.log_prob(a.reshape(dist.batch_shape))
            ent = dist.entropy()
            if self.policy.mode == "all":  # one decision per node: sum over nodes
                logp, ent = logp.sum(-1), ent.mean(-1)
            adv = torch.as_tensor(advantages, dtype=torch.float32)
            loss = -(adv * logp).mean() - cfg.entropy_coef * ent.mean()
            self.optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            if on_update is not None:
                on_update({"loss": float(loss.detach()), "mean_return": float(np.mean(returns)),
                           "entropy": float(ent.mean().detach())})
        return self
