"""Value types of the cost model: ``CostTable`` (resolved per graph x topology) and ``SimResult``.

Shapes (N nodes, D devices):
    fwd_time, bwd_time: float64 [N, D] seconds (per node, per device)
    link_latency, link_bandwidth: float64 [D, D] (diagonal: latency 0, bandwidth inf)
    source: tuple of D strings, ``"measured:<profile id>"`` or ``"roofline"`` per device
    launch_overhead: float64 [N, D] seconds, the fixed (per-launch) part included in *each* of
        ``fwd_time`` and ``bwd_time``; it does not shrink when a pipeline splits the batch into
        micro-batches or replicas (default: zeros)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


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
        if self.launch_overhead is None:
            object.__setattr__(self, "launch_overhead", np.zeros_like(np.asarray(self.fwd_time, dtype=np.float64)))
        for key in ("fwd_time", "bwd_time", "link_latency", "link_bandwidth", "launch_overhead"):
            arr = np.array(getattr(self, key), dtype=np.float64, order="C", copy=True)
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)
        object.__setattr__(self, "source", tuple(self.source))

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
