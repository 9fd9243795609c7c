"""Reward sources (where the step time of a placement comes from) and the pure reward formulas.

The ``RewardSource`` protocol: any object with ``evaluate(device_of_node: np.ndarray) -> (step_time: float,
feasible: bool)``, ``device_of_node`` an int64 array with one device index per real node of the task.
``SimulatedReward`` (default) wraps the prepared ``placement_rl.cost.Simulator``; a measured source (runs
the placement for real) implements the same protocol.

An environment's ``reward_source`` option accepts either such an object (used for every task, so only
with a single-graph, single-topology source) or a factory ``(graph, costs, topology) -> RewardSource``,
called once per task (default: ``SimulatedReward``).

Rewards are normalised by the best single-device step time ``T1`` so they are comparable across graphs:

* gain of a step: ``(T_before - T_after) / T1`` (``incremental``; sums to ``(T_initial - T_final) / T1``)
* final reward: ``(T1 - T_final) / T1``, minus ``infeasible_penalty`` when the final placement does not
  fit in memory.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from placement_rl.cost import Simulator
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

__all__ = ["RewardFactory", "RewardSource", "SimulatedReward", "best_single_device", "final_reward",
           "make_reward_source", "step_gain"]


@runtime_checkable
class RewardSource(Protocol):
    def evaluate(self, device_of_node: np.ndarray) -> tuple[float, bool]:
        """``(step_time seconds, feasible)`` of a placement (one device index per node)."""
        ...


RewardFactory = Callable[[CompGraph, CostTable, DeviceTopology], RewardSource]


class SimulatedReward:
    """Step time and memory feasibility from the cost model's prepared ``Simulator``."""

    def __init__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *,
                 order: str = "program") -> None:
        self.sim = Simulator(graph, costs, topology, order=order)
        self._capacity = topology.array("memory_bytes")
        # Fast path: ``step_time`` leaves the per-device memory of the placement in the simulator's work
        # array ``_mem`` (``run`` costs ~20 us more per call, building a full SimResult).
        self._mem = getattr(self.sim, "_mem", None)

    def evaluate(self, device_of_node: np.ndarray) -> tuple[float, bool]:
        if self._mem is None:
            res = self.sim.run(device_of_node)
            return res.step_time, res.feasible
        step_time = self.sim.step_time(device_of_node)
        return step_time, bool((self._mem <= self._capacity).all())

    @property
    def calls(self) -> int:
        return int(self.sim.calls)


def make_reward_source(spec: Any, graph: CompGraph, costs: CostTable, topology: DeviceTopology) -> RewardSource:
    """The reward source of one task from an env's ``reward_source`` option (None, object or factory)."""
    if spec is None:
        return SimulatedReward(graph, costs, topology)
    if isinstance(spec, RewardSource):
        return spec
    if callable(spec):
        src = spec(graph, costs, topology)
        if not isinstance(src, RewardSource):
            raise ConfigError(f"reward_source factory returned {type(src).__name__}, which has no "
                              "evaluate(device_of_node) -> (step_time, feasible)")
        return src
    raise ConfigError(f"reward_source must provide evaluate(device_of_node) or be a factory "
                      f"(graph, costs, topology) -> source, got {type(spec).__name__}")


def best_single_device(source: RewardSource, num_nodes: int, num_devices: int) -> tuple[float, int, bool]:
    """``(T1, device, feasible)``: the fastest placement of every node on one device, preferring devices
    that fit the whole model (the fastest overall when none does). Ties go to the lower index."""
    best: tuple[int, float, int] | None = None
    for d in range(num_devices):
        t, ok = source.evaluate(np.full(num_nodes, d, dtype=np.int64))
        if not np.isfinite(t) or t <= 0:
            raise ConfigError(f"reward source gave step time {t!r} for all nodes on device {d}: "
                              "it must be a positive finite number of seconds")
        cand = (0 if ok else 1, float(t), d)
        if best is None or cand < best:
            best = cand
    assert best is not None
    return best[1], best[2], best[0] == 0


def step_gain(best_single: float, before: float, after: float) -> float:
    """Incremental reward of one step: the step time saved, relative to the best single device."""
    return (before - after) / best_single


def final_reward(best_single: float, step_time: float, feasible: bool, infeasible_penalty: float) -> float:
    """Final (or one-shot) reward: speed-up over the best single device, penalised when infeasible."""
    return (best_single - step_time) / best_single - (0.0 if feasible else infeasible_penalty)
