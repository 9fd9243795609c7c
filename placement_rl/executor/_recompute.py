"""Activation recomputation of a deployed stage: each checkpointed region of the plan (``cost.recompute``: a layer
for ``full``, an attention's core for ``selective``) outlined from the stage's ``fx.GraphModule`` into a submodule
run under ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved), as the cost model prices it.

``regions_of(plan, graph)`` (in the parent, from the captured graph): per stage, the node names of each region it
checkpoints (written to the part directory). ``apply_recompute(gm, regions)`` (in each rank, after TP): fuses each
region's nodes (``torch.fx.passes.utils.fuser_utils.fuse_by_partitions``: its inputs become the submodule's
arguments, the values it hands on its outputs) and wraps the submodule in :class:`Checkpointed`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from torch import fx, nn
from torch.utils.checkpoint import checkpoint

from placement_rl.graph.ir import CompGraph

RENAMED = "tp_renamed"  # gm.meta key: exported node name -> the node that replaced it (``_tp.apply_tp``)


class Checkpointed(nn.Module):
    """Runs ``inner`` under non-reentrant activation checkpointing: only its inputs are kept for backward."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return checkpoint(self.inner, *args, use_reentrant=False)


def regions_of(plan, graph: CompGraph) -> dict[str, list[list[str]]]:
    """Stage index (as a string, JSON) -> the node names of each region it checkpoints, in program order."""
    from placement_rl.cost.recompute import regions

    out: dict[str, list[list[str]]] = {}
    for s, mode in enumerate(plan.recompute):
        if mode == "none":
            continue
        rid = regions(graph, mode)
        mine = (plan.stage_of_node == s) & (rid >= 0)
        out[str(s)] = [[graph.names[v] for v in graph.topo_order if mine[v] and rid[v] == r]
                       for r in np.unique(rid[mine])]
    return out


def _convex(gm: fx.GraphModule, part: dict[fx.Node, None]) -> dict[fx.Node, None]:
    """``part`` plus every computing node on a path between two of its nodes (the program's ``getitem`` of a split,
    which the captured graph folds into the split), so that the outlined region has no cycle through the rest."""
    order = list(gm.graph.nodes)
    after: set[fx.Node] = set()
    for n in order:  # descendants of the region
        if n in part or any(a in part or a in after for a in n.all_input_nodes):
            after.add(n)
    before: set[fx.Node] = set()
    for n in reversed(order):  # ancestors of the region
        if n in part or any(u in part or u in before for u in n.users):
            before.add(n)
    out = dict(part)
    for n in order:
        if n in after and n in before and n not in out and n.op in ("call_function", "call_module"):
            out[n] = None
    return out


def apply_recompute(gm: fx.GraphModule, regions: Sequence[Sequence[str]]) -> int:
    """Outline each region of ``gm`` into a checkpointed submodule (in place); returns how many were."""
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    renamed = dict(gm.meta.get(RENAMED, {}))
    nodes = {n.name: n for n in gm.graph.nodes}
    parts = []
    for names in regions:
        got = [nodes.get(renamed.get(x, x)) for x in names]
        part = {n: None for n in got if n is not None and n.op in ("call_function", "call_module")}
        if part:
            parts.append(_convex(gm, part))
    if not parts:
        return 0
    fuse_by_partitions(gm, parts, prefix="recompute_")
    for i in range(len(parts)):
        name = f"recompute_{i}"
        setattr(gm, name, Checkpointed(getattr(gm, name)))
    gm.recompile()
    return len(parts)


def saved_bytes(module: nn.Module, inputs: Sequence[Any]) -> int:
    """Bytes autograd saves for backward in one forward of ``module`` (distinct storages, parameters excluded):
    the activation memory recomputation trades, measured independently of the allocator and the process."""
    import torch

    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    return int(sum(v for k, v in storages.items() if k not in params))


__all__ = ["Checkpointed", "RENAMED", "apply_recompute", "regions_of", "saved_bytes"]
