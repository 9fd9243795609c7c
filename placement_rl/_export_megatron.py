"""Megatron-LM's ``pretrain_gpt.py`` arguments for a ``StagePlan`` (``to_megatron``: degrees, the uneven
``--pipeline-model-parallel-layout``, batch split, recomputation, the model's sizes and architecture) and back
(``from_megatron``); see ``placement_rl.export``'s module doc.

The model's flags come from ``_export_model.model_settings(graph)``; what it does not record is named in a
``# note:`` rather than guessed.
"""

from __future__ import annotations

import re
from typing import Any

from placement_rl._export_header import _header
from placement_rl._export_layout import layout
from placement_rl._export_model import ModelSettings, model_settings
from placement_rl._export_read import _plan
from placement_rl.errors import PlanError
from placement_rl.export_modules import module_graph
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.layers import Modules, modules
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology


def _rotary(key: str) -> bool:
    """A rotary position embedding (``model.rotary_emb``): no weights, and Megatron-LM computes it in every stage,
    so it is neither the embedding ``E`` nor a layer."""
    return "rotary" in key.rsplit(".", 1)[-1]


def _megatron_stage(ms: tuple[str, ...], mods: Modules, first: bool, last: bool, k: int) -> str:
    layers = [m for m in ms if m in mods.layer]
    first_layer = min(mods.order.index(m) for m in mods.layer)
    rest = [m for m in ms if m not in mods.layer and not _rotary(m)]
    pre = [m for m in rest if mods.order.index(m) < first_layer]
    post = [m for m in rest if m not in pre]
    if pre and not first:
        raise PlanError(f"stage {k} holds {pre[0]} (part of the embedding, before the layers): Megatron-LM keeps the "
                        "whole embedding in the first stage; move the cut after it")
    if post and not last:
        raise PlanError(f"stage {k} holds {post[0]} (after the layers): Megatron-LM keeps the final norm, output layer "
                        "and loss together in the last stage")
    if not (pre or layers or post):
        raise PlanError(f"stage {k} holds only {ms[0]} (a rotary embedding, which Megatron-LM computes in every "
                        "stage): move the cut so that the stage holds a layer")
    out = "E" if pre else ""
    n = len(layers)
    out += "t" * n if n <= 1 else f"t*{n}"
    return out + ("L" if post else "")


def untied_embeddings(graph: CompGraph) -> bool:
    """Whether the output layer has weights of its own (not the input embedding's): the model config's
    ``tie_word_embeddings`` where the graph records it, else the captured graph (a shared weight counts once, at
    the embedding, so a tied output layer holds at most its bias; a coarsened graph's members)."""
    graph = module_graph(graph)
    cfg = (graph.meta.get("hf") or {}).get("config") or {}
    if isinstance(cfg.get("tie_word_embeddings"), bool):
        return not cfg["tie_word_embeddings"]
    emb = [v for v, op in enumerate(graph.op_types) if op == "embedding"]
    head = [v for v, op in enumerate(graph.op_types) if op == "linear"]
    return bool(emb and head) and float(graph.param_bytes[head[-1]]) >= float(graph.param_bytes[emb[0]]) > 0


_LLAMA_FLAGS: tuple[tuple[str, Any], ...] = (("--normalization", "RMSNorm"), ("--swiglu", None),
                                             ("--position-embedding-type", "rope"), ("--disable-bias-linear", None))
# model type -> Megatron-LM's architecture flags; GPT's and GPT-2's are Megatron-LM's defaults (LayerNorm, GELU,
# learned absolute positions, biases in every linear layer)
_ARCH = {"gpt": (), "moe": (), "gpt2": (), "llama": _LLAMA_FLAGS, "mistral": _LLAMA_FLAGS, "mixtral": _LLAMA_FLAGS}


