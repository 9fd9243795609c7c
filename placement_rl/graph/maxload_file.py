"""Reader of the max-load partitioning format of Tarnawski et al., "Efficient Algorithms for Device Placement of
DNN Graph Operators" (NeurIPS 2020; msr-fiddle/dnn-partitioning, MIT licence): a DNN's layers or operators with a
measured time on an accelerator and on a CPU core, for ``maxFPGAs`` identical accelerators ("FPGA" there means any
accelerator) and ``maxCPUs`` CPU cores.

An instance file is one JSON object: ``maxSizePerFPGA`` (bytes), ``maxFPGAs``, ``maxCPUs``, ``nodes`` (``id``,
``supportedOnFpga``, ``cpuLatency``, ``fpgaLatency``, ``isBackwardNode``, optional ``size`` (bytes, default 0) and
``colorClass`` (any integer, negative ones too: nodes sharing one run on one device; a node without the key is in
no class with others)) and ``edges`` (``sourceId``, ``destId``, ``cost``: the time to move the source's output
between an accelerator and CPU memory, the same on every edge out of one node). Other keys (``name``, ``layerId``,
edge ``size``) are kept or ignored. A split file is the solvers' output: ``fpgas`` and
``cpus``, each a list of ``{"nodes": [ids]}`` (``load`` and ``maxLoad`` are ignored when read).

``read_instance(path)`` -> ``MaxLoadInstance`` (arrays in file order) and ``read_split(path, instance)`` -> device
per node (accelerators ``0 .. F-1``, CPU cores ``F ..``; a node the split leaves out joins its colour class's
device, so a forward-only split scores a training graph); any problem is one ``GraphError`` line naming the file
and the entry.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from placement_rl.errors import GraphError


@dataclass(frozen=True, eq=False)
class MaxLoadInstance:
    """One instance: per node (file order) ``ids``, ``names``, ``acc`` / ``cpu`` times, ``size`` bytes,
    ``supported`` (may run on an accelerator), ``backward``, ``colour`` (colocation class, numbered ``0 .. m-1`` in
    file order: nodes sharing a ``colorClass`` share one, a node without the key has one of its own) and
    ``out_cost`` (the time to move its output off its device, 0 without out-edges); ``edges`` int [E, 2] (node
    indices); ``max_size`` bytes per accelerator; ``accelerators`` and ``cpus`` (device counts)."""

    path: str
    ids: tuple[int, ...]
    names: tuple[str, ...]
    acc: np.ndarray
    cpu: np.ndarray
    size: np.ndarray
    supported: np.ndarray
    backward: np.ndarray
    colour: np.ndarray
    out_cost: np.ndarray
    edges: np.ndarray
    max_size: float
    accelerators: int
    cpus: int

    @property
    def num_nodes(self) -> int:
        return len(self.ids)

    def describe(self) -> str:
        nb = int(self.backward.sum())
        return (f"{self.num_nodes} nodes ({self.num_nodes - nb} forward, {nb} backward), {len(self.edges)} edges; "
                f"{self.accelerators} accelerators of {self.max_size:.4g} bytes, {self.cpus} CPU cores")


def _load(path: Path) -> Any:
    if path.is_dir():
        raise GraphError(f"{path} is a folder, not a JSON file")
    if not path.is_file():
        raise GraphError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GraphError(f"{path} is not JSON ({exc})") from None
    except RecursionError:
        raise GraphError(f"{path} nests its JSON too deeply to read") from None
    except OSError as exc:
        raise GraphError(f"{path} cannot be read ({exc.strerror or exc})") from None


def _finite_int(value: Any) -> bool:
    """A JSON number that is a whole, finite value within 64 bits (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return False
    return abs(int(value)) < 2**63


def _shown(value: Any) -> str:
    """A JSON value for an error message: a string quoted and called one (``'1', a string``), anything else as
    JSON spells it (``true``, ``null``, ``[1, false]``); at most 40 characters of it."""
    if isinstance(value, str):
        return f"{value[:40]!r}, a string"
    try:
        return json.dumps(value)[:40]
    except (RecursionError, TypeError, ValueError):  # nested past what the encoder takes, or not from JSON
        return str(value)[:40]


def _number(path: Path, where: str, value: Any, *, integer: bool = False) -> float:
    if integer:
        ok = _finite_int(value) and value >= 0
    else:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300
              and math.isfinite(value) and value >= 0)
    if not ok:
        kind = "a whole number" if integer else "a finite number"
        raise GraphError(f"{path}: {where} must be {kind} >= 0 (got {_shown(value)})")
    return float(value)


