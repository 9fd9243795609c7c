"""Downward-closed sets (ideals) of a DAG: the stage boundaries of a pipeline.

A stage plan with no backward edge is a chain of ideals ``{} = I_0 < I_1 < ... < I_S = V``: stage ``s`` is the
difference ``I_{s+1} minus I_s``, a contiguous set of the DAG (it contains every node on a path between two
of its nodes). The cuts of one topological order are the chains of its prefixes, a small part of this space
on a graph with parallel branches.

``enumerate_ideals(graph, limit=...)`` lists them all (smallest first; optionally only those that split no
colocation group) or returns None past ``limit``; ``ideal_bound(graph)`` is an upper bound on their number
(a greedy chain cover: an ideal is a prefix of every chain, so there are at most ``prod(len(chain) + 1)``);
``prefix_ideals(graph)`` is the fallback family, the prefixes of ``graph.topo_order`` (``prefix_count`` counts
them without the N^2 matrix).

Shapes (N nodes, K ideals): ``members`` bool [K, N], row 0 the empty set, row K-1 every node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from placement_rl.graph.ir import CompGraph


@dataclass(frozen=True, eq=False)
class IdealFamily:
    """Ideals a planner may cut at: ``members`` bool [K, N] (smallest first), whether they are all of the graph's
    ideals (``complete``), the upper bound on their number and a note saying what was done. ``members`` is None
    where the family was only counted (``counted``: too many to search, so not built)."""

    members: np.ndarray | None
    complete: bool
    bound: int
    note: str
    counted: int = 0

    @property
    def count(self) -> int:
        return self.counted if self.members is None else int(self.members.shape[0])


def ideal_bound(graph: CompGraph) -> int:
    """Upper bound on the number of ideals: ``prod(len(c) + 1)`` over a greedy chain cover of the DAG (a node
    extends the chain whose last node is its latest ancestor in topological order). Ancestor sets are bit masks over
    topological positions, so that latest chain end is the highest bit they share with the mask of chain ends."""
    pp, pi = graph.pred_ptr, graph.pred_idx
    order = graph.topo_order.tolist()
    rank = [0] * graph.num_nodes
    for k, v in enumerate(order):
        rank[v] = k
    anc: list[int] = [0] * graph.num_nodes  # bit rank[u] set for each ancestor u
    ends = 0  # bit rank[u] set for each node u that ends a chain
    length: dict[int, int] = {}  # rank of a chain's last node -> the chain's length
    for k, v in enumerate(order):
        for u in pi[pp[v]:pp[v + 1]].tolist():
            anc[v] |= anc[u] | (1 << rank[u])
        shared = anc[v] & ends
        tail = shared.bit_length() - 1
        length[k] = length.pop(tail) + 1 if shared else 1
        ends ^= (1 << k) | (1 << tail if shared else 0)
    bound = 1
    for n in length.values():
        bound *= n + 1
    return bound


def magnitude(x: int) -> str:
    """``x`` in 3 digits, or its power of ten past floats (a chain-cover bound of thousands of chains)."""
    return f"{x:.3g}" if x < 1e300 else f"~1e{int(math.log10(x))}"


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
    if len(out) > limit:
        return None
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
                if len(out) + len(nxt) > limit:  # a level may hold far more sets than ``limit``: stop now
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
    return members[_prefixes_kept(graph, colocate)]


def prefix_count(graph: CompGraph, colocate: Sequence[Sequence[int]] = ()) -> int:
    """How many prefixes ``prefix_ideals`` keeps, without building them (N^2 booleans: 400 MB at 20,000 nodes)."""
    return int(_prefixes_kept(graph, colocate).sum())


def _prefixes_kept(graph: CompGraph, colocate: Sequence[Sequence[int]]) -> np.ndarray:
    """bool [N + 1]: whether the prefix of each length splits no colocation group (the prefixes of a length past
    the group's first node and up to its last split it)."""
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topo_order] = np.arange(graph.num_nodes)
    keep = np.ones(graph.num_nodes + 1, dtype=bool)
    for grp in colocate:
        if len(grp) > 1:
            at = position[list(grp)]
            keep[at.min() + 1:at.max() + 1] = False
    return keep


def prefix_family(graph: CompGraph, colocate: Sequence[Sequence[int]], bound: int, note: str,
                  searchable: Callable[[int], bool] = lambda count: True) -> IdealFamily:
    """The prefixes of one topological order (``prefix_ideals``) as a family that is not complete, built only
    where their count is ``searchable`` (else ``members`` None: a planner that would skip them needs no N^2 matrix,
    seconds and 400 MB at 20,000 nodes)."""
    count = prefix_count(graph, colocate)
    return IdealFamily(prefix_ideals(graph, colocate) if searchable(count) else None, False, bound, note, count)


def ideal_family(graph: CompGraph, *, limit: int, colocate: Sequence[Sequence[int]] = (),
                 searchable: Callable[[int], bool] = lambda count: True) -> IdealFamily:
    """All ideals when there are at most ``limit``, else the prefixes of one topological order (saying so; built
    only where their count is ``searchable``, ``prefix_family``)."""
    bound = ideal_bound(graph)
    members = enumerate_ideals(graph, limit=limit, colocate=colocate)
    if members is not None:
        return IdealFamily(members, True, bound, f"all {members.shape[0]} ideals of the graph (bound {bound})")
    return prefix_family(graph, colocate, bound,
                         f"more than {limit} ideals (chain-cover bound {magnitude(bound)}): searched the prefixes of "
                         "one topological order instead (coarsen the graph or raise the limit for the full space)",
                         searchable)


__all__ = ["IdealFamily", "enumerate_ideals", "enumerate_ideals_masks", "ideal_bound", "ideal_family", "magnitude",
           "prefix_count", "prefix_family", "prefix_ideals"]
