"""Timers for one callable on one device: ``time.perf_counter`` on the CPU, CUDA events on a GPU.

Each sample times ``inner`` back-to-back calls (``inner`` grows until a sample lasts ``min_sample``
seconds, so microsecond ops are not lost in timer resolution) and reports the per-call mean;
the caller takes the median and spread of ``repeats`` samples.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

MIN_SAMPLE_S = 2e-4  # a sample is at least 200 us of back-to-back calls
MAX_INNER = 256


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


def time_cpu(fn: Callable[[], Any], *, warmup: int, repeats: int, min_sample: float = MIN_SAMPLE_S) -> list[float]:
    """Per-call seconds of ``fn`` on the CPU, ``repeats`` samples (wall clock, ``time.perf_counter``)."""
    for _ in range(warmup):
        fn()
    inner = _inner_count(fn, torch.device("cpu"), min_sample)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
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
            min_sample: float = MIN_SAMPLE_S) -> list[float]:
    """Per-call seconds of ``fn`` on ``device`` (CUDA events on a GPU, ``perf_counter`` otherwise)."""
    if device.type == "cuda":
        return time_cuda(fn, device, warmup=warmup, repeats=repeats, min_sample=min_sample)
    return time_cpu(fn, warmup=warmup, repeats=repeats, min_sample=min_sample)


def wall_samples(fn: Callable[[], Any], device: torch.device, *, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` single calls, synchronising the device around each (whole steps)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - t0)
    return samples
