"""What data parallelism costs on this host's process groups beyond the ops: measured, fitted, per tensor.

``measure_dist_overheads(backend="gloo")`` runs two processes (one torch thread each) and times, on a stack of
``k`` ``Linear(width, width)`` layers for several ``k`` (2 parameter tensors per layer):

* the forward + backward of one micro-batch with no wrapper, under DDP, under FSDP2 ``fully_shard`` (one unit,
  as ``executor._runner.apply_fsdp`` shards a stage), and as ``k / 2`` Megatron column / row pairs under TP
  (``parallelize_module`` over the 2 ranks) against one rank's shards as plain Linears;
* the Adam step over plain parameters and over the FSDP2 shards (DTensors);
* the collectives FSDP and DDP issue: all-reduce, all-gather and reduce-scatter of a range of buffer sizes;
* a two-stage pipeline (``PipelineStage`` + ``ScheduleGPipe``, one stage per process) of ``Linear`` stacks at
  ``m`` micro-batches and two boundary sizes, against the same stage's ``m`` plain passes: the CPU seconds each
  rank spends on the schedule (send / recv and their copies, the stage's autograd bookkeeping, the per-micro-batch
  python) beyond its ops.

``fit_dist_overheads`` turns the medians into a ``DistOverheads``: per pass (forward + backward of one
micro-batch) the extra seconds of DDP, FSDP and TP as ``a + b * tensors``, and the extra seconds of Adam over
DTensor shards (FSDP's, TP's) as ``c + d * tensors`` beyond plain Adam over the same elements, and a pipeline
stage's schedule cost as ``e + m * (f + g * boundary_bytes)`` per step (``boundary_bytes``: activations a stage
sends and receives per micro-batch). These are CPU-side costs of
the wrappers (hooks, DTensor dispatch per parameter, copy-in / copy-out, waiting on the process group), which
per-op profiles cannot see. Collective times are kept as measured curves (``collective_seconds``).

What a plan's deployed step is predicted from these: ``placement_rl.profiling.deploy_predict``.
Not modelled: DDP bucket rebuilds; schedules other than GPipe are priced with GPipe's per-micro-batch cost.
"""

from __future__ import annotations

import dataclasses
import gc
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
PP_MICRO = (1, 2, 4, 8)  # micro-batches of the pipeline measurement
# boundary tensor: BATCH x WIDTH x widen floats: 2 KiB, 64 KiB, 1 MiB and 4 MiB per micro-batch (the plans a
# user deploys move 0.1-10 MiB per micro-batch; a slope fitted on 2-64 KiB alone was noise, 0 on some hosts)
PP_WIDEN = (1, 32, 512, 2048)
PP_LAYERS = 4  # Linear layers per stage
GEMM_N = 384  # the compute between two TP collectives in their measurement (about 1 ms on one core)
TP_CALLS = 8  # collectives per timed round of that measurement


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
    # pipeline schedule per stage and step: e + m * (f + g * boundary bytes per micro-batch) CPU seconds
    pp_stage: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def pp_microbatch_seconds(self, boundary_bytes: float) -> float:
        """A pipeline stage's schedule cost per micro-batch that moves ``boundary_bytes`` in and out."""
        return self.pp_stage[1] + self.pp_stage[2] * max(float(boundary_bytes), 0.0)

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
                       raw=dict(d.get("raw", {})), pp_stage=tuple(float(x) for x in d.get("pp_stage", (0, 0, 0))))
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


