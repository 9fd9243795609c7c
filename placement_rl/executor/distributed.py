"""Deploy a ``StagePlan`` for real: DP x PP (x TP) with ``torch.distributed`` (pipelining stages + DDP or FSDP2
on a 2-D mesh, or a 3-D ``(dp, pp, tp)`` mesh with Megatron tensor parallelism through ``parallelize_module``,
see ``_tp``; a one-stage plan is plain DDP / FSDP2 / TP without a pipeline schedule).

Flow (everything that can be wrong is checked before a process starts)::

    deploy_stage_plan(plan, graph, model="gpt", overrides={...})      # or module=..., inputs=...
      prepare_job   parallel_dims(plan) -> ParallelDims  (one DP degree, dp x pp ranks, layout, schedule, sharding)
                    batch checks                          (dp x num_microbatches divide the batch)
                    memory check with a topology          (the cost model's memory rule; device and bytes named)
                    torch.export at micro-batch size; assign_stages(program, graph, plan)
                                                          (every plan node in the program, contiguous stages)
                    no custom autograd.Function (its backward would not run), the modules defining custom ops
                    (each rank imports them), static shapes in a pipeline, no in-place write into a value
                    received with its alias (a received value a stage writes into is copied first)
                    TP: degree divides heads / hidden / vocab, split GEMMs are nn.Linear / nn.Embedding
                    calls, no cut inside a TP region, TP groups on one host (with a topology), with
                    sequence parallelism a sequence the TP degree divides
                    the precision each plan runs in (``run_precision``: its priced one where the path has it)
                    write JOB_DIR: job.json + one part per plan (part.json, program.pt2, inputs.pt)
      launch_local  one ``distributed_worker`` process per rank (torchrun's environment), watchdog;
                    ExecutionError naming the rank that died or hung, no process left behind
      collect_results -> DeployResult (median step time, samples/s, Adam time, peak memory, losses)

Several plans with the same world size can share one launch (``deploy_stage_plans``): the ranks start
once and run the plans one after the other. Launching uses ``subprocess`` rather than
``torch.multiprocessing.spawn``: the ranks run the very module ``torchrun`` runs, each in its own
session so the watchdog can kill a rank and anything it started.

Splitting: stage k is the exported program's sub-graph of the nodes the plan puts in stage k
(``_stages.split_stages``). Targets are ordinary inputs: the first stage receives all inputs and
threads those a later stage needs (the targets, for the loss) to it. The last stage's output is the
loss itself, so the schedule's ``loss_fn`` returns it unchanged. The gradients equal those of one
process whose loss is the mean over the ``dp x num_microbatches`` chunks of the batch (the full-batch
loss for mean-reduced losses without batch statistics; with BatchNorm each chunk has its own
statistics, as in any data- or pipeline-parallel run) -- see :func:`reference_step`.

Tied parameters (GPT's embedding and LM head) get a copy in each stage that uses them; after the
schedule (and DDP) their gradients are summed over the owning stages (an all-reduce among those ranks,
a local sum for stages on one rank), so every copy takes the same Adam step.

Backends: gloo on CPU, NCCL on CUDA (``device="cuda"``, or ``"auto"`` when GPUs are present and the
plan's devices are GPUs; one GPU per rank: the plan device's ``torch_device`` index when the job was prepared with
a topology and the node's ranks map to distinct GPUs of one host, else ``LOCAL_RANK``, with a note; see
``_mesh.cuda_binding``). ``job.json``'s ``rank_devices`` and each rank's ``plan_device`` in the result say which
device of the plan a rank stands for (the same on CPU). Launch with :func:`launch_local` on this
machine, or with ``torchrun`` on one or several machines using :func:`build_torchrun_command` (then
:func:`collect_results`).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from placement_rl.errors import ConfigError, ExecutionError, PlanError
from placement_rl.executor._launch import build_torchrun_command, run_ranks
from placement_rl.executor._mesh import ParallelDims, parallel_dims, rank_devices
from placement_rl.executor._stages import (assign_stages, check_autograd_functions, check_static_shapes,
                                           check_unused_parameters, crossing_values, export_step, op_modules,
                                           param_aliases, program_module, split_stages, tied_parameters, value_meta)
from placement_rl.graph.io import atomic_write_text
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

__all__ = ["PRECISIONS", "DeployConfig", "DeployResult", "DeploySpec", "PreparedJob", "build_torchrun_command",
           "collect_results", "deploy_stage_plan", "deploy_stage_plans", "launch_local", "prepare_job",
           "reference_step", "run_precision", "sequence_parallel_names"]

JOB_SCHEMA = "placement_rl.deploy_job"
RESULT_SCHEMA = "placement_rl.deploy_result"
VERSION = 1
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp64")  # what can price a plan (a cost source label's suffix)


@dataclass(frozen=True, kw_only=True)
class DeployConfig:
    """Options of a deployment.

    steps: measured training steps (Adam); warmup: steps run first and not measured (the first one
    infers shapes and warms up communicators); lr: Adam learning rate; device: ``cpu`` (gloo),
    ``cuda`` (NCCL, one GPU per rank) or ``auto`` (cuda when available and the plan's devices are
    GPUs); timeout_s: a rank that dies or makes no progress for this long ends the job (also the
    process-group timeout); threads: torch threads per rank; collect_grads: save the gradients of
    the first step (tests); keep_job_dir: keep the job directory of a temporary run.
    """

    steps: int = 3
    warmup: int = 1
    lr: float = 1e-3
    device: str = "auto"
    timeout_s: float = 300.0
    threads: int = 1
    collect_grads: bool = False
    keep_job_dir: bool = False

    def validate(self) -> "DeployConfig":
        if self.steps < 1 or self.warmup < 0:
            raise ConfigError(f"deploy needs steps >= 1 and warmup >= 0 (got steps={self.steps}, "
                              f"warmup={self.warmup})")
        if not self.lr > 0:
            raise ConfigError(f"deploy lr must be > 0, got {self.lr}")
        if self.device not in DEVICES:
            raise ConfigError(f"deploy device '{self.device}' is unknown; choose one of {', '.join(DEVICES)}")
        if not self.timeout_s > 0 or self.threads < 1:
            raise ConfigError(f"deploy needs timeout_s > 0 and threads >= 1 (got {self.timeout_s}, {self.threads})")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("deploy device 'cuda' was asked for but torch sees no CUDA GPU; use device=cpu")
        return self


@dataclass(frozen=True)
class DeployResult:
    """Measured outcome. ``step_time``: median over measured steps of the slowest rank's step (s)."""

    step_time: float
    throughput: float  # samples per second (global batch / step_time)
    optimizer_time: float  # median over steps of the slowest rank's Adam step (included in step_time)
    batch_size: int
    losses: tuple[float, ...]  # per step (warm-up included), mean over DP replicas
    peak_memory_bytes: int  # max over ranks (``memory_kind``: cpu_max_rss or cuda_max_allocated)
    memory_kind: str
    world_size: int
    dp: int
    pp: int
    schedule: str
    backend: str
    tied_parameters: tuple[str, ...]
    ranks: tuple[Mapping[str, Any], ...]
    wall_time: float
    grads: Mapping[str, torch.Tensor] | None = field(default=None, repr=False)
    sharding: str = "dp"
    tp: int = 1
    precision: Mapping[str, str] = field(default_factory=lambda: {"priced": "fp32", "run": "fp32"})  # run_precision

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "grads"}
        out.update(schema=RESULT_SCHEMA, version=VERSION, ranks=[dict(r) for r in self.ranks])
        return out


