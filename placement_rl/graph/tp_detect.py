"""Finding the tensor-parallel splits of a captured graph: ``detect`` (the annotation ``capture`` stores in
``graph.meta["tp"]``; read back per node by ``placement_rl.graph.tp.annotation``).

``detect(graph) -> dict`` (JSON, stored in ``graph.meta["tp"]`` by ``capture``) finds, on an uncoarsened graph:

* **Megatron pairs**: a *row-parallel* GEMM ``R`` (weights split along its input features, output a partial
  sum all-reduced in forward) whose activation inputs come, through parameter-free ops only, from one or more
  *column-parallel* GEMMs (weights split along their output features): attention QKV (fused or not) -> output
  projection, with the per-head ops between them (scores, softmax, weighted sum) split by heads; MLP up (and
  gate) -> down. Found on the graph, not by name: walking back from ``R`` through parameter-free ops must end
  at GEMMs with parameters (the columns) or at sources that do not depend on the activations (masks,
  positions); every op fed by a column must feed only the pair; a norm or another parameterised op on the way
  means no pair. A GEMM is in at most one pair.
* **Vocabulary parallelism**: the word embedding is split by rows (vocab-parallel embedding: masked lookup,
  forward all-reduce of its output): among the tables not looked up by positions (indices from an ``arange``),
  the one tied to the LM head (``meta["tied"]``; with no head found, the one tied to a GEMM: the output
  projection), else one whose row count is the head's vocabulary, else (no head, or no table matches) the
  largest; a position table is never taken for it because it is large. The GEMM feeding the loss (the LM head,
  tied or not) is split by vocabulary (column-parallel): between them only views and element-wise ops that keep
  the vocabulary axis (a bias over the vocabulary such as BART's ``final_logits_bias``, a scalar scale, Gemma2's
  tanh softcapping), which run on the sharded logits; the loss runs on vocab-sharded logits (Megatron's parallel
  cross-entropy: ``LOSS_ALLREDUCES`` = three all-reduces of one number per token -- the logits' maximum, the sum of
  their exponentials, the target's logit).
* Everything else is **replicated** (norms, residual adds, dropout on the residual stream, position
  embeddings): every TP rank runs it in full. Sequence parallelism is not modelled.

Collectives per node (bytes at the graph's batch; each is an all-reduce over the TP group, every micro-batch):
``ar_fwd`` -- the row GEMM's output, the vocab-parallel embedding's output, the parallel cross-entropy's
``3 x tokens x 4`` bytes (three collectives of a third each: ``collectives``); ``ar_bwd`` -- the input gradient of
each pair's columns (once per distinct input tensor: Megatron's ``f`` operator) and of the LM head. Every other op
with bytes is one collective.

``dims``: the sizes a TP degree must divide -- every column's output features and row's input features
(derived from FLOPs and bytes: ``tokens = 2 out_bytes in_bytes / (F e^2)`` with ``e`` the parameter element
size), the vocabulary, and heads (the zoo model's ``n_heads`` / ``n_kv_heads`` where known, else derived from
the attention score / value matmuls when the graph has them; fused SDPA hides them: then ``heads`` is absent
and only the feature sizes are checked, unless a ``graph=hf`` config names them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph

from placement_rl.graph.op_classes import base_name, op_class
from placement_rl.graph.tp_kinds import (COLUMN, KINDS, REPLICATED, ROW, SCHEMA_VERSION, SHARDED,  # noqa: F401
                                         VOCAB_EMB, VOCAB_HEAD, VOCAB_LOSS)

LOSS_ALLREDUCES = 3  # Megatron's vocab-parallel cross-entropy: max, sum of exponentials, target logit


def collectives(kind: str | None) -> int:
    """How many TP collectives the ``ar_fwd`` bytes of an op of annotation ``kind`` (a ``KINDS`` name) are, every
    micro-batch: ``LOSS_ALLREDUCES`` for the parallel cross-entropy, else one (its ``ar_bwd`` bytes: always one)."""
    return LOSS_ALLREDUCES if kind == KINDS[VOCAB_LOSS] else 1


def _classes(graph: CompGraph) -> list[str]:
    return [op_class(t, p, f) for t, p, f in zip(graph.op_types, graph.param_bytes, graph.fwd_flops)]


_MATMULS = ("linear", "addmm", "mm", "matmul", "conv1d_hf")


def _is_matmul(op_type: str) -> bool:
    """A captured GEMM op (``aten`` linear / addmm / mm / matmul); synthetic op types never split."""
    return base_name(op_type) in _MATMULS


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


def _from_positions(graph: CompGraph, v: int) -> bool:
    """Whether lookup ``v``'s indices are positions: built (through parameter-free ops) from an ``arange``."""
    seen, stack = set(), [int(u) for u in graph.predecessors(v)]
    while stack:
        u = stack.pop()
        if u in seen or graph.param_bytes[u] > 0:
            continue
        seen.add(u)
        if base_name(graph.op_types[u]) == "arange":
            return True
        stack.extend(int(x) for x in graph.predecessors(u))
    return False


