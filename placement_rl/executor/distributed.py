"""Deploy a ``StagePlan`` for real: DP x PP (x TP) with ``torch.distributed`` (pipelining stages + DDP or FSDP2
on a 2-D mesh, or a 3-D ``(dp, pp, tp)`` mesh with Megatron tensor parallelism through ``parallelize_module``,
see ``_tp``; a one-stage plan is plain DDP / FSDP2 / TP without a pipeline schedule).

Flow (everything that can be wrong is checked before a process starts)::

    deploy_stage_plan(plan, graph, model="gpt", overrides={...})      # or module=..., inputs=...
      prepare_job   parallel_dims(plan) -> ParallelDims  (one DP degree, dp x pp ranks, layout, schedule, sharding)
                    batch checks                          (dp x num_microbatches divide the batch)
                    memory check with a topology          (the cost model's memory rule; device and bytes named)
                    torch.export at micro-batch size; assign_stages(program, graph, plan)
                                                          (every plan node in the program, contiguous stages;
                                                          names realigned past the ops without compute that an
                                                          export at micro-batch size 1 folds, _prepare.program_names)
                    no custom autograd.Function (its backward would not run), the modules defining custom ops
                    (each rank imports them), static shapes in a pipeline, no in-place write into a value
                    received with its alias (a received value a stage writes into is copied first)
                    TP: degree divides heads / hidden / vocab, split GEMMs are nn.Linear / nn.Embedding
                    calls, no cut inside a TP region, TP groups on one host (with a topology), with
                    sequence parallelism a sequence the TP degree divides
                    the precision each plan runs in (``run_precision``: its priced one where the path has it)
                    write JOB_DIR: job.json + one part per plan (part.json, program.pt2, inputs.pt)
      launch_local  one ``distributed_worker`` process per rank (torchrun's environment), watchdog;
                    ExecutionError naming the rank that died or hung, no process left behind
      collect_results -> DeployResult (median step time, samples/s, Adam time, peak memory, losses)

Several plans with the same world size can share one launch (``deploy_stage_plans``): the ranks start
once and run the plans one after the other. Launching uses ``subprocess`` rather than
``torch.multiprocessing.spawn``: the ranks run the very module ``torchrun`` runs, each in its own
session so the watchdog can kill a rank and anything it started.

Splitting: stage k is the exported program's sub-graph of the nodes the plan puts in stage k
(``_stages.split_stages``). Targets are ordinary inputs: the first stage receives all inputs and
threads those a later stage needs (the targets, for the loss) to it. The last stage's output is the
loss itself, so the schedule's ``loss_fn`` returns it unchanged. The gradients equal those of one
process whose loss is the mean over the ``dp x num_microbatches`` chunks of the batch (the full-batch
loss for mean-reduced losses without batch statistics; with BatchNorm each chunk has its own
statistics, as in any data- or pipeline-parallel run) -- see :func:`reference_step`.

Tied parameters (GPT's embedding and LM head) get a copy in each stage that uses them; after the
schedule (and DDP) their gradients are summed over the owning stages (an all-reduce among those ranks,
a local sum for stages on one rank), so every copy takes the same Adam step.

Backends: gloo on CPU, NCCL on CUDA (``device="cuda"``, or ``"auto"`` when GPUs are present and the
plan's devices are GPUs; one GPU per rank: the plan device's ``torch_device`` index when the job was prepared with
a topology and the node's ranks map to distinct GPUs of one host, else ``LOCAL_RANK``, with a note; see
``_mesh.cuda_binding``). ``job.json``'s ``rank_devices`` and each rank's ``plan_device`` in the result say which
device of the plan a rank stands for (the same on CPU). Launch with :func:`launch_local` on this
machine, or with ``torchrun`` on one or several machines using :func:`build_torchrun_command` (then
:func:`collect_results`).

The parts: ``_deploy_types`` (the config, spec, job and result values), ``_prepare`` (one plan checked and written:
``prepare_part``, ``check_memory``), ``_tp_checks`` (the TP checks), ``_devices`` (where and in which precision the
ranks run); import them from here.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from placement_rl.errors import ConfigError, ExecutionError, PlanError
from placement_rl.executor._deploy_types import (DEVICES, JOB_SCHEMA, PRECISIONS, RESULT_SCHEMA, VERSION, DeployConfig,
                                                 DeployResult, DeploySpec, PreparedJob)
from placement_rl.executor._devices import _resolve_device, plan_devices_of_ranks, run_precision
from placement_rl.executor._launch import build_torchrun_command, run_ranks
from placement_rl.executor._mesh import ParallelDims
from placement_rl.executor._prepare import check_memory, prepare_part
from placement_rl.executor._stages import export_step, program_module
from placement_rl.executor._tp_checks import (LOGIT_OPS, check_logits, check_sequence, check_ties,
                                              sequence_parallel_names)
from placement_rl.graph.io import atomic_write_text
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

__all__ = ["PRECISIONS", "DeployConfig", "DeployResult", "DeploySpec", "PreparedJob", "build_torchrun_command",
           "collect_results", "deploy_stage_plan", "deploy_stage_plans", "launch_local", "prepare_job",
           "reference_step", "run_precision", "sequence_parallel_names",
           # from the parts, still imported from here
           "DEVICES", "JOB_SCHEMA", "LOGIT_OPS", "RESULT_SCHEMA", "VERSION", "check_logits", "check_memory",
           "check_sequence", "check_ties", "export_step", "plan_devices_of_ranks", "prepare_part", "program_module"]


def prepare_job(specs: Sequence[DeploySpec], *, config: DeployConfig | None = None,
                job_dir: str | Path) -> PreparedJob:
    """Validate every plan and write the job directory the ranks read; no process is started. A plan refused
    here leaves no job directory behind (unless ``job_dir`` existed before).

    All plans of one job run in the same processes, one after the other: they need the same world size.
    """
    config = (config or DeployConfig()).validate()
    if not specs:
        raise ConfigError("prepare_job needs at least one plan")
    job = Path(job_dir)
    created = not job.exists()
    (job / "result").mkdir(parents=True, exist_ok=True)
    parts = []
    try:
        for i, spec in enumerate(specs):
            dims = prepare_part(spec, part_dir=job / f"part{i}")
            if parts and dims.world_size != parts[0].world_size:
                raise PlanError(f"plan #{i} needs {dims.world_size} processes, plan #0 needs "
                                f"{parts[0].world_size}; plans deployed together must have the same world size")
            parts.append(dims)
        devices = {_resolve_device(config, s.plan, s.topology) for s in specs}
        if len(devices) != 1:
            raise ConfigError("plans deployed together must all run on CPUs or all on GPUs")
        device = devices.pop()
        precisions = [run_precision(s.precision, device, d) for s, d in zip(specs, parts)]
    except BaseException:
        if created:  # a refused plan leaves no job directory behind
            shutil.rmtree(job, ignore_errors=True)
        raise
    backend = "nccl" if device == "cuda" else "gloo"
    # the plan's device of every rank, when every plan has a topology and all of them map the ranks alike
    maps = [None if s.topology is None else plan_devices_of_ranks(s.plan, d, s.topology) for s, d in zip(specs, parts)]
    atomic_write_text(job / "job.json", json.dumps({
        "schema": JOB_SCHEMA, "version": VERSION, "backend": backend, "config": asdict(config) | {"device": device},
        "world_size": parts[0].world_size, "parts": [f"part{i}" for i in range(len(parts))], "precision": precisions,
        "rank_devices": maps[0] if all(m is not None and m == maps[0] for m in maps) else None}, indent=1))
    return PreparedJob(job_dir=job, parts=tuple(parts), backend=backend, threads=config.threads,
                       timeout_s=config.timeout_s)


def _collect_part(part_dir: Path, *, backend: str, collect_grads: bool, wall_time: float,
                  precision: Mapping[str, str]) -> DeployResult:
    part = json.loads((part_dir / "part.json").read_text())
    dims = ParallelDims(**{k: tuple(v) if isinstance(v, list) else v for k, v in part["dims"].items()})
    ranks = []
    for r in range(dims.world_size):
        path = part_dir / "result" / f"rank{r}.json"
        if not path.is_file():
            raise ExecutionError(f"rank {r} wrote no result for {part_dir.name} ({path} is missing)")
        ranks.append(json.loads(path.read_text()))
    per_step = np.max(np.array([r["step_times"] for r in ranks], dtype=np.float64), axis=0)
    step_time = float(statistics.median(per_step.tolist()))
    opt = np.max(np.array([r["optimizer_times"] for r in ranks], dtype=np.float64), axis=0)
    last = [r["losses"] for r in ranks if dims.num_stages - 1 in r["stages"]]
    losses = tuple(float(x) for x in np.mean(np.array(last, dtype=np.float64), axis=0))
    grads = None
    if collect_grads:
        grads = {}
        for r in range(dims.world_size):
            path = part_dir / "result" / f"rank{r}_grads.pt"
            if ranks[r]["dp_rank"] == 0 and path.is_file():
                grads.update(torch.load(path, weights_only=True))
    peak = max(ranks, key=lambda r: r["peak_memory_bytes"])
    return DeployResult(step_time=step_time, throughput=part["batch_size"] / step_time,
                        optimizer_time=float(statistics.median(opt.tolist())), batch_size=part["batch_size"],
                        losses=losses, peak_memory_bytes=int(peak["peak_memory_bytes"]),
                        memory_kind=peak["memory_kind"], world_size=dims.world_size, dp=dims.dp, pp=dims.pp,
                        schedule=None if dims.plain else dims.schedule, backend=backend,
                        tied_parameters=tuple(sorted(part["tied"])), ranks=tuple(ranks), wall_time=wall_time,
                        grads=grads, sharding=dims.sharding, tp=dims.tp, precision=dict(precision))


def collect_results(job_dir: str | Path, *, wall_time: float = 0.0) -> list[DeployResult]:
    """Read the per-rank results of a finished job (launched here or by torchrun), one per plan."""
    job_dir = Path(job_dir)
    job = json.loads((job_dir / "job.json").read_text())
    return [_collect_part(job_dir / name, backend=job["backend"], collect_grads=bool(job["config"]["collect_grads"]),
                          wall_time=wall_time, precision=precision)
            for name, precision in zip(job["parts"], job["precision"])]


def launch_local(job: PreparedJob, *, nprocs: int | None = None, timeout_s: float | None = None,
                 extra_env: Mapping[str, str] | None = None) -> list[DeployResult]:
    """Run a prepared job with one process per rank on this machine; ``ExecutionError`` names a failed rank."""
    world = job.world_size
    nprocs = world if nprocs is None else nprocs
    if nprocs != world:
        raise ConfigError(f"the plan needs {world} processes (dp {job.parts[0].dp} x pp {job.parts[0].pp} x tp "
                          f"{job.parts[0].tp}), not {nprocs}")
    if job.backend == "nccl" and torch.cuda.device_count() < world:
        raise ConfigError(f"the plan needs {world} GPUs on this machine, torch sees {torch.cuda.device_count()}")
    wall = run_ranks(job.job_dir, nprocs=nprocs, timeout_s=job.timeout_s if timeout_s is None else timeout_s,
                     threads=job.threads, extra_env=extra_env)
    return collect_results(job.job_dir, wall_time=wall)


def deploy_stage_plans(specs: Sequence[DeploySpec], *, config: DeployConfig | None = None,
                       job_dir: str | Path | None = None,
                       extra_env: Mapping[str, str] | None = None) -> list[DeployResult]:
    """Validate every plan, then run them one after the other in ``dp x pp`` local processes (started once).

    ``job_dir``: where the job and per-rank logs go (default: a temporary directory, removed after a
    success unless ``config.keep_job_dir``; kept after a failure, whose message names its logs).
    """
    config = config or DeployConfig()
    tmp = None
    if job_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="prl-deploy-"))
        job_dir = tmp
    try:
        job = prepare_job(specs, config=config, job_dir=job_dir)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    results = launch_local(job, extra_env=extra_env)
    if tmp is not None and not config.keep_job_dir:  # kept after a failure: the error message points at its logs
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def deploy_stage_plan(plan: StagePlan, graph: CompGraph, *, model: str | None = None,
                      overrides: Mapping[str, Any] | None = None, module: nn.Module | None = None,
                      inputs: Sequence[torch.Tensor] | None = None, config: DeployConfig | None = None,
                      topology: DeviceTopology | None = None, job_dir: str | Path | None = None,
                      extra_env: Mapping[str, str] | None = None, precision: str = "fp32") -> DeployResult:
    """Deploy one plan on this machine: train ``config.steps`` steps and report the measurements.

    The model is a zoo name (``model=``, ``overrides=``) or a module with its example inputs (targets
    included; ``module(*inputs)`` returns the loss). ``precision``: the one that priced the plan
    (:func:`run_precision`). The result's ``to_dict()`` is what ``deploy.json`` holds.
    """
    spec = DeploySpec(plan=plan, graph=graph, model=model, overrides=dict(overrides or {}), module=module,
                      inputs=inputs, topology=topology, precision=precision)
    return deploy_stage_plans([spec], config=config, job_dir=job_dir, extra_env=extra_env)[0]


def reference_step(module: nn.Module, inputs: Sequence[torch.Tensor], *,
                   chunks: int) -> tuple[float, dict[str, torch.Tensor]]:
    """Single-process reference of one deployed step: loss and grads (by parameter name) of the mean of
    the losses of ``chunks`` (= dp x num_microbatches) equal slices of the batch, in replica-major order.
    """
    module.zero_grad(set_to_none=True)
    size = int(inputs[0].shape[0]) // chunks
    total = sum(module(*(t[i * size:(i + 1) * size] for t in inputs)) for i in range(chunks)) / chunks
    total.backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    return float(total.detach()), grads
