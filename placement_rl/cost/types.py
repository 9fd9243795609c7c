"""Value types of the cost model: ``CostTable`` (resolved per graph x topology) and ``SimResult``.

Shapes (N nodes, D devices):
    fwd_time, bwd_time: float64 [N, D] seconds (per node, per device)
    link_latency, link_bandwidth: float64 [D, D] (diagonal: latency 0, bandwidth inf)
    source: tuple of D strings, ``"measured:<profile id>"`` or ``"roofline"`` per device
    launch_overhead: float64 [N, D] seconds, the fixed (per-launch) part included in *each* of
        ``fwd_time`` and ``bwd_time``; it does not shrink when a pipeline splits the batch into
        micro-batches or replicas (default: zeros)

A ``CostTable`` checks itself when built (by ``resolve_costs``, a costs file or by hand): the shapes above, times
finite and >= 0, and between distinct devices link latencies finite and >= 0 and bandwidths > 0 (inf: no per-byte
cost); the diagonal is never read. Anything else is a ``ProfileError`` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from placement_rl.errors import ProfileError
from placement_rl.graph.ir import restore_read_only


@dataclass(frozen=True, eq=False)
class CostTable:
    fwd_time: np.ndarray
    bwd_time: np.ndarray
    link_latency: np.ndarray
    link_bandwidth: np.ndarray
    source: tuple[str, ...]
    graph_fingerprint: str = ""
    topology_name: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    launch_overhead: np.ndarray | None = None

    def __post_init__(self) -> None:
        for key in ("fwd_time", "bwd_time", "link_latency", "link_bandwidth", "launch_overhead"):
            value = getattr(self, key)
            if value is None and key == "launch_overhead":
                value = np.zeros_like(self.fwd_time)
            try:
                arr = np.array(value, dtype=np.float64, order="C", copy=True)
            except (TypeError, ValueError, OverflowError) as exc:
                raise ProfileError(f"cost table field '{key}' must be an array of numbers ({exc})") from None
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)
        try:
            if isinstance(self.source, (str, bytes)):  # tuple("ab") would be one label per character
                raise TypeError
            object.__setattr__(self, "source", tuple(self.source))
        except TypeError:
            raise ProfileError(f"cost table field 'source' must be a list of strings (one per device), got "
                               f"{self.source!r}"[:300]) from None
        self._check()

    def _check(self) -> None:
        """``ProfileError`` naming the field: shapes [N, D] and [D, D], times finite and >= 0, link latencies
        finite and >= 0 and bandwidths > 0 (inf: free) between distinct devices (the diagonal is never read)."""
        fwd = self.fwd_time
        if fwd.ndim != 2:
            raise ProfileError(f"cost table field 'fwd_time' must be [N nodes, D devices], got shape {list(fwd.shape)}")
        n, d = fwd.shape
        for key, shape in (("bwd_time", (n, d)), ("launch_overhead", (n, d)), ("link_latency", (d, d)),
                           ("link_bandwidth", (d, d))):
            got = getattr(self, key).shape
            if got != shape:
                raise ProfileError(f"cost table field '{key}' has shape {list(got)}, expected {list(shape)} "
                                   f"({'N nodes x D devices' if shape == (n, d) else 'D x D devices'}, as 'fwd_time' "
                                   f"{list(fwd.shape)})")
        if len(self.source) != d or not all(isinstance(x, str) for x in self.source):
            raise ProfileError(f"cost table field 'source' must list {d} strings (one per device), got "
                               f"{list(self.source)!r}"[:300])
        for key in ("fwd_time", "bwd_time", "launch_overhead"):
            arr = getattr(self, key)
            bad = np.argwhere(~np.isfinite(arr) | (arr < 0))
            if bad.size:
                i, j = (int(x) for x in bad[0])
                raise ProfileError(f"cost table field '{key}' is {float(arr[i, j])!r} for node #{i} on device #{j}: "
                                   "times must be finite seconds >= 0")
        off = ~np.eye(d, dtype=bool)
        for key, bad in (("link_latency", off & ~(np.isfinite(self.link_latency) & (self.link_latency >= 0))),
                         ("link_bandwidth", off & ~(self.link_bandwidth > 0))):
            if bad.any():
                i, j = (int(x) for x in np.argwhere(bad)[0])
                what = "finite seconds >= 0" if key == "link_latency" else "bytes/s > 0 (inf: no per-byte cost)"
                raise ProfileError(f"cost table field '{key}' is {float(getattr(self, key)[i, j])!r} between devices "
                                   f"#{i} and #{j}: must be {what}")

    def __setstate__(self, state: dict) -> None:  # unpickled (another process): its arrays read-only again
        restore_read_only(self, state)

    @property
    def num_nodes(self) -> int:
        return int(self.fwd_time.shape[0])

    @property
    def num_devices(self) -> int:
        return int(self.fwd_time.shape[1])

    def describe_source(self, device_names: tuple[str, ...] | None = None) -> str:
        """One line saying where each device's numbers came from (never silently mixed)."""
        names = device_names or tuple(f"dev{i}" for i in range(self.num_devices))
        return ", ".join(f"{n}={s}" for n, s in zip(names, self.source))


@dataclass(frozen=True)
class Interval:
    """One timeline entry: an op (``fwd``/``bwd``) on a device, or a transfer/all-reduce on a link."""

    kind: str
    resource: str
    start: float
    end: float
    label: str = ""


@dataclass(frozen=True, eq=False)
class SimResult:
    step_time: float
    feasible: bool
    device_busy: np.ndarray
    peak_memory: np.ndarray
    comm_time: float = 0.0
    timeline: tuple[Interval, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