def _model_flags(ms: ModelSettings) -> tuple[list[tuple[str, Any]], list[str]]:
    """Megatron-LM's model flags for ``ms`` (value None: a switch) and the flags whose values it lacks."""
    sizes = [("--hidden-size", ms.hidden), ("--ffn-hidden-size", ms.ffn), ("--num-attention-heads", ms.heads),
             ("--seq-length", ms.seq_len), ("--max-position-embeddings", ms.positions)]
    flags = [(k, v) for k, v in sizes if v is not None]
    missing = [k for k, v in sizes if v is None]
    if ms.kv_channels:
        flags.append(("--kv-channels", ms.kv_channels))
    if ms.kv_heads and ms.heads and ms.kv_heads < ms.heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", ms.kv_heads)]
    flags += list(_ARCH.get(ms.model_type or "", ()))
    if ms.dropout is None:
        missing += ["--attention-dropout", "--hidden-dropout"]
    else:
        flags += [("--attention-dropout", f"{ms.dropout:g}"), ("--hidden-dropout", f"{ms.dropout:g}")]
    if ms.experts:
        flags.append(("--num-experts", ms.experts))
        flags += [("--moe-router-topk", ms.top_k)] if ms.top_k else []
        missing += [] if ms.top_k else ["--moe-router-topk"]
        if ms.aux_coef is not None:  # Megatron-LM's default is 0: no load-balancing loss
            flags.append(("--moe-aux-loss-coeff", f"{ms.aux_coef:g}"))
        if ms.capacity:  # Megatron-LM drops tokens over capacity with the alltoall dispatcher only
            flags += [("--moe-token-dispatcher-type", "alltoall"), ("--moe-expert-capacity-factor", f"{ms.capacity:g}")]
    return flags, missing


def _model_notes(graph: CompGraph, ms: ModelSettings, missing: list[str]) -> list[str]:
    """Notes on what the model flags leave to the user: values the metadata does not record, an architecture
    without flags here, Mistral's sliding window."""
    if ms.model_type is None:
        return [f"# note: graph '{graph.name}' records no model settings: add --hidden-size, --ffn-hidden-size, "
                "--num-attention-heads, --seq-length, --max-position-embeddings, the dropouts and the architecture "
                "flags (normalization, activation, position embedding, biases, query groups) of its model"]
    notes = []
    if missing:
        notes.append(f"# note: graph '{graph.name}' does not record {', '.join(missing)}: add the values of its "
                     "model's config (Megatron-LM's defaults are not the model's)")
    if ms.model_type not in _ARCH:
        notes.append(f"# note: no architecture flags are written for model type '{ms.model_type}': add those of its "
                     "normalization, activation, position embedding and biases (Megatron-LM's defaults are GPT-2's: "
                     "LayerNorm, GELU, learned absolute positions, biases)")
    if ms.model_type == "mistral":
        notes.append("# note: Mistral's sliding-window attention is not written (the graph does not record the "
                     "window): add --window-size for it where your Megatron-LM has it, else every layer attends "
                     "over the whole sequence")
    return notes


def _decoder_note(graph: CompGraph, ms: ModelSettings) -> list[str]:
    """A note where the graph says it is no GPT-style decoder (``pretrain_gpt.py`` trains one)."""
    if not ms.task or ms.task == "causal_lm":
        return []
    return [f"# note: graph '{graph.name}' is {ms.label} ({ms.task}), not a GPT-style "
            "decoder: the parallel settings carry over, pretrain_gpt.py's model and loss do not"]


def to_megatron(plan: StagePlan, graph: CompGraph, *, snap: bool = False,
                topology: DeviceTopology | None = None) -> str:
    """Megatron-LM command-line arguments for ``plan`` (see ``placement_rl.export``'s module docstring), one per line
    (``topology`` prices a plan ``snap`` changed)."""
    if plan.schedule in ("gpipe", "zb1p") and plan.num_stages > 1:
        raise PlanError(f"Megatron-LM runs 1F1B (interleaved with virtual stages), not '{plan.schedule}': plan with "
                        "schedule 1f1b or interleaved1f1b, or export --to torchtitan")
    lay = layout(plan, graph, snap=snap)
    mods = lay.mods
    if mods.order[0] in mods.layer or mods.order[-1] in mods.layer:
        raise PlanError(f"graph '{graph.name}' has no modules before and after its layers (embedding, head): "
                        "Megatron-LM's layout needs both")
    args = [("--tensor-model-parallel-size", lay.tp), ("--pipeline-model-parallel-size", lay.pp)]
    if lay.num_stages > 1:
        stages = [_megatron_stage(ms, mods, k == 0, k == lay.num_stages - 1, k)
                  for k, ms in enumerate(lay.stage_modules)]
        args.append(("--pipeline-model-parallel-layout", f'"{"|".join(stages)}"'))
    model = model_settings(graph)
    decoder = model.task in (None, "causal_lm")  # another model's flags would not build it: the note says so
    flags, missing = _model_flags(model) if decoder else ([], [])
    args += [("--num-layers", len(mods.layer)), *flags, ("--micro-batch-size", lay.micro_batch_size),
             ("--global-batch-size", lay.batch_size),
             ("--make-vocab-size-divisible-by", max(lay.vocab_divisible_by, 1))]
    notes = _model_notes(graph, model, missing) if decoder else _decoder_note(graph, model)
    lines = _header(plan, graph, "Megatron-LM arguments", lay, topology) + notes + [
        f"# data parallel: {lay.dp} ({'FSDP2' if lay.sharding == 'fsdp' else 'DDP'}); world size "
        f"{lay.dp * lay.pp * lay.tp}; {lay.virtual} virtual stage(s) per pipeline rank; 1F1B"
        + (" interleaved" if lay.virtual > 1 else "")]
    if lay.recompute == "full":  # every layer checkpointed: Megatron's uniform method, one layer per checkpoint
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif lay.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    body = [k if v is None else f"{k} {v}" for k, v in args]
    if untied_embeddings(graph):
        body.append("--untie-embeddings-and-output-weights")
    if lay.sharding == "fsdp":
        body.append("--use-torch-fsdp2")
    if lay.sequence_parallel:
        body.append("--sequence-parallel")
    return "\n".join(lines + [" \\\n".join(body), ""])


