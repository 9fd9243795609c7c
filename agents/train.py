"""One training loop for every agent: build envs, learn with progress, track the best plan, checkpoint, resume.

``Trainer(env_id=..., env_kwargs=..., agent=AgentSpec(...), encoder=EncoderSpec(...), seed=...)`` wraps
MaskablePPO / PPO (stable-baselines3) or REINFORCE behind ``learn(steps)``, ``save(path)``,
``load_weights(path)`` (resume: weights, optimizer state and step count) and ``tracker`` (a ``BestTracker``:
the best placement or stage plan any evaluated state reached, and ``sim_calls``, the simulator (or
measurement) calls the envs made, so baselines get the same budget).

``env_kwargs`` are the env's constructor arguments; ``graph`` is turned into one ``GraphSource`` shared by all
vector envs (costs resolved once), and ``initial_placement="heuristic"`` selects the warm start of
``envs.warm_start``.
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

from placement_rl import envs  # noqa: F401 - registers the environments
from placement_rl.agents.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from placement_rl.agents.policy import init_cut_prior
from placement_rl.agents.reinforce import Reinforce, ReinforceConfig
from placement_rl.agents.tracking import BestTracker, SimCallCounter
from placement_rl.envs.warm_start import HeuristicStartPlacementEnv, make_env
from placement_rl.envs.graph_source import GraphSource
from placement_rl.errors import CheckpointError, ConfigError

__all__ = ["ALGOS", "AgentSpec", "BestTracker", "EncoderSpec", "SimCallCounter", "Trainer", "final_plan",
           "shared_env_kwargs"]

ALGOS = ("maskable_ppo", "ppo", "reinforce")
PIPELINE_ENV_ID = "placement_rl/PipelineEnv-v0"
NOT_OPTIONS = ("graph", "topology", "cost_fn", "reward_source", "render_mode")  # env_kwargs a checkpoint leaves out


@dataclass(frozen=True, kw_only=True)
class EncoderSpec:
    name: str = "sage"
    hidden: int = 32
    layers: int = 3

    def kwargs(self) -> dict[str, Any]:
        return {"encoder": self.name, "hidden": self.hidden, "layers": self.layers}


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """PPO fields follow SB3's names; ``reinforce`` holds REINFORCE's. Defaults (as ``conf/agent/*.yaml``) are
    tuned for throughput on one CPU thread (many envs per policy call, two epochs over rollouts of
    ``n_envs x n_steps`` = 512 steps) and for the incremental-reward ``PlacementEnv`` started from the incumbent
    (gamma 0.9, a large entropy bonus to keep exploring around it); ``PipelineEnv``'s final-only reward wants
    ``gamma=1.0, ent_coef=0.01`` (``placement_rl.studies.suite.DEFAULT_AGENTS``)."""

    algo: str = "maskable_ppo"
    learning_rate: float = 1e-3
    n_envs: int = 16
    n_steps: int = 32
    batch_size: int = 256
    n_epochs: int = 2
    gamma: float = 0.9
    gae_lambda: float = 0.95
    ent_coef: float = 0.2
    clip_range: float = 0.2
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ConfigError(f"unknown agent '{self.algo}' (choose one of {', '.join(ALGOS)})")
        for k in ("n_envs", "n_steps", "batch_size", "n_epochs"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"agent.{k} must be a positive integer, got {v!r}")
        if self.batch_size > self.n_envs * self.n_steps and self.algo != "reinforce":
            raise ConfigError(f"agent.batch_size={self.batch_size} is larger than a rollout (n_envs x n_steps = "
                              f"{self.n_envs * self.n_steps}): lower batch_size or raise n_steps")


def shared_env_kwargs(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``env_kwargs`` with ``graph`` (+ ``topology``, ``cost_fn``) turned into one ``GraphSource``, so every
    env built from them shares its tasks (costs, reward source, warm start) instead of resolving its own."""
    kw = dict(env_kwargs)
    if "graph" in kw and not isinstance(kw["graph"], GraphSource):
        from placement_rl.envs.base import DEFAULT_GRAPH, DEFAULT_TOPOLOGY

        graph = kw.pop("graph")
        topology = kw.pop("topology", None)
        kw["graph"] = GraphSource.from_spec(DEFAULT_GRAPH if graph is None else graph,
                                            DEFAULT_TOPOLOGY if topology is None else topology,
                                            cost_fn=kw.pop("cost_fn", None))
    return kw


def make_vec_env(env_id: str, env_kwargs: dict[str, Any], n: int, tracker: BestTracker, seed: int):
    from stable_baselines3.common.vec_env import DummyVecEnv

    def factory(i: int) -> Callable[[], gym.Env]:
        def make() -> gym.Env:
            env = SimCallCounter(make_env(env_id, env_kwargs), tracker, slim=True)
            env.reset(seed=seed + i)
            return env

        return make

    venv = DummyVecEnv([factory(i) for i in range(n)])
    venv.seed(seed)
    return venv


class _Progress:
    """A tqdm bar over env steps showing the best step time so far."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, unit="step", desc="train", disable=not enabled, dynamic_ncols=True,
                        mininterval=0.5)
        self._best = float("inf")

    def update(self, n: int, best: float) -> None:
        if np.isfinite(best) and best != self._best:
            self._best = best
            self.bar.set_postfix(best_step_ms=f"{best * 1e3:.3f}", refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


class Trainer:
    def __init__(self, *, env_id: str, env_kwargs: dict[str, Any], agent: AgentSpec = AgentSpec(),
                 encoder: EncoderSpec = EncoderSpec(), seed: int = 0, tensorboard_dir: str | None = None,
                 config: dict[str, Any] | None = None) -> None:
        torch.set_num_threads(1)
        self.env_id, self.agent, self.encoder, self.seed = env_id, agent, encoder, seed
        self.env_kwargs = shared_env_kwargs(env_kwargs)
        self.config = dict(config or {})
        self.tracker = BestTracker()
        self.tensorboard_dir = tensorboard_dir
        self.train_seconds = 0.0
        if agent.algo == "reinforce":
            self.env = SimCallCounter(make_env(env_id, self.env_kwargs), self.tracker)
            self.model = Reinforce(self.env, encoder_kwargs=encoder.kwargs(), config=agent.reinforce, seed=seed)
            self.policy = self.model.policy
            self._writer = None
            if tensorboard_dir:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(tensorboard_dir)
        else:
            from sb3_contrib import MaskablePPO
            from stable_baselines3 import PPO
            from stable_baselines3.common.logger import Logger, configure

            from placement_rl.agents.sb3 import GraphPolicy, MaskableGraphPolicy

            self.env = make_vec_env(env_id, self.env_kwargs, agent.n_envs, self.tracker, seed)
            cls, pol = (MaskablePPO, MaskableGraphPolicy) if agent.algo == "maskable_ppo" else (PPO, GraphPolicy)
            self.model = cls(pol, self.env, learning_rate=agent.learning_rate, n_steps=agent.n_steps,
                             batch_size=agent.batch_size, n_epochs=agent.n_epochs, gamma=agent.gamma,
                             gae_lambda=agent.gae_lambda, ent_coef=agent.ent_coef, clip_range=agent.clip_range,
                             policy_kwargs={"encoder_kwargs": encoder.kwargs()}, seed=seed, verbose=0, device="cpu")
            # SB3's default logger makes a temp folder per run; log only where asked.
            self.model.set_logger(configure(tensorboard_dir, ["tensorboard"]) if tensorboard_dir
                                  else Logger(folder=None, output_formats=[]))
            self.policy = self.model.policy

        if env_id == PIPELINE_ENV_ID:
            lay = self.unwrapped_env.layout
            from placement_rl.envs.pipeline import RC

            init_cut_prior(self.policy.mlp_extractor, num_nodes=lay.max_nodes, num_stages=lay.max_devices,
                           unbiased=(RC,))

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

    def make_eval_env(self) -> gym.Env:
        """A fresh env like the training ones (sharing their tasks), counted in the same budget."""
        return SimCallCounter(make_env(self.env_id, self.env_kwargs), self.tracker)

    # -------------------------------------------------------------- learning
    def learn(self, total_steps: int, *, progress: bool = True,
              on_tick: Callable[["Trainer"], None] | None = None) -> "Trainer":
        """Train ``total_steps`` more env steps; ``on_tick(trainer)`` after each rollout / REINFORCE update."""
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
                        self._writer.add_scalar("train/sim_calls", self.tracker.sim_calls, self.num_timesteps)
                    if on_tick is not None:
                        on_tick(self)

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
            self.train_seconds += time.perf_counter() - start
        if self.agent.algo == "reinforce" and self._writer is not None:
            self._writer.flush()
        return self

    # ------------------------------------------------------------ checkpoint
    def _optimizer(self) -> torch.optim.Optimizer:
        return self.model.optimizer if self.agent.algo == "reinforce" else self.policy.optimizer

    def env_options(self) -> dict[str, Any]:
        """The env's options as plain values (``env_kwargs`` less ``NOT_OPTIONS`` and what is not a plain value),
        which ``placement-rl place`` builds its env with."""
        kw = dict(self.env_kwargs)
        given = kw.pop("config", None)
        opts = dataclasses.asdict(given) if dataclasses.is_dataclass(given) else {}
        opts.update({k: v for k, v in kw.items() if k not in NOT_OPTIONS})
        return {k: v for k, v in opts.items() if v is None or isinstance(v, (str, int, float, bool))}

    def start_record(self) -> dict[str, Any] | None:
        """Where the next episode on the task starts, for a warm-started ``PlacementEnv`` trained on one graph and
        topology (``envs.warm_start``; the greedy rollout of ``final_plan`` starts there): the graph's fingerprint
        and name, the topology's name and device count, and ``devices``; else None."""
        env = self.unwrapped_env
        src, st = getattr(env, "source", None), getattr(env, "state", None)
        if not isinstance(env, HeuristicStartPlacementEnv) or st is None or "start" not in st.extra or not (
                src.is_finite and len(src.graphs) == 1 and len(src.topologies) == 1):
            return None
        g, t = st.task.graph, st.task.topology
        devices = st.extra["incumbent" if env.start == "incumbent" else "start"]
        return {"graph": g.fingerprint(), "graph_name": g.name, "topology": t.name, "num_devices": t.num_devices,
                "devices": [int(d) for d in devices]}

    def save(self, path: str | Path) -> Path:
        """Write ``checkpoint.pt`` (``agents.checkpoint``); its config holds the run's ``config``, ``algo``,
        ``env_id``, ``encoder``, ``env_options``, ``graph_fingerprint`` where it trained on one graph and, where
        ``start_record`` gives one, ``start``."""
        cfg = dict(self.config)
        cfg.update(algo=self.agent.algo, env_id=self.env_id, encoder=dataclasses.asdict(self.encoder),
                   env_options=self.env_options())
        cfg.pop("start", None)
        cfg.pop("graph_fingerprint", None)
        src = getattr(self.unwrapped_env, "source", None)
        if src is not None and src.is_finite and len(src.graphs) == 1:  # what place compares its graph with
            cfg["graph_fingerprint"] = src.graphs[0].fingerprint()
        start = self.start_record()
        if start is not None:
            cfg["start"] = start
        return save_checkpoint(path, algo=self.agent.algo, config=cfg, obs=self.obs_info(),
                               num_timesteps=self.num_timesteps, policy=self.policy.state_dict(),
                               optimizer=self._optimizer().state_dict())

    def load_weights(self, path: str | Path, *, with_optimizer: bool = True) -> dict[str, Any]:
        """Load a checkpoint into this trainer (resume): policy weights, and — when it was trained with the same
        agent — the optimizer state and the step count. A checkpoint of another encoder, env or observation
        size raises ``CheckpointError`` naming the difference."""
        data = load_checkpoint(path)
        check_compatible(data, obs=self.obs_info(), config={"encoder": dataclasses.asdict(self.encoder),
                                                            "env_id": self.env_id}, keys=("encoder", "env_id"))
        try:
            self.policy.load_state_dict(data["policy"])
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint '{path}' does not fit this policy "
                                  f"({str(exc).splitlines()[0]})") from None
        if with_optimizer and data["algo"] == self.agent.algo and data.get("optimizer"):
            try:
                self._optimizer().load_state_dict(data["optimizer"])
            except (ValueError, KeyError) as exc:
                raise CheckpointError(f"checkpoint '{path}' has an optimizer state that does not fit this policy "
                                      f"({exc})") from None
            self.model.num_timesteps = int(data["num_timesteps"])
        return data


def final_plan(trainer: Trainer, *, samples: int, seed: int) -> dict[str, Any]:
    """Score the trained policy: one greedy rollout plus ``samples`` sampled ones on a fresh env (their simulator
    calls count in ``trainer.tracker.sim_calls``); return the best of those and of everything evaluated during
    training (``source`` says which), and under ``policy`` the best of the policy's own rollouts alone."""
    from placement_rl.agents.rollout import rollout

    env = trainer.make_eval_env()
    rng = np.random.default_rng(seed)
    pol = trainer.policy
    pol.set_training_mode(False) if hasattr(pol, "set_training_mode") else pol.eval()
    results = []
    for k in range(samples + 1):
        info = rollout(pol, env, deterministic=(k == 0), rng=rng, seed=seed + k)
        results.append((not bool(info.get("feasible", True)), float(info["step_time"]), k,
                        info.get("plan", info.get("placement"))))
    infeasible, t, k, value = min(results, key=lambda r: (r[0], r[1]))
    greedy = results[0]
    tr = trainer.tracker
    out = {"policy_greedy_time": greedy[1], "policy_best_of_k_time": t, "samples": samples,
           # the policy's own output (the learned row), apart from the best placement training explored
           "policy": {"step_time": t, "feasible": not infeasible, "value": value,
                      "source": "policy_greedy" if k == 0 else "policy_sampled"}}
    if tr.best_value is not None and (tr.best_feasible, -tr.best_time) >= (not infeasible, -t):
        out.update(step_time=tr.best_time, feasible=tr.best_feasible, value=tr.best_value, source="training")
    else:
        out.update(step_time=t, feasible=not infeasible, value=value,
                   source="policy_greedy" if k == 0 else "policy_sampled")
    return out
