"""Coarsening: contract a ``CompGraph`` into an acyclic graph of groups (GDP/Placeto-style grouping).

Algorithm (``coarsen``):

1. **Label** every node with its ``module_path`` truncated to ``depth`` dot-separated components
   (``layer1.0.conv1`` at depth 2 -> ``layer1.0``); a node with an empty path gets its own label.
2. **Group** nodes in topological order. A node joins the latest group of its label; with
   ``fold_param_free`` a parameter-free node (``param_bytes == 0``: relu, add, view, ...) instead joins its
   own label's group when that group feeds it, else the group of its producer sending the most bytes.
   A join is **refused** when it would close a cycle in the group graph (the group already reaches
   another group that feeds the node, e.g. a module used twice or a residual around a shared module);
   the node then opens a new group with its label (the group name gets an index, ``mlp#1``).
   Because every step keeps the group graph acyclic, the result is acyclic by construction.
   (Cycle checks search only between the two groups' places in a maintained topological order of the group
   graph, ``placement_rl.graph._coarsen_reach``: exact, and near-linear in practice.)
3. **Fold** groups that hold no parameters into a neighbour (producer first, then consumer), cycle-safe.
   Folding is skipped for graphs without any parameters (it would collapse them).
4. With ``max_nodes``, repeatedly merge the cheapest group (fwd+bwd flops) into its cheapest adjacent
   group whose contraction keeps the graph acyclic, until at most ``max_nodes`` groups remain. When no such
   merge is left and the count is still over, the groups left share no edge (pieces of the graph that no edge
   joins, e.g. independent chains or isolated nodes): they are packed into ``max_nodes`` groups, the most
   expensive first into the cheapest group so far. The packing runs only when the merges along edges leave the
   count over: a graph those merges bring within it keeps exactly their groups.

``depth=None`` (automatic) tries depth 1, 2, ... (folding), then the depths without folding, then one
group per node (``meta["coarsen"]["depth"] == "node"``), and keeps the first candidate with at least
``target[0]`` groups, merged down to ``target[1]`` if it has more; a graph too small for the target gets
its finest candidate. So any graph with at least ``target[0]`` nodes lands inside ``target``.

Sums of ``fwd_flops``, ``bwd_flops``, ``param_bytes``, ``act_bytes`` and ``out_bytes`` are conserved
(a group's ``out_bytes`` is the sum of its members' outputs).

Edge rule: an edge ``A -> B`` between groups carries the bytes that cross from group A into group B.
Each producer node ``u`` in A sends its output to B once, however many members of B consume it:
``sent(u, B) = min(sum of bytes of u's edges into B, cap(u))`` with
``cap(u) = max(out_bytes[u], largest bytes on one of u's edges)``, so one tensor read by two members of
B counts once while distinct outputs of a multi-output op still add up. ``bytes(A -> B)`` is the sum of
``sent(u, B)`` over ``u`` in A. Edges inside a group vanish, so total ``edge_bytes`` shrinks.

The coarse graph keeps the graph it was made from in ``meta["member_graph"]`` (``placement_rl.graph.members``:
``member_graph`` returns it with each original node's group, and the cost model prices a group as the sum of its
members).

Output nodes are ordered topologically (ties: earliest original node first). ``members`` holds the
original node names (flattened when the input was itself coarsened); ``meta["original_names"]`` keeps
the original node order for ``expand_placement``.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from placement_rl.errors import GraphError
from placement_rl.graph._coarsen_reach import GroupOrder
from placement_rl.graph.ir import NODE_ARRAYS, CompGraph
from placement_rl.graph.members import FINE_KEY, member_graph, member_record

__all__ = ["coarsen", "expand_placement", "member_graph", "member_record"]



def coarsen(graph: CompGraph, *, depth: int | None = None, fold_param_free: bool = True,
            target: tuple[int, int] = (30, 500), max_nodes: int | None = None) -> CompGraph:
    """Group ``graph``'s nodes by module path into an acyclic ``CompGraph`` of groups.

    ``depth=None`` tries depths 1, 2, ... and takes the first whose group count reaches ``target[0]``;
    if it overshoots ``target[1]`` it is merged down to ``target[1]`` groups. When no depth reaches
    ``target[0]`` with folding, the depths are tried again without folding, then one group per node;
    if even that is too few, the candidate with the most groups is returned. ``max_nodes`` caps the
    group count (cycle-safe merges of the cheapest groups, then packing of the pieces no edge joins).
    ``meta["coarsen"]`` records what was chosen.
    """
    if not isinstance(graph, CompGraph):
        raise GraphError(f"coarsen expects a CompGraph, got {type(graph).__name__}")
    lo, hi = _check_target(target)
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1):
        raise GraphError(f"coarsen: depth must be an integer >= 1 or None (automatic), got {depth!r}")
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, (int, np.integer))
                                  or max_nodes < 1):
        raise GraphError(f"coarsen: max_nodes must be an integer >= 1 or None, got {max_nodes!r}")
    fold = bool(fold_param_free) and bool((graph.param_bytes > 0).any())
    parts = [p.split(".") if p else [] for p in graph.module_paths]
    cap = max_nodes
    if depth is not None:
        chosen: tuple[int | str, bool] = (int(depth), fold)
        q = _Quotient.build(graph, _labels(graph, parts, int(depth)), fold)
    else:
        max_depth = max(1, max(len(p) for p in parts))
        plan: list[tuple[int | str, bool]] = [(d, fold) for d in range(1, max_depth + 1)]
        if fold:
            plan += [(d, False) for d in range(1, max_depth + 1)]
        plan.append(("node", False))
        best: tuple[tuple[int | str, bool], _Quotient] | None = None
        for d, f in plan:
            q = _Quotient.build(graph, _labels(graph, parts, d), f)
            if best is None or q.count > best[1].count or q.count >= lo:
                best = ((d, f), q)
            if q.count >= lo:
                if q.count > hi:
                    cap = hi if max_nodes is None else min(hi, max_nodes)
                break
        assert best is not None
        chosen, q = best
    if cap is not None and q.count > cap:
        q.merge_down(cap)
    return _assemble(graph, q, depth=chosen[0], fold=chosen[1])


def expand_placement(coarse: CompGraph, device_of_group: Sequence[int] | np.ndarray) -> np.ndarray:
    """Map a device per coarse node back to a device per original node, in the original node order."""
    dev = np.asarray(device_of_group)
    if dev.shape != (coarse.num_nodes,):
        raise GraphError(f"expand_placement: expected one device per group ({coarse.num_nodes}), "
                         f"got an array of shape {dev.shape}")
    if coarse.members is None:
        raise GraphError(f"expand_placement: graph '{coarse.name}' has no members; pass a graph made by coarsen()")
    original = coarse.meta.get("original_names")
    if original is None:
        original = [m for grp in coarse.members for m in grp]
    where = {m: gi for gi, grp in enumerate(coarse.members) for m in grp}
    if len(where) != len(original) or any(nm not in where for nm in original):
        raise GraphError(f"expand_placement: members of '{coarse.name}' do not partition "
                         "meta['original_names']; the graph was edited after coarsening")
    return dev[np.fromiter((where[nm] for nm in original), dtype=np.int64, count=len(original))]


# --------------------------------------------------------------------------------------------- helpers
def _check_target(target: tuple[int, int]) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in target)
    except (TypeError, ValueError):
        raise GraphError(f"coarsen: target must be a pair (min_groups, max_groups), got {target!r}") from None
    if lo < 1 or hi < lo:
        raise GraphError(f"coarsen: target {target!r} must satisfy 1 <= min_groups <= max_groups")
    return lo, hi


def _labels(graph: CompGraph, parts: list[list[str]], depth: int | str) -> list[tuple[str, str]]:
    """(group key, module path) per node; a node without a module path (or at depth "node") keys by name."""
    if depth == "node":
        return [("\x00" + nm, p) for nm, p in zip(graph.names, graph.module_paths)]
    out = []
    for nm, p in zip(graph.names, parts):
        path = ".".join(p[:depth])
        out.append((path if path else "\x00" + nm, path))
    return out


class _Quotient:
    """Mutable group graph: group of every node plus weighted group adjacency (kept acyclic).

    ``order`` keeps a topological position per group (``pos``, valid for ``succ``) that prunes the cycle checks.
    """

    def __init__(self, group_of: list[int], keys: list[tuple[str, str]], succ: list[dict[int, float]],
                 graph: CompGraph, pos: list[int]) -> None:
        self.group_of = group_of
        self.keys = keys
        self.succ = succ
        self.pred: list[dict[int, float]] = [{} for _ in succ]
        for a, nb in enumerate(succ):
            for b, w in nb.items():
                self.pred[b][a] = w
        self.order = GroupOrder(self.succ, self.pred, pos)
        gof = np.asarray(group_of, dtype=np.int64)
        g = len(succ)
        self.cost = np.bincount(gof, weights=graph.fwd_flops + graph.bwd_flops, minlength=g).tolist()
        self.params = np.bincount(gof, weights=graph.param_bytes, minlength=g).tolist()
        self.host = list(range(g))
        self.alive = [True] * g
        self.count = g

    # -- construction (steps 2 and 3 of the module docstring)
    @classmethod
    def build(cls, graph: CompGraph, labels: list[tuple[str, str]], fold: bool) -> "_Quotient":
        pp, pi, pe = graph.pred_ptr.tolist(), graph.pred_idx.tolist(), graph.pred_eid.tolist()
        eb, params = graph.edge_bytes.tolist(), graph.param_bytes.tolist()
        group_of = [-1] * graph.num_nodes
        keys: list[tuple[str, str]] = []
        succ: list[dict[int, float]] = []
        pred: list[set[int]] = []
        order = GroupOrder(succ, pred)
        latest: dict[str, int] = {}
        for w in graph.topo_order.tolist():
            sent: dict[int, float] = {}
            for k in range(pp[w], pp[w + 1]):
                gp = group_of[pi[k]]
                sent[gp] = sent.get(gp, 0.0) + eb[pe[k]]
            own = latest.get(labels[w][0])
            if fold and params[w] == 0 and sent:
                cands = [own] if own in sent else []
                cands += sorted(sent, key=lambda x: (-sent[x], -x))
                if own is not None:
                    cands.append(own)
            else:
                cands = [] if own is None else [own]
            chosen = -1
            for c in dict.fromkeys(cands):
                # w may join c unless c reaches one of w's other feeders
                if not order.reaches(c, [g for g in sent if g != c]):
                    chosen = c
                    break
            if chosen < 0:
                chosen = len(keys)
                keys.append(labels[w])
                succ.append({})
                pred.append(set())
                order.add()
                latest[labels[w][0]] = chosen
            group_of[w] = chosen
            for gp, b in sent.items():
                if gp != chosen:
                    succ[gp][chosen] = succ[gp].get(chosen, 0.0) + b
                    pred[chosen].add(gp)
            order.place_after(chosen, sent)
        q = cls(group_of, keys, succ, graph, order.pos)
        if fold:
            q._fold_param_free()
        return q

    def _fold_param_free(self) -> None:
        for a in range(len(self.alive)):
            if not self.alive[a] or self.params[a] > 0:
                continue
            preds = sorted(self.pred[a], key=lambda x: (-self.pred[a][x], -x))
            succs = sorted(self.succ[a], key=lambda x: (-self.succ[a][x], x))
            for b in preds + succs:
                if self.safe(a, b):
                    self.merge(into=b, other=a)
                    break

    def merge_down(self, max_nodes: int) -> None:
        """Merge the cheapest group into its cheapest safe neighbour until ``max_nodes`` groups remain; pieces of the
        graph that no edge joins are then packed together (``merge_pieces``)."""
        heap = [(self.cost[a], a) for a in range(len(self.alive)) if self.alive[a]]
        heapq.heapify(heap)
        while self.count > max_nodes and heap:
            c, a = heapq.heappop(heap)
            if not self.alive[a] or c != self.cost[a]:
                continue
            nbrs = {**self.pred[a], **self.succ[a]}
            for b in sorted(nbrs, key=lambda x: (self.cost[x], -nbrs[x], x)):
                if self.safe(a, b):
                    keep, gone = (a, b) if (self.cost[a], self.params[a]) > (self.cost[b], self.params[b]) else (b, a)
                    self.merge(into=keep, other=gone)
                    heapq.heappush(heap, (self.cost[keep], keep))
                    break
        if self.count > max_nodes:
            self.merge_pieces(max_nodes)

    def merge_pieces(self, max_nodes: int) -> None:
        """Pack the groups left into ``max_nodes`` groups, the most expensive first into the cheapest so far.

        Called when ``merge_down`` found no safe merge left: a group with successors can always merge with its
        successor placed first in ``order`` (no path through a third group reaches that one), and a group with only
        predecessors with its predecessor placed last, so the groups left share no edge (pieces of the graph that
        no edge joins) and any two merge without closing a cycle."""
        left = sorted((a for a in range(len(self.alive)) if self.alive[a]), key=lambda a: (-self.cost[a], a))
        bins = [(self.cost[a], a) for a in left[:max_nodes]]
        heapq.heapify(bins)
        for b in left[max_nodes:]:
            _, a = heapq.heappop(bins)
            keep, gone = (a, b) if (self.cost[a], self.params[a]) > (self.cost[b], self.params[b]) else (b, a)
            self.merge(into=keep, other=gone)
            heapq.heappush(bins, (self.cost[keep], keep))

    # -- graph operations
    def safe(self, a: int, b: int) -> bool:
        """Contracting ``a`` and ``b`` keeps the group graph acyclic (no path between them via a third group)."""
        reaches = self.order.reaches
        if b in self.succ[a]:
            return len(self.succ[a]) == 1 or len(self.pred[b]) == 1 or not reaches(a, (b,), skip=b)
        if a in self.succ[b]:
            return len(self.succ[b]) == 1 or len(self.pred[a]) == 1 or not reaches(b, (a,), skip=a)
        return not reaches(a, (b,)) and not reaches(b, (a,))

    def merge(self, *, into: int, other: int) -> None:
        a, b = into, other
        plan = self.order.plan_contract(a, b)
        for x, w in self.succ[b].items():
            del self.pred[x][b]
            if x != a:
                self.succ[a][x] = self.succ[a].get(x, 0.0) + w
                self.pred[x][a] = self.pred[x].get(a, 0.0) + w
        for x, w in self.pred[b].items():
            del self.succ[x][b]
            if x != a:
                self.pred[a][x] = self.pred[a].get(x, 0.0) + w
                self.succ[x][a] = self.succ[x].get(a, 0.0) + w
        self.succ[b], self.pred[b] = {}, {}
        self.cost[a] += self.cost[b]
        self.params[a] += self.params[b]
        self.alive[b] = False
        self.host[b] = a
        self.count -= 1
        self.order.finish_contract(a, plan)

    def final_groups(self) -> np.ndarray:
        """Current group id of every node (resolving merges)."""
        host = self.host
        for g in range(len(host)):
            r = g
            while host[r] != r:
                r = host[r]
            while host[g] != r:
                host[g], g = r, host[g]
        return np.asarray(host, dtype=np.int64)[np.asarray(self.group_of, dtype=np.int64)]


def _assemble(graph: CompGraph, q: _Quotient, *, depth: int | str, fold: bool) -> CompGraph:
    n = graph.num_nodes
    raw = q.final_groups()
    ids, gof = np.unique(raw, return_inverse=True)
    g = len(ids)
    src, dst = graph.edges[:, 0], graph.edges[:, 1]
    # Order groups topologically; among ready groups the one holding the earliest original node first.
    first = np.full(g, n, dtype=np.int64)
    np.minimum.at(first, gof, np.arange(n))
    cross = gof[src] != gof[dst]
    pair = np.unique(gof[src[cross]] * g + gof[dst[cross]])
    order = _kahn(g, pair // g, pair % g, first)
    rank = np.empty(g, dtype=np.int64)
    rank[order] = np.arange(g)
    gof = rank[gof]
    # Edge bytes: each producer's output crosses into a consumer group once (see module docstring).
    u, v, b = src[cross], gof[dst[cross]], graph.edge_bytes[cross]
    cap = graph.out_bytes.copy()
    if graph.num_edges:
        np.maximum.at(cap, src, graph.edge_bytes)
    uv, inv = np.unique(u * g + v, return_inverse=True)
    sent = np.minimum(np.bincount(inv, weights=b, minlength=len(uv)), cap[uv // g])
    ab, inv2 = np.unique(gof[uv // g] * g + uv % g, return_inverse=True)
    edge_bytes = np.bincount(inv2, weights=sent, minlength=len(ab))
    edges = np.stack([ab // g, ab % g], axis=1) if len(ab) else np.zeros((0, 2), dtype=np.int64)
    # Members (original names, flattened), module paths, names, op types.
    inner = graph.members if graph.members is not None else [(nm,) for nm in graph.names]
    members: list[list[str]] = [[] for _ in range(g)]
    for i in range(n):
        members[gof[i]].extend(inner[i])
    key_of_group = [None] * g
    for old, new in zip(ids.tolist(), rank.tolist()):
        key_of_group[new] = q.keys[old]
    work = graph.fwd_flops + graph.bwd_flops
    best = np.full(g, -1, dtype=np.int64)
    for i in np.lexsort((-np.arange(n), graph.param_bytes, work)).tolist():
        best[gof[i]] = i  # last write wins: the most expensive member (ties: more params, earlier node)
    names = _group_names([k[0][1:] if k[0].startswith("\x00") else k[0] for k in key_of_group])
    original = graph.meta.get("original_names")
    if original is None:
        original = [m for grp in inner for m in grp]
    fine = graph.meta.get(FINE_KEY)
    if fine is None:  # the graph the groups' members name, kept so that a group is priced as its members' sum
        fine = member_record(graph)
    meta = {**graph.meta, FINE_KEY: fine, "original_names": list(original),
            "coarsen": {"depth": depth, "fold_param_free": fold, "source_nodes": n,
                        "source_name": graph.name}}
    if "tied" in meta:  # users of a shared parameter -> their groups (a parameter inside one group is not tied)
        index = {nm: i for i, nm in enumerate(graph.names)}
        try:
            ties = [{**t, "nodes": list(dict.fromkeys(names[gof[index[nm]]] if nm in index else nm
                                                      for nm in t["nodes"]))} for t in meta.pop("tied")]
        except (TypeError, KeyError):
            raise GraphError(f"graph '{graph.name}': meta['tied'] must be a list of {{'bytes': B, 'nodes': [names]}} "
                             "objects") from None
        if any(len(t["nodes"]) > 1 for t in ties):
            meta["tied"] = [t for t in ties if len(t["nodes"]) > 1]
    return CompGraph(
        names=tuple(names),
        op_types=tuple(graph.op_types[int(i)] for i in best),
        module_paths=tuple(k[1] for k in key_of_group),
        **{k: np.bincount(gof, weights=getattr(graph, k), minlength=g) for k in NODE_ARRAYS},
        edges=edges, edge_bytes=edge_bytes, name=graph.name, members=tuple(tuple(m) for m in members),
        meta=meta)


def _kahn(g: int, s: np.ndarray, d: np.ndarray, prio: np.ndarray) -> np.ndarray:
    indeg = np.bincount(d, minlength=g).tolist()
    succ: list[list[int]] = [[] for _ in range(g)]
    for a, b in zip(s.tolist(), d.tolist()):
        succ[a].append(b)
    pr = prio.tolist()
    ready = [(pr[i], i) for i in range(g) if indeg[i] == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        _, a = heapq.heappop(ready)
        out.append(a)
        for b in succ[a]:
            indeg[b] -= 1
            if indeg[b] == 0:
                heapq.heappush(ready, (pr[b], b))
    if len(out) != g:  # pragma: no cover - the construction keeps the group graph acyclic
        raise GraphError("coarsen produced a cyclic group graph; please report this graph")
    return np.asarray(out, dtype=np.int64)


def _group_names(labels: list[str]) -> list[str]:
    """``label`` where unique, else ``label#k`` numbered in group order; always unique."""
    total: dict[str, int] = {}
    for lb in labels:
        total[lb] = total.get(lb, 0) + 1
    seen: dict[str, int] = {}
    taken = {lb for lb in labels if total[lb] == 1}
    out = []
    for lb in labels:
        if total[lb] == 1:
            out.append(lb)
            continue
        k = seen.get(lb, 0)
        while f"{lb}#{k}" in taken:
            k += 1
        seen[lb] = k + 1
        taken.add(f"{lb}#{k}")
        out.append(f"{lb}#{k}")
    return out
