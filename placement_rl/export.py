"""A ``StagePlan`` handed to the trainers people run: torchtitan's job config and Megatron-LM's arguments, and back.

``to_torchtitan(plan, graph) -> str`` writes the ``[parallelism]`` and ``[training]`` tables of a torchtitan job
config (TOML): ``data_parallel_replicate_degree`` / ``data_parallel_shard_degree`` (DDP or FSDP2 over the plan's DP
degree), ``tensor_parallel_degree``, ``pipeline_parallel_degree`` (device groups), ``pipeline_parallel_schedule`` by
name (``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``: torch's
``torch.distributed.pipelining`` names), ``pipeline_parallel_microbatch_size`` and ``module_fqns_per_model_part``
(the model's own module names per stage), ``local_batch_size`` / ``global_batch_size`` (a one-stage plan's
micro-batches as gradient-accumulation steps). Targets torchtitan's ``Parallelism`` / ``Training`` job-config fields
as of its 2025 releases (``module_fqns_per_model_part`` is the newest field used).

``to_megatron(plan, graph) -> str`` writes Megatron-LM ``pretrain_gpt.py`` arguments:
``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--pipeline-model-parallel-layout`` (the
uneven layer layout, one ``|``-separated entry per virtual stage in Megatron's order, virtual stage ``k`` on
pipeline rank ``k mod pp``: ``E`` embedding, ``t`` a transformer layer, ``L`` final norm, output layer and loss; the
virtual stages per rank follow from it), ``--micro-batch-size`` / ``--global-batch-size`` (gradient accumulation
when the plan's micro-batches exceed the pipeline's), ``--make-vocab-size-divisible-by``, ``--use-torch-fsdp2``
for FSDP plans and ``--untie-embeddings-and-output-weights`` when the output layer has weights of its own
(``untied_embeddings``; Megatron-LM ties them by default). ``E`` is every module before the layers except a rotary
embedding (no weights; Megatron-LM computes it in every stage) and must sit whole in the first stage. A graph the
model's metadata calls no causal LM (BERT, ViT, T5) gets a ``# note:`` line: the settings are ``pretrain_gpt.py``'s.
Targets Megatron-LM / Megatron-Core 0.13 and later (the layout argument; experimental there).
Megatron runs 1F1B (interleaved with virtual stages) only: a ``gpipe`` or ``zb1p`` pipeline is refused (a one-stage
plan has no pipeline schedule and reads back as ``1f1b``). Recomputation (one setting for all stages: both
trainers set one): ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` (every
layer) or ``selective``; torchtitan ``[activation_checkpoint] mode`` (its ``selective`` is an op-level policy, close
to but not exactly the attention core). Sequence parallelism: ``--sequence-parallel``; torchtitan runs it with
every TP degree > 1 (written as a comment).

Stages are exported at module granularity: the transformer layers (the repeated ``<container>.<i>`` modules of
the captured graph's ``module_paths``) and the modules around them. A module whose nodes the plan puts in two
stages is refused (one line naming it) unless ``snap=True``, which moves it whole to the stage holding most of
its forward FLOPs; the header then names the modules moved and gives the snapped plan's predicted step time (the
topology's estimates, ``cost.resolve_costs``; needs ``topology``). An interleaved plan whose micro-batches do not
divide over its device groups is refused as the pipeline simulator refuses it.

Neither trainer's settings say which GPU runs which rank: both number ranks pipeline rank outermost, then DP, TP
innermost, and a launcher gives rank ``r`` the ``r``-th GPU it starts. A plan whose devices are not ``0..world-1``
in that order (stage 0 on an A100, stage 1 on the H100 ...) gets a ``# rank_devices = [...]`` line (the plan's
device of every rank), a ``# note:`` naming each rank's device and, with ``topology``, one ``# node k:`` line per
run of consecutive ranks on one host (the node order to launch the hosts in, its ``CUDA_VISIBLE_DEVICES``); a host
whose ranks are not consecutive gets a note of its own (torchrun cannot number them so).
``from_torchtitan`` / ``from_megatron`` read the text back into a ``StagePlan`` for the same
graph (the ``rank_devices`` line's devices, else ``0..world-1``, in the trainers' rank order; nodes outside every
module follow their inputs' latest stage, those without inputs their consumers' earliest): a plan cut so
round-trips exactly (tests).

A coarsened graph's stages hold its groups' members' modules (``placement_rl.export_modules``: a group named after
one module may hold the embedding or the final norm too), and its plans read back onto its groups.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from placement_rl.errors import PlacementRLError, PlanError
from placement_rl.export_modules import fill_stages, group_stages, member_plan, module_graph, split_note
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.layers import Modules, modules
from placement_rl.plans import RECOMPUTE, StagePlan, check_interleaved, graph_batch_size
from placement_rl.topology import DeviceTopology

FORMATS = ("torchtitan", "megatron")
_TITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved1f1b": "Interleaved1F1B",
                    "zb1p": "InterleavedZeroBubble"}


@dataclass(frozen=True)
class Layout:
    """What both trainers need: degrees, schedule, batch split and each stage's modules (program order)."""

    tp: int
    dp: int
    pp: int
    num_stages: int
    schedule: str
    num_microbatches: int
    batch_size: int
    sharding: str
    vocab_divisible_by: int
    recompute: str
    sequence_parallel: bool
    stage_modules: tuple[tuple[str, ...], ...]
    mods: Modules
    moved: tuple[tuple[str, int], ...] = ()  # (module, stage) that --snap moved whole
    rank_devices: tuple[int, ...] = ()  # the plan's device of every trainer rank (``trainer_rank_devices``)

    @property
    def virtual(self) -> int:
        return self.num_stages // self.pp

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // (self.num_microbatches * self.dp)


