"""Graph encoders: per-node embeddings of a batch of (disjoint) computation graphs.

Every encoder maps node features to node embeddings with parameters independent of graph size, so a policy
trained on small graphs places larger ones (zero-shot).

Message passing uses the shared sparse operators of ``agents.graph_batch.Adjacency`` (built once per forward and
reused by every layer; sums over predecessors / successors as CSR products) rather than a per-layer scatter:
the same maths as PyG's ``SAGEConv`` / ``GCNConv`` at a fraction of the per-call overhead, which dominates on
the small graphs RL trains on. GAT uses PyG's ``GATv2Conv``.

Shapes:
    x:          [total_nodes, in_dim]   node features of all graphs in the batch, concatenated
    edge_index: [2, total_edges]        directed edges (src -> dst = data flow), indices into ``x``
    batch:      [total_nodes]           graph id of each node (0..B-1), sorted
    adj:        optional ``Adjacency`` of ``edge_index`` (built from it when not given)
    returns:    [total_nodes, hidden]
"""

from __future__ import annotations

import torch
from torch import nn

from placement_rl.agents.graph_batch import Adjacency
from placement_rl.errors import ConfigError

ENCODERS: dict[str, type["Encoder"]] = {}


def register(name: str):
    def deco(cls):
        ENCODERS[name] = cls
        cls.name = name
        return cls

    return deco


def _mean_pool(h: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """Mean of ``h`` per graph id, ``[B, H]``."""
    b = int(batch[-1]) + 1 if batch.numel() else 0
    sums = h.new_zeros(b, h.shape[-1]).index_add_(0, batch, h)
    counts = torch.bincount(batch, minlength=b).clamp(min=1).unsqueeze(1).to(h.dtype)
    return sums / counts


class Encoder(nn.Module):
    """Base: an input projection, then the subclass's message passing. ``out_dim`` is the embedding size."""

    name = "base"

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__()
        if hidden < 1 or layers < 1:
            raise ConfigError(f"encoder needs hidden >= 1 and layers >= 1, got hidden={hidden}, layers={layers}")
        self.in_dim, self.hidden, self.layers = in_dim, hidden, layers
        self.inp = nn.Linear(in_dim, hidden)

    @property
    def out_dim(self) -> int:
        return self.hidden

    def reset_parameters(self) -> None:
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    @staticmethod
    def adjacency(edge_index: torch.Tensor, num_nodes: int, adj: Adjacency | None) -> Adjacency:
        return adj if adj is not None else Adjacency(edge_index, num_nodes)


class MeanConv(nn.Module):
    """GraphSAGE layer: ``W_agg * aggregated + W_root * h`` (PyG ``SAGEConv`` with mean aggregation)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin_agg = nn.Linear(hidden, hidden)
        self.lin_root = nn.Linear(hidden, hidden, bias=False)

    def forward(self, agg: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.lin_agg(agg) + self.lin_root(h)


@register("mlp")
class MLPEncoder(Encoder):
    """No graph: each node embedded from its own features only (ablation baseline)."""

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__(in_dim, hidden, layers)
        self.body = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers - 1))

    def forward(self, x, edge_index, batch, adj: Adjacency | None = None):
        h = torch.relu(self.inp(x))
        for lin in self.body:
            h = torch.relu(lin(h)) + h
        return h


@register("sage")
class SAGEEncoder(Encoder):
    """GraphSAGE (mean over all neighbours, both directions) as in GDP's graph embedding; residual + LayerNorm.

    ``layer_k: h <- LayerNorm(h + relu(W_agg mean_{j in N(i)} h_j + W_root h_i))``
    """

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__(in_dim, hidden, layers)
        self.convs = nn.ModuleList(MeanConv(hidden) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))

    def forward(self, x, edge_index, batch, adj: Adjacency | None = None):
        a = self.adjacency(edge_index, x.shape[0], adj)
        h = torch.relu(self.inp(x))
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + torch.relu(conv(a.mean_all(h), h)))
        return h


@register("gcn")
class GCNEncoder(Encoder):
    """GCN (Kipf & Welling, symmetric normalisation with self-loops over the undirected graph)."""

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__(in_dim, hidden, layers)
        self.lins = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))

    def forward(self, x, edge_index, batch, adj: Adjacency | None = None):
        a = self.adjacency(edge_index, x.shape[0], adj)
        h = torch.relu(self.inp(x))
        for lin, norm in zip(self.lins, self.norms):
            h = norm(h + torch.relu(lin(a.gcn(h))))
        return h


@register("gat")
class GATEncoder(Encoder):
    """GATv2 (PyG) with 4 heads concatenated to ``hidden``, over the undirected graph; residual + LayerNorm."""

    HEADS = 4

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3) -> None:
        if hidden % self.HEADS:
            raise ConfigError(f"gat needs hidden divisible by {self.HEADS} heads, got hidden={hidden}")
        super().__init__(in_dim, hidden, layers)
        from torch_geometric.nn import GATv2Conv  # here: importing PyG costs every command about 2 s

        self.convs = nn.ModuleList(GATv2Conv(hidden, hidden // self.HEADS, heads=self.HEADS) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))

    def forward(self, x, edge_index, batch, adj: Adjacency | None = None):
        h = torch.relu(self.inp(x))
        ei = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + torch.relu(conv(h, ei)))
        return h


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
        self.fwd = nn.ModuleList(MeanConv(hidden) for _ in range(layers))
        self.bwd = nn.ModuleList(MeanConv(hidden) for _ in range(layers))
        self.out = nn.Linear(3 * hidden, hidden)

    def forward(self, x, edge_index, batch, adj: Adjacency | None = None):
        a = self.adjacency(edge_index, x.shape[0], adj)
        h0 = torch.relu(self.inp(x))
        hf, hb = h0, h0
        for cf, cb in zip(self.fwd, self.bwd):
            hf = hf + torch.relu(cf(a.mean_in(hf), hf))  # parent aggregation
            hb = hb + torch.relu(cb(a.mean_out(hb), hb))  # child aggregation
        pooled = _mean_pool(h0, batch)[batch]  # parallel (graph-level) aggregation
        return torch.relu(self.out(torch.cat([hf, hb, pooled], dim=-1)))


@register("gdp")
class GDPEncoder(Encoder):
    """GDP's placer encoder: GraphSAGE, then self-attention over all node embeddings of the same graph, so
    every node's decision sees the whole graph."""

    def __init__(self, in_dim: int, hidden: int = 64, layers: int = 3, attn_layers: int = 2, heads: int = 4) -> None:
        if hidden % heads:
            raise ConfigError(f"gdp needs hidden divisible by {heads} attention heads, got hidden={hidden}")
        super().__init__(in_dim, hidden, layers)
        del self.inp  # the SAGE stack has its own input projection
        self.sage = SAGEEncoder(in_dim, hidden, layers)
        layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=2 * hidden, dropout=0.0, batch_first=True)
        self.attn = nn.TransformerEncoder(layer, attn_layers, enable_nested_tensor=False)

    def forward(self, x, edge_index, batch, adj: Adjacency | None = None):
        from torch_geometric.utils import to_dense_batch

        h = self.sage(x, edge_index, batch, adj)
        dense, mask = to_dense_batch(h, batch)  # [B, N_max, H], [B, N_max]
        dense = self.attn(dense, src_key_padding_mask=~mask)
        return dense[mask]


def build_encoder(name: str, in_dim: int, **kwargs) -> Encoder:
    if name not in ENCODERS:
        raise ConfigError(f"unknown encoder '{name}' (choose one of {', '.join(sorted(ENCODERS))})")
    return ENCODERS[name](in_dim, **kwargs)
