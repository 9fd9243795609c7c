"""``Device``: one processor of a topology (its kind, torch device, peak figures and host), and the constants the
topology reader and local detection share. ``placement_rl.topology`` builds ``DeviceTopology`` from these."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from placement_rl.errors import TopologyError

DEVICE_KINDS = ("cpu", "gpu")
DEFAULT_LAUNCH_OVERHEAD = {"cpu": 2e-6, "gpu": 8e-6}
# what ``torch.device`` accepts (its device types, an optional index without sign or leading zero), checked without
# importing torch: a topology is read long before a plan is deployed
TORCH_DEVICE_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia",
                      "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone")
_TORCH_DEVICE = re.compile(rf"(?:{'|'.join(TORCH_DEVICE_TYPES)})(?::(?:0|[1-9][0-9]*))?")
TORCH_DEVICE_HINT = "give cpu, cuda, cuda:<index>, mps, xpu:<index> or another type torch.device accepts"


def is_torch_device(value: Any) -> bool:
    """``value`` is a string ``torch.device`` accepts (``cuda:0``, ``cpu``, ``mps``; not ``banana`` or ``cuda:-1``)."""
    return isinstance(value, str) and _TORCH_DEVICE.fullmatch(value) is not None


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
    architecture: str = ""          # a GPU not in the datasheets: the product whose architecture it shares ("H100")

    def __post_init__(self) -> None:
        """``TopologyError`` for a ``torch_device`` torch would refuse (``banana``), here rather than at deploy."""
        if not is_torch_device(self.torch_device):
            raise TopologyError(f"device '{self.name}': field 'torch_device' is {self.torch_device!r}, not a torch "
                                f"device: {TORCH_DEVICE_HINT}")
