"""``Device``: one processor of a topology (its kind, torch device, peak figures and host), and the constants the
topology reader and local detection share. ``placement_rl.topology`` builds ``DeviceTopology`` from these."""

from __future__ import annotations

from dataclasses import dataclass

DEVICE_KINDS = ("cpu", "gpu")
DEFAULT_LAUNCH_OVERHEAD = {"cpu": 2e-6, "gpu": 8e-6}


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    torch_device: str
    peak_flops: float
    mem_bandwidth: float
    memory_bytes: float
    host: int = 0
    launch_overhead: float = 0.0
    sm_count: int = 0               # streaming multiprocessors (0: unknown)
    l2_bytes: float = 0.0           # L2 cache (0: unknown)
    peak_flops_tf32: float = 0.0    # tensor-core peaks (0: unknown)
    peak_flops_bf16: float = 0.0
    peak_flops_fp16: float = 0.0    # FP16 with FP32 accumulation (0: unknown; the BF16 peak stands in for it)
    peak_flops_fp64: float = 0.0    # FP64 (0: unknown; an fp64 model is priced at the FP32 peak, with a warning)
    model: str = ""                 # hardware model, e.g. "A100-80GB-PCIe"
