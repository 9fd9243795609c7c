"""The graph-side fields of a costs file (``placement_rl.cost.costs_file``): times measured at another batch scaled to
the graph's, per-edge bytes or transfer times (a time becomes the bytes that take it on ``time_link``), and the
``colocate`` groups."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from placement_rl.cost._costs_read import UNITS, _coarsened, _node_name, _number, _warn
from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology


def _at_graph_batch(where: str, fwd: np.ndarray, bwd: np.ndarray, batch: int | None, graph: CompGraph,
                    meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int | None]:
    """``(fwd, bwd, batch)`` for the graph's own batch: times measured at ``batch`` scaled linearly to it (as
    ``simulate_pipeline`` scales to a micro-batch), the measured batch kept as ``meta["measured_batch_size"]``;
    unchanged where either batch is unknown or they agree."""
    import sys

    from placement_rl.plans import graph_batch_size

    own = graph_batch_size(graph)
    if batch is None or own is None or own == batch:
        return fwd, bwd, batch
    meta["measured_batch_size"] = batch
    print(f"note: {where}: times measured at batch_size {batch} are scaled by {own / batch:g} to batch {own}, the "
          f"batch of graph '{graph.name}'", file=sys.stderr)
    return fwd * (own / batch), bwd * (own / batch), own


def _edge_bytes(where: str, data: Mapping[str, Any], graph: CompGraph, topology: DeviceTopology,
                index: Mapping[str, int], unit: str) -> np.ndarray:
    """The graph's edge bytes with the file's ``edges`` entries: bytes as given, a time (in ``unit``) as the bytes
    that take it on ``time_link``, a time below its latency as 0 bytes (one warning line names those edges). On one
    device nothing is transferred, so a time there is checked and leaves the graph's."""
    scale = UNITS[unit]
    ebytes = np.array(graph.edge_bytes, dtype=float)
    low: list[str] = []
    edges = data.get("edges") or []
    if not isinstance(edges, list):
        raise ProfileError(f"{where}: 'edges' must be a list of {{src, dst, bytes | time}}")
    lookup = {(int(u), int(v)): e for e, (u, v) in enumerate(graph.edges.tolist())}
    link = _time_link(where, data.get("time_link"), topology)
    seen: dict[tuple[int, int], int] = {}
    for k, e in enumerate(edges):
        at = f"{where}: edges[{k}]"
        if not isinstance(e, Mapping) or "src" not in e or "dst" not in e or ("bytes" in e) == ("time" in e):
            raise ProfileError(f"{at} must be {{src, dst}} with exactly one of 'bytes' or 'time'")
        src, dst = _node_name(at, e["src"], "'src'"), _node_name(at, e["dst"], "'dst'")
        if src not in index or dst not in index:
            raise ProfileError(f"{at}: node '{src if src not in index else dst}' is not in graph "
                               f"'{graph.name}'{_coarsened(graph)}")
        key = (index[src], index[dst])
        if key not in lookup:
            raise ProfileError(f"{at}: graph '{graph.name}' has no edge {src} -> {dst}")
        if key in seen:
            raise ProfileError(f"{at}: edge {src} -> {dst} is given twice (also edges[{seen[key]}]): give it once")
        seen[key] = k
        if "bytes" in e:
            ebytes[lookup[key]] = _number(at, e["bytes"], what="bytes")
            continue
        t = _number(at, e["time"], what="time") * scale
        if link is not None:
            lat, bw = link
            ebytes[lookup[key]] = max(t - lat, 0.0) * bw
            if t < lat:
                low.append(f"edges[{k}] {src} -> {dst} time {e['time']!r} {unit}")
            if not math.isfinite(ebytes[lookup[key]]):
                raise ProfileError(f"{at}: time {e['time']!r} gives {ebytes[lookup[key]]:g} bytes on time_link: "
                                   "give the edge's 'bytes' instead")
    if low:
        _warn(f"{where}: {', '.join(low)} {'is' if len(low) == 1 else 'are'} below time_link's latency "
              f"({link[0] / scale:g} {unit}): priced as 0 bytes; give the edge's 'bytes' instead")
    return ebytes


def _colocate(where: str, value: Any, graph: CompGraph, index: Mapping[str, int]) -> list[list[int]]:
    """The ``colocate`` groups as node indices."""
    if value is not None and not isinstance(value, list):
        raise ProfileError(f"{where}: 'colocate' must be a list of node-name lists, got {value!r}")
    groups = []
    for k, grp in enumerate(value or []):
        at = f"{where}: colocate[{k}]"
        if not isinstance(grp, list):
            raise ProfileError(f"{at} must be a list of node names, got {grp!r}")
        names = [_node_name(at, x, "each entry") for x in grp]
        bad = next((x for x in names if x not in index), None)
        if bad is not None:
            raise ProfileError(f"{at} names '{bad}', not a node of graph '{graph.name}'")
        groups.append(sorted(index[x] for x in names))
    return groups


def _time_link(where: str, value: Any, topology: DeviceTopology) -> tuple[float, float] | None:
    """``(latency, bandwidth)`` of the link edge times were measured on; None on one device (no transfers)."""
    names = topology.device_names
    if topology.num_devices < 2:
        return None
    if value is None:
        a, b = 0, 1
    else:
        if not isinstance(value, list) or len(value) != 2 or any(x not in names for x in value) or value[0] == value[1]:
            raise ProfileError(f"{where}: time_link must name two devices of topology '{topology.name}', got {value!r}")
        a, b = names.index(value[0]), names.index(value[1])
    return float(topology.link_latency[a, b]), float(topology.link_bandwidth[a, b])
