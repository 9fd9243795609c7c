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

The database's parts live beside it: the file's schema and validation in ``_db_schema``, what it records besides the
times in ``_db_records``, its link fits in ``_db_links``, its message lines in ``_db_messages``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.errors import ProfileError
from placement_rl.graph.io import atomic_write_text
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import member_graph
from placement_rl.profiling._db_links import INF_BANDWIDTH, ProfileLinks
from placement_rl.profiling._db_messages import ProfileMessages
from placement_rl.profiling._db_records import (_median_iqr, _op_signatures, _same_torch_device, device_record,
                                                environment, precision)
from placement_rl.profiling._db_schema import SCHEMA, VERSION, _validate
from placement_rl.topology import Device

__all__ = ["INF_BANDWIDTH", "SCHEMA", "VERSION", "ProfileDB", "device_record", "environment", "precision"]


class ProfileDB(ProfileMessages, ProfileLinks):
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
