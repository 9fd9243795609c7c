"""Planners with tensor parallelism: tp, megatron and the exact DP x TP x PP search."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl import baselines
from placement_rl.baselines import pipe_tp
from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.errors import ConfigError
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.topology import load_topology

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def case():
    g = capture_zoo("gpt", batch_size=16, seq_len=128, vocab_size=4096, d_model=512, n_layers=4, n_heads=8)
    topo = load_topology("2x4_v100_ib")
    return g, resolve_costs(g, topo), topo


def run(name, g, c, topo, budget=2000):
    plan = baselines.get_pipeline(name)(g, c, topo, budget=budget, seed=0)
    return plan, simulate_pipeline(g, c, topo, plan)


def test_registered():
    assert {"tp", "megatron", "exact"} <= set(baselines.pipeline_names())


@pytest.mark.parametrize("name", ["tp", "megatron"])
def test_tp_and_megatron_plan_on_the_gpus_of_a_cluster_with_a_cpu(case, name):
    """``cpu_2gpu``: the CPU sat in a DP group with the two GPUs (TP 1: no degree divides a host of three), which it
    paced to 0.67 x one GPU; the plan now takes TP 2 over the GPUs and leaves the CPU out."""
    g = case[0]
    topo = load_topology("cpu_2gpu")
    c = resolve_costs(g, topo)
    plan, res = run(name, g, c, topo)
    used = {d for grp in plan.stage_devices for d in grp}
    assert all(topo.devices[d].kind == "gpu" for d in used) and plan.tp == (2,) * plan.num_stages
    one = load_topology("1x_v100_pcie_32gb")
    one_gpu = run("dp", g, resolve_costs(g, one), one)[1].step_time
    assert res.feasible and res.step_time < one_gpu


def test_tp_and_megatron_keep_tp_inside_a_host(case):
    g, c, topo = case
    plan, res = run("tp", g, c, topo)
    assert plan.tp == (4,) and plan.dp_degrees == (2,) and res.feasible
    for grp in plan.tp_groups(0):
        assert len({topo.devices[d].host for d in grp}) == 1
    plan, res = run("megatron", g, c, topo)
    assert set(plan.tp) == {4} and plan.num_stages in (1, 2) and res.feasible


def test_exact_is_never_worse_than_the_plans_inside_its_space(case):
    g, c, topo = case
    best, res = run("exact", g, c, topo)
    assert best.meta["configurations"] > 10 and best.meta["bounds_capped"] >= 0
    for name in ("dp", "fsdp", "tp", "megatron"):
        _, other = run(name, g, c, topo)
        assert res.step_time <= other.step_time + 1e-12, name
    assert best.batch_size == 16 and 16 % (best.num_microbatches * best.dp_degrees[0]) == 0


@pytest.fixture(scope="module")
def small():
    from placement_rl.graph import coarsen

    g = coarsen.coarsen(capture_zoo("gpt", batch_size=8, seq_len=64, vocab_size=1024, d_model=128, n_layers=2,
                                    n_heads=4), max_nodes=8)
    topo = load_topology("4x_v100_nvlink")  # NVLink links of unequal width: each stage's own TP group matters
    c = resolve_costs(g, topo)
    return g, c, topo, PipeProblem(g, c, topo, budget=10**6, seed=0, num_microbatches=1, schedule="1f1b",
                                   batch_size=None)


def every_cut_set(n, s):
    import itertools

    return [[0, *bars, n] for bars in itertools.combinations(range(1, n), s - 1)]


def test_cut_objective_is_the_simulated_step_on_every_plan_of_a_brute_force(small):
    """With one micro-batch per replica and DP degree 1, the analytic objective ``exact``'s cut search minimises is
    the simulator's step time, to float error, on every cut set of every (stages, TP degree), both shardings: stage
    compute on its own devices, the TP all-reduces over its own TP group, skip connections passed along every cut,
    the boundary both ways. (Dropping the TP all-reduces, pricing every stage on the first TP group, or counting only
    the last stage's tensors at a cut each break it.)"""
    g, c, topo, pp = small
    count = 0
    for t in pipe_tp.tp_choices(pp):
        assert t in (1, 2, 4)
        for s in range(1, pp.d // t + 1):
            for cuts in every_cut_set(g.num_nodes, s):
                for sh in ("dp", "fsdp"):
                    est = pipe_tp.cut_objective(pp, cuts, 1, 1, sh, t)
                    sim = simulate_pipeline(g, c, topo, pp.plan(cuts, (1,) * s, m=1, sharding=sh, tp=(t,) * s))
                    assert sim.feasible and est == pytest.approx(sim.step_time, rel=1e-12, abs=0), (t, cuts, sh)
                    count += 1
    assert count == 2 * (1 + 7 + 21 + 35 + 1 + 7 + 1)  # cut sets: TP 1 on 1-4 stages, TP 2 on 1-2, TP 4 on 1


def test_sequence_parallel_in_the_cut_objective_and_in_exact(small):
    """Sequence parallelism in ``exact``'s space: with one micro-batch and DP degree 1 the cut objective of every
    SP plan of a brute force (TP 2 and 4, every cut set) is its simulated step to float error -- a reduce-scatter
    and an all-gather for each all-reduce, the token-wise ops on 1/t of the sequence -- and differs from the same
    plan without SP (pricing SP as plain TP breaks it); ``exact``'s plan is never worse than the best of them."""
    g, c, topo, pp = small
    best, count, differs = np.inf, 0, 0
    for t in pipe_tp.tp_choices(pp)[1:]:
        for s in range(1, pp.d // t + 1):
            for cuts in every_cut_set(g.num_nodes, s):
                plan = pp.plan(cuts, (1,) * s, m=1, tp=(t,) * s, sequence_parallel=True)
                sim = simulate_pipeline(g, c, topo, plan)
                est = pipe_tp.cut_objective(pp, cuts, 1, 1, "dp", t, sequence_parallel=True)
                assert plan.sequence_parallel and est == pytest.approx(sim.step_time, rel=1e-12, abs=0), (t, cuts)
                differs += est != pytest.approx(pipe_tp.cut_objective(pp, cuts, 1, 1, "dp", t), rel=1e-9)
                best = min(best, sim.step_time)
                count += 1
    assert count == 1 + 7 + 1 and differs == count
    plan, res = run("exact", g, c, topo, budget=5000)
    assert res.step_time <= best * (1 + 1e-12)


def test_exact_cut_search_finds_the_brute_force_optimum_exactly(small):
    """For each (stages, TP) at one micro-batch, the cut DP's plan is the best of all cut sets (float error), and
    ``exact``'s plan is never worse than any plan of that brute force."""
    g, c, topo, pp = small
    grid = np.arange(g.num_nodes + 1)
    overall = np.inf
    for t in pipe_tp.tp_choices(pp):
        for s in range(2, pp.d // t + 1):
            brute = min(simulate_pipeline(g, c, topo, pp.plan(cuts, (1,) * s, m=1, tp=(t,) * s)).step_time
                        for cuts in every_cut_set(g.num_nodes, s))
            got, _ = pipe_tp._pipeline_plans(pp, grid, s, t, 1, 1, shardings=("dp",))
            est, plan = min(got, key=lambda x: x[0])
            sim = simulate_pipeline(g, c, topo, pp.plan(plan[0], plan[1], m=1, tp=plan[4]))
            assert est == pytest.approx(sim.step_time, rel=1e-12) and sim.step_time == pytest.approx(brute, rel=1e-12)
            overall = min(overall, brute)
    _, res = run("exact", g, c, topo, budget=5000)
    assert res.step_time <= overall * (1 + 1e-12)


def test_nothing_to_split_and_short_budget():
    g = capture_zoo("resnet18", **dict(zoo.tiny("resnet18"), batch_size=8))
    topo = load_topology("4x_v100_nvlink")
    c = resolve_costs(g, topo)
    plan, _ = run("tp", g, c, topo)
    assert plan.tp == (1,) and "nothing to split" in plan.meta["note"]
    plan, _ = run("exact", g, c, topo, budget=5)  # a short budget simulates the best estimates only
    assert plan.meta["sim_calls"] <= 5 and plan.meta["exhaustive"] is False


def test_evaluate_shows_why_tp_fell_back_to_data_parallelism(case):
    """``tp``'s note (no TP degree > 1: one GPU per host here) reaches the comparison's note column; it was
    dropped, and the row read as plain DP with no reason."""
    from placement_rl import evaluate

    from placement_rl.topology import DeviceTopology

    g = case[0]
    topo = DeviceTopology.from_dict({"name": "two_hosts", "devices": [
        {"name": "a", "kind": "gpu", "model": "V100 SXM2 32GB", "host": 0},
        {"name": "b", "kind": "gpu", "model": "V100 SXM2 32GB", "host": 1}],
        "links": {"intra_host": {"bandwidth": 1e11, "latency": 1e-6},
                  "inter_host": {"bandwidth": 1e10, "latency": 1e-5}}})
    rows = evaluate.compare(g, resolve_costs(g, topo), topo, budget=2000, placers=[], partitioners=("tp",))
    (row,) = [r for r in rows if r.placer == "tp"]
    assert "no TP degree > 1" in row.note, row.note


def _hosts(*sizes):
    from placement_rl.topology import DeviceTopology
    gpu = {"kind": "gpu", "peak_flops": 15.7e12, "mem_bandwidth": 9e11, "memory_bytes": 34359738368}
    return DeviceTopology.from_dict({
        "name": "hosts" + "+".join(map(str, sizes)),
        "devices": [{"name": f"h{h}_gpu", "count": n, "host": h, **gpu} for h, n in enumerate(sizes)],
        "links": {"intra_host": {"bandwidth": 5e10, "latency": 5e-6}, "inter_host": {"bandwidth": 1.25e10,
                                                                                     "latency": 2e-5}}})


@pytest.mark.parametrize("sizes, t, used", [((8, 1), 8, 8), ((6, 4), 2, 10)])
def test_tp_degrees_per_host_prefix_not_the_smallest_host(case, sizes, t, used):
    """Hosts of 8 + 1 GPUs: TP stayed 1 on all nine (the smallest host decided); TP 8 runs on the 8 now. Hosts of
    6 + 4: TP 4 divided the smallest host, so a plan on 8 devices put a TP group across the two hosts; 4 is offered
    only on the first host's 4 now, and the widest plan (TP 2) takes all ten."""
    g = case[0]
    topo = _hosts(*sizes)
    c = resolve_costs(g, topo)
    pp = PipeProblem(g, c, topo, budget=10, seed=0, num_microbatches=1, schedule="1f1b", batch_size=None)
    assert pipe_tp.usable(pp, t) == used
    for name in ("tp", "megatron"):
        plan, res = run(name, g, c, topo)
        assert res.feasible
        for s in range(plan.num_stages):
            for grp in plan.tp_groups(s):
                assert len({topo.devices[d].host for d in grp}) == 1
    for s, dp, tt, m in pipe_tp.configurations(pp):
        assert s * dp * tt <= pipe_tp.usable(pp, tt)
    if sizes == (8, 1):
        assert run("tp", g, c, topo)[0].tp == (8,) and 8 in {tt for _, _, tt, _ in pipe_tp.configurations(pp)}


def test_tp_leaves_the_fewest_devices_idle():
    """10 heads on 8 GPUs of one host: TP 5 would leave three idle; the `tp` and `megatron` baselines take TP 2."""
    g = capture_zoo("gpt", batch_size=16, seq_len=16, vocab_size=640, d_model=80, n_layers=2, n_heads=10)
    topo = load_topology("8x_h100_dgx")
    c = resolve_costs(g, topo)
    for name in ("tp", "megatron"):
        plan, _ = run(name, g, c, topo, budget=200)
        assert set(plan.tp) == {2} and sum(len(d) for d in plan.stage_devices) == 8
