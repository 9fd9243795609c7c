"""One rank of a deployed ``StagePlan``: ``python -m placement_rl.executor.distributed_worker JOB_DIR``.

torchrun-compatible: reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
from the environment (``env://`` rendezvous), and the job from ``JOB_DIR`` written by
:func:`placement_rl.executor.distributed.prepare_job`: ``job.json`` (backend, options, the list of
*parts*) and one directory per part (one plan: its layout, exported program and inputs). Several
parts run one after the other in the same process group, so a batch of plans pays the start-up once.
On several machines ``JOB_DIR`` must be readable at the same path on each (shared file system or copy).

Phases per part (small named functions, torchtitan style): ``build_stages`` -> ``build_mesh`` ->
``apply_dp`` -> ``pipeline_stage`` / ``build_schedule`` -> training steps; the process group is
destroyed in ``finally``. Progress goes to ``JOB_DIR/progress/rank<r>`` (the launcher's watchdog reads
it to name a rank that hangs), results to ``<part>/result/rank<r>.json`` (+ ``rank<r>_grads.pt``), an
exception to ``JOB_DIR/result/rank<r>.error.json``.

Test hook: ``PLACEMENT_RL_FAULT=<kind>:<rank>`` with kind ``exit`` (the rank exits with code 3) or
``hang`` (it sleeps) at the start of its first step, to test the fault handling.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as pp_schedules
from torch.nn.parallel import DistributedDataParallel

from placement_rl.executor._mesh import ParallelDims
from placement_rl.executor._stages import (StageSplit, program_module, retarget, split_stages, stage_parameters,
                                           tied_parameters, untie)

FAULT_ENV = "PLACEMENT_RL_FAULT"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Progress:
    """Monotonic progress counter of this rank, mirrored to a file the launcher's watchdog reads."""

    def __init__(self, job_dir: Path, rank: int) -> None:
        self.path = job_dir / "progress" / f"rank{rank}"
        self.path.parent.mkdir(exist_ok=True)
        self.value = 0

    def mark(self, what: str) -> None:
        self.value += 1
        _write_atomic(self.path, f"{self.value} {what}")


def loss_is_stage_output(output: torch.Tensor, target: Any) -> torch.Tensor:
    """The schedule's ``loss_fn``: the last stage already computed the loss (``target`` is a dummy)."""
    return output


def init_distributed(backend: str, timeout_s: float, device_kind: str) -> tuple[int, int, torch.device]:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device_kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                            **({"device_id": device} if device.type == "cuda" else {}))
    return rank, world, device


def build_mesh(dims: ParallelDims, device: torch.device) -> DeviceMesh:
    return init_device_mesh(device.type, (dims.dp, dims.pp), mesh_dim_names=("dp", "pp"))


def build_stages(gm: nn.Module, stage_map: dict[str, int], dims: ParallelDims, pp_rank: int,
                 device: torch.device, aliases: dict[str, str]) -> tuple[list[StageSplit], dict[str, tuple[int, ...]]]:
    """This rank's stages (tied parameters given a copy per stage) and the plan's tied parameters."""
    splits = split_stages(gm, stage_map, dims.num_stages, aliases=aliases)
    ties = tied_parameters(splits)
    mine = [splits[s] for s in dims.stages_of(pp_rank)]
    for sp in mine:
        untie(sp, list(ties))
        retarget(sp.module, device)
        sp.module.to(device)
    return mine, ties


def tie_groups(dims: ParallelDims, ties: dict[str, tuple[int, ...]], rank: int) -> dict[str, Any]:
    """Process group per tied parameter over the ranks (same DP replica) whose stages hold it.

    ``dist.new_group`` is collective: every rank creates every group, in the same order.
    """
    out: dict[str, Any] = {}
    dp_rank, _ = dims.coords(rank)
    for name in sorted(ties):
        cols = sorted({dims.pp_rank_of_stage[s] for s in ties[name]})
        for d in range(dims.dp):
            ranks = [dims.rank(d, c) for c in cols]
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if d == dp_rank and rank in ranks:
                out[name] = group
    return out


