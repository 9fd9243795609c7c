"""One training loop for every agent: build envs, learn with progress, track the best plan, checkpoint, resume.

``Trainer(env_id=..., env_kwargs=..., agent=AgentSpec(...), encoder=EncoderSpec(...), seed=...)`` wraps
MaskablePPO / PPO (stable-baselines3) or REINFORCE behind ``learn(steps)``, ``save(path)``, ``Trainer.resume(path,
...)`` and ``best`` (the best placement or stage plan any episode reached, judged by the env's reward source).
``sim_calls`` counts the simulator (or measurement) calls the envs made, so baselines get the same budget.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

import envs  # noqa: F401 - registers the environments
from agents.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from agents.reinforce import Reinforce, ReinforceConfig
from placement_rl.errors import ConfigError

ALGOS = ("maskable_ppo", "ppo", "reinforce")


@dataclass(frozen=True, kw_only=True)
class EncoderSpec:
    name: str = "sage"
    hidden: int = 64
    layers: int = 3

    def kwargs(self) -> dict[str, Any]:
        return {"encoder": self.name, "hidden": self.hidden, "layers": self.layers}


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """PPO fields follow SB3's names; ``reinforce`` holds REINFORCE's."""

    algo: str = "maskable_ppo"
    learning_rate: float = 1e-3
    n_envs: int = 4
    n_steps: int = 64
    batch_size: int = 256
    n_epochs: int = 4
    gamma: float = 1.0
    gae_lambda: float = 0.95
    ent_coef: float = 0.01
    clip_range: float = 0.2
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ConfigError(f"unknown agent '{self.algo}' (choose one of {', '.join(ALGOS)})")


class SimCallCounter(gym.Wrapper):
    """Counts evaluations of the env's reward source (simulator or executor) and keeps the best result."""

    def __init__(self, env: gym.Env, tracker: "BestTracker") -> None:
        super().__init__(env)
        self.tracker = tracker
        self._seen: dict[int, int] = {}

    def _count(self) -> None:
        st = getattr(self.env.unwrapped, "state", None)
        src = getattr(st, "source", None)
        calls = int(getattr(src, "calls", 0))
        key = id(src)
        self.tracker.sim_calls += calls - self._seen.get(key, 0)
        self._seen[key] = calls

    def reset(self, **kwargs):
        out = super().reset(**kwargs)
        self._count()
        return out

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self._count()
        if terminated or truncated:
            self.tracker.episode_end(info, reward)
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        return self.env.unwrapped.action_masks()


@dataclass
class BestTracker:
    """Best feasible result seen over all episodes, episode curve, simulator-call count."""

    sim_calls: int = 0
    episodes: int = 0
    best_time: float = float("inf")
    best_feasible: bool = False
    best_value: Any = None
    best_single_time: float = float("nan")
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (episode, step_time, best)

    def episode_end(self, info: dict[str, Any], reward: float) -> None:
        self.episodes += 1
        t = float(info.get("step_time", np.nan))
        ok = bool(info.get("feasible", True))
        self.best_single_time = float(info.get("best_single_time", self.best_single_time))
        value = info.get("plan", info.get("best_plan", info.get("placement")))
        if value is not None and (ok, -t) > (self.best_feasible, -self.best_time):
            self.best_time, self.best_feasible = t, ok
            self.best_value = value.copy() if isinstance(value, np.ndarray) else value
        self.curve.append((self.episodes, t, self.best_time))


def make_vec_env(env_id: str, env_kwargs: dict[str, Any], n: int, tracker: BestTracker, seed: int):
    from stable_baselines3.common.vec_env import DummyVecEnv

    def factory(i: int) -> Callable[[], gym.Env]:
        def make() -> gym.Env:
            env = SimCallCounter(gym.make(env_id, **env_kwargs), tracker)
            env.reset(seed=seed + i)
            return env

        return make

    venv = DummyVecEnv([factory(i) for i in range(n)])
    venv.seed(seed)
    return venv


