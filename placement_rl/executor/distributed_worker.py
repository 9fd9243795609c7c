"""One rank of a deployed ``StagePlan``: ``python -m placement_rl.executor.distributed_worker JOB_DIR``.

torchrun-compatible: reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
from the environment (``env://`` rendezvous), and the job from ``JOB_DIR`` written by
:func:`placement_rl.executor.distributed.prepare_job`: ``job.json`` (backend, options, the list of
*parts*) and one directory per part (one plan: its layout, exported program and inputs). Several
parts run one after the other in the same process group, so a batch of plans pays the start-up once.
On several machines ``JOB_DIR`` must be readable at the same path on each (shared file system or copy).

Per part, ``_runner.PartRunner`` builds this rank's stages (small named functions, torchtitan style)
and steps them; the process group is destroyed in ``finally``. Progress goes to
``JOB_DIR/progress/rank<r>`` (the launcher's watchdog reads it to name a rank that hangs), results to
``<part>/result/rank<r>.json`` (+ ``rank<r>_grads.pt``), an exception to ``JOB_DIR/result/rank<r>.error.json``.

Test hook: ``PLACEMENT_RL_FAULT=<kind>:<rank>`` with kind ``exit`` (the rank exits with code 3) or
``hang`` (it sleeps) at the start of its first step, to test the fault handling.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

from placement_rl.executor._mesh import ParallelDims, cuda_binding
from placement_rl.executor._runner import PartRunner

FAULT_ENV = "PLACEMENT_RL_FAULT"
DROPOUT_SEED = 20240917  # the first seed of the dropout streams (:func:`dropout_seed`)


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


def init_distributed(backend: str, timeout_s: float, device_kind: str,
                     rank_devices: list | None = None) -> tuple[int, int, torch.device]:
    """Join the process group. On CUDA the rank binds to its plan device's GPU (``cuda:2`` for a plan device whose
    ``torch_device`` is ``cuda:2``; ``_mesh.cuda_binding``), else to ``LOCAL_RANK`` with a note on stderr."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device_kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        index, note = cuda_binding(rank_devices, rank=rank, local_rank=local,
                                   local_world=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                                   device_count=torch.cuda.device_count())
        if note and local == 0:
            print(f"note: ranks take GPUs in LOCAL_RANK order, not the plan's devices: {note}", file=sys.stderr)
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                            **({"device_id": device} if device.type == "cuda" else {}))
    return rank, world, device


def dropout_seed(dims: ParallelDims, rank: int) -> int:
    """The seed of ``rank``'s dropout stream: one per (DP replica, pipeline rank), shared by the ranks of a TP group.

    Each pipeline rank draws its own masks (Megatron offsets the seed per pipeline rank: stages seeded alike drop
    the same elements of same-shaped activations). A TP group shares its stream, so the replicated regions drop the
    same elements on every TP rank and their parameters' gradients stay equal (Megatron's rule); a region on local
    shards draws per TP rank from it (``_tp_rng.rank_stream``)."""
    dp_rank, pp_rank = dims.coords(rank)
    return DROPOUT_SEED + dp_rank * dims.pp + pp_rank


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
          fault: bool, plan_device: str | None = None, precision: str = "fp32") -> dict[str, Any]:
    """Build this rank's share of one plan (a *part* of the job) and run its training steps in ``precision``
    (``job.json``'s, ``distributed.run_precision``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run = PartRunner(cfg, part_dir, rank=rank, device=device, precision=precision)
    # dropout: a stream per DP replica and pipeline rank, shared by a TP group (:func:`dropout_seed`); seeded after
    # the build, whose draws differ between the ranks
    torch.manual_seed(dropout_seed(run.dims, rank))
    progress.mark(f"{part_dir.name} built")
    timings, losses = [], []
    grads: dict[str, torch.Tensor] = {}
    for step in range(int(cfg["warmup"]) + int(cfg["steps"])):
        if step == 0 and fault:
            _fault(rank)
        progress.mark(f"{part_dir.name} step {step} begin")
        t = run.step()
        progress.mark(f"{part_dir.name} step {step} end")
        if step == 0 and cfg.get("collect_grads"):
            grads = run.grads()
        if step >= int(cfg["warmup"]):
            timings.append(t)
        if run.last:
            losses.append(float(torch.stack([x.detach() for x in t.losses]).mean()))
    if grads:
        torch.save(grads, part_dir / "result" / f"rank{rank}_grads.pt")
    peak, kind = run.peak_memory()
    step_times = [t.wall for t in timings]
    return {"rank": rank, "dp_rank": run.dp_rank, "pp_rank": run.dims.coords(rank)[1],
            "tp_rank": run.dims.tp_rank(rank), "stages": [sp.index for sp in run.splits], "device": str(device),
            "plan_device": plan_device, "step_times": step_times,
            "optimizer_times": [t.optimizer for t in timings], "cpu_times": [t.cpu for t in timings],
            "median_step_time": statistics.median(step_times) if step_times else None,
            "losses": losses, "peak_memory_bytes": peak, "memory_kind": kind,
            "model_state_bytes": int(sum(p.numel() * p.element_size() for p in run.params)) * 4,
            "num_params": int(sum(p.numel() for p in run.params)),
            "local_params": int(sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in run.params)),
            "tied": sorted(run.tied)}


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
        devices = job.get("rank_devices")  # the plan's device of every rank (a job written with a topology)
        rank, _, device = init_distributed(job["backend"], float(cfg["timeout_s"]), cfg["device"], devices)
        progress.mark("process group")
        plan_device = devices[rank]["name"] if devices and rank < len(devices) else None
        for i, name in enumerate(job["parts"]):
            result = train(cfg, job_dir / name, rank=rank, device=device, progress=progress, fault=i == 0,
                           plan_device=plan_device, precision=job["precision"][i]["run"])
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
    if os.environ.get(FAULT_ENV, "") == f"abort_at_exit:{rank}":
        os.abort()  # a crash in teardown after every result is written (as gloo's threads can cause)
    return 0


def _end(code: int) -> None:
    """Leave without the interpreter's teardown once this rank's results are written: gloo's C++ threads can
    abort the process in static destructors at exit (``terminate called without an active exception``, seen once
    in ~100 test launches), after every result is on disk."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _end(main())
