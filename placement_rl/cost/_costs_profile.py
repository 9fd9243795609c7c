"""A profile written by ``placement-rl profile`` read as a costs file (``placement_rl.cost.costs_file``): its measured
``copy`` links laid over the topology's, each measured device's cost source label, and the note where its CPU times
likely come from another CPU than a device whose model the topology does not name."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from placement_rl.cost._costs_plausible import _typical_ratio
from placement_rl.cost.types import CostTable
from placement_rl.topology import DeviceTopology

OTHER_CPU = 4.0  # a profile's CPU times typically this far off a CPU device's estimate: likely another CPU


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
