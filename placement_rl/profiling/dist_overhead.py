"""What data parallelism costs on this host's process groups beyond the ops: measured, fitted, per tensor.

``measure_dist_overheads(backend="gloo")`` runs two processes (one torch thread each) and times, on a stack of
``k`` ``Linear(width, width)`` layers for several ``k`` (2 parameter tensors per layer):

* the forward + backward of one micro-batch with no wrapper, under DDP, under FSDP2 ``fully_shard`` (one unit,
  as ``executor._runner.apply_fsdp`` shards a stage), and as ``k / 2`` Megatron column / row pairs under TP
  (``parallelize_module`` over the 2 ranks) against one rank's shards as plain Linears;
* the Adam step over plain parameters and over the FSDP2 shards (DTensors);
* the collectives FSDP and DDP issue: all-reduce, all-gather and reduce-scatter of a range of buffer sizes.

``fit_dist_overheads`` turns the medians into a ``DistOverheads``: per pass (forward + backward of one
micro-batch) the extra seconds of DDP, FSDP and TP as ``a + b * tensors``, and the extra seconds of Adam over
DTensor shards (FSDP's, TP's) as ``c + d * tensors`` beyond plain Adam over the same elements. These are CPU-side costs of
the wrappers (hooks, DTensor dispatch per parameter, copy-in / copy-out, waiting on the process group), which
per-op profiles cannot see. Collective times are kept as measured curves (``collective_seconds``).

``predict_deploy_step`` adds them to a ``simulate_pipeline`` prediction of a stage plan deployed by
``placement_rl.executor`` on CPU processes, and scales the result when the plan runs more processes than the
host has cores (each process runs one thread; ``k`` processes on ``c < k`` cores take ``k / c`` as long).
Not modelled: pipeline-schedule overhead per micro-batch beyond the send/recv link fit, DDP bucket rebuilds.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import numpy as np
import torch

from placement_rl.errors import ProfileError

LAYERS = (2, 8, 32)
WIDTH = 64
BATCH = 8
SIZES = tuple(2 ** k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB
KINDS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclasses.dataclass(frozen=True)
class DistOverheads:
    """Fitted wrapper costs of one backend on one host (seconds; ``tensors``: parameter tensors of a unit)."""

    backend: str
    ddp_pass: tuple[float, float]  # per forward + backward of one micro-batch: a + b * tensors
    fsdp_pass: tuple[float, float]
    fsdp_adam: tuple[float, float]  # Adam over DTensor shards beyond plain Adam over the same elements
    tp_pass: tuple[float, float]  # TP (column / row pairs) per pass beyond one rank's shards as plain Linears
    tp_adam: tuple[float, float]  # Adam over TP's DTensor parameters beyond plain Adam over the local shards
    collectives: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]  # kind -> (bytes, seconds), 2 ranks
    raw: dict[str, Any] = dataclasses.field(default_factory=dict)

    def collective_seconds(self, kind: str, nbytes: float) -> float:
        """Measured time of a 2-rank collective of ``nbytes``, read as ``comm_fit`` reads a fitted series
        (log-log between the measured sizes, the last octave's bandwidth past the end)."""
        from placement_rl.cost.comm_fit import evaluate_fit

        if nbytes <= 0:
            return 0.0
        sizes, times = self.collectives[kind]
        return float(evaluate_fit({"log2_bytes": np.log2(sizes), "log_seconds": np.log(times)}, nbytes))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DistOverheads":
        try:
            return cls(backend=str(d["backend"]), ddp_pass=tuple(d["ddp_pass"]), fsdp_pass=tuple(d["fsdp_pass"]),
                       fsdp_adam=tuple(d["fsdp_adam"]), tp_pass=tuple(d["tp_pass"]),
                       tp_adam=tuple(d["tp_adam"]),
                       collectives={k: (tuple(v[0]), tuple(v[1])) for k, v in d["collectives"].items()},
                       raw=dict(d.get("raw", {})))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ProfileError(f"malformed distributed-overhead record ({e}); re-run the measurement") from None


def _median(fn, repeats: int) -> float:
    import torch.distributed as dist

    out = []
    for r in range(repeats + 2):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        if r >= 2:
            out.append(time.perf_counter() - t0)
    return float(np.median(out))


def _worker(rank: int, backend: str, port: int, layers: Sequence[int], sizes: Sequence[int], repeats: int,
            queue) -> None:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        res: dict[str, Any] = {"collectives": {k: [] for k in KINDS}, "layers": list(layers), "rows": []}
        for n in sizes:
            x = torch.ones(max(n // 4, 2) // 2 * 2)
            half = torch.empty(x.numel() // 2)
            res["collectives"]["all_reduce"].append(_median(lambda: dist.all_reduce(x), repeats))
            res["collectives"]["all_gather"].append(_median(lambda: dist.all_gather_into_tensor(x, half), repeats))
            res["collectives"]["reduce_scatter"].append(_median(lambda: dist.reduce_scatter_tensor(half, x), repeats))
        mesh = init_device_mesh("cpu", (2,))
        inp = torch.randn(BATCH, WIDTH)

        def make(k: int, kind: str) -> nn.Module:
            torch.manual_seed(0)
            if kind == "half":  # one TP rank's shards of k / 2 Megatron pairs, as plain Linears
                return nn.Sequential(*[nn.Linear(WIDTH, WIDTH // 2) if i % 2 == 0 else nn.Linear(WIDTH // 2, WIDTH)
                                       for i in range(k)])
            m = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(k)])
            if kind == "tp":  # k / 2 column / row pairs over the 2 ranks
                parallelize_module(m, mesh, {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel()
                                             for i in range(k)})
            return m

        for k in layers:
            row = {"k": k, "tensors": 2 * k}
            for kind in ("plain", "ddp", "fsdp", "half", "tp"):
                m = make(k, kind)
                if kind == "ddp":
                    m = DistributedDataParallel(m)  # a Linear stack has no buffers to broadcast
                elif kind == "fsdp":
                    fully_shard(m, mesh=mesh)
                opt = torch.optim.Adam(m.parameters(), lr=1e-3)

                def passes() -> None:
                    m(inp).sum().backward()

                row[f"{kind}_pass"] = _median(passes, repeats)
                row[f"{kind}_adam"] = _median(opt.step, repeats)
            res["rows"].append(row)
        if rank == 0:
            queue.put(res)
    finally:
        dist.destroy_process_group()


def measure_dist_overheads(backend: str = "gloo", *, layers: Sequence[int] = LAYERS, sizes: Sequence[int] = SIZES,
                           repeats: int = 9, timeout_s: float = 600.0) -> dict[str, Any]:
    """Raw medians of the two-process measurement (see the module docstring). CPU ``gloo`` only."""
    from placement_rl.profiling.links import run_pair

    if backend != "gloo":
        raise ProfileError(f"the wrapper-overhead measurement runs on CPU processes over gloo, not '{backend}'")
    raw = run_pair(_worker, (backend, tuple(layers), tuple(sizes), repeats), timeout_s=timeout_s,
                   what=f"{backend} wrapper-overhead measurement")
    raw["sizes"], raw["backend"] = list(sizes), backend
    return raw


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares ``a + b x`` with both terms kept >= 0 (a wrapper never makes a step faster)."""
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(max(np.mean(y), 0.0)), 0.0
    if a < 0:
        return 0.0, float(max(np.sum(x * y) / np.sum(x * x), 0.0))
    return float(a), float(b)


def fit_dist_overheads(raw: dict[str, Any]) -> DistOverheads:
    rows = raw["rows"]
    t = np.array([r["tensors"] for r in rows], dtype=np.float64)
    plain = np.array([r["plain_pass"] for r in rows])
    ddp = _line(t, np.array([r["ddp_pass"] for r in rows]) - plain)
    fsdp = _line(t, np.array([r["fsdp_pass"] for r in rows]) - plain)
    adam = _line(t, np.array([r["fsdp_adam"] - r["plain_adam"] / 2.0 for r in rows]))
    tp = _line(t, np.array([r["tp_pass"] - r["half_pass"] for r in rows]))
    tp_adam = _line(t, np.array([r["tp_adam"] - r["half_adam"] for r in rows]))
    coll = {k: (tuple(float(s) for s in raw["sizes"]), tuple(float(v) for v in raw["collectives"][k]))
            for k in KINDS}
    return DistOverheads(backend=raw["backend"], ddp_pass=ddp, fsdp_pass=fsdp, fsdp_adam=adam, tp_pass=tp,
                         tp_adam=tp_adam, collectives=coll, raw=raw)


def tensors_per_param_node(module: torch.nn.Module, graph: Any) -> float:
    """Trainable parameter tensors of ``module`` per node of its captured ``graph`` that owns parameters (the
    graph records bytes, not tensors; ``predict_deploy_step`` counts tensors)."""
    tensors = sum(1 for p in module.parameters() if p.requires_grad)
    return tensors / max(int(np.count_nonzero(graph.param_bytes)), 1)


def predict_deploy_step(simulated: float, *, plan, graph, adam_seconds: float, overheads: DistOverheads | None,
                        tensors_per_node: float = 2.0, tp_split: np.ndarray | None = None,
                        cores: int | None = None) -> dict[str, float]:
    """Step time of ``plan`` as ``placement_rl.executor`` runs it on CPU processes: the simulated schedule
    (``simulated``: ``simulate_pipeline`` with measured per-op costs) + the wrappers' per-pass costs of the
    slowest stage over its micro-batches + Adam (``adam_seconds``: plain Adam over the whole model, measured;
    the largest stage's share, over DTensor shards for FSDP) and the oversubscription of ``cores``.
    ``tensors_per_node``: parameter tensors per node that owns parameters (the graph records bytes, not
    tensors; a Linear has 2). ``tp_split``: bool [N], the nodes whose parameters TP splits (the ``graph.tp``
    annotation's ``frac_params > 0``): a stage of TP degree t > 1 pays the TP per-pass and DTensor Adam terms for
    those, and its plain Adam share is one rank's (split parameters over t).
    Without ``overheads``: the simulated schedule and plain Adam only (what the bench reported before)."""
    m = int(plan.num_microbatches)
    total = float(graph.param_bytes.sum()) or 1.0
    worst_wrap = worst_opt = 0.0
    tps = tuple(plan.tp) if plan.tp else (1,) * plan.num_stages
    split = np.zeros(graph.num_nodes, dtype=bool) if tp_split is None else np.asarray(tp_split, dtype=bool)
    for s in range(plan.num_stages):
        sel = plan.stage_of_node == s
        t = int(tps[s])
        share = float((graph.param_bytes[sel] / np.where(split[sel] & (t > 1), t, 1)).sum()) / total
        tensors = float(np.count_nonzero(graph.param_bytes[sel])) * tensors_per_node
        p = len(plan.stage_devices[s]) // t
        opt = adam_seconds * share / (p if plan.sharding == "fsdp" else 1)
        wrap = 0.0
        if overheads is not None and t > 1:
            tp_tensors = float(np.count_nonzero(graph.param_bytes[sel] * split[sel])) * tensors_per_node
            a, b = overheads.tp_pass
            c, d = overheads.tp_adam
            wrap, opt = wrap + m * (a + b * tp_tensors), opt + c + d * tp_tensors
        if overheads is not None and p > 1 and tensors > 0:
            a, b = overheads.ddp_pass if plan.sharding != "fsdp" else overheads.fsdp_pass
            wrap += m * (a + b * tensors)
            if plan.sharding == "fsdp":
                c, d = overheads.fsdp_adam
                opt += c + d * tensors
        worst_wrap, worst_opt = max(worst_wrap, wrap), max(worst_opt, opt)
    step = simulated + worst_wrap + worst_opt
    procs = int(plan.world_size)
    cores = cores or os.cpu_count() or 1
    factor = max(1.0, procs / cores) if overheads is not None else 1.0
    return {"predicted_s": step * factor, "wrapper_s": worst_wrap, "optimizer_s": worst_opt,
            "oversubscription": factor}


__all__ = ["DistOverheads", "fit_dist_overheads", "measure_dist_overheads", "predict_deploy_step",
           "tensors_per_param_node"]
