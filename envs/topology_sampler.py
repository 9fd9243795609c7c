"""Random device topologies for training a policy that serves any cluster.

``random_topology(rng, num_devices=(2, 16))`` draws a cluster: a device count, GPUs of one or of several kinds
(datasheet FP32 peak, memory bandwidth and memory of real parts), optionally a CPU beside them, hosts of 2-8
GPUs joined by NVLink or PCIe inside a host and InfiniBand or Ethernet between hosts, and sometimes small
memories that force a model to be split. The figures below are vendor datasheet values (FP32 FLOP/s, bytes/s,
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
    label = name or (f"rand{n}_{'mix' if hetero else base}_{intra}" + (f"_{inter}" if n_gpu > per_host else "")
                     + ("_cpu" if with_cpu else "") + (f"_mem{mem_scale:g}" if mem_scale != 1.0 else ""))
    return DeviceTopology.from_dict({"name": label, "devices": devices, "links": links}, where=label)