def apply_dp(modules: Sequence[nn.Module], dp_mesh: DeviceMesh, *, device: torch.device,
             zero_bubble: bool) -> list[nn.Module]:
    """Wrap each stage module with DDP over the ``dp`` mesh dimension (a no-op for DP degree 1).

    Zero-bubble schedules compute weight gradients in a separate pass that DDP's hooks do not see
    (measured: wrong gradients), so there the modules stay unwrapped and :func:`allreduce_grads`
    averages the gradients after the schedule.
    """
    if dp_mesh.size() == 1 or zero_bubble:
        return list(modules)
    group = dp_mesh.get_group()
    return [DistributedDataParallel(m, process_group=group, broadcast_buffers=False,
                                    device_ids=[device.index] if device.type == "cuda" else None)
            if any(p.requires_grad for p in m.parameters()) else m for m in modules]


def pipeline_stage(module: nn.Module, split: StageSplit, dims: ParallelDims, device: torch.device,
                   metas: dict[str, Any], group: Any) -> PipelineStage:
    """A ``PipelineStage`` in static mode: example inputs/outputs and their grads from the value metadata."""
    def example(name: str, *, grad: bool = False) -> torch.Tensor:
        shape, dtype, requires_grad = metas[name]
        t = torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
        return t.requires_grad_(requires_grad) if not grad else t  # static mode reads requires_grad

    def grads(names: Sequence[str]) -> tuple[torch.Tensor | None, ...]:
        return tuple(example(v, grad=True) if metas[v][2] else None for v in names)

    first, last = split.index == 0, split.index == dims.num_stages - 1
    outputs = example(split.outputs[0]) if last else tuple(example(v) for v in split.outputs)
    return PipelineStage(module, split.index, dims.num_stages, device,
                         input_args=tuple(example(v) for v in split.inputs),
                         output_args=outputs, input_grads=None if first else grads(split.inputs),
                         output_grads=None if last else grads(split.outputs), group=group)


def build_schedule(dims: ParallelDims, stages: list[PipelineStage]) -> Any:
    cls = getattr(pp_schedules, dims.schedule_class_name())
    if dims.stages_per_rank == 1 and dims.schedule in ("gpipe", "1f1b"):
        return cls(stages[0], n_microbatches=dims.num_microbatches, loss_fn=loss_is_stage_output)
    return cls(stages, n_microbatches=dims.num_microbatches, loss_fn=loss_is_stage_output)


