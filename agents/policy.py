"""Graph policies: padded env observations -> one disjoint PyG batch -> encoder -> per-node device logits.

``GraphFeatures`` (an SB3 features extractor) batches the padded graphs of a ``[B, ...]`` observation into one
disjoint graph without a Python loop and returns, per sample, the features the heads need:

* ``mode="node"`` (``PlacementEnv``, ``PipelineEnv``: the action is about one node):
  ``[h_current, h_graph]`` -> ``[B, 2H]``
* ``mode="all"`` (``OneShotPlacementEnv``: one action per node): ``[h_1 .. h_Nmax, h_graph]`` -> ``[B, (N+1)H]``

An observation with a ``phase`` key (``PipelineEnv``: cuts, DP degrees, ..., recomputation, one action space) also
gets the phase one-hot appended in ``node`` mode (``[B, 2H + P]``), and ``NodeHead`` adds a learned bias per phase
to the logits (``phase_bias [P, D]``): the same index means "cut here" in one phase and "recompute this stage" in
another, and the graph embedding alone does not tell them apart.

``NodeHead`` (the SB3 "mlp_extractor") holds one shared per-node MLP to ``D_max`` device logits and a value MLP
over the graph embedding, so no parameter depends on the graph size (zero-shot placement of larger graphs).
"""

from __future__ import annotations

import math

import torch
from gymnasium import spaces
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from placement_rl.agents.encoders import build_encoder
from placement_rl.agents.graph_batch import GraphBatch, batch_graphs
from placement_rl.errors import ConfigError

OP_EMBED_DIM = 8
GRAPH_OBS_KEYS = ("node_features", "op_type", "edge_index", "num_nodes")  # what ``batch_graphs`` reads


def check_graph_obs(observation_space: spaces.Space, mode: str) -> None:
    """``ConfigError`` naming the first missing key unless ``observation_space`` is a ``Dict`` holding what
    ``GraphFeatures`` reads (``GRAPH_OBS_KEYS``, and ``current_node`` in ``node`` mode): the observations of the
    Placement, OneShot and Pipeline envs. ``ConstructivePlacementEnv``'s have none of ``op_type`` / ``current_node``:
    its policy is ``agents.device_policy.DevicePolicy``, trained by ``agents.constructive_train``."""
    keys = observation_space.spaces if isinstance(observation_space, spaces.Dict) else {}
    need = GRAPH_OBS_KEYS + (("current_node",) if mode == "node" else ())
    missing = next((k for k in need if k not in keys), None)
    if missing is not None:
        raise ConfigError(f"GraphPolicy / MaskableGraphPolicy are for the Placement, OneShot and Pipeline envs: this "
                          f"observation has no '{missing}' key (ConstructivePlacementEnv is trained with its own "
                          f"trainer, agents.constructive_train.ConstructiveTrainer: placement-rl train "
                          f"trainer=pretrain)")


def num_phases(observation_space: spaces.Dict) -> int:
    """Phases of an observation space with a ``phase`` key (``PipelineEnv``), else 0."""
    space = observation_space.spaces.get("phase") if isinstance(observation_space, spaces.Dict) else None
    return int(space.high.max()) + 1 if space is not None else 0


