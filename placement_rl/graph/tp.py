"""Tensor-parallel split annotations of a captured graph: which ops split, how, and what each TP degree adds.

``detect(graph) -> dict`` (JSON, stored in ``graph.meta["tp"]`` by ``capture``) finds, on an uncoarsened graph:

* **Megatron pairs**: a *row-parallel* GEMM ``R`` (weights split along its input features, output a partial
  sum all-reduced in forward) whose activation inputs come, through parameter-free ops only, from one or more
  *column-parallel* GEMMs (weights split along their output features): attention QKV (fused or not) -> output
  projection, with the per-head ops between them (scores, softmax, weighted sum) split by heads; MLP up (and
  gate) -> down. Found on the graph, not by name: walking back from ``R`` through parameter-free ops must end
  at GEMMs with parameters (the columns) or at sources that do not depend on the activations (masks,
  positions); every op fed by a column must feed only the pair; a norm or another parameterised op on the way
  means no pair. A GEMM is in at most one pair.
* **Vocabulary parallelism**: the largest embedding table is split by rows (vocab-parallel embedding: masked
  lookup, forward all-reduce of its output); the GEMM feeding the loss (the LM head, tied or not) is split by
  vocabulary (column-parallel), and the loss runs on vocab-sharded logits (Megatron's parallel cross-entropy:
  three all-reduces of one number per token).
* Everything else is **replicated** (norms, residual adds, dropout on the residual stream, position
  embeddings): every TP rank runs it in full. Sequence parallelism is not modelled.

Collectives per node (bytes at the graph's batch; each is an all-reduce over the TP group, every micro-batch):
``ar_fwd`` -- the row GEMM's output, the vocab-parallel embedding's output, the parallel cross-entropy's
``3 x tokens x 4`` bytes; ``ar_bwd`` -- the input gradient of each pair's columns (once per distinct input
tensor: Megatron's ``f`` operator) and of the LM head.

``dims``: the sizes a TP degree must divide -- every column's output features and row's input features
(derived from FLOPs and bytes: ``tokens = 2 out_bytes in_bytes / (F e^2)`` with ``e`` the parameter element
size), the vocabulary, and heads (the zoo model's ``n_heads`` / ``n_kv_heads`` where known, else derived from
the attention score / value matmuls when the graph has them; fused SDPA hides them: then ``heads`` is absent
and only the feature sizes are checked).

``annotation(graph) -> TPAnnotation`` gives per-node arrays (also for a coarsened graph, through
``graph.members``: a group's split fraction is that of its members' FLOPs / bytes); ``shard_graph(graph, t)``
is the graph one TP rank runs at degree ``t`` (split ops at their smaller shapes), priced by the same per-op
cost model; ``check_degree(graph, t)`` raises ``PlanError`` when ``t`` does not divide the split sizes or the
graph has nothing to split.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph

KINDS = ("replicated", "column", "row", "sharded", "vocab_embedding", "vocab_head", "vocab_loss")
REPLICATED, COLUMN, ROW, SHARDED, VOCAB_EMB, VOCAB_HEAD, VOCAB_LOSS = range(len(KINDS))
_SPLIT_OUT = (COLUMN, SHARDED, VOCAB_HEAD)  # kinds whose output tensor is sharded over the TP group
SCHEMA_VERSION = 1


def _classes(graph: CompGraph) -> list[str]:
    from placement_rl.cost.op_classes import op_class

    return [op_class(t, p, f) for t, p, f in zip(graph.op_types, graph.param_bytes, graph.fwd_flops)]


_MATMULS = ("linear", "addmm", "mm", "matmul", "conv1d_hf")


def _is_matmul(op_type: str) -> bool:
    """A captured GEMM op (``aten`` linear / addmm / mm / matmul); synthetic op types never split."""
    name = op_type.rsplit(".", 1)[-1].lower()
    return name.removesuffix("_default") in _MATMULS


def _elem_size(graph: CompGraph) -> float:
    pb, n = graph.meta.get("param_bytes"), graph.meta.get("num_params")
    if isinstance(pb, (int, float)) and isinstance(n, (int, float)) and n > 0 and pb > 0:
        return float(pb) / float(n)
    return 4.0


def _in_bytes(graph: CompGraph, v: int) -> tuple[int, float]:
    """(producer, bytes) of ``v``'s largest activation input (-1, 0 when it has none)."""
    lo, hi = graph.pred_ptr[v], graph.pred_ptr[v + 1]
    best, by = -1, 0.0
    for k in range(lo, hi):
        e = int(graph.pred_eid[k])
        if graph.edge_bytes[e] > by:
            best, by = int(graph.pred_idx[k]), float(graph.edge_bytes[e])
    return best, by


