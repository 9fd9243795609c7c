"""``CompGraph``: an immutable DAG of a training step's forward ops, stored as numpy arrays.

One node is one forward op (or, after coarsening, a group of ops); its backward is modelled
from the forward graph (reverse edges, ``bwd_flops``), so one node stands for fwd + bwd.

Shapes (N nodes, E edges):
    names, op_types, module_paths: tuple[str, ...] of length N
    fwd_flops, bwd_flops, out_bytes, param_bytes, act_bytes: float64 [N]
    edges: int64 [E, 2] (src, dst);  edge_bytes: float64 [E]
    members: optional tuple of N tuples of original node names (set by coarsening): each non-empty, and each
        original op in exactly one node

``meta`` is free-form JSON except for the fields planners read, checked with the rest: ``batch_size`` (and
``zoo_options.batch_size``) a positive integer or null, and ``tp`` (``placement_rl.graph.tp``) the TP annotation,
whose op names must be nodes of the graph (its members, when coarsened).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.errors import GraphError
from placement_rl.graph.codec import NODE_ARRAYS, STRING_WHERE, graph_fields, graph_to_dict, read_graph_json
from placement_rl.graph._ir_meta import check_members, check_meta
from placement_rl.graph.files import atomic_write_text


def int_array(value: Any) -> np.ndarray:
    """``value`` as an int64 array of its own shape, refusing what a cast would silently change: fractions, NaN,
    infinities and integers beyond int64. ``ValueError`` (the first such entry, flat position, as ``args``) for
    those; ``TypeError`` / ``ValueError`` from numpy for what is no number at all."""
    arr = np.asarray(value)
    if arr.dtype.kind in "iub":
        if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
            k = int(np.flatnonzero(arr.reshape(-1) > np.iinfo(np.int64).max)[0])
            raise ValueError(f"{int(arr.reshape(-1)[k])} is beyond int64", k)
        return arr.astype(np.int64)
    flt = np.array(value, dtype=np.float64)  # numeric strings, Python ints beyond int64 (as floats)
    flat = flt.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(flat) | (flat != np.floor(flat)) | (np.abs(flat) >= 2.0**63))
    if bad.size:
        k, v = int(bad[0]), float(flat[bad[0]])
        raise ValueError(f"{v!r} is {'beyond int64' if v.is_integer() else 'not an integer'}", k)
    return flt.astype(np.int64)


def _csr(n: int, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of ``values`` grouped by ``keys``: (ptr [n+1], values sorted by key, edge ids)."""
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(ptr, keys + 1, 1)
    np.cumsum(ptr, out=ptr)
    return ptr, values[order].astype(np.int64), order.astype(np.int64)


