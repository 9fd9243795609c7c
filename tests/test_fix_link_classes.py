"""Stage planners where the links differ between equal devices (the NVLink mesh of a DGX-1).

On the ``4x_v100_nvlink`` preset GPU pairs 0-3, 1-2 and 2-3 have two NVLinks (50 GB/s), pairs 0-1, 0-2 and 1-3 one
(25 GB/s). The planners took equal GPUs as interchangeable and handed them out in index order: ``pp_exhaustive``
returned DDP on (0, 1) at 8.14 ms where DDP on (0, 3) is 6.44 ms, ``exact`` (meta: every contiguous plan simulated)
was beaten by 5.8% by a plan of its own space, and ``hybrid`` on the ``8x_v100_dgx1`` preset picked the same
one-NVLink pair. Devices are now interchangeable only where a swap of the two leaves the links unchanged.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.baselines.pipe_common import PipeProblem, microbatch_choices
from placement_rl.baselines.pipe_ideals import cost_classes, device_classes, restrictions, split_classes
from placement_rl.baselines.pipe_orders import device_orders, order_space
from placement_rl.baselines.pipeline import FASTEST_FIRST_ONLY
from placement_rl.cost import PipelineSimulator, resolve_costs
from placement_rl.graph import capture, coarsen, synthetic, zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology, load_topology


def gpt(nodes: int):
    """The zoo GPT at d_model 1024, batch 2, sequence 256, coarsened to ``nodes`` nodes: DDP's gradient all-reduce
    is most of a step, so the link between the two replicas decides it."""
    module, inputs = zoo.build("gpt", batch_size=2, seq_len=256, d_model=1024, n_layers=2, n_heads=4, vocab_size=4096)
    return coarsen.coarsen(capture.capture(module, inputs), max_nodes=nodes)


def plan_of(graph, cuts, groups, m, sharding, schedule, batch) -> StagePlan:
    order = np.asarray(graph.topo_order)
    stage = np.empty(graph.num_nodes, dtype=np.int64)
    for k in range(len(cuts) - 1):
        stage[order[cuts[k]:cuts[k + 1]]] = k
    return StagePlan(stage_of_node=stage, stage_devices=tuple(groups), num_microbatches=m, schedule=schedule,
                     batch_size=batch, sharding=sharding)


def brute_force(graph, costs, topo, schedule: str, batch: int | None) -> float:
    """Least step time over every contiguous plan: segments of ``topo_order`` x any disjoint device subset per stage
    (devices may be left out) x the micro-batch counts the planners search x DDP / FSDP (every plan here fits)."""
    sim = PipelineSimulator(graph, costs, topo)
    n, d = graph.num_nodes, topo.num_devices
    best = np.inf
    for s in range(1, min(n, d) + 1):
        for bars in itertools.combinations(range(1, n), s - 1):
            for label in itertools.product(range(s + 1), repeat=d):  # device -> stage (s: unused)
                groups = [tuple(x for x in range(d) if label[x] == k) for k in range(s)]
                if not all(groups):
                    continue
                for m in microbatch_choices(s, 1, None, schedule=schedule):
                    if batch is not None and any(batch % (m * len(g)) for g in groups):
                        continue
                    for sh in ("dp", "fsdp") if max(map(len, groups)) > 1 else ("dp",):
                        res = sim.run(plan_of(graph, [0, *bars, n], groups, m, sh, schedule, batch))
                        assert res.feasible
                        best = min(best, float(res.step_time))
    return best


def step(graph, costs, topo, plan: StagePlan) -> float:
    return float(PipelineSimulator(graph, costs, topo).run(plan).step_time)


CASES = [("transformer_like", 2, 6, "gpipe"), ("dataflow", 4, None, "gpipe"), ("cnn_like", 3, None, "gpipe")]


@pytest.mark.parametrize("family,seed,batch,schedule", CASES)
def test_exact_and_pp_exhaustive_are_never_beaten_by_a_contiguous_plan_on_nvlink_pairs(family, seed, batch,
                                                                                       schedule):
    """Synthetic 5-node graphs on 4 V100s of a DGX-1 quad, where ``exact`` was 5.8%, 3.7% and 1.9% above the brute
    force with ``contiguous_enumerated`` true: now at most the brute force's optimum, and both say so."""
    topo = load_topology("4x_v100_nvlink")
    graph = synthetic.sample(family, num_nodes=5, seed=seed)
    costs = resolve_costs(graph, topo)
    best = brute_force(graph, costs, topo, schedule, batch)
    for name in ("exact", "pp_exhaustive"):
        plan = baselines.get_pipeline(name)(graph, costs, topo, budget=200000, seed=0, schedule=schedule,
                                            num_microbatches=1, batch_size=batch)
        assert step(graph, costs, topo, plan) <= best * (1 + 1e-9), name
        assert plan.meta.get("contiguous_enumerated", True) and "note" not in plan.meta, name


