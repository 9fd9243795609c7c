"""Random device topologies for training a policy that serves any cluster.

``random_topology(rng, num_devices=(2, 16))`` draws a cluster: a device count, GPUs of one or of several kinds
(datasheet FP32 peak, memory bandwidth and memory of real parts), optionally a CPU beside them, hosts of 2-8
GPUs joined by NVLink or PCIe inside a host and InfiniBand or Ethernet between hosts, and sometimes small
memories that force a model to be split, and links that differ pair by pair (``PATTERNS``: DGX-1-like hybrid
meshes, NVLink islands, hosts with mixed NICs) so that where a device sits in the topology matters. The figures below are vendor datasheet values (FP32 FLOP/s, bytes/s,
bytes); link figures are per direction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placement_rl.topology import DeviceTopology

GiB = 2**30
# name: (peak FP32 FLOP/s, memory bandwidth B/s, memory bytes) -- NVIDIA datasheets
GPUS: dict[str, tuple[float, float, float]] = {
    "k80": (4.37e12, 240e9, 12 * GiB),
    "p100": (9.3e12, 732e9, 16 * GiB),
    "v100": (15.7e12, 900e9, 32 * GiB),
    "t4": (8.1e12, 320e9, 16 * GiB),
    "a10": (31.2e12, 600e9, 24 * GiB),
    "a100": (19.5e12, 1555e9, 40 * GiB),
    "l4": (30.3e12, 300e9, 24 * GiB),
    "h100": (67e12, 3350e9, 80 * GiB),
}
CPU = (1.5e12, 100e9, 256 * GiB)  # a two-socket server CPU (AVX-512 FP32 peak), DDR4 bandwidth
# kind: (bandwidth B/s, latency s)
INTRA = {"nvlink": (50e9, 5e-6), "nvswitch": (300e9, 3e-6), "pcie": (15.75e9, 1e-5)}
INTER = {"ib": (12.5e9, 2e-5), "ib_hdr": (25e9, 1.5e-5), "eth": (3.1e9, 5e-5)}


def _device(name: str, spec: tuple[float, float, float], host: int, kind: str = "gpu",
            mem_scale: float = 1.0) -> dict[str, Any]:
    return {"name": name, "kind": kind, "host": host, "numbered": True, "peak_flops": spec[0],
            "mem_bandwidth": spec[1], "memory_bytes": float(spec[2] * mem_scale),
            "torch_device": "cpu" if kind == "cpu" else "cuda"}


# per-pair link heterogeneity (drawn per cluster): uniform links; a hybrid mesh (DGX-1-like: each pair of a host has
# 0, 1 or 2 NVLinks, PCIe where none); NVLink islands of 2 or 4 GPUs joined by PCIe; hosts with mixed NICs
PATTERNS = ("uniform", "hybrid_mesh", "islands", "mixed_nics")
PATTERN_P = (0.4, 0.25, 0.2, 0.15)
NVLINK_LANE = 25e9  # NVLink 2.0, per direction per link


def _pattern_pairs(rng: np.random.Generator, pattern: str, gpus: list[dict[str, Any]], inter: str) -> list[dict]:
    """``links.pairs`` entries that make a cluster's links differ pair by pair (see ``PATTERNS``)."""
    pairs: list[dict[str, Any]] = []
    hosts = sorted({g["host"] for g in gpus})
    by_host = {h: [g["name"] for g in gpus if g["host"] == h] for h in hosts}
    if pattern == "hybrid_mesh":
        for names in by_host.values():
            for i in range(len(names)):
                for j in range(i + 1, len(names)):
                    lanes = int(rng.choice([0, 1, 2], p=[0.25, 0.45, 0.3]))
                    bw, lat, kind = (lanes * NVLINK_LANE, 5e-6, "nvlink") if lanes else (*INTRA["pcie"], "pcie")
                    pairs.append({"between": [names[i], names[j]], "bandwidth": bw, "latency": lat, "kind": kind})
    elif pattern == "islands":
        size = int(rng.choice([2, 4]))
        for names in by_host.values():
            for i in range(len(names)):
                for j in range(i + 1, len(names)):
                    same = i // size == j // size
                    bw, lat, kind = (INTRA["nvlink"][0], INTRA["nvlink"][1], "nvlink") if same else \
                        (INTRA["pcie"][0], INTRA["pcie"][1], "pcie")
                    pairs.append({"between": [names[i], names[j]], "bandwidth": bw, "latency": lat, "kind": kind})
    elif pattern == "mixed_nics" and len(hosts) > 1:
        nic = {h: INTER[str(rng.choice(list(INTER)))] for h in hosts}
        for a in range(len(hosts)):
            for b in range(a + 1, len(hosts)):
                bw = min(nic[hosts[a]][0], nic[hosts[b]][0])
                lat = max(nic[hosts[a]][1], nic[hosts[b]][1])
                for x in by_host[hosts[a]]:
                    for y in by_host[hosts[b]]:
                        pairs.append({"between": [x, y], "bandwidth": bw, "latency": lat, "kind": "nic"})
    return pairs


