"""Built-in models: ``names()``, ``describe(name)`` (defaults), ``tiny(name)`` (overrides for tests),
``build(name, **overrides) -> (module, example_inputs)``.

Every model's ``forward`` takes the example inputs *including targets* and returns the scalar
training loss, so a captured graph is one whole training step's forward (model + loss).
Inputs and parameter init depend only on the ``seed`` option (the global RNG is left alone).

==========  ==========================================================================
name        model
==========  ==========================================================================
mlp         Linear+ReLU stack, cross-entropy
resnet18    ResNet-18 (BasicBlock, BatchNorm), 224x224 images, 1000 classes
resnet50    ResNet-50 (Bottleneck, BatchNorm)
inception   GoogLeNet-style Inception v1 with BatchNorm (9 modules by default)
nmt         GNMT-lite: unrolled LSTM encoder (bidirectional first layer) / decoder, attention
gpt         GPT-style decoder, explicit causal attention, tied LM head
moe         GPT-style decoder with top-k mixture-of-experts FFNs (static capacity routing)
gpt2_hf     transformers ``GPT2LMHeadModel`` from a ``GPT2Config`` (needs transformers)
bert_hf     transformers ``BertForMaskedLM`` from a ``BertConfig`` (needs transformers)
opt_hf      transformers ``OPTForCausalLM`` from an ``OPTConfig`` (needs transformers)
llama_hf    transformers ``LlamaForCausalLM`` (GQA, RoPE, SwiGLU, RMSNorm) from a small config
mixtral_hf  transformers ``MixtralForCausalLM`` (top-k routed experts) from a small config
==========  ==========================================================================
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.models import gpt, hf, hf_decoders, inception, mlp, moe, nmt, resnet

Builder = Callable[..., tuple[nn.Module, tuple[torch.Tensor, ...]]]


@dataclass(frozen=True)
class ZooEntry:
    """A zoo model: its builder (keyword-only options), the default of every option, and
    ``tiny`` overrides that make it build, train and capture in well under a second (tests)."""

    build: Builder
    defaults: Mapping[str, Any]
    tiny: Mapping[str, Any]


_LM_TINY = dict(batch_size=2, seq_len=16, vocab_size=97, d_model=32, n_layers=2, n_heads=4)
_CNN_TINY = dict(batch_size=2, image_size=32, num_classes=10)
_CORE: dict[str, ZooEntry] = {
    "mlp": ZooEntry(mlp.build, mlp.DEFAULTS, dict(batch_size=8, in_features=32, hidden=64, layers=2)),
    "resnet18": ZooEntry(functools.partial(resnet.build, "resnet18"), resnet.DEFAULTS, dict(_CNN_TINY, width=8)),
    "resnet50": ZooEntry(functools.partial(resnet.build, "resnet50"), resnet.DEFAULTS, dict(_CNN_TINY, width=8)),
    "inception": ZooEntry(inception.build, inception.DEFAULTS, dict(_CNN_TINY, num_modules=3)),
    "nmt": ZooEntry(nmt.build, nmt.DEFAULTS, dict(batch_size=2, src_len=5, tgt_len=4, vocab_size=97, hidden=32,
                                                  enc_layers=2, dec_layers=2)),
    "gpt": ZooEntry(gpt.build, gpt.DEFAULTS, _LM_TINY),
    "moe": ZooEntry(moe.build, moe.DEFAULTS, dict(_LM_TINY, n_experts=4, top_k=2)),
}
_HF: dict[str, ZooEntry] = {
    "gpt2_hf": ZooEntry(hf.build_gpt2, hf.GPT2_DEFAULTS, _LM_TINY),
    "bert_hf": ZooEntry(hf.build_bert, hf.BERT_DEFAULTS, _LM_TINY),
    "opt_hf": ZooEntry(hf.build_opt, hf.OPT_DEFAULTS, _LM_TINY),
    "llama_hf": ZooEntry(hf_decoders.build_llama, hf_decoders.LLAMA_DEFAULTS,
                         dict(_LM_TINY, n_kv_heads=2, ffn_hidden=64)),
    "mixtral_hf": ZooEntry(hf_decoders.build_mixtral, hf_decoders.MIXTRAL_DEFAULTS,
                           dict(_LM_TINY, n_kv_heads=2, ffn_hidden=64, n_experts=4, top_k=2)),
}


def _hf_entries() -> dict[str, ZooEntry]:
    """The transformers-based models, or none when ``transformers`` is not installed.

    Checked with ``importlib.util.find_spec`` (importing transformers takes seconds); the
    package itself is imported when one of these models is built.
    """
    return _HF if importlib.util.find_spec("transformers") is not None else {}


def _entries() -> dict[str, ZooEntry]:
    return {**_CORE, **_hf_entries()}


def names() -> list[str]:
    """Names of the available models (HF models only when ``transformers`` imports)."""
    return list(_entries())


def _entry(name: str) -> ZooEntry:
    entries = _entries()
    if name not in entries:
        hint = " (the *_hf models need the 'transformers' package: the 'hf' extra)" if name.endswith("_hf") else ""
        raise GraphError(f"unknown zoo model '{name}'{hint}; valid names: {', '.join(entries)}")
    return entries[name]


def describe(name: str) -> dict[str, Any]:
    """The default of every option of model ``name`` (the keys ``build`` accepts as overrides)."""
    return dict(_entry(name).defaults)


def tiny(name: str) -> dict[str, Any]:
    """Overrides that make model ``name`` tiny (a training step in milliseconds), for tests and smoke runs."""
    return dict(_entry(name).tiny)


def _check_value(name: str, key: str, value: Any, default: Any) -> Any:
    ok = (isinstance(value, bool) if isinstance(default, bool)
          else isinstance(value, int) and not isinstance(value, bool) if isinstance(default, int)
          else isinstance(value, (int, float)) and not isinstance(value, bool) if isinstance(default, float)
          else isinstance(value, type(default)))
    if not ok:
        raise GraphError(f"zoo model '{name}': option {key}={value!r} must be of type {type(default).__name__}")
    if key == "seed" and value < 0:  # as graph.seed (a generator's seed is a count)
        raise GraphError(f"zoo model '{name}': option seed={value!r} must be an integer >= 0")
    return float(value) if isinstance(default, float) else value


def resolve_options(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults of ``name`` updated with ``overrides`` (unknown keys or wrong types: ``GraphError``)."""
    entry = _entry(name)
    unknown = sorted(set(overrides) - set(entry.defaults))
    if unknown:
        raise GraphError(f"zoo model '{name}' has no option '{unknown[0]}'; "
                         f"valid options: {', '.join(entry.defaults)}")
    opts = dict(entry.defaults)
    opts.update({k: _check_value(name, k, v, entry.defaults[k]) for k, v in overrides.items()})
    return opts


def build(name: str, **overrides: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build model ``name`` (training mode) and its example inputs (targets included).

    ``module(*inputs)`` returns the scalar training loss. Unknown names or options raise ``GraphError``.
    """
    opts = resolve_options(name, overrides)
    try:
        module, inputs = _entry(name).build(**opts)
    except ImportError as exc:
        raise GraphError(f"zoo model '{name}' cannot be built: {exc}; install the 'hf' extra") from None
    return module.train(), tuple(inputs)
