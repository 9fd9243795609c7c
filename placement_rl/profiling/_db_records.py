"""What a profile records besides its times (``placement_rl.profiling.db``): the environment of the process that
measured, a profiled device's record, a graph's precision, timing samples as median and spread, and the op signatures
the per-op table may price."""

from __future__ import annotations

import datetime
import platform
import socket
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import Device


def environment() -> dict[str, Any]:
    """Host, torch and CUDA versions of this process (recorded with every profile)."""
    import torch

    env: dict[str, Any] = {"host": socket.gethostname(), "torch": torch.__version__,
                           "python": platform.python_version(), "cuda_runtime": torch.version.cuda,
                           "cuda_driver": None,
                           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        try:
            import pynvml

            pynvml.nvmlInit()
            drv = pynvml.nvmlSystemGetDriverVersion()
            env["cuda_driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
            pynvml.nvmlShutdown()
        except Exception:  # NVML is optional; the runtime version is still recorded
            env["cuda_driver"] = None
    return env


def device_record(device: Device) -> dict[str, Any]:
    """What is recorded about a profiled device: its torch device, hardware model and thread count."""
    import torch

    from placement_rl._local import cpu_model_name

    rec: dict[str, Any] = {"torch_device": device.torch_device, "kind": device.kind,
                           "host": socket.gethostname(), "threads": int(torch.get_num_threads())}
    if device.kind == "gpu" and torch.cuda.is_available():
        rec["model"] = torch.cuda.get_device_name(torch.device(device.torch_device))
    else:
        rec["model"] = cpu_model_name()
    return rec


def precision(meta: Mapping[str, Any]) -> str:
    """A graph's precision, as profiles record it: ``meta["dtype"]`` (absent: fp32), with ``meta["param_dtype"]``
    where that differs (``bf16 with fp32 parameters``)."""
    dtype = meta.get("dtype") or "fp32"
    params = meta.get("param_dtype") or dtype
    return dtype if params == dtype else f"{dtype} with {params} parameters"


def _op_signatures(graph: CompGraph) -> list[str] | None:
    """``graph.meta["signatures"]`` where the per-op table may price them: one per node and, for a graph of another
    precision than fp32, naming a precision (signatures taken before they did would read as fp32 ops)."""
    sigs = graph.meta.get("signatures")
    if not isinstance(sigs, (list, tuple)) or not sigs or len(sigs) != graph.num_nodes:
        return None
    if precision(graph.meta) != "fp32" and all(str(s).endswith("]") for s in sigs):  # no ``:bf16`` suffix
        return None
    return list(sigs)


def _same_torch_device(a: str, b: str) -> bool:
    def norm(x: str) -> str:
        return "cuda:0" if x == "cuda" else x
    return norm(a) == norm(b)


def _median_iqr(samples: Sequence[float]) -> tuple[float, float]:
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ProfileError("no timing samples to record: repeats must be >= 1")
    q25, q50, q75 = np.percentile(x, [25, 50, 75])
    return float(q50), float(q75 - q25)
