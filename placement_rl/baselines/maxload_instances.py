"""Max-load instances (``placement_rl.graph.maxload_file``'s format, as JSON-ready dicts): the project's graphs
(``instance_from_graph``), so that the max-load solvers (``placement-rl maxload``, and the original authors' DP and
IP) can split them, and small random ones (``random_instance``) for checks against enumeration.

``instance_from_graph``: 
Accelerators are the topology's GPUs, which the model takes as identical (the first GPU's times; GPUs of another
model are refused), CPU cores its CPU devices. Each node becomes a forward node (its forward time on each kind of
device; its pinned bytes, ``cost.memory.pinned_memory``, as its size) and, under training costs, a backward node
of the same colour class (its backward time, no size). A forward edge ``u -> v`` costs a tensor over the GPU-CPU
link (a GPU-GPU link where there is no CPU), the backward edge ``v' -> u'`` its gradient; a node's outgoing edges
must cost the same, so each costs the node's largest (``u``: the largest tensor it sends, ``v'``: the largest
gradient).
"""

from __future__ import annotations

import random

import numpy as np

from placement_rl.cost.memory import pinned_memory
from placement_rl.cost.modes import mode_of
from placement_rl.cost.types import CostTable
from placement_rl.errors import TopologyError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology


def instance_from_graph(graph: CompGraph, costs: CostTable, topology: DeviceTopology) -> dict:
    """The instance as a JSON-ready dict (see the module doc)."""
    kinds = [d.kind for d in topology.devices]
    gpus = [k for k, kind in enumerate(kinds) if kind == "gpu"]
    cpus = [k for k, kind in enumerate(kinds) if kind == "cpu"]
    if not gpus:
        raise TopologyError(f"topology '{topology.name}' has no GPU: the max-load model needs accelerators")
    g0 = gpus[0]
    for k in gpus[1:]:
        if not np.allclose(costs.fwd_time[:, k], costs.fwd_time[:, g0], rtol=1e-9):
            raise TopologyError(f"topology '{topology.name}': GPUs {topology.devices[g0].name} and "
                                f"{topology.devices[k].name} differ; the max-load model takes identical accelerators")
    c0 = cpus[0] if cpus else None
    other = c0 if c0 is not None else (gpus[1] if len(gpus) > 1 else None)
    bw = float(costs.link_bandwidth[g0, other]) if other is not None else np.inf
    lat = float(costs.link_latency[g0, other]) if other is not None else 0.0
    n = graph.num_nodes
    pairs = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    edge_move = lat + np.asarray(graph.edge_bytes, dtype=np.float64) / bw
    move = lat + np.asarray(graph.out_bytes, dtype=np.float64) / bw  # a node with no out-edge: its output
    sent = np.full(n, -np.inf)
    np.maximum.at(sent, pairs[:, 0], edge_move)
    move = np.where(np.isfinite(sent), sent, move)
    grad_cost = np.zeros(n)
    np.maximum.at(grad_cost, pairs[:, 1], edge_move)
    size = pinned_memory(graph, costs)
    training = mode_of(costs) != "inference"
    nodes, edges = [], []
    for k in range(n):
        nodes.append({"id": k, "name": graph.names[k], "supportedOnFpga": 1, "isBackwardNode": 0,
                      "fpgaLatency": float(costs.fwd_time[k, g0]),
                      "cpuLatency": float(costs.fwd_time[k, c0]) if c0 is not None else float(costs.fwd_time[k, g0]),
                      "size": float(size[k]), "colorClass": k})
    for u, v in pairs.tolist():
        edges.append({"sourceId": u, "destId": v, "cost": float(move[u])})
    if training:
        for k in range(n):
            nodes.append({"id": n + k, "name": graph.names[k] + ".backward", "supportedOnFpga": 1,
                          "isBackwardNode": 1, "fpgaLatency": float(costs.bwd_time[k, g0]),
                          "cpuLatency": float(costs.bwd_time[k, c0]) if c0 is not None else
                          float(costs.bwd_time[k, g0]), "size": 0.0, "colorClass": k})
            edges.append({"sourceId": k, "destId": n + k, "cost": float(move[k])})
        for u, v in pairs.tolist():
            edges.append({"sourceId": n + v, "destId": n + u, "cost": float(grad_cost[v])})
    return {"maxSizePerFPGA": float(topology.devices[g0].memory_bytes), "maxFPGAs": len(gpus),
            "maxCPUs": len(cpus), "nodes": nodes, "edges": edges,
            "source": f"placement_rl: graph {graph.name} on topology {topology.name}"}


def node_entry(nid: int, acc: float, cpu: float, *, size: float = 0, backward: int = 0, colour: int | None = None,
               supported: int = 1) -> dict:
    """One node of an instance file."""
    out = {"id": nid, "supportedOnFpga": supported, "cpuLatency": cpu, "fpgaLatency": acc, "isBackwardNode": backward,
           "size": size}
    if colour is not None:
        out["colorClass"] = colour
    return out


def random_instance(seed: int, *, n: int = 7, acc: int = 2, cpus: int = 1, backward: bool = False,
                    colour: bool = False, max_size: float = 1e9, unsupported: float = 0.0) -> dict:
    """A random DAG of ``n`` nodes (ids 10 ..; each fed by one or two earlier ones; sizes 1-5 bytes) for ``acc``
    accelerators and ``cpus`` cores; with ``backward`` a backward node per forward node (ids 100 ..) in its colour
    class, fed by it and by its successors' backward nodes; with ``colour`` two forward nodes share a class;
    ``unsupported``: the share of nodes an accelerator cannot run."""
    r = random.Random(seed)
    nodes = [node_entry(10 + i, round(r.uniform(0.2, 3), 3), round(r.uniform(1, 9), 3), size=r.randint(1, 5),
                   supported=int(r.random() >= unsupported)) for i in range(n)]
    cost: dict[int, float] = {}
    edges = []

    def edge(u, v):
        edges.append({"sourceId": u, "destId": v, "cost": cost.setdefault(u, round(r.uniform(0.05, 1.5), 3))})

    for v in range(1, n):
        for u in r.sample(range(v), k=min(v, r.randint(1, 2))):
            edge(10 + u, 10 + v)
    if backward:
        forward = [(e["sourceId"], e["destId"]) for e in edges]
        for i in range(n):
            nodes[i]["colorClass"] = i
            nodes.append(node_entry(100 + i, round(r.uniform(0.2, 3), 3), round(r.uniform(1, 9), 3), backward=1,
                               colour=i))
            edge(10 + i, 100 + i)
        for u, v in forward:
            edge(v + 90, u + 90)
    elif colour:
        a, b = r.sample(range(n), 2)
        nodes[a]["colorClass"] = nodes[b]["colorClass"] = 7
    return {"maxSizePerFPGA": max_size, "maxFPGAs": acc, "maxCPUs": cpus, "nodes": nodes, "edges": edges}


__all__ = ["instance_from_graph", "node_entry", "random_instance"]
