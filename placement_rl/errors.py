"""Domain errors. Each message says what to fix; the CLI prints it as one line, exit code 2."""

from __future__ import annotations


class PlacementRLError(Exception):
    """Base class of every error caused by bad user input (graphs, topologies, plans, configs)."""


class GraphError(PlacementRLError):
    """A computation graph (or its JSON file) is invalid."""


class TopologyError(PlacementRLError):
    """A device topology (or its YAML file) is invalid."""


class PlanError(PlacementRLError):
    """A Placement or StagePlan does not fit its graph or topology."""


class CaptureError(GraphError):
    """A module could not be traced or measured; ``reason`` says why without the hints meant for ``capture``'s own
    options (``method``, ``exec_mode``), for callers that do not expose them (``graph=hf``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ProfileError(PlacementRLError):
    """A ProfileDB file is missing, corrupted or does not match."""


class ConfigError(PlacementRLError):
    """A run configuration is invalid."""


class CheckpointError(PlacementRLError):
    """A checkpoint cannot be loaded (format version or config mismatch)."""


class ExecutionError(PlacementRLError):
    """Running a placement or plan for real failed (out of memory, a rank died or hung)."""


def fmt_bytes(n: float) -> str:
    """Bytes for a message, in the largest binary unit that keeps the value >= 1 (``1.50 GiB``, ``12.0 KiB``)."""
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
