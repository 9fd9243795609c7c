"""How many threads a greedy decode uses (``PLACEMENT_RL_DECODE_THREADS``; ``placement_rl.cost.split``'s module
doc says why serial is the library default and when threads are worth it)."""

from __future__ import annotations

import multiprocessing
import os
import sys

import numba

from placement_rl.decode_env import THREADS_ENV, parse_threads  # noqa: F401 (re-exported)

MIN_WORK = 2_000_000  # node-device evaluations (about N x W x D^2) below which one thread decodes


def _numba_threads() -> int:
    """numba's thread count. Asking starts numba's threading layer, and that (GNU OpenMP here, shared with torch)
    resets the intra-op thread count torch reads in this thread: torch's count is put back, so a process that set
    ``torch.set_num_threads(1)`` (training, the thread clock of profiling) keeps it."""
    torch = sys.modules.get("torch")
    keep = torch.get_num_threads() if torch is not None else None
    n = int(numba.get_num_threads())
    if keep is not None and torch.get_num_threads() != keep:
        torch.set_num_threads(keep)
    return n


def requested_threads() -> int:
    """Threads ``PLACEMENT_RL_DECODE_THREADS`` asks for (1 when unset; ``auto``: numba's thread count)."""
    n = parse_threads(os.environ.get(THREADS_ENV, "1"))
    if n == 1:
        return 1
    most = _numba_threads()
    return min(n or most, most)


def _threads(work: int, threshold: int, most: int) -> int:
    """Threads for ``work`` node-device evaluations: 1 unless asked (the default: numba's threading layer is never
    started), in a ``multiprocessing`` child (see the module doc), or under ``threshold``; at most ``most``."""
    if os.environ.get(THREADS_ENV, "1").strip() == "1" or multiprocessing.parent_process() is not None:
        return 1
    return 1 if work < threshold else max(1, min(requested_threads(), most))


def threads_asked() -> int:
    """Threads a decode large enough to be worth it would use in this process (1: the serial kernel)."""
    return _threads(MIN_WORK, MIN_WORK, MIN_WORK)  # at most what ``requested_threads`` gives
