"""Budget and best-result bookkeeping shared by every agent.

``SimCallCounter`` wraps each training env: it counts the evaluations of the env's reward source (simulator or
executor calls — the budget the baselines get too) and reports every evaluated plan to a shared
``BestTracker``, which keeps the best one (feasible first, then fastest). Every placement the sequential env
visits was simulated (that is where its reward came from), so the best of them is a placement the agent found
under that budget. ``info`` dicts are slimmed to scalars before they reach the vector env, which deep-copies
them on every step (``slim=True``, as the trainer's vector envs use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

# info keys the vector env passes on (scalars only); plans and placements stay with the tracker
KEEP_INFO = ("step_time", "feasible", "best_single_time", "best_step_time", "phase", "num_stages",
             "TimeLimit.truncated")


@dataclass
class BestTracker:
    """Best feasible result seen over all evaluated plans, per-episode curve, simulator-call count."""

    sim_calls: int = 0
    episodes: int = 0
    best_time: float = float("inf")
    best_feasible: bool = False
    best_value: Any = None
    best_single_time: float = float("nan")
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (episode, final step_time, best)
    seen_calls: dict[int, int] = field(default_factory=dict, repr=False)  # id(reward source) -> calls counted

    def offer(self, info: dict[str, Any]) -> None:
        """Consider the plan an env just evaluated (``step_time``, ``feasible``, and a ``plan`` / ``placement``)."""
        value = info.get("plan", info.get("placement"))
        t = info.get("step_time")
        if value is None or t is None:
            return
        t = float(t)
        ok = bool(info.get("feasible", True))
        if np.isfinite(t) and (ok, -t) > (self.best_feasible, -self.best_time):
            self.best_time, self.best_feasible = t, ok
            self.best_value = value.copy() if isinstance(value, np.ndarray) else value

    def episode_end(self, info: dict[str, Any], reward: float = 0.0) -> None:
        self.episodes += 1
        self.best_single_time = float(info.get("best_single_time", self.best_single_time))
        self.curve.append((self.episodes, float(info.get("step_time", np.nan)), self.best_time))


class SimCallCounter(gym.Wrapper):
    """Counts evaluations of the env's reward source and feeds every evaluated plan to the tracker."""

    def __init__(self, env: gym.Env, tracker: BestTracker, *, slim: bool = False) -> None:
        super().__init__(env)
        self.tracker = tracker
        self.slim = slim

    def _count(self) -> None:
        st = getattr(self.env.unwrapped, "state", None)
        if st is None:
            return
        tr = self.tracker
        src = st.source
        calls = int(getattr(src, "calls", 0))
        key = id(src)
        tr.sim_calls += calls - tr.seen_calls.get(key, 0)
        tr.seen_calls[key] = calls
        extra = st.extra
        if "start_calls" in extra and not extra.get("start_counted"):
            tr.sim_calls += int(extra["start_calls"])  # the warm start's heuristics (envs.warm_start)
            extra["start_counted"] = True

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._count()
        self.tracker.offer(info)  # the initial placement was evaluated too (PlacementEnv, OneShotPlacementEnv)
        return obs, _slim(info) if self.slim else info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._count()
        self.tracker.offer(info)
        if terminated or truncated:
            self.tracker.episode_end(info, float(reward))
        return obs, reward, terminated, truncated, _slim(info) if self.slim else info

    def action_masks(self) -> np.ndarray:
        return self.env.unwrapped.action_masks()


def _slim(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in KEEP_INFO if k in info}