def layout(plan: StagePlan, graph: CompGraph, *, snap: bool = False) -> Layout:
    """The plan at module granularity (``PlanError`` naming what cannot be exported); a coarsened graph's modules
    are its groups' members' (``member_plan``)."""
    from placement_rl.executor._mesh import parallel_dims

    if len(plan.stage_of_node) != graph.num_nodes:
        raise PlanError(f"plan has {len(plan.stage_of_node)} entries but graph '{graph.name}' has {graph.num_nodes} "
                        "nodes: export it with the graph it was made for")
    coarse = graph
    plan, graph = member_plan(plan, graph)
    dims = parallel_dims(plan)  # one DP and one TP degree, groups equal or disjoint, a schedule torch runs
    if dims.num_stages > 1 and dims.layout not in ("single", "loop") and plan.schedule != "zb1p":
        raise PlanError("virtual stages must go round-robin over the device groups (stage k on group k mod pp)")
    check_interleaved(plan, [k % dims.pp for k in range(dims.num_stages)], dims.pp)  # as deploy and evaluate
    if len(set(plan.recompute)) > 1:
        most = most_recompute(plan)
        raise PlanError(f"stages recompute differently ({list(plan.recompute)}): torchtitan and Megatron-LM set one "
                        f"recomputation for the whole model; give every stage the same, or export with "
                        f"--uniform-recompute to recompute '{most}' in every stage (the most any stage does: no stage "
                        "keeps more activations than planned, the step is slower)")
    batch = plan.batch_size if plan.batch_size is not None else graph_batch_size(graph)
    if batch is None:
        raise PlanError(f"the plan and graph '{graph.name}' name no batch size: set the plan's batch_size")
    mods = modules(graph)
    where: dict[str, dict[int, float]] = {}
    for v, k in enumerate(mods.key):
        if k is not None:
            d = where.setdefault(k, {})
            s = int(plan.stage_of_node[v])
            d[s] = d.get(s, 0.0) + float(graph.fwd_flops[v]) + 1e-9
    stage_of: dict[str, int] = {}
    moved: list[tuple[str, int]] = []
    last = 0
    for k in mods.order:
        d = where[k]
        if len(d) > 1 and not snap:
            raise PlanError(f"module '{k}' is split between stages {sorted(d)}{split_note(coarse, mods.key, k)}: "
                            "torchtitan and Megatron-LM cut between modules; move the cut to a layer boundary or "
                            "export with --snap")
        last = max(last, max(d, key=d.get))
        stage_of[k] = last
        if set(d) != {last}:
            moved.append((k, last))
    per = [tuple(k for k in mods.order if stage_of[k] == s) for s in range(plan.num_stages)]
    empty = [s for s, ms in enumerate(per) if not ms]
    if empty:
        raise PlanError(f"stage {empty[0]} holds no whole module after snapping: use fewer stages")
    ranks = tuple(int(d) for c in range(dims.pp) for d in plan.stage_devices[dims.stages_of(c)[0]])
    return Layout(tp=dims.tp, dp=dims.dp, pp=dims.pp, num_stages=dims.num_stages, schedule=plan.schedule,
                  num_microbatches=dims.num_microbatches, batch_size=int(batch), sharding=plan.sharding,
                  vocab_divisible_by=plan.make_vocab_size_divisible_by, recompute=plan.recompute[0],
                  sequence_parallel=plan.sequence_parallel and dims.tp > 1,
                  stage_modules=tuple(per), mods=mods, moved=tuple(moved), rank_devices=ranks)


