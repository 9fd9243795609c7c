"""The constructive placement policy: node embeddings once per episode, a small shared head per device.

``DevicePolicy`` encodes the graph once (any encoder of ``agents.encoders``: sage, gat, gcn, placeto, gdp, mlp)
into node embeddings; each decision scores every device with the same small network on (the node's
embedding, that device's schedule features), plus a DeepSets context (the mean over the devices of their
hidden states), so nothing in the weights depends on the number or order of devices: one checkpoint places on
1 to 64 devices of mixed kinds. Masked devices get -inf.

Shapes:
    x:            [N, node_dim]   static node features (``envs.constructive_task.node_features``)
    edge_index:   [2, E]
    embed(...) -> [N, hidden]
    node_h:       [B, hidden]     embeddings of the nodes being placed (one per decision)
    dev_feats:    [B, D, dev_dim] per-device features (``placement_rl.cost.schedule.DEVICE_FEATURES``)
    mask:         [B, D] bool     devices that may take the node
    logits(...) -> [B, D]
"""

from __future__ import annotations

import torch
from torch import nn

from placement_rl.agents.encoders import build_encoder


class DevicePolicy(nn.Module):
    def __init__(self, *, node_dim: int, dev_dim: int, encoder: str = "sage", hidden: int = 64,
                 layers: int = 3) -> None:
        super().__init__()
        self.node_dim, self.dev_dim, self.hidden = node_dim, dev_dim, hidden
        self.encoder = build_encoder(encoder, node_dim, hidden=hidden, layers=layers)
        self.node_out = nn.Linear(self.encoder.out_dim, hidden)
        self.dev_in = nn.Sequential(nn.Linear(dev_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.phi = nn.Sequential(nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.rho = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        batch = torch.zeros(x.shape[0], dtype=torch.long)
        return self.node_out(self.encoder(x, edge_index, batch))

    def logits(self, node_h: torch.Tensor, dev_feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.phi(self.dev_in(dev_feats) + node_h.unsqueeze(1))  # [B, D, H]
        m = mask.unsqueeze(-1).to(h.dtype)
        ctx = (h * m).sum(1) / m.sum(1).clamp(min=1.0)  # [B, H]
        out = self.rho(torch.cat([h, ctx.unsqueeze(1).expand_as(h)], dim=-1)).squeeze(-1)
        return out.masked_fill(~mask, float("-inf"))
