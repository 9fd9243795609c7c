"""Data-parallel pricing: collectives (ring / tree / hierarchical), DDP bucket overlap, FSDP, memory."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.cost.collectives import collective_coeffs, collective_time
from placement_rl.cost.memory import BUCKET_BYTES, FSDP_GATHER_FACTOR, STATE_FACTOR, stage_state_bytes
from placement_rl.errors import ConfigError, PlanError
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

from tests.test_cost_pipeline import chain, plan, table, topology

MIB = 2.0**20


def test_ring_collectives_match_the_alpha_beta_formulas() -> None:
    topo = load_topology("4x_v100_pcie")
    n = 1e8
    lat, bw = topo.link_latency[0, 1], topo.link_bandwidth[0, 1]
    p = 4
    assert collective_time("allreduce", n, range(p), topo, algorithm="ring") == pytest.approx(
        2 * (p - 1) * lat + 2 * (p - 1) / p * n / bw)
    for kind in ("allgather", "reducescatter"):
        assert collective_time(kind, n, range(p), topo) == pytest.approx((p - 1) * lat + (p - 1) / p * n / bw)
    assert collective_time("allreduce", n, [2], topo) == 0.0
    assert collective_time("allreduce", 0, range(p), topo) == 0.0
    # the tree wins on latency for tiny buffers, the ring on bandwidth for big ones
    small, big = 8.0, 1e9
    assert collective_time("allreduce", small, range(p), topo) == pytest.approx(
        collective_time("allreduce", small, range(p), topo, algorithm="tree"))
    assert collective_time("allreduce", big, range(p), topo) == pytest.approx(
        collective_time("allreduce", big, range(p), topo, algorithm="ring"))


def test_hierarchical_allreduce_across_hosts_beats_a_flat_ring() -> None:
    topo = load_topology("2x4_v100_ib")  # NVLink inside each host, one IB link between hosts
    n = 4e8
    algos = collective_coeffs("allreduce", range(8), topo)
    assert set(algos) == {"ring", "tree", "hierarchical"}
    ring = collective_time("allreduce", n, range(8), topo, algorithm="ring")
    hier = collective_time("allreduce", n, range(8), topo, algorithm="hierarchical")
    ib = topo.link_bandwidth[0, 4]
    assert ring == pytest.approx(2 * 7 * topo.link_latency[0, 4] + 2 * 7 / 8 * n / ib)  # the IB link paces the ring
    assert hier < ring
    assert hier > 2 * 1 / 2 * n / ib  # the inter-host phase alone (one NIC per host)
    assert collective_time("allreduce", n, range(8), topo) == pytest.approx(min(ring, hier))
    assert "hierarchical" not in collective_coeffs("allreduce", range(4), topo)  # one host


def test_collective_bad_input_is_a_config_error() -> None:
    topo = load_topology("4x_v100_pcie")
    with pytest.raises(ConfigError, match="unknown collective"):
        collective_time("broadcast", 1.0, range(2), topo)
    with pytest.raises(ConfigError, match="distinct"):
        collective_time("allreduce", 1.0, [0, 0], topo)
    with pytest.raises(ConfigError, match="does not apply"):
        collective_time("allgather", 1.0, range(2), topo, algorithm="tree")


def test_ddp_overlap_is_shorter_than_serial_and_never_shorter_than_either_part() -> None:
    # 6 nodes of 30 MiB parameters each: one bucket per node, all-reduced while backward continues
    n, d = 6, 2
    g = chain(n, params=30 * MIB)
    bw = 2e9
    costs = table([0.01] * n, [0.02] * n, d, latency=1e-5, bandwidth=bw)
    topo = topology(d)
    res = simulate_pipeline(g, costs, topo, plan([0] * n, [(0, 1)], 1))
    compute = (0.01 + 0.02) * n / d
    allreduce = sum(res.meta["allreduce_time"])
    assert allreduce == pytest.approx(n * (2 * 1e-5 + 30 * MIB / bw))  # p = 2: 2 (p-1)/p = 1
    assert res.step_time < compute + allreduce - 1e-9
    assert res.step_time >= max(compute, allreduce) - 1e-12
    intervals = [iv for iv in simulate_pipeline(g, costs, topo, plan([0] * n, [(0, 1)], 1), timeline=True).timeline
                 if iv.kind == "allreduce"]
    assert len(intervals) == n and intervals[0].start < compute  # the first bucket starts during backward


def test_ddp_overlap_on_resnet18_a100() -> None:
    from placement_rl.evaluate import _zoo
    from placement_rl.graph.spec import graph_from_spec

    g = graph_from_spec(_zoo("resnet18"))
    topo = load_topology("8x_a100_nvswitch")
    costs = resolve_costs(g, topo)
    res = simulate_pipeline(g, costs, topo, plan(np.zeros(g.num_nodes, np.int64), [tuple(range(8))], 1))
    compute = res.meta["stage_fwd_time"][0] + res.meta["stage_bwd_time"][0]
    allreduce = res.meta["allreduce_time"][0]
    assert allreduce > 0 and max(compute, allreduce) <= res.step_time < compute + allreduce


def test_fsdp_memory_is_shards_plus_the_gathered_group() -> None:
    n, d = 4, 4
    params, act = 40 * MIB, 8.0 * MIB
    g = chain(n, params=params, act=act)
    costs = table([0.01] * n, [0.02] * n, d, latency=1e-5, bandwidth=1e10)
    topo = topology(d)
    groups = [tuple(range(d))]
    ddp = simulate_pipeline(g, costs, topo, plan([0] * n, groups, 1))
    fsdp = simulate_pipeline(g, costs, topo, plan([0] * n, groups, 1, sharding="fsdp"))
    total = n * params
    np.testing.assert_allclose(ddp.peak_memory, STATE_FACTOR * total + n * act / d)
    np.testing.assert_allclose(fsdp.peak_memory, STATE_FACTOR * total / d + FSDP_GATHER_FACTOR * params + n * act / d)
    assert stage_state_bytes(total, d, "fsdp", params) == pytest.approx(STATE_FACTOR * total / d
                                                                        + FSDP_GATHER_FACTOR * params)
    assert stage_state_bytes(total, 1, "fsdp", params) == STATE_FACTOR * total
    # gathers and reduce-scatters: never faster than the plain compute, and they are counted as communication
    assert fsdp.step_time >= (0.03 * n) / d
    assert fsdp.meta["allreduce_time"][0] > 0 and fsdp.meta["sharding"] == "fsdp"
    assert params > BUCKET_BYTES  # one unit per node


def test_plan_that_does_not_fit_names_device_and_bytes() -> None:
    g = chain(8, params=2.5e8)
    costs = table([1.0] * 8, [1.0] * 8, 2)
    res = simulate_pipeline(g, costs, topology(2, memory=6e9), plan([0] * 8, [(0, 1)], 1))
    assert not res.feasible
    assert res.meta["memory_errors"][0] == "gpu0 needs 7.45 GiB, has 5.59 GiB"
    ok = simulate_pipeline(g, costs, topology(2, memory=6e9), plan([0] * 8, [(0, 1)], 1, sharding="fsdp"))
    assert ok.feasible and "memory_errors" not in ok.meta


def test_sharding_field_round_trips_and_old_json_reads_as_dp() -> None:
    p = StagePlan(stage_of_node=[0, 0], stage_devices=[(0, 1)], sharding="fsdp")
    q = StagePlan.from_json(p.to_json())
    assert q.sharding == "fsdp"
    old = p.to_dict()
    del old["sharding"]
    import json

    assert StagePlan.from_json(json.dumps(old)).sharding == "dp"
    with pytest.raises(PlanError, match="unknown sharding 'zero'"):
        StagePlan(stage_of_node=[0], stage_devices=[(0,)], sharding="zero")


@pytest.mark.parametrize("seed", range(8))
def test_ddp_step_between_either_part_and_their_sum_on_random_chains(seed) -> None:
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(2, 12)), int(rng.integers(2, 5))
    params = rng.uniform(0, 80, n) * MIB
    from placement_rl.graph.ir import make_graph

    g = make_graph([dict(name=f"n{i}", bwd_flops=1.0, param_bytes=float(params[i])) for i in range(n)],
                   [(i, i + 1, 0.0) for i in range(n - 1)])
    fwd, bwd = rng.uniform(1e-3, 2e-2, n), rng.uniform(1e-3, 4e-2, n)
    costs = table(fwd, bwd, d, latency=float(rng.uniform(0, 1e-4)), bandwidth=float(rng.uniform(1e9, 1e11)))
    m = int(rng.choice([1, 2, 4]))
    res = simulate_pipeline(g, costs, topology(d), plan([0] * n, [tuple(range(d))], m))
    compute = m * (res.meta["stage_fwd_time"][0] + res.meta["stage_bwd_time"][0])
    allreduce = res.meta["allreduce_time"][0]
    assert max(compute, allreduce) - 1e-12 <= res.step_time <= compute + allreduce + 1e-12
