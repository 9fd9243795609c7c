"""Edges of zero bytes: pure dependencies in both passes, and the bounds that price them.

The simulator sends nothing along a zero-byte edge, forward or backward: the consumer's forward waits for its
producer's end, and the producer's backward (where its output needs a gradient) for the consumer's backward, with no
link time and nothing on the link. Every bound part stays at or below the enumerated optimum on the graphs where
charging such an edge a link's latency lifted them above it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.baselines.bounds import lower_bound
from placement_rl.cost import CostTable, Simulator, priority_order, resolve_costs, simulate
from placement_rl.cost.comm_fit import link_segments, segment_time
from placement_rl.cost.resolve import needs_grad
from placement_rl.graph.ir import make_graph
from placement_rl.topology import DeviceTopology

PARTS = ("path", "work", "blocks", "milp", "cp")


def _cpus(latency: float, *, memory: float = 1e12, peak=(1e11, 1e11), overhead=(0.0, 0.0),
          mem_bandwidth=(1e10, 1e10)) -> DeviceTopology:
    """Two CPUs on one host, as the cases were found on: a link of 1 GB/s and ``latency``."""
    devs = [{"name": f"c{i}_", "kind": "cpu", "torch_device": "cpu", "host": 0, "peak_flops": peak[i],
             "mem_bandwidth": mem_bandwidth[i], "memory_bytes": memory, "launch_overhead": overhead[i]}
            for i in range(2)]
    return DeviceTopology.from_dict({"name": "t", "devices": devs, "links": {
        "intra_host": {"bandwidth": 1e9, "latency": latency, "kind": "pcie"},
        "inter_host": {"bandwidth": 1e6, "latency": latency, "kind": "ib"}}})


def _node(name: str, fwd: float = 0.0, **fields) -> dict:
    return {"name": name, "op_type": "linear", "fwd_flops": fwd, "bwd_flops": 2 * fwd, **fields}


def _chain3():
    """A 3-node chain of zero-byte edges, 10 us latency: the milp part was 8.0e-05 over an optimum of 5e-05."""
    g = make_graph([_node("n0"), _node("n1", param_bytes=1e6), _node("n2")], [(0, 1, 0.0), (1, 2, 0.0)])
    return g, _cpus(1e-5, overhead=(1e-5, 0.0), mem_bandwidth=(1e11, 1e10))


def _chain6(memory: float = 1e12):
    """A 6-node chain of zero-byte edges ending in a heavy node, 100 us latency: the milp and cp parts were 3.0e-05
    over an optimum of 2.3e-05 (with ``memory`` 5e8 nothing fits: the cp part's start ignores memory)."""
    nodes = [_node(f"n{i}") for i in range(5)] + [_node("n5", 1e6, act_bytes=1e9)]
    g = make_graph(nodes, [(i, i + 1, 0.0) for i in range(5)])
    return g, _cpus(1e-4, memory=memory, peak=(1e11, 1e12), overhead=(0.0, 1e-5))


def _fan_in():
    """Five nodes into one over zero-byte edges, 100 us latency: the cp part was 1.9e-5 relative over the optimum."""
    nodes = [_node("n0", param_bytes=1e6), _node("n1", out_bytes=1e6), _node("n2"), _node("n3", 1e3),
             _node("n4", param_bytes=1e6), _node("n5")]
    return make_graph(nodes, [(i, 5, 0.0) for i in range(5)]), _cpus(1e-4)


def _hand_links():
    """A (0) sends 10 MB to B (1) over [1, 11] ms; Z (0) ends at 3 ms inside that transfer, and W (1) takes Z's
    zero-byte edge: the simulator starts W at 3 ms (step 12 ms). The cp model put a zero-size interval for Z's
    chunk on the link, which CP-SAT kept out of A's transfer: W or B later, a cp part of 14 ms."""
    g = make_graph([{"name": k} for k in "AZWB"], [("A", "B", 1e7), ("Z", "W", 0.0)])
    fwd = np.array([[1, 100], [2, 100], [100, 8], [100, 1]], float) * 1e-3
    costs = CostTable(fwd_time=fwd, bwd_time=np.zeros((4, 2)), link_latency=np.zeros((2, 2)),
                      link_bandwidth=np.array([[np.inf, 1e9], [1e9, np.inf]]), source=("hand",) * 2)
    return g, costs, _gpus(2)


def _gpus(d: int) -> DeviceTopology:
    return DeviceTopology.from_dict({"name": "t", "devices": [{"name": "gpu", "count": d, "kind": "gpu",
                                                               "peak_flops": 1e12, "mem_bandwidth": 1e15,
                                                               "memory_bytes": 1e12, "launch_overhead": 0.0}],
                                     "links": {"intra_host": {"bandwidth": 1e9, "latency": 1e-5}}})


def _enumerate(g, c, t) -> list[tuple[float, tuple]]:
    """Every placement's step time (memory aside, as the bounds), fastest first."""
    sim = Simulator(g, c, t)
    return sorted((sim.step_time(np.array(p)), p) for p in itertools.product(range(t.num_devices),
                                                                            repeat=g.num_nodes))


def _cases():
    out = {name: (g, resolve_costs(g, t), t) for name, (g, t) in
           (("chain3", _chain3()), ("chain6", _chain6()), ("chain6_over_memory", _chain6(5e8)),
            ("fan_in", _fan_in()))}
    return {**out, "hand_links": _hand_links()}


@pytest.mark.parametrize("name", ["chain3", "chain6", "chain6_over_memory", "fan_in", "hand_links"])
def test_every_bound_part_is_at_most_the_enumerated_optimum(name):
    """Each part (path, work, blocks, milp, cp) <= the optimum; the cp part run from the slowest placement, as
    ``place`` runs it from its plan (from the optimum it is not run: nothing can beat that start)."""
    pytest.importorskip("ortools")
    g, c, t = _cases()[name]
    times = _enumerate(g, c, t)
    best, slowest = times[0][0], np.array(times[-1][1])
    got = lower_bound(g, c, t, milp_seconds=1.0, cp_seconds=2.0, cp_start=slowest)
    assert set(got.parts) == set(PARTS), got.parts
    above = {k: v for k, v in got.parts.items() if v > best * (1 + 1e-9)}
    assert not above, (above, best)
    assert "no schedule" not in got.cp_note  # the model admits the start's own schedule (it proved it could not)


def test_the_backward_of_a_cross_device_zero_byte_edge_uses_no_link():
    """n1 (parameters: its output needs a gradient) on c0 between n0 and n2 on c1: no transfer either way, and
    n1's backward starts when n2's ends. It sent a 0-byte gradient over c1 -> c0 that took the link's 10 us."""
    g, t = _chain3()
    c = resolve_costs(g, t)
    res = simulate(g, c, t, [1, 0, 1], timeline=True)
    assert not [iv for iv in res.timeline if iv.kind in ("transfer", "grad_transfer")]
    assert res.comm_time == 0.0
    bwd = {iv.label: iv for iv in res.timeline if iv.kind == "bwd"}
    assert bwd["n1"].start == bwd["n2"].end  # the dependency is kept, with no link time
    assert _old_backward(g, c, t, np.array([1, 0, 1]), res.timeline)[1] == [(1 * 2 + 0, "n1")]  # the old: c1 -> c0


def test_a_zero_byte_consumer_beside_one_with_bytes_still_waits_for_the_gradient_sent():
    """Two consumers of one producer on the other device, one edge of zero bytes and one of 1 MB: the gradient is
    sent once, with the larger bytes, after both consumers' backward (accumulated as before)."""
    g = make_graph([{"name": "p", "param_bytes": 1.0}, {"name": "a"}, {"name": "b"}],
                   [("p", "a", 0.0), ("p", "b", 1e6)])
    c = CostTable(fwd_time=np.ones((3, 2)), bwd_time=np.array([[1.0, 1.0], [5.0, 5.0], [1.0, 1.0]]),
                  link_latency=np.array([[0.0, 0.5], [0.5, 0.0]]), link_bandwidth=np.full((2, 2), 1e6),
                  source=("hand",) * 2)
    t = _gpus(2)
    res = simulate(g, c, t, [0, 1, 1], timeline=True)
    grads = [iv for iv in res.timeline if iv.kind == "grad_transfer"]
    bwd = {iv.label: iv for iv in res.timeline if iv.kind == "bwd"}
    assert len(grads) == 1 and grads[0].start == max(bwd["a"].end, bwd["b"].end)
    assert grads[0].end - grads[0].start == pytest.approx(0.5 + 1.0)
    assert bwd["p"].start == grads[0].end


def _old_backward(graph, costs, topology, dev, timeline) -> tuple[dict, list]:
    """The simulator's backward as it ran before zero-byte edges sent nothing back (a copy of ``_op_kernel.
    bwd_range``'s loop then, in Python): from the forward's ``timeline``, each node's backward ``(start, end)``
    and the gradient transfers ``(link, producer)``. A gradient over a zero-byte edge paid the link's latency."""
    names = {nm: i for i, nm in enumerate(topology.device_names)}
    node = {nm: i for i, nm in enumerate(graph.names)}
    nd = topology.num_devices
    finish, dev_free, link_free = np.zeros(graph.num_nodes), np.zeros(nd), {}
    for iv in timeline:
        if iv.kind == "fwd":
            finish[node[iv.label]] = iv.end
            dev_free[names[iv.resource]] = max(dev_free[names[iv.resource]], iv.end)
        elif iv.kind == "transfer":
            a, b = (names[x] for x in iv.resource.split("->"))
            link_free[a * nd + b] = max(link_free.get(a * nd + b, 0.0), iv.end)
    tables, grad, bwd_t = link_segments(topology, costs), needs_grad(graph), np.asarray(costs.bwd_time)
    bfinish, spans, sent = np.zeros(graph.num_nodes), {}, []
    for u in reversed(priority_order(graph, costs).tolist()):
        du, ready = int(dev[u]), finish[u]
        if grad[u]:
            acc: dict[int, list[float]] = {}  # consumer device -> [latest backward end, largest bytes]
            for q in range(graph.succ_ptr[u], graph.succ_ptr[u + 1]):
                w = graph.succ_idx[q]
                dw, t = int(dev[w]), bfinish[w]
                if dw == du:
                    ready = max(ready, t)
                    continue
                b = graph.edge_bytes[graph.succ_eid[q]]
                got = acc.setdefault(dw, [t, b])
                got[0], got[1] = max(got[0], t), max(got[1], b)
            for dw, (t, b) in acc.items():  # sent back once per device, whatever its bytes
                link = dw * nd + du
                st = max(t, link_free.get(link, 0.0))
                link_free[link] = st + segment_time(tables[dw, du], b)
                ready = max(ready, link_free[link])
                sent.append((link, graph.names[u]))
        st = max(dev_free[du], ready)
        bfinish[u] = dev_free[du] = st + bwd_t[u, du]
        spans[graph.names[u]] = (st, bfinish[u])
    return spans, sent


def _random_case(rng):
    """A random DAG whose edges all carry bytes, a hand cost table and uneven links."""
    n, d = int(rng.integers(3, 10)), int(rng.integers(2, 5))
    edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 0.35] or [(0, 1)]
    nbytes = rng.choice([1.0, 1e3, 1e6, 1e8], size=len(edges))
    g = make_graph([{"name": f"n{i}", "param_bytes": float(rng.choice([0.0, 1e6]))} for i in range(n)],
                   [(u, v, float(b)) for (u, v), b in zip(edges, nbytes)])
    latency, bandwidth = rng.choice([0.0, 1e-5, 1e-3], size=(d, d)), rng.choice([1e8, 1e10], size=(d, d))
    np.fill_diagonal(latency, 0.0)
    np.fill_diagonal(bandwidth, np.inf)
    c = CostTable(fwd_time=rng.random((n, d)) * 1e-3, bwd_time=rng.random((n, d)) * 2e-3, link_latency=latency,
                  link_bandwidth=bandwidth, source=("hand",) * d)
    return g, c, _gpus(d)


