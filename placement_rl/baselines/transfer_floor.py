"""The least time a node's output can take to reach another device: what every bound charges a cut edge.

The simulator (``cost._op_kernel``) sends a tensor to a device when its first consumer there is scheduled; the first
chunk carries one out-edge's whole bytes and a later one follows it on the same link, and a gradient goes back
once per consumer device, carrying one out-edge's bytes. So anything node ``u`` sends over the link ``a -> b``
arrives at least the segment time of the cheapest of its out-edges after ``u`` ends. An edge of zero bytes sends
nothing either way (forward or backward; its ends still wait for each other): it costs 0, and so does the least
transfer of a node with one.
"""

from __future__ import annotations

import numpy as np

from placement_rl.cost.comm_fit import link_segments
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology


def cut_costs(graph: CompGraph, costs: CostTable, topology: DeviceTopology) -> np.ndarray:
    """``[N]``: the least seconds after node ``u`` ends that anything it sends reaches another device (inf for a
    node with no out-edge; 0 for one with a zero-byte out-edge, which sends nothing): the first chunk the simulator
    sends from ``u`` to a device carries one out-edge's whole bytes (``cost._op_kernel.fwd_place``), and a later one
    follows it on the same link, so every arrival waits at least the fastest link's time for the smallest such
    chunk."""
    if topology.num_devices < 2:
        return np.full(graph.num_nodes, np.inf)
    return pair_costs(graph, costs, topology).min(axis=(1, 2))


def pair_costs(graph: CompGraph, costs: CostTable, topology: DeviceTopology) -> np.ndarray:
    """``[N, D, D]``: ``cut_costs`` per ordered device pair ``(a, b)``: the least time anything node ``u`` on
    ``a`` sends reaches ``b`` (its smallest out-edge's bytes over that link, 0 for a zero-byte edge; inf on the
    diagonal and without out-edges). Its minimum over pairs is ``cut_costs``."""
    d, n = topology.num_devices, graph.num_nodes
    out = np.full((n, d, d), np.inf)
    e, nbytes = np.asarray(graph.edges).reshape(-1, 2), np.asarray(graph.edge_bytes, dtype=np.float64)
    if not len(e):
        return out
    tables = link_segments(topology, costs)
    for a in range(d):
        for b in range(d):
            if a == b:
                continue
            t = tables[a, b]
            r = np.searchsorted(t[:, 0], nbytes, side="right")
            col = np.full(n, np.inf)
            sent = np.where(nbytes > 0, np.maximum(t[r, 1] + t[r, 2] * nbytes, 0.0), 0.0)  # zero bytes: nothing sent
            np.minimum.at(col, e[:, 0], sent)
            out[:, a, b] = col
    return out


__all__ = ["cut_costs", "pair_costs"]
