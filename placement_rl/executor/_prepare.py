"""One plan of a deployment checked against its model and written for the ranks (``placement_rl.executor.distributed``,
whose module doc lists the checks): ``prepare_part`` validates the plan (graph, batch, memory with a topology, export,
TP) and writes its part directory (part.json, program.pt2, inputs.pt)."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import fx, nn

from placement_rl.errors import ConfigError, ExecutionError, PlanError
from placement_rl.executor._deploy_types import DeploySpec
from placement_rl.executor._mesh import ParallelDims, parallel_dims
from placement_rl.executor._stages import (align_programs, assign_stages, check_autograd_functions,
                                           check_static_shapes, check_unused_parameters, crossing_values, export_step,
                                           op_modules, param_aliases, plan_node_stages, program_module, split_stages,
                                           tied_parameters, value_meta)
from placement_rl.executor._tp_checks import check_logits, check_sequence, check_ties, sequence_parallel_names
from placement_rl.graph.io import atomic_write_text
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology


def _check_plan_graph(plan: StagePlan, graph: CompGraph) -> None:
    """The graph-only part of ``StagePlan.validate`` (no topology needed)."""
    n, s = graph.num_nodes, plan.num_stages
    if len(plan.stage_of_node) != n:
        raise PlanError(f"stage plan has {len(plan.stage_of_node)} entries but graph '{graph.name}' has {n} nodes")
    son = plan.stage_of_node
    if son.min() < 0 or son.max() >= s or (np.bincount(son, minlength=s) == 0).any():
        raise PlanError(f"stage ids must cover 0..{s - 1}, each stage non-empty (got {sorted(set(son.tolist()))})")
    if graph.num_edges:
        back = np.flatnonzero(son[graph.edges[:, 0]] > son[graph.edges[:, 1]])
        if back.size:
            a, b = graph.edges[int(back[0])]
            raise PlanError(f"stages are not contiguous: edge '{graph.names[a]}' (stage {son[a]}) -> "
                            f"'{graph.names[b]}' (stage {son[b]}) goes backwards")


def _model(model: str | None, overrides: Mapping[str, Any] | None, module: nn.Module | None,
           inputs: Sequence[torch.Tensor] | None, plan: StagePlan) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if (model is None) == (module is None):
        raise ConfigError("give either a zoo model name (model=...) or a module with its inputs (module=, inputs=)")
    if model is not None:
        from placement_rl.graph import zoo

        opts = dict(overrides or {})
        if plan.batch_size is not None:
            opts["batch_size"] = int(plan.batch_size)
        return zoo.build(model, **opts)
    if not inputs:
        raise ConfigError("module= needs inputs= (the example inputs, targets included)")
    return module.train(), tuple(inputs)


def check_memory(plan: StagePlan, graph: CompGraph, topology: DeviceTopology) -> None:
    """``PlanError`` naming the device and bytes when the plan does not fit the topology's memory (the cost
    model's memory rule: training state incl. Adam, FSDP shards + gathered unit, in-flight activations)."""
    from placement_rl.cost import resolve_costs
    from placement_rl.cost.pipeline import PIPELINE_SCHEDULES, PipelineSimulator

    if plan.schedule not in PIPELINE_SCHEDULES:  # zb1p: not simulated; its in-flight activations are 1f1b's
        stacked = len({d for g in plan.stage_devices for d in g}) < sum(len(g) for g in plan.stage_devices)
        plan = replace(plan, schedule="interleaved1f1b" if stacked else "1f1b")
    from placement_rl.plans import graph_batch_size

    costs = resolve_costs(graph, topology)
    captured = graph_batch_size(graph)  # the plan's batch_size is what runs: activations at that batch
    scaled = plan.batch_size is not None and captured is not None and costs.meta.get("batch_size") is None
    res = PipelineSimulator(graph, costs, topology, cost_batch_size=float(captured) if scaled else None).run(plan)
    if not res.feasible:
        errs = list(res.meta.get("memory_errors", ()))
        more = f" (and {len(errs) - 1} more devices)" if len(errs) > 1 else ""
        raise PlanError(f"{plan.sharding} plan does not fit topology '{topology.name}': {errs[0] if errs else ''}"
                        f"{more}; use sharding fsdp, more stages or more micro-batches")


