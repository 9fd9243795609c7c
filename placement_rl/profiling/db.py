"""``ProfileDB``: measured per-node times and link fits, as a versioned JSON file (never pickle).

Schema ``placement_rl.profile`` version 1::

    {"schema": "placement_rl.profile", "version": 1,
     "env": {"host", "torch", "cuda_runtime", "cuda_driver", "python", "created"},
     "devices": {name: {"torch_device", "kind", "model", "host", "threads", "env": {...}}},
     "graphs": {fingerprint: {"name", "nodes": [name, ...], "signatures": [sig, ...], "batch_size" (optional),
                              "precision" (optional; absent: fp32),
                              "times": {device: {node: [fwd_med, fwd_iqr, bwd_med, bwd_iqr, repeats]}},
                              "step": {device: [median, iqr, repeats]},
                              "optimizer": {device: [median, iqr, repeats, param_bytes]}}},
     "ops": {device: {signature: [fwd_med, bwd_med, count]}},
     "links": [{"src", "dst", "backend", "latency", "bandwidth", "sizes": [...], "times": [...]}]}

Times are seconds (median of repeats, spread = inter-quartile range), bandwidth bytes/s, latency s.
A node's ``signature`` is ``op_type(shape, shape, ...)`` of its tensor inputs, then ``:bf16`` / ``:fp16`` /
``:fp64`` where its tensors are of another precision than fp32: the per-op table lets a graph that was never
profiled reuse the times of identical ops (``lookup`` falls back to it when every node's signature is known, see
``graph.meta["signatures"]``).

Precision: a graph's fingerprint and its ops' signatures name its precision (``precision``: ``meta["dtype"]``
and ``meta["param_dtype"]``) where it is not fp32, so a profile's times price only graphs of the precision it
measured; an entry records a precision other than fp32 in ``"precision"``.

Lookup (the cost model's ``CostSource`` hook): a topology device matches a profiled device through an
explicit ``device_map``; else a device profiled on this host with the same ``torch_device`` (the topology
runs here); else a device of the same name and kind profiled on another host (profiles shipped as data).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.errors import ProfileError
from placement_rl.graph.io import atomic_write_text
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import member_graph
from placement_rl.topology import Device, DeviceTopology

SCHEMA = "placement_rl.profile"
VERSION = 1
INF_BANDWIDTH = 1e18  # stands in for "no measurable per-byte cost" where a finite number is required


def environment() -> dict[str, Any]:
    """Host, torch and CUDA versions of this process (recorded with every profile)."""
    import torch

    env: dict[str, Any] = {"host": socket.gethostname(), "torch": torch.__version__,
                           "python": platform.python_version(), "cuda_runtime": torch.version.cuda,
                           "cuda_driver": None,
                           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        try:
            import pynvml

            pynvml.nvmlInit()
            drv = pynvml.nvmlSystemGetDriverVersion()
            env["cuda_driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
            pynvml.nvmlShutdown()
        except Exception:  # NVML is optional; the runtime version is still recorded
            env["cuda_driver"] = None
    return env


def device_record(device: Device) -> dict[str, Any]:
    """What is recorded about a profiled device: its torch device, hardware model and thread count."""
    import torch

    from placement_rl._local import cpu_model_name

    rec: dict[str, Any] = {"torch_device": device.torch_device, "kind": device.kind,
                           "host": socket.gethostname(), "threads": int(torch.get_num_threads())}
    if device.kind == "gpu" and torch.cuda.is_available():
        rec["model"] = torch.cuda.get_device_name(torch.device(device.torch_device))
    else:
        rec["model"] = cpu_model_name()
    return rec


def precision(meta: Mapping[str, Any]) -> str:
    """A graph's precision, as profiles record it: ``meta["dtype"]`` (absent: fp32), with ``meta["param_dtype"]``
    where that differs (``bf16 with fp32 parameters``)."""
    dtype = meta.get("dtype") or "fp32"
    params = meta.get("param_dtype") or dtype
    return dtype if params == dtype else f"{dtype} with {params} parameters"


def _stat(x: Any, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise ProfileError(f"{where}: expected a finite non-negative number, got {x!r}; re-profile")
    return float(x)


class ProfileDB:
    """An in-memory profile database bound to a JSON file (``save`` writes it atomically)."""

    def __init__(self, path: str | os.PathLike | None = None, *, device_map: Mapping[str, str] | None = None,
                 data: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.device_map = dict(device_map or {})
        self.data: dict[str, Any] = dict(data) if data is not None else {
            "schema": SCHEMA, "version": VERSION, "env": environment(),
            "devices": {}, "graphs": {}, "ops": {}, "links": []}

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: str | os.PathLike, *, device_map: Mapping[str, str] | None = None) -> "ProfileDB":
        """Read and validate a profile file; any problem is a one-line ``ProfileError`` naming the file."""
        p = Path(path)
        if not p.is_file():
            raise ProfileError(f"profile file '{p}' does not exist: run `placement-rl profile` to create it")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{p}: corrupted profile (malformed JSON at line {exc.lineno} column {exc.colno}: "
                               f"{exc.msg}); delete it and re-run `placement-rl profile`") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ProfileError(f"{p}: cannot read profile ({exc.__class__.__name__}); re-run `placement-rl profile`"
                               ) from None
        _validate(data, str(p))
        return cls(p, device_map=device_map, data=data)

    @classmethod
    def open(cls, path: str | os.PathLike, **kwargs: Any) -> "ProfileDB":
        """Load ``path`` if it exists (to resume or extend it), else start an empty DB bound to it."""
        return cls.load(path, **kwargs) if Path(path).exists() else cls(path, **kwargs)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ProfileError("ProfileDB.save needs a path: this DB was created without one")
        _validate(self.data, str(target))
        atomic_write_text(target, json.dumps(self.data, indent=1, allow_nan=False))
        self.path = target
        return target

    @property
    def label(self) -> str:
        src = self.data.get("env", {}).get("source")  # imported public measurements name their dataset
        if src:
            return f"{src}.json"
        return self.path.name if self.path is not None else "profile"

    # --------------------------------------------------------------- devices
    @property
    def device_names(self) -> list[str]:
        return sorted(self.data["devices"])

    def add_device(self, name: str, device: Device) -> None:
        self.data["devices"][name] = {**device_record(device), "env": environment()}

    def resolve_device(self, device: Device) -> str | None:
        """The profiled device a topology device stands for, or None (see the module docstring).

        Order: ``device_map``; a device profiled on this host with the same ``torch_device`` and kind (the
        topology runs here); a device of the same name and kind profiled on another host (shipped profiles).
        """
        devs = self.data["devices"]
        if device.name in self.device_map:
            name = self.device_map[device.name]
            if name not in devs:
                raise ProfileError(f"device_map sends '{device.name}' to '{name}', which profile {self.label} lacks "
                                   f"(profiled: {', '.join(self.device_names) or 'none'})")
            return name
        here = socket.gethostname()
        same = [n for n, r in devs.items() if r.get("host") == here and r.get("kind") == device.kind
                and _same_torch_device(r.get("torch_device", ""), device.torch_device)]
        if same:
            return device.name if device.name in same else same[0]
        rec = devs.get(device.name)
        if rec is not None and rec.get("host") != here and rec.get("kind") == device.kind:
            return device.name
        return None

    # ------------------------------------------------------------ node times
    def graph_entry(self, graph: CompGraph, *, create: bool = False) -> dict[str, Any] | None:
        fp = graph.fingerprint()
        entry = self.data["graphs"].get(fp)
        if entry is None and create:
            sigs = graph.meta.get("signatures")
            entry = {"name": graph.name, "nodes": list(graph.names),
                     "signatures": list(sigs) if isinstance(sigs, (list, tuple)) else [], "times": {}, "step": {}}
            batch = graph.meta.get("batch_size")
            if isinstance(batch, int) and not isinstance(batch, bool):
                entry["batch_size"] = batch
            if precision(graph.meta) != "fp32":
                entry["precision"] = precision(graph.meta)
            self.data["graphs"][fp] = entry
        return entry

    def node_times(self, graph: CompGraph, device_name: str) -> dict[str, list[float]]:
        """Profiled nodes of ``graph`` on ``device_name``: node -> [fwd, fwd_iqr, bwd, bwd_iqr, repeats]."""
        entry = self.graph_entry(graph)
        return {} if entry is None else dict(entry["times"].get(device_name, {}))

    def put_node(self, graph: CompGraph, device_name: str, node: str, fwd: Sequence[float],
                 bwd: Sequence[float], *, signature: str | None = None) -> None:
        """Record one node's timing samples (seconds) on a profiled device."""
        if device_name not in self.data["devices"]:
            raise ProfileError(f"device '{device_name}' is not in profile {self.label}: call add_device first")
        entry = self.graph_entry(graph, create=True)
        f, fi = _median_iqr(fwd)
        b, bi = _median_iqr(bwd) if len(bwd) else (0.0, 0.0)
        entry["times"].setdefault(device_name, {})[node] = [f, fi, b, bi, int(len(fwd))]
        if signature:
            ops = self.data["ops"].setdefault(device_name, {})
            old = ops.get(signature)
            if old is None:
                ops[signature] = [f, b, 1]
            else:  # running mean over identical ops
                k = old[2]
                ops[signature] = [(old[0] * k + f) / (k + 1), (old[1] * k + b) / (k + 1), k + 1]

    def put_step(self, graph: CompGraph, device_name: str, samples: Sequence[float]) -> None:
        """Record whole-step (forward + backward) samples of the module the graph was captured from."""
        med, iqr = _median_iqr(samples)
        self.graph_entry(graph, create=True)["step"][device_name] = [med, iqr, int(len(samples))]

    def put_optimizer(self, graph: CompGraph, device_name: str, samples: Sequence[float], param_bytes: float) -> None:
        """Record optimizer-step samples over all of the model's trainable parameters (``param_bytes``)."""
        med, iqr = _median_iqr(samples)
        entry = self.graph_entry(graph, create=True)
        entry.setdefault("optimizer", {})[device_name] = [med, iqr, int(len(samples)), float(param_bytes)]

    def optimizer_time(self, graph: CompGraph, device_name: str) -> tuple[float, float] | None:
        """``(seconds, param_bytes)`` of one optimizer step over the whole model on a profiled device."""
        entry = self.graph_entry(graph)
        got = None if entry is None else entry.get("optimizer", {}).get(device_name)
        return None if got is None else (float(got[0]), float(got[3]))

    def step_time(self, graph: CompGraph, device_name: str) -> float | None:
        entry = self.graph_entry(graph)
        got = None if entry is None else entry["step"].get(device_name)
        return None if got is None else float(got[0])

    def lookup(self, graph: CompGraph, device: Device) -> tuple[np.ndarray, np.ndarray, str] | None:
        """``(fwd [N], bwd [N], label)`` for ``graph`` on ``device``, or None when not profiled.

        Order: the graph's own entry; for a coarsened graph, the entry of the capture it was made from
        (``meta["member_graph"]``; by node names for a graph without that record) holding every member (a group's
        time is the sum of its members'); then the per-op signature table.
        """
        name = self.resolve_device(device)
        if name is None:
            return None
        label = f"{self.label}:{name}"
        times = self.node_times(graph, name)
        if times and all(n in times for n in graph.names):
            fwd = np.array([times[n][0] for n in graph.names])
            bwd = np.array([times[n][2] for n in graph.names])
            return fwd, bwd, label
        if graph.members is not None:
            got = self._lookup_members(graph, name)
            if got is not None:
                return got[0], got[1], label
        sigs = _op_signatures(graph)
        ops = self.data["ops"].get(name, {})
        if sigs and all(s in ops for s in sigs):
            return (np.array([ops[s][0] for s in sigs]), np.array([ops[s][1] for s in sigs]), f"{label}:ops")
        return None

    def _lookup_members(self, graph: CompGraph, device_name: str) -> tuple[np.ndarray, np.ndarray] | None:
        assert graph.members is not None
        wanted = {m for grp in graph.members for m in grp}
        for entry in self._member_candidates(graph):
            times = entry["times"].get(device_name, {})
            if wanted.issubset(times):
                fwd = np.array([sum(times[m][0] for m in grp) for grp in graph.members])
                bwd = np.array([sum(times[m][2] for m in grp) for grp in graph.members])
                return fwd, bwd
        return None

    def member_entry(self, graph: CompGraph) -> dict[str, Any] | None:
        """For a coarsened ``graph``: the entry that recorded every member (the captured graph ``profile``
        measures), or None."""
        if graph.members is None:
            return None
        wanted = {m for grp in graph.members for m in grp}
        return next((e for e in self._member_candidates(graph) if wanted <= set(e["nodes"])), None)

    def _member_candidates(self, graph: CompGraph) -> list[dict[str, Any]]:
        """The entries whose times may price a coarsened ``graph``'s members: the one recorded for the graph it was
        made from (``meta["member_graph"]``) where it carries that graph -- another entry with the same node names
        is another batch size or shapes -- else, for a graph without that record, every entry (matched by name)."""
        fine = member_graph(graph)
        if fine is None:
            return list(self.data["graphs"].values())
        entry = self.data["graphs"].get(fine[0].fingerprint())
        return [] if entry is None else [entry]

    def other_precision(self, graph: CompGraph) -> str | None:
        """For messages: where only entries of another precision hold every node of ``graph`` (or of the graph it
        was coarsened from), one line naming both precisions, else None."""
        own = precision(graph.meta)
        wanted = [set(graph.names)]
        if graph.members is not None:
            wanted.append({m for grp in graph.members for m in grp})
        found = [(fp, e) for fp, e in self.data["graphs"].items() if any(w <= set(e["nodes"]) for w in wanted)]
        if not found or any(e.get("precision", "fp32") == own for _, e in found):
            return None
        fp, entry = found[0]
        return (f"the profile's times for graph '{entry.get('name', graph.name)}' (fingerprint {fp}) were measured in "
                f"{entry.get('precision', 'fp32')}, graph '{graph.name}' (fingerprint {graph.fingerprint()}) is {own}: "
                f"a profile prices only the precision it measured; profile the {own} model")

    def other_capture(self, graph: CompGraph) -> str | None:
        """For messages: where ``graph``'s nodes have times only in an entry of another precision
        (``other_precision``), or a coarsened ``graph``'s members only in an entry of another capture (same node
        names; another batch size or shapes), what differs, else None."""
        other = self.other_precision(graph)
        if other is not None:
            return other
        fine = member_graph(graph)
        if fine is None or self._member_candidates(graph):
            return None
        wanted = {m for grp in graph.members or () for m in grp}
        found = next(((fp, e) for fp, e in self.data["graphs"].items() if wanted <= set(e["nodes"])), None)
        if found is None:
            return None
        fp, entry = found
        theirs, ours = entry.get("batch_size"), fine[0].meta.get("batch_size")
        if theirs is not None and ours is not None and theirs != ours:
            return (f"the profile was taken at batch {theirs}, graph '{graph.name}' is at batch {ours}: re-profile "
                    f"at batch {ours}, or use the graph at batch {theirs}")
        return (f"the profile's times for graph '{entry.get('name', graph.name)}' were taken on another capture "
                f"(fingerprint {fp}{f', batch {theirs}' if theirs is not None else ''}) than the graph "
                f"'{graph.name}' was made from (fingerprint {fine[0].fingerprint()}"
                f"{f', batch {ours}' if ours is not None else ''}): the same node names with other sizes (batch, "
                "shapes); re-profile this graph")

    def with_coarsened(self, graph: CompGraph) -> "ProfileDB":
        """This profile with an entry of its own for a coarsened ``graph`` it holds only uncoarsened (``place``
        writes the coarsened graph, ``profile`` records the captured one): a group's times are the sums of its
        members', the whole step and optimizer times the model's. Itself where nothing is to add."""
        entry = None if self.graph_entry(graph) is not None else self.member_entry(graph)
        if entry is None:
            return self
        assert graph.members is not None
        wanted = {m for grp in graph.members for m in grp}
        times = {dev: {name: [sum(t[m][0] for m in grp), 0.0, sum(t[m][2] for m in grp), 0.0,
                              min(t[m][4] for m in grp)] for name, grp in zip(graph.names, graph.members)}
                 for dev, t in entry["times"].items() if wanted <= set(t)}
        if not times:  # the members' entry names the nodes it lacks (``why_no_times``)
            return self
        own = {"name": graph.name, "nodes": list(graph.names), "signatures": [], "times": times,
               "step": dict(entry["step"]), "optimizer": dict(entry.get("optimizer", {})),
               **({"precision": entry["precision"]} if "precision" in entry else {})}
        return ProfileDB(self.path, device_map=self.device_map,
                         data={**self.data, "graphs": {**self.data["graphs"], graph.fingerprint(): own}})

    def missing_nodes(self, graph: CompGraph, device_name: str) -> list[str] | None:
        """For messages: the nodes of ``graph`` (for a coarsened graph, its members) the entry recorded for it
        has no times for on ``device_name`` (empty: none missing), or None when no entry holds the graph."""
        entry = self.graph_entry(graph)
        wanted = list(graph.names) if entry is not None else None
        if entry is None and graph.members is not None:
            wanted = [m for grp in graph.members for m in grp]
            entry = self.member_entry(graph)
        if entry is None or wanted is None:
            return None
        times = entry["times"].get(device_name, {})
        return [n for n in wanted if n not in times]

    def foreign_nodes(self, graph: CompGraph) -> tuple[str, str] | None:
        """For a profile read as ``graph``'s costs: a ``(device, node)`` whose times the entry holding ``graph``
        (under its fingerprint, else its members') has for a node neither that entry nor ``graph`` has, or None."""
        entry = self.graph_entry(graph) or self.member_entry(graph)
        if entry is None:
            return None
        known = set(entry["nodes"]) | set(graph.names) | {m for grp in graph.members or () for m in grp}
        return next(((dev, n) for dev, t in sorted(entry["times"].items()) for n in t if n not in known), None)

    def why_no_times(self, graph: CompGraph, topology: DeviceTopology, *, show: int = 3) -> str:
        """For messages: why ``lookup`` finds no times for ``graph`` on ``topology``'s devices -- its members
        profiled in another capture (``other_capture``), the nodes it lacks (the first ``show`` named) on the
        profiled device they resolve to, else the graphs and devices the profile holds."""
        other = self.other_capture(graph)
        if other is not None:
            return other
        for dev in topology.devices:
            name = self.resolve_device(dev)
            missing = self.missing_nodes(graph, name) if name is not None else None
            if missing:
                more = f", ... ({len(missing)} in all)" if len(missing) > show else ""
                return (f"the profile lacks times for {len(missing)} node{'s' if len(missing) != 1 else ''} of "
                        f"graph '{graph.name}' on device '{name}' ({', '.join(missing[:show])}{more})")
        here = socket.gethostname()
        elsewhere = {n: r.get("host") for n, r in self.data["devices"].items() if r.get("host") != here}
        if elsewhere and not any(self.resolve_device(d) for d in topology.devices):
            names = sorted(elsewhere)
            return (f"its device{'s' if len(names) != 1 else ''} "
                    f"{', '.join(f'{n} (host {elsewhere[n]})' for n in names)} {'were' if len(names) != 1 else 'was'}"
                    f" profiled on another host than this one ({here}) and price{'' if len(names) != 1 else 's'} only"
                    f" a topology device named {' or '.join(names)} (topology '{topology.name}' has "
                    f"{', '.join(topology.device_names)})")
        graphs = sorted({str(e.get("name", "?")) for e in self.data["graphs"].values()})
        return (f"the profile has no times for graph '{graph.name}' (fingerprint {graph.fingerprint()}) on any "
                f"device of topology '{topology.name}' (it holds graph{'s' if len(graphs) != 1 else ''} "
                f"{', '.join(graphs) or 'none'} on {', '.join(self.device_names) or 'no device'})")

    # ------------------------------------------------------------------ links
    def put_link(self, src: str, dst: str, backend: str, sizes: Sequence[float], times: Sequence[float],
                 latency: float, bandwidth: float) -> None:
        """Record a link fit ``time = latency + bytes / bandwidth`` (replaces an earlier one)."""
        rec = {"src": src, "dst": dst, "backend": backend, "latency": float(latency),
               "bandwidth": float(min(bandwidth, INF_BANDWIDTH)),
               "sizes": [float(s) for s in sizes], "times": [float(t) for t in times]}
        self.data["links"] = [r for r in self.data["links"]
                              if (r["src"], r["dst"], r["backend"]) != (src, dst, backend)] + [rec]

    def links(self, backend: str | None = None) -> list[dict[str, Any]]:
        return [dict(r) for r in self.data["links"] if backend is None or r["backend"] == backend]

    def link(self, src_torch: str, dst_torch: str, backend: str = "copy") -> tuple[float, float] | None:
        """``(latency, bandwidth)`` measured between two torch devices (either direction), or None."""
        for r in self.data["links"]:
            if r["backend"] == backend and {r["src"], r["dst"]} == {src_torch, dst_torch}:
                return float(r["latency"]), float(r["bandwidth"])
        return None

    def apply_links(self, topology: DeviceTopology, *, backend: str = "copy") -> DeviceTopology:
        """A copy of ``topology`` whose links are replaced by measured fits where this DB has them.

        Pairs are matched through the devices' ``torch_device`` (a same-device pair, e.g. two logical CPU
        devices, uses the measured in-place ``.to()`` cost). ``meta["link_sources"]`` says which were measured.
        """
        n = topology.num_devices
        bw, lat = np.array(topology.link_bandwidth), np.array(topology.link_latency)
        sources: dict[str, str] = {}
        for i in range(n):
            for j in range(i + 1, n):
                a, b = topology.devices[i], topology.devices[j]
                got = self.link(a.torch_device, b.torch_device, backend)
                pair = f"{a.name}<->{b.name}"
                if got is None:
                    sources[pair] = "topology"
                    continue
                lat[i, j] = lat[j, i] = got[0]
                bw[i, j] = bw[j, i] = got[1]
                sources[pair] = f"measured:{self.label}:{backend}"
        return DeviceTopology(name=topology.name, devices=topology.devices, link_bandwidth=bw, link_latency=lat,
                              link_kind=topology.link_kind, description=topology.description,
                              meta={**dict(topology.meta), "link_sources": sources})