@dataclass(frozen=True)
class DeploySpec:
    """One plan to deploy: the plan, its graph, and the model (a zoo name + overrides, or a module + inputs).

    ``precision``: the one that priced the plan (``PRECISIONS``; ``bf16/fp32``: its devices were priced in
    different ones); the ranks run in it where they can (:func:`run_precision`).
    """

    plan: StagePlan
    graph: CompGraph
    model: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    module: nn.Module | None = None
    inputs: Sequence[torch.Tensor] | None = None
    topology: DeviceTopology | None = None
    precision: str = "fp32"


@dataclass(frozen=True)
class PreparedJob:
    job_dir: Path
    parts: tuple[ParallelDims, ...]
    backend: str
    threads: int
    timeout_s: float

    @property
    def world_size(self) -> int:
        return self.parts[0].world_size


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


def _resolve_device(config: DeployConfig, plan: StagePlan, topology: DeviceTopology | None) -> str:
    if config.device != "auto":
        return config.device
    gpus = topology is None or all(topology.devices[d].kind == "gpu" for g in plan.stage_devices for d in g)
    if gpus and topology is not None and not torch.cuda.is_available():
        warnings.warn(f"the plan's devices are GPUs of '{topology.name}' but torch sees no CUDA GPU here: running "
                      "its layout on CPU processes (gloo)", RuntimeWarning, stacklevel=3)
    return "cuda" if torch.cuda.is_available() and gpus else "cpu"


