"""Helpers shared by the zoo model builders: argument checks and seeded construction."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from placement_rl.errors import GraphError


def check_positive(model: str, **values: float) -> None:
    """Raise ``GraphError`` naming the first option that is not > 0."""
    for key, val in values.items():
        if not val > 0:
            raise GraphError(f"zoo model '{model}': option {key}={val!r} must be > 0")


def check_prob(model: str, **values: float) -> None:
    for key, val in values.items():
        if not 0.0 <= val < 1.0:
            raise GraphError(f"zoo model '{model}': option {key}={val!r} must be in [0, 1)")


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[torch.Generator]:
    """Build under a private RNG state: parameter init and inputs depend on ``seed`` only.

    The global torch RNG is forked (saved and restored), so callers see no change to it.
    Yields a CPU ``torch.Generator`` seeded with ``seed`` for the example inputs.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        yield gen
