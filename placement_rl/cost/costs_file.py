"""Measured costs from a file: per node and device kind forward / backward time and memory, per edge bytes or a
measured transfer time, colocation groups and device restrictions -- what every command reads with
``costs.path=<file>`` instead of estimating times from FLOPs.

Format (JSON, or YAML with the same fields)::

    schema: placement_rl.costs          # required
    version: 1                          # required
    time_unit: ms                       # s (default), ms or us: the unit of every time in the file
    batch_size: 32                      # optional: the batch the times were measured at (see below)
    mode: train                         # optional: train (default) or inference (backward times may be omitted)
    nodes:                              # one entry per graph node, by its name in the graph
      layer0:
        fwd: {gpu: 1.2, cpu: 30.0}      # per device: its name, else its model, else its kind (gpu / cpu);
                                        # keys no device of the topology has are ignored (a warning names them)
        bwd: {gpu: 2.4, cpu: 60.0}      # required in train mode
        param_bytes: 4.0e6              # optional: replaces the graph's (training state is 4 x this)
        act_bytes: 1.0e6                # optional: bytes kept for the backward, replaces the graph's
        memory: {gpu: 2.0e6}            # optional: the same as act_bytes, per kind (the largest of the
                                        # topology's kinds is used)
        devices: [gpu0, gpu1]           # optional: the only devices this node may run on
    edges:                              # optional: per edge the tensor's bytes or a measured transfer time
      - {src: layer0, dst: layer1, bytes: 2.0e6}
      - {src: layer1, dst: layer2, time: 0.4}
    time_link: [gpu0, gpu1]             # the link edge times were measured on (default: the first two devices)
    colocate: [[layer0, layer1]]        # optional: node groups that must share a device / a stage

An edge time ``t`` becomes the bytes that take ``t`` on ``time_link``: ``(t - latency) x bandwidth`` (on one
device, where nothing is transferred, the graph's bytes stay; a time below the latency is 0 bytes, with a warning).
Times measured at a ``batch_size`` other than the graph's own batch (``plans.graph_batch_size``) are scaled to it
linearly, ``x graph batch / batch_size``, as ``simulate_pipeline`` scales a node's time to a micro-batch: every
placement and stage plan then prices the graph's batch (a note line says so; a graph that records no batch takes
the times as they are and pipelines scale from ``batch_size``). Every node of the graph needs a forward time (and in
train mode a backward time) for every device of the topology. A key or an edge given twice is refused. Memory
fields are written into the graph (``load_costs`` returns it with the table): ``memory`` replaces ``act_bytes``, the
parameters stay the graph's unless ``param_bytes`` is given. Implausible times are warnings (``_warn_implausible``),
for a costs file and a profile alike. A measured profile written by
``placement-rl profile`` (schema ``placement_rl.profile``) is read as well: its times go through
``resolve_costs``, its ``copy`` link fits replace the topology's links between two torch devices of one host (a
pair on one torch device, e.g. two logical CPUs, keeps the topology's: its copy moves nothing), and each measured
device's cost source says what was profiled and which links price the transfers (``measured:p.json:cpu (AMD EPYC,
1 thread; links: topology)``), and the topology's model where it names another (where a CPU device names none and
the times are typically over ``OTHER_CPU`` x off its estimate, a note line says it is likely another CPU). Times
it cannot be right about (a node the graph lacks) are refused, implausible ones (zero for a node with FLOPs, over
``IMPLAUSIBLE`` x the topology's estimate) are a warning line on stderr. Any problem is one ``ProfileError`` line
naming the file and what to fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from placement_rl.cost.modes import MODES, inference_costs
from placement_rl.cost.resolve import resolve_costs
from placement_rl.cost.types import CostTable
from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

SCHEMA = "placement_rl.costs"
VERSION = 1
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
IMPLAUSIBLE = 1e4  # a measured time this many times the topology's own estimate is a hand edit or a broken run
LIKELY_UNIT = 300.0  # most times this many times the estimate: one factor on every time, e.g. ms read as s
OTHER_CPU = 4.0  # a profile's CPU times typically this far off a CPU device's estimate: likely another CPU


class _DuplicateKey(ValueError):
    """A key given twice in one JSON object or YAML mapping (the parsers would keep the last in silence)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, refusing a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key '{key}' is given twice in one object")
        out[key] = value
    return out


