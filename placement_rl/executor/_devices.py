"""Where the ranks of a deployment run and in which precision (``placement_rl.executor.distributed``): the device
kind a job runs on (``_resolve_device``), the precision a plan priced in one runs in there (``run_precision``), and
the plan's device each rank stands for (``plan_devices_of_ranks``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from placement_rl.errors import ConfigError
from placement_rl.executor._deploy_types import PRECISIONS, DeployConfig
from placement_rl.executor._mesh import ParallelDims, rank_devices
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology


def _resolve_device(config: DeployConfig, plan: StagePlan, topology: DeviceTopology | None) -> str:
    if config.device != "auto":
        return config.device
    gpus = topology is None or all(topology.devices[d].kind == "gpu" for g in plan.stage_devices for d in g)
    if gpus and topology is not None and not torch.cuda.is_available():
        warnings.warn(f"the plan's devices are GPUs of '{topology.name}' but torch sees no CUDA GPU here: running "
                      "its layout on CPU processes (gloo)", RuntimeWarning, stacklevel=3)
    return "cuda" if torch.cuda.is_available() and gpus else "cpu"


def run_precision(priced: str, device: str, dims: ParallelDims) -> dict[str, str]:
    """``{"priced", "run"}`` (+ ``"why"`` where they differ): the precision a plan priced in ``priced`` runs in on
    ``device`` (``cpu`` / ``cuda``), as the ranks apply it to the model as built (fp32 for the zoo; ``_runner``).

    bf16: ``torch.autocast`` (CPU and CUDA), every path but TP; fp16: autocast and a ``GradScaler``, on CUDA and a
    one-stage DDP plan only (the scaler's overflow check must see the all-reduced gradients to skip a step on every
    rank alike); tf32: TF32 matmuls on CUDA. Anything else runs in fp32, saying why.
    """
    if any(p not in PRECISIONS for p in priced.split("/")):
        raise ConfigError(f"precision '{priced}' is unknown; choose one of {', '.join(PRECISIONS)}")
    why = ""
    if "/" in priced:
        why = "the plan's devices were priced in different precisions"
    elif priced == "fp64":
        why = "the executor does not convert the model to fp64"
    elif priced == "tf32" and device != "cuda":
        why = "TF32 needs a CUDA GPU"
    elif priced in ("bf16", "fp16") and dims.tp > 1:
        why = "autocast is not wired into tensor-parallel stages"
    elif priced == "fp16" and device != "cuda":
        why = "fp16 needs a CUDA GPU for its gradient scaler"
    elif priced == "fp16" and not (dims.plain and dims.sharding == "dp"):
        why = "fp16 runs one-stage DDP plans only: the gradient scaler's overflow check needs all-reduced gradients"
    return {"priced": priced, "run": "fp32", "why": why} if why else {"priced": priced, "run": priced}


def plan_devices_of_ranks(plan: StagePlan, dims: ParallelDims, topology: DeviceTopology) -> list[dict[str, Any]]:
    """The plan's device of every global rank: ``{"name", "torch_device", "host"}`` (``_mesh.rank_devices``)."""
    return [{"name": d.name, "torch_device": d.torch_device, "host": d.host}
            for d in (topology.devices[i] for i in rank_devices(plan, dims))]
