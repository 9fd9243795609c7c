"""Pipeline simulator (GPipe, 1F1B, interleaved 1F1B, DP all-reduce) against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import CostTable, PipelineSimulator, simulate_pipeline
from placement_rl.cost.pipeline import with_step_overhead
from placement_rl.errors import PlanError, ProfileError
from placement_rl.graph.ir import make_graph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology


def topology(d: int, memory: float = 1e12) -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": f"t{d}", "devices": [{"name": "gpu", "count": d, "kind": "gpu", "peak_flops": 1e12,
                                      "mem_bandwidth": 1e15, "memory_bytes": memory}],
        "links": {"intra_host": {"bandwidth": 1.0, "latency": 0.0}}})


def table(fwd, bwd, d: int, *, latency=0.0, bandwidth=np.inf, overhead=None) -> CostTable:
    lat = np.broadcast_to(np.asarray(latency, float), (d, d)).copy()
    bw = np.broadcast_to(np.asarray(bandwidth, float), (d, d)).copy()
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, np.inf)
    col = lambda x: np.repeat(np.array(x, float)[:, None], d, 1)  # noqa: E731
    return CostTable(fwd_time=col(fwd), bwd_time=col(bwd), link_latency=lat, link_bandwidth=bw,
                     source=("hand",) * d, launch_overhead=None if overhead is None else col(overhead))


def chain(n: int, *, edge_bytes: float = 0.0, params: float = 0.0, act: float = 0.0):
    nodes = [dict(name=f"n{i}", bwd_flops=1.0, param_bytes=params, act_bytes=act) for i in range(n)]
    return make_graph(nodes, [(i, i + 1, edge_bytes) for i in range(n - 1)])


def plan(stages, groups, m: int, schedule: str = "1f1b", **kw) -> StagePlan:
    return StagePlan(stage_of_node=stages, stage_devices=groups, num_microbatches=m, schedule=schedule, **kw)


@pytest.mark.parametrize("num_stages,m", [(2, 1), (4, 4), (4, 8), (8, 3)])
def test_gpipe_and_1f1b_take_m_plus_s_minus_1_slots(num_stages: int, m: int) -> None:
    g = chain(num_stages, act=8.0)
    costs = table([1.0] * num_stages, [2.0] * num_stages, num_stages)  # per micro-batch: 1/m fwd, 2/m bwd
    topo = topology(num_stages)
    groups = [(s,) for s in range(num_stages)]
    slots = (m + num_stages - 1) * (1.0 + 2.0) / m
    gp = simulate_pipeline(g, costs, topo, plan(list(range(num_stages)), groups, m, "gpipe"))
    fb = simulate_pipeline(g, costs, topo, plan(list(range(num_stages)), groups, m, "1f1b"))
    assert gp.step_time == pytest.approx(slots)
    assert fb.step_time == pytest.approx(slots)
    assert gp.meta["bubble_fraction"] == pytest.approx(1 - 3.0 / slots)
    # GPipe keeps all m micro-batches (8 bytes / m each), 1F1B keeps min(S - s, m) at stage s
    np.testing.assert_allclose(gp.peak_memory, [8.0] * num_stages)
    np.testing.assert_allclose(fb.peak_memory, [min(num_stages - s, m) * 8.0 / m for s in range(num_stages)])
    assert np.all(fb.peak_memory <= gp.peak_memory)
    if m > num_stages:
        assert fb.peak_memory[0] < gp.peak_memory[0]


def test_unequal_stages_are_simulated_event_by_event() -> None:
    # stage 0: 1 per micro-batch fwd and bwd; stage 1: 3 and 3 (m = 2)
    g = chain(2)
    costs = table([2.0, 6.0], [2.0, 6.0], 2)
    for schedule in ("gpipe", "1f1b"):
        res = simulate_pipeline(g, costs, topology(2), plan([0, 1], [(0,), (1,)], 2, schedule), timeline=True)
        # stage 1: F0 [1,4] F1 [4,7] B0 [7,10] B1 [10,13] (1F1B: F0 B0 F1 B1, same ends); stage 0: B1 [13,14]
        assert res.step_time == pytest.approx(14.0)
        assert res.meta["stage_fwd_time"] == [1.0, 3.0]
        for name in ("gpu0", "gpu1"):
            spans = sorted((iv.start, iv.end) for iv in res.timeline if iv.resource == name)
            assert len(spans) == 4 and all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))


def test_boundary_transfers_carry_skip_connections() -> None:
    # 0 -> 1 -> 2 and a skip 0 -> 2: boundary 0|1 carries node 0's tensor (3 bytes), 1|2 both (3 + 5 bytes)
    g = make_graph([dict(name=f"n{i}", bwd_flops=1.0) for i in range(3)], [(0, 1, 3.0), (1, 2, 5.0), (0, 2, 3.0)])
    costs = table([1.0] * 3, [1.0] * 3, 3, latency=0.5, bandwidth=1.0)
    res = simulate_pipeline(g, costs, topology(3), plan([0, 1, 2], [(0,), (1,), (2,)], 1))
    # forward 1 + (0.5 + 3) + 1 + (0.5 + 8) + 1, backward the same
    assert res.step_time == pytest.approx(2 * (3 + 3.5 + 8.5))
    assert res.comm_time == pytest.approx(2 * (3.5 + 8.5))


def test_dp_allreduce_matches_the_ring_formula() -> None:
    # one stage over devices 0, 1, 2 (p = 3); link 0-2 is the slowest (bandwidth 2, latency 0.3)
    bw = np.array([[np.inf, 8.0, 2.0, 8.0], [8.0, np.inf, 4.0, 8.0], [2.0, 4.0, np.inf, 8.0], [8.0] * 3 + [np.inf]])
    lat = np.array([[0, 0.1, 0.3, 0.1], [0.1, 0, 0.2, 0.1], [0.3, 0.2, 0, 0.1], [0.1, 0.1, 0.1, 0]])
    g = chain(2, params=6.0)
    costs = table([3.0, 3.0], [6.0, 6.0], 4, latency=lat, bandwidth=bw)
    res = simulate_pipeline(g, costs, topology(4), plan([0, 0], [(0, 1, 2)], 1))
    p, params = 3, 12.0
    allreduce = 2 * (p - 1) / p * params / 2.0 + 2 * (p - 1) * 0.3
    assert res.meta["allreduce_time"] == [pytest.approx(allreduce)]
    assert res.step_time == pytest.approx((6.0 + 12.0) / p + allreduce)  # compute split over 3 replicas
    np.testing.assert_allclose(res.peak_memory[:3], 4 * params)
    assert res.peak_memory[3] == 0.0


def test_launch_overhead_does_not_shrink_with_microbatches() -> None:
    g = chain(1)
    costs = table([1.0], [2.0], 1, overhead=[0.1])
    res = simulate_pipeline(g, costs, topology(1), plan([0], [(0,)], 4, "gpipe"))
    assert res.meta["stage_fwd_time"] == [pytest.approx(0.9 / 4 + 0.1)]
    assert res.meta["stage_bwd_time"] == [pytest.approx(1.9 / 4 + 0.1)]
    assert res.step_time == pytest.approx(4 * (0.9 / 4 + 0.1 + 1.9 / 4 + 0.1))


def test_interleaved_1f1b_shrinks_the_bubble() -> None:
    g = chain(4, act=1.0)
    costs = table([1.0] * 4, [2.0] * 4, 2)
    topo = topology(2)
    for m in (2, 4, 8):
        plain = simulate_pipeline(g, costs, topo, plan([0, 0, 1, 1], [(0,), (1,)], m, "1f1b"))
        inter = simulate_pipeline(g, costs, topo, plan([0, 1, 2, 3], [(0,), (1,), (0,), (1,)], m,
                                                       "interleaved1f1b"))
        work = 2 * 3.0  # per device: two nodes of fwd 1 + bwd 2
        assert plain.step_time == pytest.approx(work * (m + 1) / m)
        # Megatron: bubble (P - 1) / v of a stage slot, v = 2 chunks per device
        assert inter.step_time == pytest.approx(work + work / 2 / m)
        assert inter.meta["bubble_fraction"] < plain.meta["bubble_fraction"]


def test_invalid_pipeline_plans_raise_plan_error() -> None:
    g = chain(4)
    costs = table([1.0] * 4, [1.0] * 4, 4)
    sim = PipelineSimulator(g, costs, topology(4))
    with pytest.raises(PlanError, match="round-robin"):
        sim.step_time(plan([0, 1, 2, 3], [(0,), (0,), (1,), (1,)], 2, "interleaved1f1b"))
    with pytest.raises(PlanError, match="divisible"):
        sim.step_time(plan([0, 1, 2, 3], [(0,), (1,), (0,), (1,)], 3, "interleaved1f1b"))
    with pytest.raises(PlanError, match="zb1p"):
        sim.step_time(plan([0, 1, 2, 3], [(0,), (1,), (2,), (3,)], 2, "zb1p"))
    with pytest.raises(PlanError, match="overlap"):
        sim.step_time(plan([0, 0, 1, 1], [(0, 1), (1, 2)], 2, "interleaved1f1b"))
    good = sim.step_time(plan([0, 0, 1, 1], [(0,), (1,)], 2))
    with pytest.raises(PlanError, match="backwards"):  # same layout (cached), bad stage_of_node
        sim.step_time(plan([0, 1, 0, 1], [(0,), (1,)], 2))
    assert sim.step_time(plan([0, 0, 1, 1], [(0,), (1,)], 2)) == good


def test_over_memory_plan_is_infeasible_and_simulator_matches() -> None:
    g = chain(4, params=1e9, act=4e9)
    topo = topology(2, memory=16e9)
    costs = table([1.0] * 4, [1.0] * 4, 2)
    one = plan([0, 0, 0, 0], [(0,)], 4, "gpipe")
    two = plan([0, 0, 1, 1], [(0,), (1,)], 4, "1f1b")
    r1, r2 = simulate_pipeline(g, costs, topo, one), simulate_pipeline(g, costs, topo, two)
    assert not r1.feasible and r1.peak_memory[0] == pytest.approx(16e9 + 16e9)
    assert r2.feasible and r2.peak_memory[0] == pytest.approx(8e9 + 2 * 8e9 / 4)
    sim = PipelineSimulator(g, costs, topo)
    assert sim.step_time(two) == r2.step_time == sim.run(two).step_time
    assert sim.calls == 2


@pytest.mark.parametrize("schedule,groups,v", [("gpipe", 3, 1), ("1f1b", 4, 1), ("interleaved1f1b", 2, 3),
                                               ("interleaved1f1b", 3, 2), ("interleaved1f1b", 1, 4)])
def test_random_unequal_stages_respect_dependencies(schedule: str, groups: int, v: int) -> None:
    rng = np.random.default_rng(groups * 10 + v)
    s = groups * v
    g = chain(s, edge_bytes=2.0, act=1.0)
    costs = table(rng.uniform(0.5, 3, s), rng.uniform(0.5, 6, s), groups, latency=0.1, bandwidth=4.0)
    for m in (groups, 2 * groups, 4 * groups):
        p = plan(list(range(s)), [(k % groups,) for k in range(s)], m, schedule)
        res = simulate_pipeline(g, costs, topology(groups), p, timeline=True)
        ops = {(iv.kind, iv.label): iv for iv in res.timeline if iv.kind in ("fwd", "bwd")}
        assert len(ops) == 2 * s * m
        for k in range(s):
            for i in range(m):
                f, b = ops[("fwd", f"stage{k} mb{i}")], ops[("bwd", f"stage{k} mb{i}")]
                assert f.end <= b.start + 1e-12
                if k > 0:
                    assert ops[("fwd", f"stage{k - 1} mb{i}")].end <= f.start + 1e-12
                    assert ops[("bwd", f"stage{k - 1} mb{i}")].start >= b.end - 1e-12
        assert res.step_time >= res.device_busy.max() - 1e-9
        assert max(iv.end for iv in res.timeline) == pytest.approx(res.step_time)


def test_costs_measured_at_the_microbatch_are_not_rescaled() -> None:
    """Per-micro-batch costs (``cost_batch_size``) are used as they are; other micro-batches scale by size."""
    g = chain(2)
    topo = topology(2)
    micro = table([1.0, 1.0], [2.0, 2.0], 2)  # measured at the per-replica micro-batch of 4
    p4 = plan([0, 1], [(0,), (1,)], 4, "gpipe", batch_size=16)
    got = simulate_pipeline(g, micro, topo, p4, cost_batch_size=4)
    assert got.step_time == pytest.approx((4 + 2 - 1) * 3.0)  # no 1/m scaling: 3 s per micro-batch per stage
    assert got.meta["cost_batch_size"] == 4.0
    # the same table read as whole-batch costs (old model) shrinks by 1/m
    assert simulate_pipeline(g, micro, topo, p4).step_time == pytest.approx((4 + 2 - 1) * 3.0 / 4)
    # meta["batch_size"] is the default; a 2-micro-batch plan runs micro-batches of 8: twice the time
    tagged = CostTable(fwd_time=micro.fwd_time, bwd_time=micro.bwd_time, link_latency=micro.link_latency,
                       link_bandwidth=micro.link_bandwidth, source=micro.source, meta={"batch_size": 4})
    p2 = plan([0, 1], [(0,), (1,)], 2, "gpipe", batch_size=16)
    assert simulate_pipeline(g, tagged, topo, p2).step_time == pytest.approx((2 + 2 - 1) * 6.0)
    with pytest.raises(PlanError, match="batch_size"):
        simulate_pipeline(g, tagged, topo, plan([0, 1], [(0,), (1,)], 2, "gpipe"))
    with pytest.raises(ProfileError, match="cost batch size"):
        PipelineSimulator(g, micro, topo, cost_batch_size=0)


def test_step_overhead_is_paid_by_every_microbatch() -> None:
    g = chain(4)
    topo = topology(2)
    costs = with_step_overhead(table([1.0] * 4, [1.0] * 4, 2), 8.0)  # 1 s per node forward and backward
    np.testing.assert_allclose(costs.fwd_time, 2.0)
    np.testing.assert_allclose(costs.launch_overhead, 1.0)
    assert costs.meta["step_overhead"] == [8.0, 8.0]
    # one stage, m micro-batches of the whole-batch costs: variable part shrinks, overhead does not
    for m in (1, 4):
        p = plan([0, 0, 0, 0], [(0,)], m, "gpipe", batch_size=16)
        assert simulate_pipeline(g, costs, topo, p).step_time == pytest.approx(8.0 + 8.0 * m)
    with pytest.raises(ProfileError):
        with_step_overhead(costs, -1.0)
