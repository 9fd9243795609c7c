"""Timers for one callable on one device: ``time.perf_counter`` on the CPU, CUDA events on a GPU.

Each sample times ``inner`` back-to-back calls (``inner`` grows until a sample lasts ``min_sample``
seconds, so microsecond ops are not lost in timer resolution) and reports the per-call mean;
the caller takes the median and spread of ``repeats`` samples.

Clocks (``clock=``): ``"wall"`` (``time.perf_counter``; CUDA events on a GPU) or ``"thread"``
(``time.thread_time``: CPU seconds of the calling thread). ``"thread"`` is only meaningful on the CPU
with one intra-op thread (all work then runs on the calling thread, the autograd backward included); it
is immune to other processes taking the cores (a shared machine under load), which wall time is not.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from placement_rl.errors import ProfileError

MIN_SAMPLE_S = 1e-3  # a sample is at least 1 ms of back-to-back calls (averages out short disturbances)
MAX_INNER = 256
CLOCKS = ("wall", "thread")


def clock_fn(clock: str, device: torch.device | None = None) -> Callable[[], float]:
    """The timer function of ``clock``; ``"thread"`` is refused on a GPU or with several intra-op threads."""
    if clock == "wall":
        return time.perf_counter
    if clock != "thread":
        raise ProfileError(f"unknown clock {clock!r} (choose one of {CLOCKS})")
    if device is not None and device.type == "cuda":
        raise ProfileError("clock='thread' measures CPU time only: use clock='wall' for CUDA devices")
    if torch.get_num_threads() != 1:
        raise ProfileError(f"clock='thread' needs torch.set_num_threads(1) (now {torch.get_num_threads()}): "
                         "with several intra-op threads CPU time of one thread misses work")
    return time.thread_time


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inner_count(fn: Callable[[], Any], device: torch.device, min_sample: float) -> int:
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    one = time.perf_counter() - t0
    return int(min(MAX_INNER, max(1, round(min_sample / max(one, 1e-9)))))


def time_cpu(fn: Callable[[], Any], *, warmup: int, repeats: int, min_sample: float = MIN_SAMPLE_S,
             clock: str = "wall", keep: bool = True) -> list[float]:
    """Per-call seconds of ``fn`` on the CPU, ``repeats`` samples (``clock``: wall or thread CPU time).

    ``keep``: hold every result until the sample's clock has stopped, so each call allocates fresh memory
    as ops do in a training step (where activations stay alive until backward) instead of reusing the
    block the previous call just freed; freeing happens outside the timed region.
    """
    now = clock_fn(clock)
    for _ in range(warmup):
        fn()
    inner = _inner_count(fn, torch.device("cpu"), min_sample)
    samples = []
    held: list[Any] = []
    hold = held.append if keep else (lambda _x: None)
    for _ in range(repeats):
        t0 = now()
        for _ in range(inner):
            hold(fn())
        samples.append((now() - t0) / inner)
        held.clear()
    return samples


def time_cuda(fn: Callable[[], Any], device: torch.device, *, warmup: int, repeats: int,
              min_sample: float = MIN_SAMPLE_S) -> list[float]:
    """Per-call seconds of ``fn`` on a CUDA device from CUDA events on its current stream."""
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        inner = _inner_count(fn, device, min_sample)
        samples = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / inner)
    return samples


def time_fn(fn: Callable[[], Any], device: torch.device, *, warmup: int, repeats: int,
            min_sample: float = MIN_SAMPLE_S, clock: str = "wall") -> list[float]:
    """Per-call seconds of ``fn`` on ``device`` (CUDA events on a GPU, ``clock`` on the CPU)."""
    if device.type == "cuda":
        clock_fn(clock, device)
        return time_cuda(fn, device, warmup=warmup, repeats=repeats, min_sample=min_sample)
    return time_cpu(fn, warmup=warmup, repeats=repeats, min_sample=min_sample, clock=clock)


def wall_samples(fn: Callable[[], Any], device: torch.device, *, warmup: int, repeats: int,
                 clock: str = "wall") -> list[float]:
    """Seconds of each of ``repeats`` single calls, synchronising the device around each (whole steps)."""
    now = clock_fn(clock, device)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        synchronize(device)
        t0 = now()
        fn()
        synchronize(device)
        samples.append(now() - t0)
    return samples
