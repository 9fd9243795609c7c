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


class ProfileError(PlacementRLError):
    """A ProfileDB file is missing, corrupted or does not match."""


class ConfigError(PlacementRLError):
    """A run configuration is invalid."""


class CheckpointError(PlacementRLError):
    """A checkpoint cannot be loaded (format version or config mismatch)."""


class ExecutionError(PlacementRLError):
    """Running a placement or plan for real failed (out of memory, a rank died or hung)."""
