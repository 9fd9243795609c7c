"""Alpha-beta prices of the collectives data parallelism uses: all-reduce, all-gather, reduce-scatter.

``collective_time(kind, nbytes, device_ids, topology, costs=None) -> seconds`` is the one public price;
``coeff_array`` gives the same as a segment table (``comm_fit``) so the pipeline kernel can price many buffers
(DDP buckets, FSDP units) without calling back into Python; nothing else prices a collective.

**Measured** (``algorithm="measured"``, and what ``auto`` takes when it applies): a topology naming a measured
system (``collective_fit: a100_dgx``, see ``comm_fit``) prices a collective of GPUs from that system's NCCL
fit (the measured GPU count and GPUs per node; an unmeasured count scales the nearest measured one of the same
layout by the ring factor only where the system's own counts follow that rule: ``comm_fit.select_fit``). NCCL
already picked its best algorithm in those runs, so the analytic ones below are not consulted. Otherwise
(another system, a collective kind the tables lack, a layout across nodes on a system measured within one node
or the other way round, a count the rule does not carry to) the analytic model below.

``nbytes`` is the full buffer: the gradient for an all-reduce, the gathered (unsharded) tensor for an
all-gather, the input of a reduce-scatter. Links come from ``costs.link_latency`` / ``link_bandwidth``
when a ``CostTable`` is given (measured fits), else from the topology; ``L`` / ``1/B`` below are the worst
latency / inverse bandwidth among the links an algorithm uses. For p devices:

* ``ring``: all-reduce ``2 (p-1) L + 2 (p-1)/p * n / B``; all-gather and reduce-scatter ``(p-1) L + (p-1)/p * n / B``
  (every link of the group, so a ring spanning hosts runs at the inter-host link).
* ``tree`` (all-reduce only; NCCL's double binary tree): ``2 ceil(log2 p) L + 2 n / B`` -- wins on latency
  for small buffers and many devices.
* ``hierarchical`` (groups spanning several hosts): reduce-scatter inside each host (NVLink/PCIe ring over
  its l local devices), all-reduce of the host's share across the h hosts, all-gather inside each host:
  ``RS_intra(n) + AR_inter(n) + AG_intra(n)``, the inter-host ring counting ``n`` per host because one
  NIC per host carries all its local ranks' shares (``2 (h-1) L_x + 2 (h-1)/h * n / B_x``).
  All-gather: inter-host all-gather then intra-host; reduce-scatter the reverse.

``algorithm="auto"`` takes the measured fit where it applies, else the cheapest analytic algorithm (NCCL's
tuner does the same from its own model). Not modelled analytically: link contention with other traffic
(pipeline sends, another stage's collective on a shared NIC), NCCL protocol switching (LL/LL128/Simple), SHARP / NVLS in-network reduction, reduction compute time.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from placement_rl.cost.comm_fit import envelope, fit_applies, fit_segments, segment_time, select_fit
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.topology import DeviceTopology

KINDS = ("allreduce", "allgather", "reducescatter")
ALGORITHMS = ("ring", "tree", "hierarchical")
MEASURED = "measured"
_FIT_KIND = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}


def _links(topology: DeviceTopology, costs: CostTable | None) -> tuple[np.ndarray, np.ndarray]:
    lat = costs.link_latency if costs is not None else topology.link_latency
    bw = costs.link_bandwidth if costs is not None else topology.link_bandwidth
    inv = np.zeros_like(bw)
    ok = np.isfinite(bw) & (bw > 0)
    inv[ok] = 1.0 / bw[ok]
    np.fill_diagonal(inv, 0.0)
    return lat, inv


def _worst(lat: np.ndarray, inv: np.ndarray, a: Sequence[int], b: Sequence[int]) -> tuple[float, float]:
    """Worst latency and inverse bandwidth over pairs (x in a, y in b, x != y)."""
    wl = wi = 0.0
    for x in a:
        for y in b:
            if x != y:
                wl, wi = max(wl, float(lat[x, y])), max(wi, float(inv[x, y]))
    return wl, wi


def _ring(kind: str, p: int, lat: float, inv: float) -> tuple[float, float]:
    if p <= 1:
        return 0.0, 0.0
    if kind == "allreduce":
        return 2.0 * (p - 1) * lat, 2.0 * (p - 1) / p * inv
    return (p - 1) * lat, (p - 1) / p * inv


def collective_coeffs(kind: str, device_ids: Sequence[int], topology: DeviceTopology,
                      costs: CostTable | None = None) -> dict[str, tuple[float, float]]:
    """``{algorithm: (alpha, beta)}`` of every algorithm that applies (see the module docstring);
    ``time = alpha + beta * nbytes``. One device (or none): ``{"ring": (0, 0)}``."""
    if kind not in KINDS:
        raise ConfigError(f"unknown collective '{kind}' (choose one of {', '.join(KINDS)})")
    devs = [int(d) for d in device_ids]
    if len(set(devs)) != len(devs) or any(not 0 <= d < topology.num_devices for d in devs):
        raise ConfigError(f"collective device ids {devs} must be distinct indices into topology "
                          f"'{topology.name}' (0..{topology.num_devices - 1})")
    p = len(devs)
    if p <= 1:
        return {"ring": (0.0, 0.0)}
    lat, inv = _links(topology, costs)
    out = {"ring": _ring(kind, p, *_worst(lat, inv, devs, devs))}
    if kind == "allreduce":
        lw, iw = _worst(lat, inv, devs, devs)
        out["tree"] = (2.0 * math.ceil(math.log2(p)) * lw, 2.0 * iw)
    hosts: dict[int, list[int]] = {}
    for d in devs:
        hosts.setdefault(topology.devices[d].host, []).append(d)
    h = len(hosts)
    if h > 1:
        local = max(len(v) for v in hosts.values())
        li = ii = 0.0
        for members in hosts.values():
            a, b = _worst(lat, inv, members, members)
            li, ii = max(li, a), max(ii, b)
        lx, ix = 0.0, 0.0
        for x, hx in enumerate(hosts.values()):
            for y, hy in enumerate(hosts.values()):
                if x != y:
                    a, b = _worst(lat, inv, hx, hy)
                    lx, ix = max(lx, a), max(ix, b)
        intra_ag, intra_rs = _ring("allgather", local, li, ii), _ring("reducescatter", local, li, ii)
        inter = _ring(kind, h, lx, ix)
        if kind == "allreduce":
            parts = (intra_rs, inter, intra_ag)
        elif kind == "allgather":
            parts = (inter, intra_ag)
        else:
            parts = (intra_rs, inter)
        out["hierarchical"] = (sum(a for a, _ in parts), sum(b for _, b in parts))
    return out


def measured_segments(kind: str, device_ids: Sequence[int], topology: DeviceTopology,
                      costs: CostTable | None = None) -> np.ndarray | None:
    """Segment table of the measured NCCL fit for ``kind`` over ``device_ids`` (GPUs of a topology naming a
    measured system, see the module docstring), or None where it does not apply."""
    devs = [int(d) for d in device_ids]
    system = fit_applies(topology, costs)
    if system is None or len(devs) <= 1 or any(topology.devices[d].kind != "gpu" for d in devs):
        return None
    hosts: dict[int, int] = {}
    for d in devs:
        hosts[topology.devices[d].host] = hosts.get(topology.devices[d].host, 0) + 1
    sel = select_fit(_FIT_KIND[kind], len(devs), system, max(hosts.values()))
    return None if sel is None else fit_segments(*sel)


def collective_time(kind: str, nbytes: float, device_ids: Sequence[int], topology: DeviceTopology,
                    costs: CostTable | None = None, *, algorithm: str = "auto") -> float:
    """Seconds for collective ``kind`` (``allreduce``, ``allgather``, ``reducescatter``) of an ``nbytes``
    buffer over ``device_ids`` (indices into ``topology.devices``); ``algorithm``: ``auto`` (the measured fit
    where it applies, else the cheapest analytic one), ``measured``, ``ring``, ``tree`` or ``hierarchical``.
    Links from ``costs`` when given, else from the topology."""
    if not (isinstance(nbytes, (int, float, np.integer, np.floating)) and math.isfinite(nbytes) and nbytes >= 0):
        raise ConfigError(f"collective size must be a finite number of bytes >= 0, got {nbytes!r}")
    coeffs = collective_coeffs(kind, device_ids, topology, costs)
    if algorithm in ("auto", MEASURED):
        seg = measured_segments(kind, device_ids, topology, costs)
        if seg is None and algorithm == MEASURED:
            raise ConfigError(f"no measured {kind} fit applies to devices {list(device_ids)} of topology "
                              f"'{topology.name}' (it needs a 'collective_fit:' system that measured it)")
        if seg is not None:
            return 0.0 if nbytes == 0 else segment_time(seg, float(nbytes))
    if algorithm != "auto":
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown collective algorithm '{algorithm}' (choose auto, {MEASURED} or one of "
                              f"{', '.join(ALGORITHMS)})")
        if algorithm not in coeffs:
            raise ConfigError(f"algorithm '{algorithm}' does not apply to {kind} over devices {list(device_ids)} "
                              f"(applicable: {', '.join(coeffs)})")
        coeffs = {algorithm: coeffs[algorithm]}
    if nbytes == 0:
        return 0.0
    return min(a + b * float(nbytes) for a, b in coeffs.values())


def coeff_array(kind: str, device_ids: Sequence[int], topology: DeviceTopology,
                costs: CostTable | None = None) -> np.ndarray:
    """Segment table ``float64 [K, 3]`` (``comm_fit``) of ``collective_time(..., algorithm="auto")``: the
    measured fit where it applies, else the lower envelope of the analytic algorithms' (alpha, beta)."""
    seg = measured_segments(kind, device_ids, topology, costs)
    if seg is not None:
        return seg
    return envelope(collective_coeffs(kind, device_ids, topology, costs).values())


__all__ = ["ALGORITHMS", "KINDS", "MEASURED", "coeff_array", "collective_coeffs", "collective_time",
           "measured_segments"]
