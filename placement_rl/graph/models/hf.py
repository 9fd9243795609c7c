"""``gpt2_hf`` / ``bert_hf`` / ``opt_hf``: Hugging Face transformers built from a config (no weight download).

``transformers`` is imported only when a model is built (it is slow to import). Attention uses the ``eager`` implementation
(explicit matmuls) so its FLOPs are visible to ``FlopCounterMode`` on every device, and the KV
cache is off (``use_cache=False``) so the forward is a plain training step.
"""

from __future__ import annotations

import torch
from torch import nn

from placement_rl.graph.models._common import check_positive, check_prob, seeded
from placement_rl.graph.models.gpt import check_transformer

GPT2_DEFAULTS = dict(batch_size=8, seq_len=128, vocab_size=50257, d_model=512, n_layers=4, n_heads=8,
                     dropout=0.1, seed=0)
BERT_DEFAULTS = dict(batch_size=8, seq_len=128, vocab_size=30522, d_model=512, n_layers=4, n_heads=8,
                     dropout=0.1, mask_prob=0.15, seed=0)
OPT_DEFAULTS = dict(batch_size=8, seq_len=128, vocab_size=50272, d_model=512, n_layers=4, n_heads=8,
                    dropout=0.1, seed=0)


class CausalLMLoss(nn.Module):
    """forward(input_ids [B, T] int64, labels [B, T] int64) -> the model's shifted LM loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss


class MaskedLMLoss(nn.Module):
    """forward(input_ids [B, T] int64, labels [B, T] int64, -100 = not masked) -> MLM loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels).loss


def build_gpt2(*, batch_size: int, seq_len: int, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
               dropout: float, seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_transformer("gpt2_hf", batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size,
                      d_model=d_model, n_layers=n_layers, n_heads=n_heads, dropout=dropout)
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=seq_len, n_embd=d_model, n_layer=n_layers,
                        n_head=n_heads, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                        use_cache=False, bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1)
    config._attn_implementation = "eager"
    with seeded(seed) as gen:
        lm = GPT2LMHeadModel(config)
        lm.loss_type = "ForCausalLM"  # the class name does not say so; silences a fallback warning
        model = CausalLMLoss(lm)
        ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=gen)
    return model, (ids, ids.clone())


def build_opt(*, batch_size: int, seq_len: int, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
              dropout: float, seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Meta's OPT (``OPTForCausalLM``): pre-LayerNorm decoder, learned positions, ReLU MLP of 4 x d_model."""
    check_transformer("opt_hf", batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size,
                      d_model=d_model, n_layers=n_layers, n_heads=n_heads, dropout=dropout)
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(vocab_size=vocab_size, hidden_size=d_model, num_hidden_layers=n_layers, ffn_dim=4 * d_model,
                       num_attention_heads=n_heads, max_position_embeddings=max(seq_len, 64),
                       word_embed_proj_dim=d_model, do_layer_norm_before=True, dropout=dropout,
                       attention_dropout=dropout, use_cache=False, pad_token_id=1, bos_token_id=2, eos_token_id=2)
    config._attn_implementation = "eager"
    with seeded(seed) as gen:
        lm = OPTForCausalLM(config)
        lm.loss_type = "ForCausalLM"
        model = CausalLMLoss(lm)
        ids = torch.randint(3, vocab_size, (batch_size, seq_len), generator=gen)
    return model, (ids, ids.clone())


def build_bert(*, batch_size: int, seq_len: int, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
               dropout: float, mask_prob: float, seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_transformer("bert_hf", batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size,
                      d_model=d_model, n_layers=n_layers, n_heads=n_heads, dropout=dropout)
    check_prob("bert_hf", mask_prob=mask_prob)
    check_positive("bert_hf", mask_prob=mask_prob)
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=vocab_size, hidden_size=d_model, num_hidden_layers=n_layers,
                        num_attention_heads=n_heads, intermediate_size=4 * d_model,
                        max_position_embeddings=max(512, seq_len), hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout, pad_token_id=0)
    config._attn_implementation = "eager"
    with seeded(seed) as gen:
        model = MaskedLMLoss(BertForMaskedLM(config))
        ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=gen)
        masked = torch.rand(batch_size, seq_len, generator=gen) < mask_prob
        masked[:, 0] = True  # at least one target per row, so the loss is never NaN
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return model, (ids, labels)