def _unique_yaml_loader() -> type:
    """A ``yaml.SafeLoader`` that refuses a mapping key given twice (merge keys ``<<`` may still be overridden)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = self.construct_object(key_node, deep=deep)
                    if key in seen:
                        mark = key_node.start_mark
                        raise _DuplicateKey(f"key '{key}' is given twice in one mapping (line {mark.line + 1})")
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)
    return UniqueKeyLoader


def _read(path: str | os.PathLike) -> tuple[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"costs file '{p}' does not exist")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{p}: cannot read costs file ({exc.__class__.__name__})") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            return str(p), _load_yaml(p, text)
        try:
            return str(p), json.loads(text, object_pairs_hook=_unique_pairs)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{p}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise ProfileError(f"{p}: {exc}: give each entry once") from None


def _load_yaml(p: Path, text: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_unique_yaml_loader())  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ProfileError(f"{p}: malformed YAML ({str(exc).splitlines()[0]})") from None


def _number(where: str, value: Any, *, what: str) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 4.0e6 (no sign in the exponent) as a string, as the topology reader
        try:                    # takes it
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{where}: {what} must be a number >= 0, got {value!r}")
    return float(value)


def _per_device(where: str, value: Any, topology: DeviceTopology, what: str, scale: float) -> np.ndarray:
    """One value per device from a number or a mapping keyed by device name, model or kind."""
    if not isinstance(value, Mapping):
        return np.full(topology.num_devices, _number(where, value, what=what) * scale)
    out = np.empty(topology.num_devices)
    for j, dev in enumerate(topology.devices):
        key = next((k for k in (dev.name, dev.model, dev.kind) if k and k in value), None)
        if key is None:
            raise ProfileError(f"{where}: {what} has no entry for device '{dev.name}' (kind {dev.kind}"
                               f"{', model ' + dev.model if dev.model else ''}): give one keyed by its name, model "
                               "or kind")
        out[j] = _number(where, value[key], what=f"{what}['{key}']") * scale
    return out


def load_costs(path: str | os.PathLike, graph: CompGraph, topology: DeviceTopology) -> tuple[CompGraph, CostTable]:
    """The graph (memory fields and edge bytes from the file) and its ``CostTable`` from a costs file."""
    where, data = _read(path)
    if isinstance(data, Mapping) and data.get("schema") == "placement_rl.profile":
        from placement_rl.profiling.db import ProfileDB, precision

        db = ProfileDB.load(path)
        foreign = db.foreign_nodes(graph)
        if foreign is not None:
            raise ProfileError(f"{where}: node '{foreign[1]}' (times on '{foreign[0]}') is not in graph '{graph.name}' "
                               f"(fingerprint {graph.fingerprint()}): remove it from the profile, or re-profile")
        linked, links = _profile_links(db, topology)
        costs = resolve_costs(graph, linked, profiles=db)
        if not any(src.startswith("measured:") for src in costs.source):  # a profile of another graph or host
            other = db.other_capture(graph)  # the same node names at another batch size or shapes
            raise ProfileError(f"{where}: {other}" if other else f"{where}: {db.why_no_times(graph, topology)}: "
                               "profile this graph (`placement-rl profile`), or leave costs.path out for the estimates")
        estimate = resolve_costs(graph, linked)
        _warn_implausible(where, graph, costs, estimate)
        _note_unnamed_cpus(where, db, topology, costs, estimate)
        prec = precision(graph.meta)
        source = tuple(_profile_label(src, db, dev, links, prec) if src.startswith("measured:") else src
                       for src, dev in zip(costs.source, topology.devices))
        return graph, dataclasses.replace(costs, source=source, meta={**dict(costs.meta), "links": links})
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: top level must be a mapping with schema '{SCHEMA}'")
    if data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: field 'schema' is {data.get('schema')!r}, expected '{SCHEMA}' (or a "
                           "'placement_rl.profile' written by `placement-rl profile`)")
    if data.get("version") != VERSION:
        raise ProfileError(f"{where}: unknown costs file version {data.get('version')!r} (this release reads "
                           f"{VERSION})")
    unknown = set(data) - {"schema", "version", "time_unit", "batch_size", "mode", "nodes", "edges", "time_link",
                           "colocate", "meta", "source"}
    if unknown:
        raise ProfileError(f"{where}: unknown field '{sorted(unknown)[0]}'")
    unit = data.get("time_unit", "s")
    if unit not in UNITS:
        raise ProfileError(f"{where}: time_unit is {unit!r}: choose one of {', '.join(UNITS)}")
    scale = UNITS[unit]
    mode = data.get("mode", "train")
    if mode not in MODES:
        raise ProfileError(f"{where}: mode is {mode!r}: choose one of {', '.join(MODES)}")
    batch = data.get("batch_size")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ProfileError(f"{where}: batch_size must be a positive integer or absent, got {batch!r}")
    nodes = data.get("nodes")
    if not isinstance(nodes, Mapping) or not nodes:
        raise ProfileError(f"{where}: field 'nodes' must map every node name of graph '{graph.name}' to its times")
    index = {nm: i for i, nm in enumerate(graph.names)}
    extra = [k for k in nodes if k not in index]
    if extra:
        raise ProfileError(f"{where}: node '{extra[0]}' is not in graph '{graph.name}' (fingerprint "
                           f"{graph.fingerprint()}){_coarsened(graph)}")
    missing = [nm for nm in graph.names if nm not in nodes]
    if missing:
        raise ProfileError(f"{where}: node '{missing[0]}' of graph '{graph.name}' has no entry "
                           f"({len(missing)} missing): give fwd (and bwd) times for every node")
    n, d = graph.num_nodes, topology.num_devices
    fwd, bwd = np.zeros((n, d)), np.zeros((n, d))
    params, acts = np.array(graph.param_bytes, dtype=float), np.array(graph.act_bytes, dtype=float)
    allowed: dict[int, list[int]] = {}
    kinds, unused = _device_keys(topology), set()
    for nm, entry in nodes.items():
        i, at = index[nm], f"{where}: node '{nm}'"
        if not isinstance(entry, Mapping):
            raise ProfileError(f"{at} must be a mapping with 'fwd' (and 'bwd') times")
        bad = set(entry) - {"fwd", "bwd", "param_bytes", "act_bytes", "devices", "memory"}
        if bad:
            raise ProfileError(f"{at}: unknown field '{sorted(bad)[0]}'")
        if "fwd" not in entry:
            raise ProfileError(f"{at} has no 'fwd' time")
        unused |= {str(k) for key in ("fwd", "bwd", "memory") if isinstance(entry.get(key), Mapping)
                   for k in entry[key] if k not in kinds}
        fwd[i] = _per_device(at, entry["fwd"], topology, "fwd", scale)
        if "bwd" in entry:
            bwd[i] = _per_device(at, entry["bwd"], topology, "bwd", scale)
        elif mode == "train":
            raise ProfileError(f"{at} has no 'bwd' time (required with mode train; set mode: inference for "
                               "forward-only costs)")
        for key, arr in (("param_bytes", params), ("act_bytes", acts)):
            if key in entry:
                arr[i] = _number(at, entry[key], what=key)
        if "memory" in entry:  # bytes the node pins beyond its parameters' training state: its kept activations
            mem = entry["memory"]  # (the parameters stay the graph's or param_bytes: they price the gradient sync)
            if isinstance(mem, Mapping) and mem:  # the largest entry given: the kinds it leaves out need none
                given = {k: _number(at, v, what=f"memory['{k}']") for k, v in mem.items()}
                here = [v for k, v in given.items() if k in kinds]  # a kind the topology lacks pins nothing here
                acts[i] = max(here) if here else acts[i]
            else:
                acts[i] = float(_per_device(at, mem, topology, "memory", 1.0).max())
        if "devices" in entry:
            devs = entry["devices"]
            if not isinstance(devs, list) or not devs:
                raise ProfileError(f"{at}: 'devices' must be a non-empty list of device names")
            names = topology.device_names
            unknown_dev = [x for x in devs if x not in names]
            if unknown_dev:
                raise ProfileError(f"{at}: device '{unknown_dev[0]}' is not in topology '{topology.name}' "
                                   f"(devices: {', '.join(names)})")
            allowed[i] = sorted(names.index(x) for x in devs)
    if unused:
        _warn(f"{where}: entries for {', '.join(repr(k) for k in sorted(unused))} match no device of topology "
              f"'{topology.name}' (by name, model or kind) and are ignored")
    ebytes = _edge_bytes(where, data, graph, topology, index, unit)
    colocate = _colocate(where, data.get("colocate"), graph, index)
    new_graph = graph
    if (not np.array_equal(params, graph.param_bytes) or not np.array_equal(acts, graph.act_bytes)
            or not np.array_equal(ebytes, graph.edge_bytes)):
        new_graph = dataclasses.replace(graph, param_bytes=params, act_bytes=acts, edge_bytes=ebytes)
        new_graph.validate()
    meta: dict[str, Any] = {"costs_file": where, "colocate": colocate,
                            "allowed": {str(i): v for i, v in allowed.items()}}
    fwd, bwd, batch = _at_graph_batch(where, fwd, bwd, batch, graph, meta)
    if batch is not None:
        meta["batch_size"] = batch
    base = resolve_costs(new_graph, topology)  # links (latency, bandwidth) of the topology, and the estimates
    costs = CostTable(fwd_time=fwd, bwd_time=bwd, link_latency=base.link_latency, link_bandwidth=base.link_bandwidth,
                      source=(f"measured:{Path(where).name}",) * d, graph_fingerprint=new_graph.fingerprint(),
                      topology_name=topology.name, meta=meta)
    _warn_implausible(where, new_graph, costs, base, fix=f"check the file's times and its time_unit ({unit!r})")
    return new_graph, (inference_costs(costs) if mode == "inference" else costs)


def _node_name(at: str, value: Any, what: str) -> str:
    """A node name where the file must give one (a list or a mapping there is one line, not a ``TypeError``)."""
    if not isinstance(value, str):
        raise ProfileError(f"{at}: {what} must be a node name, got {value!r}")
    return value


def _warn(text: str) -> None:
    """One warning line on stderr."""
    import sys

    print(f"warning: {text}", file=sys.stderr)


def _device_keys(topology: DeviceTopology) -> set[str]:
    """What a per-device mapping may be keyed by: the topology's device names, models and kinds."""
    return {k for dev in topology.devices for k in (dev.name, dev.model, dev.kind) if k}


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


