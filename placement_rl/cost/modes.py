"""Simulation modes and objectives: a training step or forward-only inference; step time or time per sample.

``mode``:

* ``train`` (default): forward, backward, gradients, optimizer state (4 x parameters), activations kept for
  the backward.
* ``inference``: forward only -- no backward time, no gradient transfers or DP gradient sync, the parameters
  alone in memory (no gradients, no optimizer state), activations not kept. ``inference_costs(costs)`` is the
  ``CostTable`` transform every simulator and planner consumes: backward times zeroed and ``meta["mode"] =
  "inference"`` (``PipelineSimulator`` and ``Simulator`` read the mode from there unless told otherwise).

``objective``:

* ``step``: the time of one step (one batch through the whole pipeline / graph), what training minimises.
* ``throughput``: time per sample in steady state, when a stream of batches (micro-batches) keeps every
  resource busy: the busiest resource's work per micro-batch (a device group's compute, a link's transfers,
  a group's gradient sync spread over its micro-batches) over the samples in a micro-batch. See
  ``cost.throughput``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError

MODES = ("train", "inference")
OBJECTIVES = ("step", "throughput")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"unknown mode '{mode}' (choose one of {', '.join(MODES)})")
    return mode


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{objective}' (choose one of {', '.join(OBJECTIVES)})")
    return objective


def mode_of(costs: CostTable) -> str:
    """The mode a cost table was prepared for (``train`` unless ``inference_costs`` made it)."""
    return check_mode(str(costs.meta.get("mode", "train")))


def inference_costs(costs: CostTable) -> CostTable:
    """``costs`` for forward-only inference: backward times zero, ``meta["mode"] = "inference"``."""
    if mode_of(costs) == "inference":
        return costs
    zero = np.zeros_like(costs.bwd_time)
    return dataclasses.replace(costs, bwd_time=zero, meta={**dict(costs.meta), "mode": "inference"})


def for_mode(costs: CostTable, mode: str) -> CostTable:
    """``costs`` prepared for ``mode`` (a training table cannot be made from an inference one)."""
    if check_mode(mode) == "inference":
        return inference_costs(costs)
    if mode_of(costs) == "inference":
        where = costs.meta.get("costs_file")
        raise ConfigError(f"these costs{f' ({where})' if where else ''} were prepared for inference (no backward "
                          "times): price with mode=inference, or give training costs (with backward times) for "
                          "mode=train")
    return costs


__all__ = ["MODES", "OBJECTIVES", "check_mode", "check_objective", "for_mode", "inference_costs", "mode_of"]