def program_names(module: nn.Module, batch: Sequence[torch.Tensor], gm: fx.GraphModule, graph: CompGraph,
                  dims: ParallelDims) -> dict[str, str | None]:
    """Graph node name -> the micro-batch program ``gm``'s node name where they differ (None: an op without compute
    of its own that the export at micro-batch size 1 folded away, ``_stages.align_programs``); empty when they agree
    or the graph is not this model's (``assign_stages`` says so). A folded op frees its name, which the later ops of
    its kind take, so the graph's names are realigned when one of them is missing. ``PlanError`` naming the cause and
    the fix when the micro-batch export changed the program otherwise."""
    size = int(batch[0].shape[0])
    micro = size // (dims.dp * dims.num_microbatches)
    wanted = set(plan_node_stages(graph, np.zeros(graph.num_nodes, dtype=np.int64)))
    if micro == size or wanted <= {n.name for n in gm.graph.nodes}:
        return {}
    ref = program_module(export_step(module, batch))  # at the whole batch, as the graph was captured
    if not wanted <= {n.name for n in ref.graph.nodes}:
        return {}
    names, odd = align_programs(ref, gm)
    if odd is not None:
        raise PlanError(f"exporting the model at micro-batch size {micro} (batch {size} / (DP {dims.dp} x "
                        f"{dims.num_microbatches} micro-batches)) changes its program at '{odd.name}' ({odd.target}), "
                        f"so graph '{graph.name}' does not describe what would run; use a plan whose micro-batch holds "
                        f"{'2 or more samples' if micro == 1 else 'another number of samples'}")
    return {k: v for k, v in names.items() if k != v}


def _renamed(names: Sequence[str], rename: Mapping[str, str | None]) -> list[str]:
    """Graph node ``names`` as the program names them (:func:`program_names`), the ops it folded away left out."""
    return [rename.get(m, m) for m in names if rename.get(m, m) is not None]


