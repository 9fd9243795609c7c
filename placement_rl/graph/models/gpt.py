"""``gpt``: a GPT-style decoder-only language model (pre-LayerNorm, causal attention, tied head).

Attention is written with explicit matmuls and softmax (not ``scaled_dot_product_attention``):
on CPU the fused SDPA kernel is invisible to ``FlopCounterMode``, which would make the captured
FLOPs depend on the device the graph was captured on.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.models._common import check_positive, check_prob, seeded

DEFAULTS = dict(batch_size=8, seq_len=256, vocab_size=16384, d_model=512, n_layers=6, n_heads=8,
                dropout=0.1, seed=0)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention. Shapes: x [B, T, C] -> [B, T, C]."""

    def __init__(self, *, d_model: int, n_heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(seq_len, seq_len, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, 2))
        att = (q @ k.transpose(-2, -1)) * (c // self.n_heads) ** -0.5
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = self.attn_drop(torch.softmax(att, -1)) @ v
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class FeedForward(nn.Module):
    """Linear(d, 4d) -> GELU -> Linear(4d, d) -> dropout."""

    def __init__(self, *, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(F.gelu(self.fc1(x))))


class Block(nn.Module):
    """Pre-LN transformer block; ``ffn`` returns its output (and the MoE variant an aux loss)."""

    def __init__(self, *, d_model: int, n_heads: int, seq_len: int, dropout: float, ffn: nn.Module) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model=d_model, n_heads=n_heads, seq_len=seq_len, dropout=dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x + self.attn(self.ln1(x))
        out = self.ffn(self.ln2(x))
        if isinstance(out, tuple):
            return x + out[0], out[1]
        return x + out, None


class TransformerLM(nn.Module):
    """Token + position embeddings, blocks, final LayerNorm, head tied to the token embedding.

    forward(idx [B, T] int64, targets [B, T] int64) -> scalar loss (+ ``aux_coef`` x aux losses).
    """

    def __init__(self, *, vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int,
                 dropout: float, make_ffn: Callable[[], nn.Module], aux_coef: float = 0.0) -> None:
        super().__init__()
        self.aux_coef = aux_coef
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(d_model=d_model, n_heads=n_heads, seq_len=seq_len, dropout=dropout, ffn=make_ffn())
            for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases (keeps the initial loss near log(vocab))."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        aux_total = None
        for block in self.blocks:
            x, aux = block(x)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if aux_total is not None:
            loss = loss + self.aux_coef * aux_total
        return loss


def check_transformer(model: str, *, batch_size: int, seq_len: int, vocab_size: int, d_model: int,
                      n_layers: int, n_heads: int, dropout: float) -> None:
    check_positive(model, batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size, d_model=d_model,
                   n_layers=n_layers, n_heads=n_heads)
    check_prob(model, dropout=dropout)
    if d_model % n_heads:
        raise GraphError(f"zoo model '{model}': option n_heads={n_heads} must divide d_model={d_model}")


def lm_inputs(gen: torch.Generator, *, batch_size: int, seq_len: int, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """Random token ids and their next-token targets."""
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build(*, batch_size: int, seq_len: int, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
          dropout: float, seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_transformer("gpt", batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size, d_model=d_model,
                      n_layers=n_layers, n_heads=n_heads, dropout=dropout)
    with seeded(seed) as gen:
        model = TransformerLM(vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_layers=n_layers,
                              n_heads=n_heads, dropout=dropout,
                              make_ffn=lambda: FeedForward(d_model=d_model, dropout=dropout))
        inputs = lm_inputs(gen, batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size)
    return model, inputs
