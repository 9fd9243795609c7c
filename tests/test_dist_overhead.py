"""Wrapper costs of DDP / FSDP2 on gloo: the fit, the prediction of a deployed plan, and a real measurement."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.errors import ProfileError
from placement_rl.graph import synthetic
from placement_rl.plans import StagePlan
from placement_rl.cost import CostTable, simulate_pipeline
from placement_rl.graph.ir import make_graph
from placement_rl.profiling.deploy_predict import (collective_links, predict_deploy_step, stage_boundary_bytes,
                                                   with_links, with_pipeline_overhead, with_tp_dispatch)
from placement_rl.profiling.dist_overhead import (KINDS, PP_MICRO, PP_WIDEN, DistOverheads, fit_dist_overheads,
                                                  measure_dist_overheads, measure_tp_collectives)
from placement_rl.topology import load_topology


def synthetic_raw(a: float, b: float, c: float, d: float) -> dict:
    """Medians as a host with per-pass DDP cost a/2 + b/2 per tensor, FSDP a + b per tensor, DTensor Adam c + d;
    TP 2a + 2b per tensor per pass and Adam c + d over its DTensors."""
    rows = []
    for k in (2, 8, 32):
        t = 2 * k
        plain, adam = 1e-4 * k, 5e-5 * k
        rows.append({"k": k, "tensors": t, "plain_pass": plain, "ddp_pass": plain + a / 2 + b / 2 * t,
                     "fsdp_pass": plain + a + b * t, "plain_adam": adam, "ddp_adam": adam,
                     "fsdp_adam": adam / 2 + c + d * t, "half_pass": plain / 2,
                     "tp_pass": plain / 2 + 2 * a + 2 * b * t, "half_adam": adam / 2, "tp_adam": adam / 2 + c + d * t})
    sizes = [2 ** 10, 2 ** 16, 2 ** 22]
    pipeline = [{"widen": w, "m": m, "bytes": 2048.0 * w,
                 "pipe": [1e-4 * m + 3e-4 + m * (5e-4 + 2e-9 * 2048 * w) + j * 1e-5 for j in range(2)],
                 "plain": [1e-4 * m + j * 1e-5 for j in range(2)]} for w in (1, 32) for m in (1, 2, 4, 8)]
    return {"rows": rows, "sizes": sizes, "backend": "gloo", "pipeline": pipeline,
            "collectives": {k: [1e-5 + s / 1e9 for s in sizes] for k in KINDS}}


def test_fit_recovers_the_per_tensor_lines_and_round_trips():
    o = fit_dist_overheads(synthetic_raw(2e-3, 5e-5, 1e-4, 3e-4))
    np.testing.assert_allclose(o.fsdp_pass, (2e-3, 5e-5), rtol=1e-6)
    np.testing.assert_allclose(o.ddp_pass, (1e-3, 2.5e-5), rtol=1e-6)
    np.testing.assert_allclose(o.fsdp_adam, (1e-4, 3e-4), rtol=1e-6)
    np.testing.assert_allclose(o.tp_pass, (4e-3, 1e-4), rtol=1e-6)
    np.testing.assert_allclose(o.tp_adam, (1e-4, 3e-4), rtol=1e-6)
    assert o.collective_seconds("all_gather", 2 ** 16) == pytest.approx(1e-5 + 2 ** 16 / 1e9, rel=1e-9)
    assert o.collective_seconds("all_reduce", 2 ** 24) > o.collective_seconds("all_reduce", 2 ** 22)
    np.testing.assert_allclose(o.pp_stage, (3e-4, 5e-4, 2e-9), rtol=1e-6)
    assert DistOverheads.from_dict(o.to_dict()) == o
    old = {k: v for k, v in o.to_dict().items() if k != "pp_stage"}  # a record written before the pipeline term
    assert DistOverheads.from_dict(old).pp_stage == (0.0, 0.0, 0.0)
    with pytest.raises(ProfileError, match="malformed"):
        DistOverheads.from_dict({"backend": "gloo"})


def test_prediction_adds_wrappers_adam_and_oversubscription():
    g = synthetic.sample("transformer_like", num_nodes=40, seed=0)
    o = fit_dist_overheads(synthetic_raw(2e-3, 5e-5, 1e-4, 3e-4))
    n = g.num_nodes
    tensors = 2.0 * np.count_nonzero(g.param_bytes)
    one = StagePlan(stage_of_node=np.zeros(n, dtype=np.int64), stage_devices=((0,),), num_microbatches=1,
                    schedule="gpipe", batch_size=16)
    fsdp = StagePlan(stage_of_node=np.zeros(n, dtype=np.int64), stage_devices=((0, 1),), num_microbatches=2,
                     schedule="gpipe", batch_size=16, sharding="fsdp")
    ddp = StagePlan(stage_of_node=np.zeros(n, dtype=np.int64), stage_devices=((0, 1),), num_microbatches=2,
                    schedule="gpipe", batch_size=16)
    # one process: nothing but the simulated step and plain Adam
    assert predict_deploy_step(0.05, plan=one, graph=g, adam_seconds=0.01, overheads=o)["predicted_s"] == \
        pytest.approx(0.06)
    got = predict_deploy_step(0.05, plan=fsdp, graph=g, adam_seconds=0.01, overheads=o, cores=2)
    assert got["wrapper_s"] == pytest.approx(2 * (2e-3 + 5e-5 * tensors))
    assert got["optimizer_s"] == pytest.approx(0.005 + 1e-4 + 3e-4 * tensors)
    assert got["predicted_s"] == pytest.approx(0.05 + got["wrapper_s"] + got["optimizer_s"])
    d = predict_deploy_step(0.05, plan=ddp, graph=g, adam_seconds=0.01, overheads=o, cores=2)
    assert d["wrapper_s"] == pytest.approx(2 * (1e-3 + 2.5e-5 * tensors)) and d["optimizer_s"] == pytest.approx(0.01)
    # TP: the split nodes pay the TP terms, the stage's plain Adam is one rank's share of the split parameters
    split = g.param_bytes > 0
    tp = StagePlan(stage_of_node=np.zeros(n, dtype=np.int64), stage_devices=((0, 1),), num_microbatches=2,
                   schedule="gpipe", batch_size=16, tp=(2,))
    t = predict_deploy_step(0.05, plan=tp, graph=g, adam_seconds=0.01, overheads=o, tp_split=split, cores=2)
    assert t["wrapper_s"] == pytest.approx(2 * (4e-3 + 1e-4 * tensors))
    assert t["optimizer_s"] == pytest.approx(0.005 + 1e-4 + 3e-4 * tensors)
    # the same plan on one core: two processes share it
    assert predict_deploy_step(0.05, plan=ddp, graph=g, adam_seconds=0.01, overheads=o, cores=1)["predicted_s"] == \
        pytest.approx(2 * d["predicted_s"])


def test_links_from_the_measured_tp_all_reduce_price_the_collectives():
    """A measured 2-rank all-reduce of exactly ``2 L + n / B`` gives links (L, B); with them the simulator's
    collectives price 2 ranks as measured and 4 by the ring / tree rules."""
    from placement_rl.cost.collectives import collective_time

    lat, bw = 3e-4, 2e9
    raw = synthetic_raw(2e-3, 5e-5, 1e-4, 3e-4)
    raw["tp_all_reduce"] = [2 * lat + s / bw for s in raw["sizes"]]
    o = fit_dist_overheads(raw)
    assert DistOverheads.from_dict(o.to_dict()) == o
    got = collective_links(o)
    np.testing.assert_allclose(got, (lat, bw), rtol=1e-6)
    import yaml

    from placement_rl.topology import DeviceTopology, conf_dir

    data = yaml.safe_load((conf_dir() / "topology" / "2x_cpu.yaml").read_text())
    data["devices"][0]["count"] = 4
    topo = DeviceTopology.from_dict(data)
    n = 4
    costs = with_links(CostTable(fwd_time=np.ones((1, n)), bwd_time=np.ones((1, n)), link_latency=np.zeros((n, n)),
                                 link_bandwidth=np.full((n, n), np.inf), source=("hand",) * n), *got)
    for size in (1e3, 1e6):
        assert collective_time("allreduce", size, [0, 1], topo, costs) == pytest.approx(2 * lat + size / bw)
        assert collective_time("allreduce", size, [0, 1, 2, 3], topo, costs) == pytest.approx(
            min(6 * lat + 1.5 * size / bw, 4 * lat + 2 * size / bw))
    # a curve measured over 4 ranks: links that make the simulator's own 4-rank price match it
    four = [min(6 * lat + 1.5 * n / bw, 4 * lat + 2 * n / bw) for n in raw["sizes"]]
    got4 = collective_links((raw["sizes"], four), ranks=4)
    np.testing.assert_allclose(got4, (lat, bw), rtol=1e-4)
    with pytest.raises(ProfileError, match="tp_all_reduce"):
        collective_links(fit_dist_overheads(synthetic_raw(2e-3, 5e-5, 1e-4, 3e-4)))


def test_core_sharing_slows_compute_not_links():
    from placement_rl.profiling.deploy_predict import core_sharing, with_core_sharing

    n = 3
    costs = CostTable(fwd_time=np.full((n, 2), 1e-3), bwd_time=np.full((n, 2), 2e-3),
                      link_latency=np.array([[0.0, 1e-5], [1e-5, 0.0]]),
                      link_bandwidth=np.array([[np.inf, 1e9], [1e9, np.inf]]), source=("hand", "hand"))
    plan4 = StagePlan(np.zeros(n, dtype=np.int64), ((0, 1, 2, 3),), tp=(2,))
    assert core_sharing(plan4, 2) == 2.0 and core_sharing(plan4, 8) == 1.0
    slow = with_core_sharing(costs, 2.0)
    np.testing.assert_allclose(slow.fwd_time, 2e-3) and np.testing.assert_allclose(slow.bwd_time, 4e-3)
    assert np.array_equal(slow.link_latency, costs.link_latency) and with_core_sharing(costs, 1.0) is costs


def test_measured_tp_dispatch_is_paid_whole_by_every_micro_batch():
    """``with_tp_dispatch`` puts a TP stage's measured DTensor cost per pass on the nodes a TP rank runs whole: the
    simulated one-stage TP step grows by exactly m passes' cost; with the measured DTensor Adam cost the prediction
    adds it and no fitted TP term."""
    from placement_rl.cost import resolve_costs
    from placement_rl.graph.capture import capture_zoo

    g = capture_zoo("gpt", batch_size=4, seq_len=8, vocab_size=32, d_model=16, n_layers=2, n_heads=2, dropout=0.0)
    topo = load_topology("2x_cpu")
    costs = resolve_costs(g, topo)
    o = fit_dist_overheads(synthetic_raw(2e-3, 5e-5, 1e-4, 3e-4))
    for m in (1, 2, 4):
        plan = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), num_microbatches=m, batch_size=4)
        base = simulate_pipeline(g, costs, topo, plan).step_time
        more = simulate_pipeline(g, with_tp_dispatch(costs, plan, g, [7e-3]), topo, plan).step_time
        assert more - base == pytest.approx(m * 7e-3, rel=1e-9)
        got = predict_deploy_step(more, plan=plan, graph=g, adam_seconds=0.0, overheads=o, cores=2,
                                  tp_adam_seconds=[2e-3])
        assert got["wrapper_s"] == 0.0 and got["optimizer_s"] == pytest.approx(2e-3)
        assert got["predicted_s"] == pytest.approx(more + 2e-3)
    with pytest.raises(ProfileError, match="stages"):
        with_tp_dispatch(costs, plan, g, [1e-3, 1e-3])


def chain(n: int, out_bytes: float = 1e3):
    nodes = [dict(name=f"n{i}", fwd_flops=1.0, bwd_flops=2.0, out_bytes=out_bytes, param_bytes=1e3, act_bytes=1e3)
             for i in range(n)]
    edges = [(f"n{i}", f"n{i + 1}", out_bytes) for i in range(n - 1)] + [("n0", "n3", out_bytes)]
    return make_graph(nodes, edges, name="chain")


def test_boundary_bytes_follow_the_simulators_rule_at_the_micro_batch():
    g = chain(6)  # n0 feeds n1 (stage 0) and n3 (stage 1); n2 feeds n3: two values cross the cut
    cut = np.array([0, 0, 0, 1, 1, 1])
    plan = StagePlan(stage_of_node=cut, stage_devices=((0,), (1,)), num_microbatches=2, schedule="gpipe",
                     batch_size=8)
    np.testing.assert_allclose(stage_boundary_bytes(plan, g), [1e3, 1e3])  # 2 values x 1e3 bytes / 2 micro-batches
    dp = StagePlan(stage_of_node=cut, stage_devices=((0, 2), (1, 3)), num_microbatches=1, schedule="gpipe",
                   batch_size=8)
    np.testing.assert_allclose(stage_boundary_bytes(dp, g), [1e3, 1e3])  # per replica: half the batch
    one = StagePlan(stage_of_node=np.zeros(6, dtype=np.int64), stage_devices=((0,),), num_microbatches=2,
                    schedule="gpipe", batch_size=8)
    np.testing.assert_allclose(stage_boundary_bytes(one, g), [0.0])
    three = StagePlan(stage_of_node=np.array([0, 0, 1, 2, 2, 2]), stage_devices=((0,), (1,), (2,)),
                      num_microbatches=1, schedule="gpipe", batch_size=8)
    # boundary 0|1: n0 (to n3, passed along) and n1; boundary 1|2: n0 and n2. Stage 1 receives 2 and sends 2
    np.testing.assert_allclose(stage_boundary_bytes(three, g), [2e3, 4e3, 2e3])


def test_pipeline_overhead_is_paid_per_micro_batch_by_each_stage():
    """Each stage's nodes carry its schedule cost per micro-batch (half forward, half backward); a simulated
    GPipe step of two stages grows by at least m and at most m + 1 per-micro-batch costs."""
    g, n = chain(6), 6
    o = fit_dist_overheads(synthetic_raw(2e-3, 5e-5, 1e-4, 3e-4))
    costs = CostTable(fwd_time=np.full((n, 2), 1e-3), bwd_time=np.full((n, 2), 2e-3),
                      link_latency=np.array([[0.0, 1e-5], [1e-5, 0.0]]),
                      link_bandwidth=np.array([[np.inf, 1e9], [1e9, np.inf]]), source=("hand", "hand"))
    topo = load_topology("2x_cpu")
    for m in (1, 2, 4):
        plan = StagePlan(stage_of_node=np.array([0, 0, 0, 1, 1, 1]), stage_devices=((0,), (1,)), num_microbatches=m,
                         schedule="gpipe", batch_size=8)
        per_mb = np.array([o.pp_microbatch_seconds(b) for b in stage_boundary_bytes(plan, g)])
        staged = with_pipeline_overhead(costs, plan, g, o)
        for s in (0, 1):
            sel = plan.stage_of_node == s
            added = (staged.fwd_time - costs.fwd_time)[sel].sum(0) + (staged.bwd_time - costs.bwd_time)[sel].sum(0)
            np.testing.assert_allclose(added, per_mb[s], rtol=1e-12)
        base = simulate_pipeline(g, costs, topo, plan, cost_batch_size=8 / m).step_time
        more = simulate_pipeline(g, staged, topo, plan, cost_batch_size=8 / m).step_time
        assert m * per_mb.min() - 1e-12 <= more - base <= (m + 1) * per_mb.max() + 1e-12
        got = predict_deploy_step(more, plan=plan, graph=g, adam_seconds=0.0, overheads=o, cores=2)
        assert got["predicted_s"] == pytest.approx(more + o.pp_stage[0])  # + the per-step term
    single = StagePlan(stage_of_node=np.zeros(n, dtype=np.int64), stage_devices=((0,),), num_microbatches=2,
                       schedule="gpipe", batch_size=8)
    assert with_pipeline_overhead(costs, single, g, o) is costs


def test_only_gloo_is_measured():
    with pytest.raises(ProfileError, match="gloo"):
        measure_dist_overheads("nccl")


@pytest.mark.slow
@pytest.mark.distributed
def test_real_measurement_on_two_gloo_processes():
    """Two real gloo processes: every median is a positive time and FSDP2 costs more per pass than no wrapper."""
    raw = measure_dist_overheads("gloo", layers=(2, 8), sizes=(2 ** 10, 2 ** 16), repeats=3)
    assert [r["k"] for r in raw["rows"]] == [2, 8]
    for r in raw["rows"]:
        assert all(r[f"{k}_{w}"] > 0 for k in ("plain", "ddp", "fsdp", "half", "tp") for w in ("pass", "adam"))
        assert r["fsdp_pass"] > r["plain_pass"]
    o = fit_dist_overheads(raw)
    assert all(len(o.collectives[k][1]) == 2 and min(o.collectives[k][1]) > 0 for k in KINDS)
    assert o.fsdp_pass[0] + o.fsdp_pass[1] * 4 > 0
    assert len(raw["pipeline"]) == len(PP_WIDEN) * len(PP_MICRO)
    assert all(min(r["pipe"]) > 0 and min(r["plain"]) > 0 for r in raw["pipeline"])
    assert min(o.pp_stage) >= 0
    assert len(o.collectives["tp_all_reduce"][1]) == 2 and min(o.collectives["tp_all_reduce"][1]) >= 0


@pytest.mark.slow
@pytest.mark.distributed
def test_tp_collectives_measured_on_the_plans_process_count():
    got = measure_tp_collectives("gloo", world=4, degrees=(2, 4), sizes=(2 ** 10, 2 ** 18), repeats=1)
    assert set(got) == {2, 4}
    for sizes, times in got.values():
        assert sizes == (2.0 ** 10, 2.0 ** 18) and len(times) == 2 and min(times) >= 0
    with pytest.raises(ProfileError, match="gloo"):
        measure_tp_collectives("nccl")
    with pytest.raises(ProfileError, match="divide"):
        measure_tp_collectives("gloo", world=4, degrees=(3,))
