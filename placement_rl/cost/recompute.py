"""Activation recomputation per pipeline stage (``StagePlan.recompute``): what it costs and what it frees.

Per stage, one of ``RECOMPUTE``:

* ``none``: every op keeps what its backward needs (``act_bytes``).
* ``selective`` (Megatron-LM's selective recomputation): each attention's *core* -- the per-head ops between the
  fused / separate QKV projections and the output projection (scores, scale, mask, softmax, dropout, the weighted
  sum; the sharded ops of an attention pair in ``graph.tp``) -- is checkpointed.
* ``full``: each transformer layer (``graph.layers``: ``blocks.<i>``) is checkpointed (Megatron's full recomputation,
  uniform method, one layer per checkpoint); ops outside the layers (embedding, head, loss) keep theirs.

A checkpointed region R, priced as ``torch.utils.checkpoint`` runs it (non-reentrant, early stop, torch's
default):

* time: its forward runs again during the backward, just before R's own backward, but only as far as it must to
  regenerate what R's ops saved (``repeated``): the recomputation stops at the first moment every saved tensor is
  back, which is at the last op of R (in program order) that saves one, before that op runs when it saves only its
  inputs (autograd saves an op's inputs before the kernel runs, its outputs after: a GEMM, a GELU), after it when
  it saves an output (softmax, a norm's statistics, a dropout mask); R's ops after that op are not run again. So a
  layer (full) repeats everything up to its MLP's first GEMM and activation, not the second GEMM nor the residual
  add after it, and an attention core (selective) repeats scores, scale, mask and softmax, not the weighted sum. Each
  repeated node adds its forward time (variable and fixed part) to its backward time, on every micro-batch;
* memory: R keeps only the tensors entering it from outside (once per producer, its largest edge: the layer's input
  hidden state; the core's q, k, v and mask) instead of its ops' saved activations; while R's backward runs, one
  micro-batch's activations of R exist again: at least R's whole ``act_bytes`` (its last node's backward runs first,
  with all of them back). This transient is priced with the gradient buffers of a backward
  (``cost.backward_memory``): at a node of R, R's activations up to that node plus the node's own gradient buffers,
  the stage's largest for one micro-batch (and at least its largest region's ``act_bytes``) added at each backward on
  top of the micro-batches in flight (GPipe: m; 1F1B: ``min(m, S - s)``), so the simulated peak is
  ``state + in-flight x (kept + received) + transient``, each transient counted once (a recomputed region's
  activations and the loss's gradients never coexist: the larger).

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
GEMMS = ("linear", "matmul", "bmm", "mm", "addmm", "baddbmm", "einsum", "conv")  # op types (prefixes) that save
# their inputs, whatever the storage accounting of ``act_bytes`` credits them with
OUTPUT_SAVERS = frozenset({"softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm", "rms_norm",
                           "instance_norm", "dropout", "relu", "tanh", "sigmoid", "exp"})  # save a tensor they make


def regions(graph: CompGraph, mode: str) -> np.ndarray:
    """Region id per node (-1: kept as is) of recomputation ``mode`` (``selective`` or ``full``)."""
    got = _REGIONS.setdefault(graph, {})
    if mode not in got:
        got[mode] = _layers(graph) if mode == "full" else _cores(graph)
    return got[mode]


def repeated(graph: CompGraph, rid: np.ndarray) -> np.ndarray:
    """Bool [N]: the nodes of the regions ``rid`` (region id per node, -1 outside) that the non-reentrant checkpoint
    runs again in the backward (see the module docstring): in program order, each region's nodes up to its last
    node that saves a tensor for backward (``act_bytes > 0`` or a GEMM), that node included only when it saves a
    tensor it makes (``OUTPUT_SAVERS``)."""
    out = np.zeros(graph.num_nodes, dtype=bool)
    if not rid.size or rid.max() < 0:
        return out
    order = graph.topo_order[rid[graph.topo_order] >= 0]
    ops = graph.op_types
    saves = {int(v): graph.act_bytes[v] > 0 or str(ops[v]).startswith(GEMMS) for v in order}
    last: dict[int, int] = {}
    for v in order:
        if saves[int(v)]:
            last[int(rid[v])] = int(v)
    stop = {r: (v, str(ops[v]) in OUTPUT_SAVERS) for r, v in last.items()}
    done: set[int] = set()
    for v in order:
        r = int(rid[v])
        if r in done or r not in stop:
            continue
        end, keep = stop[r]
        if int(v) == end:
            out[v] = keep
            done.add(r)
        else:
            out[v] = True
    return out


def repeated_of(graph: CompGraph, mode: str) -> np.ndarray:
    """``repeated`` of every whole region of recomputation ``mode`` (cached per graph)."""
    got = _REGIONS.setdefault(graph, {})
    key = f"{mode}:repeated"
    if key not in got:
        got[key] = repeated(graph, regions(graph, mode))
    return got[key]


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
                    act: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
    """``(fvar, ffix, bvar, bfix)`` ``[D, N]``, ``act [N]`` with each stage's recomputation applied (copies) and
    ``again [N]``: per node of a recomputed region, the region's activations that exist again while the node's
    backward runs: those of the region's nodes up to it in topological order (the later ones' backward ran first
    and freed them), so the region's last node holds all of them (0 outside the regions; the pipeline kernel adds
    it to the node's gradient buffers, see the module docstring).

    ``graph``: the plan's graph (regions); ``run(s)``: the graph one rank of stage ``s`` runs (a TP shard: its edge
    bytes), node for node the same; ``act``: per-rank saved activations."""
    fvar, ffix, bvar, bfix = times
    bvar, bfix, act = bvar.copy(), bfix.copy(), act.copy()
    again_bytes = np.zeros(graph.num_nodes)
    pos = np.empty(graph.num_nodes, dtype=np.int64)
    pos[graph.topo_order] = np.arange(graph.num_nodes)
    for s, mode in enumerate(plan.recompute):
        if mode == "none":
            continue
        rid = regions(graph, mode)
        here = plan.stage_of_node == s
        nodes = np.flatnonzero(here & (rid >= 0))
        if not nodes.size:
            continue
        mine = np.unique(rid[nodes])
        local = np.where(np.isin(rid, mine) & here, rid, -1)
        whole = not (np.isin(rid, mine) & ~here).any()  # no region of the stage is cut by a stage boundary
        again = np.flatnonzero(repeated_of(graph, mode) & here if whole else repeated(graph, local))
        bvar[:, again] += fvar[:, again]
        bfix[:, again] += ffix[:, again]
        kept = kept_bytes(run(s), local)
        by = nodes[np.lexsort((pos[nodes], rid[nodes]))]  # region by region, each in topological order
        upto = np.cumsum(act[by])
        starts = np.flatnonzero(np.concatenate([[True], rid[by][1:] != rid[by][:-1]]))
        before = np.repeat(upto[starts] - act[by][starts], np.diff(np.append(starts, by.size)))
        again_bytes[by] = upto - before
        act[nodes] = 0.0
        first: dict[int, int] = {}  # a node of each region holds its bytes (the kernel sums a stage's nodes)
        for v in nodes:
            first.setdefault(int(rid[v]), int(v))
        for r in mine:
            act[first[int(r)]] += kept[r]
        in_flight(plan, s)  # refuses a schedule it is not modelled with
    return (fvar, ffix, bvar, bfix), act, again_bytes


__all__ = ["GEMMS", "OUTPUT_SAVERS", "RECOMPUTE", "apply_recompute", "in_flight", "kept_bytes", "regions", "repeated",
           "repeated_of"]