def _op_signatures(graph: CompGraph) -> list[str] | None:
    """``graph.meta["signatures"]`` where the per-op table may price them: one per node and, for a graph of another
    precision than fp32, naming a precision (signatures taken before they did would read as fp32 ops)."""
    sigs = graph.meta.get("signatures")
    if not isinstance(sigs, (list, tuple)) or not sigs or len(sigs) != graph.num_nodes:
        return None
    if precision(graph.meta) != "fp32" and all(str(s).endswith("]") for s in sigs):  # no ``:bf16`` suffix
        return None
    return list(sigs)


def _same_torch_device(a: str, b: str) -> bool:
    def norm(x: str) -> str:
        return "cuda:0" if x == "cuda" else x
    return norm(a) == norm(b)


def _median_iqr(samples: Sequence[float]) -> tuple[float, float]:
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ProfileError("no timing samples to record: repeats must be >= 1")
    q25, q50, q75 = np.percentile(x, [25, 50, 75])
    return float(q50), float(q75 - q25)


def _validate(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: not a profile (top level must be a JSON object); re-run `placement-rl profile`")
    if data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: field 'schema' is {data.get('schema')!r}, expected '{SCHEMA}': "
                           "not a profile file")
    if data.get("version") != VERSION:
        raise ProfileError(f"{where}: unknown profile schema version {data.get('version')!r} "
                           f"(this release reads version {VERSION}); re-run `placement-rl profile`")
    for key, typ in (("env", dict), ("devices", dict), ("graphs", dict), ("ops", dict), ("links", list)):
        if not isinstance(data.get(key), typ):
            raise ProfileError(f"{where}: field '{key}' must be a JSON {typ.__name__}; the file is damaged")
    for name, rec in data["devices"].items():
        if not isinstance(rec, dict) or not isinstance(rec.get("torch_device"), str):
            raise ProfileError(f"{where}: device '{name}' lacks a 'torch_device'; the file is damaged")
    for fp, entry in data["graphs"].items():
        w = f"{where}: graph {fp}"
        if not isinstance(entry, dict) or not isinstance(entry.get("times"), dict) \
                or not isinstance(entry.get("step"), dict) or not isinstance(entry.get("nodes"), list):
            raise ProfileError(f"{w} must hold 'nodes', 'times' and 'step'; the file is damaged")
        for dev, nodes in entry["times"].items():
            if dev not in data["devices"] or not isinstance(nodes, dict):
                raise ProfileError(f"{w}: times for unknown device '{dev}'; the file is damaged")
            for node, row in nodes.items():
                if not isinstance(row, list) or len(row) != 5:
                    raise ProfileError(f"{w}: node '{node}' on '{dev}' must be [fwd, fwd_iqr, bwd, bwd_iqr, repeats]")
                for x in row:
                    _stat(x, f"{w}: node '{node}' on '{dev}'")
        for dev, row in entry["step"].items():
            if not isinstance(row, list) or len(row) != 3:
                raise ProfileError(f"{w}: step on '{dev}' must be [median, iqr, repeats]")
            for x in row:
                _stat(x, f"{w}: step on '{dev}'")
        opt = entry.get("optimizer", {})
        if not isinstance(opt, dict):
            raise ProfileError(f"{w}: 'optimizer' must be an object; the file is damaged")
        for dev, row in opt.items():
            if not isinstance(row, list) or len(row) != 4:
                raise ProfileError(f"{w}: optimizer on '{dev}' must be [median, iqr, repeats, param_bytes]")
            for x in row:
                _stat(x, f"{w}: optimizer on '{dev}'")
    for dev, ops in data["ops"].items():
        if not isinstance(ops, dict):
            raise ProfileError(f"{where}: ops of '{dev}' must be an object; the file is damaged")
        for sig, row in ops.items():
            if not isinstance(row, list) or len(row) != 3:
                raise ProfileError(f"{where}: op '{sig}' on '{dev}' must be [fwd, bwd, count]")
            for x in row:
                _stat(x, f"{where}: op '{sig}' on '{dev}'")
    for k, rec in enumerate(data["links"]):
        if not isinstance(rec, dict) or not all(isinstance(rec.get(f), str) for f in ("src", "dst", "backend")):
            raise ProfileError(f"{where}: links[{k}] must have 'src', 'dst' and 'backend'; the file is damaged")
        _stat(rec.get("latency"), f"{where}: links[{k}] latency")
        bw = _stat(rec.get("bandwidth"), f"{where}: links[{k}] bandwidth")
        if bw <= 0:
            raise ProfileError(f"{where}: links[{k}] has bandwidth 0; re-run the link benchmark")
