"""``simulate``: the training-step time of an op-level placement (a device per node).

Model (pure and deterministic):

* Forward ops run in a fixed priority order: ``"program"`` (the captured program order: lowest node index
  first among ops whose inputs are computed) or ``"critical_path"`` (HEFT upward rank over mean device
  and link costs, highest first, ties by index; always a topological order). Backward ops run in the
  reverse order. The ops are list-scheduled one after the other: each device runs one op at a time and an
  op starts when its device is free and all its inputs have arrived. On one device every forward op
  precedes every backward op (autograd runs after the forward).
* A tensor crossing devices costs ``latency + bytes / bandwidth`` on that directed link (the measured NCCL
  send/recv curve where the topology names a measured system, ``comm_fit``). It is sent once
  per destination device (like the copy op the executor inserts), when its first consumer there is
  scheduled, carrying that consumer's edge bytes; a later consumer there that needs a larger part of the
  tensor (a larger edge, as from a multi-output group) has the rest sent when it is scheduled. So the
  forward pass can be built one node at a time (the constructive env does) and ends where ``simulate`` does. Transfers on one link are serialised in the order
  they are issued and overlap with compute.
* Backward: gradients flow along reversed edges with the same bytes; gradients produced on one device for
  the same tensor are accumulated there and sent back once, after the last of them is computed. An edge of zero
  bytes sends nothing either way, forward or backward: it only orders its ends (the consumer's forward after the
  producer's, the producer's backward after the consumer's). Edges out
  of a node whose output needs no gradient (see ``resolve.needs_grad``) carry none. Parameter gradients
  stay on their device.
* Inference costs (``cost.modes.inference_costs``, ``mode=inference``): backward times are zero, no gradient is
  sent and a node pins its parameters alone (no gradients, optimizer state or kept activations); received
  buffers are still counted.
* ``step_time`` = end of the last backward op. The optimizer update is not modelled (it is local to each
  device and does not depend on the placement beyond its parameter bytes).
* Memory per device (``peak_memory``): 4 x param_bytes (params, grads, Adam's two moments) + act_bytes of
  its nodes (kept for backward) + bytes of tensors it received (kept for backward). ``feasible`` = every
  device within ``memory_bytes``. ``device_busy`` = fwd + bwd compute per device; ``comm_time`` = total
  time links spend transferring.
"""

from __future__ import annotations

import heapq
import threading

import numpy as np

from placement_rl.cost.memory import static_memory
from placement_rl.cost._op_kernel import simulate_ops
from placement_rl.cost.comm_fit import inverse_bandwidth, link_segments, split_segments
from placement_rl.cost.resolve import needs_grad
from placement_rl.cost.types import CostTable, Interval, SimResult
from placement_rl.errors import PlanError, ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement
from placement_rl.topology import DeviceTopology

ORDERS = ("program", "critical_path")
_KINDS = ("fwd", "bwd", "transfer", "grad_transfer")


def check_costs(graph: CompGraph, costs: CostTable, topology: DeviceTopology) -> None:
    """Raise ``ProfileError`` when a cost table was resolved for another graph or topology: its shape, and the
    graph fingerprint it records (where it records one: a table built by hand may not). The topology is checked
    by its device count only: a topology renamed, or given other memory sizes, keeps its table."""
    if costs.num_nodes != graph.num_nodes or costs.num_devices != topology.num_devices:
        raise ProfileError(f"cost table is {costs.num_nodes} nodes x {costs.num_devices} devices but graph "
                           f"'{graph.name}' has {graph.num_nodes} nodes and topology '{topology.name}' "
                           f"{topology.num_devices} devices: call resolve_costs(graph, topology) again")
    if costs.graph_fingerprint and costs.graph_fingerprint != graph.fingerprint():
        raise ProfileError(f"cost table was resolved for another graph (fingerprint {costs.graph_fingerprint}, "
                           f"graph '{graph.name}' has {graph.fingerprint()}): call resolve_costs(graph, topology) "
                           "again")


def _owned(arr: np.ndarray, dtype=np.float64) -> np.ndarray:
    """A writable C-contiguous copy, so each kernel compiles for one set of array types."""
    return np.array(arr, dtype=dtype, order="C", copy=True)


def _inverse_bandwidth(costs: CostTable) -> np.ndarray:
    return inverse_bandwidth(costs.link_bandwidth)


