"""The values of a deployment (``placement_rl.executor.distributed``): its options (``DeployConfig``), one plan to
deploy (``DeploySpec``), a job written for the ranks (``PreparedJob``) and the measured outcome (``DeployResult``,
what ``deploy.json`` holds), with the schema names of the job and result files."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from placement_rl.errors import ConfigError
from placement_rl.executor._mesh import ParallelDims
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

JOB_SCHEMA = "placement_rl.deploy_job"
RESULT_SCHEMA = "placement_rl.deploy_result"
VERSION = 1
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp64")  # what can price a plan (a cost source label's suffix)


@dataclass(frozen=True, kw_only=True)
class DeployConfig:
    """Options of a deployment.

    steps: measured training steps (Adam); warmup: steps run first and not measured (the first one
    infers shapes and warms up communicators); lr: Adam learning rate; device: ``cpu`` (gloo),
    ``cuda`` (NCCL, one GPU per rank) or ``auto`` (cuda when available and the plan's devices are
    GPUs); timeout_s: a rank that dies or makes no progress for this long ends the job (also the
    process-group timeout); threads: torch threads per rank; collect_grads: save the gradients of
    the first step (tests); keep_job_dir: keep the job directory of a temporary run.
    """

    steps: int = 3
    warmup: int = 1
    lr: float = 1e-3
    device: str = "auto"
    timeout_s: float = 300.0
    threads: int = 1
    collect_grads: bool = False
    keep_job_dir: bool = False

    def validate(self) -> "DeployConfig":
        if self.steps < 1 or self.warmup < 0:
            raise ConfigError(f"deploy needs steps >= 1 and warmup >= 0 (got steps={self.steps}, "
                              f"warmup={self.warmup})")
        if not self.lr > 0:
            raise ConfigError(f"deploy lr must be > 0, got {self.lr}")
        if self.device not in DEVICES:
            raise ConfigError(f"deploy device '{self.device}' is unknown; choose one of {', '.join(DEVICES)}")
        if not self.timeout_s > 0 or self.threads < 1:
            raise ConfigError(f"deploy needs timeout_s > 0 and threads >= 1 (got {self.timeout_s}, {self.threads})")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("deploy device 'cuda' was asked for but torch sees no CUDA GPU; use device=cpu")
        return self


@dataclass(frozen=True)
class DeployResult:
    """Measured outcome. ``step_time``: median over measured steps of the slowest rank's step (s)."""

    step_time: float
    throughput: float  # samples per second (global batch / step_time)
    optimizer_time: float  # median over steps of the slowest rank's Adam step (included in step_time)
    batch_size: int
    losses: tuple[float, ...]  # per step (warm-up included), mean over DP replicas
    peak_memory_bytes: int  # max over ranks (``memory_kind``: cpu_max_rss or cuda_max_allocated)
    memory_kind: str
    world_size: int
    dp: int
    pp: int
    schedule: str | None  # the pipeline schedule that ran; None: one stage, no pipeline (a plain loop)
    backend: str
    tied_parameters: tuple[str, ...]
    ranks: tuple[Mapping[str, Any], ...]
    wall_time: float
    grads: Mapping[str, torch.Tensor] | None = field(default=None, repr=False)
    sharding: str = "dp"
    tp: int = 1
    precision: Mapping[str, str] = field(default_factory=lambda: {"priced": "fp32", "run": "fp32"})  # run_precision

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "grads"}
        out.update(schema=RESULT_SCHEMA, version=VERSION, ranks=[dict(r) for r in self.ranks])
        return out


@dataclass(frozen=True)
class DeploySpec:
    """One plan to deploy: the plan, its graph, and the model (a zoo name + overrides, or a module + inputs).

    ``precision``: the one that priced the plan (``PRECISIONS``; ``bf16/fp32``: its devices were priced in
    different ones); the ranks run in it where they can (:func:`run_precision`).
    """

    plan: StagePlan
    graph: CompGraph
    model: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    module: nn.Module | None = None
    inputs: Sequence[torch.Tensor] | None = None
    topology: DeviceTopology | None = None
    precision: str = "fp32"


@dataclass(frozen=True)
class PreparedJob:
    job_dir: Path
    parts: tuple[ParallelDims, ...]
    backend: str
    threads: int
    timeout_s: float

    @property
    def world_size(self) -> int:
        return self.parts[0].world_size
