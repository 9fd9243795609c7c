"""Gymnasium environments over (computation graph, device topology), registered as ``placement_rl/...-v0``.

* ``placement_rl/PlacementEnv-v0``: ``PlacementEnv`` (Placeto-style, one node per step)
* ``placement_rl/OneShotPlacementEnv-v0``: ``OneShotPlacementEnv`` (ColocRL/GDP-style, all nodes at once)
* ``placement_rl/PipelineEnv-v0``: ``PipelineEnv`` (stage cuts in topological order, then a DP degree per stage)
* ``placement_rl/ConstructivePlacementEnv-v0``: ``ConstructivePlacementEnv`` (build the placement node by node on
  a schedule-aware state, any device count; the env the pretrained policy is trained on)

``gymnasium.make(id, graph=..., topology=..., **options)``; see each class docstring.
"""

from gymnasium.envs.registration import register, registry

from placement_rl.envs.base import EnvConfig
from placement_rl.envs.features import ObsLayout
from placement_rl.envs.graph_source import GraphSource, Task
from placement_rl.envs.oneshot import OneShotConfig, OneShotPlacementEnv
from placement_rl.envs.pipeline import PipelineConfig, PipelineEnv
from placement_rl.envs.placement import PlacementConfig, PlacementEnv
from placement_rl.envs.reward import RewardSource, SimulatedReward

__all__ = ["ENV_IDS", "EnvConfig", "GraphSource", "ObsLayout", "OneShotConfig", "OneShotPlacementEnv",
           "PipelineConfig", "PipelineEnv", "PlacementConfig", "PlacementEnv", "RewardSource", "SimulatedReward",
           "Task"]

# Every episode ends by construction (one step; passes x nodes; nodes - 1 + stages steps; nodes), so none gets a
# time limit (one of a step marked the one-step env's natural end truncated too).
ENV_IDS = {
    "placement_rl/PlacementEnv-v0": ("placement_rl.envs.placement:PlacementEnv", None),
    "placement_rl/OneShotPlacementEnv-v0": ("placement_rl.envs.oneshot:OneShotPlacementEnv", None),
    "placement_rl/PipelineEnv-v0": ("placement_rl.envs.pipeline:PipelineEnv", None),
    "placement_rl/ConstructivePlacementEnv-v0": ("placement_rl.envs.constructive:ConstructivePlacementEnv", None),
}

for _id, (_entry, _steps) in ENV_IDS.items():
    if _id not in registry:
        register(id=_id, entry_point=_entry, max_episode_steps=_steps)