def test_pp_exhaustive_takes_the_two_nvlink_pair_for_ddp():
    """GPT on 4 V100s, batch 2 (DP degree at most 2): ``pp_exhaustive`` returned DDP on (0, 1), one NVLink, 8.14 ms;
    a pair with two NVLinks takes 6.44 ms, and so does its plan now (the brute force's optimum)."""
    topo = load_topology("4x_v100_nvlink")
    graph = gpt(5)
    costs = resolve_costs(graph, topo)
    best = brute_force(graph, costs, topo, "1f1b", 2)
    plan = baselines.get_pipeline("pp_exhaustive")(graph, costs, topo, budget=200000, seed=0, num_microbatches=2,
                                                   batch_size=2)
    assert step(graph, costs, topo, plan) == pytest.approx(best, rel=1e-9)
    assert "note" not in plan.meta
    ddp01 = plan_of(graph, [0, graph.num_nodes], [(0, 1)], 1, "dp", "1f1b", 2)
    assert best < 0.85 * step(graph, costs, topo, ddp01)


def test_hybrid_on_a_dgx1_replicates_on_a_pair_with_two_nvlinks():
    """8 V100s of a DGX-1, batch 2: ``hybrid`` (and ``pp_exhaustive``) took DDP on (0, 1), one NVLink, 21% slower
    than on a pair with two; now their plans are at least as fast as DDP on the best of the 28 pairs."""
    topo = load_topology("8x_v100_dgx1")
    graph = gpt(4)
    costs = resolve_costs(graph, topo)
    pairs = {p: step(graph, costs, topo, plan_of(graph, [0, graph.num_nodes], [p], 1, "dp", "1f1b", 2))
             for p in itertools.combinations(range(8), 2)}
    best = min(pairs.values())
    assert pairs[(0, 1)] > 1.2 * best
    hybrid = baselines.get_pipeline("hybrid")(graph, costs, topo, budget=20000, seed=0)
    assert hybrid.meta["step_time"] <= best * (1 + 1e-9)
    (group,) = hybrid.stage_devices
    assert len(group) == 2 and topo.link_bandwidth[group[0], group[1]] == 50e9
    plan = baselines.get_pipeline("pp_exhaustive")(graph, costs, topo, budget=200000, seed=0, num_microbatches=1,
                                                   batch_size=2)
    assert plan.meta["step_time"] <= best * (1 + 1e-9)


def test_eight_distinct_gpus_are_searched_in_bounds_and_said_not_every_order():
    """On the DGX-1 every GPU is its own class: every order of 8 classes is far over any budget, so ``exact`` and
    ``pp_exhaustive`` take the fastest-first runs with their devices also picked best-connected, and say that this
    is not every contiguous plan."""
    topo = load_topology("8x_v100_dgx1")
    graph = synthetic.sample("layered", num_nodes=4, seed=0)
    costs = resolve_costs(graph, topo)
    exact = baselines.get_pipeline("exact")(graph, costs, topo, budget=20000, seed=0)
    assert exact.meta["contiguous_enumerated"] is False and "links differ" in exact.meta["note"]
    exhaustive = baselines.get_pipeline("pp_exhaustive")(graph, costs, topo, budget=200000, seed=0)
    assert FASTEST_FIRST_ONLY in exhaustive.meta["note"] and "best-connected" in exhaustive.meta["note"]
    assert exhaustive.meta["sim_calls"] < 20000


