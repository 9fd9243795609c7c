"""Any Hugging Face ``transformers`` model from its config alone (``graph.source=hf``): no weights, no download.

    build(config="path/to/config.json", overrides={"num_hidden_layers": 4}, batch_size=1, seq_len=2048)
    build(model_type="qwen2", overrides={"hidden_size": 896, ...})

The config comes from a ``config.json`` (or a folder holding one, as ``save_pretrained`` writes it) or, when no
file is given, from a ``model_type`` with the library's defaults; ``overrides`` set config fields (each must be
one the config has).
The model is built on the **meta device** (``AutoModelFor<task>.from_config``): no parameter memory is allocated,
so a 70B-parameter config captures on a laptop, and ``capture`` runs its ops on meta tensors. The KV cache is off.
Attention: ``eager`` (default: explicit score / softmax / value ops, each priced by the cost model; the backward
keeps the seq x seq scores and probabilities, as eager PyTorch does) or ``sdpa`` (one
``scaled_dot_product_attention`` op per attention, its FLOPs counted by ``FlopCounterMode``; its saved
activations are set to what a fused kernel such as FlashAttention keeps for the backward: its inputs (query,
key, value, and the mask where the model passes one), output and one log-sum-exp per row
(``fused_attention_memory``), not the seq x seq matrix the CPU math kernel saves under capture; the fused kernel's time is priced as one GEMM-like op of its FLOPs, not measured).

The graph is captured in fp32, whatever dtype the config names (hub configs say ``bfloat16``): the project's
graphs count fp32 bytes and the topology's ``dtype`` (``+topology.dtype=bf16``) prices a bf16 run.

Tasks and the training step captured (the forward returns the loss):

* ``causal_lm``: ``input_ids`` [batch, seq_len], ``labels`` = the same ids (shifted inside the model);
* ``masked_lm``: ``input_ids`` and ``labels`` [batch, seq_len];
* ``seq2seq_lm``: ``input_ids`` and ``labels`` [batch, seq_len] (the decoder's inputs are the shifted labels);
* ``image_classification``: ``pixel_values`` [batch, channels, image_size, image_size], ``labels`` [batch].

``task: auto`` reads it from the config's ``architectures`` (``...ForCausalLM`` -> ``causal_lm`` ...), else from
what the config is (encoder-decoder -> ``seq2seq_lm``; an image size and no vocabulary ->
``image_classification``; a type with a masked-LM head (BERT, RoBERTa) -> ``masked_lm``; else ``causal_lm``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from placement_rl.errors import GraphError

TASKS = ("auto", "causal_lm", "masked_lm", "seq2seq_lm", "image_classification")
ATTENTION = ("eager", "sdpa")
_AUTO_CLASS = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
               "seq2seq_lm": "AutoModelForSeq2SeqLM", "image_classification": "AutoModelForImageClassification"}
_SUFFIX = (("ForCausalLM", "causal_lm"), ("LMHeadModel", "causal_lm"), ("ForMaskedLM", "masked_lm"),
           ("ForConditionalGeneration", "seq2seq_lm"), ("ForSeq2SeqLM", "seq2seq_lm"),
           ("ForImageClassification", "image_classification"))


class LossStep(nn.Module):
    """forward(inputs, labels) -> the wrapped model's loss (a training step's forward)."""

    def __init__(self, model: nn.Module, task: str) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.task == "image_classification":
            return self.model(pixel_values=inputs, labels=labels).loss
        if self.task == "masked_lm":
            return self.model(input_ids=inputs, labels=labels).loss
        return self.model(input_ids=inputs, labels=labels, use_cache=False).loss


def _transformers():
    try:
        import transformers
    except ImportError:
        raise GraphError("graph.source=hf needs the 'transformers' package: pip install 'placement-rl[hf]'") from None
    transformers.logging.set_verbosity_error()  # config sanity chatter (token ids outside a shrunk vocabulary)
    return transformers


def load_config(config: str | None, model_type: str | None, overrides: Mapping[str, Any] | None):
    """The ``PretrainedConfig`` from a config.json / folder or a model type, with ``overrides`` applied. The
    config is constructed with them (fields derived at construction, such as a head size from the hidden size,
    follow); each must be a field the config has."""
    tf = _transformers()
    data: dict[str, Any] = {}
    if config:
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise GraphError(f"graph.config={config}: no such config.json (give the file or the folder holding it)")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GraphError(f"graph.config={config}: not a JSON config ({exc.__class__.__name__})") from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise GraphError(f"graph.config={config}: a transformers config.json names its 'model_type'")
        kind = str(data.pop("model_type"))  # the file names its type: graph.model_type is not used
    elif model_type:
        kind = str(model_type)
    else:
        raise GraphError("graph.source=hf needs graph.config=<config.json> or graph.model_type=<type> (e.g. llama)")
    base = _for_model(tf, kind, data)
    overrides = dict(overrides or {})
    for key, value in overrides.items():
        if not hasattr(base, key):
            raise GraphError(f"graph.overrides.{key}: the '{kind}' config has no field '{key}'")
        was = getattr(base, key)
        if (isinstance(was, int) and not isinstance(was, bool) and was > 0 and isinstance(value, int)
                and not isinstance(value, bool) and value < 1):  # a count (layers, heads, width ...)
            raise GraphError(f"graph.overrides.{key}={value}: must be >= 1 (the '{kind}' default is {was})")
    if not overrides:
        return base
    fields = {**data, **overrides}
    old_layers, layers = getattr(base, "num_hidden_layers", None), overrides.get("num_hidden_layers")
    if isinstance(old_layers, int) and isinstance(layers, int):
        for key, value in data.items():  # per-layer lists (layer_types ...) follow a changed layer count
            if key not in overrides and isinstance(value, list) and len(value) == old_layers:
                fields[key] = (value * (layers // max(old_layers, 1) + 1))[:layers]
    return _for_model(tf, kind, fields)


def _reason(exc: BaseException, limit: int = 200) -> str:
    """One line of an exception: its last non-empty line (validation errors put the cause last)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:limit]