def allreduce_grads(params: Sequence[nn.Parameter], group: Any, size: int) -> None:
    """Average gradients over the DP group in one flat all-reduce (used without DDP)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def sync_tied_grads(tied: dict[str, list[nn.Parameter]], groups: dict[str, Any]) -> None:
    """Sum the gradient of each tied parameter over its local copies and the other owning ranks."""
    for name in sorted(tied):
        copies = tied[name]
        grads = [p.grad for p in copies if p.grad is not None]
        total = torch.stack(grads).sum(0) if grads else torch.zeros_like(copies[0])
        if groups.get(name) is not None:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=groups[name])
        for p in copies:
            p.grad = total.clone()


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_max_rss"


def _fault(rank: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    kind, _, who = spec.partition(":")
    if who.isdigit() and int(who) == rank:
        if kind == "exit":
            os._exit(3)
        if kind == "hang":
            time.sleep(1e6)


def train(cfg: dict[str, Any], part_dir: Path, *, rank: int, device: torch.device, progress: Progress,
          fault: bool) -> dict[str, Any]:
    """Build this rank's share of one plan (a *part* of the job) and run its training steps."""
    part = json.loads((part_dir / "part.json").read_text())
    dims = ParallelDims(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in part["dims"].items()})
    dp_rank, pp_rank = dims.coords(rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    gm = program_module(torch.export.load(str(part_dir / "program.pt2")))
    splits, ties = build_stages(gm, {k: int(v) for k, v in part["stage_map"].items()}, dims, pp_rank, device,
                                part["param_aliases"])
    del gm
    mesh = build_mesh(dims, device)
    groups = tie_groups(dims, ties, rank)
    zero_bubble = "ZeroBubble" in dims.schedule_class_name()
    manual_dp = zero_bubble and dims.dp > 1
    modules = apply_dp([sp.module for sp in splits], mesh["dp"], device=device, zero_bubble=zero_bubble)
    stages = [pipeline_stage(mod, sp, dims, device, part["value_meta"], mesh["pp"].get_group())
              for mod, sp in zip(modules, splits)]
    schedule = build_schedule(dims, stages)
    named = [stage_parameters(sp) for sp in splits]
    params = [p for per in named for p in per.values()]
    tied: dict[str, list[nn.Parameter]] = {}
    for per in named:
        for name, p in per.items():
            if name in ties:
                tied.setdefault(name, []).append(p)
    optimizer = torch.optim.Adam(params, lr=float(cfg["lr"])) if params else None
    progress.mark("built")

    inputs = torch.load(part_dir / "inputs.pt", weights_only=True)
    per_replica = inputs[0].shape[0] // dims.dp
    batch = tuple(t[dp_rank * per_replica:(dp_rank + 1) * per_replica].to(device) for t in inputs)
    first = any(sp.index == 0 for sp in splits)
    last = any(sp.index == dims.num_stages - 1 for sp in splits)
    dummy_target = torch.zeros(dims.num_microbatches, device=device)
    dp_group = mesh["dp"].get_group() if manual_dp else None

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train_step() -> tuple[float, float, float, list[torch.Tensor]]:
        """One step: schedule (forward, backward, DP sync), tied-grad sync, Adam.

        Returns (wall s, Adam wall s, CPU s of this process, losses)."""
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        dist.barrier()  # every rank starts the step together, so the slowest rank's time is the step time
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        mb_losses: list[torch.Tensor] = []
        schedule.step(*(batch if first else ()), target=dummy_target if last else None,
                      losses=mb_losses if last else None, return_outputs=False)
        if manual_dp:
            allreduce_grads(params, dp_group, dims.dp)
        sync_tied_grads(tied, groups)
        sync()
        t1 = time.perf_counter()
        if optimizer is not None:
            optimizer.step()
        sync()
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1, time.process_time() - c0, mb_losses

    step_times, opt_times, cpu_times, losses = [], [], [], []
    grads: dict[str, torch.Tensor] = {}
    for step in range(int(cfg["warmup"]) + int(cfg["steps"])):
        if step == 0 and fault:
            _fault(rank)
        progress.mark(f"{part_dir.name} step {step} begin")
        dt, dt_opt, dt_cpu, mb_losses = train_step()
        progress.mark(f"{part_dir.name} step {step} end")
        if step == 0 and cfg.get("collect_grads"):
            grads = {name: p.grad.detach().cpu().clone() for per in named for name, p in per.items()
                     if p.grad is not None}
        if step >= int(cfg["warmup"]):
            step_times.append(dt)
            cpu_times.append(dt_cpu)
            opt_times.append(dt_opt)
        if last:
            losses.append(float(torch.stack([x.detach() for x in mb_losses]).mean()))
    peak, kind = _peak_memory(device)
    if grads:
        torch.save(grads, part_dir / "result" / f"rank{rank}_grads.pt")
    return {"rank": rank, "dp_rank": dp_rank, "pp_rank": pp_rank, "stages": [sp.index for sp in splits],
            "device": str(device), "step_times": step_times, "optimizer_times": opt_times, "cpu_times": cpu_times,
            "median_step_time": statistics.median(step_times) if step_times else None,
            "losses": losses, "peak_memory_bytes": peak, "memory_kind": kind,
            "model_state_bytes": int(sum(p.numel() * p.element_size() for p in params)) * 4,
            "num_params": int(sum(p.numel() for p in params)), "tied": sorted(tied)}



def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m placement_rl.executor.distributed_worker JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    job = json.loads((job_dir / "job.json").read_text())
    cfg = job["config"]
    torch.set_num_threads(int(cfg["threads"]))
    rank = int(os.environ["RANK"])
    progress = Progress(job_dir, rank)
    progress.mark("started")
    try:
        rank, _, device = init_distributed(job["backend"], float(cfg["timeout_s"]), cfg["device"])
        progress.mark("process group")
        for i, name in enumerate(job["parts"]):
            result = train(cfg, job_dir / name, rank=rank, device=device, progress=progress, fault=i == 0)
            _write_atomic(job_dir / name / "result" / f"rank{rank}.json", json.dumps(result))
        progress.mark("done")
    except BaseException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _write_atomic(job_dir / "result" / f"rank{rank}.error.json",
                      json.dumps({"rank": rank, "time": time.time(), "progress": progress.value,
                                  "error": f"{type(exc).__name__}: {first}"[:400]}))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
