"""Detect the local machine as a ``DeviceTopology`` named ``local``.

Devices: the CPU always (``cpu``), plus every CUDA GPU that ``torch.cuda`` sees (``gpu<i>`` on ``cuda:<i>``).
Every figure records how it was obtained in ``topology.meta["sources"]``:

* ``measured`` -- timed here (fp32 matmul for FLOP/s, a large tensor copy for bytes/s, tiny ops for overhead);
* ``nvml``     -- read through NVML (``pynvml`` from nvidia-ml-py): memory clock x bus width, PCIe generation
  x width, active NVLink links;
* ``table``    -- the vendor datasheet figure for the GPU model (``placement_rl.datasheets``);
* ``os`` / ``torch`` -- memory sizes from ``os.sysconf`` (or ``/proc/meminfo``, capped by a cgroup limit) and
  ``torch.cuda.get_device_properties``;
* ``default``  -- a conservative constant, used when nothing better is available or ``measure=False``.

No GPU, no NVML or a failing NVML call is not an error: the figure falls back to the next source.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from placement_rl.datasheets import lookup
from placement_rl.devices import DEFAULT_LAUNCH_OVERHEAD, Device

# Conservative CPU constants (per torch thread) used when measure=False: an AVX2 core sustains well over this.
CPU_DEFAULT_FLOPS_PER_THREAD = 2.0e10
CPU_DEFAULT_MEM_BANDWIDTH = 1.0e10
GPU_DEFAULT_PEAK_FLOPS = 1.0e13
GPU_DEFAULT_MEM_BANDWIDTH = 5.0e11
PCIE_DEFAULT = (16.0e9, 1.0e-5)          # bytes/s per direction (PCIe Gen3 x16 is 15.75e9), seconds
NVLINK_LATENCY = 5.0e-6                  # typical GPU-to-GPU small-message latency over NVLink (NCCL tests)
# Usable PCIe bytes/s per lane per direction after line coding (PCI-SIG base specifications 1.0 .. 6.0).
PCIE_LANE_BANDWIDTH = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}

def gpu_spec(name: str) -> tuple[float, float] | None:
    """(FP32 FLOP/s, memory bytes/s) of a torch device name from the datasheet table (``placement_rl.datasheets``),
    or None if unknown."""
    sheet = lookup(name)
    return None if sheet is None else (sheet.peak_flops, sheet.mem_bandwidth)


# ---------------------------------------------------------------- measurements
def _best_time(fn: Callable[[], Any], reps: int, sync: Callable[[], None] = lambda: None,
               *, min_total: float = 0.03, max_reps: int = 50) -> float:
    """Best wall time of ``fn`` after one warm-up: at least ``reps`` runs and ``min_total`` seconds, so that a
    transient stall (thread-pool start, a neighbour's burst) does not become the figure."""
    fn()
    sync()
    best, total, done = float("inf"), 0.0, 0
    while done < reps or (total < min_total and done < max_reps):
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        best, total, done = min(best, dt), total + dt, done + 1
    return best


def measure_matmul_flops(device: str = "cpu", *, n: int = 512, reps: int = 5) -> float:
    """FLOP/s of an n x n fp32 matmul on ``device`` (best of ``reps``; the current torch thread count on CPU)."""
    import torch

    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dev)
    b = torch.randn(n, n, generator=gen).to(dev)
    out = torch.empty(n, n, device=dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        best = _best_time(lambda: torch.mm(a, b, out=out), reps, sync)
    return 2.0 * n ** 3 / best


def measure_copy_bandwidth(device: str = "cpu", *, nbytes: int = 64 * 2**20, reps: int = 5) -> float:
    """Memory bytes/s of a large tensor copy on ``device``, counting the read and the write (as STREAM copy)."""
    import torch

    dev = torch.device(device)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        best = _best_time(lambda: dst.copy_(src), reps, sync)
    return 2.0 * src.numel() * 4 / best


def measure_launch_overhead(*, calls: int = 200) -> float:
    """Seconds per tiny eager torch op on the CPU (dispatch overhead), best of three batches."""
    import torch

    x = torch.ones(1)
    with torch.inference_mode():
        def batch() -> None:
            for _ in range(calls):
                torch.add(x, x)
        return _best_time(batch, 3) / calls


def host_memory_bytes() -> tuple[float, str]:
    """Physical memory in bytes, capped by a cgroup (v2 or v1) limit when one is set."""
    total, source = 0.0, "default"
    try:
        total, source = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "os"
    except (ValueError, OSError, AttributeError):
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    total, source = float(line.split()[1]) * 1024, "os"
                    break
        except OSError:
            pass
    if total <= 0:
        return 8.0 * 2**30, "default"
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            return float(text), "os"
    return total, source


def cpu_model_name() -> str:
    from placement_rl.results import cpu_model

    return cpu_model()


# ---------------------------------------------------------------- NVML
class _NVML:
    """Thin guarded view of NVML: every query returns None when NVML or the field is unavailable."""

    def __init__(self) -> None:
        self.nv: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
        except Exception:  # no library, no driver, no permission: NVML is optional
            self.nv = None

    def close(self) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass

    def call(self, fn_name: str, *args: Any) -> Any:
        if self.nv is None or not hasattr(self.nv, fn_name):
            return None
        try:
            return getattr(self.nv, fn_name)(*args)
        except Exception:
            return None

    def handle(self, index: int, uuid: str | None) -> Any:
        if self.nv is None:
            return None
        if uuid:
            h = self.call("nvmlDeviceGetHandleByUUID", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            if h is not None:
                return h
        if os.environ.get("CUDA_VISIBLE_DEVICES") is None:  # torch index == NVML index only without remapping
            return self.call("nvmlDeviceGetHandleByIndex", index)
        return None

    def mem_bandwidth(self, h: Any) -> float | None:
        clock = self.call("nvmlDeviceGetMaxClockInfo", h, getattr(self.nv, "NVML_CLOCK_MEM", 2))
        width = self.call("nvmlDeviceGetMemoryBusWidth", h)
        if not clock or not width:
            return None
        return float(clock) * 1e6 * 2 * float(width) / 8  # double data rate: MHz x 2 transfers x bus bytes

    def pcie(self, h: Any) -> float | None:
        gen = self.call("nvmlDeviceGetMaxPcieLinkGeneration", h)
        width = self.call("nvmlDeviceGetMaxPcieLinkWidth", h)
        if not gen or not width or int(gen) not in PCIE_LANE_BANDWIDTH:
            return None
        return PCIE_LANE_BANDWIDTH[int(gen)] * int(width)

    def bus_id(self, h: Any) -> str | None:
        info = self.call("nvmlDeviceGetPciInfo", h)
        return _norm_bus(getattr(info, "busId", None)) if info is not None else None

    def nvlink_peers(self, h: Any) -> dict[str, int]:
        """Active NVLink links of a GPU counted per remote PCI bus id (switches included)."""
        peers: dict[str, int] = {}
        enabled = getattr(self.nv, "NVML_FEATURE_ENABLED", 1)
        for link in range(int(getattr(self.nv, "NVML_NVLINK_MAX_LINKS", 18))):
            if self.call("nvmlDeviceGetNvLinkState", h, link) != enabled:
                continue
            info = (self.call("nvmlDeviceGetNvLinkRemotePciInfo_v2", h, link)
                    or self.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link))
            remote = _norm_bus(getattr(info, "busId", None)) if info is not None else None
            key = remote or "unknown"
            peers[key] = peers.get(key, 0) + 1
        return peers


def _norm_bus(bus: Any) -> str | None:
    if bus is None:
        return None
    s = bus.decode() if isinstance(bus, bytes) else str(bus)
    s = s.strip("\x00").lower()
    return s[-12:] if len(s) >= 12 else s  # "00000000:07:00.0" and "0000:07:00.0" -> "0000:07:00.0"


def nvlink_bandwidth_per_link(cc_major: int) -> float:
    """Bytes/s per direction of one NVLink: NVLink1 (sm_6x) 20 GB/s, NVLink2..4 (sm_7x..9x) 25 GB/s,
    NVLink5 (sm_10x) 50 GB/s (P100, V100, A100, H100 and Blackwell architecture whitepapers)."""
    if cc_major <= 6:
        return 20e9
    if cc_major >= 10:
        return 50e9
    return 25e9


# ---------------------------------------------------------------- detection
def _detect_cpu(measure: bool, sources: dict[str, dict[str, str]]) -> Device:
    import torch

    threads = max(1, torch.get_num_threads())
    memory, mem_src = host_memory_bytes()
    if measure:
        peak, bandwidth = measure_matmul_flops("cpu"), measure_copy_bandwidth("cpu")
        overhead = measure_launch_overhead()
        src = {"peak_flops": "measured", "mem_bandwidth": "measured", "launch_overhead": "measured"}
    else:
        peak, bandwidth = CPU_DEFAULT_FLOPS_PER_THREAD * threads, CPU_DEFAULT_MEM_BANDWIDTH
        overhead = DEFAULT_LAUNCH_OVERHEAD["cpu"]
        src = {"peak_flops": "default", "mem_bandwidth": "default", "launch_overhead": "default"}
    sources["cpu"] = {**src, "memory_bytes": mem_src}
    return Device(name="cpu", kind="cpu", torch_device="cpu", peak_flops=float(peak), mem_bandwidth=float(bandwidth),
                  memory_bytes=float(memory), host=0, launch_overhead=float(overhead))


def _detect_gpu(index: int, measure: bool, nvml: _NVML, sources: dict[str, dict[str, str]]) -> tuple[Device, dict]:
    import torch

    props = torch.cuda.get_device_properties(index)
    name, td = f"gpu{index}", f"cuda:{index}"
    uuid = getattr(props, "uuid", None)
    handle = nvml.handle(index, str(uuid) if uuid is not None else None)
    sheet = lookup(props.name)
    spec = None if sheet is None else (sheet.peak_flops, sheet.mem_bandwidth)
    src: dict[str, str] = {"memory_bytes": "torch", "launch_overhead": "default"}
    if spec is not None:
        peak, src["peak_flops"] = spec[0], "table"
    elif measure:
        peak, src["peak_flops"] = measure_matmul_flops(td, n=2048), "measured"
    else:
        peak, src["peak_flops"] = GPU_DEFAULT_PEAK_FLOPS, "default"
    bandwidth = nvml.mem_bandwidth(handle) if handle is not None else None
    if bandwidth:
        src["mem_bandwidth"] = "nvml"
    elif spec is not None:
        bandwidth, src["mem_bandwidth"] = spec[1], "table"
    elif measure:
        bandwidth, src["mem_bandwidth"] = measure_copy_bandwidth(td, nbytes=256 * 2**20), "measured"
    else:
        bandwidth, src["mem_bandwidth"] = GPU_DEFAULT_MEM_BANDWIDTH, "default"
    sources[name] = src
    info = {"model": props.name, "cc_major": int(props.major), "handle": handle,
            "bus": nvml.bus_id(handle) if handle is not None else None,
            "pcie": nvml.pcie(handle) if handle is not None else None}
    # the product name, SM count and L2 size: the calibrated cost model's architecture facts and wave model; the
    # tensor-core peaks (dtype tf32 / bf16 / fp16) from the datasheet
    tensor = {} if sheet is None else {"peak_flops_tf32": sheet.peak_flops_tf32,
                                       "peak_flops_bf16": sheet.peak_flops_bf16,
                                       "peak_flops_fp16": sheet.peak_flops_fp16}
    if sheet is not None:
        src.update({k: "table" for k in tensor})
    dev = Device(name=name, kind="gpu", torch_device=td, peak_flops=float(peak), mem_bandwidth=float(bandwidth),
                 memory_bytes=float(props.total_memory), host=0, launch_overhead=DEFAULT_LAUNCH_OVERHEAD["gpu"],
                 sm_count=int(getattr(props, "multi_processor_count", 0) or 0),
                 l2_bytes=float(getattr(props, "L2_cache_size", 0) or 0), model=str(props.name), **tensor)
    return dev, info


def _nvml_gpu_buses(nvml: _NVML) -> set[str]:
    count = nvml.call("nvmlDeviceGetCount") or 0
    buses = set()
    for k in range(int(count)):
        h = nvml.call("nvmlDeviceGetHandleByIndex", k)
        bus = nvml.bus_id(h) if h is not None else None
        if bus:
            buses.add(bus)
    return buses


def gpu_pair_links(infos: list[dict], peers: list[dict[str, int]], gpu_buses: set[str]
                   ) -> list[tuple[int, int, float, float, str, str]]:
    """(i, j, bandwidth, latency, kind, source) for every GPU pair (indices into ``infos``).

    ``infos[k]`` has ``bus`` (PCI bus id or None), ``cc_major`` and ``pcie`` (bytes/s or None); ``peers[k]`` counts
    GPU k's active NVLinks per remote bus id; links whose remote is not in ``gpu_buses`` lead to an NVSwitch (or a
    switch NVML cannot see, as NCCL assumes). A pair gets its direct links plus min(switch links of each) at the
    per-link rate of the older GPU; with no NVLink the pair shares PCIe at the slower of the two slots.
    """
    switch = [sum(c for bus, c in p.items() if bus not in gpu_buses) for p in peers]
    out = []
    for i in range(len(infos)):
        for j in range(i + 1, len(infos)):
            direct = peers[i].get(infos[j]["bus"], 0) if infos[j]["bus"] else 0
            via_switch = min(switch[i], switch[j])
            if direct + via_switch > 0:
                per_link = nvlink_bandwidth_per_link(min(infos[i]["cc_major"], infos[j]["cc_major"]))
                kind = "nvlink" if direct else "nvswitch"
                out.append((i, j, (direct + via_switch) * per_link, NVLINK_LATENCY, kind, "nvml"))
            else:
                pi, pj = infos[i]["pcie"], infos[j]["pcie"]
                if pi and pj:
                    out.append((i, j, min(pi, pj), PCIE_DEFAULT[1], "pcie", "nvml"))
                else:
                    out.append((i, j, PCIE_DEFAULT[0], PCIE_DEFAULT[1], "pcie", "default"))
    return out


def detect(*, measure: bool = True) -> dict[str, Any]:
    """The ``DeviceTopology`` fields of the local machine, a topology named ``local``: ``cpu`` plus ``gpu<i>`` for
    every CUDA GPU.

    ``measure=True`` times the CPU (well under a second); ``measure=False`` uses conservative constants.
    ``meta["sources"]`` says where each figure came from (see the module docstring).
    """
    import torch

    sources: dict[str, dict[str, str]] = {}
    devices = [_detect_cpu(measure, sources)]
    infos: list[dict] = []
    gpu_links: list[tuple[int, int, float, float, str, str]] = []
    if torch.cuda.is_available():
        nvml = _NVML()
        try:
            for i in range(torch.cuda.device_count()):
                dev, info = _detect_gpu(i, measure, nvml, sources)
                devices.append(dev)
                infos.append(info)
            peers = [nvml.nvlink_peers(x["handle"]) if x["handle"] is not None else {} for x in infos]
            gpu_links = gpu_pair_links(infos, peers, _nvml_gpu_buses(nvml))
        finally:
            nvml.close()
    n = len(devices)
    bw, lat = np.full((n, n), np.inf), np.zeros((n, n))
    kinds = [["local"] * n for _ in range(n)]

    def put(a: int, b: int, bandwidth: float, latency: float, kind: str, source: str) -> None:
        bw[a, b] = bw[b, a] = bandwidth
        lat[a, b] = lat[b, a] = latency
        kinds[a][b] = kinds[b][a] = kind
        sources[f"{devices[a].name}<->{devices[b].name}"] = {"bandwidth": source, "latency": "default"}

    for g, info in enumerate(infos, start=1):
        pcie = info["pcie"]
        put(0, g, pcie or PCIE_DEFAULT[0], PCIE_DEFAULT[1], "pcie", "nvml" if pcie else "default")
    for i, j, bandwidth, latency, kind, source in gpu_links:
        put(i + 1, j + 1, bandwidth, latency, kind, source)
    meta = {"sources": sources, "cpu_model": cpu_model_name(), "torch_threads": int(torch.get_num_threads()),
            "gpu_models": {devices[g].name: info["model"] for g, info in enumerate(infos, start=1)},
            "measured": bool(measure)}
    gpus = f" + {len(infos)} CUDA GPU(s)" if infos else ""
    return dict(name="local", devices=tuple(devices), link_bandwidth=bw, link_latency=lat,
                link_kind=tuple(tuple(r) for r in kinds), description=f"this machine: {meta['cpu_model']}{gpus}",
                meta=meta)
