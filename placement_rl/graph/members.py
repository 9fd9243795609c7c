"""The graph a coarsened graph was made from, kept in its ``meta["member_graph"]`` (a graph JSON object, so it
survives ``to_json``): ``member_graph`` returns it with each original node's group, and the cost model prices a
group as the sum of its members (``placement_rl.cost.resolve``); TP sharding shards it alongside
(``placement_rl.graph.tp``). A graph written before that record was kept, or changed since, is priced group by
group. ``member_record`` builds the record (``placement_rl.graph.coarsen`` stores it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placement_rl.graph.io import graph_from_dict, graph_to_dict
from placement_rl.graph.ir import CompGraph

__all__ = ["FINE_KEY", "member_graph", "member_record"]

FINE_KEY = "member_graph"  # meta key: the original graph (graph JSON object) a coarsened graph was made from
_RECORDS: dict[int, tuple[dict, "CompGraph | None"]] = {}  # record -> (record, its graph): built or parsed once
_MEMBER_CACHE: dict[tuple[int, int], tuple] = {}  # (record, members) -> (record, members, (graph, group of node))


def member_graph(graph: CompGraph) -> "tuple[CompGraph, np.ndarray] | None":
    """``(original graph, group of each original node)`` of a coarsened graph that carries the graph it was made
    from (``meta["member_graph"]``, written by ``coarsen``) and still matches it: every original node in exactly
    one group and each group's FLOPs and parameter bytes the sum of its members'. None for an uncoarsened graph,
    one without that record (written before it was kept) or one changed since (e.g. split for tensor
    parallelism). The cost model prices a group as the sum of its members (``placement_rl.cost.resolve``)."""
    fine = graph.meta.get(FINE_KEY)
    if graph.members is None or not isinstance(fine, dict):
        return None
    key = (id(fine), id(graph.members))
    hit = _MEMBER_CACHE.get(key)
    if hit is None or hit[0] is not fine or hit[1] is not graph.members:
        hit = _remember(_MEMBER_CACHE, key, (fine, graph.members, _members_of(graph, fine)))
    if hit[2] is None:
        return None
    g, gof = hit[2]
    n = graph.num_nodes
    for k in ("fwd_flops", "param_bytes"):  # checked on every call: the arrays may have been replaced
        if not np.allclose(np.bincount(gof, weights=getattr(g, k), minlength=n), getattr(graph, k), rtol=1e-6,
                           atol=1e-3):
            return None
    return g, gof


def member_record(fine: CompGraph) -> dict:
    """The ``meta["member_graph"]`` record of ``fine`` (its graph JSON object), remembered with ``fine`` itself so
    that ``member_graph`` reads it back without parsing it."""
    record = graph_to_dict(fine)
    _remember(_RECORDS, id(record), (record, fine))
    return record


def _remember(cache: dict, key: Any, value: tuple) -> tuple:
    if len(cache) > 256:
        cache.clear()
    cache[key] = value
    return value


def _record_graph(graph: CompGraph, record: dict) -> "CompGraph | None":
    hit = _RECORDS.get(id(record))
    if hit is None or hit[0] is not record:  # read from a file or another process: parsed once
        try:
            g = graph_from_dict(record, where=f"graph '{graph.name}' meta.member_graph")
        except Exception:  # noqa: BLE001 -- a damaged record: price the groups themselves
            g = None
        hit = _remember(_RECORDS, id(record), (record, g))
    return hit[1]


def _members_of(graph: CompGraph, fine: dict) -> "tuple[CompGraph, np.ndarray] | None":
    g = _record_graph(graph, fine)
    if g is None:
        return None
    index = {nm: i for i, nm in enumerate(g.names)}
    gof = np.full(g.num_nodes, -1, dtype=np.int64)
    for k, grp in enumerate(graph.members):
        for nm in grp:
            i = index.get(nm, -1)
            if i < 0 or gof[i] >= 0:
                return None
            gof[i] = k
    return (g, gof) if (gof >= 0).all() else None