def _profile_links(db: Any, topology: DeviceTopology) -> tuple[DeviceTopology, str]:
    """``topology`` with the profile's measured ``copy`` fits on the links between two torch devices of one host
    where the profile has them, and ``measured`` / ``topology``: what prices the transfers."""
    bw, lat = np.array(topology.link_bandwidth), np.array(topology.link_latency)
    measured = False
    for i, a in enumerate(topology.devices):
        for j in range(i + 1, topology.num_devices):
            b = topology.devices[j]
            got = db.link(a.torch_device, b.torch_device) if a.host == b.host else None
            if got is None or _torch_device(a.torch_device) == _torch_device(b.torch_device):
                continue
            lat[i, j] = lat[j, i] = got[0]
            bw[i, j] = bw[j, i] = got[1]
            measured = True
    if not measured:
        return topology, "topology"
    return dataclasses.replace(topology, link_bandwidth=bw, link_latency=lat), "measured"


def _torch_device(name: str) -> str:
    return "cuda:0" if name == "cuda" else name


def _same_model(a: str, b: str) -> bool:
    """Whether two hardware names share a model number (``Tesla V100-PCIE-32GB`` / ``V100-PCIe-32GB``)."""
    import re

    def numbers(x: str) -> set[str]:
        return {t for t in re.split(r"[^a-z0-9]+", x.lower()) if any(c.isdigit() for c in t)}
    return bool(numbers(a) & numbers(b)) or a.strip().lower() == b.strip().lower()


