"""What DTensor's dispatch costs a deployed TP stage, measured on the stage's own program in this process.

``measure_tp_dispatch(part_dir)`` reads a part written by ``prepare_job`` (a plan with TP degree t > 1) and, in the
calling process (a one-rank gloo group is started when none is), builds every stage of the plan twice from the
exported program: as the plain stage program, and as ``_runner.PartRunner`` runs it on a TP rank -- ``_tp.apply_tp``
(column / row / vocab-parallel modules, local-shard regions, padded vocabulary, sequence parallelism), the same
activation recomputation -- but over a **one-rank** TP mesh, so every shard is the whole tensor and no byte moves.
Both run forward + backward of one micro-batch (the plan's micro-batch of one replica; the first stage on the
part's own inputs, later stages on tensors of the boundary's shapes) and Adam, in interleaved rounds, under the
runner's TP context (``implicit_replication`` and ``loss_parallel``). Per stage:

* ``pass_s``: TP pass minus plain pass -- the CPU seconds DTensor adds per micro-batch (sharding propagation,
  wrapping / unwrapping, redistribute calls, autograd of the subclass), which per-op profiles do not see and which
  do not shrink with the shard;
* ``adam_s``: Adam over the DTensor parameters minus Adam over the same plain parameters;
* ``plain_pass_s``, ``plain_adam_s``: the plain figures, for reference.

The TP collectives are not in these figures beyond their call on a one-rank group (DTensor still issues them): the
cost model prices the collectives themselves from measured collective times over the links.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from placement_rl.errors import PlanError


def _one_rank_group() -> contextlib.AbstractContextManager:
    """A one-rank gloo process group for the measurement, unless one is already up (then that one)."""
    if dist.is_initialized():
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def group():
        fd, path = tempfile.mkstemp(prefix="prl-tp-probe-")
        os.close(fd)
        os.unlink(path)
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{path}")
        try:
            yield
        finally:
            dist.destroy_process_group()
            with contextlib.suppress(OSError):
                os.unlink(path)

    return group()


def _example(meta: Any, *, grad: bool) -> torch.Tensor:
    shape, dtype, requires_grad = meta
    dt = getattr(torch, dtype)
    if dt.is_floating_point:
        return torch.randn(shape, dtype=dt).requires_grad_(bool(requires_grad) and grad)
    return torch.zeros(shape, dtype=dt)


def _tp_context() -> contextlib.ExitStack:
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.distributed.tensor.parallel import loss_parallel

    stack = contextlib.ExitStack()
    stack.enter_context(implicit_replication())
    stack.enter_context(loss_parallel())
    return stack


def _backward(out: Any) -> None:
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def measure_tp_dispatch(part_dir: str | Path, *, repeats: int = 10, warmup: int = 3) -> list[dict[str, float]]:
    """Per stage of the part's plan: DTensor's extra seconds per micro-batch pass and per Adam step (see the module
    docstring). ``PlanError`` for a part without TP."""
    from torch.distributed.device_mesh import init_device_mesh

    from placement_rl.executor import _tp
    from placement_rl.executor._recompute import apply_recompute
    from placement_rl.executor._runner import read_dims
    from placement_rl.executor._stages import (import_op_modules, program_module, split_stages, stage_parameters,
                                               tied_parameters, untie)

    part_dir = Path(part_dir)
    part = json.loads((part_dir / "part.json").read_text())
    dims = read_dims(part)
    if dims.tp == 1:
        raise PlanError(f"{part_dir.name}: the plan has no tensor parallelism (TP degree 1); nothing to probe")
    import_op_modules(part.get("op_modules") or ())
    inputs = torch.load(part_dir / "inputs.pt", weights_only=True)
    micro = inputs[0].shape[0] // (dims.dp * dims.num_microbatches)
    stage_map = {k: int(v) for k, v in part["stage_map"].items()}
    regions = part.get("recompute_regions") or {}
    kinds = dict(part["tp_kinds"])
    out = []
    with _one_rank_group(), torch.random.fork_rng():
        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (1,))
        for s in range(dims.num_stages):
            built = {}
            for kind in ("plain", "tp"):
                gm = program_module(torch.export.load(str(part_dir / "program.pt2")))
                splits = split_stages(gm, stage_map, dims.num_stages, aliases=part["param_aliases"])
                sp = splits[s]
                untie(sp, list(tied_parameters(splits)))
                mod: Any = sp.module
                if kind == "tp":
                    ids = {id(p): name for name, p in stage_parameters(sp).items()}
                    mod, _ = _tp.apply_tp(mod, kinds, mesh, ids, vocab=tuple(part.get("tp_vocab") or ()) or None,
                                          seq_norms=frozenset(part.get("tp_seq_norms") or ()),
                                          seq_values=frozenset(part.get("tp_seq_values") or ()))
                if regions.get(str(s)):
                    apply_recompute(getattr(mod, "inner", mod), regions[str(s)])
                if s == 0:
                    args = tuple(t[:micro] for t in inputs)
                else:
                    args = tuple(_example(part["value_meta"][v], grad=True) for v in sp.inputs)
                params = [p for p in mod.parameters() if p.requires_grad]
                built[kind] = (mod, args, torch.optim.Adam(params, lr=1e-3) if params else None)
            times: dict[str, list[float]] = {k: [] for k in ("plain_pass", "tp_pass", "plain_adam", "tp_adam")}
            for r in range(warmup + repeats):
                for kind, (mod, args, opt) in built.items():
                    if opt is not None:
                        opt.zero_grad(set_to_none=True)
                    ctx = _tp_context() if kind == "tp" else contextlib.nullcontext()
                    t0 = time.perf_counter()
                    with ctx:
                        _backward(mod(*args))
                    t1 = time.perf_counter()
                    if opt is not None:
                        opt.step()
                    t2 = time.perf_counter()
                    if r >= warmup:
                        times[f"{kind}_pass"].append(t1 - t0)
                        times[f"{kind}_adam"].append(t2 - t1)
            med = {k: float(np.median(v)) for k, v in times.items()}
            out.append({"stage": s, "micro_batch": int(micro), "pass_s": max(med["tp_pass"] - med["plain_pass"], 0.0),
                        "adam_s": max(med["tp_adam"] - med["plain_adam"], 0.0), "plain_pass_s": med["plain_pass"],
                        "plain_adam_s": med["plain_adam"]})
            del built
    return out


__all__ = ["measure_tp_dispatch"]
