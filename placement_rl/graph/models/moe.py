"""``moe``: a GPT-style decoder whose feed-forward layers are top-k mixtures of experts.

Routing follows Switch/GShard with a fixed expert capacity, so every shape is static and the
model exports on meta/fake tensors: router softmax -> top-k gates -> a token's slot in each
chosen expert's buffer (token-order priority, tokens over capacity are dropped) -> one-hot
dispatch/combine tensors [tokens, experts, capacity] -> einsum dispatch, one FFN per expert
on its [capacity, d_model] buffer, einsum combine. A Switch load-balancing loss is added.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.models._common import check_positive, seeded
from placement_rl.graph.models.gpt import TransformerLM, check_transformer, lm_inputs

DEFAULTS = dict(batch_size=8, seq_len=256, vocab_size=16384, d_model=512, n_layers=4, n_heads=8,
                n_experts=8, top_k=2, capacity_factor=1.25, aux_coef=0.01, dropout=0.1, seed=0)


class Expert(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoEFeedForward(nn.Module):
    """Top-k routed experts with capacity ``ceil(capacity_factor * top_k * tokens / n_experts)``.

    Shapes: x [B, T, C] -> ([B, T, C], aux loss scalar).
    """

    def __init__(self, *, d_model: int, n_experts: int, top_k: int, capacity_factor: float,
                 dropout: float) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model) for _ in range(n_experts))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, c = x.shape
        tokens = x.reshape(b * t, c)
        n, e = tokens.shape[0], self.n_experts
        capacity = max(1, math.ceil(self.capacity_factor * self.top_k * n / e))
        probs = torch.softmax(self.router(tokens), -1)                       # [N, E]
        top_p, top_i = probs.topk(self.top_k, -1)                             # [N, k]
        top_p = top_p / top_p.sum(-1, keepdim=True)
        experts = torch.arange(e, device=x.device)
        chosen = top_i.unsqueeze(-1) == experts                               # [N, k, E]
        mask = chosen.any(1).to(x.dtype)                                      # [N, E]
        gates = (chosen.to(x.dtype) * top_p.unsqueeze(-1)).sum(1)             # [N, E]
        position = torch.cumsum(mask, 0) * mask - 1                           # slot or -1
        slots = torch.arange(capacity, device=x.device, dtype=x.dtype)
        dispatch = (position.unsqueeze(-1) == slots).to(x.dtype)              # [N, E, cap]
        combine = dispatch * gates.unsqueeze(-1)
        expert_in = torch.einsum("nec,nd->ecd", dispatch, tokens)             # [E, cap, C]
        expert_out = torch.stack([exp(expert_in[i]) for i, exp in enumerate(self.experts)])
        out = torch.einsum("nec,ecd->nd", combine, expert_out)
        aux = e * (mask.mean(0) / self.top_k * probs.mean(0)).sum()
        return self.drop(out.reshape(b, t, c)), aux


def build(*, batch_size: int, seq_len: int, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
          n_experts: int, top_k: int, capacity_factor: float, aux_coef: float, dropout: float,
          seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_transformer("moe", batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size, d_model=d_model,
                      n_layers=n_layers, n_heads=n_heads, dropout=dropout)
    check_positive("moe", n_experts=n_experts, top_k=top_k, capacity_factor=capacity_factor)
    if top_k > n_experts:
        raise GraphError(f"zoo model 'moe': option top_k={top_k} must be <= n_experts={n_experts}")
    if aux_coef < 0:
        raise GraphError(f"zoo model 'moe': option aux_coef={aux_coef} must be >= 0")
    with seeded(seed) as gen:
        model = TransformerLM(
            vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
            dropout=dropout, aux_coef=aux_coef,
            make_ffn=lambda: MoEFeedForward(d_model=d_model, n_experts=n_experts, top_k=top_k,
                                            capacity_factor=capacity_factor, dropout=dropout))
        inputs = lm_inputs(gen, batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size)
    return model, inputs