def _linear_dims(graph: CompGraph, v: int, e: float) -> tuple[int, int, float] | None:
    """(in_features, out_features, tokens) of GEMM ``v`` from its FLOPs and bytes, or None."""
    _, ib = _in_bytes(graph, v)
    f, ob = float(graph.fwd_flops[v]), float(graph.out_bytes[v])
    if f <= 0 or ib <= 0 or ob <= 0:
        return None
    tokens = 2.0 * ob * ib / (f * e * e)
    if tokens < 0.5:
        return None
    return int(round(ib / (e * tokens))), int(round(ob / (e * tokens))), tokens


def _pair_cone(graph: CompGraph, r: int, cls: list[str], gemm: np.ndarray, taken: np.ndarray):
    """Columns and the ops between them and row candidate ``r``, or None when ``r`` closes no pair."""
    pp, pi = graph.pred_ptr, graph.pred_idx
    cone: set[int] = set()
    cols: set[int] = set()
    stack = [int(x) for x in pi[pp[r]:pp[r + 1]]]
    if not stack:
        return None
    while stack:
        u = stack.pop()
        if u in cone or u in cols:
            continue
        if gemm[u]:
            if taken[u]:
                return None
            cols.add(u)
            continue
        if graph.param_bytes[u] > 0 or cls[u] in ("norm", "embedding", "loss"):
            return None
        cone.add(u)
        stack.extend(int(x) for x in pi[pp[u]:pp[u + 1]])
    if not cols:
        return None
    # ops fed (transitively, inside the cone) by a column are sharded; the rest are sources (masks, positions)
    sp, si = graph.succ_ptr, graph.succ_idx
    sharded: set[int] = set()
    stack = [c for c in cols]
    while stack:
        u = stack.pop()
        for w in si[sp[u]:sp[u + 1]]:
            w = int(w)
            if w in cone and w not in sharded:
                sharded.add(w)
                stack.append(w)
    for u in list(cols) + list(sharded):
        for w in si[sp[u]:sp[u + 1]]:
            w = int(w)
            if w != r and w not in sharded:
                if graph.out_bytes[w] == 0 and sp[w + 1] == sp[w]:
                    continue  # a dead end without output (shape asserts): harmless
                return None  # a sharded tensor escapes the pair
    # r's activation inputs must all be sharded (a replicated input would need a scatter)
    if any(int(x) not in sharded and int(x) not in cols for x in pi[pp[r]:pp[r + 1]]):
        return None
    # a source op of the cone must not depend on the activations (it would need them replicated)
    for u in cone - sharded:
        if _depends_on_params(graph, u):
            return None
    return sorted(cols), sorted(sharded)


def _live_successors(graph: CompGraph, u: int) -> list[int]:
    """Successors of ``u`` except dead ends without output (shape asserts)."""
    sp = graph.succ_ptr
    return [int(w) for w in graph.successors(u) if graph.out_bytes[w] > 0 or sp[w + 1] > sp[w]]