def run_precision(priced: str, device: str, dims: ParallelDims) -> dict[str, str]:
    """``{"priced", "run"}`` (+ ``"why"`` where they differ): the precision a plan priced in ``priced`` runs in on
    ``device`` (``cpu`` / ``cuda``), as the ranks apply it to the model as built (fp32 for the zoo; ``_runner``).

    bf16: ``torch.autocast`` (CPU and CUDA), every path but TP; fp16: autocast and a ``GradScaler``, on CUDA and a
    one-stage DDP plan only (the scaler's overflow check must see the all-reduced gradients to skip a step on every
    rank alike); tf32: TF32 matmuls on CUDA. Anything else runs in fp32, saying why.
    """
    if any(p not in PRECISIONS for p in priced.split("/")):
        raise ConfigError(f"precision '{priced}' is unknown; choose one of {', '.join(PRECISIONS)}")
    why = ""
    if "/" in priced:
        why = "the plan's devices were priced in different precisions"
    elif priced == "fp64":
        why = "the executor does not convert the model to fp64"
    elif priced == "tf32" and device != "cuda":
        why = "TF32 needs a CUDA GPU"
    elif priced in ("bf16", "fp16") and dims.tp > 1:
        why = "autocast is not wired into tensor-parallel stages"
    elif priced == "fp16" and device != "cuda":
        why = "fp16 needs a CUDA GPU for its gradient scaler"
    elif priced == "fp16" and not (dims.plain and dims.sharding == "dp"):
        why = "fp16 runs one-stage DDP plans only: the gradient scaler's overflow check needs all-reduced gradients"
    return {"priced": priced, "run": "fp32", "why": why} if why else {"priced": priced, "run": priced}


def plan_devices_of_ranks(plan: StagePlan, dims: ParallelDims, topology: DeviceTopology) -> list[dict[str, Any]]:
    """The plan's device of every global rank: ``{"name", "torch_device", "host"}`` (``_mesh.rank_devices``)."""
    return [{"name": d.name, "torch_device": d.torch_device, "host": d.host}
            for d in (topology.devices[i] for i in rank_devices(plan, dims))]


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


def sequence_parallel_names(graph: CompGraph) -> tuple[list[str], list[str]]:
    """Sequence parallelism's ``(norms, values)`` as the exported program's node names: the ``layer_norm`` nodes
    that run under ``SequenceParallel`` and the values it keeps sharded along the sequence (``_tp.apply_tp``). A
    coarsened graph's groups are named after modules, not program nodes, so its names come from the graph its
    groups were made from (``member_graph``); ``PlanError`` for a coarsened graph that no longer carries it."""
    from placement_rl.graph import tp as tpmod
    from placement_rl.graph.members import member_graph

    if graph.members is not None:
        found = member_graph(graph)
        if found is None:
            raise PlanError(f"sequence parallelism needs the program's nodes, and graph '{graph.name}' is coarsened "
                            "without the graph its groups were made from; plan on the captured graph "
                            "(graph.coarsen.enabled=false) or set sequence_parallel to false")
        graph = found[0]
    ann = tpmod.annotation(graph)
    norms = sorted(graph.names[v] for v in np.flatnonzero(ann.seq_frac > 0) if graph.op_types[v] == "layer_norm")
    seq_out = np.isin(ann.kind, [tpmod.KINDS.index(k) for k in ("row", "vocab_embedding")])
    return norms, sorted(graph.names[v] for v in np.flatnonzero((ann.seq_frac > 0) | seq_out))


LOGIT_OPS = ("add", "sub", "mul", "div", "tanh")  # element-wise ops TP detection lets the vocab split cross


