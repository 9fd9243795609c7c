"""Tensor-parallel split annotations of a captured graph: which ops split, how, and what each TP degree adds.

``detect(graph) -> dict`` (``placement_rl.graph.tp_detect``: Megatron column / row pairs, vocabulary
parallelism, the collectives each adds and the sizes a degree must divide) is stored in ``graph.meta["tp"]`` by
``capture``. ``annotation(graph) -> TPAnnotation`` gives per-node arrays (also for a coarsened graph, through
``graph.members``: a group's split fraction is that of its members' FLOPs / bytes); ``shard_graph(graph, t)``
is the graph one TP rank runs at degree ``t`` (split ops at their smaller shapes), priced by the same per-op
cost model; ``check_degree(graph, t)`` raises ``PlanError`` when ``t`` does not divide the split sizes or the
graph has nothing to split, ``check_sequence(graph, t)`` when sequence parallelism cannot split its sequence.

**Vocabulary padding** (Megatron-LM's ``--make-vocab-size-divisible-by``, default 128): at every TP degree ``t``,
1 included (Megatron's ``_vocab_size_with_padding``), the vocabulary ``V`` is padded to
``padded_vocab(V, t, d) = ceil(V / (d t)) d t`` rows (GPT-2's 50,257: 50,304 at t = 1, 50,432 at t = 2, 50,688 at
t = 4, 51,200 at t = 8), so a vocabulary no degree divides still splits. ``shard_graph`` then prices the vocabulary
ops (vocab-parallel embedding table, LM head, the views and loss on vocab-sharded logits) at ``padded / V / t`` of
their size, at ``t = 1`` too (``shard_graph(graph, 1)`` is ``graph`` itself only where nothing is padded).
``d = 0`` switches padding off: a degree that does not divide ``V`` is then refused. A split size equal to ``V`` by
chance (a hidden size) is taken for the vocabulary.

**Saved activations**: a column-parallel GEMM (QKV, MLP up / gate) and the vocab-parallel LM head multiply their
whole, replicated input by a weight shard, and every TP rank keeps that input whole for its weight gradient
(Korthikanti et al. 2022: the QKV and MLP inputs are among the ``10 sbh`` a TP layer does not split). So
``shard_graph`` prices their saved activations whole without sequence parallelism and at ``1/t`` with it
(Megatron-SP keeps the sequence shard and all-gathers it again in backward): ``TPAnnotation.col_act``.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import FINE_KEY, member_graph, member_record
from placement_rl.graph.tp_detect import (COLUMN, KINDS, REPLICATED, ROW, SCHEMA_VERSION, SHARDED, VOCAB_EMB,
                                          VOCAB_HEAD, VOCAB_LOSS, detect)

_SPLIT_OUT = (COLUMN, SHARDED, VOCAB_HEAD)  # kinds whose output tensor is sharded over the TP group
_INPUT_ACT = (COLUMN, VOCAB_HEAD)  # kinds that save their replicated input: whole on every rank unless SP shards it
VOCAB_DIVISIBLE_BY = 128  # Megatron-LM's default --make-vocab-size-divisible-by


def padded_vocab(vocab: int, tp: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Megatron's padded vocabulary at TP degree ``tp``: the next multiple of ``divisible_by x tp``, at ``tp = 1``
    too (``vocab`` itself with padding off, ``divisible_by = 0``)."""
    if divisible_by <= 0:
        return int(vocab)
    unit = int(divisible_by) * max(int(tp), 1)
    return -(-int(vocab) // unit) * unit


@dataclass(frozen=True, eq=False)
class TPAnnotation:
    """Per-node TP arrays of a graph (N nodes). Shapes: float64 [N] unless noted.

    kind: int64 [N] (index into ``KINDS``; a coarsened group takes its most expensive member's kind);
    frac_flops / frac_params / frac_act / frac_out: share of the node's FLOPs, parameters, saved activations and
    output bytes that split over the TP group (saved activations: without sequence parallelism); ar_fwd / ar_bwd:
    all-reduce bytes per TP degree > 1 (whole batch); edge_split: float64 [E], share of each edge's bytes that is
    sharded; vocab_frac: float64 [4, N], share of the node's FLOPs / parameters / saved activations / output bytes
    that is split along the vocabulary (padded: ``padded_vocab``); edge_vocab: float64 [E], share of each edge's
    bytes split along the vocabulary; seq_frac: float64 [N], share of the node that Megatron's sequence parallelism
    splits along the sequence (the replicated token-wise ops between TP regions: norms, dropout, residual adds);
    col_act: float64 [N], share of the node's saved activations that is a column GEMM's or the LM head's
    replicated input (whole on every rank; split along the sequence with sequence parallelism).
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
    vocab_frac: np.ndarray | None = None
    edge_vocab: np.ndarray | None = None
    seq_frac: np.ndarray | None = None
    col_act: np.ndarray | None = None

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
            return _empty(graph, f"graph '{graph.name}' is coarsened and carries no TP annotation (meta['tp']), "
                                 "which is found on the ops before coarsening: a captured model records it (capture "
                                 "it again); a graph file carries it only in the meta.tp that capture writes "
                                 "(docs/tensor_parallel.md), else place the file uncoarsened "
                                 "(graph.coarsen.enabled=false) to detect it on the file's ops")
        data = detect(graph)
    return _from_dict(graph, data)


def _empty(graph: CompGraph, note: str) -> TPAnnotation:
    z = np.zeros(graph.num_nodes)
    return TPAnnotation(np.zeros(graph.num_nodes, dtype=np.int64), z, z, z, z, z, z, np.zeros(graph.num_edges), (),
                        {}, None, (), note, np.zeros((4, graph.num_nodes)), np.zeros(graph.num_edges), z, z)


def _from_dict(graph: CompGraph, data: Mapping[str, Any]) -> TPAnnotation:
    kinds = {str(k): KINDS.index(v) for k, v in dict(data.get("nodes", {})).items() if v in KINDS}
    arf, arb = dict(data.get("ar_fwd", {})), dict(data.get("ar_bwd", {}))
    groups = graph.members if graph.members is not None else tuple((nm,) for nm in graph.names)
    n = graph.num_nodes
    kind = np.zeros(n, dtype=np.int64)
    ff, fp, fa, fo, fc = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    a_f, a_b = np.zeros(n), np.zeros(n)
    sized = _member_shares(graph)
    for v, grp in enumerate(groups):
        ks = [kinds.get(m, REPLICATED) for m in grp]
        a_f[v] = sum(float(arf.get(m, 0.0)) for m in grp)
        a_b[v] = sum(float(arb.get(m, 0.0)) for m in grp)
        if len(grp) == 1:
            k = ks[0]
            kind[v] = k
            ff[v] = 1.0 if k in (COLUMN, ROW, SHARDED, VOCAB_HEAD, VOCAB_LOSS) else 0.0
            fp[v] = 1.0 if k in (COLUMN, ROW, VOCAB_HEAD, VOCAB_EMB) else 0.0
            fa[v] = 1.0 if k in (ROW, SHARDED, VOCAB_LOSS) else 0.0
            fc[v] = 1.0 if k in _INPUT_ACT else 0.0
            fo[v] = 1.0 if k in _SPLIT_OUT else 0.0
            continue
        split = [k != REPLICATED for k in ks]
        kind[v] = max(set(ks), key=ks.count) if any(split) else REPLICATED
        fo[v] = 1.0 if ks[-1] in _SPLIT_OUT else 0.0
        if sized is None:  # a coarsened group without its members' graph: the split share counted by members
            ff[v] = sum(split) / len(ks)
            fc[v] = sum(k in _INPUT_ACT for k in ks) / len(ks)
            fa[v] = ff[v] - fc[v]
            fp[v] = 1.0 if any(k in (COLUMN, ROW, VOCAB_HEAD, VOCAB_EMB) for k in ks) else 0.0
    if sized is not None:
        ff, fp, fa, fc = sized
    edge_split = fo[graph.edges[:, 0]] if graph.num_edges else np.zeros(0)
    vf = _vocab_shares(graph, groups, kinds, kind, np.stack([ff, fp, fa, fo]))
    edge_vocab = vf[3][graph.edges[:, 0]] if graph.num_edges else np.zeros(0)
    return TPAnnotation(kind, ff, fp, fa, fo, a_f, a_b, edge_split,
                        tuple(int(d) for d in data.get("divisors", ())), dict(data.get("heads", {})),
                        data.get("vocab"), tuple(data.get("pairs", ())), str(data.get("note", "")), vf, edge_vocab,
                        _seq_shares(graph, kind), fc)


def _seq_shares(graph: CompGraph, kind: np.ndarray) -> np.ndarray:
    """Share of each node that sequence parallelism splits: replicated nodes fed (transitively) by a row GEMM or the
    vocab-parallel embedding and feeding a column GEMM or the LM head -- the residual stream between TP regions
    (an uncoarsened graph's nodes whole; a coarsened group by its members' FLOPs where its members' graph is kept)."""
    n = graph.num_nodes
    if graph.members is not None:
        fine = member_graph(graph)
        if fine is None:
            return np.zeros(n)
        g0, gof = fine
        a0 = annotation(g0)
        w = g0.act_bytes + g0.out_bytes
        den = np.bincount(gof, weights=w, minlength=n)
        return np.divide(np.bincount(gof, weights=w * a0.seq_frac, minlength=n), den, out=np.zeros(n), where=den > 0)
    order = graph.topo_order.tolist()
    down = np.isin(kind, (ROW, VOCAB_EMB))
    for v in order:
        if not down[v] and any(down[int(u)] for u in graph.predecessors(v)):
            down[v] = kind[v] == REPLICATED
    up = np.isin(kind, (COLUMN, VOCAB_HEAD))
    for v in order[::-1]:
        if not up[v] and any(up[int(w)] for w in graph.successors(v)):
            up[v] = kind[v] == REPLICATED
    return ((kind == REPLICATED) & down & up).astype(np.float64)


_VOCAB_KINDS = (VOCAB_EMB, VOCAB_HEAD, VOCAB_LOSS)


def _vocab_shares(graph: CompGraph, groups: tuple[tuple[str, ...], ...], kinds: Mapping[str, int], kind: np.ndarray,
                  fracs: np.ndarray) -> np.ndarray:
    """``[4, N]`` share of each node's FLOPs / parameters / activations / output split along the vocabulary: the
    vocab-parallel embedding, LM head and loss and the sharded ops on the head -> loss path (whole nodes of an
    uncoarsened graph; a group's share from its members' graph where kept, else its vocab-kind members' count)."""
    n = graph.num_nodes
    if graph.members is None:
        on = np.isin(kind, _VOCAB_KINDS)
        stack = [int(v) for v in np.flatnonzero(kind == VOCAB_HEAD)]
        while stack:  # the views between the LM head and the loss carry vocab-sharded logits
            u = stack.pop()
            for w in graph.successors(u):
                w = int(w)
                if not on[w] and kind[w] == SHARDED:
                    on[w] = True
                    stack.append(w)
        return fracs * on[None, :]
    fine = member_graph(graph)
    if fine is not None:
        g0, gof = fine
        a0 = annotation(g0)
        out = np.zeros((4, n))
        for q, w in enumerate((g0.fwd_flops, g0.param_bytes, g0.act_bytes)):
            den = np.bincount(gof, weights=w, minlength=n)
            out[q] = np.divide(np.bincount(gof, weights=w * a0.vocab_frac[q], minlength=n), den, out=np.zeros(n),
                               where=den > 0)
        last = np.array([g0.index[grp[-1]] for grp in groups])
        out[3] = a0.vocab_frac[3][last]
        return out
    share = np.array([sum(kinds.get(m, REPLICATED) in _VOCAB_KINDS for m in grp) / len(grp) for grp in groups])
    return np.minimum(fracs, share[None, :])


def _member_shares(graph: CompGraph) -> tuple[np.ndarray, ...] | None:
    """``(frac_flops, frac_params, frac_act, col_act)`` of a coarsened graph's groups weighted by their members'
    sizes, from the graph it was coarsened from where it is kept (``placement_rl.graph.members``); None otherwise."""
    if graph.members is None:
        return None
    fine = member_graph(graph)
    if fine is None:
        return None
    g0, gof = fine
    a0, n = annotation(g0), graph.num_nodes

    def share(w: np.ndarray, f: np.ndarray) -> np.ndarray:
        num, den = np.bincount(gof, weights=w * f, minlength=n), np.bincount(gof, weights=w, minlength=n)
        return np.divide(num, den, out=np.zeros(n), where=den > 0)

    return (share(g0.fwd_flops, a0.frac_flops), share(g0.param_bytes, a0.frac_params),
            share(g0.act_bytes, a0.frac_act), share(g0.act_bytes, a0.col_act))


def check_degree(graph: CompGraph, tp: int, ann: TPAnnotation | None = None, *,
                 divisible_by: int = VOCAB_DIVISIBLE_BY) -> None:
    """``PlanError`` unless TP degree ``tp`` can split ``graph`` (1 always can). The vocabulary is padded
    (``padded_vocab``) unless ``divisible_by`` is 0: only then must ``tp`` divide it."""
    if tp == 1:
        return
    ann = ann if ann is not None else annotation(graph)
    if not ann.splittable:
        raise PlanError(f"TP degree {tp} on graph '{graph.name}': {ann.note or 'nothing to split'}")
    padded = bool(ann.vocab) and divisible_by > 0
    bad = [d for d in ann.divisors if d % tp and not (padded and d == ann.vocab)]
    if bad:
        what = []
        for k, h in ann.heads.items():
            if h % tp:
                what.append(f"{k}={h}")
        if ann.vocab and ann.vocab % tp and not padded:
            what.append(f"vocab={ann.vocab}")
        rest = [d for d in bad if d not in ann.heads.values() and d != ann.vocab]
        if rest:
            what.append(f"split sizes {rest[:3]}")
        keep = [d for d in ann.divisors if not (padded and d == ann.vocab)]
        hint = (" (or pad the vocabulary: make_vocab_size_divisible_by > 0)"
                if ann.vocab and ann.vocab % tp and not padded else "")
        g = math.gcd(*keep)
        choice = (f"choose a TP degree dividing {g}" if g > 1 else
                  "only TP degree 1 divides all its split sizes: use tp 1")
        raise PlanError(f"TP degree {tp} does not divide {', '.join(what)} of graph '{graph.name}'; {choice}{hint}")


def sequence_length(graph: CompGraph) -> int | None:
    """The token sequence length ``graph`` was captured at, as its metadata names it: a zoo model's ``seq_len``
    option, a ``graph=hf`` text model's ``seq_len``; None where unknown (an image model, a hand-written graph)."""
    hf = graph.meta.get("hf")
    text = hf if isinstance(hf, Mapping) and hf.get("task") != "image_classification" else None
    for where in (graph.meta.get("zoo_options"), text):
        s = where.get("seq_len") if isinstance(where, Mapping) else None
        if isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0:
            return int(s)
    return None


def check_sequence(graph: CompGraph, tp: int) -> None:
    """``PlanError`` when sequence parallelism at TP degree ``tp`` cannot split ``graph``'s sequence (its length, where
    the metadata names it: ``sequence_length``, not divisible by ``tp``): deploy refuses it before launch
    (``executor._tp_checks.check_sequence``), and Megatron's sequence scatter asserts it."""
    s = sequence_length(graph)
    if tp > 1 and s is not None and s % tp:
        raise PlanError(f"sequence length {s} of graph '{graph.name}' is not divisible by TP {tp}: sequence_parallel "
                        "needs it; change the sequence length or set sequence_parallel to false")


def shard_graph(graph: CompGraph, tp: int, ann: TPAnnotation | None = None, *,
                divisible_by: int = VOCAB_DIVISIBLE_BY, sequence_parallel: bool = False) -> CompGraph:
    """What one rank of a TP group of ``tp`` runs: split ops at 1/tp of their FLOPs, parameters, saved
    activations and sharded outputs / edges (the same nodes and edges, so costs line up node for node); the
    vocabulary's share at ``padded_vocab / vocab / tp`` (Megatron's padding, at ``tp = 1`` too; ``divisible_by = 0``:
    none); the replicated input a column GEMM or the LM head saves (``col_act``) whole; with ``sequence_parallel``
    that input and the replicated token-wise ops between TP regions (``seq_frac``) at 1/tp too. ``graph`` itself at
    ``tp = 1`` where nothing is padded."""
    ann = ann if ann is not None else annotation(graph)
    pad = padded_vocab(ann.vocab, tp, divisible_by) / ann.vocab if ann.vocab else 1.0
    if tp == 1 and pad == 1.0:
        return graph
    k = 1.0 / tp

    def scale(arr: np.ndarray, frac: np.ndarray, vocab: np.ndarray) -> np.ndarray:
        return arr * (1.0 - frac + k * (frac - vocab) + k * pad * vocab)

    vf = ann.vocab_frac if ann.vocab_frac is not None else np.zeros((4, graph.num_nodes))
    ev = ann.edge_vocab if ann.edge_vocab is not None else np.zeros(graph.num_edges)
    if sequence_parallel and ann.seq_frac is not None:  # token-wise replicated ops on 1/tp of the sequence
        sq = ann.seq_frac
        col = ann.col_act if ann.col_act is not None else np.zeros(graph.num_nodes)
        frac_f, frac_o = (np.maximum(x, sq) for x in (ann.frac_flops, ann.frac_out))
        frac_a = np.maximum(ann.frac_act + col, sq)  # a column's saved input: its sequence shard
        edge = np.maximum(ann.edge_split, sq[graph.edges[:, 0]] if graph.num_edges else np.zeros(0))
    else:
        frac_f, frac_a, frac_o, edge = ann.frac_flops, ann.frac_act, ann.frac_out, ann.edge_split
    meta = dict(graph.meta)
    fine = member_graph(graph)
    if fine is not None:  # a coarsened graph: its members are sharded too, so a group stays priced as their sum
        meta[FINE_KEY] = member_record(shard_graph(fine[0], tp, divisible_by=divisible_by,
                                                   sequence_parallel=sequence_parallel))
    suffix = ("" if pad == 1.0 else f"v{padded_vocab(ann.vocab, tp, divisible_by)}") + ("sp" if sequence_parallel
                                                                                      else "")
    return graph.replace(fwd_flops=scale(graph.fwd_flops, frac_f, vf[0]),
                         bwd_flops=scale(graph.bwd_flops, frac_f, vf[0]),
                         param_bytes=scale(graph.param_bytes, ann.frac_params, vf[1]),
                         act_bytes=scale(graph.act_bytes, frac_a, vf[2]),
                         out_bytes=scale(graph.out_bytes, frac_o, vf[3]),
                         edge_bytes=scale(graph.edge_bytes, edge, ev),
                         name=f"{graph.name}@tp{tp}{suffix}", meta=meta)


def without_tp(graph: CompGraph) -> CompGraph:
    """``graph`` with an empty TP annotation: planners then search DP x PP only (the no-TP baseline of a study)."""
    return graph.replace(meta={**graph.meta, "tp": {"version": SCHEMA_VERSION, "nodes": {}, "ar_fwd": {}, "ar_bwd": {},
                                                    "pairs": [], "divisors": [], "heads": {}, "vocab": None,
                                                    "split_nodes": 0, "note": "TP disabled for this study"}})


def max_degree(graph: CompGraph, limit: int = 64, *, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Largest TP degree <= ``limit`` that ``check_degree`` accepts (1 when nothing splits)."""
    ann = annotation(graph)
    if not ann.splittable:
        return 1
    best = 1
    for t in range(2, limit + 1):
        try:
            check_degree(graph, t, ann, divisible_by=divisible_by)
        except PlanError:
            continue
        best = t
    return best


__all__ = ["KINDS", "TPAnnotation", "VOCAB_DIVISIBLE_BY", "annotation", "check_degree", "check_sequence", "detect",
           "max_degree", "padded_vocab", "sequence_length", "shard_graph", "without_tp"]
