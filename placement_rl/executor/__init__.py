"""Executors: run a placement for real. ``local``: op-level placement in one process."""

from placement_rl.executor.local import (LocalRunResult, MeasurementTimeout, PlacedProgram, check_memory,
                                         memory_estimate, run_placement)

__all__ = ["LocalRunResult", "MeasurementTimeout", "PlacedProgram", "check_memory", "memory_estimate",
           "run_placement"]
