"""Any Hugging Face ``transformers`` model from its config alone (``graph.source=hf``): no weights, no download.

    build(config="path/to/config.json", overrides={"num_hidden_layers": 4}, batch_size=1, seq_len=2048)
    build(model_type="qwen2", overrides={"hidden_size": 896, ...})

The config is read by ``hf_config.load_config`` (a config.json or a model type, ``overrides`` applied; see that
module). LayerDrop is off (a captured step runs every layer).
The model is built on the **meta device** (``AutoModelFor<task>.from_config``): no parameter memory is allocated,
so a 70B-parameter config captures on a laptop, and ``capture`` runs its ops on meta tensors. The KV cache is off.
Attention: ``eager`` (default: explicit score / softmax / value ops, each priced by the cost model; the backward
keeps the seq x seq scores and probabilities, as eager PyTorch does) or ``sdpa`` (one
``scaled_dot_product_attention`` op per attention, its FLOPs counted by ``FlopCounterMode``; its saved
activations are set to what a fused kernel such as FlashAttention keeps for the backward: its inputs (query,
key, value, and the mask where the model passes one), output and one log-sum-exp per row
(``fused_attention_memory``), not the seq x seq matrix the CPU math kernel saves under capture; the fused kernel's
time is priced as one GEMM-like op of its FLOPs, not measured).

The graph is captured in fp32, whatever dtype the config names (hub configs say ``bfloat16``): its bytes are fp32
(the weights of mixed-precision training) and the topology's ``dtype`` (``+topology.dtype=bf16``) prices a bf16 run
(a module captured in bf16 by hand records ``meta["dtype"]`` instead: docs/graph_file.md, Precision).

Tasks and the training step captured (the forward returns the loss):

* ``causal_lm``: ``input_ids`` [batch, seq_len], ``labels`` = the same ids (shifted inside the model);
* ``masked_lm``: ``input_ids`` and ``labels`` [batch, seq_len];
* ``seq2seq_lm``: ``input_ids`` and ``labels`` [batch, seq_len] (the decoder's inputs are the shifted labels);
  for Whisper (``WhisperForConditionalGeneration``) the encoder reads audio: ``input_features`` [batch,
  num_mel_bins, 2 x max_source_positions] (3000 frames, 30 s, for the hub configs; the encoder accepts no other
  length: lower ``max_source_positions`` in ``overrides`` for a smaller graph), recorded as ``audio_features``;
* ``image_classification``: ``pixel_values`` [batch, channels, image_size, image_size] (224 where the config
  names no image size, as convolutional nets), ``labels`` [batch].

Multimodal models with a language-model head (gemma3, llama4 ... ``ForConditionalGeneration``) are captured on text
alone: the vocabulary is the ``text_config``'s and the vision / audio towers' parameters are left unused.

``task: auto`` is one the model type has a class for in transformers' auto mappings: the one whose class the
config's ``architectures`` names, else read from its suffix (``...ForCausalLM`` -> ``causal_lm`` ...) or from
what the config is (encoder-decoder -> ``seq2seq_lm``; an image size and no vocabulary ->
``image_classification``; a type with a masked-LM head (BERT, RoBERTa) -> ``masked_lm``; else ``causal_lm``); when
that guess has no class, the first task (in ``TASKS`` order) that has one. A type with none of the four heads
(audio, detection, segmentation ... models) is refused with one line. Whisper: ``seq2seq_lm``, the whole
encoder-decoder (``WhisperForConditionalGeneration``) on audio features, unless the config names its decoder alone
(``WhisperForCausalLM``) or ``graph.task=causal_lm`` asks for it; an encoder-decoder config captured as its
decoder's causal LM without its config naming that class gets a one-line warning saying so.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.models.hf_config import (attention_sizes, check_sizes, get_field, has_field, is_config,
                                                 kv_heads, load_config, positive_int, reason, text_config,
                                                 transformers_module)

TASKS = ("auto", "causal_lm", "masked_lm", "seq2seq_lm", "image_classification")
ATTENTION = ("eager", "sdpa")
_AUTO_CLASS = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
               "seq2seq_lm": "AutoModelForSeq2SeqLM", "image_classification": "AutoModelForImageClassification"}
_SUFFIX = (("ForCausalLM", "causal_lm"), ("LMHeadModel", "causal_lm"), ("ForMaskedLM", "masked_lm"),
           ("ForConditionalGeneration", "seq2seq_lm"), ("ForSeq2SeqLM", "seq2seq_lm"),
           ("ForImageClassification", "image_classification"))
_MAPPING_NAMES = {"causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "masked_lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
                  "seq2seq_lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
                  "image_classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"}
# the parameter paths of a multimodal model's non-text towers (gemma3's vision_tower, qwen2_audio's audio_tower ...)
_TOWER = re.compile(r"(^|\.)(vision_tower|vision_model|visual|audio_tower|audio_model|audio_encoder|"
                    r"multi_modal_projector|mm_projector)(\.|$)")
_DEFAULT_IMAGE_SIZE = 224  # configs of convolutional nets (ResNet, RegNet ...) name no input resolution
_SPEECH_TYPES = ("whisper",)  # speech encoder-decoders whose audio input the builder makes (``_audio_features``)


class LossStep(nn.Module):
    """forward(inputs, labels) -> the wrapped model's loss (a training step's forward); ``inputs`` are the token ids,
    or the audio features of a speech encoder-decoder (``audio=True``: Whisper's ``input_features``)."""

    def __init__(self, model: nn.Module, task: str, audio: bool = False) -> None:
        super().__init__()
        self.model = model
        self.task = task
        self.audio = audio

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.task == "image_classification":
            return self.model(pixel_values=inputs, labels=labels).loss
        if self.task == "masked_lm":
            return self.model(input_ids=inputs, labels=labels).loss
        if self.audio:
            return self.model(input_features=inputs, labels=labels, use_cache=False).loss
        return self.model(input_ids=inputs, labels=labels, use_cache=False).loss


def task_classes(cfg) -> dict[str, tuple[str, ...]]:
    """The tasks the config's model type has a class for in transformers' auto mappings, with the class names
    (in ``TASKS`` order)."""
    auto = transformers_module().models.auto.modeling_auto
    out: dict[str, tuple[str, ...]] = {}
    for task, attr in _MAPPING_NAMES.items():
        names = getattr(auto, attr, {}).get(getattr(cfg, "model_type", None))
        if names:
            out[task] = tuple(names) if isinstance(names, (list, tuple)) else (str(names),)
    return out


def speech_class(cfg) -> str | None:
    """The speech-to-text encoder-decoder class (``AutoModelForSpeechSeq2Seq``) of a config whose audio input the
    builder makes (``_SPEECH_TYPES``: Whisper's ``WhisperForConditionalGeneration``), else None."""
    kind = getattr(cfg, "model_type", None)
    if kind not in _SPEECH_TYPES:
        return None
    names = getattr(transformers_module().models.auto.modeling_auto, "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", {})
    name = names.get(kind)
    return str(name) if name else None


def infer_task(cfg) -> str:
    """The training task of a config (see the module doc)."""
    has = task_classes(cfg)
    archs = [str(a) for a in (get_field(cfg, "architectures") or ())]
    for arch in archs:  # the class the config names
        for task, names in has.items():
            if arch in names:
                return task
        if arch == speech_class(cfg):  # a hub Whisper config names the encoder-decoder
            return "seq2seq_lm"
    guess = _guess_task(cfg, archs)
    if guess == "seq2seq_lm" and speech_class(cfg) is not None:  # a bare Whisper config: the whole model
        return guess
    if not has or guess in has:
        return guess
    return next(iter(has))  # the guess has no class for this type (an image model with a vocabulary: BEiT ...)


def _guess_task(cfg, archs: list[str]) -> str:
    for arch in archs:
        for suffix, task in _SUFFIX:
            if arch.endswith(suffix):
                return task
    if get_field(cfg, "is_encoder_decoder"):
        return "seq2seq_lm"
    if get_field(cfg, "image_size") and not get_field(cfg, "vocab_size"):
        return "image_classification"
    tf = transformers_module()
    auto = tf.models.auto.modeling_auto
    if type(cfg) in auto.MODEL_FOR_MASKED_LM_MAPPING:  # BERT-like encoders also have a causal head: not their task
        return "masked_lm"
    return "causal_lm"


def _registered(auto, cfg) -> bool:
    """Whether ``auto`` (an ``AutoModelFor...`` class) knows the config's class (as one registered at run time)."""
    try:
        return type(cfg) in auto._model_mapping
    except Exception:  # noqa: BLE001
        return False


def _no_layerdrop(cfg) -> None:
    """LayerDrop off (``layerdrop``, ``encoder_layerdrop`` ...) on the config and its sub-configs: a training step
    skips each layer at random (a data-dependent branch torch.export cannot trace); the graph has them all."""
    for obj in [cfg] + [v for v in vars(cfg).values() if is_config(v)]:
        for key, value in list(vars(obj).items()):
            if key.endswith("layerdrop") and isinstance(value, (int, float)) and value:
                setattr(obj, key, 0.0)


def _params_to_meta(model: nn.Module) -> None:
    """Parameters made off the meta device (XLNet's legacy ``torch.FloatTensor(...)`` constructors ignore the
    device context) moved to it: meta inputs and a CPU weight cannot meet in one op. Buffers stay where they are."""
    moved: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, par in list(mod._parameters.items()):
            if par is not None and not par.is_meta:
                if id(par) not in moved:
                    moved[id(par)] = nn.Parameter(par.detach().to("meta"), requires_grad=par.requires_grad)
                mod._parameters[name] = moved[id(par)]


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
    tf = transformers_module()
    cfg = load_config(config, model_type, overrides)
    task = infer_task(cfg) if task == "auto" else task
    has = task_classes(cfg)
    audio = task == "seq2seq_lm" and task not in has and speech_class(cfg) is not None
    auto = getattr(tf, "AutoModelForSpeechSeq2Seq" if audio else _AUTO_CLASS[task])
    if task not in has and not audio and not _registered(auto, cfg):
        if has:
            raise GraphError(f"graph.task={task}: a '{cfg.model_type}' config has no {_AUTO_CLASS[task]} model "
                             f"(it has: {', '.join(has)}); set graph.task")
        raise GraphError(f"the '{cfg.model_type}' model type has no causal-LM, masked-LM, seq2seq-LM or "
                         f"image-classification class in transformers {tf.__version__}: graph=hf captures those "
                         "training steps (not audio, detection, segmentation ... heads)")
    text = cfg if task == "image_classification" else text_config(cfg)  # a composite config's language model
    check_sizes(text, cfg.model_type, None if task == "image_classification" else seq_len)
    cfg.use_cache = False
    for key in ("torch_dtype", "dtype"):  # hub configs say bfloat16: graphs are fp32 (the topology sets the dtype)
        if getattr(cfg, key, None) is not None:
            setattr(cfg, key, torch.float32)
    if task == "seq2seq_lm" and getattr(cfg, "decoder_start_token_id", None) is None:
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0  # T5's default config leaves it out
    _no_layerdrop(cfg)
    if getattr(cfg, "architectures", None) is None:  # auto classes with several candidates (DeiT) iterate it
        cfg.architectures = []
    decoder_only = task == "causal_lm" and bool(get_field(cfg, "is_encoder_decoder"))  # WhisperForCausalLM clears it
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
                         f"{type(exc).__name__}: {reason(exc, 160)}") from None
    _params_to_meta(model)
    model.train()
    from placement_rl.graph.models.hf_decoders import register_moe_flops

    register_moe_flops()  # FLOP formulas for transformers' grouped-matmul expert ops (after the model class loaded)
    gen = torch.Generator().manual_seed(seed)
    if task == "image_classification":
        vision = get_field(cfg, "vision_config") if is_config(get_field(cfg, "vision_config")) else cfg  # CLIP, SigLIP
        named = has_field(cfg, "image_size") or has_field(vision, "image_size")
        size = (get_field(cfg, "image_size") or get_field(vision, "image_size")
                or (None if named else _DEFAULT_IMAGE_SIZE))
        size = size[0] if isinstance(size, (list, tuple)) and size else size
        if not isinstance(size, int):
            raise GraphError(f"the '{cfg.model_type}' config has no integer image_size: set graph.overrides.image_size")
        chans = int(get_field(cfg, "num_channels") or get_field(vision, "num_channels") or 3)
        inputs = torch.randn(batch_size, chans, size, size, generator=gen)
        labels = torch.randint(0, max(int(getattr(cfg, "num_labels", 2)), 1), (batch_size,), generator=gen)
    else:
        vocab = get_field(text, "vocab_size")
        vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else 0
        if vocab < 2:
            raise GraphError(f"the '{cfg.model_type}' config has no vocab_size: set graph.overrides.vocab_size")
        labels = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)
        inputs = torch.randn(batch_size, *_audio_features(model), generator=gen) if audio else labels.clone()
    inputs, labels = inputs.to("meta"), labels.to("meta")  # beside the meta weights (capture runs on meta tensors)
    params = sum(p.numel() for p in model.parameters())
    keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "num_local_experts", "num_experts")
    sized = text if task != "image_classification" else vision
    sizing = {k: get_field(sized, k) for k in keys if positive_int(get_field(sized, k))}
    if kv_heads(sized):  # Falcon names them otherwise (num_kv_heads, multi_query): TP checks read this key
        sizing["num_key_value_heads"] = kv_heads(sized)
    heads, hidden = attention_sizes(sized)
    head_dim = positive_int(get_field(sized, "head_dim")) or (hidden / heads if heads and hidden else 64.0)
    desc = {"model_type": cfg.model_type, "task": task, "class": type(model).__name__, "params": int(params),
            "batch_size": batch_size, "seq_len": seq_len, "attention": attention, "head_dim": float(head_dim),
            "config": sizing}
    if task == "image_classification":
        desc["image_size"] = int(size)
    if audio:
        desc["audio_features"] = list(inputs.shape[1:])  # (mel bins, frames) beside the seq_len target tokens
    if decoder_only and type(model).__name__ not in cfg.architectures:  # not a decoder the config names
        _warn_decoder_only(cfg, type(model).__name__)
    if task != "image_classification":  # a multimodal model captured on text: its towers take no part in the step
        towers = sum(p.numel() for n, p in model.named_parameters() if _TOWER.search(n))
        if towers:
            desc["unused_params"] = int(towers)
            logging.getLogger(__name__).warning(
                "%s is captured on text input: the %.1f M parameters of its vision / audio towers take no part in the "
                "step and are not in the graph (not placed, not in memory or gradient traffic)", type(model).__name__,
                towers / 1e6)
    return LossStep(model, task, audio=audio), (inputs, labels), desc


def _audio_features(model: nn.Module) -> tuple[int, int]:
    """``(mel bins, frames)`` of a Whisper-style encoder's input: it refuses any length but ``max_source_positions``
    x its two convolutions' strides (3000 frames, 30 s of audio, for the hub configs)."""
    enc = model.get_encoder()
    frames = int(model.config.max_source_positions) * int(enc.conv1.stride[0]) * int(enc.conv2.stride[0])
    return int(model.config.num_mel_bins), frames


def _warn_decoder_only(cfg, cls: str) -> None:
    """One line where an encoder-decoder config is captured as its decoder's causal LM (Whisper by model type)."""
    whole = speech_class(cfg)
    how = (f"graph.task=seq2seq_lm captures the whole encoder-decoder ({whole}) on audio features" if whole else
           "graph=hf cannot capture its whole model")
    logging.getLogger(__name__).warning("%s is the decoder of the '%s' encoder-decoder alone (no encoder in the "
                                        "graph): %s", cls, cfg.model_type, how)
