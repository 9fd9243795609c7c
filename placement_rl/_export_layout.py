"""A ``StagePlan`` at module granularity (``Layout``: what torchtitan and Megatron-LM both need; see
``placement_rl.export``'s module doc), its recomputation made one for the whole model, and, for the readers, the
plan whose stages hold given modules."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.export_modules import fill_stages, member_plan, split_note
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.layers import Modules, modules
from placement_rl.plans import RECOMPUTE, StagePlan, check_interleaved, graph_batch_size


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
    check_priced(plan, coarse)
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


def check_priced(plan: StagePlan, graph: CompGraph) -> None:
    """``PlanError`` for what ``evaluate`` refuses: recomputation with interleaved 1F1B (not priced:
    ``cost.recompute.in_flight``) and sequence parallelism on a sequence a TP degree does not divide
    (``StagePlan.check_sequence``, as deploy)."""
    if plan.schedule == "interleaved1f1b" and any(r != "none" for r in plan.recompute):
        raise PlanError(f"recomputation with schedule 'interleaved1f1b' is not modelled: use 1f1b, or recompute "
                        f"'none' (the plan recomputes {list(plan.recompute)})")
    plan.check_sequence(graph)


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