class GraphFeatures(BaseFeaturesExtractor):
    """Encoder over the batched graphs; see the module docstring for the output layout."""

    def __init__(self, observation_space: spaces.Dict, *, encoder: str = "sage", hidden: int = 64, layers: int = 3,
                 mode: str = "node", op_type_buckets: int | None = None) -> None:
        check_graph_obs(observation_space, mode)
        n_max, f = observation_space["node_features"].shape
        self.phases = num_phases(observation_space) if mode == "node" else 0
        dim = 2 * hidden + self.phases if mode == "node" else (n_max + 1) * hidden
        super().__init__(observation_space, features_dim=dim)
        buckets = op_type_buckets or int(observation_space["op_type"].high.max()) + 1
        self.mode, self.hidden, self.n_max = mode, hidden, n_max
        self.op_embed = nn.Embedding(buckets, OP_EMBED_DIM)
        self.encoder = build_encoder(encoder, f + OP_EMBED_DIM, hidden=hidden, layers=layers)

    def encode(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, GraphBatch]:
        """Node embeddings ``[T, H]`` of the disjoint batch, and the batch."""
        gb = batch_graphs(obs)
        op_type = gb.op_type.clamp(0, self.op_embed.num_embeddings - 1)
        h = self.encoder(torch.cat([gb.x, self.op_embed(op_type)], dim=-1), gb.edge_index, gb.batch, gb.adjacency)
        return h, gb

    def embed(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Node embeddings as a dense ``[B, N, H]`` tensor (padded rows 0), graph embedding ``[B, H]``, mask."""
        h, gb = self.encode(obs)
        return gb.to_dense(h), gb.mean_pool(h), gb.node_mask

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        h, gb = self.encode(obs)
        graph = gb.mean_pool(h)
        if self.mode == "node":
            b = gb.num_graphs
            n = gb.node_mask.sum(1) if not gb.full else None
            cur = obs["current_node"].reshape(b).round().long()
            cur = cur.clamp(0, self.n_max - 1) if n is None else torch.minimum(cur, (n - 1).clamp(min=0))
            out = [h[gb.offsets + cur], graph]
            if self.phases:
                phase = obs["phase"].reshape(b).round().long().clamp(0, self.phases - 1)
                out.append(nn.functional.one_hot(phase, self.phases).to(h.dtype))
            return torch.cat(out, dim=-1)
        return torch.cat([gb.to_dense(h).reshape(gb.num_graphs, -1), graph], dim=-1)


class NodeHead(nn.Module):
    """Per-node device logits (shared MLP over ``[h_node, h_graph]``) and a value latent from ``h_graph``.

    ``latent_dim_pi`` equals the action dimension (the logits themselves); the SB3 policy's ``action_net`` is an
    identity. ``latent_dim_vf`` = hidden. ``phases > 0`` (``node`` mode): features end with a phase one-hot and the
    logits get that phase's row of ``phase_bias`` (zeros at first).
    """

    def __init__(self, *, hidden: int, num_devices: int, mode: str, n_max: int, phases: int = 0) -> None:
        super().__init__()
        self.hidden, self.mode, self.n_max, self.num_devices = hidden, mode, n_max, num_devices
        self.phases = phases if mode == "node" else 0
        self.policy = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.Tanh(), nn.Linear(hidden, num_devices))
        self.value = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        if self.phases:
            self.phase_bias = nn.Parameter(torch.zeros(self.phases, num_devices))
        self.latent_dim_pi = num_devices if mode == "node" else n_max * num_devices
        self.latent_dim_vf = hidden

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        h = self.hidden
        if self.mode == "node":
            if self.phases:
                return self.policy(features[:, :2 * h]) + features[:, 2 * h:] @ self.phase_bias
            return self.policy(features)
        b = features.shape[0]
        nodes = features[:, :-h].reshape(b, -1, h)
        graph = features[:, -h:].unsqueeze(1).expand(-1, nodes.shape[1], -1)
        return self.policy(torch.cat([nodes, graph], dim=-1)).reshape(b, -1)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        h = self.hidden
        return self.value(features[:, h:2 * h] if self.phases else features[:, -h:])

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)


def action_mode(action_space: spaces.Space) -> str:
    """``node`` for one action per step (Discrete), ``all`` for one action per node (MultiDiscrete)."""
    return "all" if isinstance(action_space, spaces.MultiDiscrete) else "node"


def num_devices_of(action_space: spaces.Space) -> int:
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(action_space.nvec.reshape(-1)[0])
    return int(action_space.n)


def init_cut_prior(head: NodeHead, *, num_nodes: int, num_stages: int, unbiased: tuple[int, ...] = ()) -> None:
    """``PipelineEnv`` (action 1 = "start a new stage here"): lower action 1's initial logit by
    ``log(num_nodes / num_stages)`` so that the untrained policy cuts with probability about
    ``num_stages / num_nodes`` and its plans spread about ``num_stages`` stages over the graph, instead of cutting
    at every other node (all stages but the last crowded at the start). Learning moves it from there.

    With a per-phase bias (``head.phases``) the prior goes into each phase's row except those in ``unbiased``
    (the recomputation phase: action 1 there is ``full``, which the untrained policy should try as often as
    ``none``); the other phases start exactly as with the shared bias."""
    shift = math.log(max(num_nodes / max(num_stages, 1), 1.0))
    with torch.no_grad():
        if getattr(head, "phases", 0):
            for p in range(head.phases):
                if p not in unbiased:
                    head.phase_bias[p, 1] -= shift
        else:
            head.policy[-1].bias[1] -= shift
