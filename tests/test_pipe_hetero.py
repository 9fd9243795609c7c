"""Heterogeneous device groups in the pipeline simulator: a DP / FSDP group is paced by its slowest member in
forward and in backward alike; forward-only (inference) pipelines send no gradients."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import CostTable, simulate_pipeline
from placement_rl.cost.modes import inference_costs
from placement_rl.graph.ir import make_graph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

MIB = 2.0**20


def mixed_topology(fast: int = 3) -> DeviceTopology:
    """``fast`` accelerators and one CPU, uniform links."""
    return DeviceTopology.from_dict({
        "name": f"{fast}gpu_cpu", "devices": [
            {"name": "gpu", "count": fast, "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 1e12,
             "memory_bytes": 1e12},
            {"name": "cpu", "count": 1, "kind": "cpu", "peak_flops": 1e11, "mem_bandwidth": 1e11,
             "memory_bytes": 1e12}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-6}}})


def layers(n: int, params: float = 40 * MIB):
    nodes = [dict(name=f"l{i}", bwd_flops=1.0, param_bytes=params, act_bytes=1e6) for i in range(n)]
    return make_graph(nodes, [(i, i + 1, 1e6) for i in range(n - 1)])


def per_device(fwd: np.ndarray, bwd: np.ndarray, topo: DeviceTopology) -> CostTable:
    d = topo.num_devices
    return CostTable(fwd_time=fwd, bwd_time=bwd, link_latency=np.array(topo.link_latency),
                     link_bandwidth=np.array(topo.link_bandwidth), source=("hand",) * d)


def fsdp_step(graph, costs, topo, group, m: int = 1, mode=None) -> float:
    plan = StagePlan(stage_of_node=[0] * graph.num_nodes, stage_devices=(tuple(group),), num_microbatches=m,
                     sharding="fsdp")
    return simulate_pipeline(graph, costs, topo, plan, mode=mode).step_time


@pytest.mark.parametrize("sharding", ["fsdp", "dp"])
def test_forward_only_group_is_paced_by_its_slow_member_whatever_the_order(sharding: str) -> None:
    topo = mixed_topology(3)
    g = layers(4)
    fwd = np.array([[1.0, 1.0, 1.0, 23.0]] * 4)  # the CPU is 23x slower
    costs = inference_costs(per_device(fwd, np.zeros_like(fwd), topo))
    steps = []
    for group in ((0, 1, 2, 3), (3, 0, 1, 2)):
        plan = StagePlan(stage_of_node=[0] * 4, stage_devices=(group,), num_microbatches=1, sharding=sharding)
        steps.append(simulate_pipeline(g, costs, topo, plan).step_time)
    assert steps[0] == pytest.approx(steps[1])
    assert steps[0] >= 4 * 23.0 / 4 - 1e-9  # the CPU replica's forward over a quarter of the batch


def test_training_fsdp_unit_paced_by_slowest_forward_and_slowest_backward_separately() -> None:
    topo = mixed_topology(1)  # device 0 slow forward, device 1 slow backward
    g = layers(2)
    fwd = np.array([[8.0, 2.0]] * 2)
    bwd = np.array([[2.0, 4.0]] * 2)
    costs = per_device(fwd, bwd, topo)
    no_comm = CostTable(fwd_time=fwd, bwd_time=bwd, link_latency=np.zeros((2, 2)),
                        link_bandwidth=np.full((2, 2), np.inf), source=("hand",) * 2)
    for c in (costs, no_comm):
        a, b = fsdp_step(g, c, topo, (0, 1)), fsdp_step(g, c, topo, (1, 0))
        assert a == pytest.approx(b)
    # without communication: per replica (half the batch) forward max 4 per layer, backward max 2 per layer
    assert fsdp_step(g, no_comm, topo, (1, 0)) == pytest.approx(2 * 4.0 + 2 * 2.0)


def test_inference_pipeline_sends_no_gradients_and_keeps_no_training_state() -> None:
    topo = mixed_topology(3)
    g = layers(4)
    fwd = np.array([[1.0, 1.0, 1.0, 5.0]] * 4)
    costs = per_device(fwd, 2 * fwd, topo)
    plan = StagePlan(stage_of_node=[0, 0, 1, 1], stage_devices=((0,), (1,)), num_microbatches=4)
    train = simulate_pipeline(g, costs, topo, plan, timeline=True)
    inf = simulate_pipeline(g, costs, topo, plan, timeline=True, mode="inference")
    assert inf.meta["mode"] == "inference"
    assert not [iv for iv in inf.timeline if iv.kind in ("grad_transfer", "allreduce") or
                (iv.kind == "bwd" and iv.end > iv.start)]
    # forwards stream: 2 stages of 0.5 per micro-batch, 4 micro-batches, one transfer of 1e6/4 bytes each
    link = 1e-6 + 1e6 / 4 / 1e10
    assert inf.step_time == pytest.approx(5 * 0.5 + link)
    assert inf.step_time < train.step_time
    assert np.all(inf.peak_memory[:2] == pytest.approx(2 * 40 * MIB + np.array([0.0, 1e6 / 4])))
    assert simulate_pipeline(g, inference_costs(costs), topo, plan).step_time == pytest.approx(inf.step_time)


def slow_cpu_case(n: int = 12, fast: int = 6, slow: float = 23.0, batch: int | None = None):
    topo = mixed_topology(fast)
    nodes = [dict(name=f"l{i}", bwd_flops=1.0, param_bytes=1e6, act_bytes=1e6) for i in range(n)]
    meta = {"batch_size": batch} if batch else {}
    g = make_graph(nodes, [(i, i + 1, 1e5) for i in range(n - 1)], meta=meta)
    fwd = np.ones((n, fast + 1)) * (1.0 + 0.1 * np.arange(n))[:, None]
    fwd[:, -1] *= slow
    return g, per_device(fwd, 2 * fwd, topo), topo


@pytest.mark.parametrize("name", ["hybrid", "pp_params", "pp_uniform"])
def test_fixed_shape_planners_leave_a_slow_device_out_on_a_prime_cluster(name: str) -> None:
    """D = 7 (prime): 6 accelerators and a CPU 23x slower. The planner must do at least as well as on the 6
    accelerators alone (it used to force pp x dp = 7, making the CPU a stage or a replica)."""
    from placement_rl import baselines

    g, costs, topo = slow_cpu_case()
    sub = topo.subset(range(6))
    sub_costs = CostTable(fwd_time=costs.fwd_time[:, :6], bwd_time=costs.bwd_time[:, :6],
                          link_latency=costs.link_latency[:6, :6], link_bandwidth=costs.link_bandwidth[:6, :6],
                          source=("hand",) * 6)
    planner = baselines.get_pipeline(name)
    full = planner(g, costs, topo, budget=5000, seed=0)
    alone = planner(g, sub_costs, sub, budget=5000, seed=0)
    t_full = simulate_pipeline(g, costs, topo, full).step_time
    t_alone = simulate_pipeline(g, sub_costs, sub, alone).step_time
    assert t_full <= t_alone * (1 + 1e-9)
    assert 6 not in {d for grp in full.stage_devices for d in grp}


@pytest.mark.parametrize("name", ["fsdp", "hybrid", "exact"])
def test_planners_do_not_return_a_cpu_paced_fsdp_group_priced_at_accelerator_speed(name: str) -> None:
    """Forward-only graph, 3 accelerators and a CPU 23x slower: the plan a planner returns is priced by its
    slowest member, so no planner but ``fsdp`` (all devices by definition) puts the CPU in a group."""
    from placement_rl import baselines

    topo = mixed_topology(3)
    g = layers(8)
    fwd = np.array([[1.0, 1.0, 1.0, 23.0]] * 8)
    costs = inference_costs(per_device(fwd, np.zeros_like(fwd), topo))
    plan = baselines.get_pipeline(name)(g, costs, topo, budget=3000, seed=0)
    true = simulate_pipeline(g, costs, topo, plan).step_time
    assert plan.meta["step_time"] == pytest.approx(true)
    if name == "fsdp":
        assert true >= 8 * 23.0 / 4 - 1e-9  # the CPU's quarter of the batch
    else:
        assert not any(3 in grp and len(grp) > 1 for grp in plan.stage_devices)
        assert true <= 8 * 1.0 / 3 + 1.0  # about the three accelerators' speed


@pytest.mark.parametrize("planner", ["hybrid", "pp_time_dp", "pipedream"])
def test_cuts_keep_a_small_fast_device_within_its_memory(planner: str) -> None:
    """A fast device with little memory beside a slow one with much: the time-balanced cuts put 6 of 8 layers on
    the fast device, past its memory (the planners' plans did not fit, and nor did any other shape); the cuts they
    take now are the least bottleneck among those that fit, a plan of the same shape that does."""
    from placement_rl import baselines

    topo = DeviceTopology.from_dict({
        "name": "small_fast", "devices": [
            {"name": "fast", "count": 1, "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 1e12,
             "memory_bytes": 13 * 40 * MIB},
            {"name": "slow", "count": 1, "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 1e12,
             "memory_bytes": 1e12}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-6}}})
    g = layers(8)  # 4 x 40 MiB of training state per layer: at most 3 layers on the fast device
    fwd = np.array([[1.0, 3.0]] * 8)
    costs = per_device(fwd, 2 * fwd, topo)
    plan = baselines.get_pipeline(planner)(g, costs, topo, budget=10**4, seed=0)
    res = simulate_pipeline(g, costs, topo, plan)
    assert res.feasible and plan.num_stages == 2
    fast = plan.stage_devices.index((0,))
    assert (plan.stage_of_node == fast).sum() == 3  # as many as fit


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_hybrid_where_no_cut_fits_keeps_the_time_balanced_cuts(schedule: str) -> None:
    """Where no stage of any split fits its devices, the memory-kept cuts' DP has only infinite costs (its argmin
    gave empty stages, and ``hybrid`` an ``IndexError``): the time-balanced cuts are kept, simulated as not fitting."""
    from placement_rl import baselines

    topo = DeviceTopology.from_dict({
        "name": "tiny", "devices": [{"name": "gpu", "count": 3, "kind": "gpu", "peak_flops": 1e13,
                                     "mem_bandwidth": 1e12, "memory_bytes": 5e9}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-6}}})
    g = layers(3, params=3e9)  # 12 GB of training state per layer: nothing fits anywhere
    fwd = np.array([[1.0, 1.5, 2.0]] * 3)
    costs = per_device(fwd, 2 * fwd, topo)
    plan = baselines.get_pipeline("hybrid")(g, costs, topo, budget=10**4, seed=0, schedule=schedule)
    assert not simulate_pipeline(g, costs, topo, plan).feasible