def _depends_on_params(graph: CompGraph, u: int) -> bool:
    pp, pi = graph.pred_ptr, graph.pred_idx
    seen, stack = set(), [u]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if graph.param_bytes[x] > 0:
            return True
        stack.extend(int(y) for y in pi[pp[x]:pp[x + 1]])
    return False


def _head_dim(graph: CompGraph, sharded: list[int], cls: list[str], e: float) -> float | None:
    """Head size from the attention score matmul (``F = 2 B H S S hd``, out ``e B H S S``), if there is one."""
    for u in sharded:
        if cls[u] == "bmm" and graph.out_bytes[u] > 0 and graph.fwd_flops[u] > 0:
            succ = graph.successors(u)
            seen, frontier = set(), list(int(x) for x in succ)
            while frontier:  # through element-wise / view ops to a softmax: u computes attention scores
                w = frontier.pop()
                if w in seen or w not in sharded:
                    continue
                seen.add(w)
                if cls[w] == "softmax":
                    return e * float(graph.fwd_flops[u]) / (2.0 * float(graph.out_bytes[u]))
                if cls[w] in ("view", "ew", "ew_pass"):
                    frontier.extend(int(x) for x in graph.successors(w))
    return None


def detect(graph: CompGraph) -> dict[str, Any]:
    """TP split annotations of an uncoarsened graph (JSON-serialisable; see the module docstring)."""
    if graph.members is not None:
        raise PlanError(f"graph '{graph.name}' is coarsened: detect TP splits on the captured graph (capture "
                        "stores them in meta['tp'], which coarsening keeps)")
    cls = _classes(graph)
    n = graph.num_nodes
    e = _elem_size(graph)
    gemm = np.array([_is_matmul(graph.op_types[v]) and graph.param_bytes[v] > 0 and graph.fwd_flops[v] > 0
                     for v in range(n)], dtype=bool)
    kind = np.zeros(n, dtype=np.int64)
    taken = np.zeros(n, dtype=bool)
    ar_fwd, ar_bwd = np.zeros(n), np.zeros(n)
    pairs, divisors, head_dims = [], set(), []
    for r in graph.topo_order.tolist():
        if not gemm[r] or taken[r]:
            continue
        got = _pair_cone(graph, r, cls, gemm, taken)
        if got is None:
            continue
        cols, sharded = got
        if any(taken[c] or kind[c] != REPLICATED for c in cols) or any(kind[u] != REPLICATED for u in sharded):
            continue
        taken[cols] = True
        taken[r] = True
        kind[cols], kind[sharded], kind[r] = COLUMN, SHARDED, ROW
        ar_fwd[r] = graph.out_bytes[r]
        producers: dict[int, float] = {}
        for c in cols:
            src, by = _in_bytes(graph, c)
            producers[src] = max(producers.get(src, 0.0), by)
        ar_bwd[cols[0]] = sum(producers.values())
        hd = _head_dim(graph, sharded, cls, e)
        unit = 1
        if hd is not None and hd >= 1:
            unit = int(round(hd))
            head_dims.append(unit)
        for c in cols:
            dims = _linear_dims(graph, c, e)
            if dims is not None:
                divisors.add(max(dims[1] // unit, 1) if dims[1] % unit == 0 else dims[1])
        dims = _linear_dims(graph, r, e)
        if dims is not None:
            divisors.add(max(dims[0] // unit, 1) if dims[0] % unit == 0 else dims[0])
        pairs.append({"columns": [graph.names[c] for c in cols], "row": graph.names[r],
                      "sharded_ops": len(sharded), "head_dim": None if hd is None else unit})
    vocab = None
    # vocab-parallel LM head: the GEMM feeding the loss through views; the loss runs on sharded logits
    has_embedding = any(cls[v] == "embedding" and graph.param_bytes[v] > 0 for v in range(n))
    for loss in (v for v in range(n) if cls[v] == "loss" and (pairs or has_embedding)):
        path, u = [], loss
        while True:
            src, _ = _in_bytes(graph, u)
            if src < 0:
                break
            if cls[src] == "view" and kind[src] == REPLICATED and len(_live_successors(graph, src)) == 1:
                path.append(src)
                u = src
                continue
            break
        if src >= 0 and _is_matmul(graph.op_types[src]) and graph.fwd_flops[src] > 0 and kind[src] == REPLICATED \
                and len(_live_successors(graph, src)) == 1:
            dims = _linear_dims(graph, src, e)
            kind[src], kind[path], kind[loss] = VOCAB_HEAD, SHARDED, VOCAB_LOSS
            ar_bwd[src] = _in_bytes(graph, src)[1]
            if dims is not None:
                vocab = dims[1]
                ar_fwd[loss] = 3.0 * dims[2] * 4.0
            break
    embeds = [v for v in range(n) if cls[v] == "embedding" and graph.param_bytes[v] > 0]
    if embeds and (vocab is not None or pairs):
        big = max(embeds, key=lambda v: graph.param_bytes[v])
        kind[big] = VOCAB_EMB
        ar_fwd[big] = graph.out_bytes[big]
        if vocab is None and pairs:  # rows of the table: parameters / (e x hidden), hidden from a pair's tokens
            dims = _linear_dims(graph, graph.index[pairs[0]["row"]], e)
            if dims is not None and graph.out_bytes[big] > 0:
                hidden = graph.out_bytes[big] / (e * dims[2])
                vocab = int(round(graph.param_bytes[big] / (e * hidden)))
    if vocab:
        divisors.add(int(vocab))
    opts = graph.meta.get("zoo_options") or {}
    heads = {k: int(opts[k]) for k in ("n_heads", "n_kv_heads") if isinstance(opts.get(k), int)}
    divisors.update(heads.values())
    split = int((kind != REPLICATED).sum())
    note = "" if pairs or vocab else ("nothing to split: no column-parallel -> row-parallel GEMM pair and no "
                                      "vocabulary-parallel embedding / LM head; TP degree must be 1")
    return {"version": SCHEMA_VERSION,
            "nodes": {graph.names[v]: KINDS[kind[v]] for v in range(n) if kind[v] != REPLICATED},
            "ar_fwd": {graph.names[v]: float(ar_fwd[v]) for v in range(n) if ar_fwd[v] > 0},
            "ar_bwd": {graph.names[v]: float(ar_bwd[v]) for v in range(n) if ar_bwd[v] > 0},
            "pairs": pairs, "divisors": sorted(int(d) for d in divisors if d > 0), "heads": heads,
            "vocab": vocab, "split_nodes": split, "note": note}


@dataclass(frozen=True, eq=False)
class TPAnnotation:
    """Per-node TP arrays of a graph (N nodes). Shapes: float64 [N] unless noted.

    kind: int64 [N] (index into ``KINDS``; a coarsened group takes its most expensive member's kind);
    frac_flops / frac_params / frac_act / frac_out: share of the node's FLOPs, parameters, saved activations and
    output bytes that split over the TP group; ar_fwd / ar_bwd: all-reduce bytes per TP degree > 1 (whole batch);
    edge_split: float64 [E], share of each edge's bytes that is sharded.
    """

    kind: np.ndarray
    frac_flops: np.ndarray
    frac_params: np.ndarray
    frac_act: np.ndarray
    frac_out: np.ndarray
    ar_fwd: np.ndarray
    ar_bwd: np.ndarray
    edge_split: np.ndarray
    divisors: tuple[int, ...]
    heads: Mapping[str, int]
    vocab: int | None
    pairs: tuple[Mapping[str, Any], ...]
    note: str

    @property
    def splittable(self) -> bool:
        return bool((self.kind != REPLICATED).any())


_ANNOTATIONS: "weakref.WeakKeyDictionary[CompGraph, TPAnnotation]" = weakref.WeakKeyDictionary()


def annotation(graph: CompGraph) -> TPAnnotation:
    """The graph's TP annotation: ``meta["tp"]`` when capture stored it, else detected (uncoarsened graphs).
    Kept per graph object while it lives (graphs are immutable, so this never changes a result)."""
    got = _ANNOTATIONS.get(graph)
    if got is None:
        got = _ANNOTATIONS[graph] = _annotation(graph)
    return got


def _annotation(graph: CompGraph) -> TPAnnotation:
    data = graph.meta.get("tp")
    if not isinstance(data, Mapping) or data.get("version") != SCHEMA_VERSION:
        if graph.members is not None:
            return _empty(graph, f"graph '{graph.name}' is coarsened and carries no TP annotation (meta['tp']); "
                                 "capture it again so that the annotation is recorded before coarsening")
        data = detect(graph)
    return _from_dict(graph, data)


def _empty(graph: CompGraph, note: str) -> TPAnnotation:
    z = np.zeros(graph.num_nodes)
    return TPAnnotation(np.zeros(graph.num_nodes, dtype=np.int64), z, z, z, z, z, z, np.zeros(graph.num_edges), (),
                        {}, None, (), note)


def _from_dict(graph: CompGraph, data: Mapping[str, Any]) -> TPAnnotation:
    kinds = {str(k): KINDS.index(v) for k, v in dict(data.get("nodes", {})).items() if v in KINDS}
    arf, arb = dict(data.get("ar_fwd", {})), dict(data.get("ar_bwd", {}))
    groups = graph.members if graph.members is not None else tuple((nm,) for nm in graph.names)
    n = graph.num_nodes
    kind = np.zeros(n, dtype=np.int64)
    ff, fp, fa, fo = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    a_f, a_b = np.zeros(n), np.zeros(n)
    for v, grp in enumerate(groups):
        ks = [kinds.get(m, REPLICATED) for m in grp]
        a_f[v] = sum(float(arf.get(m, 0.0)) for m in grp)
        a_b[v] = sum(float(arb.get(m, 0.0)) for m in grp)
        if len(grp) == 1:
            k = ks[0]
            kind[v] = k
            ff[v] = 1.0 if k in (COLUMN, ROW, SHARDED, VOCAB_HEAD, VOCAB_LOSS) else 0.0
            fp[v] = 1.0 if k in (COLUMN, ROW, VOCAB_HEAD, VOCAB_EMB) else 0.0
            fa[v] = 1.0 if k in (COLUMN, ROW, SHARDED, VOCAB_HEAD, VOCAB_LOSS) else 0.0
            fo[v] = 1.0 if k in _SPLIT_OUT else 0.0
            continue
        # a coarsened group: counted by members here; by their sizes below where the members' graph is kept
        split = [k != REPLICATED for k in ks]
        share = sum(split) / len(ks)
        kind[v] = max(set(ks), key=ks.count) if any(split) else REPLICATED
        ff[v] = fa[v] = share
        fp[v] = 1.0 if any(k in (COLUMN, ROW, VOCAB_HEAD, VOCAB_EMB) for k in ks) else 0.0
        fo[v] = 1.0 if ks[-1] in _SPLIT_OUT else 0.0
    if graph.members is not None:  # the graph it was coarsened from, where kept: each member's share by its size
        from placement_rl.graph.coarsen import member_graph

        fine = member_graph(graph)
        if fine is not None:
            g0, gof = fine
            a0 = annotation(g0)

            def share(w: np.ndarray, f: np.ndarray) -> np.ndarray:
                num, den = np.bincount(gof, weights=w * f, minlength=n), np.bincount(gof, weights=w, minlength=n)
                return np.divide(num, den, out=np.zeros(n), where=den > 0)

            ff, fp, fa = share(g0.fwd_flops, a0.frac_flops), share(g0.param_bytes, a0.frac_params), \
                share(g0.act_bytes, a0.frac_act)
    edge_split = fo[graph.edges[:, 0]] if graph.num_edges else np.zeros(0)
    return TPAnnotation(kind, ff, fp, fa, fo, a_f, a_b, edge_split,
                        tuple(int(d) for d in data.get("divisors", ())), dict(data.get("heads", {})),
                        data.get("vocab"), tuple(data.get("pairs", ())), str(data.get("note", "")))


def check_degree(graph: CompGraph, tp: int, ann: TPAnnotation | None = None) -> None:
    """``PlanError`` unless TP degree ``tp`` can split ``graph`` (1 always can)."""
    if tp == 1:
        return
    ann = ann if ann is not None else annotation(graph)
    if not ann.splittable:
        raise PlanError(f"TP degree {tp} on graph '{graph.name}': {ann.note or 'nothing to split'}")
    bad = [d for d in ann.divisors if d % tp]
    if bad:
        what = []
        for k, h in ann.heads.items():
            if h % tp:
                what.append(f"{k}={h}")
        if ann.vocab and ann.vocab % tp:
            what.append(f"vocab={ann.vocab}")
        rest = [d for d in bad if d not in ann.heads.values() and d != ann.vocab]
        if rest:
            what.append(f"split sizes {rest[:3]}")
        raise PlanError(f"TP degree {tp} does not divide {', '.join(what)} of graph '{graph.name}'; choose a TP "
                        f"degree dividing {math.gcd(*ann.divisors)}")


def shard_graph(graph: CompGraph, tp: int, ann: TPAnnotation | None = None) -> CompGraph:
    """What one rank of a TP group of ``tp`` runs: split ops at 1/tp of their FLOPs, parameters, saved
    activations and sharded outputs / edges (the same nodes and edges, so costs line up node for node)."""
    ann = ann if ann is not None else annotation(graph)
    if tp == 1:
        return graph
    k = 1.0 / tp

    def scale(arr: np.ndarray, frac: np.ndarray) -> np.ndarray:
        return arr * (1.0 - frac + frac * k)

    meta = dict(graph.meta)
    from placement_rl.graph.coarsen import FINE_KEY, member_graph

    fine = member_graph(graph)
    if fine is not None:  # a coarsened graph: its members are sharded too, so a group stays priced as their sum
        from placement_rl.graph.io import graph_to_dict

        meta[FINE_KEY] = graph_to_dict(shard_graph(fine[0], tp))
    return graph.replace(fwd_flops=scale(graph.fwd_flops, ann.frac_flops),
                         bwd_flops=scale(graph.bwd_flops, ann.frac_flops),
                         param_bytes=scale(graph.param_bytes, ann.frac_params),
                         act_bytes=scale(graph.act_bytes, ann.frac_act),
                         out_bytes=scale(graph.out_bytes, ann.frac_out),
                         edge_bytes=scale(graph.edge_bytes, ann.edge_split),
                         name=f"{graph.name}@tp{tp}", meta=meta)


def without_tp(graph: CompGraph) -> CompGraph:
    """``graph`` with an empty TP annotation: planners then search DP x PP only (the no-TP baseline of a study)."""
    return graph.replace(meta={**graph.meta, "tp": {"version": SCHEMA_VERSION, "nodes": {}, "ar_fwd": {}, "ar_bwd": {},
                                                    "pairs": [], "divisors": [], "heads": {}, "vocab": None,
                                                    "split_nodes": 0, "note": "TP disabled for this study"}})


def max_degree(graph: CompGraph, limit: int = 64) -> int:
    """Largest TP degree <= ``limit`` that ``check_degree`` accepts (1 when nothing splits)."""
    ann = annotation(graph)
    if not ann.splittable:
        return 1
    best = 1
    for t in range(2, limit + 1):
        if all(d % t == 0 for d in ann.divisors):
            best = t
    return best


__all__ = ["KINDS", "TPAnnotation", "annotation", "check_degree", "detect", "max_degree", "shard_graph", "without_tp"]