def check_logits(gm: Any, kinds: Mapping[str, str]) -> None:
    """``PlanError`` where the vocab-parallel LM head's logits go through an element-wise op before the loss (BART's
    ``final_logits_bias``, Gemma 2's softcapping): priced vocab-split, but the executor's loss_parallel needs the
    head's output itself (the ranks failed; before detection crossed them, the tied table's gradient was wrong)."""
    for n in gm.graph.nodes:
        if kinds.get(n.name) != "vocab_head":
            continue
        todo, seen = list(n.users), set()
        while todo:
            u = todo.pop()
            if u in seen or kinds.get(u.name) != "sharded":
                continue
            seen.add(u)
            op = str(getattr(u.target, "__name__", u.target)).split(".")[0].rstrip("_")
            if op in LOGIT_OPS:
                raise PlanError(f"the LM head '{n.name}' feeds its logits through '{u.name}' ({op}: a logits bias or "
                                "softcapping) before the loss; TP deploy runs a vocab-parallel loss on the head's "
                                "output only: use tp=1 for this model")
            todo.extend(u.users)


def check_ties(graph: CompGraph, kinds: Mapping[str, str]) -> None:
    """``PlanError`` where a vocab-parallel word table is tied to a GEMM that is not the vocab-parallel head (TP
    detection missed the head): the table's shards and the whole head would share one weight, and its gradient came
    out wrong (Gemma 2 at TP 2, 45% off, before the head behind its softcapping was found)."""
    for tie in graph.meta.get("tied") or ():
        users = [str(x) for x in (tie.get("nodes") or ())] if isinstance(tie, Mapping) else []
        split = [u for u in users if kinds.get(u) == "vocab_embedding"]
        other = [u for u in users if u not in split and kinds.get(u) != "vocab_head"]
        if split and other:
            raise PlanError(f"the vocab-parallel embedding '{split[0]}' shares its weight with '{other[0]}', which TP "
                            "does not split by vocabulary (its LM head was not found): use tp=1 for this model")


def check_sequence(gm: Any, values: Sequence[str], tp: int) -> None:
    """``PlanError`` when TP degree ``tp`` does not divide the sequence (dim 1) of a value that sequence
    parallelism shards along it (``values``: exported node names, :func:`sequence_parallel_names`)."""
    for n in gm.graph.nodes:
        val = n.meta.get("val") if n.name in values else None
        if isinstance(val, torch.Tensor) and val.dim() >= 3 and int(val.shape[1]) % tp:
            raise PlanError(f"sequence length {int(val.shape[1])} is not divisible by TP {tp}: sequence_parallel "
                            f"needs it ('{n.name}'); change the sequence length or set sequence_parallel to false")


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
    stage_map = assign_stages(gm, graph, plan.stage_of_node)
    imports = op_modules(gm)  # the modules defining its custom ops, imported by each rank before it loads the program
    tp_kinds: dict[str, str] = {}
    tp_vocab: list[int] = []  # [vocabulary, padded] when a TP plan pads it (Megatron's make_vocab_size_divisible_by)
    tp_seq_norms: list[str] = []  # sequence parallelism: the norms run under SequenceParallel
    tp_seq_values: list[str] = []  # ... and the values it keeps sharded along the sequence (a later stage's inputs)
    if dims.tp > 1:
        from placement_rl.executor._tp_region import check_program, node_kinds
        from placement_rl.graph import tp as tpmod

        tp_kinds = node_kinds(graph)
        vocab = tpmod.annotation(graph).vocab
        if vocab:
            tp_vocab = [int(vocab), tpmod.padded_vocab(int(vocab), dims.tp, plan.make_vocab_size_divisible_by)]
        check_program(gm, tp_kinds, dims.tp, stage_map, vocab=tuple(tp_vocab) or None)
        check_logits(gm, tp_kinds)
        check_ties(graph, tp_kinds)
        if plan.sequence_parallel:
            tp_seq_norms, tp_seq_values = sequence_parallel_names(graph)
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
        "recompute_regions": regions_of(plan, graph),
        "tied": {k: list(v) for k, v in tied_parameters(splits).items()},
        "plan": plan.to_dict(graph), "model": {"zoo": spec.model, "overrides": dict(spec.overrides or {})}}, indent=1))
    return dims


