"""Padded env observations -> one disjoint graph, and the sparse aggregation operators every encoder shares.

``batch_graphs(obs)`` turns the ``[B, ...]`` padded observation of a vector of envs into one disjoint graph with
tensor ops only (no Python loop over the batch). ``Adjacency`` holds the two sparse "sum over neighbours"
operators of that graph (over predecessors and over successors, CSR) built once per forward pass; every layer of
every encoder reuses them, and each one's transpose is the other, so backward is a sparse product too (no
transpose or re-sort at backward time).

Shapes (B graphs, N = max_nodes, E = max_edges, T = real nodes in the batch, E_T = real edges):
    node_features [B, N, F], op_type [B, N], edge_index [B, 2, E] (padding -1), num_nodes [B, 1]
    -> x [T, F], op_type [T], edge_index [2, E_T] (global ids), batch [T], node_mask [B, N]
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property

import torch



@dataclass(frozen=True)
class GraphBatch:
    """One disjoint graph made of ``num_graphs`` padded observations."""

    x: torch.Tensor  # [T, F]
    op_type: torch.Tensor  # [T] int64
    edge_index: torch.Tensor  # [2, E_T] int64, global node ids
    batch: torch.Tensor  # [T] graph id of each node, sorted
    node_mask: torch.Tensor  # [B, N] bool, real nodes
    offsets: torch.Tensor  # [B] global id of each graph's node 0
    full: bool  # every graph has N real nodes (node_mask all true: dense reshapes need no masking)

    @property
    def num_graphs(self) -> int:
        return int(self.node_mask.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @cached_property
    def adjacency(self) -> "Adjacency":
        return Adjacency(self.edge_index, self.num_nodes)

    def to_dense(self, h: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` node rows -> ``[B, N, H]`` with zero rows for padding."""
        b, n = self.node_mask.shape
        if self.full:
            return h.reshape(b, n, h.shape[-1])
        dense = h.new_zeros(b, n, h.shape[-1])
        dense[self.node_mask] = h
        return dense

    def mean_pool(self, h: torch.Tensor) -> torch.Tensor:
        """Mean node embedding per graph, ``[B, H]``."""
        b, n = self.node_mask.shape
        if self.full:
            return h.reshape(b, n, h.shape[-1]).mean(1)
        counts = self.node_mask.sum(1, keepdim=True).clamp(min=1).to(h.dtype)
        return self.to_dense(h).sum(1) / counts


def batch_graphs(obs: dict[str, torch.Tensor]) -> GraphBatch:
    """Padded ``[B, ...]`` observations -> one disjoint ``GraphBatch`` (node ids offset by the cumulative node
    counts; no Python loop). Observation values may arrive as floats (SB3 casts Box spaces); they are rounded."""
    feats = obs["node_features"]
    b, n_max, f = feats.shape
    dev = feats.device
    num_nodes = obs["num_nodes"].reshape(b).round().long()
    ei = obs["edge_index"].reshape(b, 2, -1).round().long()  # [B, 2, E], padding -1
    op = obs["op_type"].reshape(b, n_max).round().long()
    full = bool((num_nodes == n_max).all())
    if full:
        node_mask = torch.ones(b, n_max, dtype=torch.bool, device=dev)
        x, op_type = feats.reshape(b * n_max, f), op.reshape(-1)
        offsets = torch.arange(b, device=dev) * n_max
        batch = torch.arange(b, device=dev).repeat_interleave(n_max)
    else:
        node_mask = torch.arange(n_max, device=dev).unsqueeze(0) < num_nodes.unsqueeze(1)
        x, op_type = feats[node_mask], op[node_mask]
        offsets = torch.cumsum(num_nodes, 0) - num_nodes
        batch = torch.repeat_interleave(torch.arange(b, device=dev), num_nodes)
    valid = ei[:, 0, :] >= 0  # [B, E]
    shifted = ei + offsets.view(b, 1, 1)
    if bool(valid.all()):
        edge_index = shifted.permute(1, 0, 2).reshape(2, -1)
    else:
        edge_index = shifted.permute(1, 0, 2)[:, valid]
    return GraphBatch(x=x, op_type=op_type, edge_index=edge_index, batch=batch, node_mask=node_mask, offsets=offsets,
                      full=full)


class _SpMM(torch.autograd.Function):
    """``a @ x`` for a constant sparse ``a`` whose transpose ``at`` is known: backward is ``at @ grad``."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, at: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.at = at
        return a @ x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return None, None, ctx.at @ grad.contiguous()


def _csr(rows: torch.Tensor, cols: torch.Tensor, n: int) -> torch.Tensor:
    """Unit-valued CSR matrix ``[n, n]`` with an entry (rows[k], cols[k]) per edge (duplicates add up)."""
    order = torch.argsort(rows, stable=True)
    counts = torch.bincount(rows, minlength=n)
    crow = torch.zeros(n + 1, dtype=torch.long, device=rows.device)
    torch.cumsum(counts, 0, out=crow[1:])
    vals = torch.ones(rows.shape[0], dtype=torch.float32, device=rows.device)
    with warnings.catch_warnings():  # torch marks CSR as beta; CSR @ dense, all that is used here, is stable
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, cols[order], vals, (n, n), check_invariants=False)


class Adjacency:
    """Neighbour aggregations of a directed graph (``edge_index[0] -> edge_index[1]`` = data flow).

    ``sum_in(h)[i]`` sums ``h`` over i's predecessors, ``sum_out`` over its successors; ``mean_in``,
    ``mean_out``, ``mean_all`` (both directions) divide by the matching degree (isolated nodes get 0);
    ``gcn(h)`` is Kipf & Welling's symmetric normalisation ``D^-1/2 (A + A^T + I) D^-1/2 h``.
    """

    def __init__(self, edge_index: torch.Tensor, num_nodes: int) -> None:
        src, dst = edge_index[0], edge_index[1]
        n = int(num_nodes)
        self.num_nodes = n
        self._in = _csr(dst, src, n)  # row i: predecessors of i
        self._out = _csr(src, dst, n)  # row i: successors of i (the transpose of _in)
        deg_in = torch.bincount(dst, minlength=n).to(torch.float32)
        deg_out = torch.bincount(src, minlength=n).to(torch.float32)
        self.inv_in = (1.0 / deg_in.clamp(min=1)).unsqueeze(1)
        self.inv_out = (1.0 / deg_out.clamp(min=1)).unsqueeze(1)
        self.inv_all = (1.0 / (deg_in + deg_out).clamp(min=1)).unsqueeze(1)
        self.gcn_scale = (deg_in + deg_out + 1.0).rsqrt().unsqueeze(1)

    def sum_in(self, h: torch.Tensor) -> torch.Tensor:
        return _SpMM.apply(self._in, self._out, h)

    def sum_out(self, h: torch.Tensor) -> torch.Tensor:
        return _SpMM.apply(self._out, self._in, h)

    def mean_in(self, h: torch.Tensor) -> torch.Tensor:
        return self.sum_in(h) * self.inv_in

    def mean_out(self, h: torch.Tensor) -> torch.Tensor:
        return self.sum_out(h) * self.inv_out

    def mean_all(self, h: torch.Tensor) -> torch.Tensor:
        return (self.sum_in(h) + self.sum_out(h)) * self.inv_all

    def gcn(self, h: torch.Tensor) -> torch.Tensor:
        s = self.gcn_scale
        hs = h * s
        return (self.sum_in(hs) + self.sum_out(hs) + hs) * s
