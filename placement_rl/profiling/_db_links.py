"""Measured link fits in a ``ProfileDB`` (``placement_rl.profiling.db``): ``time = latency + bytes / bandwidth`` per
pair of torch devices and backend, recorded, looked up, and laid over a topology's links. ``ProfileLinks`` is the
database's part that holds them."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from placement_rl.topology import DeviceTopology

INF_BANDWIDTH = 1e18  # stands in for "no measurable per-byte cost" where a finite number is required


class ProfileLinks:
    """``ProfileDB``'s link fits (its ``data["links"]`` and ``label``)."""

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
