"""Downward-closed sets (ideals) of a DAG: the stage boundaries of a pipeline.

A stage plan with no backward edge is a chain of ideals ``{} = I_0 < I_1 < ... < I_S = V``: stage ``s`` is the
difference ``I_{s+1} minus I_s``, a contiguous set of the DAG (it contains every node on a path between two
of its nodes). The cuts of one topological order are the chains of its prefixes, a small part of this space
on a graph with parallel branches.

``enumerate_ideals(graph, limit=...)`` lists them all (smallest first; optionally only those that split no
colocation group) or returns None past ``limit``; ``ideal_bound(graph)`` is an upper bound on their number
(a greedy chain cover: an ideal is a prefix of every chain, so there are at most ``prod(len(chain) + 1)``);
``prefix_ideals(graph)`` is the fallback family, the prefixes of ``graph.topo_order``.

Shapes (N nodes, K ideals): ``members`` bool [K, N], row 0 the empty set, row K-1 every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from placement_rl.graph.ir import CompGraph


@dataclass(frozen=True, eq=False)
class IdealFamily:
    """Ideals a planner may cut at: ``members`` bool [K, N] (smallest first), whether they are all of the graph's
    ideals (``complete``), the upper bound on their number and a note saying what was done."""

    members: np.ndarray
    complete: bool
    bound: int
    note: str

    @property
    def count(self) -> int:
        return int(self.members.shape[0])


def ideal_bound(graph: CompGraph) -> int:
    """Upper bound on the number of ideals: ``prod(len(c) + 1)`` over a greedy chain cover of the DAG (a node
    extends the chain whose last node is its latest ancestor in topological order)."""
    ends: dict[int, int] = {}  # node that ends a chain -> chain length
    pp, pi = graph.pred_ptr, graph.pred_idx
    order = graph.topo_order.tolist()
    rank = {v: k for k, v in enumerate(order)}
    anc: list[int] = [0] * graph.num_nodes
    for v in order:
        for u in pi[pp[v]:pp[v + 1]].tolist():
            anc[v] |= anc[int(u)] | (1 << int(u))
        tails = [u for u in ends if anc[v] >> u & 1]
        tail = max(tails, key=rank.__getitem__) if tails else None
        ends[v] = (ends.pop(tail) + 1) if tail is not None else 1
    bound = 1
    for length in ends.values():
        bound *= length + 1
    return bound


def _masks(graph: CompGraph) -> list[int]:
    pp, pi = graph.pred_ptr, graph.pred_idx
    return [sum(1 << int(u) for u in pi[pp[v]:pp[v + 1]].tolist()) for v in range(graph.num_nodes)]


def _to_matrix(ideals: Sequence[int], n: int) -> np.ndarray:
    nbytes = max(1, (n + 7) // 8)
    raw = np.frombuffer(b"".join(x.to_bytes(nbytes, "little") for x in ideals), dtype=np.uint8)
    bits = np.unpackbits(raw.reshape(len(ideals), nbytes), axis=1, bitorder="little")
    return bits[:, :n].astype(bool)


def enumerate_ideals(graph: CompGraph, *, limit: int, colocate: Sequence[Sequence[int]] = ()) -> np.ndarray | None:
    """Every ideal (bool [K, N], smallest first), or None when there are more than ``limit`` (counting the
    ones a colocation group splits, which are dropped at the end: a stage never splits a group)."""
    out = _ideal_masks(_masks(graph), graph.num_nodes, limit)
    if out is None:
        return None
    groups = [sum(1 << int(v) for v in grp) for grp in colocate if len(grp) > 1]
    if groups:
        out = [x for x in out if all(x & g in (0, g) for g in groups)]
    return _to_matrix(out, graph.num_nodes)


def enumerate_ideals_masks(preds: Sequence[int], n: int, *, limit: int) -> np.ndarray | None:
    """``enumerate_ideals`` of a DAG given as the bit mask of each node's predecessors."""
    out = _ideal_masks(preds, n, limit)
    return None if out is None else _to_matrix(out, n)


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1, low
        mask ^= low


def _ideal_masks(preds: Sequence[int], n: int, limit: int) -> list[int] | None:
    """The ideals level by level (each level sorted), each carried with the mask of the nodes that may join it
    (those outside whose predecessors are all inside): a node joining changes that mask only at its successors."""
    succ: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for u, _ in _bits(preds[v]):
            succ[u].append(v)
    level = {0: sum(1 << v for v in range(n) if not preds[v])}
    out: list[int] = [0]
    while level:
        nxt: dict[int, int] = {}
        for ideal, free in level.items():
            for v, bit in _bits(free):
                grown = ideal | bit
                if grown in nxt:
                    continue
                more = free ^ bit
                for w in succ[v]:
                    if preds[w] & grown == preds[w]:
                        more |= 1 << w
                nxt[grown] = more
        if len(out) + len(nxt) > limit:
            return None
        level = nxt
        out.extend(sorted(nxt))
    return out


def prefix_ideals(graph: CompGraph, colocate: Sequence[Sequence[int]] = ()) -> np.ndarray:
    """The prefixes of ``graph.topo_order`` (bool [N + 1, N]), minus those that split a colocation group."""
    n = graph.num_nodes
    members = np.zeros((n + 1, n), dtype=bool)
    for k, v in enumerate(graph.topo_order.tolist()):
        members[k + 1:, v] = True
    keep = np.ones(n + 1, dtype=bool)
    for grp in colocate:
        if len(grp) > 1:
            inside = members[:, list(grp)].sum(axis=1)
            keep &= (inside == 0) | (inside == len(grp))
    return members[keep]


def ideal_family(graph: CompGraph, *, limit: int, colocate: Sequence[Sequence[int]] = ()) -> IdealFamily:
    """All ideals when there are at most ``limit``, else the prefixes of one topological order (saying so)."""
    bound = ideal_bound(graph)
    members = enumerate_ideals(graph, limit=limit, colocate=colocate)
    if members is not None:
        return IdealFamily(members, True, bound, f"all {members.shape[0]} ideals of the graph (bound {bound})")
    return IdealFamily(prefix_ideals(graph, colocate), False, bound,
                       f"more than {limit} ideals (chain-cover bound {bound:.3g}): searched the prefixes of one "
                       "topological order instead (coarsen the graph or raise the limit for the full space)")


__all__ = ["IdealFamily", "enumerate_ideals", "enumerate_ideals_masks", "ideal_bound", "ideal_family",
           "prefix_ideals"]