def prepare_part(spec: DeploySpec, *, part_dir: Path) -> ParallelDims:
    """Validate one plan against its model and write its part directory; return its DP x PP layout."""
    plan, graph = spec.plan, spec.graph
    dims = parallel_dims(plan)
    if spec.topology is not None:
        plan.validate(graph, spec.topology)
    _check_plan_graph(plan, graph)
    if plan.batch_size is not None:
        chunks = dims.dp * dims.num_microbatches
        if plan.batch_size % chunks:
            raise PlanError(f"batch size {plan.batch_size} is not divisible by DP degree ({dims.dp}) x "
                            f"num_microbatches ({dims.num_microbatches}); change the batch or the plan")
    if spec.topology is not None:
        check_memory(plan, graph, spec.topology)
    if dims.tp > 1:
        from placement_rl.graph import tp as tpmod

        tpmod.check_degree(graph, dims.tp, divisible_by=plan.make_vocab_size_divisible_by)  # heads / hidden / vocab
    if graph.meta.get("capture_method", "export") != "export":
        raise PlanError(f"graph '{graph.name}' was captured with torch.fx; the distributed executor splits the "
                        "torch.export program, so capture the model with method='export'")
    module, batch = _model(spec.model, spec.overrides, spec.module, spec.inputs, plan)
    sizes = {int(t.shape[0]) if t.dim() else -1 for t in batch}
    if len(sizes) != 1 or -1 in sizes:
        raise ConfigError(f"every model input needs the batch as its first dimension (sizes {sorted(sizes)})")
    size = sizes.pop()
    if plan.batch_size is not None and plan.batch_size != size:
        raise PlanError(f"plan batch size {plan.batch_size} differs from the model inputs' batch {size}")
    chunks = dims.dp * dims.num_microbatches
    if size % chunks:
        raise PlanError(f"batch size {size} is not divisible by DP degree ({dims.dp}) x num_microbatches "
                        f"({dims.num_microbatches}); change the batch or the plan")
    micro = [t[:size // chunks] for t in batch]
    try:
        ep = export_step(module, micro)
    except Exception as exc:  # torch.export raises many kinds
        raise ExecutionError(f"cannot export the model at micro-batch size {size // chunks} ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    custom = check_autograd_functions(module, micro)
    if custom:
        raise PlanError(custom)
    manual_dp = "ZeroBubble" in dims.schedule_class_name() or dims.tp > 1  # the executor's own all-reduce, not DDP
    unused = check_unused_parameters(module, micro, dp=dims.dp, ddp=dims.sharding == "dp" and not manual_dp)
    if unused:
        raise PlanError(unused)
    gm = program_module(ep)
    rename = program_names(module, batch, gm, graph, dims)  # graph names -> gm's where its export folded ops away
    stage_map = assign_stages(gm, graph, plan.stage_of_node, rename)
    imports = op_modules(gm)  # the modules defining its custom ops, imported by each rank before it loads the program
    tp_kinds: dict[str, str] = {}
    tp_vocab: list[int] = []  # [vocabulary, padded] when a TP plan pads it (Megatron's make_vocab_size_divisible_by)
    tp_seq_norms: list[str] = []  # sequence parallelism: the norms run under SequenceParallel
    tp_seq_values: list[str] = []  # ... and the values it keeps sharded along the sequence (a later stage's inputs)
    if dims.tp > 1:
        from placement_rl.executor._tp_region import check_program, node_kinds
        from placement_rl.graph import tp as tpmod

        graph_kinds = node_kinds(graph)
        tp_kinds = {rename.get(k, k): v for k, v in graph_kinds.items() if rename.get(k, k) is not None}
        vocab = tpmod.annotation(graph).vocab
        if vocab:
            tp_vocab = [int(vocab), tpmod.padded_vocab(int(vocab), dims.tp, plan.make_vocab_size_divisible_by)]
        check_program(gm, tp_kinds, dims.tp, stage_map, vocab=tuple(tp_vocab) or None)
        check_logits(gm, tp_kinds)
        check_ties(graph, graph_kinds)
        if plan.sequence_parallel:
            tp_seq_norms, tp_seq_values = (_renamed(x, rename) for x in sequence_parallel_names(graph))
            check_sequence(gm, tp_seq_values, dims.tp)
    from placement_rl.executor._recompute import regions_of

    aliases = param_aliases(module)
    splits = split_stages(gm, stage_map, dims.num_stages, aliases=aliases)
    if not dims.plain:  # a pipeline's stages are built from the values' shapes (a one-stage plan needs none)
        check_static_shapes(gm)
    metas = {} if dims.plain else value_meta(program_module(ep), micro)
    ties = tied_parameters(splits)
    if plan.sharding == "fsdp" and ties and dims.dp > 1:
        raise PlanError(f"an fsdp plan cannot share tied parameters {sorted(ties)} between stages (their sharded "
                        "gradients are not synchronised); put them in one stage or use sharding dp")
    crossing = crossing_values(splits)
    odd = [] if dims.plain else [v for v in crossing if v not in metas]
    if odd:
        raise PlanError(f"value '{odd[0]}' passes between stages but is not a single tensor; move the cut so that "
                        "only tensors cross stages")
    (part_dir / "result").mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch's own pytree deprecation noise while pickling the program
        warnings.simplefilter("ignore", FutureWarning)
        torch.export.save(ep, str(part_dir / "program.pt2"))
    torch.save(tuple(t.detach().cpu() for t in batch), part_dir / "inputs.pt")
    atomic_write_text(part_dir / "part.json", json.dumps({
        "dims": asdict(dims), "stage_map": stage_map, "param_aliases": aliases, "op_modules": imports,
        "value_meta": {v: metas[v] for v in crossing if v in metas}, "batch_size": size, "tp_kinds": tp_kinds,
        "tp_vocab": tp_vocab, "tp_seq_norms": tp_seq_norms, "tp_seq_values": tp_seq_values,
        "recompute_regions": {s: [_renamed(r, rename) for r in rs] for s, rs in regions_of(plan, graph).items()},
        "tied": {k: list(v) for k, v in tied_parameters(splits).items()},
        "plan": plan.to_dict(graph), "model": {"zoo": spec.model, "overrides": dict(spec.overrides or {})}}, indent=1))
    return dims
