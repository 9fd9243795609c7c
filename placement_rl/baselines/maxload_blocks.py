"""Blocks of a max-load instance (``placement_rl.baselines.maxload``): the units a split assigns to devices.

``blocks_of(inst)`` groups the nodes by colour class (a node without one is its own), merges an idle class (no
time, no bytes) whose edges all go to one other class into it (which keeps the optimum), and for contiguous splits
also the classes on one cycle of the ``precedence`` graph (forward edges, and the mirrored backward edges of a
class with no forward node): a contiguous split cannot separate them, a split of any shape can.
``merge_pendants`` coarsens further (a block beside its only neighbour), for graphs with too many ideals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placement_rl.graph.maxload_file import MaxLoadInstance


@dataclass(frozen=True, eq=False)
class Blocks:
    """Colour classes merged until their forward graph is a DAG: ``block`` per node, ``count``, ``preds`` (bit mask
    of each block's predecessor blocks), per-block sums, and ``free`` (blocks with no edge to another block, which
    the dynamic program leaves out and places last)."""

    block: np.ndarray
    count: int
    preds: list[int]
    acc: np.ndarray
    cpu: np.ndarray
    size: np.ndarray
    bad: np.ndarray
    free: np.ndarray


def _find(parent: list[int], x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def _classes(inst: MaxLoadInstance) -> tuple[np.ndarray, int]:
    """Colour class per node (``inst.colour``: a node without a ``colorClass`` has its own), numbered ``0 .. m-1``."""
    values, cls = np.unique(inst.colour, return_inverse=True)
    return cls.reshape(-1).astype(np.int64), len(values)


def precedence(inst: MaxLoadInstance, classes: tuple[np.ndarray, int] | None = None) -> list[tuple[int, int]]:
    """The node pairs ``(u, v)`` whose order a contiguous split keeps: every forward edge, and every backward edge
    touching a class with no forward node, mirrored (such a class sits where its gradient flow puts it).
    ``classes``: ``_classes(inst)`` where the caller has it."""
    cls, m = classes or _classes(inst)
    has_fwd = np.zeros(m, dtype=bool)
    has_fwd[cls[~inst.backward]] = True
    bwd = inst.backward
    out = []
    for u, v in inst.edges.tolist():
        if not bwd[u] and not bwd[v]:
            out.append((u, v))
        elif bwd[u] and bwd[v] and (not has_fwd[cls[u]] or not has_fwd[cls[v]]):
            out.append((v, u))
    return out


def blocks_of(inst: MaxLoadInstance, *, contiguous: bool = True) -> Blocks:
    """The colour classes, and a class with no time and no bytes whose every edge goes to one other class merged
    into it (beside it it costs nothing and saves its transfers, so the best split of either kind is kept); for
    ``contiguous`` splits also the classes on one cycle of the ``precedence`` graph merged (a contiguous split
    cannot separate them; a split of any shape can, so the searches for one and the bound use the classes)."""
    import networkx as nx

    cls, m = _classes(inst)
    g = nx.DiGraph()
    g.add_nodes_from(range(m))
    g.add_edges_from((int(cls[u]), int(cls[v])) for u, v in precedence(inst, (cls, m)) if cls[u] != cls[v])
    parent = list(range(m))
    if contiguous:
        for comp in nx.strongly_connected_components(g):
            comp = sorted(comp)
            for c in comp[1:]:
                parent[_find(parent, c)] = _find(parent, comp[0])
    _merge_idle(inst, cls, parent)
    roots = sorted({_find(parent, c) for c in range(m)})
    renum = {r: k for k, r in enumerate(roots)}
    of_class = np.array([renum[_find(parent, c)] for c in range(m)], dtype=np.int64)
    block = of_class[cls]
    count = len(roots)
    preds = [0] * count
    for a, b in g.edges():
        x, y = int(of_class[a]), int(of_class[b])
        if x != y:
            preds[y] |= 1 << x
    linked = np.zeros(count, dtype=bool)
    ends = block[inst.edges] if len(inst.edges) else np.zeros((0, 2), dtype=np.int64)
    cross = ends[ends[:, 0] != ends[:, 1]]
    linked[cross.ravel()] = True
    free = ~linked if linked.any() else np.arange(count) > 0
    acc = np.bincount(block, weights=inst.acc, minlength=count)
    cpu = np.bincount(block, weights=inst.cpu, minlength=count)
    size = np.bincount(block, weights=inst.size, minlength=count)
    bad = np.bincount(block, weights=(~inst.supported).astype(float), minlength=count)
    return Blocks(block, count, preds, acc, cpu, size, bad, free)


def _merge_idle(inst: MaxLoadInstance, cls: np.ndarray, parent: list[int]) -> None:
    """Merge (in ``parent``) every class with no time, no bytes and no node an accelerator cannot run whose edges
    all go to one other class into that class, until none is left."""
    load = np.abs(inst.acc) + np.abs(inst.cpu) + np.abs(inst.size) + (~inst.supported)
    busy: dict[int, bool] = {}
    for v in range(inst.num_nodes):
        r = _find(parent, int(cls[v]))
        busy[r] = busy.get(r, False) or bool(load[v] > 0)
    nbrs: dict[int, set[int]] = {}
    for u, v in inst.edges.tolist():
        a, b = _find(parent, int(cls[u])), _find(parent, int(cls[v]))
        if a != b:
            nbrs.setdefault(a, set()).add(b)
            nbrs.setdefault(b, set()).add(a)
    work = [r for r, ns in nbrs.items() if len(ns) == 1 and not busy.get(r, True)]
    while work:
        r = work.pop()
        if _find(parent, r) != r or len(nbrs.get(r, ())) != 1 or busy.get(r, True):
            continue
        (target,) = nbrs.pop(r)
        parent[r] = target
        nbrs[target].discard(r)
        if len(nbrs[target]) == 1 and not busy.get(target, True):
            work.append(target)


def merge_pendants(inst: MaxLoadInstance, blocks: Blocks) -> Blocks:
    """Coarser blocks: each block whose edges all go to one other block (with more than one neighbour itself)
    merged into it. A smaller space of splits (a block beside its only neighbour), for graphs with too many
    ideals."""
    ends = blocks.block[inst.edges] if len(inst.edges) else np.zeros((0, 2), dtype=np.int64)
    nbrs: list[set[int]] = [set() for _ in range(blocks.count)]
    for a, b in ends[ends[:, 0] != ends[:, 1]].tolist():
        nbrs[a].add(b)
        nbrs[b].add(a)
    target = np.arange(blocks.count)
    for b in range(blocks.count):
        if len(nbrs[b]) == 1:
            (t,) = nbrs[b]
            if len(nbrs[t]) > 1:
                target[b] = t
    _, renum = np.unique(target, return_inverse=True)
    count = int(renum.max()) + 1
    block = renum[blocks.block]
    preds = [0] * count
    for y in range(blocks.count):
        bits = blocks.preds[y]
        while bits:
            low = bits & -bits
            x = low.bit_length() - 1
            if renum[x] != renum[y]:
                preds[renum[y]] |= 1 << int(renum[x])
            bits ^= low

    def total(values):
        return np.bincount(renum, weights=values, minlength=count)

    free = np.bincount(renum, weights=(~blocks.free).astype(float), minlength=count) < 0.5
    return Blocks(block, count, preds, total(blocks.acc), total(blocks.cpu), total(blocks.size), total(blocks.bad),
                  free)


__all__ = ["Blocks", "blocks_of", "merge_pendants", "precedence"]
