"""The tensor-parallel checks a plan passes before a deployment's ranks start (``placement_rl.executor.distributed``):
no element-wise op between the vocab-parallel LM head and the loss, no vocab-parallel word table tied to a GEMM TP
does not split by vocabulary, and with sequence parallelism a sequence the TP degree divides (the norms and values
it shards: ``sequence_parallel_names``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph


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