def _for_model(tf, kind: str, kwargs: dict):
    if kind not in tf.models.auto.configuration_auto.CONFIG_MAPPING:
        raise GraphError(f"graph.model_type={kind}: transformers {tf.__version__} knows no such model type "
                         "(e.g. llama, qwen2, mistral, gpt2, bert, t5, vit)")
    try:
        return tf.AutoConfig.for_model(kind, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- the config's own checks (e.g. heads dividing the width)
        raise GraphError(f"the '{kind}' config refuses these fields: {_reason(exc)}") from None


def infer_task(cfg) -> str:
    """The training task of a config (see the module doc)."""
    for arch in getattr(cfg, "architectures", None) or ():
        for suffix, task in _SUFFIX:
            if str(arch).endswith(suffix):
                return task
    if getattr(cfg, "is_encoder_decoder", False):
        return "seq2seq_lm"
    if getattr(cfg, "image_size", None) and not getattr(cfg, "vocab_size", None):
        return "image_classification"
    tf = _transformers()
    auto = tf.models.auto.modeling_auto
    if type(cfg) in auto.MODEL_FOR_MASKED_LM_MAPPING:  # BERT-like encoders also have a causal head: not their task
        return "masked_lm"
    return "causal_lm"


def fused_attention_memory(graph, head_dim: float):
    """``graph`` with each ``scaled_dot_product_attention`` node's saved activations set to a fused kernel's:
    its inputs (query, key, value, mask) and output, plus one fp32 log-sum-exp per query row and head
    (``out_bytes / head_dim`` of fp32 output)."""
    act = np.array(graph.act_bytes, dtype=np.float64)
    hit = [v for v in range(graph.num_nodes) if graph.op_types[v].split(".")[-1].startswith("scaled_dot_product")]
    if not hit:
        return graph
    inputs = np.bincount(graph.edges[:, 1], weights=graph.edge_bytes, minlength=graph.num_nodes)
    act[hit] = inputs[hit] + graph.out_bytes[hit] * (1.0 + 1.0 / max(head_dim, 1.0))
    return graph.replace(act_bytes=act)


def build(*, config: str | None = None, model_type: str | None = None, task: str = "auto",
          overrides: Mapping[str, Any] | None = None, batch_size: int = 8, seq_len: int = 512,
          seed: int = 0, attention: str = "eager") -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]:
    """``(module, example inputs, description)``: the model on the meta device wrapped as a loss step, and what
    was built (model type, task, class, parameter count, config fields that size it)."""
    if task not in TASKS:
        raise GraphError(f"graph.task={task}: choose one of {', '.join(TASKS)}")
    if attention not in ATTENTION:
        raise GraphError(f"graph.attention={attention}: choose one of {', '.join(ATTENTION)}")
    for key, val in (("batch_size", batch_size), ("seq_len", seq_len)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise GraphError(f"graph.{key}={val!r} must be an integer >= 1")
    tf = _transformers()
    cfg = load_config(config, model_type, overrides)
    task = infer_task(cfg) if task == "auto" else task
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if task != "image_classification" and isinstance(limit, int) and seq_len > limit:
        raise GraphError(f"graph.seq_len={seq_len} is longer than the config's {limit} positions "
                         "(max_position_embeddings): lower it or raise that field in graph.overrides")
    cfg.use_cache = False
    for key in ("torch_dtype", "dtype"):  # hub configs say bfloat16: graphs are fp32 (the topology sets the dtype)
        if getattr(cfg, key, None) is not None:
            setattr(cfg, key, torch.float32)
    if task == "seq2seq_lm" and getattr(cfg, "decoder_start_token_id", None) is None:
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0  # T5's default config leaves it out
    auto = getattr(tf, _AUTO_CLASS[task])
    try:
        with torch.device("meta"):
            try:
                model = auto.from_config(cfg, attn_implementation=attention, dtype=torch.float32)
            except TypeError:  # transformers < 4.56 names it torch_dtype
                model = auto.from_config(cfg, attn_implementation=attention, torch_dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 -- no head for the task, or a field the model's code refuses
        if isinstance(exc, ValueError) and "Unrecognized configuration class" in str(exc):
            raise GraphError(f"graph.task={task}: a '{cfg.model_type}' config has no {_AUTO_CLASS[task]} model; "
                             "set graph.task") from None
        raise GraphError(f"the '{cfg.model_type}' model cannot be built from this config: "
                         f"{type(exc).__name__}: {_reason(exc, 160)}") from None
    model.train()
    from placement_rl.graph.models.hf_decoders import register_moe_flops

    register_moe_flops()  # FLOP formulas for transformers' grouped-matmul expert ops (after the model class loaded)
    gen = torch.Generator().manual_seed(seed)
    if task == "image_classification":
        size = getattr(cfg, "image_size", None)
        size = size[0] if isinstance(size, (list, tuple)) else size
        if not isinstance(size, int):
            raise GraphError(f"the '{cfg.model_type}' config has no integer image_size: set graph.overrides.image_size")
        chans = int(getattr(cfg, "num_channels", 3) or 3)
        inputs = torch.randn(batch_size, chans, size, size, generator=gen)
        labels = torch.randint(0, max(int(getattr(cfg, "num_labels", 2)), 1), (batch_size,), generator=gen)
    else:
        vocab = int(getattr(cfg, "vocab_size", 0) or 0)
        if vocab < 2:
            raise GraphError(f"the '{cfg.model_type}' config has no vocab_size: set graph.overrides.vocab_size")
        inputs = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)
        labels = inputs.clone()
    inputs, labels = inputs.to("meta"), labels.to("meta")  # beside the meta weights (capture runs on meta tensors)
    params = sum(p.numel() for p in model.parameters())
    keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "num_local_experts", "num_experts")
    sizing = {k: getattr(cfg, k) for k in keys if isinstance(getattr(cfg, k, None), int)}
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None) or 0
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None) or 0
    head_dim = getattr(cfg, "head_dim", None) or (hidden / heads if heads else 64.0)
    desc = {"model_type": cfg.model_type, "task": task, "class": type(model).__name__, "params": int(params),
            "batch_size": batch_size, "seq_len": seq_len, "attention": attention, "head_dim": float(head_dim),
            "config": sizing}
    return LossStep(model, task), (inputs, labels), desc