def _megatron_args(text: str) -> dict[str, Any]:
    body = " ".join(x for x in text.splitlines() if not x.lstrip().startswith("#")).replace("\\", " ")
    out: dict[str, Any] = {}
    for m in re.finditer(r'--([a-z0-9-]+)(?:\s+("[^"]*"|[^-\s][^\s]*))?', body):
        out[m.group(1)] = True if m.group(2) is None else m.group(2).strip('"')
    return out


def _expand(stage: str) -> list[str]:
    out = []
    for sym, rep in re.findall(r"([EtL])(?:\*(\d+))?", stage):
        out += [sym] * (int(rep) if rep else 1)
    if "".join(re.findall(r"[EtL]|\*\d+", stage)) != re.sub(r"\s", "", stage):
        raise PlanError(f"layout entry '{stage}' uses symbols other than E, t, L (with *n)")
    return out


def from_megatron(text: str, graph: CompGraph) -> StagePlan:
    """The ``StagePlan`` Megatron-LM arguments (as ``to_megatron`` writes them) describe for ``graph``."""
    a = _megatron_args(text)
    try:
        tp, pp = int(a.get("tensor-model-parallel-size", 1)), int(a.get("pipeline-model-parallel-size", 1))
        micro, batch = int(a["micro-batch-size"]), int(a["global-batch-size"])
        vocab = int(a.get("make-vocab-size-divisible-by", 128))
    except (KeyError, ValueError) as exc:
        raise PlanError(f"Megatron-LM arguments need integer --micro-batch-size and --global-batch-size ({exc})") \
            from None
    world = re.search(r"world size (\d+)", text)
    dp = int(world.group(1)) // (tp * pp) if world else 1
    mods = modules(module_graph(graph))
    layers = sorted(mods.layer, key=mods.layer.get)
    first = mods.order.index(layers[0])
    pre = [k for k in mods.order[:first] if k not in mods.layer]
    post = [k for k in mods.order[first:] if k not in mods.layer]
    if "pipeline-model-parallel-layout" in a:
        stages = [_expand(x) for x in str(a["pipeline-model-parallel-layout"]).split("|")]
    else:
        stages = [["E", *["t"] * len(layers), "L"]]
    parts, it = [], iter(layers)
    for st in stages:
        part = []
        for sym in st:
            part += pre if sym == "E" else post if sym == "L" else [next(it, "")]
        if "" in part:
            raise PlanError(f"the layout has more layers than graph '{graph.name}' ({len(layers)})")
        parts.append(part)
    if next(it, None) is not None:
        raise PlanError(f"the layout places fewer layers than graph '{graph.name}' has ({len(layers)})")
    schedule = "1f1b" if len(stages) <= pp else "interleaved1f1b"
    rc = str(a.get("recompute-granularity", "none"))
    if rc not in ("none", "selective", "full"):
        raise PlanError(f"--recompute-granularity '{rc}' has no stage-plan counterpart (selective, full)")
    return _plan(graph, parts, tp=tp, dp=dp, pp=pp, m=batch // (dp * micro), schedule=schedule,
                 sharding="fsdp" if a.get("use-torch-fsdp2") else "dp", batch=batch, vocab=vocab, recompute=rc,
                 sp=bool(a.get("sequence-parallel")), text=text)
