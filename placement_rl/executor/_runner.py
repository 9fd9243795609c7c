"""One rank's share of one deployed plan: build it (torchtitan-style named steps) and run training steps.

``PartRunner(cfg, part_dir, rank=..., device=..., precision=...)`` reads a part directory written by
``placement_rl.executor.distributed.prepare_job`` and, inside an initialised process group, builds:
``build_stages`` (split + tied copies) -> ``build_mesh`` (2-D ``dp`` x ``pp``, or 3-D with ``tp``) -> ``tie_groups`` ->
``apply_tp`` (Megatron styles through ``parallelize_module`` over ``tp``, see ``_tp``; then the DP gradients are
averaged by one all-reduce of the local shards over ``dp``, or FSDP2 shards over ``dp`` on top) ->
``apply_precision`` (the plan's priced precision, ``distributed.run_precision``: bf16 / fp16 under
``torch.autocast``, TF32 matmuls) -> ``apply_dp`` (DDP over ``dp``) or ``apply_fsdp`` (FSDP2 ``fully_shard`` over
``dp``, for ``sharding=fsdp``) -> ``pipeline_stage`` (static metadata) -> ``build_schedule`` (by name) -> Adam.
A one-stage plan skips the pipeline: each rank runs its micro-batches in a plain loop (gradient accumulation; DDP
syncs on the last one only, ``no_sync`` before), exactly what a hand-written DDP / FSDP2 script does.
``step()`` runs one timed training step. The worker entry point
(``placement_rl.executor.distributed_worker``) and the benchmark's in-process A/B both use it.
"""

from __future__ import annotations

import contextlib
import json
import resource
import time
from dataclasses import dataclass
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
from placement_rl.executor._stages import (StageSplit, import_op_modules, program_module, retarget, split_stages,
                                           stage_parameters, tied_parameters, untie)


def loss_is_stage_output(output: torch.Tensor, target: Any) -> torch.Tensor:
    """The schedule's ``loss_fn``: the last stage already computed the loss (``target`` is a dummy)."""
    return output


def build_mesh(dims: ParallelDims, device: torch.device) -> DeviceMesh:
    if dims.tp == 1:
        return init_device_mesh(device.type, (dims.dp, dims.pp), mesh_dim_names=("dp", "pp"))
    return init_device_mesh(device.type, (dims.dp, dims.pp, dims.tp), mesh_dim_names=("dp", "pp", "tp"))


def apply_tp(splits: Sequence[StageSplit], modules: Sequence[nn.Module], tp_mesh: DeviceMesh,
             kinds: dict[str, str], vocab: tuple[int, int] | None = None, seq_norms: frozenset[str] | None = None,
             seq_values: frozenset[str] | None = None
             ) -> tuple[list[nn.Module], list[dict[str, tuple[nn.Module, str]]]]:
    """Megatron TP of each stage over the ``tp`` mesh dimension (``_tp.apply_tp``); where each parameter sits."""
    from placement_rl.executor import _tp

    out, named = [], []
    for sp, mod in zip(splits, modules):
        ids = {id(p): name for name, p in stage_parameters(sp).items()}
        wrapped, params = _tp.apply_tp(mod, kinds, tp_mesh, ids, vocab=vocab, seq_norms=seq_norms,
                                       seq_values=seq_values)
        out.append(wrapped)
        named.append(params)
    return out, named


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
    for name in sorted(ties):
        cols = sorted({dims.pp_rank_of_stage[s] for s in ties[name]})
        for d in range(dims.dp):
            for t in range(dims.tp):
                ranks = [dims.rank(d, c, t) for c in cols]
                group = dist.new_group(ranks) if len(ranks) > 1 else None
                if rank in ranks:
                    out[name] = group
    return out


