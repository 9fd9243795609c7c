"""The pipelined-throughput objective: time per batch (and per sample) in steady state.

When a stream of batches keeps every resource busy, a plan's rate is set by its busiest resource. For a stage
plan with ``m`` micro-batches (per micro-batch, from ``simulate_pipeline``'s per-stage outputs):

* a device group's compute: the forward + backward span of every stage it runs (FSDP: its exposed all-gathers
  and reduce-scatters are inside those spans);
* a directed link between consecutive groups: one boundary transfer (``meta["link_time"]``);
* a DDP group's gradient sync: its all-reduces per step over the ``m`` micro-batches (its own channel).

``steady_time = m x max(those)``: the time per batch in steady state (``meta["steady_time"]``); divided by the
batch size, the time per sample (``meta["time_per_sample"]``, when the batch size is known). With inference
costs (``cost.modes``) there is no backward and no gradient sync. For an op placement
(``op_steady_time``): the largest of each device's compute (forward + backward) and each directed link's
transfers per step (each tensor once per destination device, its largest edge there; gradients back the same
bytes in training), priced ``latency + bytes / bandwidth``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from placement_rl.cost.modes import mode_of
from placement_rl.cost.resolve import needs_grad
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement, StagePlan


def pipeline_steady_time(plan: StagePlan, meta: Mapping[str, Any]) -> float:
    """Steady-state time per batch of ``plan`` from ``simulate_pipeline``'s ``meta`` (see the module doc)."""
    m = int(plan.num_microbatches)
    fwd, bwd = meta["stage_fwd_time"], meta["stage_bwd_time"]
    busy: dict[tuple[int, ...], float] = {}
    for s, grp in enumerate(plan.stage_devices):
        busy[grp] = busy.get(grp, 0.0) + fwd[s] + bwd[s]
    period = max(busy.values())
    links = [meta["link_time"][s] for s in range(plan.num_stages - 1)
             if plan.stage_devices[s] != plan.stage_devices[s + 1]]
    period = max([period, *links])
    if plan.sharding == "dp" and meta.get("mode", "train") == "train":
        sync: dict[tuple[int, ...], float] = {}
        for s, grp in enumerate(plan.stage_devices):
            sync[grp] = sync.get(grp, 0.0) + meta["allreduce_time"][s] / m
        period = max(period, *sync.values())
    return m * period


def op_steady_time(graph: CompGraph, costs: CostTable, placement: Placement | np.ndarray) -> float:
    """Steady-state time per batch of an op placement (see the module doc)."""
    dev = np.asarray(placement.device_of_node if isinstance(placement, Placement) else placement, dtype=np.int64)
    d = costs.num_devices
    nodes = np.arange(graph.num_nodes)
    busy = np.bincount(dev, weights=costs.fwd_time[nodes, dev] + costs.bwd_time[nodes, dev], minlength=d)
    train = mode_of(costs) == "train"
    grad = needs_grad(graph) if train else np.zeros(graph.num_nodes, dtype=bool)
    sent: dict[tuple[int, int], float] = {}  # (producer, destination device) -> bytes
    for (u, v), b in zip(graph.edges.tolist(), graph.edge_bytes.tolist()):
        if dev[u] != dev[v]:
            key = (u, int(dev[v]))
            sent[key] = max(sent.get(key, 0.0), b)
    link = np.zeros((d, d))
    for (u, dst), b in sent.items():
        src = int(dev[u])
        t = costs.link_latency[src, dst] + b / costs.link_bandwidth[src, dst]
        link[src, dst] += t
        if grad[u]:
            link[dst, src] += t
    return float(max(busy.max(initial=0.0), link.max(initial=0.0)))


__all__ = ["op_steady_time", "pipeline_steady_time"]