def upward_rank(graph: CompGraph, costs: CostTable) -> np.ndarray:
    """HEFT upward rank: mean fwd time + max over successors of (mean transfer time + their rank)."""
    d = costs.num_devices
    w = costs.fwd_time.mean(axis=1)
    if d > 1:
        off = ~np.eye(d, dtype=bool)
        mean_lat = float(costs.link_latency[off].mean())
        mean_inv = float(_inverse_bandwidth(costs)[off].mean())
    else:
        mean_lat = mean_inv = 0.0
    rank = w.copy()
    sp, si, se = graph.succ_ptr, graph.succ_idx, graph.succ_eid
    eb = graph.edge_bytes
    for v in graph.topo_order[::-1].tolist():
        best = 0.0
        for k in range(sp[v], sp[v + 1]):
            c = mean_lat + eb[se[k]] * mean_inv + rank[si[k]]
            best = max(best, c)
        rank[v] = w[v] + best
    return rank


def priority_order(graph: CompGraph, costs: CostTable, order: str = "program") -> np.ndarray:
    """The forward priority order (a topological order of node indices) for ``order``."""
    if order == "program":
        return np.array(graph.topo_order, dtype=np.int64)
    if order != "critical_path":
        raise PlanError(f"unknown simulation order '{order}' (choose one of {', '.join(ORDERS)})")
    rank = upward_rank(graph, costs)
    n = graph.num_nodes
    indeg = np.diff(graph.pred_ptr).tolist()
    sp, si = graph.succ_ptr.tolist(), graph.succ_idx.tolist()
    ready = [(-rank[v], v) for v in range(n) if indeg[v] == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        _, v = heapq.heappop(ready)
        out.append(v)
        for k in range(sp[v], sp[v + 1]):
            w = si[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(ready, (-rank[w], w))
    return np.array(out, dtype=np.int64)


def _grad_and_memory(graph: CompGraph, costs: CostTable) -> tuple[np.ndarray, np.ndarray]:
    """Which outputs send a gradient back, and the bytes each node pins: training (``needs_grad``, 4 x params +
    kept activations) or inference costs (``cost.modes``: no gradient, the parameters alone)."""
    from placement_rl.cost.modes import mode_of

    if mode_of(costs) == "inference":
        return np.zeros(graph.num_nodes, dtype=np.uint8), np.array(graph.param_bytes, dtype=np.float64)
    return needs_grad(graph).astype(np.uint8), static_memory(graph)


class Simulator:
    """``simulate`` prepared once per (graph, costs, topology, order) for fast repeated evaluation.

    ``step_time(device_of_node)`` returns only the step time (no allocation beyond the call);
    ``run(placement)`` returns a full ``SimResult``. ``calls`` counts evaluations.
    """

    def __init__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *,
                 order: str = "program") -> None:
        check_costs(graph, costs, topology)
        self.graph, self.costs, self.topology, self.order_name = graph, costs, topology, order
        self.order = priority_order(graph, costs, order)
        self.calls = 0
        n, e = graph.num_nodes, graph.num_edges
        i64 = np.int64
        self._graph_arrays = (
            self.order, _owned(graph.pred_ptr, i64), _owned(graph.pred_idx, i64), _owned(graph.pred_eid, i64),
            _owned(graph.succ_ptr, i64), _owned(graph.succ_idx, i64),
            _owned(graph.succ_eid, i64), _owned(graph.edge_bytes, np.float64),
            _owned(costs.fwd_time), _owned(costs.bwd_time), *split_segments(link_segments(topology, costs)),
            *_grad_and_memory(graph, costs))
        self._owner = threading.get_ident()  # the thread that uses the scratch buffers below; others get their own
        self._scratch = self._new_scratch()
        self._no_rec = (np.zeros(1, i64), np.zeros(0, np.int8), np.zeros(0, i64), np.zeros(0), np.zeros(0),
                        np.zeros(0, i64))
        self._rec_size = 2 * n + 2 * e
        self._capacity = topology.array("memory_bytes")
        self._source = costs.describe_source(topology.device_names)

    def _new_scratch(self) -> tuple:
        """The kernel's work arrays, then busy time, memory and the outputs (step, comm, forward, valid)."""
        n, d = self.graph.num_nodes, self.topology.num_devices
        work = (np.zeros(n), np.zeros(n), np.zeros(n * d), np.zeros(n * d), np.zeros(d), np.zeros(d * d),
                np.zeros(d), np.zeros(d), np.zeros(d, np.int64), np.zeros(2))
        return (*work, np.zeros(d), np.zeros(d), np.zeros(4))

    def __setstate__(self, state: dict) -> None:  # unpickled in another process: this thread owns the buffers
        self.__dict__.update(state)
        self._owner = threading.get_ident()

    def _as_devices(self, device_of_node) -> np.ndarray:
        if isinstance(device_of_node, Placement):
            device_of_node = device_of_node.device_of_node
        dev = device_of_node
        if not (isinstance(dev, np.ndarray) and dev.dtype == np.int64 and dev.ndim == 1
                and dev.flags.c_contiguous):
            dev = np.ascontiguousarray(Placement(dev).device_of_node)  # PlanError for fractions, 2-D, NaN
        if dev.shape[0] != self.graph.num_nodes:
            Placement(dev).validate(self.graph, self.topology)
        if dev.flags.writeable:  # one compiled specialisation: read-only arrays (as in Placement)
            dev = dev.view()
            dev.setflags(write=False)
        return dev

    def _simulate(self, dev: np.ndarray, rec: tuple) -> tuple:
        """``(busy, memory, out)`` of one simulation; a thread other than the owner works in buffers of its own
        (the kernel releases the GIL: shared buffers gave wrong step times under threads)."""
        scratch = self._scratch if threading.get_ident() == self._owner else self._new_scratch()
        simulate_ops(dev, *self._graph_arrays, *scratch, len(rec[1]) > 0, *rec)
        self.calls += 1
        busy, mem, out = scratch[-3:]
        if out[3] == 0.0:
            Placement(dev).validate(self.graph, self.topology)
        return busy, mem, out

    def step_time(self, device_of_node: np.ndarray) -> float:
        """Simulated step time (seconds) of a placement given as a device index per node."""
        return float(self._simulate(self._as_devices(device_of_node), self._no_rec)[2][0])

    def run(self, placement, timeline: bool = False) -> SimResult:
        """Full result (step time, busy time and memory per device, feasibility, optional timeline)."""
        dev = self._as_devices(placement)
        if timeline:
            r = self._rec_size
            rec = (np.zeros(1, np.int64), np.zeros(r, np.int8), np.zeros(r, np.int64), np.zeros(r), np.zeros(r),
                   np.zeros(r, np.int64))
        else:
            rec = self._no_rec
        busy, mem, out = self._simulate(dev, rec)
        mem = mem.copy()
        meta = {"order": self.order_name, "forward_time": float(out[2]), "cost_source": self._source}
        broken: list[str] = []
        if self.costs.meta.get("allowed") or self.costs.meta.get("colocate"):
            from placement_rl.cost.costs_file import restriction_errors

            broken = restriction_errors(self.costs, dev, self.graph.names, self.topology.device_names)
            if broken:
                meta["restriction_errors"] = broken
        return SimResult(step_time=float(out[0]), feasible=bool(np.all(mem <= self._capacity)) and not broken,
                         device_busy=busy.copy(), peak_memory=mem, comm_time=float(out[1]),
                         timeline=self._timeline(rec) if timeline else None, meta=meta)

    def _timeline(self, rec: tuple) -> tuple[Interval, ...]:
        names, graph_names, d = self.topology.device_names, self.graph.names, self.topology.num_devices
        out = []
        for k in range(int(rec[0][0])):
            kind, res = int(rec[1][k]), int(rec[2][k])
            resource = names[res] if kind < 2 else f"{names[res // d]}->{names[res % d]}"
            out.append(Interval(kind=_KINDS[kind], resource=resource, start=float(rec[3][k]),
                                end=float(rec[4][k]), label=graph_names[int(rec[5][k])]))
        return tuple(out)


def simulate(graph: CompGraph, costs: CostTable, topology: DeviceTopology, placement, *,
             order: str = "program", timeline: bool = False) -> SimResult:
    """Simulated training step of ``placement`` (a ``Placement`` or a device index per node)."""
    return Simulator(graph, costs, topology, order=order).run(placement, timeline=timeline)