def _flag(path: Path, where: str, value: Any) -> bool:
    if value in (0, 1) or isinstance(value, bool):
        return bool(value)
    raise GraphError(f"{path}: {where} must be true / false or 0 / 1 (got {_shown(value)})")


def _int(path: Path, where: str, value: Any) -> int:
    if not _finite_int(value):
        raise GraphError(f"{path}: {where} must be an integer (got {_shown(value)})")
    return int(value)


def _field(path: Path, obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise GraphError(f"{path}: {where} has no '{key}'")
    return obj[key]


def read_instance(path: str | Path) -> MaxLoadInstance:
    """The instance in ``path`` (see the module doc), checked: ids unique, edges between known nodes, a DAG with no
    edge from a backward node to a forward one, one cost per source node."""
    path = Path(path)
    data = _load(path)
    if not isinstance(data, dict):
        raise GraphError(f"{path} is not a max-load instance (a JSON object with maxFPGAs, maxCPUs, nodes, edges)")
    if str(data.get("schema", "")).startswith("placement_rl.graph"):
        raise GraphError(f"{path} is one of placement_rl's graph files, not a max-load instance: give the topology "
                         "to make one on (placement-rl maxload GRAPH --topology T)")
    fpgas = int(_number(path, "maxFPGAs", _field(path, data, "maxFPGAs", "the instance"), integer=True))
    cpus = int(_number(path, "maxCPUs", _field(path, data, "maxCPUs", "the instance"), integer=True))
    max_size = _number(path, "maxSizePerFPGA", _field(path, data, "maxSizePerFPGA", "the instance"))
    if fpgas + cpus == 0:
        raise GraphError(f"{path}: maxFPGAs and maxCPUs are both 0: there is no device to place on")
    nodes, edges = _field(path, data, "nodes", "the instance"), _field(path, data, "edges", "the instance")
    if not isinstance(nodes, list) or not nodes:
        raise GraphError(f"{path}: nodes must be a non-empty list")
    if not isinstance(edges, list):
        raise GraphError(f"{path}: edges must be a list")
    index: dict[int, int] = {}
    classes: dict[Any, int] = {}  # colorClass (int), or ("none", k) for node k without one -> class number
    cols: dict[str, list] = {k: [] for k in ("acc", "cpu", "size", "supported", "backward", "colour", "names")}
    for k, node in enumerate(nodes):
        where = f"nodes[{k}]"
        if not isinstance(node, dict):
            raise GraphError(f"{path}: {where} is not an object")
        nid = _int(path, f"{where}.id", _field(path, node, "id", where))
        if nid in index:
            raise GraphError(f"{path}: {where}.id {nid} is used by an earlier node")
        index[nid] = k
        cols["acc"].append(_number(path, f"{where}.fpgaLatency", _field(path, node, "fpgaLatency", where)))
        cols["cpu"].append(_number(path, f"{where}.cpuLatency", _field(path, node, "cpuLatency", where)))
        cols["size"].append(_number(path, f"{where}.size", node.get("size", 0.0)))
        cols["supported"].append(_flag(path, f"{where}.supportedOnFpga", _field(path, node, "supportedOnFpga", where)))
        cols["backward"].append(_flag(path, f"{where}.isBackwardNode", _field(path, node, "isBackwardNode", where)))
        key = _int(path, f"{where}.colorClass", node["colorClass"]) if "colorClass" in node else ("none", k)
        cols["colour"].append(classes.setdefault(key, len(classes)))
        cols["names"].append(str(node.get("name", nid)))
    out_cost = np.zeros(len(nodes))
    has_cost = np.zeros(len(nodes), dtype=bool)
    pairs = []
    for k, edge in enumerate(edges):
        where = f"edges[{k}]"
        if not isinstance(edge, dict):
            raise GraphError(f"{path}: {where} is not an object")
        ends = []
        for key in ("sourceId", "destId"):
            nid = _int(path, f"{where}.{key}", _field(path, edge, key, where))
            if nid not in index:
                raise GraphError(f"{path}: {where}.{key} {nid} is not the id of any node")
            ends.append(index[nid])
        u, v = ends
        if u == v:
            raise GraphError(f"{path}: {where} is a self-loop on node {nodes[u]['id']}")
        cost = _number(path, f"{where}.cost", _field(path, edge, "cost", where))
        if has_cost[u] and abs(out_cost[u] - cost) > 1e-6 * max(1.0, cost):
            raise GraphError(f"{path}: {where}.cost {cost:g} differs from another edge out of node "
                             f"{nodes[u]['id']} ({out_cost[u]:g}); the output of a node costs the same to every "
                             "consumer")
        out_cost[u], has_cost[u] = cost, True
        if cols["backward"][u] and not cols["backward"][v]:
            raise GraphError(f"{path}: {where} goes from backward node {nodes[u]['id']} to forward node "
                             f"{nodes[v]['id']}; backward nodes may feed only backward nodes")
        pairs.append((u, v))
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    _check_acyclic(path, len(nodes), arr, [n["id"] for n in nodes])
    return MaxLoadInstance(str(path), tuple(index), tuple(cols["names"]), np.array(cols["acc"]),
                           np.array(cols["cpu"]), np.array(cols["size"]), np.array(cols["supported"], dtype=bool),
                           np.array(cols["backward"], dtype=bool), np.array(cols["colour"], dtype=np.int64),
                           out_cost, arr, max_size, fpgas, cpus)


def _check_acyclic(path: Path, n: int, edges: np.ndarray, ids: list) -> None:
    indeg = np.bincount(edges[:, 1], minlength=n) if len(edges) else np.zeros(n, dtype=np.int64)
    succ: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges.tolist():
        succ[u].append(v)
    stack = [v for v in range(n) if indeg[v] == 0]
    seen = 0
    while stack:
        u = stack.pop()
        seen += 1
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    if seen < n:
        first = next(v for v in range(n) if indeg[v] > 0)
        raise GraphError(f"{path}: the edges form a cycle (through node {ids[first]}); an instance must be a DAG")


def read_split(path: str | Path, inst: MaxLoadInstance, *, pooled_cpus: bool = False) -> np.ndarray:
    """Device per node (int [N]: accelerators ``0 .. F-1`` in the order of ``fpgas``, CPU cores ``F ..`` in the
    order of ``cpus``) of a split file for ``inst``; every node exactly once. ``pooled_cpus``: the CPUs are one
    pool of any size (device ``F``; the latency objective)."""
    path = Path(path)
    data = _load(path)
    if not isinstance(data, dict) or "fpgas" not in data and "cpus" not in data:
        raise GraphError(f"{path} is not a split (a JSON object with 'fpgas' and 'cpus', lists of {{'nodes': [ids]}})")
    index = {nid: k for k, nid in enumerate(inst.ids)}
    device = np.full(inst.num_nodes, -1, dtype=np.int64)
    cpu_limit = 2**31 if pooled_cpus else inst.cpus
    for key, first, limit in (("fpgas", 0, inst.accelerators), ("cpus", inst.accelerators, cpu_limit)):
        groups = data.get(key, [])
        if not isinstance(groups, list):
            raise GraphError(f"{path}: '{key}' must be a list of {{'nodes': [ids]}}")
        busy = sum(1 for g in groups if isinstance(g, dict) and g.get("nodes"))
        if busy > limit:
            raise GraphError(f"{path}: {busy} non-empty '{key}' groups, more than the instance's {limit}")
        used = 0
        for k, group in enumerate(groups):
            members = group.get("nodes") if isinstance(group, dict) else None
            if not isinstance(members, list):
                raise GraphError(f"{path}: {key}[{k}] has no list 'nodes'")
            if not members:
                continue
            for nid in members:
                if not _finite_int(nid) or int(nid) not in index:
                    raise GraphError(f"{path}: {key}[{k}] names node {_shown(nid)}, which {inst.path} does not "
                                     "have")
                nid = int(nid)
                if device[index[nid]] >= 0:
                    raise GraphError(f"{path}: node {nid} is listed twice")
                device[index[nid]] = first + (0 if pooled_cpus and key == "cpus" else used)
            used += 1
    _colocate_rest(inst, device)
    missing = np.flatnonzero(device < 0)
    if len(missing):
        raise GraphError(f"{path} leaves {len(missing)} nodes unplaced (first: node {inst.ids[missing[0]]})")
    return device


def _colocate_rest(inst: MaxLoadInstance, device: np.ndarray) -> None:
    """Give a node the split leaves out the device of its colour class, where the class has exactly one (a forward
    split read for a training graph: each backward node joins its forward node)."""
    placed = device >= 0
    if placed.all() or not placed.any():
        return
    m = int(inst.colour.max()) + 1
    low, high = np.full(m, np.iinfo(np.int64).max), np.full(m, -1)
    np.minimum.at(low, inst.colour[placed], device[placed])
    np.maximum.at(high, inst.colour[placed], device[placed])
    fill = ~placed & (low == high)[inst.colour]
    device[fill] = high[inst.colour[fill]]


__all__ = ["MaxLoadInstance", "read_instance", "read_split"]