def _profile_label(source: str, db: Any, device: Any, links: str, precision: str = "fp32") -> str:
    """A measured device's cost source with what the profile measured (precision where not fp32, model, threads)
    and, where the topology names another model for the device it prices, that one: ``measured:p.json:cpu (AMD
    EPYC, 1 thread; links: topology)``, ``measured:p.json:cuda:0 (fp16, NVIDIA H100 ...; links: ...)``."""
    rec = db.data["devices"].get(db.resolve_device(device) or "", {})
    what = [precision] if precision != "fp32" else []
    what += [str(rec["model"])] if rec.get("model") else []
    if rec.get("kind") == "cpu" and isinstance(rec.get("threads"), int):
        what.append(f"{rec['threads']} thread{'s' if rec['threads'] != 1 else ''}")
    if device.model and rec.get("model") and not _same_model(device.model, str(rec["model"])):
        what.append(f"pricing {device.name}, a {device.model}")
    return f"{source} ({', '.join(what) + '; ' if what else ''}links: {links})"


def _note_unnamed_cpus(where: str, db: Any, topology: DeviceTopology, costs: CostTable, estimate: CostTable) -> None:
    """A note line on stderr where the profile's CPU times price CPU devices whose model the topology does not name
    and are typically more than ``OTHER_CPU`` x off the topology's own estimate for them (either way): likely
    another CPU or thread count, which the cost source cannot name (``_profile_label`` names a different model
    where the topology gives one)."""
    import sys

    found: dict[str, list[int]] = {}
    for j, (src, dev) in enumerate(zip(costs.source, topology.devices)):
        rec = db.data["devices"].get(db.resolve_device(dev) or "", {})
        if src.startswith("measured:") and dev.kind == "cpu" and not dev.model and rec.get("model"):
            found.setdefault(str(rec["model"]), []).append(j)
    for model, cols in found.items():
        ratio = _typical_ratio(costs.fwd_time[:, cols], estimate.fwd_time[:, cols])
        if ratio > OTHER_CPU or 0 < ratio * OTHER_CPU < 1:
            names = ", ".join(topology.devices[j].name for j in cols)
            print(f"note: {where}: the profile's CPU times ({model}) are typically {ratio:.3g} x the estimate for "
                  f"{names}, whose model topology '{topology.name}' does not name: likely another CPU or thread "
                  "count (give the device a 'model' to have it named in the cost source)", file=sys.stderr)