def _stage_of_node(graph: CompGraph, mods: Modules, stage_of: dict[str, int]) -> np.ndarray:
    """Every node's stage when each module sits whole in ``stage_of[module]``: a node of no module follows its
    inputs' latest stage, one without inputs (targets, positions) its consumers' earliest."""
    return fill_stages(graph, [None if k is None else stage_of[k] for k in mods.key])


def most_recompute(plan: StagePlan) -> str:
    """The most recomputation any stage of ``plan`` does (``none`` < ``selective`` < ``full``)."""
    return max(plan.recompute, key=RECOMPUTE.index)


def uniform_recompute(plan: StagePlan) -> StagePlan:
    """``plan`` with every stage recomputing as much as its most recomputing stage (``most_recompute``: no stage keeps
    more activations than planned), for trainers that set one recomputation for the whole model; the plan's
    per-stage modes go to ``meta["recompute_as_planned"]`` and its predicted step, for the plan as planned, is
    dropped. A plan that already recomputes uniformly is returned as is."""
    if len(set(plan.recompute)) <= 1:
        return plan
    meta = {k: v for k, v in plan.meta.items() if k not in ("step_time", "steady_time")}
    meta["recompute_as_planned"] = list(plan.recompute)
    return replace(plan, recompute=(most_recompute(plan),) * plan.num_stages, meta=meta)


def _price(plan: StagePlan, graph: CompGraph, topology: DeviceTopology | None) -> float | str:
    """One training step of ``plan`` from the topology's estimates (``cost.resolve_costs``), or why not."""
    from placement_rl.cost import resolve_costs, simulate_pipeline

    if topology is None:
        return "no topology: pass --topology"
    try:
        return float(simulate_pipeline(graph, resolve_costs(graph, topology), topology,
                                       plan.validate(graph, topology)).step_time)
    except PlacementRLError as exc:
        return str(exc)