def _tied_tables(graph: CompGraph, embeds: list[int], user: int | None) -> list[int]:
    """The tables of ``embeds`` that share their parameter (``meta["tied"]`` names a shared parameter's users)
    with GEMM ``user``, or with any GEMM when ``user`` is None (the output projection of a head not found)."""
    names = {graph.names[v]: v for v in embeds}
    out = []
    for tie in graph.meta.get("tied") or ():
        users = [nm for nm in tie.get("nodes", ()) if nm in graph.index]
        if user is None:
            shared = any(_is_matmul(graph.op_types[graph.index[nm]]) for nm in users)
        else:
            shared = graph.names[user] in users
        if shared:
            out.extend(names[nm] for nm in users if nm in names)
    return out


def _vocab_embedding(graph: CompGraph, embeds: list[int], head: int, vocab: int | None, e: float) -> int:
    """The embedding of ``embeds`` to split by vocabulary, among those not looked up by positions (an ``arange``;
    all of them if each is): the one tied to the LM head ``head`` (to any GEMM when no head was found: the output
    projection), else the largest whose rows are the head's ``vocab`` (rows: parameters / (``e`` x the head's input
    features)), else the largest (a position table larger than a character vocabulary is never the word embedding
    when the head or a tie identifies it)."""
    def largest(vs: list[int]) -> int:
        return max(vs, key=lambda v: graph.param_bytes[v])

    words = [v for v in embeds if not _from_positions(graph, v)] or embeds
    tied = _tied_tables(graph, words, head if head >= 0 else None)
    if tied:
        return largest(tied)
    dims = _linear_dims(graph, head, e) if head >= 0 else None
    if vocab and dims is not None and dims[0] > 0:
        fits = [v for v in words if int(round(graph.param_bytes[v] / (e * dims[0]))) == vocab]
        if fits:
            return largest(fits)
    return largest(words)


_LOGIT_OPS = ("add", "sub", "mul", "div", "tanh")  # element-wise ops on the logits that keep the vocabulary axis


def _keeps_vocab(graph: CompGraph, v: int, cls: list[str]) -> bool:
    """Whether op ``v`` between the LM head and the loss keeps the logits' vocabulary axis: a view, or an op of
    ``_LOGIT_OPS`` (a bias broadcast over the vocabulary, a scalar scale, tanh softcapping) whose output is the size
    of its largest input and whose other inputs are smaller (broadcast)."""
    if cls[v] == "view":
        return True
    if base_name(graph.op_types[v]).removesuffix("_") not in _LOGIT_OPS:
        return False
    src, by = _in_bytes(graph, v)
    if src < 0 or float(graph.out_bytes[v]) != by:
        return False
    lo, hi = graph.pred_ptr[v], graph.pred_ptr[v + 1]
    others = [float(graph.edge_bytes[int(graph.pred_eid[k])]) for k in range(lo, hi) if int(graph.pred_idx[k]) != src]
    return all(b < by for b in others)


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
    vocab, head = None, -1
    # vocab-parallel LM head: the GEMM feeding the loss through ops keeping the vocabulary axis (views, a
    # bias, softcapping); the loss runs on sharded logits
    has_embedding = any(cls[v] == "embedding" and graph.param_bytes[v] > 0 for v in range(n))
    for loss in (v for v in range(n) if cls[v] == "loss" and (pairs or has_embedding)):
        path, src = [], _in_bytes(graph, loss)[0]
        while src >= 0 and kind[src] == REPLICATED and len(_live_successors(graph, src)) == 1 \
                and _keeps_vocab(graph, src, cls):
            path.append(src)
            src = _in_bytes(graph, src)[0]
        if src >= 0 and _is_matmul(graph.op_types[src]) and graph.fwd_flops[src] > 0 and kind[src] == REPLICATED \
                and len(_live_successors(graph, src)) == 1:
            dims = _linear_dims(graph, src, e)
            kind[src], kind[path], kind[loss] = VOCAB_HEAD, SHARDED, VOCAB_LOSS
            ar_bwd[src] = _in_bytes(graph, src)[1]
            head = src
            if dims is not None:
                vocab = dims[1]
                ar_fwd[loss] = LOSS_ALLREDUCES * dims[2] * 4.0
            break
    embeds = [v for v in range(n) if cls[v] == "embedding" and graph.param_bytes[v] > 0]
    if embeds and (vocab is not None or pairs):
        word = _vocab_embedding(graph, embeds, head, vocab, e)
        kind[word] = VOCAB_EMB
        ar_fwd[word] = graph.out_bytes[word]
        if vocab is None and pairs:  # rows of the table: parameters / (e x hidden), hidden from a pair's tokens
            dims = _linear_dims(graph, graph.index[pairs[0]["row"]], e)
            if dims is not None and graph.out_bytes[word] > 0:
                hidden = graph.out_bytes[word] / (e * dims[2])
                vocab = int(round(graph.param_bytes[word] / (e * hidden)))
    if vocab:
        divisors.add(int(vocab))
    opts = graph.meta.get("zoo_options") or {}
    heads = {k: int(opts[k]) for k in ("n_heads", "n_kv_heads") if isinstance(opts.get(k), int)}
    hf = (graph.meta.get("hf") or {}).get("config") or {}  # graph=hf: the config's head counts
    for key, name in (("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads")):
        if key not in heads and isinstance(hf.get(name), int) and hf[name] > 0:
            heads[key] = int(hf[name])
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


__all__ = ["COLUMN", "KINDS", "LOSS_ALLREDUCES", "REPLICATED", "ROW", "SCHEMA_VERSION", "SHARDED", "VOCAB_EMB",
           "VOCAB_HEAD", "VOCAB_LOSS", "collectives", "detect"]