def _interleaved(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median seconds of each callable over ``repeats`` rounds (after 2 warm-up rounds); every round runs every
    callable once, all ranks together (a barrier before each)."""
    import torch.distributed as dist

    got: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats + 2):
        for key, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            if r >= 2:
                got[key].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in got.items()}


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
        res["tp_all_reduce"] = _tp_collective_times(mesh, sizes, repeats)
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

        configs = {}
        for k in layers:
            for kind in ("plain", "ddp", "fsdp", "half", "tp"):
                m = make(k, kind)
                if kind == "ddp":
                    m = DistributedDataParallel(m)  # a Linear stack has no buffers to broadcast
                elif kind == "fsdp":
                    fully_shard(m, mesh=mesh)
                configs[(k, kind)] = (m, torch.optim.Adam(m.parameters(), lr=1e-3))
        # rounds over every configuration, so a slow spell of a shared host lands on all of them alike
        fns = {}
        for (k, kind), (m, opt) in configs.items():
            fns[f"{k}_{kind}_pass"] = lambda m=m: m(inp).sum().backward()
            fns[f"{k}_{kind}_adam"] = opt.step
        times = _interleaved(fns, repeats)
        for k in layers:
            res["rows"].append({"k": k, "tensors": 2 * k, **{f"{kind}_{what}": times[f"{k}_{kind}_{what}"]
                                                           for kind in ("plain", "ddp", "fsdp", "half", "tp")
                                                           for what in ("pass", "adam")}})
        res["pipeline"] = _pipeline_rows(rank, repeats)
        dist.barrier()  # no rank tears the group down while the other still has work on it; then the result
        if rank == 0:
            queue.put(res)
    finally:
        dist.destroy_process_group()


def _tp_collective_times(mesh, sizes: Sequence[int], repeats: int) -> list[float]:
    """Per size: seconds of an all-reduce as a TP step issues it -- DTensor redistributing a ``Partial`` tensor to
    ``Replicate`` right after a stretch of compute (a ``GEMM_N``-square matmul), ``TP_CALLS`` times in a row, minus
    the same compute alone, per call. Between compute the two ranks reach the collective at different moments and a
    rank that waited must be woken; the back-to-back figures (``collectives``) miss both."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    a = torch.randn(GEMM_N, GEMM_N)

    def work() -> None:
        for _ in range(TP_CALLS):
            a @ a

    fns: dict[str, Any] = {"compute": work}
    for n in sizes:
        x = torch.ones(max(n // 4, 2) // 2 * 2)

        def step(x=x) -> None:
            for _ in range(TP_CALLS):
                a @ a
                DTensor.from_local(x, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()]).to_local()

        fns[str(n)] = step
    got = _interleaved(fns, repeats)
    return [max(got[str(n)] - got["compute"], 0.0) / TP_CALLS for n in sizes]


class _PipeHalf(torch.nn.Module):
    """One stage of the pipeline measurement: ``PP_LAYERS`` Linears; stage 0 widens its output to ``widen``
    copies (the boundary tensor), stage 1 reads the first ``WIDTH`` columns."""

    def __init__(self, first: bool, widen: int) -> None:
        super().__init__()
        self.first, self.widen = first, widen
        self.body = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(PP_LAYERS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).repeat(1, self.widen) if self.first else self.body(x[:, :WIDTH])


def _pipeline_rows(rank: int, repeats: int) -> list[dict[str, Any]]:
    """Per (widen, m): this rank's and the peer's CPU seconds of a pipelined GPipe step and of ``m`` plain passes
    of the same stage (process CPU clock: the schedule's threads count, waiting does not)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    configs = {}
    for widen in PP_WIDEN:
        bw = BATCH * WIDTH * widen
        for m in PP_MICRO:
            torch.manual_seed(0)
            mod = _PipeHalf(rank == 0, widen)
            inp = torch.zeros(BATCH, WIDTH if rank == 0 else bw // BATCH, requires_grad=rank == 1)
            out = torch.zeros(BATCH, bw // BATCH if rank == 0 else WIDTH)
            stage = PipelineStage(mod, rank, 2, torch.device("cpu"), input_args=(inp,), output_args=out,
                                  input_grads=None if rank == 0 else (torch.zeros_like(inp),),
                                  output_grads=(torch.zeros_like(out),) if rank == 0 else None)
            sched = ScheduleGPipe(stage, m, loss_fn=lambda o, t: o.sum())
            x, target = torch.randn(BATCH * m, WIDTH), torch.zeros(m)

            def step(sched=sched, x=x, target=target) -> None:
                sched.step(x) if rank == 0 else sched.step(target=target)

            def plain(mod=mod, inp=inp, m=m) -> None:
                for _ in range(m):
                    mod(torch.randn_like(inp).requires_grad_(rank == 1)).sum().backward()

            configs[(widen, m)] = (4.0 * bw, step, plain)
    got: dict[tuple, dict[str, list[float]]] = {key: {"pipe": [], "plain": []} for key in configs}
    for r in range(repeats + 2):  # rounds over every configuration (see ``_interleaved``); process CPU clock
        for key, (_, step, plain) in configs.items():
            for name, fn in (("pipe", step), ("plain", plain)):
                dist.barrier()
                c0 = time.process_time()
                fn()
                if r >= 2:
                    got[key][name].append(time.process_time() - c0)
    rows = []
    for (widen, m), (nbytes, _, _) in configs.items():
        row = {"widen": widen, "m": m, "bytes": nbytes, **{k: float(np.median(v)) for k, v in got[(widen, m)].items()}}
        both = [None, None]
        dist.all_gather_object(both, row)
        rows.append({**row, "pipe": [b["pipe"] for b in both], "plain": [b["plain"] for b in both]})
    configs.clear()  # the stages and schedules go before the process group does
    gc.collect()
    dist.barrier()
    return rows


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


def _tp_collective_worker(rank: int, world: int, port: int, degrees: Sequence[int], sizes: Sequence[int],
                          repeats: int, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out = {}
        for t in degrees:  # every group of t ranks at once, as the plans' TP groups run
            mesh = init_device_mesh("cpu", (world // t, t), mesh_dim_names=("dp", "tp"))
            out[int(t)] = _tp_collective_times(mesh["tp"], sizes, repeats)
        dist.barrier()  # every rank is done before the result goes out (see links.run_pair)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def measure_tp_collectives(backend: str = "gloo", *, world: int = 2, degrees: Sequence[int] = (2,),
                           sizes: Sequence[int] = SIZES, repeats: int = 9, timeout_s: float = 300.0
                           ) -> dict[int, tuple[tuple[float, ...], tuple[float, ...]]]:
    """``{t: (sizes, seconds)}``: the all-reduce as a TP step issues it (``_tp_collective_times``) over groups of
    ``t`` ranks, on ``world`` fresh gloo processes (one thread each; all ``world / t`` groups at once, as a plan of
    ``world`` processes runs its TP groups) -- measured right before the plans it prices run, so that it sees the
    host as they do: their process count on its cores and the load of that moment."""
    from placement_rl.profiling.links import run_pair

    if backend != "gloo":
        raise ProfileError(f"the TP collective measurement runs on CPU processes over gloo, not '{backend}'")
    if any(t < 2 or world % t for t in degrees):
        raise ProfileError(f"TP group sizes {list(degrees)} must be >= 2 and divide the {world} processes")
    got = run_pair(_tp_collective_worker, (world, tuple(degrees), tuple(sizes), repeats), timeout_s=timeout_s,
                   what=f"{backend} TP collective measurement", world=world)
    return {int(t): (tuple(float(x) for x in sizes), tuple(float(v) for v in got[t])) for t in degrees}


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
    if raw.get("tp_all_reduce"):
        coll["tp_all_reduce"] = (tuple(float(s) for s in raw["sizes"]), tuple(float(v) for v in raw["tp_all_reduce"]))
    return DistOverheads(backend=raw["backend"], ddp_pass=ddp, fsdp_pass=fsdp, fsdp_adam=adam, tp_pass=tp,
                         tp_adam=tp_adam, collectives=coll, raw=raw, pp_stage=_fit_pipeline(raw.get("pipeline", [])))


def _fit_pipeline(rows: Sequence[dict[str, Any]]) -> tuple[float, float, float]:
    """Non-negative least squares of a stage's extra CPU seconds per step (pipelined minus plain, both ranks)
    on ``(1, m, m * bytes)``: per step, per micro-batch, per boundary byte per micro-batch."""
    from scipy.optimize import nnls

    if not rows:
        return 0.0, 0.0, 0.0
    a, y = [], []
    for r in rows:
        for pipe, plain in zip(r["pipe"], r["plain"]):
            a.append([1.0, r["m"], r["m"] * r["bytes"]])
            y.append(pipe - plain)
    scale = np.array([1.0, 1.0, 1e-6])  # bytes in MB for the solver's conditioning
    coef, _ = nnls(np.array(a) / scale, np.array(y))
    e, f, g = coef / scale
    return float(e), float(f), float(g)


__all__ = ["DistOverheads", "fit_dist_overheads", "measure_dist_overheads", "measure_tp_collectives"]