def _snapped_step(plan: StagePlan, graph: CompGraph, lay: Layout, topology: DeviceTopology | None) -> str:
    """The header's words on a plan ``--snap`` changed: which modules moved, and both plans' predicted step times
    from the topology's estimates (the plan's own prediction was for the plan as cut)."""
    from placement_rl.cost import resolve_costs, simulate_pipeline

    names = ", ".join(f"{k} to stage {s}" for k, s in lay.moved[:3]) + (f" and {len(lay.moved) - 3} more"
                                                                        if len(lay.moved) > 3 else "")
    said = f"--snap moved {names}"
    if topology is None:
        return f"{said}; predicted step not priced (no topology: pass --topology)"
    plan, graph = member_plan(plan, graph)  # the modules moved are the member graph's
    stage_of = {k: s for s, ms in enumerate(lay.stage_modules) for k in ms}
    snapped = replace(plan, stage_of_node=_stage_of_node(graph, lay.mods, stage_of), meta={})
    try:
        costs = resolve_costs(graph, topology)
        before = simulate_pipeline(graph, costs, topology, plan).step_time
        after = simulate_pipeline(graph, costs, topology, snapped.validate(graph, topology)).step_time
    except PlacementRLError as exc:
        return f"{said}; predicted step not priced ({exc})"
    return f"predicted step {after:.6g} s after {said} (as cut: {before:.6g} s; topology estimates)"


def _step_words(plan: StagePlan, graph: CompGraph, topology: DeviceTopology | None) -> str:
    """The header's predicted step: the plan's own (``meta["step_time"]``) unless it was planned for inference
    (``meta["mode"]``; plans without it read as training) or its recomputation was made uniform: then one
    training step priced from the topology's estimates, since the settings written train the model."""
    own = plan.meta.get("step_time")
    own = float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) else None
    inference = str(plan.meta.get("mode", "train")) == "inference"
    if not inference and "recompute_as_planned" not in plan.meta:
        return "" if own is None else f", predicted step {own:.6g} s"
    step = _price(plan, graph, topology)
    words = (f", predicted training step {step:.6g} s (topology estimates)" if isinstance(step, float)
             else f", predicted training step not priced ({step})")
    if inference and own is not None:
        words += (f"; the plan's own {own:.6g} s is one forward pass (planned with mode=inference), not a "
                  "training step")
    return words