def _edge_array(edges: Any) -> np.ndarray:
    """``CompGraph.edges`` as a read-only int64 [E, 2] array; ``GraphError`` for any other shape or a value that is
    no integer node index."""
    what = "field 'edges' must be an [E, 2] array of (src, dst) integer node indices"
    if edges is None or isinstance(edges, (str, bytes, Mapping, int, float)):
        raise GraphError(f"{what}, got {edges!r}"[:300])
    try:
        arr = int_array(edges)
    except ValueError as exc:
        if len(exc.args) == 2 and np.ndim(edges) == 2 and np.shape(edges)[1] == 2:
            raise GraphError(f"field 'edges': edge #{exc.args[1] // 2} endpoint {exc.args[0]} (endpoints are "
                             "node indices)") from None
        raise GraphError(f"{what} ({exc.args[0]})") from None
    except (TypeError, OverflowError) as exc:
        raise GraphError(f"{what} ({exc})") from None
    if arr.size == 0:
        arr = arr.reshape(0, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise GraphError(f"{what}, got shape {list(arr.shape)} (bytes go in 'edge_bytes'; make_graph takes "
                         "[src, dst, bytes] triples)")
    arr.setflags(write=False)
    return arr


def restore_read_only(obj: Any, state: dict) -> None:
    """``__setstate__`` of the frozen value types: the pickled fields back, every array among them read-only."""
    for value in state.values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
    obj.__dict__.update(state)


@dataclass(frozen=True, eq=False)
class CompGraph:
    """A validated computation graph. Construct it with keyword arguments; it validates itself."""

    names: tuple[str, ...]
    op_types: tuple[str, ...]
    module_paths: tuple[str, ...]
    fwd_flops: np.ndarray
    bwd_flops: np.ndarray
    out_bytes: np.ndarray
    param_bytes: np.ndarray
    act_bytes: np.ndarray
    edges: np.ndarray
    edge_bytes: np.ndarray
    name: str = "graph"
    members: tuple[tuple[str, ...], ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "names", tuple(str(x) for x in self.names))
        set_(self, "op_types", tuple(str(x) for x in self.op_types))
        set_(self, "module_paths", tuple(str(x) for x in self.module_paths))
        for key in NODE_ARRAYS + ("edge_bytes",):
            value = getattr(self, key)
            try:
                arr = np.array(value, dtype=np.float64)
            except (TypeError, ValueError, OverflowError) as exc:
                raise GraphError(f"field '{key}' must be a list of numbers ({exc})") from None
            if arr.ndim != 1:
                got = f"shape {list(arr.shape)}" if arr.ndim else repr(value)
                raise GraphError(f"field '{key}' must be a flat list of numbers (one per "
                                 f"{'edge' if key == 'edge_bytes' else 'node'}), got {got}")
            arr.setflags(write=False)
            set_(self, key, arr)
        set_(self, "edges", _edge_array(self.edges))
        if self.members is not None:
            try:
                set_(self, "members", tuple(tuple(str(m) for m in grp) for grp in self.members))
            except TypeError:
                raise GraphError(f"field 'members' must be a list of op-name lists (one per node), got "
                                 f"{self.members!r}"[:300]) from None
        if not isinstance(self.meta, Mapping):
            raise GraphError(f"field 'meta' must be a dict (free-form JSON data; {{}} for none), got "
                             f"{self.meta!r}"[:300])
        set_(self, "meta", dict(self.meta))
        self.validate()

    def __setstate__(self, state: dict) -> None:  # unpickled (another process): its arrays read-only again
        restore_read_only(self, state)

    # ------------------------------------------------------------------ sizes
    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return int(self.edges.shape[0])

    def __len__(self) -> int:
        return self.num_nodes

    def __repr__(self) -> str:
        return (f"CompGraph(name={self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"fwd_flops={self.fwd_flops.sum():.3g}, params={self.param_bytes.sum():.3g}B)")

    # -------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise ``GraphError`` naming the node, edge or field to fix; return None if valid."""
        n = self.num_nodes
        if n == 0:
            raise GraphError(f"graph '{self.name}' has no nodes")
        for key in ("op_types", "module_paths"):
            if len(getattr(self, key)) != n:
                raise GraphError(f"field '{key}' has {len(getattr(self, key))} entries, expected {n} (one per node)")
        for key in NODE_ARRAYS:
            arr = getattr(self, key)
            if arr.shape[0] != n:
                raise GraphError(f"field '{key}' has {arr.shape[0]} entries, expected {n} (one per node)")
            bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
            if bad.size:
                i = int(bad[0])
                raise GraphError(f"node '{self.names[i]}' (#{i}) has invalid {key}={float(arr[i])!r}: "
                                 "costs must be finite and non-negative")
        if len(set(self.names)) != n:
            seen: set[str] = set()
            dup = next(x for x in self.names if x in seen or seen.add(x))  # type: ignore[func-returns-value]
            raise GraphError(f"duplicate node name '{dup}': node names must be unique")
        if self.edge_bytes.shape[0] != self.num_edges:
            raise GraphError(f"field 'edge_bytes' has {self.edge_bytes.shape[0]} entries, "
                             f"expected {self.num_edges} (one per edge)")
        bad = np.flatnonzero(~np.isfinite(self.edge_bytes) | (self.edge_bytes < 0))
        if bad.size:
            raise GraphError(f"edge #{int(bad[0])} {self._edge_str(int(bad[0]))} has invalid "
                             f"edge_bytes={float(self.edge_bytes[bad[0]])!r}: must be finite and non-negative")
        if self.num_edges:
            out_of_range = np.flatnonzero((self.edges < 0).any(1) | (self.edges >= n).any(1))
            if out_of_range.size:
                e = int(out_of_range[0])
                raise GraphError(f"edge #{e} {self.edges[e].tolist()} is dangling: "
                                 f"node indices must be in [0, {n})")
            loops = np.flatnonzero(self.edges[:, 0] == self.edges[:, 1])
            if loops.size:
                raise GraphError(f"edge #{int(loops[0])} {self._edge_str(int(loops[0]))} is a self-loop")
            key = self.edges[:, 0] * n + self.edges[:, 1]
            uniq, first, counts = np.unique(key, return_index=True, return_counts=True)
            if (counts > 1).any():
                k = int(uniq[np.flatnonzero(counts > 1)[0]])
                e = int(np.flatnonzero(key == k)[1])
                raise GraphError(f"duplicate edge #{e} {self._edge_str(e)}: each (src, dst) pair may appear once")
        if self.members is not None:
            check_members(self)
        check_meta(self)
        self._check_acyclic()

    def _edge_str(self, e: int) -> str:
        s, d = (int(x) for x in self.edges[e])
        n = self.num_nodes
        sn = self.names[s] if 0 <= s < n else str(s)
        dn = self.names[d] if 0 <= d < n else str(d)
        return f"'{sn}' -> '{dn}'"

    def _check_acyclic(self) -> None:
        order = self._kahn()
        if len(order) == self.num_nodes:
            return
        # Find one cycle among the nodes Kahn could not order, to name it. Walk *backwards*: every leftover
        # node kept a leftover predecessor (its in-degree never reached 0), while a leftover node downstream
        # of a cycle may have no leftover successor.
        left = np.ones(self.num_nodes, dtype=bool)
        left[order] = False
        pred: dict[int, int] = {}
        for s, d in self.edges.tolist():
            if left[s] and left[d]:
                pred.setdefault(d, s)
        path, pos, node = [], {}, int(np.flatnonzero(left)[0])
        while node not in pos:
            pos[node] = len(path)
            path.append(node)
            node = pred[node]
        cycle = (path[pos[node]:] + [node])[::-1]
        raise GraphError("graph has a cycle: " + " -> ".join(repr(self.names[i]) for i in cycle)
                         + "; remove one of its edges")

    def _kahn(self) -> list[int]:
        n = self.num_nodes
        indeg = np.zeros(n, dtype=np.int64)
        if self.num_edges:
            np.add.at(indeg, self.edges[:, 1], 1)
        succ_ptr, succ_idx, _ = _csr(n, self.edges[:, 0], self.edges[:, 1]) if self.num_edges else (
            np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), None)
        # Stable: among ready nodes, lowest index (program order) first.
        import heapq
        ready = [i for i in range(n) if indeg[i] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        indeg = indeg.tolist()
        sp, si = succ_ptr.tolist(), succ_idx.tolist()
        while ready:
            u = heapq.heappop(ready)
            order.append(u)
            for k in range(sp[u], sp[u + 1]):
                v = si[k]
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(ready, v)
        return order

    # --------------------------------------------------------------- structure
    @cached_property
    def topo_order(self) -> np.ndarray:
        """Topological order; among ready nodes the lowest index (captured program order) first."""
        order = np.array(self._kahn(), dtype=np.int64)
        order.setflags(write=False)
        return order

    @cached_property
    def _pred_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _csr(self.num_nodes, self.edges[:, 1], self.edges[:, 0])

    @cached_property
    def _succ_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _csr(self.num_nodes, self.edges[:, 0], self.edges[:, 1])

    @property
    def pred_ptr(self) -> np.ndarray:
        return self._pred_csr[0]

    @property
    def pred_idx(self) -> np.ndarray:
        return self._pred_csr[1]

    @property
    def pred_eid(self) -> np.ndarray:
        """Edge id of each entry of ``pred_idx`` (to look up ``edge_bytes``)."""
        return self._pred_csr[2]

    @property
    def succ_ptr(self) -> np.ndarray:
        return self._succ_csr[0]

    @property
    def succ_idx(self) -> np.ndarray:
        return self._succ_csr[1]

    @property
    def succ_eid(self) -> np.ndarray:
        return self._succ_csr[2]

    def predecessors(self, i: int) -> np.ndarray:
        return self.pred_idx[self.pred_ptr[i]:self.pred_ptr[i + 1]]

    def successors(self, i: int) -> np.ndarray:
        return self.succ_idx[self.succ_ptr[i]:self.succ_ptr[i + 1]]

    @cached_property
    def index(self) -> dict[str, int]:
        """Node name -> node index."""
        return {name: i for i, name in enumerate(self.names)}

    # ------------------------------------------------------------------ totals
    def totals(self) -> dict[str, float]:
        """Sums of every per-node cost and of edge bytes (conserved by coarsening)."""
        out = {key: float(getattr(self, key).sum()) for key in NODE_ARRAYS}
        out["edge_bytes"] = float(self.edge_bytes.sum())
        return out

    def fingerprint(self) -> str:
        """Stable hash of structure, op types, sizes and precision (keys profiles); independent of ``name`` and of
        ``meta`` but ``dtype`` / ``param_dtype``, which count only where not fp32 (fp32 graphs keep their hashes)."""
        h = hashlib.sha256()
        h.update(("\x1f".join(self.names) + "\x1e" + "\x1f".join(self.op_types)).encode())
        for key in NODE_ARRAYS + ("edge_bytes",):
            h.update(np.ascontiguousarray(getattr(self, key), dtype="<f8").tobytes())
        h.update(np.ascontiguousarray(self.edges, dtype="<i8").tobytes())
        dtype = self.meta.get("dtype") or "fp32"
        precision = (dtype, self.meta.get("param_dtype") or dtype)
        if precision != ("fp32", "fp32"):  # an fp16 and a bf16 capture have equal bytes
            h.update(("\x1d" + "/".join(precision)).encode())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ export
    def to_networkx(self):
        """A ``networkx.DiGraph`` with every node and edge attribute."""
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        for i, nm in enumerate(self.names):
            g.add_node(i, name=nm, op_type=self.op_types[i], module_path=self.module_paths[i],
                       **{k: float(getattr(self, k)[i]) for k in NODE_ARRAYS})
        for e, (s, d) in enumerate(self.edges.tolist()):
            g.add_edge(s, d, bytes=float(self.edge_bytes[e]))
        return g

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The graph as versioned JSON (``placement_rl.graph.codec``), also written to ``path`` when given."""
        text = json.dumps(graph_to_dict(self), indent=None, separators=(",", ":"), allow_nan=False)
        if path is not None:
            atomic_write_text(path, text)
        return text

    @staticmethod
    def from_json(path_or_str: str | os.PathLike) -> "CompGraph":
        """Load a graph from a JSON file path or a JSON string; any problem is a ``GraphError`` (naming the file,
        for one read from a file)."""
        data, where = read_graph_json(path_or_str)
        fields = graph_fields(data, where=where)
        try:
            return CompGraph(**fields)
        except GraphError as exc:  # the graph's own checks (``validate``) name the file as the reader's do
            if where == STRING_WHERE:
                raise
            raise GraphError(f"{where}: {exc}") from None

    def replace(self, **changes: Any) -> "CompGraph":
        """A copy with some fields changed (validated again)."""
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        fields.update(changes)
        return CompGraph(**fields)


def _is_number(v: Any) -> bool:
    """A single real number (not a bool) that ``float`` takes: numpy scalars and numeric strings included."""
    try:
        return not isinstance(v, (bool, np.bool_)) and np.ndim(v) == 0 and isinstance(float(v), float)
    except (TypeError, ValueError, OverflowError):
        return False


NODE_FIELDS = ("name", "op_type", "module_path", *NODE_ARRAYS, "members")  # what a ``make_graph`` node may give


def make_graph(nodes: Sequence[Mapping[str, Any]], edges: Sequence[Sequence[float]], *, name: str = "graph",
               meta: Mapping[str, Any] | None = None) -> CompGraph:
    """Build a graph from node dicts (``name`` plus the per-node fields) and ``[src, dst, bytes]`` edges.

    Missing per-node numbers default to 0, missing ``op_type`` to ``"op"``, ``module_path`` to ``""``.
    Edge endpoints may be node indices or node names; ``bytes`` may be left out (0). A node field other than
    ``NODE_FIELDS`` (a misspelt cost would otherwise read as 0) or a malformed node or edge is a ``GraphError``
    naming its index and field. (A graph *file* drops unknown node fields: ``docs/graph_file.md``.)
    """
    names: list[str] = []
    for i, nd in enumerate(nodes):
        if not isinstance(nd, Mapping):
            raise GraphError(f"node #{i} must be a dict with 'name' and per-node fields, got {nd!r}"[:300])
        names.append(str(nd.get("name", f"n{i}")))
        for key in nd:
            if key not in NODE_FIELDS:
                near = difflib.get_close_matches(str(key), NODE_FIELDS, n=1)
                hint = f"did you mean '{near[0]}'?" if near else f"valid: {', '.join(NODE_FIELDS)}"
                raise GraphError(f"node '{names[i]}' (#{i}) has unknown field '{key}': {hint}")
        for key in NODE_ARRAYS:
            if not _is_number(nd.get(key, 0.0)):
                raise GraphError(f"node '{names[i]}' (#{i}) has {key}={nd[key]!r}: must be a number (finite, "
                                 ">= 0)"[:300])
    idx = {nm: i for i, nm in enumerate(names)}

    def _end(k: int, end: str, x: Any) -> int:
        if isinstance(x, str):
            if x not in idx:
                raise GraphError(f"edge #{k} {end} '{x}' names no node")
            return idx[x]
        v = float(x) if _is_number(x) else -1.0
        if not (v.is_integer() and 0 <= v < len(names)):
            raise GraphError(f"edge #{k} has {end}={x!r}: give a node name or an index in [0, {len(names)})"[:300])
        return int(v)

    if isinstance(edges, (str, bytes, Mapping)) or not hasattr(edges, "__iter__"):
        raise GraphError(f"edges must be a list of [src, dst, bytes], got {edges!r}"[:300])
    e, eb = [], []
    for k, ed in enumerate(edges):
        if isinstance(ed, (str, bytes, Mapping)) or not hasattr(ed, "__len__") or len(ed) not in (2, 3):
            raise GraphError(f"edge #{k} must be [src, dst] or [src, dst, bytes], got {ed!r}"[:300])
        e.append((_end(k, "src", ed[0]), _end(k, "dst", ed[1])))
        b = ed[2] if len(ed) == 3 else 0.0
        if not _is_number(b):
            raise GraphError(f"edge #{k} has bytes={b!r}: must be a number (finite, >= 0)"[:300])
        eb.append(float(b))
    members = None
    if any("members" in nd for nd in nodes):
        members = [tuple(nd.get("members", (names[i],))) for i, nd in enumerate(nodes)]
    return CompGraph(
        names=tuple(names),
        op_types=tuple(str(nd.get("op_type", "op")) for nd in nodes),
        module_paths=tuple(str(nd.get("module_path", "")) for nd in nodes),
        **{k: [nd.get(k, 0.0) for nd in nodes] for k in NODE_ARRAYS},
        edges=np.array(e, dtype=np.int64).reshape(-1, 2),
        edge_bytes=eb,
        name=name,
        members=members,
        meta={} if meta is None else meta,
    )
