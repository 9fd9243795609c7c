"""The numba simulator equals a small, readable plain-Python reference of the same model on random graphs."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import Simulator, needs_grad, priority_order, resolve_costs, simulate
from placement_rl.graph.ir import make_graph
from placement_rl.topology import DeviceTopology


def reference_simulate(graph, costs, device_of_node, order):
    """Plain-Python list scheduling: returns (step_time, comm_time, busy[D], memory[D])."""
    n, d = costs.num_nodes, costs.num_devices
    dev = [int(x) for x in device_of_node]
    succ = {u: [] for u in range(n)}  # in edge order, like the CSR arrays
    preds = {v: [] for v in range(n)}
    for e, (u, v) in enumerate(graph.edges.tolist()):
        succ[u].append((v, float(graph.edge_bytes[e])))
        preds[v].append((u, float(graph.edge_bytes[e])))
    grad = needs_grad(graph)

    def transfer_cost(a, b, nbytes):
        return costs.link_latency[a, b] + nbytes / costs.link_bandwidth[a, b]

    device_free = [0.0] * d
    link_free: dict[tuple[int, int], float] = {}
    busy, memory = [0.0] * d, [0.0] * d
    comm = 0.0
    finish: dict[int, float] = {}
    arrived: dict[tuple[int, int], float] = {}  # (tensor, device) -> arrival time
    sent: dict[tuple[int, int], float] = {}  # (tensor, device) -> bytes of it sent there so far
    for v in order:
        ready = 0.0
        for u, nbytes in preds[v]:
            if dev[u] == dev[v]:
                ready = max(ready, finish[u])
                continue
            have = sent.get((u, dev[v]), 0.0)
            if have < nbytes:  # first consumer there, or one needing more of the tensor: send the rest
                link = (dev[u], dev[v])
                start = max(finish[u], link_free.get(link, 0.0))
                cost = transfer_cost(*link, nbytes - have)
                arrived[(u, dev[v])] = link_free[link] = start + cost
                sent[(u, dev[v])] = nbytes
                comm += cost
                memory[dev[v]] += nbytes - have
            ready = max(ready, arrived[(u, dev[v])])
        start = max(device_free[dev[v]], ready)
        finish[v] = device_free[dev[v]] = start + costs.fwd_time[v, dev[v]]
        busy[dev[v]] += costs.fwd_time[v, dev[v]]
        memory[dev[v]] += 4 * graph.param_bytes[v] + graph.act_bytes[v]
    bfinish: dict[int, float] = {}
    for u in reversed(order):
        ready = finish[u]
        if grad[u]:
            from_device: dict[int, list[float]] = {}  # consumer device -> [last grad time, bytes]
            for w, b in succ[u]:
                if dev[w] == dev[u]:
                    ready = max(ready, bfinish[w])
                elif dev[w] in from_device:
                    entry = from_device[dev[w]]
                    entry[0], entry[1] = max(entry[0], bfinish[w]), max(entry[1], b)
                else:
                    from_device[dev[w]] = [bfinish[w], b]
            for dw, (t, nbytes) in from_device.items():
                link = (dw, dev[u])
                start = max(t, link_free.get(link, 0.0))
                cost = transfer_cost(*link, nbytes)
                link_free[link] = start + cost
                comm += cost
                ready = max(ready, start + cost)
        start = max(device_free[dev[u]], ready)
        bfinish[u] = device_free[dev[u]] = start + costs.bwd_time[u, dev[u]]
        busy[dev[u]] += costs.bwd_time[u, dev[u]]
    return max(bfinish.values()), comm, np.array(busy), np.array(memory)


def random_graph(rng: np.random.Generator, n: int):
    nodes = []
    for i in range(n):
        trainable = rng.random() < 0.7
        nodes.append(dict(name=f"n{i}", fwd_flops=rng.uniform(1e9, 1e11), out_bytes=rng.uniform(1e5, 1e7),
                          bwd_flops=rng.uniform(1e9, 2e11) if trainable else 0.0,
                          param_bytes=rng.uniform(1e5, 1e8) if trainable else 0.0,
                          act_bytes=rng.uniform(1e5, 1e7)))
    edges = set()
    for v in range(1, n):
        for u in rng.integers(max(0, v - 8), v, size=rng.integers(1, 4)).tolist():
            edges.add((u, v))
    perm = rng.permutation(n)  # shuffle node indices so program order differs from the build order
    inv = np.argsort(perm)
    nodes = [nodes[i] | {"name": f"n{k}"} for k, i in enumerate(perm)]
    edges_l = [(int(inv[u]), int(inv[v]), float(rng.uniform(1e4, 1e8))) for u, v in sorted(edges)]
    return make_graph(nodes, edges_l, name=f"random{n}")


def random_topology(rng: np.random.Generator, d: int) -> DeviceTopology:
    devices = [{"name": f"gpu{i}", "kind": "gpu", "peak_flops": float(rng.uniform(5e12, 2e13)),
                "mem_bandwidth": float(rng.uniform(3e11, 1e12)), "memory_bytes": 4e9, "host": i // 2}
               for i in range(d)]
    return DeviceTopology.from_dict({"name": f"rand{d}", "devices": devices, "links": {
        "intra_host": {"bandwidth": 2e10, "latency": 5e-6}, "inter_host": {"bandwidth": 5e9, "latency": 2e-5}}})


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("order", ["program", "critical_path"])
def test_numba_matches_reference(seed: int, order: str) -> None:
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, int(rng.integers(5, 60)))
    topo = random_topology(rng, int(rng.integers(1, 5)))
    costs = resolve_costs(graph, topo)
    sim = Simulator(graph, costs, topo, order=order)
    prio = priority_order(graph, costs, order).tolist()
    for _ in range(4):
        dev = rng.integers(0, topo.num_devices, graph.num_nodes)
        step, comm, busy, mem = reference_simulate(graph, costs, dev, prio)
        got = sim.run(dev)
        assert got.step_time == pytest.approx(step, rel=1e-12)
        assert sim.step_time(dev) == got.step_time
        assert got.comm_time == pytest.approx(comm, rel=1e-12, abs=1e-15)
        np.testing.assert_allclose(got.device_busy, busy, rtol=1e-12)
        np.testing.assert_allclose(got.peak_memory, mem, rtol=1e-12)
        assert got.feasible == bool(np.all(mem <= 4e9))
        assert simulate(graph, costs, topo, dev, order=order).step_time == got.step_time