def prepare_job(specs: Sequence[DeploySpec], *, config: DeployConfig | None = None,
                job_dir: str | Path) -> PreparedJob:
    """Validate every plan and write the job directory the ranks read; no process is started. A plan refused
    here leaves no job directory behind (unless ``job_dir`` existed before).

    All plans of one job run in the same processes, one after the other: they need the same world size.
    """
    config = (config or DeployConfig()).validate()
    if not specs:
        raise ConfigError("prepare_job needs at least one plan")
    job = Path(job_dir)
    created = not job.exists()
    (job / "result").mkdir(parents=True, exist_ok=True)
    parts = []
    try:
        for i, spec in enumerate(specs):
            dims = prepare_part(spec, part_dir=job / f"part{i}")
            if parts and dims.world_size != parts[0].world_size:
                raise PlanError(f"plan #{i} needs {dims.world_size} processes, plan #0 needs "
                                f"{parts[0].world_size}; plans deployed together must have the same world size")
            parts.append(dims)
        devices = {_resolve_device(config, s.plan, s.topology) for s in specs}
        if len(devices) != 1:
            raise ConfigError("plans deployed together must all run on CPUs or all on GPUs")
        device = devices.pop()
        precisions = [run_precision(s.precision, device, d) for s, d in zip(specs, parts)]
    except BaseException:
        if created:  # a refused plan leaves no job directory behind
            shutil.rmtree(job, ignore_errors=True)
        raise
    backend = "nccl" if device == "cuda" else "gloo"
    # the plan's device of every rank, when every plan has a topology and all of them map the ranks alike
    maps = [None if s.topology is None else plan_devices_of_ranks(s.plan, d, s.topology) for s, d in zip(specs, parts)]
    atomic_write_text(job / "job.json", json.dumps({
        "schema": JOB_SCHEMA, "version": VERSION, "backend": backend, "config": asdict(config) | {"device": device},
        "world_size": parts[0].world_size, "parts": [f"part{i}" for i in range(len(parts))], "precision": precisions,
        "rank_devices": maps[0] if all(m is not None and m == maps[0] for m in maps) else None}, indent=1))
    return PreparedJob(job_dir=job, parts=tuple(parts), backend=backend, threads=config.threads,
                       timeout_s=config.timeout_s)


def _collect_part(part_dir: Path, *, backend: str, collect_grads: bool, wall_time: float,
                  precision: Mapping[str, str]) -> DeployResult:
    part = json.loads((part_dir / "part.json").read_text())
    dims = ParallelDims(**{k: tuple(v) if isinstance(v, list) else v for k, v in part["dims"].items()})
    ranks = []
    for r in range(dims.world_size):
        path = part_dir / "result" / f"rank{r}.json"
        if not path.is_file():
            raise ExecutionError(f"rank {r} wrote no result for {part_dir.name} ({path} is missing)")
        ranks.append(json.loads(path.read_text()))
    per_step = np.max(np.array([r["step_times"] for r in ranks], dtype=np.float64), axis=0)
    step_time = float(statistics.median(per_step.tolist()))
    opt = np.max(np.array([r["optimizer_times"] for r in ranks], dtype=np.float64), axis=0)
    last = [r["losses"] for r in ranks if dims.num_stages - 1 in r["stages"]]
    losses = tuple(float(x) for x in np.mean(np.array(last, dtype=np.float64), axis=0))
    grads = None
    if collect_grads:
        grads = {}
        for r in range(dims.world_size):
            path = part_dir / "result" / f"rank{r}_grads.pt"
            if ranks[r]["dp_rank"] == 0 and path.is_file():
                grads.update(torch.load(path, weights_only=True))
    peak = max(ranks, key=lambda r: r["peak_memory_bytes"])
    return DeployResult(step_time=step_time, throughput=part["batch_size"] / step_time,
                        optimizer_time=float(statistics.median(opt.tolist())), batch_size=part["batch_size"],
                        losses=losses, peak_memory_bytes=int(peak["peak_memory_bytes"]),
                        memory_kind=peak["memory_kind"], world_size=dims.world_size, dp=dims.dp, pp=dims.pp,
                        schedule=dims.schedule, backend=backend, tied_parameters=tuple(sorted(part["tied"])),
                        ranks=tuple(ranks), wall_time=wall_time, grads=grads, sharding=dims.sharding, tp=dims.tp,
                        precision=dict(precision))


