"""Back from a trainer's settings to a ``StagePlan`` (see ``placement_rl.export``'s module doc): the plan whose stages
hold the modules the settings list, on the devices of the ``# rank_devices`` line where the text has one."""

from __future__ import annotations

import re

from placement_rl._export_layout import _stage_of_node
from placement_rl.errors import PlanError
from placement_rl.export_modules import group_stages, module_graph
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.layers import modules
from placement_rl.plans import StagePlan


def _read_rank_devices(text: str, world: int) -> list[int] | None:
    """The ``# rank_devices`` line ``_export_header._rank_lines`` writes (None: ranks 0..world-1 run on devices
    0..world-1)."""
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
