"""Link micro-benchmarks fitted to ``time = latency + bytes / bandwidth`` (non-negative least squares).

Backends (the ``backend`` field of a ProfileDB link):

* ``copy``: ``x.to(dst)`` from ``src``, exactly the transfer the local executor inserts on a
  cross-device edge (for two logical devices on one torch device this is the no-op ``.to`` call);
* ``pinned``: host <-> GPU ``copy_`` from/to page-locked host memory (``non_blocking``), CUDA-event timed;
* ``p2p``: GPU -> GPU ``copy_`` with peer access (when the pair has it);
* ``gloo`` / ``nccl``: send/recv between two processes (ping-pong, half the round trip), gloo on CPU
  tensors, NCCL on two GPUs.

None of the GPU paths can run without CUDA; they are guarded by ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from placement_rl.errors import ProfileError
from placement_rl.profiling.timing import synchronize

DEFAULT_SIZES = tuple(2 ** k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB


@dataclass(frozen=True)
class LinkFit:
    src: str
    dst: str
    backend: str
    latency: float  # seconds
    bandwidth: float  # bytes/s (inf when no per-byte cost is measurable)
    sizes: tuple[float, ...]
    times: tuple[float, ...]  # median seconds per size

    def predict(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


def fit_link(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """``(latency, bandwidth)`` minimising squared relative error of ``latency + bytes / bandwidth``.

    Relative (1/t weighted) so microsecond small messages count as much as the large ones; both
    coefficients are constrained non-negative (``scipy.optimize.nnls``); no slope -> bandwidth inf.
    """
    from scipy.optimize import nnls

    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if s.shape != t.shape or s.size < 2:
        raise ProfileError("a link fit needs at least two (size, time) points")
    w = 1.0 / np.maximum(t, 1e-12)
    a = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    (lat, inv_bw), _ = nnls(a, t * w)
    return float(lat), (float(1.0 / inv_bw) if inv_bw > 1e-18 else float("inf"))  # < 1 s per EB: none


def _median_per_size(fn_for_size, sizes: Sequence[int], device: torch.device, repeats: int) -> list[float]:
    out = []
    for n in sizes:
        fn = fn_for_size(n)
        fn()
        synchronize(device)
        samples = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        out.append(float(np.median(samples)))
    return out


def bench_copy(src: str, dst: str, *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10) -> LinkFit:
    """Time the executor's transfer (``transfer(x, dst)``, i.e. ``x.to(dst)``) of float32 tensors on ``src``."""
    from placement_rl.profiling.program import transfer

    s_dev, d_dev = torch.device(src), torch.device(dst)
    timing_dev = d_dev if d_dev.type == "cuda" else s_dev

    def make(n: int):
        x = torch.ones(max(n // 4, 1), device=s_dev)
        return lambda: transfer(x, d_dev)

    times = _median_per_size(make, sizes, timing_dev, repeats)
    lat, bw = fit_link(sizes, times)
    return LinkFit(src, dst, "copy", lat, bw, tuple(map(float, sizes)), tuple(times))


def bench_pinned(gpu: str, *, to_device: bool, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10) -> LinkFit:
    """Host <-> GPU copies between page-locked host memory and a preallocated GPU buffer (CUDA events)."""
    if not torch.cuda.is_available():
        raise ProfileError("pinned host<->device benchmark needs a CUDA GPU")
    g = torch.device(gpu)

    def make(n: int):
        host = torch.ones(max(n // 4, 1)).pin_memory()
        dev = torch.empty(host.shape, device=g)
        if to_device:
            return lambda: dev.copy_(host, non_blocking=True)
        return lambda: host.copy_(dev, non_blocking=True)

    times = _median_per_size(make, sizes, g, repeats)
    lat, bw = fit_link(sizes, times)
    src, dst = ("cpu", gpu) if to_device else (gpu, "cpu")
    return LinkFit(src, dst, "pinned", lat, bw, tuple(map(float, sizes)), tuple(times))


def bench_p2p(src: str, dst: str, *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10) -> LinkFit:
    """GPU -> GPU ``copy_`` into a preallocated buffer (peer access where the pair supports it)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        raise ProfileError("GPU peer-to-peer benchmark needs at least two CUDA GPUs")
    s_dev, d_dev = torch.device(src), torch.device(dst)

    def make(n: int):
        x = torch.ones(max(n // 4, 1), device=s_dev)
        y = torch.empty(x.shape, device=d_dev)
        return lambda: y.copy_(x, non_blocking=True)

    times = _median_per_size(make, sizes, s_dev, repeats)
    lat, bw = fit_link(sizes, times)
    return LinkFit(src, dst, "p2p", lat, bw, tuple(map(float, sizes)), tuple(times))


# ------------------------------------------------------------ two processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pingpong_worker(rank: int, backend: str, port: int, sizes: Sequence[int], repeats: int, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        peer = 1 - rank
        out = []
        for n in sizes:
            buf = torch.ones(max(n // 4, 1), device=device)
            samples = []
            for r in range(repeats + 2):  # two warm-up round trips
                synchronize(device)
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
                synchronize(device)
                if r >= 2:
                    samples.append((time.perf_counter() - t0) / 2)
            out.append(float(np.median(samples)))
        dist.barrier()  # every rank is done: what rank 0 puts next is a finished measurement (see run_pair)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def run_pair(worker: Callable[..., None], args: tuple, *, timeout_s: float, what: str, world: int = 2) -> Any:
    """Run ``worker(rank, args[0], port, *args[1:], queue)`` in ``world`` spawned processes (two by default;
    ``args[0]``: the backend, or what the worker takes there; one torch thread each) and return what rank 0 put on
    the queue. A failure or a time-out is a ``ProfileError`` naming ``what``; the workers are stopped, never left
    behind. Workers put their result after a last barrier, so a delivered result is a finished measurement on
    every rank: a worker that then dies tearing its process group down (gloo's threads now and then abort at exit,
    "terminate called without an active exception") does not void it."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    env_backup = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        procs = [ctx.Process(target=worker, args=(r, args[0], port, *args[1:], queue)) for r in range(int(world))]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.terminate()
            p.join()
        if alive or queue.empty():
            codes = [p.exitcode for p in procs]
            raise ProfileError(f"{what} failed (worker exit codes {codes}{', timed out' if alive else ''})")
        return queue.get()
    finally:
        if env_backup is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_backup


def bench_sendrecv(backend: str, *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10,
                   timeout_s: float = 120.0) -> LinkFit:
    """send/recv between two processes on this host over ``gloo`` (CPU) or ``nccl`` (GPU 0 <-> GPU 1)."""
    if backend not in ("gloo", "nccl"):
        raise ProfileError(f"unknown process-group backend '{backend}' (use gloo or nccl)")
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < 2):
        raise ProfileError("the NCCL send/recv benchmark needs two CUDA GPUs on this host")
    times = run_pair(_pingpong_worker, (backend, tuple(sizes), repeats), timeout_s=timeout_s,
                     what=f"{backend} send/recv benchmark")
    lat, bw = fit_link(sizes, times)
    src, dst = ("cuda:0", "cuda:1") if backend == "nccl" else ("cpu", "cpu")
    return LinkFit(src, dst, backend, lat, bw, tuple(map(float, sizes)), tuple(times))


def local_link_benchmarks(torch_devices: Sequence[str], *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10,
                          processes: bool = True) -> list[LinkFit]:
    """Every benchmark that applies to these local torch devices (``copy`` for each pair, plus pinned,
    p2p, gloo and NCCL where the hardware is present)."""
    devs = list(dict.fromkeys(str(torch.device(d)) for d in torch_devices))
    fits: list[LinkFit] = []
    pairs = [(a, b) for a in devs for b in devs if a == b or torch.device(a).type != torch.device(b).type
             or a < b or torch.cuda.is_available()]
    for a, b in pairs:
        fits.append(bench_copy(a, b, sizes=sizes, repeats=repeats))
    gpus = [d for d in devs if d.startswith("cuda")]
    if torch.cuda.is_available():
        for g in gpus:
            fits.append(bench_pinned(g, to_device=True, sizes=sizes, repeats=repeats))
            fits.append(bench_pinned(g, to_device=False, sizes=sizes, repeats=repeats))
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                fits.append(bench_p2p(a, b, sizes=sizes, repeats=repeats))
    if processes:
        fits.append(bench_sendrecv("gloo", sizes=sizes, repeats=repeats))
        if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
            fits.append(bench_sendrecv("nccl", sizes=sizes, repeats=repeats))
    return fits
