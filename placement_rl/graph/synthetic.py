"""Seeded random DAG families with costs resembling captured training graphs.

Every sample has exactly ``num_nodes`` nodes: one source (``input``, node 0) and one sink (the loss,
last node), nodes numbered in a topological (program) order. Families:

* ``layered`` — random layered DAG: random widths and depth, edges between consecutive layers with a
  per-graph probability, plus skip connections from earlier layers.
* ``series_parallel`` — a chain of blocks, each a recursive series/parallel composition whose
  parallel branches end in a join op (add/cat/mul/matmul).
* ``transformer_like`` — GPT-style blocks (layer norm, q/k/v projections, attention matmuls, softmax,
  output projection, residual adds, MLP).
* ``cnn_like`` — ResNet-style stem, residual stages with downsample shortcuts, pooling head.
* ``dataflow`` — a wide tensor-program DAG: each op reads 1-3 tensors from a sliding window of recent ones
  (width 4-64), mostly matmuls and linears, so many independent contractions can run at once.

Costs (fp32): heavy ops (linear, conv2d, matmul, embedding) carry large log-normal ``fwd_flops`` and,
except attention matmuls, parameters; most other ops are cheap parameter-free elementwise ops whose
output is the size of their input; norms carry small parameters as in real models. ``fwd_flops`` are
clipped to [1e5, 1e11] (views and the input have none), ``out_bytes`` to [1e3, 1e8] (the loss is a
4-byte scalar), ``bwd_flops`` ~2x forward for heavy and parameter ops and ~1x otherwise,
``act_bytes`` = bytes of the op's inputs, ``edge_bytes`` = the producer's ``out_bytes``. Module paths are
hierarchical (``block3.layer1.linear0``; functional ops sit in their parent module) so ``coarsen``
applies. Same (family, num_nodes, seed) -> identical graph.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from placement_rl.errors import GraphError
from placement_rl.graph.ir import CompGraph

__all__ = ["families", "sample"]

HEAVY = ("linear", "conv2d", "matmul", "embedding")
PARAM_OPS = ("linear", "conv2d", "embedding", "layer_norm", "batch_norm")
_UNARY = {"linear": 0.18, "conv2d": 0.07, "layer_norm": 0.06, "batch_norm": 0.04, "relu": 0.15, "gelu": 0.08,
          "dropout": 0.10, "softmax": 0.05, "view": 0.10, "transpose": 0.07, "mul_scalar": 0.10}
_JOIN = {"add": 0.55, "cat": 0.20, "mul": 0.10, "matmul": 0.15}
_FILL = ("dropout", "view", "transpose", "relu")
_ELEM_FLOPS = {"relu": 1, "gelu": 8, "dropout": 2, "softmax": 5, "mul_scalar": 1, "add": 1, "mul": 1, "cat": 1,
               "layer_norm": 8, "batch_norm": 4, "max_pool2d": 9, "adaptive_avg_pool2d": 1, "cross_entropy": 5}


class _Full(Exception):
    """Raised by ``_Skeleton.add`` when the body has reached its node budget."""


class _Skeleton:
    """Nodes (kind, module path, parent scope, preds) added in topological order, up to ``capacity``."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.capacity, self.rng = capacity, rng
        self.kinds: list[str] = []
        self.paths: list[str] = []
        self.scopes: list[str] = []
        self.preds: list[list[int]] = []
        self.keys: list[float] = []
        self._leaf: dict[tuple[str, str], int] = {}
        self.add("input", "", [])

    def add(self, kind: str, scope: str, preds: list[int], leaf: str | None = None) -> int:
        if len(self.kinds) >= self.capacity:
            raise _Full
        if leaf is None and kind in PARAM_OPS:
            j = self._leaf.get((scope, kind), 0)
            self._leaf[(scope, kind)] = j + 1
            leaf = f"{kind}{j}"
        path = f"{scope}.{leaf}" if leaf and scope else (leaf or scope)
        self.kinds.append(kind)
        self.paths.append(path)
        self.scopes.append(scope)
        self.preds.append(list(dict.fromkeys(preds)))
        self.keys.append(float(len(self.keys)))
        return len(self.kinds) - 1

    def pick(self, table: dict[str, float]) -> str:
        names = list(table)
        p = np.array([table[k] for k in names])
        return names[int(self.rng.choice(len(names), p=p / p.sum()))]

    def fill(self) -> None:
        """Insert cheap parameter-free ops on random edges until the body is full."""
        while len(self.kinds) < self.capacity:
            v = int(self.rng.integers(1, len(self.kinds)))
            j = int(self.rng.integers(len(self.preds[v])))
            u = self.preds[v][j]
            x = self.add(_FILL[int(self.rng.integers(len(_FILL)))], self.scopes[u], [u])
            self.keys[x] = (self.keys[u] + self.keys[v]) / 2
            self.preds[v][j] = x


