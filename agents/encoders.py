"""Graph encoders: per-node embeddings of a batch of (disjoint) computation graphs.

Every encoder maps node features to node embeddings with parameters independent of graph size, so a policy
trained on small graphs places larger ones (zero-shot).

Shapes:
    x:          [total_nodes, in_dim]   node features of all graphs in the batch, concatenated
    edge_index: [2, total_edges]        directed edges (src -> dst = data flow), indices into ``x``
    batch:      [total_nodes]           graph id of each node (0..B-1), sorted
    returns:    [total_nodes, hidden]
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GATv2Conv, GCNConv, SAGEConv, global_mean_pool
from torch_geometric.utils import to_dense_batch

ENCODERS: dict[str, type["Encoder"]] = {}


def register(name: str):
    def deco(cls):
        ENCODERS[name] = cls
        cls.name = name
        return cls

    return deco


class Encoder(nn.Module):
    """Base: an input projection, then the subclass's message passing. ``out_dim`` is the embedding size."""

    name = "base"

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__()
        self.in_dim, self.hidden, self.layers = in_dim, hidden, layers
        self.inp = nn.Linear(in_dim, hidden)

    @property
    def out_dim(self) -> int:
        return self.hidden

    def reset_parameters(self) -> None:
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()


def _undirected(edge_index: torch.Tensor) -> torch.Tensor:
    return torch.cat([edge_index, edge_index.flip(0)], dim=1)


@register("mlp")
class MLPEncoder(Encoder):
    """No graph: each node embedded from its own features only (ablation baseline)."""

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__(in_dim, hidden, layers)
        self.body = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers - 1))

    def forward(self, x, edge_index, batch):
        h = torch.relu(self.inp(x))
        for lin in self.body:
            h = torch.relu(lin(h)) + h
        return h


class _ConvEncoder(Encoder):
    """Residual stack of PyG convolutions over the undirected graph."""

    def make_conv(self) -> nn.Module:
        raise TypeError("subclasses define make_conv")

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__(in_dim, hidden, layers)
        self.convs = nn.ModuleList(self.make_conv() for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))

    def forward(self, x, edge_index, batch):
        h = torch.relu(self.inp(x))
        ei = _undirected(edge_index)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + torch.relu(conv(h, ei)))
        return h


@register("sage")
class SAGEEncoder(_ConvEncoder):
    """GraphSAGE (mean aggregation) as in GDP's graph embedding."""

    def make_conv(self) -> nn.Module:
        return SAGEConv(self.hidden, self.hidden)


@register("gcn")
class GCNEncoder(_ConvEncoder):
    def make_conv(self) -> nn.Module:
        return GCNConv(self.hidden, self.hidden)


@register("gat")
class GATEncoder(_ConvEncoder):
    """GATv2 with 4 heads concatenated to ``hidden``."""

    def make_conv(self) -> nn.Module:
        heads = 4
        return GATv2Conv(self.hidden, self.hidden // heads, heads=heads)


@register("placeto")
class PlacetoEncoder(Encoder):
    """Placeto's DAG embedding: message passing forward along data flow (from parents) and backward (from
    children) with separate weights, plus a "parallel" summary — the mean input embedding of the whole graph,
    standing in for Placeto's mean over the nodes that are neither ancestors nor descendants — concatenated and
    projected.

    Placeto propagates over the full topological order; here ``layers`` rounds of directed message passing
    (receptive field ``layers`` hops each way) keep the cost linear and batched; ``layers`` is configurable.
    """

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 4) -> None:
        super().__init__(in_dim, hidden, layers)
        self.fwd = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(layers))
        self.bwd = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(layers))
        self.out = nn.Linear(3 * hidden, hidden)

    def forward(self, x, edge_index, batch):
        h0 = torch.relu(self.inp(x))
        hf, hb = h0, h0
        rev = edge_index.flip(0)
        for cf, cb in zip(self.fwd, self.bwd):
            hf = hf + torch.relu(cf(hf, edge_index))  # parent aggregation
            hb = hb + torch.relu(cb(hb, rev))  # child aggregation
        pooled = global_mean_pool(h0, batch)[batch]  # parallel (graph-level) aggregation
        return torch.relu(self.out(torch.cat([hf, hb, pooled], dim=-1)))


@register("gdp")
class GDPEncoder(Encoder):
    """GDP's placer encoder: GraphSAGE, then self-attention over all node embeddings of the same graph, so
    every node's decision sees the whole graph."""

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3, attn_layers: int = 2, heads: int = 4) -> None:
        super().__init__(in_dim, hidden, layers)
        self.sage = SAGEEncoder(in_dim, hidden, layers)
        layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=2 * hidden, dropout=0.0, batch_first=True)
        self.attn = nn.TransformerEncoder(layer, attn_layers, enable_nested_tensor=False)

    def forward(self, x, edge_index, batch):
        h = self.sage(x, edge_index, batch)
        dense, mask = to_dense_batch(h, batch)  # [B, N_max, H], [B, N_max]
        dense = self.attn(dense, src_key_padding_mask=~mask)
        return dense[mask]


def build_encoder(name: str, in_dim: int, **kwargs) -> Encoder:
    from placement_rl.errors import ConfigError

    if name not in ENCODERS:
        raise ConfigError(f"unknown encoder '{name}' (choose one of {', '.join(sorted(ENCODERS))})")
    return ENCODERS[name](in_dim, **kwargs)
