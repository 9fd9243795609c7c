"""What a graph's metadata says of its model (``model_settings``): a zoo model's options, the sizes of the Hugging
Face config a ``graph=hf`` capture was built from. Both trainers' exports (``_export_megatron``,
``_export_torchtitan``) write their model settings from it, and name in a ``# note:`` what it does not record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placement_rl.graph.ir import CompGraph


@dataclass(frozen=True)
class ModelSettings:
    """What a graph's metadata says of its model; None where it does not record a value.

    ``model_type``: ``gpt``, ``moe`` (the zoo's), or the Hugging Face model type (``llama``, ``mistral`` ...); None
    when the metadata names no model. ``task``: the Hugging Face task (``causal_lm`` for the zoo's decoders).
    ``kv_channels``: the head size where it is not ``hidden / heads`` (Gemma). ``positions``: the position table's
    rows (``max_position_embeddings``). ``capacity``: the experts' capacity factor (tokens over it are dropped); ``aux_coef``: the weight of the
    router's load-balancing loss."""

    model_type: str | None = None
    task: str | None = None
    label: str = ""
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    kv_channels: int | None = None
    ffn: int | None = None
    seq_len: int | None = None
    positions: int | None = None
    vocab: int | None = None
    dropout: float | None = None
    experts: int | None = None
    top_k: int | None = None
    capacity: float | None = None
    aux_coef: float | None = None


# zoo model -> (model type, task, least position-table rows: the table has max(seq_len, this))
_ZOO = {"gpt": ("gpt", "causal_lm", 0), "moe": ("moe", "causal_lm", 0), "gpt2_hf": ("gpt2", "causal_lm", 0),
        "opt_hf": ("opt", "causal_lm", 64), "llama_hf": ("llama", "causal_lm", 64),
        "mixtral_hf": ("mixtral", "causal_lm", 64), "bert_hf": ("bert", "masked_lm", 512)}


def _zoo_settings(name: str, opts: dict[str, Any]) -> ModelSettings:
    """A zoo language model's settings: its options, and what its builder fixes (a 4 x d_model FFN unless
    ``ffn_hidden``; no dropout in the Llama-family models, which have no ``dropout`` option)."""
    model_type, task, least = _ZOO[name]
    d, seq = int(opts["d_model"]), int(opts["seq_len"])
    return ModelSettings(model_type=model_type, task=task, label=f"zoo model '{name}'", hidden=d,
                         heads=int(opts["n_heads"]), kv_heads=int(opts.get("n_kv_heads") or opts["n_heads"]),
                         ffn=int(opts.get("ffn_hidden") or 4 * d), seq_len=seq, positions=max(seq, least),
                         vocab=int(opts["vocab_size"]), dropout=float(opts.get("dropout", 0.0)),
                         experts=opts.get("n_experts"), top_k=opts.get("top_k"),
                         capacity=opts.get("capacity_factor"), aux_coef=opts.get("aux_coef"))


def _hf_settings(hf: dict[str, Any]) -> ModelSettings:
    """A ``graph=hf`` capture's settings: the sizes its description keeps of the config (no position table, dropout
    or router top-k: those stay None)."""
    cfg = hf.get("config") or {}
    hidden, heads, head_dim = cfg.get("hidden_size"), cfg.get("num_attention_heads"), hf.get("head_dim")
    odd_head = bool(hidden and heads and head_dim and float(head_dim) != hidden / heads)
    return ModelSettings(model_type=hf.get("model_type"), task=hf.get("task"),
                         label=str(hf.get("class") or hf.get("model_type")), hidden=hidden, heads=heads,
                         kv_heads=cfg.get("num_key_value_heads") or heads,
                         kv_channels=int(head_dim) if odd_head else None, ffn=cfg.get("intermediate_size"),
                         seq_len=hf.get("seq_len"), vocab=cfg.get("vocab_size"),
                         experts=cfg.get("num_local_experts") or cfg.get("num_experts"))


def model_settings(graph: CompGraph) -> ModelSettings:
    """What ``graph``'s metadata says of its model: the Hugging Face description of a ``graph=hf`` capture (or one
    a test set), else a zoo language model's options; an empty ``ModelSettings`` for any other graph."""
    meta = graph.meta
    if meta.get("hf"):
        return _hf_settings(meta["hf"])
    if meta.get("zoo") in _ZOO and meta.get("zoo_options"):
        return _zoo_settings(meta["zoo"], meta["zoo_options"])
    return ModelSettings()