def collect_results(job_dir: str | Path, *, wall_time: float = 0.0) -> list[DeployResult]:
    """Read the per-rank results of a finished job (launched here or by torchrun), one per plan."""
    job_dir = Path(job_dir)
    job = json.loads((job_dir / "job.json").read_text())
    return [_collect_part(job_dir / name, backend=job["backend"], collect_grads=bool(job["config"]["collect_grads"]),
                          wall_time=wall_time, precision=precision)
            for name, precision in zip(job["parts"], job["precision"])]


def launch_local(job: PreparedJob, *, nprocs: int | None = None, timeout_s: float | None = None,
                 extra_env: Mapping[str, str] | None = None) -> list[DeployResult]:
    """Run a prepared job with one process per rank on this machine; ``ExecutionError`` names a failed rank."""
    world = job.world_size
    nprocs = world if nprocs is None else nprocs
    if nprocs != world:
        raise ConfigError(f"the plan needs {world} processes (dp {job.parts[0].dp} x pp {job.parts[0].pp} x tp "
                          f"{job.parts[0].tp}), not {nprocs}")
    if job.backend == "nccl" and torch.cuda.device_count() < world:
        raise ConfigError(f"the plan needs {world} GPUs on this machine, torch sees {torch.cuda.device_count()}")
    wall = run_ranks(job.job_dir, nprocs=nprocs, timeout_s=job.timeout_s if timeout_s is None else timeout_s,
                     threads=job.threads, extra_env=extra_env)
    return collect_results(job.job_dir, wall_time=wall)


def deploy_stage_plans(specs: Sequence[DeploySpec], *, config: DeployConfig | None = None,
                       job_dir: str | Path | None = None,
                       extra_env: Mapping[str, str] | None = None) -> list[DeployResult]:
    """Validate every plan, then run them one after the other in ``dp x pp`` local processes (started once).

    ``job_dir``: where the job and per-rank logs go (default: a temporary directory, removed after a
    success unless ``config.keep_job_dir``; kept after a failure, whose message names its logs).
    """
    config = config or DeployConfig()
    tmp = None
    if job_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="prl-deploy-"))
        job_dir = tmp
    try:
        job = prepare_job(specs, config=config, job_dir=job_dir)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    results = launch_local(job, extra_env=extra_env)
    if tmp is not None and not config.keep_job_dir:  # kept after a failure: the error message points at its logs
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def deploy_stage_plan(plan: StagePlan, graph: CompGraph, *, model: str | None = None,
                      overrides: Mapping[str, Any] | None = None, module: nn.Module | None = None,
                      inputs: Sequence[torch.Tensor] | None = None, config: DeployConfig | None = None,
                      topology: DeviceTopology | None = None, job_dir: str | Path | None = None,
                      extra_env: Mapping[str, str] | None = None, precision: str = "fp32") -> DeployResult:
    """Deploy one plan on this machine: train ``config.steps`` steps and report the measurements.

    The model is a zoo name (``model=``, ``overrides=``) or a module with its example inputs (targets
    included; ``module(*inputs)`` returns the loss). ``precision``: the one that priced the plan
    (:func:`run_precision`). The result's ``to_dict()`` is what ``deploy.json`` holds.
    """
    spec = DeploySpec(plan=plan, graph=graph, model=model, overrides=dict(overrides or {}), module=module,
                      inputs=inputs, topology=topology, precision=precision)
    return deploy_stage_plans([spec], config=config, job_dir=job_dir, extra_env=extra_env)[0]


def reference_step(module: nn.Module, inputs: Sequence[torch.Tensor], *,
                   chunks: int) -> tuple[float, dict[str, torch.Tensor]]:
    """Single-process reference of one deployed step: loss and grads (by parameter name) of the mean of
    the losses of ``chunks`` (= dp x num_microbatches) equal slices of the batch, in replica-major order.
    """
    module.zero_grad(set_to_none=True)
    size = int(inputs[0].shape[0]) // chunks
    total = sum(module(*(t[i * size:(i + 1) * size] for t in inputs)) for i in range(chunks)) / chunks
    total.backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    return float(total.detach()), grads
