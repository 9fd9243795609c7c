"""torchtitan's job config for a ``StagePlan`` (``to_torchtitan``: its ``[parallelism]`` and ``[training]`` tables,
comments on the model and sequence length torchtitan must be given, a note on DDP combined with TP or PP) and back
(``from_torchtitan``); see ``placement_rl.export``'s module doc."""

from __future__ import annotations

import re
import tomllib

from placement_rl._export_header import _header
from placement_rl._export_layout import Layout, layout
from placement_rl._export_model import ModelSettings, model_settings
from placement_rl._export_read import _plan
from placement_rl.errors import PlanError
from placement_rl.export_modules import module_graph
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.layers import modules
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

_TITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved1f1b": "Interleaved1F1B",
                    "zb1p": "InterleavedZeroBubble"}


def _model_lines(graph: CompGraph, ms: ModelSettings, layers: int) -> list[str]:
    """Comment lines on the model torchtitan must be given: it defines its models in code, chosen by ``[model]``
    name and flavor, and defaults ``[training] seq_len`` to 2048. The sizes the graph records, those it does not,
    and a note on Mistral's sliding window."""
    if ms.model_type is None:
        return [f"# model: not written, and graph '{graph.name}' records no model settings: choose the [model] name "
                "and flavor of its model and set [training] seq_len to its sequence length"]
    sizes = [("dim", ms.hidden), ("n_layers", layers), ("n_heads", ms.heads), ("n_kv_heads", ms.kv_heads),
             ("ffn_hidden", ms.ffn), ("vocab_size", ms.vocab)]
    sizes += [("experts", ms.experts), ("top_k", ms.top_k)] if ms.experts else []
    lacking = [k for k, v in sizes if v is None] + ([] if ms.seq_len else ["seq_len"])
    lines = ["# model: not written (torchtitan defines its models in code): choose a [model] name and flavor with",
             "# " + ", ".join(f"{k} = {v}" for k, v in sizes if v is not None)]
    lines += [f"# and set [training] seq_len = {ms.seq_len} (torchtitan's default is 2048)"] if ms.seq_len else []
    if lacking:
        lines.append(f"# not recorded in the graph: {', '.join(lacking)} (take them from the model's config)")
    if ms.model_type == "mistral":
        lines.append("# note: Mistral's sliding-window attention is not recorded in the graph: torchtitan's Llama "
                     "models attend over the whole sequence")
    return lines


def _ddp_note(lay: Layout) -> list[str]:
    """DDP combined with TP or PP: some torchtitan releases stop at startup (their ``parallelize`` refuses DDP on a
    mesh of more than one dimension; newer ones check the replicate mesh only)."""
    if lay.sharding == "fsdp" or lay.dp <= 1 or (lay.tp <= 1 and lay.pp <= 1):
        return []
    return ["# note: some torchtitan releases refuse DDP (data_parallel_replicate_degree > 1) combined with TP or PP "
            "at startup (\"DDP has not supported > 1D parallelism\"); with those, plan with sharding fsdp instead"]