def _warn_implausible(where: str, graph: CompGraph, costs: CostTable, estimate: CostTable, show: int = 3, *,
                      fix: str = "check the file or re-profile") -> None:
    """One warning line on stderr per kind of implausible measured time: zero forward time for a node with FLOPs, a
    time over ``IMPLAUSIBLE`` x the topology's estimate (hand edits, broken runs), and most nodes' times over
    ``LIKELY_UNIT`` x it (a unit mistake: one factor on every time, under ``IMPLAUSIBLE``)."""
    import sys

    measured = [j for j, src in enumerate(costs.source) if src.startswith("measured:")]
    zero, huge = [], []
    for i, name in enumerate(graph.names):
        t = [(costs.fwd_time[i, j], costs.bwd_time[i, j], estimate.fwd_time[i, j], estimate.bwd_time[i, j])
             for j in measured]
        if graph.fwd_flops[i] > 0 and any(f == 0 for f, _, _, _ in t):
            zero.append(name)
        elif any(f > IMPLAUSIBLE * ef > 0 or b > IMPLAUSIBLE * eb > 0 for f, b, ef, eb in t):
            huge.append(f"{name} {max(max(f, b) for f, b, _, _ in t):.3g} s")
    for found, what in ((zero, f"a forward time of 0 for {'nodes' if len(zero) != 1 else 'a node'} with FLOPs"),
                        (huge, f"times over {IMPLAUSIBLE:g} x the topology's estimate")):
        if found:
            more = f", ... ({len(found)} in all)" if len(found) > show else ""
            print(f"warning: {where}: {what}: {', '.join(found[:show])}{more}; {fix}", file=sys.stderr)
    ratio = _typical_ratio(costs.fwd_time[:, measured], estimate.fwd_time[:, measured])
    if ratio > LIKELY_UNIT:
        print(f"warning: {where}: most forward times are over {LIKELY_UNIT:g} x the topology's estimate (typically "
              f"{ratio:.3g} x): a unit mistake? {fix}", file=sys.stderr)


