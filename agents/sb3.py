"""SB3 policies with the per-node head: ``GraphPolicy`` (PPO) and ``MaskableGraphPolicy`` (MaskablePPO)."""

from __future__ import annotations

from typing import Any

from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import nn

from placement_rl.agents.policy import GraphFeatures, NodeHead, action_mode, num_devices_of, num_phases


class _GraphPolicyMixin:
    """Shared construction: GraphFeatures extractor, NodeHead as the mlp_extractor, identity action net."""

    def _graph_init(self, observation_space, action_space, kwargs: dict[str, Any]) -> dict[str, Any]:
        enc = dict(kwargs.pop("encoder_kwargs", None) or {})
        mode = action_mode(action_space)
        enc.setdefault("mode", mode)
        kwargs.setdefault("features_extractor_class", GraphFeatures)
        kwargs.setdefault("features_extractor_kwargs", enc)
        kwargs.setdefault("ortho_init", False)
        self._head_kwargs = {"hidden": enc.get("hidden", 64), "num_devices": num_devices_of(action_space),
                             "mode": mode, "n_max": observation_space["node_features"].shape[0],
                             "phases": num_phases(observation_space)}
        return kwargs

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = NodeHead(**self._head_kwargs)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)  # type: ignore[misc]
        self.action_net = nn.Identity()  # NodeHead already outputs the logits
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


class GraphPolicy(_GraphPolicyMixin, ActorCriticPolicy):
    def __init__(self, observation_space, action_space, lr_schedule, **kwargs: Any) -> None:
        kwargs = self._graph_init(observation_space, action_space, kwargs)
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)


class MaskableGraphPolicy(_GraphPolicyMixin, MaskableActorCriticPolicy):
    def __init__(self, observation_space, action_space, lr_schedule, **kwargs: Any) -> None:
        kwargs = self._graph_init(observation_space, action_space, kwargs)
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)
