"""Activation recomputation per pipeline stage (``StagePlan.recompute``): what it costs and what it frees.

Per stage, one of ``RECOMPUTE``:

* ``none``: every op keeps what its backward needs (``act_bytes``).
* ``selective`` (Megatron-LM's selective recomputation): each attention's *core* -- the per-head ops between the
  fused / separate QKV projections and the output projection (scores, scale, mask, softmax, dropout, the weighted
  sum; the sharded ops of an attention pair in ``graph.tp``) -- is checkpointed.
* ``full``: each transformer layer (``graph.layers``: ``blocks.<i>``) is checkpointed (Megatron's full recomputation,
  uniform method, one layer per checkpoint); ops outside the layers (embedding, head, loss) keep theirs.

A checkpointed region R, priced as ``torch.utils.checkpoint`` runs it (non-reentrant):

* time: its forward runs again during the backward, just before R's own backward: every node of R adds its forward
  time (variable and fixed part) to its backward time, on every micro-batch;
* memory: R keeps only the tensors entering it from outside (once per producer, its largest edge: the layer's input
  hidden state; the core's q, k, v and mask) instead of its ops' saved activations; while R's backward runs, one
  micro-batch's activations of R exist again: the stage's largest region's ``act_bytes`` for one micro-batch, added
  to the stage's peak. In the pipeline kernel's terms (``cur_mb = act / (m p)`` per micro-batch in flight) the
  transient is spread over the in-flight micro-batches of the stage (GPipe: m; 1F1B: ``min(m, S - s)``), so the
  simulated peak is ``state + in-flight x (kept + received) + transient``.

Not modelled: ``interleaved1f1b`` with recomputation (several stages per group: refused), recomputation of a
coarsened graph's groups that span layers (kept whole: not recomputed), selective recomputation of a coarsened graph
(refused: the attention's ops are gone), the recomputed forward's launch overhead being any cheaper than the first.
"""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import RECOMPUTE

_REGIONS: "weakref.WeakKeyDictionary[CompGraph, dict[str, np.ndarray]]" = weakref.WeakKeyDictionary()


def regions(graph: CompGraph, mode: str) -> np.ndarray:
    """Region id per node (-1: kept as is) of recomputation ``mode`` (``selective`` or ``full``)."""
    got = _REGIONS.setdefault(graph, {})
    if mode not in got:
        got[mode] = _layers(graph) if mode == "full" else _cores(graph)
    return got[mode]


def _layers(graph: CompGraph) -> np.ndarray:
    from placement_rl.graph.layers import modules

    try:
        mods = modules(graph)
    except PlanError:
        raise PlanError(f"full recomputation checkpoints each layer, and graph '{graph.name}' has no repeated "
                        "layers (module paths like 'layers.0')") from None
    return np.array([mods.layer.get(k, -1) if k is not None else -1 for k in mods.key], dtype=np.int64)


def _cores(graph: CompGraph) -> np.ndarray:
    from placement_rl.graph import tp as tpmod

    if graph.members is not None:
        raise PlanError(f"selective recomputation needs the attention's ops: graph '{graph.name}' is coarsened; use "
                        "the captured graph or full recomputation")
    ann = tpmod.annotation(graph)
    out = np.full(graph.num_nodes, -1, dtype=np.int64)
    for r, pair in enumerate(p for p in ann.pairs if p.get("head_dim")):
        row = graph.index[pair["row"]]
        stack = [graph.index[c] for c in pair["columns"]]
        while stack:  # the sharded ops between the pair's columns and its row: the attention's core
            u = stack.pop()
            for w in graph.successors(u):
                w = int(w)
                if w != row and ann.kind[w] == tpmod.SHARDED and out[w] < 0:
                    out[w] = r
                    stack.append(w)
    if (out < 0).all():
        raise PlanError(f"graph '{graph.name}' has no attention core (scores / softmax between a QKV projection and "
                        "its output projection) for selective recomputation")
    return out


def kept_bytes(graph: CompGraph, rid: np.ndarray) -> np.ndarray:
    """Per region: bytes of the tensors entering it from outside, once per producer (its largest such edge)."""
    n_reg = int(rid.max()) + 1 if rid.size and rid.max() >= 0 else 0
    out = np.zeros(n_reg)
    if not graph.num_edges or not n_reg:
        return out
    src, dst = graph.edges[:, 0], graph.edges[:, 1]
    into = (rid[dst] >= 0) & (rid[src] != rid[dst])
    best: dict[tuple[int, int], float] = {}
    for e in np.flatnonzero(into):
        key = (int(rid[dst[e]]), int(src[e]))
        best[key] = max(best.get(key, 0.0), float(graph.edge_bytes[e]))
    for (r, _), b in best.items():
        out[r] += b
    return out


def in_flight(plan, stage: int) -> int:
    """Micro-batches a stage holds at once in the pipeline kernel's schedule."""
    m, s = int(plan.num_microbatches), plan.num_stages
    if plan.schedule not in ("gpipe", "1f1b"):
        raise PlanError(f"recomputation with schedule '{plan.schedule}' is not modelled: use gpipe or 1f1b")
    return m if plan.schedule == "gpipe" else min(m, s - stage)


def apply_recompute(plan, graph: CompGraph, run: Callable[[int], CompGraph], times: tuple[np.ndarray, ...],
                    act: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """``(fvar, ffix, bvar, bfix)`` ``[D, N]`` and ``act [N]`` with each stage's recomputation applied (copies).

    ``graph``: the plan's graph (regions); ``run(s)``: the graph one rank of stage ``s`` runs (a TP shard: its edge
    bytes), node for node the same; ``act``: per-rank saved activations."""
    fvar, ffix, bvar, bfix = times
    bvar, bfix, act = bvar.copy(), bfix.copy(), act.copy()
    for s, mode in enumerate(plan.recompute):
        if mode == "none":
            continue
        rid = regions(graph, mode)
        nodes = np.flatnonzero((plan.stage_of_node == s) & (rid >= 0))
        if not nodes.size:
            continue
        bvar[:, nodes] += fvar[:, nodes]
        bfix[:, nodes] += ffix[:, nodes]
        mine = np.unique(rid[nodes])
        local = np.where(np.isin(rid, mine) & (plan.stage_of_node == s), rid, -1)
        kept = kept_bytes(run(s), local)
        freed = np.bincount(rid[nodes], weights=act[nodes], minlength=kept.size)
        act[nodes] = 0.0
        first: dict[int, int] = {}  # a node of each region holds its bytes (the kernel sums a stage's nodes)
        for v in nodes:
            first.setdefault(int(rid[v]), int(v))
        for r in mine:
            act[first[int(r)]] += kept[r]
        worst = int(mine[np.argmax(freed[mine])])
        act[first[worst]] += freed[worst] / in_flight(plan, s)
    return (fvar, ffix, bvar, bfix), act


__all__ = ["RECOMPUTE", "apply_recompute", "in_flight", "kept_bytes", "regions"]