class Autocast(nn.Module):
    """``inner`` run under ``torch.autocast(device_type, dtype)``, its outputs given back in ``out_dtypes`` where
    those are set: a pipeline stage sends and receives values in the dtypes of the schedule's static metadata (the
    captured ones), so its neighbours' buffers and gradients match; autocast casts them again where it computes."""

    def __init__(self, inner: nn.Module, device_type: str, dtype: torch.dtype,
                 out_dtypes: Sequence[torch.dtype] | None = None) -> None:
        super().__init__()
        self.inner, self.device_type, self.dtype = inner, device_type, dtype
        self.out_dtypes = None if out_dtypes is None else tuple(out_dtypes)

    def forward(self, *args: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.inner(*args)
        if self.out_dtypes is None:
            return out
        if isinstance(out, tuple):
            return tuple(o.to(d) for o, d in zip(out, self.out_dtypes))
        return out.to(self.out_dtypes[0])


def apply_precision(splits: Sequence[StageSplit], modules: Sequence[nn.Module], precision: str,
                    device: torch.device, metas: dict[str, Any]) -> list[nn.Module]:
    """Run each stage in ``precision`` (``distributed.run_precision`` chose it for this path): bf16 / fp16 under
    ``Autocast`` (a pipeline stage's outputs in their ``metas`` dtypes), tf32 by TF32 matmuls (and cuDNN's,
    torch's default), switched off again for an fp32 part run later in the same process."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        if precision == "tf32":
            torch.backends.cudnn.allow_tf32 = True
    if precision not in ("bf16", "fp16"):
        return list(modules)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return [Autocast(mod, device.type, dtype,
                     [getattr(torch, metas[v][1]) for v in sp.outputs] if metas else None)
            for sp, mod in zip(splits, modules)]


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


def apply_fsdp(modules: Sequence[nn.Module], dp_mesh: DeviceMesh) -> list[nn.Module]:
    """Shard each stage module with FSDP2 ``fully_shard`` over the ``dp`` mesh dimension (one unit per stage;
    a no-op for DP degree 1): parameters all-gathered for forward and backward, gradients reduce-scattered
    (averaged), Adam state on the shards."""
    if dp_mesh.size() == 1:
        return list(modules)
    from torch.distributed.fsdp import fully_shard

    for m in modules:
        if any(p.requires_grad for p in m.parameters()):
            fully_shard(m, mesh=dp_mesh)
    return list(modules)


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


@torch.no_grad()
def allreduce_grads(params: Sequence[nn.Parameter], group: Any, size: int) -> None:
    """Average gradients over the DP group in one flat all-reduce (used without DDP; TP shards: their local
    tensors, each TP rank with its DP peers)."""
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def sync_tied_grads(tied: dict[str, list[nn.Parameter]], groups: dict[str, Any]) -> None:
    """Sum the gradient of each tied parameter over its local copies and the other owning ranks (TP shards:
    their local tensors, shards of one TP rank being alike)."""
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    for name in sorted(tied):
        copies = tied[name]
        grads = [local(p.grad) for p in copies if p.grad is not None]
        total = torch.stack(grads).sum(0) if grads else torch.zeros_like(local(copies[0]))
        if groups.get(name) is not None:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=groups[name])
        for p in copies:
            if hasattr(p, "to_local"):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                local(p.grad).copy_(total)
            else:
                p.grad = total.clone()


@dataclass(frozen=True)
class StepTiming:
    wall: float  # seconds from after the start barrier to the end of Adam
    optimizer: float  # seconds of the Adam step (included in ``wall``)
    cpu: float  # CPU seconds of this process during the step
    losses: tuple[torch.Tensor, ...]  # per micro-batch (last stage only)


def read_dims(part: dict[str, Any]) -> ParallelDims:
    return ParallelDims(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in part["dims"].items()})


class PartRunner:
    """This rank's stages of one plan, wrapped for DP, in a schedule, with its optimizer and data."""

    def __init__(self, cfg: dict[str, Any], part_dir: Path, *, rank: int, device: torch.device,
                 precision: str = "fp32") -> None:
        part = json.loads((part_dir / "part.json").read_text())
        self.dims = dims = read_dims(part)
        self.rank, self.device = rank, device
        self.dp_rank, pp_rank = dims.coords(rank)
        import_op_modules(part.get("op_modules") or ())  # custom ops must be registered to load the program
        gm = program_module(torch.export.load(str(part_dir / "program.pt2")))
        self.splits, ties = build_stages(gm, {k: int(v) for k, v in part["stage_map"].items()}, dims, pp_rank,
                                         device, part["param_aliases"])
        del gm
        mesh = build_mesh(dims, device)
        self.groups = tie_groups(dims, ties, rank)
        zero_bubble = "ZeroBubble" in dims.schedule_class_name()
        manual_dp = zero_bubble or (dims.tp > 1 and dims.sharding == "dp")  # DDP does not take DTensor shards
        self.dp_group = mesh["dp"].get_group() if manual_dp and dims.dp > 1 else None
        modules = [sp.module for sp in self.splits]
        named = None
        if dims.tp > 1:
            modules, named = apply_tp(self.splits, modules, mesh["tp"], dict(part["tp_kinds"]),
                                      vocab=tuple(part.get("tp_vocab") or ()) or None,
                                      seq_norms=frozenset(part.get("tp_seq_norms") or ()),
                                      seq_values=frozenset(part.get("tp_seq_values") or ()))
        recompute = part.get("recompute_regions") or {}
        if recompute:  # activation recomputation: each checkpointed region outlined under torch.utils.checkpoint
            from placement_rl.executor._recompute import apply_recompute

            for sp, mod in zip(self.splits, modules):
                apply_recompute(getattr(mod, "inner", mod), recompute.get(str(sp.index), []))
        modules = apply_precision(self.splits, modules, precision, device, part["value_meta"])
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None  # one-stage DDP only
        if dims.sharding == "fsdp":
            modules = apply_fsdp(modules, mesh["dp"])
        elif dims.tp == 1:
            modules = apply_dp(modules, mesh["dp"], device=device, zero_bubble=zero_bubble)
        self.modules = modules
        if dims.plain:
            self.schedule = None
        else:
            stages = [pipeline_stage(mod, sp, dims, device, part["value_meta"], mesh["pp"].get_group())
                      for mod, sp in zip(modules, self.splits)]
            self.schedule = build_schedule(dims, stages)
        self.row_perm: dict[str, torch.Tensor] = {}  # TP: rows interleaved for a fused GEMM (``_tp.ROW_PERM``)
        self.real_rows: dict[str, int] = {}  # TP: a padded vocabulary's real rows (``_tp.REAL_ROWS``)
        if named is not None:  # read after FSDP, which replaces the parameters it shards
            from placement_rl.executor._tp_region import REAL_ROWS, ROW_PERM

            self.named = [{k: mod._parameters[a] for k, (mod, a) in per.items()} for per in named]
            self.row_perm = {k: getattr(mod, ROW_PERM) for per in named for k, (mod, a) in per.items()
                             if hasattr(mod, ROW_PERM)}
            self.real_rows = {k: getattr(mod, REAL_ROWS) for per in named for k, (mod, a) in per.items()
                              if hasattr(mod, REAL_ROWS)}
        else:
            self.named = [stage_parameters(sp) for sp in self.splits]
        self.params = [p for per in self.named for p in per.values()]
        self.tied: dict[str, list[nn.Parameter]] = {}
        for per in self.named:
            for name, p in per.items():
                if name in ties:
                    self.tied.setdefault(name, []).append(p)
        self.optimizer = torch.optim.Adam(self.params, lr=float(cfg["lr"])) if self.params else None
        inputs = torch.load(part_dir / "inputs.pt", weights_only=True)
        per_replica = inputs[0].shape[0] // dims.dp
        self.batch = tuple(t[self.dp_rank * per_replica:(self.dp_rank + 1) * per_replica].to(device) for t in inputs)
        self.first = any(sp.index == 0 for sp in self.splits)
        self.last = any(sp.index == dims.num_stages - 1 for sp in self.splits)
        self.dummy_target = torch.zeros(dims.num_microbatches, device=device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> StepTiming:
        """One step: schedule (forward, backward, DP sync), tied-grad sync, Adam."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        dist.barrier()  # every rank starts the step together, so the slowest rank's time is the step time
        self._sync()
        t0, c0 = time.perf_counter(), time.process_time()
        losses: list[torch.Tensor] = []
        with self._tp_context():  # TP: implicit replication and the vocab-parallel loss (fwd and bwd)
            if self.schedule is None:
                self._plain_step(losses)
            else:
                self.schedule.step(*(self.batch if self.first else ()),
                                   target=self.dummy_target if self.last else None,
                                   losses=losses if self.last else None, return_outputs=False)
        if self.dims.tp > 1:
            from placement_rl.executor._tp import normalize_grads

            normalize_grads(self.params)
        if self.dp_group is not None:
            allreduce_grads(self.params, self.dp_group, self.dims.dp)
        sync_tied_grads(self.tied, self.groups)
        self._sync()
        t1 = time.perf_counter()
        if self.optimizer is not None and self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped on every rank alike when the all-reduced grads overflow
            self.scaler.update()
        elif self.optimizer is not None:
            self.optimizer.step()
        self._sync()
        t2 = time.perf_counter()
        return StepTiming(wall=t2 - t0, optimizer=t2 - t1, cpu=time.process_time() - c0, losses=tuple(losses))

    def _tp_context(self) -> Any:
        """TP: plain tensors meeting DTensor shards count as replicated, and the loss on vocabulary-sharded logits
        is Megatron's vocab-parallel cross-entropy (``loss_parallel``: all-reduces of one number per token instead of
        an all-gather of the logits), as the cost model prices it."""
        if self.dims.tp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.experimental import implicit_replication
        from torch.distributed.tensor.parallel import loss_parallel

        stack = contextlib.ExitStack()
        stack.enter_context(implicit_replication())
        stack.enter_context(loss_parallel())
        return stack

    def _plain_step(self, losses: list[torch.Tensor]) -> None:
        """One stage, data parallel: m micro-batches, each loss / m backpropagated (the schedules scale the
        same way); DDP all-reduces on the last micro-batch only, FSDP2 reduce-scatters after every one."""
        module, m = self.modules[0], self.dims.num_microbatches
        size = self.batch[0].shape[0] // m
        for i in range(m):
            sync = i == m - 1 or not isinstance(module, DistributedDataParallel)
            with contextlib.nullcontext() if sync else module.no_sync():
                out = module(*(t[i * size:(i + 1) * size] for t in self.batch))
                loss = out[0] if isinstance(out, (tuple, list)) else out
                (loss / m if self.scaler is None else self.scaler.scale(loss / m)).backward()
            losses.append(loss.detach())

    def grads(self) -> dict[str, torch.Tensor]:
        """Current gradients by original parameter name (CPU copies; FSDP shards gathered: every rank calls)."""
        out = {}
        for per in self.named:
            for name, p in per.items():
                if p.grad is None:
                    continue
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                if name in self.row_perm:  # back to the original row order
                    g = g[torch.argsort(self.row_perm[name])]
                if name in self.real_rows:  # a padded vocabulary: the real vocabulary's rows
                    g = g[:self.real_rows[name]]
                out[name] = g.detach().cpu().clone()
        return out

    def peak_memory(self) -> tuple[int, str]:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)), "cuda_max_allocated"
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_max_rss"