def _pairwise(pp: PipeProblem) -> list[list[int]]:
    """Classes by the definition: equal cost columns, memory and restrictions, and a swap that keeps both link
    matrices (each pair checked with the whole permuted matrix)."""
    allowed = restrictions(pp)[0]
    lat, bw = np.asarray(pp.costs.link_latency), np.asarray(pp.costs.link_bandwidth)
    out = []
    for members in cost_classes(pp, allowed):
        for x in members:
            for cls in out:
                perm = np.arange(pp.d)
                perm[[x, cls[0]]] = perm[[cls[0], x]]
                if cls[0] in members and all(np.array_equal(m[np.ix_(perm, perm)], m) for m in (lat, bw)):
                    cls.append(x)
                    break
            else:
                out.append([x])
    return sorted(out, key=lambda c: c[0])


def _problem(topo: DeviceTopology) -> PipeProblem:
    graph = synthetic.sample("layered", num_nodes=4, seed=0)
    return PipeProblem(graph, resolve_costs(graph, topo), topo, budget=1, seed=0, num_microbatches=1,
                       schedule="1f1b", batch_size=None)


def _hosts(hosts: int, per_host: int, nvlink: dict | None = None) -> DeviceTopology:
    names = [f"h{h}_gpu{k}" for h in range(hosts) for k in range(per_host)]
    pairs = [{"between": [names[a], names[b]], "bandwidth": bw, "latency": 5e-6}
             for (a, b), bw in (nvlink or {}).items()]
    return DeviceTopology.from_dict({
        "name": "hosts", "devices": [dict(name=f"h{h}_gpu", count=per_host, kind="gpu", host=h, peak_flops=1e14,
                                          mem_bandwidth=1e12, memory_bytes=8e10) for h in range(hosts)],
        "links": {"intra_host": {"bandwidth": 3e11, "latency": 5e-6},
                  "inter_host": {"bandwidth": 5e10, "latency": 2e-5}, "pairs": pairs}})


@pytest.mark.parametrize("topo", ["8x_a100_dgx", "4x_h100_nvlink", "2x_cpu", "cpu_2gpu", "4x_v100_nvlink",
                                  "8x_v100_dgx1", "2x4_v100_ib", "hosts", "hosts_pairs"])
def test_device_classes_are_the_swaps_that_keep_the_links(topo: str) -> None:
    """Equal devices on alike links keep their classes (so their plans are the ones they were: no order or choice
    to add); a DGX-1 quad splits into 4, two hosts into a class each, a faster pair inside a host into its own."""
    t = {"hosts": _hosts(2, 4), "hosts_pairs": _hosts(2, 4, {(0, 1): 1e12, (4, 5): 1e12, (2, 3): 1e12})}.get(topo)
    pp = _problem(t or load_topology(topo))
    classes = device_classes(pp, restrictions(pp)[0])
    assert sorted(classes) == _pairwise(pp)
    expected = {"4x_v100_nvlink": [[0], [1], [2], [3]], "8x_v100_dgx1": [[k] for k in range(8)],
                "2x4_v100_ib": [[k] for k in range(8)], "hosts": [[0, 1, 2, 3], [4, 5, 6, 7]],
                "hosts_pairs": [[0, 1], [2, 3], [4, 5], [6, 7]]}
    if topo in expected:
        assert sorted(classes) == expected[topo] and split_classes(pp) is not None
    else:
        assert classes == cost_classes(pp, restrictions(pp)[0]) and split_classes(pp) is None
        if len(classes) == 1:
            assert order_space(pp, cap=10**6)[0] == 0 and device_orders(pp, cap=10**6)[:1] == (0,)


def test_every_order_is_counted_as_listed_on_a_dgx1_quad() -> None:
    """``order_space``'s count (bounded first by a dynamic program, which must never exceed it) equals its listing."""
    pp = _problem(load_topology("4x_v100_nvlink"))
    total, plans = order_space(pp, cap=10**6)
    assert 0 < total == sum(1 for _ in plans)
    over, none = order_space(pp, cap=total - 1)
    assert over > total - 1 and next(none, None) is None


def test_compositions_of_many_classes_do_not_overflow_into_an_enumeration():
    """64 hosts of 8 equal GPUs are 64 classes: the product of their sizes overflowed int64 in numpy, came out small
    and every composition was listed (a MemoryError at 512 devices)."""
    from placement_rl.baselines.pipe_ideals import MAX_COMPOSITIONS, compositions

    comps = compositions([8] * 64)
    assert comps.shape[1] == 64 and 0 < len(comps) <= 64 * 5
    assert len(compositions([1, 2])) == 5 <= MAX_COMPOSITIONS  # small spaces are still listed whole