class _Progress:
    """SB3 callback: a tqdm bar over env steps and per-update metrics to a callback."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, unit="step", desc="train", disable=not enabled, dynamic_ncols=True)

    def update(self, n: int, best: float) -> None:
        self.bar.update(n)
        if np.isfinite(best):
            self.bar.set_postfix(best_step_ms=f"{best * 1e3:.3f}")

    def close(self) -> None:
        self.bar.close()


class Trainer:
    def __init__(self, *, env_id: str, env_kwargs: dict[str, Any], agent: AgentSpec = AgentSpec(),
                 encoder: EncoderSpec = EncoderSpec(), seed: int = 0, tensorboard_dir: str | None = None,
                 config: dict[str, Any] | None = None) -> None:
        torch.set_num_threads(1)
        self.env_id, self.env_kwargs, self.agent, self.encoder, self.seed = env_id, env_kwargs, agent, encoder, seed
        self.config = dict(config or {})
        self.tracker = BestTracker()
        self.tensorboard_dir = tensorboard_dir
        pk = {"encoder_kwargs": encoder.kwargs()}
        if agent.algo == "reinforce":
            env = SimCallCounter(gym.make(env_id, **env_kwargs), self.tracker)
            self.env = env
            self.model = Reinforce(env, encoder_kwargs=encoder.kwargs(), config=agent.reinforce, seed=seed)
            self.policy = self.model.policy
            self._writer = None
            if tensorboard_dir:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(tensorboard_dir)
        else:
            from sb3_contrib import MaskablePPO
            from stable_baselines3 import PPO

            from agents.sb3 import GraphPolicy, MaskableGraphPolicy

            self.env = make_vec_env(env_id, env_kwargs, agent.n_envs, self.tracker, seed)
            cls, pol = (MaskablePPO, MaskableGraphPolicy) if agent.algo == "maskable_ppo" else (PPO, GraphPolicy)
            self.model = cls(pol, self.env, learning_rate=agent.learning_rate, n_steps=agent.n_steps,
                             batch_size=agent.batch_size, n_epochs=agent.n_epochs, gamma=agent.gamma,
                             gae_lambda=agent.gae_lambda, ent_coef=agent.ent_coef, clip_range=agent.clip_range,
                             policy_kwargs=pk, seed=seed, verbose=0, device="cpu")
            from stable_baselines3.common.logger import Logger, configure

            # SB3's default logger makes a temp folder per run; log only where asked.
            self.model.set_logger(configure(tensorboard_dir, ["tensorboard"]) if tensorboard_dir
                                  else Logger(folder=None, output_formats=[]))
            self.policy = self.model.policy

    @property
    def unwrapped_env(self) -> gym.Env:
        return self.env.envs[0].unwrapped if hasattr(self.env, "envs") else self.env.unwrapped

    @property
    def num_timesteps(self) -> int:
        return int(self.model.num_timesteps)

    def obs_info(self) -> dict[str, int]:
        lay = self.unwrapped_env.layout
        return {"max_nodes": lay.max_nodes, "max_edges": lay.max_edges, "max_devices": lay.max_devices,
                "op_type_buckets": lay.op_type_buckets, "num_features": lay.num_features}

    # -------------------------------------------------------------- learning
    def learn(self, total_steps: int, *, progress: bool = True,
              on_tick: Callable[["Trainer"], None] | None = None) -> "Trainer":
        bar = _Progress(total_steps, progress)
        start = time.perf_counter()
        try:
            if self.agent.algo == "reinforce":
                last = [self.num_timesteps]

                def on_episode(info: dict[str, Any], steps: int) -> None:
                    bar.update(steps - last[0], self.tracker.best_time)
                    last[0] = steps

                def on_update(stats: dict[str, float]) -> None:
                    if self._writer is not None:
                        for k, v in stats.items():
                            self._writer.add_scalar(f"reinforce/{k}", v, self.num_timesteps)
                        self._writer.add_scalar("train/best_step_time", self.tracker.best_time, self.num_timesteps)

                self.model.learn(total_steps, on_episode=on_episode, on_update=on_update)
            else:
                from stable_baselines3.common.callbacks import BaseCallback

                trainer = self

                class Tick(BaseCallback):
                    def _on_step(self) -> bool:
                        bar.update(trainer.env.num_envs, trainer.tracker.best_time)
                        return True

                    def _on_rollout_end(self) -> None:
                        self.logger.record("train/best_step_time", trainer.tracker.best_time)
                        self.logger.record("train/sim_calls", trainer.tracker.sim_calls)
                        if on_tick is not None:
                            on_tick(trainer)

                self.model.learn(total_steps, callback=Tick(), reset_num_timesteps=False, progress_bar=False)
        finally:
            bar.close()
        self.train_seconds = time.perf_counter() - start
        return self

    # ------------------------------------------------------------ checkpoint
    def save(self, path: str | Path) -> Path:
        opt = self.model.optimizer if self.agent.algo == "reinforce" else self.policy.optimizer
        cfg = dict(self.config)
        cfg.update(algo=self.agent.algo, env_id=self.env_id, encoder=dataclasses.asdict(self.encoder))
        return save_checkpoint(path, algo=self.agent.algo, config=cfg, obs=self.obs_info(),
                               num_timesteps=self.num_timesteps, policy=self.policy.state_dict(),
                               optimizer=opt.state_dict())

    def load_weights(self, path: str | Path, *, with_optimizer: bool = True) -> dict[str, Any]:
        data = load_checkpoint(path)
        check_compatible(data, obs=self.obs_info(), config={"encoder": dataclasses.asdict(self.encoder),
                                                            "env_id": self.env_id}, keys=("encoder", "env_id"))
        try:
            self.policy.load_state_dict(data["policy"])
        except RuntimeError as exc:
            from placement_rl.errors import CheckpointError

            raise CheckpointError(f"checkpoint '{path}' does not fit this policy "
                                  f"({str(exc).splitlines()[0]})") from None
        if with_optimizer and data["algo"] == self.agent.algo and data.get("optimizer"):
            opt = self.model.optimizer if self.agent.algo == "reinforce" else self.policy.optimizer
            opt.load_state_dict(data["optimizer"])
            self.model.num_timesteps = int(data["num_timesteps"])
        return data


def final_plan(trainer: Trainer, *, samples: int, seed: int) -> dict[str, Any]:
    """Score the trained policy: one greedy rollout plus ``samples`` sampled ones on a fresh env; return the best
    of those and of everything seen during training (``source`` says which)."""
    from agents.rollout import rollout

    env = SimCallCounter(gym.make(trainer.env_id, **trainer.env_kwargs), trainer.tracker)
    rng = np.random.default_rng(seed)
    pol = trainer.policy
    pol.eval() if hasattr(pol, "eval") else None
    results = []
    for k in range(samples + 1):
        info = rollout(pol, env, deterministic=(k == 0), rng=rng, seed=seed + k)
        value = info.get("plan", info.get("placement"))
        results.append((not bool(info.get("feasible", True)), float(info["step_time"]), k, value))
    infeasible, t, k, value = min(results, key=lambda r: (r[0], r[1]))
    greedy = results[0]
    tr = trainer.tracker
    out = {"policy_greedy_time": greedy[1], "policy_best_of_k_time": t, "samples": samples}
    if tr.best_value is not None and (tr.best_feasible, -tr.best_time) > (not infeasible, -t):
        out.update(step_time=tr.best_time, feasible=tr.best_feasible, value=tr.best_value, source="training")
    else:
        out.update(step_time=t, feasible=not infeasible, value=value,
                   source="policy_greedy" if k == 0 else "policy_sampled")
    return out
