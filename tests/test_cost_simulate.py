"""Op-placement simulator against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import CostTable, Simulator, priority_order, resolve_costs, simulate
from placement_rl.errors import PlanError, ProfileError
from placement_rl.graph.ir import make_graph
from placement_rl.plans import Placement
from placement_rl.topology import DeviceTopology


def topology(d: int = 2, *, memory: float = 16e9) -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": f"t{d}", "devices": [{"name": "gpu", "count": d, "kind": "gpu", "peak_flops": 1e12,
                                      "mem_bandwidth": 1e15, "memory_bytes": memory, "launch_overhead": 0.0}],
        "links": {"intra_host": {"bandwidth": 1.0, "latency": 0.5}}})


def table(fwd, bwd, d: int = 2, *, latency: float = 0.5, bandwidth: float = 1.0) -> CostTable:
    """A hand-made cost table: the same times on every device, uniform links."""
    lat = np.full((d, d), latency)
    bw = np.full((d, d), bandwidth)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, np.inf)
    return CostTable(fwd_time=np.repeat(np.array(fwd, float)[:, None], d, 1),
                     bwd_time=np.repeat(np.array(bwd, float)[:, None], d, 1),
                     link_latency=lat, link_bandwidth=bw, source=("hand",) * d)


def graph(n: int, edges, **node_fields):
    nodes = [dict(name=f"n{i}", bwd_flops=1.0, **{k: v[i] for k, v in node_fields.items()}) for i in range(n)]
    return make_graph(nodes, edges)


def test_chain_on_one_device_is_sum_of_costs() -> None:
    g = graph(5, [(i, i + 1, 1e6) for i in range(4)])
    fwd, bwd = [1.0, 2.0, 0.5, 3.0, 1.5], [2.0, 1.0, 1.0, 4.0, 0.25]
    res = simulate(g, table(fwd, bwd), topology(), Placement([1] * 5))
    assert res.step_time == pytest.approx(sum(fwd) + sum(bwd))
    assert res.comm_time == 0.0
    np.testing.assert_allclose(res.device_busy, [0.0, sum(fwd) + sum(bwd)])


def test_two_branches_on_two_devices_take_the_max_plus_transfers() -> None:
    # x -> a -> j and x -> b -> j; a on gpu0, b on gpu1; each transfer costs 0.5 + 2 bytes / 1 B/s = 2.5
    g = graph(4, [(0, 1, 2.0), (0, 2, 2.0), (1, 3, 2.0), (2, 3, 2.0)])
    costs = table([1.0, 3.0, 5.0, 1.0], [1.0, 2.0, 4.0, 1.0])
    res = simulate(g, costs, topology(), Placement([0, 0, 1, 0]), timeline=True)
    # forward: x [0,1]; a [1,4]; x->gpu1 [1,3.5]; b [3.5,8.5]; b->gpu0 [8.5,11]; j [11,12]
    # = x + max(a, transfer + b + transfer) + j
    assert res.meta["forward_time"] == pytest.approx(1 + max(3, 2.5 + 5 + 2.5) + 1)
    # backward: j [12,13]; a [13,15]; grad j->b [13,15.5]; b [15.5,19.5]; grad b->x [19.5,22]; x [22,23]
    assert res.step_time == pytest.approx(23.0)
    assert res.comm_time == pytest.approx(4 * 2.5)
    links = {iv.resource for iv in res.timeline if "transfer" in iv.kind}
    assert links == {"gpu0->gpu1", "gpu1->gpu0"}
    # everything on one device: the plain sum
    assert simulate(g, costs, topology(), [0, 0, 0, 0]).step_time == pytest.approx(10 + 8)


def test_transfers_on_one_link_serialise() -> None:
    # p1 -> q1 and p2 -> q2 cross gpu0 -> gpu1; each transfer costs 0.5 + 2.5 = 3
    g = graph(4, [(0, 2, 2.5), (1, 3, 2.5)])
    costs = table([1.0, 1.0, 1.0, 1.0], [0.0] * 4)
    res = simulate(g, costs, topology(), [0, 0, 1, 1], timeline=True)
    # p1 [0,1] p2 [1,2]; link busy [1,4] then [4,7]; q1 [4,5]; q2 [7,8] (not [5,6]: the link is busy)
    assert res.meta["forward_time"] == pytest.approx(8.0)
    transfers = sorted((iv.start, iv.end) for iv in res.timeline if iv.kind == "transfer")
    assert transfers == [(1.0, 4.0), (4.0, 7.0)]
    # on separate links (two destination devices) they overlap
    res3 = simulate(g, table([1.0] * 4, [0.0] * 4, 3), topology(3), [0, 0, 1, 2])
    assert res3.meta["forward_time"] == pytest.approx(6.0)


def test_tensor_is_sent_once_per_destination_device() -> None:
    g = graph(3, [(0, 1, 2.0), (0, 2, 2.0)])
    res = simulate(g, table([1.0] * 3, [0.0] * 3), topology(), [0, 1, 1])
    assert res.comm_time == pytest.approx(2 * 2.5)  # once forward, once for the accumulated gradient
    assert res.meta["forward_time"] == pytest.approx(1 + 2.5 + 2)


def test_timeline_ops_do_not_overlap_on_a_device() -> None:
    rng = np.random.default_rng(3)
    g = graph(30, [(u, v, 1.0) for v in range(1, 30) for u in {int(rng.integers(0, v)), v - 1}])
    costs = table(rng.uniform(0.1, 1, 30), rng.uniform(0.1, 2, 30), 3)
    res = simulate(g, costs, topology(3), rng.integers(0, 3, 30), timeline=True)
    for res_name in {iv.resource for iv in res.timeline}:
        spans = sorted((iv.start, iv.end) for iv in res.timeline if iv.resource == res_name)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
    assert max(iv.end for iv in res.timeline) == pytest.approx(res.step_time)


def test_over_memory_placement_is_infeasible() -> None:
    # each node: 4 x 1 GB of parameter state + 0.5 GB activations = 4.5 GB; devices hold 8 GB
    g = graph(2, [(0, 1, 1e6)], param_bytes=[1e9, 1e9], act_bytes=[5e8, 5e8])
    topo = topology(memory=8e9)
    costs = resolve_costs(g, topo)
    together = simulate(g, costs, topo, [0, 0])
    assert not together.feasible
    assert together.peak_memory[0] == pytest.approx(9e9)
    apart = simulate(g, costs, topo, [0, 1])
    assert apart.feasible
    np.testing.assert_allclose(apart.peak_memory, [4.5e9, 4.5e9 + 1e6])  # + the received buffer


def test_critical_path_order_is_a_valid_priority_order() -> None:
    # node 1 starts a long chain (1 -> 3 -> 4); node 2 is a cheap leaf: critical path runs 1 before 2
    g = graph(5, [(0, 1, 1.0), (0, 2, 1.0), (1, 3, 1.0), (3, 4, 1.0)])
    costs = table([1.0, 5.0, 0.1, 5.0, 5.0], [1.0] * 5)
    order = priority_order(g, costs, "critical_path").tolist()
    assert sorted(order) == list(range(5))
    pos = {v: k for k, v in enumerate(order)}
    assert all(pos[u] < pos[v] for u, v in g.edges.tolist())
    g2 = graph(4, [(0, 3, 1.0), (1, 2, 1.0)])  # program order 0,1,2,3; chain 1 -> 2 is longer
    costs2 = table([1.0, 5.0, 5.0, 1.0], [1.0] * 4)
    assert priority_order(g2, costs2, "critical_path").tolist()[0] == 1
    with pytest.raises(PlanError, match="unknown simulation order"):
        priority_order(g2, costs2, "random")


def test_simulate_is_deterministic_and_matches_simulator() -> None:
    rng = np.random.default_rng(0)
    g = graph(40, [(u, v, float(rng.uniform(1, 10))) for v in range(1, 40) for u in {int(rng.integers(0, v))}])
    costs = table(rng.uniform(0.1, 1, 40), rng.uniform(0.1, 2, 40), 4)
    topo = topology(4)
    dev = rng.integers(0, 4, 40)
    a = simulate(g, costs, topo, dev, timeline=True)
    b = simulate(g, costs, topo, Placement(dev), timeline=True)
    assert a.step_time == b.step_time and a.timeline == b.timeline
    sim = Simulator(g, costs, topo)
    assert sim.step_time(dev) == a.step_time == sim.run(dev).step_time
    assert sim.step_time(dev.astype(np.int32)) == a.step_time
    assert sim.calls == 3


def test_bad_inputs_raise_domain_errors() -> None:
    g = graph(3, [(0, 1, 1.0), (1, 2, 1.0)])
    topo = topology()
    sim = Simulator(g, table([1.0] * 3, [1.0] * 3), topo)
    with pytest.raises(PlanError, match="3 nodes"):
        sim.step_time(np.zeros(2, dtype=np.int64))
    with pytest.raises(PlanError, match="device index 5"):
        sim.step_time(np.array([0, 5, 1]))
    with pytest.raises(ProfileError, match="resolve_costs"):
        Simulator(g, table([1.0] * 4, [1.0] * 4), topo)


def test_memory_messages_show_small_sizes():
    """A memory error names sizes in a unit that shows them (it said '0.00 GiB' for a few MiB)."""
    from placement_rl.errors import fmt_bytes

    assert fmt_bytes(10) == "10 B" and fmt_bytes(1536) == "1.50 KiB" and fmt_bytes(3 * 2**20) == "3.00 MiB"
    assert fmt_bytes(2.5 * 2**30) == "2.50 GiB"


def test_a_zero_byte_edge_across_devices_still_orders_its_ends() -> None:
    """An edge of no bytes (``make_graph``'s default) sends nothing, but its consumer starts after its producer:
    on two devices the forward was x [0, 1] and y [0, 2] side by side (forward 2.0, below the lower bound)."""
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.cost.schedule import ScheduleState

    g = graph(2, [(0, 1, 0.0)])
    costs = table([1.0, 2.0], [1.0, 1.0])
    topo = topology()
    res = simulate(g, costs, topo, [0, 1], timeline=True)
    fwd = {iv.label: iv for iv in res.timeline if iv.kind == "fwd"}
    assert fwd["n1"].start == pytest.approx(fwd["n0"].end) and res.meta["forward_time"] == pytest.approx(3.0)
    assert not [iv for iv in res.timeline if iv.kind == "transfer"]  # nothing sent forward
    assert res.step_time >= lower_bound(g, costs, topo).value * (1 - 1e-12)
    state = ScheduleState(g, costs, topo)  # the constructive env's kernels: the same times
    for d in (0, 1):
        state.features()
        state.place([d])
    assert state.finish()[0] == pytest.approx(res.step_time, rel=1e-12)


def test_the_constructive_state_takes_an_inference_task_whose_training_state_would_not_fit() -> None:
    """Two 1.5 GB layers on two 4 GB devices: 12 GB of training state, 3 GB of parameters. ``simulate`` prices the
    inference placement as fitting; ``ScheduleState`` (and every placer on it: sim_eft, la_rule, the policy)
    refused the task with the training state's figure."""
    from placement_rl import baselines
    from placement_rl.cost.modes import inference_costs
    from placement_rl.cost.schedule import ScheduleState

    topo = topology(memory=4e9)
    g = graph(2, [(0, 1, 1e6)], param_bytes=[1.5e9, 1.5e9])
    costs = inference_costs(table([1.0, 1.0], [1.0, 1.0]))
    assert simulate(g, costs, topo, [0, 1]).feasible
    state = ScheduleState(g, costs, topo)
    for d in (0, 1):
        state.features()
        state.place([d])
    assert state.feasible()[0]
    for name in ("sim_eft", "la_rule"):
        assert baselines.get(name)(g, costs, topo, budget=100, seed=0).meta["feasible"], name
    with pytest.raises(PlanError, match="for its parameters"):
        ScheduleState(graph(2, [(0, 1, 1e6)], param_bytes=[5e9, 5e9]), costs, topo)