def random_topology(rng: np.random.Generator, num_devices: tuple[int, int] = (2, 16), *,
                    name: str | None = None) -> DeviceTopology:
    """A random cluster of ``num_devices`` (inclusive range) devices (see the module docstring)."""
    lo, hi = num_devices
    n = int(rng.integers(lo, hi + 1))
    kinds = list(GPUS)
    hetero = rng.random() < 0.35
    with_cpu = n >= 3 and rng.random() < 0.15
    n_gpu = n - 1 if with_cpu else n
    per_host = int(rng.choice([2, 4, 8])) if n_gpu > 4 and rng.random() < 0.6 else n_gpu
    mem_scale = float(rng.choice([1.0, 1.0, 1.0, 0.25, 0.0625]))
    base = kinds[int(rng.integers(len(kinds)))]
    devices = []
    for i in range(n_gpu):
        kind = kinds[int(rng.integers(len(kinds)))] if hetero else base
        devices.append(_device(f"h{i // per_host}_{kind}_", GPUS[kind], i // per_host, mem_scale=mem_scale))
    if with_cpu:
        devices.append(_device("cpu", CPU, 0, kind="cpu"))
    intra = str(rng.choice(list(INTRA)))
    inter = str(rng.choice(list(INTER)))
    pattern = str(rng.choice(PATTERNS, p=PATTERN_P))
    if hetero and rng.random() < 0.5:  # mixed memories too (a small card beside large ones)
        for d in devices:
            d["memory_bytes"] *= float(rng.choice([1.0, 0.5, 0.25]))
    # identical names within a host get numbered by the loader; keep names unique across hosts and kinds
    seen: dict[str, int] = {}
    for d in devices:
        k = seen.get(d["name"], 0)
        seen[d["name"]] = k + 1
        d["name"] = f"{d['name']}{k}" if d["kind"] == "gpu" else d["name"]
        d.pop("numbered")
    links: dict[str, Any] = {"intra_host": {"bandwidth": INTRA[intra][0], "latency": INTRA[intra][1], "kind": intra},
                             "inter_host": {"bandwidth": INTER[inter][0], "latency": INTER[inter][1], "kind": inter}}
    if with_cpu:  # the CPU reaches its host's GPUs over PCIe
        links["pairs"] = [{"between": ["cpu", d["name"]], "bandwidth": INTRA["pcie"][0],
                           "latency": INTRA["pcie"][1], "kind": "pcie"} for d in devices if d["host"] == 0
                          and d["kind"] == "gpu"]
        for d in devices:
            if d["kind"] == "gpu" and d["host"] != 0:
                links["pairs"].append({"between": ["cpu", d["name"]], "bandwidth": INTER[inter][0],
                                       "latency": INTER[inter][1], "kind": inter})
    links.setdefault("pairs", [])
    links["pairs"] += _pattern_pairs(rng, pattern, [d for d in devices if d["kind"] == "gpu"], inter)
    if pattern != "uniform":
        intra = f"{intra}-{pattern}"
    label = name or (f"rand{n}_{'mix' if hetero else base}_{intra}" + (f"_{inter}" if n_gpu > per_host else "")
                     + ("_cpu" if with_cpu else "") + (f"_mem{mem_scale:g}" if mem_scale != 1.0 else ""))
    return DeviceTopology.from_dict({"name": label, "devices": devices, "links": links}, where=label)
