"""Fixed time added to a cost table's nodes, counted as launch overhead (every micro-batch pays it in full, it does
not scale with the batch; see ``placement_rl.cost.pipeline``): ``with_node_overhead`` per node, ``with_step_overhead``
a measured per-pass overhead that no op owns, spread evenly over the nodes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from placement_rl.cost.types import CostTable
from placement_rl.errors import ProfileError


def with_node_overhead(costs: CostTable, seconds: np.ndarray, **meta: Any) -> CostTable:
    """``costs`` plus fixed ``seconds`` on every node's forward and on its backward (``[N, 1]`` or ``[N, D]``),
    counted as launch overhead (every micro-batch pays it in full, it does not scale with the batch); ``meta``
    is recorded in the table's meta."""
    add = np.broadcast_to(np.asarray(seconds, dtype=np.float64), costs.fwd_time.shape)
    return dataclasses.replace(costs, fwd_time=costs.fwd_time + add, bwd_time=costs.bwd_time + add,
                               launch_overhead=costs.launch_overhead + add, meta={**dict(costs.meta), **meta})


def with_step_overhead(costs: CostTable, overhead: float | np.ndarray) -> CostTable:
    """``costs`` plus a per-pass overhead no op owns, spread evenly over the nodes as fixed time.

    ``overhead``: seconds per forward+backward pass of the whole graph, one number or one per device (e.g.
    a profile's measured whole step minus the sum of its per-op times, at the batch the costs were
    measured at). Each node gets ``overhead / (2 N)`` on its forward and on its backward, counted as
    launch overhead (every micro-batch pays it in full), so a stage pays its share of nodes per micro-batch.
    """
    per = np.broadcast_to(np.asarray(overhead, dtype=np.float64), (costs.num_devices,))
    if not np.all(np.isfinite(per)) or np.any(per < 0):
        raise ProfileError(f"step overhead must be finite and >= 0 seconds, got {np.asarray(overhead).tolist()}")
    return with_node_overhead(costs, per[None, :] / (2.0 * max(costs.num_nodes, 1)), step_overhead=per.tolist())