def test_graphs_without_zero_byte_edges_keep_the_backward_they_had():
    """On random graphs whose edges all carry bytes, the backward (every op's start and end, every gradient sent)
    and the step time equal the old loop's, recomputed in Python from the forward's timeline."""
    rng = np.random.default_rng(11)
    for _ in range(25):
        g, c, t = _random_case(rng)
        for p in rng.integers(0, t.num_devices, size=(3, g.num_nodes)):
            res = simulate(g, c, t, p, timeline=True)
            spans, sent = _old_backward(g, c, t, p, res.timeline)
            d = t.num_devices
            names = {nm: i for i, nm in enumerate(t.device_names)}
            bwd = {iv.label: (iv.start, iv.end) for iv in res.timeline if iv.kind == "bwd"}
            grads = [(names[iv.resource.split("->")[0]] * d + names[iv.resource.split("->")[1]], iv.label)
                     for iv in res.timeline if iv.kind == "grad_transfer"]
            assert bwd.keys() == spans.keys() and grads == sent
            for k, (s, e) in spans.items():
                assert bwd[k] == pytest.approx((s, e), rel=1e-12, abs=0.0), k
            assert res.step_time == pytest.approx(max(e for _, e in spans.values()), rel=1e-12, abs=0.0)


def test_the_cp_part_says_when_cp_sat_proves_its_model_has_no_schedule():
    """A horizon below every schedule (half the path bound): CP-SAT proves the model infeasible in well under its
    seconds, and the note says so instead of reading as a timeout ("found no placement in 10 s")."""
    pytest.importorskip("ortools")
    from placement_rl.baselines.bounds import path_bound
    from placement_rl.baselines.bounds_cp import cp_bound

    g, t = _chain6()
    c = resolve_costs(g, t)
    got = cp_bound(g, c, t, upper=0.5 * path_bound(g, c), seconds=10.0, workers=1)
    assert got.bound == 0.0 and got.placement is None
    assert got.note.startswith("CP-SAT proved that its model of 6 nodes on 2 devices has no schedule within the "
                               "start's step time"), got.note
    assert " in 10 s" not in got.note


def test_cp_sat_says_when_its_model_has_no_placement_within_the_start(monkeypatch):
    """Where CP-SAT proves its model (memory rounded up) admits nothing within the best start's step time, that
    start comes back and the note says it was proved, not that time ran out."""
    pytest.importorskip("ortools")
    from placement_rl.baselines import bounds_cp

    monkeypatch.setattr(bounds_cp, "_solve", lambda *a, **k: bounds_cp._Solved(0.0, None, None, False, True))
    g, t = _chain6()
    c = resolve_costs(g, t)
    p = baselines.get("cp_sat")(g, c, t, budget=50, seed=0, seconds=60.0)  # seconds to spare (a cold JIT cache)
    assert p.meta["note"].startswith("CP-SAT proved that no placement within the best start's step time fits its "
                                     "model"), p.meta["note"]
    assert p.meta["feasible"] and p.meta["cp_bound"] is None and not p.meta["cp_improved"]
