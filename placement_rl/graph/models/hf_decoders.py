"""``llama_hf`` / ``mixtral_hf``: Llama-family causal LMs of ``transformers`` built from a small config (no weight
download), with eager attention, no KV cache and the causal-LM loss (``CausalLMLoss``).

``build_decoder(family, ...)`` builds any of ``FAMILIES`` (Llama, Mistral, Qwen2, Phi-3, Gemma, Mixtral) from the
same options; the zoo exposes ``llama_hf`` and ``mixtral_hf``. These models run their rotary embedding under
``torch.no_grad()``, which ``torch.export`` emits as a ``wrap_with_set_grad_enabled`` region
(``placement_rl.graph.hop`` inlines it).

Mixtral's experts: ``transformers`` 5 runs them through the custom op ``transformers::grouped_mm_fallback`` (one
grouped matmul over the tokens sorted by expert: data-dependent group sizes, all experts in one op) unless
``experts="batched_mm"`` (a gather of each token's expert weights and a batched matmul). ``FlopCounterMode`` knows
no formula for it, nor for ``aten._grouped_mm`` (what the eager model calls on torch >= 2.9), so
``register_moe_flops()`` registers ``2 * tokens * in * out`` for both (and twice that for the custom backward op).
"""

from __future__ import annotations

import importlib
from math import prod
from typing import Any

import torch
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.models._common import check_positive, seeded
from placement_rl.graph.models.gpt import check_transformer
from placement_rl.graph.models.hf import CausalLMLoss

# family -> (transformers module, config class, model class)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "llama": ("transformers", "LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("transformers", "MistralConfig", "MistralForCausalLM"),
    "qwen2": ("transformers", "Qwen2Config", "Qwen2ForCausalLM"),
    "phi3": ("transformers", "Phi3Config", "Phi3ForCausalLM"),
    "gemma": ("transformers", "GemmaConfig", "GemmaForCausalLM"),
    "mixtral": ("transformers", "MixtralConfig", "MixtralForCausalLM"),
}
EXPERTS = ("grouped_mm", "batched_mm")

LLAMA_DEFAULTS = dict(batch_size=4, seq_len=128, vocab_size=32000, d_model=512, n_layers=4, n_heads=8, n_kv_heads=4,
                      ffn_hidden=1408, seed=0)
MIXTRAL_DEFAULTS = dict(LLAMA_DEFAULTS, n_experts=8, top_k=2, experts="grouped_mm")


def register_moe_flops() -> None:
    """FLOP formulas for ``transformers``' grouped-matmul custom ops (idempotent; no-op without them)."""
    from torch.utils import flop_counter

    grouped = getattr(torch.ops.aten, "_grouped_mm", None)
    if grouped is not None and grouped not in flop_counter.flop_registry:
        @flop_counter.register_flop_formula(grouped)
        def _aten_grouped(a_shape, b_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
            # (S, K) x (G, K, N) -> (S, N), or batched (G, M, K) x (G, K, N); out_shape gives the rows
            return 2 * prod(out_shape) * a_shape[-1]

    ops = getattr(torch.ops, "transformers", None)
    try:
        fwd, bwd = ops.grouped_mm_fallback, ops.grouped_mm_fallback_backward
    except (AttributeError, RuntimeError):
        return
    if fwd in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(fwd)
    def _fwd(input_shape, weight_shape, offs_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
        return 2 * input_shape[0] * weight_shape[1] * weight_shape[2]

    @flop_counter.register_flop_formula(bwd)
    def _bwd(input_shape, weight_shape, offs_shape, grad_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
        return 4 * input_shape[0] * weight_shape[1] * weight_shape[2]


def build_decoder(family: str, *, batch_size: int, seq_len: int, vocab_size: int, d_model: int, n_layers: int,
                  n_heads: int, n_kv_heads: int, ffn_hidden: int, seed: int, n_experts: int = 0, top_k: int = 0,
                  experts: str = "grouped_mm") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model_name = f"{family}_hf"
    if family not in FAMILIES:
        raise GraphError(f"unknown decoder family '{family}'; valid families: {', '.join(FAMILIES)}")
    check_transformer(model_name, batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size, d_model=d_model,
                      n_layers=n_layers, n_heads=n_heads, dropout=0.0)
    check_positive(model_name, n_kv_heads=n_kv_heads, ffn_hidden=ffn_hidden)
    if n_heads % n_kv_heads:
        raise GraphError(f"zoo model '{model_name}': option n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
    mod_name, cfg_name, cls_name = FAMILIES[family]
    mod = importlib.import_module(mod_name)
    kwargs: dict[str, Any] = dict(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=ffn_hidden,
                                  num_hidden_layers=n_layers, num_attention_heads=n_heads,
                                  num_key_value_heads=n_kv_heads, max_position_embeddings=max(seq_len, 64),
                                  use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                  tie_word_embeddings=False)
    if family == "mixtral":
        check_positive(model_name, n_experts=n_experts, top_k=top_k)
        if top_k > n_experts:
            raise GraphError(f"zoo model '{model_name}': option top_k={top_k} must be <= n_experts={n_experts}")
        if experts not in EXPERTS:
            raise GraphError(f"zoo model '{model_name}': option experts='{experts}'; valid: {', '.join(EXPERTS)}")
        kwargs.update(num_local_experts=n_experts, num_experts_per_tok=top_k, router_aux_loss_coef=0.0)
    if family == "gemma":
        kwargs["head_dim"] = d_model // n_heads
    config = getattr(mod, cfg_name)(**kwargs)
    config._attn_implementation = "eager"
    if family == "mixtral":
        config._experts_implementation = experts
    with seeded(seed) as gen:
        lm = getattr(mod, cls_name)(config)
        register_moe_flops()  # after the model class has loaded transformers' MoE ops
        lm.loss_type = "ForCausalLM"
        model = CausalLMLoss(lm)
        ids = torch.randint(3, vocab_size, (batch_size, seq_len), generator=gen)
    return model, (ids, ids.clone())


def build_llama(**opts: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return build_decoder("llama", **opts)


def build_mixtral(**opts: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return build_decoder("mixtral", **opts)
