"""``nmt``: a GNMT-lite LSTM encoder-decoder with attention, trained with teacher forcing.

The LSTM layers are unrolled over time (one ``LSTMCell`` node per token and layer), as in the
TensorFlow NMT graphs placed by ColocRL/HDP; a whole-sequence ``nn.LSTM`` would be one node, and
its fused CPU kernel is invisible to ``FlopCounterMode``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.models._common import check_positive, check_prob, seeded

DEFAULTS = dict(batch_size=64, src_len=20, tgt_len=20, vocab_size=16000, hidden=512, enc_layers=3,
                dec_layers=3, dropout=0.1, seed=0)


class LSTMLayer(nn.Module):
    """One unidirectional LSTM layer unrolled over time: one ``LSTMCell`` call per token.

    Shapes: x [B, T, in_features] -> [B, T, hidden].
    """

    def __init__(self, in_features: int, hidden: int, *, reverse: bool = False) -> None:
        super().__init__()
        self.hidden, self.reverse = hidden, reverse
        self.cell = nn.LSTMCell(in_features, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.unbind(1)
        if self.reverse:
            xs = xs[::-1]
        h = c = x.new_zeros(x.shape[0], self.hidden)
        outs = []
        for xt in xs:
            h, c = self.cell(xt, (h, c))
            outs.append(h)
        if self.reverse:
            outs = outs[::-1]
        return torch.stack(outs, 1)


class Encoder(nn.Module):
    """Bidirectional first layer, then unidirectional layers (residual from the third on)."""

    def __init__(self, *, vocab_size: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.fwd = LSTMLayer(hidden, hidden // 2)
        self.bwd = LSTMLayer(hidden, hidden // 2, reverse=True)
        self.layers = nn.ModuleList(LSTMLayer(hidden, hidden) for _ in range(layers - 1))
        self.drop = nn.Dropout(dropout)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embed(src))
        x = torch.cat([self.fwd(x), self.bwd(x)], 2)
        for i, layer in enumerate(self.layers):
            out = layer(self.drop(x))
            x = out + x if i >= 1 else out
        return x


class Decoder(nn.Module):
    """Bottom LSTM, Luong-style attention over the encoder, upper LSTMs fed [h, context]."""

    def __init__(self, *, vocab_size: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.bottom = LSTMLayer(hidden, hidden)
        self.attn_query = nn.Linear(hidden, hidden, bias=False)
        self.layers = nn.ModuleList(LSTMLayer(2 * hidden, hidden) for _ in range(layers - 1))
        self.drop = nn.Dropout(dropout)
        self.scale = hidden ** -0.5

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        h = self.bottom(self.drop(self.embed(tgt)))
        scores = torch.bmm(self.attn_query(h), memory.transpose(1, 2)) * self.scale
        context = torch.bmm(torch.softmax(scores, -1), memory)
        for i, layer in enumerate(self.layers):
            out = layer(self.drop(torch.cat([h, context], 2)))
            h = out + h if i >= 1 else out
        return h


class NMT(nn.Module):
    """forward(src [B, S] int64, tgt_in [B, T] int64, tgt_out [B, T] int64) -> scalar loss."""

    def __init__(self, *, vocab_size: int, hidden: int, enc_layers: int, dec_layers: int,
                 dropout: float) -> None:
        super().__init__()
        self.encoder = Encoder(vocab_size=vocab_size, hidden=hidden, layers=enc_layers, dropout=dropout)
        self.decoder = Decoder(vocab_size=vocab_size, hidden=hidden, layers=dec_layers, dropout=dropout)
        self.proj = nn.Linear(hidden, vocab_size)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        h = self.decoder(tgt_in, self.encoder(src))
        logits = self.proj(h)
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())


def build(*, batch_size: int, src_len: int, tgt_len: int, vocab_size: int, hidden: int, enc_layers: int,
          dec_layers: int, dropout: float, seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_positive("nmt", batch_size=batch_size, src_len=src_len, tgt_len=tgt_len, vocab_size=vocab_size,
                   hidden=hidden, enc_layers=enc_layers, dec_layers=dec_layers)
    check_prob("nmt", dropout=dropout)
    if hidden % 2:
        raise GraphError(f"zoo model 'nmt': option hidden={hidden} must be even (bidirectional first layer)")
    with seeded(seed) as gen:
        model = NMT(vocab_size=vocab_size, hidden=hidden, enc_layers=enc_layers, dec_layers=dec_layers,
                    dropout=dropout)
        src = torch.randint(0, vocab_size, (batch_size, src_len), generator=gen)
        tgt = torch.randint(0, vocab_size, (batch_size, tgt_len + 1), generator=gen)
    return model, (src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous())