def to_torchtitan(plan: StagePlan, graph: CompGraph, *, snap: bool = False,
                  topology: DeviceTopology | None = None) -> str:
    """torchtitan job-config TOML (``[parallelism]``, ``[training]``) for ``plan`` (see ``placement_rl.export``'s
    module docstring; ``topology`` prices a plan ``snap`` changed)."""
    lay = layout(plan, graph, snap=snap)
    sched = _TITAN_SCHEDULES[plan.schedule]
    if plan.schedule == "zb1p" and lay.virtual == 2 and lay.num_stages > lay.pp:
        from placement_rl.executor._mesh import parallel_dims

        if parallel_dims(plan).layout == "v":
            sched = "ZBVZeroBubble"
    fsdp = lay.sharding == "fsdp"
    model = _model_lines(graph, model_settings(graph), len(lay.mods.layer))
    lines = _header(plan, graph, "torchtitan job config", lay, topology) + model
    lines += _ddp_note(lay) + [
        "# module names are the captured model's (torchtitan's Llama names them tok_embeddings, layers.<i>, norm,",
        "# output); the vocabulary padding below is Megatron's rule, torchtitan shards unevenly instead",
        f"# make_vocab_size_divisible_by = {lay.vocab_divisible_by}",
        f"# sequence_parallel = {str(lay.sequence_parallel).lower()} (torchtitan's TP shards the norms along the "
        "sequence whenever tensor_parallel_degree > 1)",
        "", "[parallelism]",
        f"data_parallel_replicate_degree = {1 if fsdp else lay.dp}",
        f"data_parallel_shard_degree = {lay.dp if fsdp else 1}",
        f"tensor_parallel_degree = {lay.tp}",
        f"pipeline_parallel_degree = {lay.pp}"]
    if lay.num_stages > 1:
        parts = ", ".join("[" + ", ".join(f'"{m}"' for m in ms) + "]" for ms in lay.stage_modules)
        lines += [f'pipeline_parallel_schedule = "{sched}"',
                  f"pipeline_parallel_microbatch_size = {lay.micro_batch_size}",
                  f"module_fqns_per_model_part = [{parts}]"]
    # torchtitan: a pipeline splits each DP rank's local batch into micro-batches; without one, micro-batches are
    # gradient-accumulation steps (global = local x DP x steps)
    local = lay.batch_size // lay.dp if lay.num_stages > 1 else lay.micro_batch_size
    lines += ["", "[training]", f"local_batch_size = {local}", f"global_batch_size = {lay.batch_size}"]
    if lay.recompute != "none":  # torchtitan's selective mode is its op-level policy, not exactly the core
        lines += ["", "[activation_checkpoint]", f'mode = "{lay.recompute}"']
        lines += ['selective_ac_option = "op"'] if lay.recompute == "selective" else []
    lines.append("")
    return "\n".join(lines)

def from_torchtitan(text: str, graph: CompGraph) -> StagePlan:
    """The ``StagePlan`` a torchtitan job config (as ``to_torchtitan`` writes it) describes for ``graph``."""
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"not a torchtitan TOML job config ({exc})") from None
    par, tr = cfg.get("parallelism", {}), cfg.get("training", {})
    rep, shard = int(par.get("data_parallel_replicate_degree", 1)), int(par.get("data_parallel_shard_degree", 1))
    if rep > 1 and shard > 1:
        raise PlanError("HSDP (replicate and shard degrees both > 1) has no stage-plan counterpart")
    dp, pp, tp = max(rep, shard), int(par.get("pipeline_parallel_degree", 1)), int(par.get("tensor_parallel_degree", 1))
    batch = int(tr.get("global_batch_size", -1))
    if batch < 1:
        batch = int(tr.get("local_batch_size", 8)) * dp
    mods = modules(module_graph(graph))
    parts = par.get("module_fqns_per_model_part") or [list(mods.order)]
    names = {v: k for k, v in _TITAN_SCHEDULES.items()} | {"ZBVZeroBubble": "zb1p"}
    schedule = names.get(str(par.get("pipeline_parallel_schedule", "1F1B")))
    if schedule is None:
        raise PlanError(f"pipeline schedule '{par.get('pipeline_parallel_schedule')}' has no stage-plan counterpart "
                        f"(choose one of {', '.join(names)})")
    local = int(tr.get("local_batch_size", batch // dp))
    micro = int(par.get("pipeline_parallel_microbatch_size", 1)) if len(parts) > 1 else local
    vocab = re.search(r"make_vocab_size_divisible_by = (\d+)", text)
    rc = str(cfg.get("activation_checkpoint", {}).get("mode", "none"))
    if rc not in ("none", "selective", "full"):
        raise PlanError(f"activation_checkpoint mode '{rc}' has no stage-plan counterpart (none, selective, full)")
    return _plan(graph, [list(p) for p in parts], tp=tp, dp=dp, pp=pp, m=max(batch // (dp * micro), 1),
                 schedule=schedule, sharding="fsdp" if shard > 1 else "dp", batch=batch,
                 vocab=int(vocab.group(1)) if vocab else 128, recompute=rc,
                 sp="# sequence_parallel = true" in text, text=text)