def _typical_ratio(times: np.ndarray, estimate: np.ndarray) -> float:
    """The median over nodes of a node's largest measured / estimated forward time (nodes estimated at 0 left out);
    0 where no node has an estimate."""
    ok = (estimate > 0).all(axis=1) & (times > 0).any(axis=1)
    if not ok.any():
        return 0.0
    return float(np.median((times[ok] / estimate[ok]).max(axis=1)))


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


def restriction_errors(costs: CostTable, device_of_node: np.ndarray, names: tuple[str, ...],
                       devices: tuple[str, ...]) -> list[str]:
    """What an op placement breaks of the costs file's device restrictions and colocation groups."""
    out = []
    for node, devs in (costs.meta.get("allowed") or {}).items():
        i = int(node)
        if int(device_of_node[i]) not in devs:
            out.append(f"node '{names[i]}' may run only on {', '.join(devices[x] for x in devs)}, not on "
                       f"{devices[int(device_of_node[i])]}")
    for grp in costs.meta.get("colocate") or []:
        if len({int(device_of_node[i]) for i in grp}) > 1:
            out.append(f"colocated nodes {', '.join(names[i] for i in grp)} are on different devices")
    return out


def stage_restriction_errors(costs: CostTable, stage_of_node: np.ndarray, groups, names: tuple[str, ...],
                             devices: tuple[str, ...]) -> list[str]:
    """The same for a stage plan: every device of a node's stage must be allowed, a colocation group one stage."""
    out = []
    for node, devs in (costs.meta.get("allowed") or {}).items():
        i = int(node)
        bad = [d for d in groups[int(stage_of_node[i])] if d not in devs]
        if bad:
            out.append(f"node '{names[i]}' may run only on {', '.join(devices[x] for x in devs)}, but its stage "
                       f"uses {devices[bad[0]]}")
    for grp in costs.meta.get("colocate") or []:
        if len({int(stage_of_node[i]) for i in grp}) > 1:
            out.append(f"colocated nodes {', '.join(names[i] for i in grp)} are in different stages")
    return out


__all__ = ["SCHEMA", "load_costs", "restriction_errors", "stage_restriction_errors"]


def _coarsened(graph: CompGraph) -> str:
    """The hint for a node name the graph lacks where the command coarsened it (a group renamed even one node)."""
    if graph.members and any(len(m) > 1 or m[0] != nm for nm, m in zip(graph.names, graph.members)):
        return (" (this graph is coarsened: its nodes are groups of the captured ones, named by module path; "
                "graph.coarsen.enabled=false keeps the names the file uses)")
    return ""
