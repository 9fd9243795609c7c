"""``MeasuredReward``: a reward source that runs each placement for real with the local executor.

Implements the ``envs.reward.RewardSource`` protocol: ``evaluate(device_of_node) -> (step_time, feasible)``.

* The step time is the median of ``steps`` real training steps (after ``warmup``) of the placed program
  (``placement_rl.executor.local.run_placement``) on the topology's devices.
* Results are cached by the placement's bytes: a placement is measured once per source.
* ``timeout_s`` bounds one measurement (checked between training steps, so a single step is never cut
  short). A placement that runs past it, does not fit in memory or fails on the device is reported
  infeasible with ``step_time = timeout_s`` (a finite penalty time), logged as a warning, and the reason
  is kept in ``last_error`` / ``errors``.

Use it as ``PlacementEnv(graph=graph, topology=topology, reward_source=MeasuredReward(module, inputs,
graph, topology, ...))``; it fits one (graph, topology) only. The graph must be captured from ``module``
on ``inputs`` (node names are matched against the module's exported program).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import torch

from placement_rl.errors import ConfigError, ExecutionError
from placement_rl.executor.local import MeasurementTimeout, run_placement
from placement_rl.graph.ir import CompGraph
from placement_rl.profiling.program import export_program
from placement_rl.topology import DeviceTopology

__all__ = ["MeasuredReward"]

log = logging.getLogger(__name__)


class MeasuredReward:
    """Step time of a placement measured by running it (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, inputs: Sequence[Any], graph: CompGraph, topology: DeviceTopology, *,
                 steps: int = 3, warmup: int = 1, timeout_s: float = 60.0, optimizer: str = "adam") -> None:
        if steps < 1 or warmup < 0:
            raise ConfigError(f"measured reward needs steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
        if not timeout_s > 0:
            raise ConfigError(f"measured reward timeout_s must be > 0, got {timeout_s!r}")
        self.module, self.inputs = module, tuple(inputs)
        self.graph, self.topology = graph, topology
        self.steps, self.warmup, self.timeout_s, self.optimizer = steps, warmup, float(timeout_s), optimizer
        self.program = export_program(module, self.inputs)
        self.program.check_graph(graph)
        self.cache: dict[bytes, tuple[float, bool]] = {}
        self.errors: dict[bytes, str] = {}
        self.last_error: str | None = None
        self.measurements = 0

    def evaluate(self, device_of_node: np.ndarray) -> tuple[float, bool]:
        dev = np.asarray(device_of_node, dtype=np.int64).reshape(-1)
        if dev.shape[0] != self.graph.num_nodes:
            raise ConfigError(f"placement has {dev.shape[0]} entries but graph '{self.graph.name}' has "
                              f"{self.graph.num_nodes} nodes: MeasuredReward serves one graph only")
        key = dev.tobytes()
        if key in self.cache:
            self.last_error = self.errors.get(key)
            return self.cache[key]
        self.measurements += 1
        try:
            res = run_placement(self.module, self.inputs, self.graph, dev, self.topology, steps=self.steps,
                                warmup=self.warmup, optimizer=self.optimizer, time_limit_s=self.timeout_s,
                                program=self.program)
            out, self.last_error = (float(res.median_step_time), True), None
        except MeasurementTimeout as exc:
            out, self.last_error = (self.timeout_s, False), f"timeout: {exc}"
        except ExecutionError as exc:
            out, self.last_error = (self.timeout_s, False), f"failed: {exc}"
        if self.last_error is not None:
            self.errors[key] = self.last_error
            log.warning("measured reward: placement reported infeasible (step_time=%.3g s): %s",
                        self.timeout_s, self.last_error)
        self.cache[key] = out
        return out
