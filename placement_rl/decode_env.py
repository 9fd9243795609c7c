"""``PLACEMENT_RL_DECODE_THREADS``, the environment variable that asks for a greedy decode on threads
(``placement_rl.cost.threads``), and its parser: outside the cost package, so that the command line can check it
without loading the simulator's kernels."""

from __future__ import annotations

from placement_rl.errors import ConfigError

THREADS_ENV = "PLACEMENT_RL_DECODE_THREADS"


def parse_threads(raw: str) -> int:
    """A ``PLACEMENT_RL_DECODE_THREADS`` value: ``auto`` -> 0 (numba's thread count), ``N`` >= 1 -> N;
    ``ConfigError`` otherwise."""
    raw = raw.strip().lower()
    if raw == "auto":
        return 0
    n = int(raw) if raw.isdigit() else 0
    if n < 1:
        raise ConfigError(f"{THREADS_ENV}={raw!r}: use a thread count >= 1 or 'auto'")
    return n