def _rank_lines(lay: Layout, topology: DeviceTopology | None) -> list[str]:
    """Where the plan's devices are not ranks 0..world-1 in order (the trainers' ranks: pipeline rank outermost,
    then DP, TP innermost, which the readers assume): a ``# rank_devices`` line the readers take back, a note
    naming each rank's device, and, with a topology, the node order to launch the hosts in and each node's
    ``CUDA_VISIBLE_DEVICES`` (torchrun numbers a node's ranks consecutively, local rank i on visible GPU i)."""
    ranks = lay.rank_devices
    if ranks == tuple(range(len(ranks))):
        return []
    devs = topology.devices if topology is not None and max(ranks) < topology.num_devices else None
    name = (lambda d: devs[d].name) if devs is not None else (lambda d: f"device {d}")
    said = ", ".join(f"rank {r} {name(d)}" for r, d in enumerate(ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    lines = [f"# rank_devices = [{', '.join(map(str, ranks))}]",
             f"# note: pipeline ranks must run on the plan's devices, not on devices 0..{len(ranks) - 1} in order: "
             f"{said} (ranks as torchtitan and Megatron-LM number them: pipeline rank outermost, TP innermost)"
             + ("; launch the hosts as the nodes below" if devs is not None else
                "; the device indices are the plan's topology's")]
    if devs is None:
        return lines
    nodes: list[list[int]] = []  # runs of consecutive ranks on one host
    for r, d in enumerate(ranks):
        if nodes and devs[ranks[nodes[-1][0]]].host == devs[d].host:
            nodes[-1].append(r)
        else:
            nodes.append([r])
    for k, rs in enumerate(nodes):
        host = devs[ranks[rs[0]]].host
        index = [str(devs[ranks[r]].torch_device).partition(":") for r in rs]
        visible = (", CUDA_VISIBLE_DEVICES=" + ",".join(i for _, _, i in index)
                   if all(kind == "cuda" and i.isdigit() for kind, _, i in index) else "")
        which = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs[0]}-{rs[-1]}"
        lines.append(f"# node {k}: host {host}, {which} ({', '.join(devs[ranks[r]].name for r in rs)}){visible}")
    hosts = [devs[ranks[rs[0]]].host for rs in nodes]
    split = next((h for h in hosts if hosts.count(h) > 1), None)
    if split is not None:
        held = ", ".join(str(r) for r, d in enumerate(ranks) if devs[d].host == split)
        lines.append(f"# note: host {split} holds ranks {held}, which are not consecutive: torchrun numbers a "
                     "node's ranks consecutively, so start that host's processes by hand with these ranks")
    return lines


def _read_rank_devices(text: str, world: int) -> list[int] | None:
    """The ``# rank_devices`` line ``_rank_lines`` writes (None: ranks 0..world-1 run on devices 0..world-1)."""
    m = re.search(r"^# rank_devices = \[([^\]]*)\]", text, re.M)
    if m is None:
        return None
    try:
        ranks = [int(x) for x in m.group(1).split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"rank_devices [{m.group(1)}] must list device indices") from None
    if len(ranks) != world:
        raise PlanError(f"rank_devices names {len(ranks)} devices, but the degrees make {world} ranks")
    twice = next((d for d in ranks if ranks.count(d) > 1 or d < 0), None)
    if twice is not None:
        raise PlanError(f"rank_devices names device {twice} twice" if twice >= 0 else
                        f"rank_devices names device {twice}: indices are >= 0")
    return ranks


def _header(plan: StagePlan, graph: CompGraph, what: str, lay: Layout, topology: DeviceTopology | None) -> list[str]:
    head = f"# {what}: placement-rl stage plan for graph '{graph.name}' (fingerprint {graph.fingerprint()[:16]})"
    if lay.moved:
        lines = [head, f"# {plan.num_stages} stage(s), {_snapped_step(plan, graph, lay, topology)}"]
    else:
        lines = [head, f"# {plan.num_stages} stage(s){_step_words(plan, graph, topology)}"]
    if "recompute_as_planned" in plan.meta:
        lines.append(f"# note: the plan recomputes {plan.meta['recompute_as_planned']} per stage; exported with "
                     f"'{lay.recompute}' in every stage (--uniform-recompute): less memory and a slower step than "
                     "planned")
    return lines + _rank_lines(lay, topology)


def to_torchtitan(plan: StagePlan, graph: CompGraph, *, snap: bool = False,
                  topology: DeviceTopology | None = None) -> str:
    """torchtitan job-config TOML (``[parallelism]``, ``[training]``) for ``plan`` (see the module docstring;
    ``topology`` prices a plan ``snap`` changed)."""
    lay = layout(plan, graph, snap=snap)
    sched = _TITAN_SCHEDULES[plan.schedule]
    if plan.schedule == "zb1p" and lay.virtual == 2 and lay.num_stages > lay.pp:
        from placement_rl.executor._mesh import parallel_dims

        if parallel_dims(plan).layout == "v":
            sched = "ZBVZeroBubble"
    fsdp = lay.sharding == "fsdp"
    lines = _header(plan, graph, "torchtitan job config", lay, topology) + [
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


def _decoder_note(graph: CompGraph) -> list[str]:
    """A note where the graph says it is no GPT-style decoder (``pretrain_gpt.py`` trains one)."""
    hf = graph.meta.get("hf") or {}
    task = hf.get("task")
    if not task or task == "causal_lm":
        return []
    return [f"# note: graph '{graph.name}' is {hf.get('class') or hf.get('model_type')} ({task}), not a GPT-style "
            "decoder: the parallel settings carry over, pretrain_gpt.py's model and loss do not"]


def to_megatron(plan: StagePlan, graph: CompGraph, *, snap: bool = False,
                topology: DeviceTopology | None = None) -> str:
    """Megatron-LM command-line arguments for ``plan`` (see the module docstring), one per line (``topology``
    prices a plan ``snap`` changed)."""
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
    args += [("--num-layers", len(mods.layer)), ("--micro-batch-size", lay.micro_batch_size),
             ("--global-batch-size", lay.batch_size),
             ("--make-vocab-size-divisible-by", max(lay.vocab_divisible_by, 1))]
    lines = _header(plan, graph, "Megatron-LM arguments", lay, topology) + _decoder_note(graph) + [
        f"# data parallel: {lay.dp} ({'FSDP2' if lay.sharding == 'fsdp' else 'DDP'}); world size "
        f"{lay.dp * lay.pp * lay.tp}; {lay.virtual} virtual stage(s) per pipeline rank; 1F1B"
        + (" interleaved" if lay.virtual > 1 else "")]
    if lay.recompute == "full":  # every layer checkpointed: Megatron's uniform method, one layer per checkpoint
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif lay.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    body = [f"{k} {v}" for k, v in args]
    if untied_embeddings(graph):
        body.append("--untie-embeddings-and-output-weights")
    if lay.sharding == "fsdp":
        body.append("--use-torch-fsdp2")
    if lay.sequence_parallel:
        body.append("--sequence-parallel")
    return "\n".join(lines + [" \\\n".join(body), ""])


# ----------------------------------------------------------------------------------------------- back to a plan
def _plan(graph: CompGraph, parts: list[list[str]], *, tp: int, dp: int, pp: int, m: int, schedule: str,
          sharding: str, batch: int, vocab: int, recompute: str = "none", sp: bool = False,
          text: str = "") -> StagePlan:
    """The plan whose stages hold ``parts`` (module names of ``module_graph(graph)``), on ``graph``'s nodes."""
    fine = module_graph(graph)
    mods = modules(fine)
    stage_of: dict[str, int] = {}
    for s, ms in enumerate(parts):
        for k in ms:
            if k not in mods.order:
                raise PlanError(f"module '{k}' of stage {s} is not a module of graph '{graph.name}'")
            if k in stage_of:
                raise PlanError(f"module '{k}' is listed in stages {stage_of[k]} and {s}")
            stage_of[k] = s
    missing = [k for k in mods.order if k not in stage_of]
    if missing:
        raise PlanError(f"module '{missing[0]}' of graph '{graph.name}' is in no stage")
    son = group_stages(graph, _stage_of_node(fine, mods, stage_of), mods.key)
    w = dp * tp
    ranks = _read_rank_devices(text, w * pp) or list(range(w * pp))
    groups = tuple(tuple(ranks[(s % pp) * w:(s % pp + 1) * w]) for s in range(len(parts)))
    return StagePlan(son, groups, num_microbatches=m, schedule=schedule, batch_size=batch, sharding=sharding,
                     tp=(tp,) * len(parts), make_vocab_size_divisible_by=vocab, recompute=(recompute,) * len(parts),
                     sequence_parallel=sp)


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


def export_plan(plan: StagePlan, graph: CompGraph, fmt: str, *, snap: bool = False,
                topology: DeviceTopology | None = None, uniform: bool = False) -> str:
    """``to_torchtitan`` or ``to_megatron`` by name; ``uniform``: a plan whose stages recompute differently is
    exported with ``uniform_recompute`` (refused otherwise)."""
    if fmt not in FORMATS:
        raise PlanError(f"unknown export format '{fmt}' (choose one of {', '.join(FORMATS)})")
    if uniform:
        plan = uniform_recompute(plan)
    return (to_torchtitan if fmt == "torchtitan" else to_megatron)(plan, graph, snap=snap, topology=topology)


__all__ = ["FORMATS", "Layout", "Modules", "export_plan", "from_megatron", "from_torchtitan", "layout", "modules",
           "most_recompute", "to_megatron", "to_torchtitan", "uniform_recompute", "untied_embeddings"]
