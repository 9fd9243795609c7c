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

The reading lives beside this module: the file and its values in ``_costs_read``, edges, colocation and the batch in
``_costs_edges``, a profile's links and labels in ``_costs_profile``, the plausibility warnings in
``_costs_plausible``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from placement_rl.cost._costs_edges import _at_graph_batch, _colocate, _edge_bytes
from placement_rl.cost._costs_plausible import IMPLAUSIBLE, LIKELY_UNIT, _warn_implausible
from placement_rl.cost._costs_profile import OTHER_CPU, _note_unnamed_cpus, _profile_label, _profile_links
from placement_rl.cost._costs_read import UNITS, _coarsened, _device_keys, _number, _per_device, _read, _warn
from placement_rl.cost.modes import MODES, inference_costs
from placement_rl.cost.resolve import resolve_costs
from placement_rl.cost.types import CostTable
from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

__all__ = ["IMPLAUSIBLE", "LIKELY_UNIT", "OTHER_CPU", "SCHEMA", "UNITS", "load_costs", "restriction_errors",
           "stage_restriction_errors"]

SCHEMA = "placement_rl.costs"
VERSION = 1


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