# ---------------------------------------------------------------------------------------------- families
def _layered(sk: _Skeleton, m: int) -> None:
    rng = sk.rng
    width = int(rng.integers(2, 9))
    depth = max(1, -(-m // width))
    widths = 1 + rng.multinomial(m - depth, np.full(depth, 1.0 / depth))
    p_join, p_skip = rng.uniform(0.05, 0.25), rng.uniform(0.05, 0.2)
    per_block = int(rng.integers(2, 5))
    layers: list[list[int]] = [[0]]
    for lyr, w in enumerate(widths.tolist()):
        scope = f"block{lyr // per_block}.layer{lyr % per_block}"
        prev = layers[-1]
        preds: list[list[int]] = [[prev[int(rng.integers(len(prev)))]] for _ in range(w)]
        for ps in preds:
            if len(prev) > 1 and rng.random() < p_join:
                ps.append(prev[int(rng.integers(len(prev)))])
            if len(layers) > 2 and rng.random() < p_skip:
                src = layers[int(rng.integers(1, len(layers) - 1))]
                ps.append(src[int(rng.integers(len(src)))])
        used = {p for ps in preds for p in ps}
        for p in prev:  # every node of the previous layer feeds the next one
            if p not in used:
                preds[int(rng.integers(w))].append(p)
        cur = []
        for ps in preds:
            ps = list(dict.fromkeys(ps))
            cur.append(sk.add(_join_kind(sk, len(ps)) if len(ps) > 1 else sk.pick(_UNARY), scope, ps))
        layers.append(cur)


def _series_parallel(sk: _Skeleton, m: int) -> None:
    rng = sk.rng
    sizes = _split(rng, m, max(1, int(round(m / rng.uniform(8, 40)))))
    x = 0
    for b, k in enumerate(sizes):
        x = _sp_block(sk, k, f"block{b}", [x])


def _sp_block(sk: _Skeleton, k: int, scope: str, preds: list[int]) -> int:
    rng = sk.rng
    if k == 1:
        kind = _join_kind(sk, len(preds)) if len(preds) > 1 else sk.pick(_UNARY)
        return sk.add(kind, scope, preds)
    if k >= 3 and rng.random() < 0.35:
        branches = _split(rng, k - 1, int(rng.integers(2, min(4, k - 1) + 1)))
        exits = [_sp_block(sk, s, f"{scope}.branch{j}", preds) for j, s in enumerate(branches)]
        return sk.add(_join_kind(sk, len(exits)), scope, exits)
    a = int(rng.integers(1, k))
    return _sp_block(sk, k - a, scope, [_sp_block(sk, a, scope, preds)])


def _transformer_like(sk: _Skeleton, m: int) -> None:
    try:
        tok = sk.add("embedding", "embed", [0], leaf="tok")
        pos = sk.add("embedding", "embed", [0], leaf="pos")
        x = sk.add("add", "embed", [tok, pos])
        for i in range(max(0, (m - 5) // 15)):
            p = f"h.{i}"
            ln = sk.add("layer_norm", p, [x], leaf="ln_1")
            q, k, v = (sk.add("linear", f"{p}.attn", [ln], leaf=f"{c}_proj") for c in "qkv")
            kt = sk.add("transpose", f"{p}.attn", [k])
            s = sk.add("matmul", f"{p}.attn", [q, kt])
            a = sk.add("softmax", f"{p}.attn", [s])
            o = sk.add("matmul", f"{p}.attn", [a, v])
            x = sk.add("add", p, [x, sk.add("linear", f"{p}.attn", [o], leaf="o_proj")])
            ln = sk.add("layer_norm", p, [x], leaf="ln_2")
            h = sk.add("gelu", f"{p}.mlp", [sk.add("linear", f"{p}.mlp", [ln], leaf="fc1")])
            x = sk.add("add", p, [x, sk.add("linear", f"{p}.mlp", [h], leaf="fc2")])
        sk.add("linear", "", [sk.add("layer_norm", "", [x], leaf="ln_f")], leaf="lm_head")
    except _Full:
        pass


def _cnn_like(sk: _Skeleton, m: int) -> None:
    nblocks = max(0, (m - 7) // 10)
    while nblocks and 7 + 8 * nblocks + 2 * min(4, nblocks) > m:
        nblocks -= 1
    stages = _split(sk.rng, nblocks, min(4, nblocks)) if nblocks else []
    try:
        x = sk.add("conv2d", "", [0], leaf="conv1")
        x = sk.add("batch_norm", "", [x], leaf="bn1")
        x = sk.add("relu", "", [x], leaf="relu")
        x = sk.add("max_pool2d", "", [x], leaf="maxpool")
        for s, nb in enumerate(stages, start=1):
            for b in range(nb):
                p = f"layer{s}.{b}"
                y = sk.add("conv2d", p, [x], leaf="conv1")
                y = sk.add("relu", p, [sk.add("batch_norm", p, [y], leaf="bn1")])
                y = sk.add("batch_norm", p, [sk.add("conv2d", p, [y], leaf="conv2")], leaf="bn2")
                if b == 0:
                    x = sk.add("conv2d", p, [x], leaf="downsample.0")
                    x = sk.add("batch_norm", p, [x], leaf="downsample.1")
                x = sk.add("relu", p, [sk.add("add", p, [y, x])])
        x = sk.add("adaptive_avg_pool2d", "", [x], leaf="avgpool")
        sk.add("linear", "", [sk.add("view", "", [x])], leaf="fc")
    except _Full:
        pass


def _dataflow(sk: _Skeleton, m: int) -> None:
    """A wide tensor-program DAG (einsum / matmul dataflow): each op reads 1-3 recent tensors from a sliding
    window, heavy contractions dominate, and the window width sets how much can run in parallel."""
    rng = sk.rng
    window = int(rng.integers(4, 65))
    heavy = {"matmul": 0.45, "linear": 0.25, "add": 0.1, "mul": 0.1, "gelu": 0.05, "softmax": 0.05}
    nodes = [0]
    for i in range(m):
        lo = max(0, len(nodes) - window)
        k = 1 + int(rng.random() < 0.5) + int(rng.random() < 0.2)
        preds = sorted({nodes[int(rng.integers(lo, len(nodes)))] for _ in range(k)})
        kind = sk.pick(heavy) if len(preds) == 1 else sk.pick(_JOIN)
        if len(preds) == 1 and kind in _JOIN:
            kind = "linear"
        nodes.append(sk.add(kind, f"stages.stage{i // max(window, 1)}", preds))


_FAMILIES: dict[str, Callable[[_Skeleton, int], None]] = {
    "layered": _layered, "series_parallel": _series_parallel,
    "transformer_like": _transformer_like, "cnn_like": _cnn_like, "dataflow": _dataflow}


def families() -> list[str]:
    """Names of the synthetic graph families."""
    return list(_FAMILIES)


MAX_NODES = 1_000_000


def sample(family: str, *, num_nodes: int, seed: int) -> CompGraph:
    """A random graph of ``family`` with exactly ``num_nodes`` nodes; deterministic in ``seed``."""
    if family not in _FAMILIES:
        raise GraphError(f"unknown synthetic family {family!r}; choose one of {', '.join(_FAMILIES)}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or not 3 <= num_nodes <= MAX_NODES:
        raise GraphError(f"synthetic.sample: num_nodes must be an integer in [3, {MAX_NODES}] (a million nodes take "
                         f"about 40 s and 1.7 GB to build), got {num_nodes!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise GraphError(f"synthetic.sample: seed must be an integer, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    n = int(num_nodes)
    sk = _Skeleton(n - 1, rng)
    _FAMILIES[family](sk, n - 2)
    sk.fill()
    order = np.argsort(np.asarray(sk.keys), kind="stable")
    rank = np.empty(n - 1, dtype=np.int64)
    rank[order] = np.arange(n - 1)
    kinds = [sk.kinds[i] for i in order]
    paths = [sk.paths[i] for i in order]
    preds = [sorted(int(rank[p]) for p in sk.preds[i]) for i in order]
    has_succ = np.zeros(n - 1, dtype=bool)
    for ps in preds:
        has_succ[ps] = True
    kinds.append("cross_entropy")
    paths.append("loss")
    preds.append(np.flatnonzero(~has_succ).tolist())
    return _finish(rng, kinds, paths, preds, name=f"{family}-{n}-s{int(seed)}",
                   meta={"family": family, "num_nodes": n, "seed": int(seed)})


# ------------------------------------------------------------------------------------------------ helpers
def _join_kind(sk: _Skeleton, n_in: int) -> str:
    return sk.pick(_JOIN) if n_in == 2 else sk.pick({k: w for k, w in _JOIN.items() if k != "matmul"})


def _split(rng: np.random.Generator, total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` positive integers (random)."""
    parts = max(1, min(parts, total))
    return (1 + rng.multinomial(total - parts, np.full(parts, 1.0 / parts))).tolist()


def _finish(rng: np.random.Generator, kinds: list[str], paths: list[str], preds: list[list[int]], *,
            name: str, meta: dict) -> CompGraph:
    n = len(kinds)
    scale = 10 ** rng.uniform(5.5, 7.5)  # typical activation size of this graph, bytes
    out, fwd, bwd, par, act = (np.zeros(n) for _ in range(5))
    for i, kind in enumerate(kinds):
        ins = out[preds[i]] if preds[i] else np.zeros(0)
        main = float(ins.max()) if ins.size else scale
        act[i] = float(ins.sum())
        feat = min(16384.0, max(16.0, 10 ** rng.normal(2.8, 0.4)))
        if kind == "input":
            out[i], act[i] = scale * rng.lognormal(0.0, 0.3), 0.0
        elif kind == "cross_entropy":
            out[i], fwd[i] = 4.0, _ELEM_FLOPS[kind] * act[i] / 4
        elif kind == "embedding":
            out[i] = np.sqrt(main * scale) * rng.lognormal(0.0, 0.5)
            fwd[i], par[i] = out[i] / 4, 10 ** rng.uniform(3.5, 5.0) * feat * 4
        elif kind in HEAVY:
            out[i] = np.sqrt(main * scale) * rng.lognormal(0.0, 0.5)
            k_dim = min(16384.0, max(8.0, 10 ** rng.normal(2.8, 0.45)))
            fwd[i] = 2.0 * (out[i] / 4) * k_dim
            par[i] = 0.0 if kind == "matmul" else k_dim * feat * 4
        elif kind == "cat":
            out[i] = act[i]
        elif kind == "max_pool2d":
            out[i] = main / 4
        elif kind == "adaptive_avg_pool2d":
            out[i] = main / 49
        else:
            out[i] = main
        if kind in ("view", "transpose", "input"):
            act[i] = 0.0
        elif kind not in HEAVY and kind != "cross_entropy":
            fwd[i] = _ELEM_FLOPS.get(kind, 1) * main / 4
        if kind in ("layer_norm", "batch_norm"):
            par[i] = feat * 8
        if kind != "cross_entropy":
            out[i] = min(1e8, max(1e3, out[i]))
        if fwd[i] > 0:
            fwd[i] = min(1e11, max(1e5, fwd[i]))
        factor = 2.0 if kind in HEAVY or kind in PARAM_OPS else 1.0
        bwd[i] = fwd[i] * factor * rng.lognormal(0.0, 0.05)
    src = [p for i in range(n) for p in preds[i]]
    dst = [i for i in range(n) for _ in preds[i]]
    return CompGraph(
        names=tuple(f"{k}_{i}" for i, k in enumerate(kinds)), op_types=tuple(kinds), module_paths=tuple(paths),
        fwd_flops=fwd, bwd_flops=bwd, out_bytes=out, param_bytes=par, act_bytes=act,
        edges=np.array([src, dst], dtype=np.int64).T.reshape(-1, 2), edge_bytes=out[src] if src else np.zeros(0),
        name=name, meta=meta)
