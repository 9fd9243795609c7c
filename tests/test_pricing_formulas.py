"""Pipeline pricing against closed forms: TP collectives reported as communication, priced once per simulation and
one latency each, the bubble fraction without them, the interleaved warm-up order, and the plan errors
``evaluate plan=`` shows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from placement_rl.cost import resolve_costs
from placement_rl.cost.pipeline import simulate_pipeline
from placement_rl.cost.types import CostTable
from placement_rl.errors import PlanError
from placement_rl.graph import make_graph, zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology, load_topology

torch.set_num_threads(1)


def one_host(gpus: int, bandwidth: float = 50e9, latency: float = 10e-6) -> DeviceTopology:
    """``gpus`` A100s on one host joined by links of the given bandwidth and latency (no measured collective fit)."""
    return DeviceTopology.from_dict({
        "name": f"one_host_{gpus}", "devices": [{"name": "gpu", "count": gpus, "kind": "gpu", "host": 0,
                                                 "model": "A100-SXM4-80GB"}],
        "links": {"intra_host": {"bandwidth": bandwidth, "latency": latency, "kind": "nvlink"},
                  "inter_host": {"bandwidth": bandwidth, "latency": latency, "kind": "ib"}}})


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **zoo.tiny("gpt"))


# ------------------------------------------------------------------------------- TP collectives are communication
def _with_free_links(costs: CostTable) -> CostTable:
    """``costs`` with every link free: TP collectives and transfers take no time, compute is unchanged."""
    return dataclasses.replace(costs, link_bandwidth=np.full_like(costs.link_bandwidth, np.inf),
                               link_latency=np.zeros_like(costs.link_latency))


def test_tp_collectives_are_reported_as_communication_not_busy_compute(gpt):
    """A TP stage's blocking all-reduces lengthen the step (priced inside the nodes' times) but are communication:
    ``meta["tp_comm_time"]`` holds them, ``device_busy`` leaves them out (the busy time is what the same plan keeps on
    free links). They were in busy, and reported nowhere."""
    topo = one_host(2)
    costs = resolve_costs(gpt, topo)
    plan = StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), num_microbatches=2)
    res, free = simulate_pipeline(gpt, costs, topo, plan), simulate_pipeline(gpt, _with_free_links(costs), topo, plan)
    tp_time = res.step_time - free.step_time  # one stage, no DP, no pipeline transfer: the TP collectives alone
    assert tp_time > 0 and free.meta["tp_comm_time"] == [0.0]
    assert res.meta["tp_comm_time"][0] == pytest.approx(tp_time, rel=1e-9)
    np.testing.assert_allclose(res.device_busy, free.device_busy, rtol=1e-12)


def test_bubble_fraction_counts_neither_compute_nor_tp_collectives(gpt):
    """The bubble fraction is the share of the step a device group is idle: its TP collectives count as neither
    bubble nor compute. One stage without DP has no bubble, TP or not (it was the plan's TP share, 0.27 on four
    A100s); two stages: ``1 - mean over groups of (busy + TP time) / step``."""
    topo = one_host(4)
    costs = resolve_costs(gpt, topo)
    one = simulate_pipeline(gpt, costs, topo, StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0, 1, 2, 3),),
                                                        tp=(4,), num_microbatches=2))
    assert one.meta["tp_comm_time"][0] > 0.0
    assert one.meta["bubble_fraction"] == pytest.approx(0.0, abs=1e-12)
    half = np.array([0] * (gpt.num_nodes // 2) + [1] * (gpt.num_nodes - gpt.num_nodes // 2))
    two = simulate_pipeline(gpt, costs, topo, StagePlan(half, ((0, 1), (2, 3)), tp=(2, 2), num_microbatches=2))
    spans = two.device_busy[[0, 2]] + np.array(two.meta["tp_comm_time"])
    assert two.meta["bubble_fraction"] == pytest.approx(1.0 - spans.mean() / two.step_time, rel=1e-12)
    assert 0.0 < two.meta["bubble_fraction"] < 1.0 - two.device_busy[[0, 2]].mean() / two.step_time


def test_recomputed_tp_collectives_count_again_and_the_step_is_unchanged(gpt):
    """Full recomputation runs a layer's forward all-reduces again in its backward: they count as communication too,
    so busy time still equals the free-link plan's compute; the step is the kernel's as before (stage times in the
    meta are still the spans with the collectives inside)."""
    topo = one_host(4)
    costs = resolve_costs(gpt, topo)
    half = np.array([0] * (gpt.num_nodes // 2) + [1] * (gpt.num_nodes - gpt.num_nodes // 2))
    plan = StagePlan(half, ((0, 1), (2, 3)), tp=(2, 2), num_microbatches=2, recompute=("full", "none"))
    res, free = simulate_pipeline(gpt, costs, topo, plan), simulate_pipeline(gpt, _with_free_links(costs), topo, plan)
    plain = simulate_pipeline(gpt, costs, topo, dataclasses.replace(plan, recompute=()))
    assert res.meta["tp_comm_time"][0] > plain.meta["tp_comm_time"][0]
    assert res.meta["tp_comm_time"][1] == pytest.approx(plain.meta["tp_comm_time"][1], rel=1e-12)
    np.testing.assert_allclose(res.device_busy, free.device_busy, rtol=1e-12)
    m = plan.num_microbatches
    spans = [m * (f + b) for f, b in zip(res.meta["stage_fwd_time"], res.meta["stage_bwd_time"])]
    np.testing.assert_allclose(np.array(spans) - res.meta["tp_comm_time"], res.device_busy[[0, 2]], rtol=1e-12)


# ------------------------------------------------------------------------------- one latency per TP collective
def _tp_time(graph, latency: float, bandwidth: float, m: int = 2) -> float:
    """TP collective seconds over the step of ``graph`` on one TP group of 2 (one stage, no DP), links of the given
    latency and bandwidth (ring all-reduce of n bytes on 2 ranks: ``2 latency + n / bandwidth``)."""
    topo = one_host(2, bandwidth=bandwidth, latency=latency)
    plan = StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), num_microbatches=m)
    return simulate_pipeline(graph, resolve_costs(graph, topo), topo, plan).meta["tp_comm_time"][0]


def test_parallel_cross_entropy_is_three_all_reduces(gpt):
    """Megatron's vocab-parallel cross-entropy all-reduces the logits' maximum, the sum of exponentials and the target
    logit: three collectives of one number per token, each paying its latency (priced as one, two latencies per
    micro-batch were missing); the bytes are unchanged (3 x tokens x 4 on the loss op)."""
    from placement_rl.graph import tp

    ann, m, lat, bw = tp.annotation(gpt), 2, 10e-6, 50e9
    loss = int(np.flatnonzero(ann.kind == tp.VOCAB_LOSS)[0])
    assert ann.ar_fwd[loss] > 0
    per_mb = int((ann.ar_fwd > 0).sum()) + 2 + int((ann.ar_bwd > 0).sum())  # the loss's bytes are three
    assert _tp_time(gpt, 0.0, bw, m) == pytest.approx((ann.ar_fwd.sum() + ann.ar_bwd.sum()) / bw, rel=1e-9)
    assert _tp_time(gpt, lat, bw, m) - _tp_time(gpt, 0.0, bw, m) == pytest.approx(m * per_mb * 2 * lat, rel=1e-9)


def test_a_coarsened_group_pays_each_members_collective(gpt):
    """A coarsened group holding several TP collectives (a layer's two row GEMMs, the loss's three) pays each one's
    latency, as the uncoarsened graph does (ring all-reduces: the same TP time to rounding)."""
    from placement_rl.graph.coarsen import coarsen

    coarse = coarsen(gpt, max_nodes=8)
    assert coarse.num_nodes < gpt.num_nodes
    assert _tp_time(coarse, 10e-6, 50e9) == pytest.approx(_tp_time(gpt, 10e-6, 50e9), rel=1e-9)


# ------------------------------------------------------------------------------- TP collectives priced once
def test_run_prices_tp_collectives_once_and_reports_what_the_kernel_timed(gpt, monkeypatch):
    """``run`` prices a TP plan's collectives once, forward and backward per TP stage and collective kind, for the
    kernel's node times and ``meta["tp_comm_time"]`` alike (they were priced twice): the step is ``step_time``'s and
    the TP time ``tp_comm_time``'s, to the last bit."""
    from placement_rl.cost import tensor_parallel
    from placement_rl.cost.pipeline import PipelineSimulator

    topo = one_host(4)
    costs = resolve_costs(gpt, topo)
    n = gpt.num_nodes
    whole, half = np.zeros(n, dtype=np.int64), np.array([0] * (n // 2) + [1] * (n - n // 2))
    plans = [StagePlan(whole, ((0, 1),), tp=(2,), num_microbatches=2),
             StagePlan(whole, ((0, 1, 2, 3),), tp=(4,), num_microbatches=2, sequence_parallel=True),
             StagePlan(whole, ((0, 1, 2, 3),), tp=(2,), num_microbatches=1),
             StagePlan(half, ((0, 1), (2, 3)), tp=(2, 2), num_microbatches=2, schedule="1f1b",
                       recompute=("full", "none")),
             StagePlan(half, ((0, 1), (2,)), tp=(2, 1), num_microbatches=2)]
    calls = []
    priced = tensor_parallel.collective_times
    monkeypatch.setattr(tensor_parallel, "collective_times", lambda *a: calls.append(1) or priced(*a))
    for plan in plans:
        sim = PipelineSimulator(gpt, costs, topo)
        calls.clear()
        res = sim.run(plan)
        kinds = 2 if plan.sequence_parallel else 1  # Megatron-SP: a reduce-scatter and an all-gather
        assert len(calls) == 2 * kinds * sum(t > 1 for t in plan.tp)
        assert res.step_time == sim.step_time(plan)
        assert res.meta["tp_comm_time"] == sim.tp_comm_time(plan).tolist()


# ------------------------------------------------------------------------------- interleaved 1F1B warm-up
def test_interleaved_warm_up_is_torchs_and_megatrons_order():
    """Interleaved 1F1B with m == G device groups: group g warms up with min(2 (G - g - 1) + (v - 1) G, m v)
    forwards (torch's ScheduleInterleaved1F1B, Megatron-LM's at its default micro-batch group size), so the peak
    chunk-micro-batches in flight per group are that + 1 where a 1F1B phase follows, else m v."""
    topo = one_host(4, bandwidth=1e30, latency=0.0)
    g_count, v = 4, 2
    s, m, act = g_count * v, g_count, 1e6
    g = make_graph([{"name": f"n{k}", "fwd_flops": 1e9, "bwd_flops": 2e9, "act_bytes": act} for k in range(s)],
                   [[k, k + 1, 0.0] for k in range(s - 1)], name="chain")
    d = topo.num_devices
    costs = CostTable(fwd_time=np.full((s, d), 1e-3), bwd_time=np.full((s, d), 2e-3), link_latency=topo.link_latency,
                      link_bandwidth=topo.link_bandwidth, source=("hand",) * d)
    plan = StagePlan(list(range(s)), tuple((k % g_count,) for k in range(s)), num_microbatches=m,
                     schedule="interleaved1f1b")
    peak = simulate_pipeline(g, costs, topo, plan).peak_memory[:g_count] / (act / m)
    warm = [min(2 * (g_count - k - 1) + (v - 1) * g_count, m * v) for k in range(g_count)]
    assert peak.round(9).tolist() == [w if w == m * v else w + 1 for w in warm] == [8, 8, 7, 5]


# ------------------------------------------------------------------------------- plan errors
def test_more_stages_than_nodes_says_so():
    g = make_graph([{"name": n, "fwd_flops": 1e9, "bwd_flops": 2e9} for n in "abc"], [[0, 1, 1.0], [1, 2, 1.0]],
                   name="chain3")
    plan = StagePlan([0, 1, 2], ((0,), (1,), (0,), (1,)), schedule="interleaved1f1b")
    with pytest.raises(PlanError, match=r"^stage plan has 4 stages for 3 nodes of graph 'chain3': every stage needs a "
                                        r"node, so use at most 3 stages$"):
        plan.validate(g, load_topology("2x_k80"))


@pytest.mark.parametrize("schedule, stages, devices, m, says", [
    ("zb1p", [0, 0, 1, 1], ((0,), (1,)), 2, "'zb1p' is not modelled"),
    ("interleaved1f1b", [0, 1, 2, 3], ((0,), (1,), (0,), (1,)), 3,
     r"num_microbatches \(3\) divisible by the number of device groups \(2\)")])
def test_evaluate_plan_errors_met_while_pricing_name_the_file(tmp_path, monkeypatch, schedule, stages, devices, m,
                                                              says):
    """Errors only pricing meets (zb1p, interleaved micro-batches) start with the plan file, as the others do."""
    from placement_rl.cli import evaluate
    from placement_rl.cli.common import _compose

    g = make_graph([{"name": n, "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
                     "out_bytes": 1e6} for n in "abcd"], [[0, 1, 1e6], [1, 2, 1e6], [2, 3, 1e6]], name="chain")
    g.to_json(tmp_path / "chain.json")
    topo = load_topology("2x_k80")
    path = tmp_path / "bad.json"
    StagePlan(stages, devices, num_microbatches=m, schedule=schedule).to_json(path, graph=g, topology=topo)
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(evaluate, "output_dir", lambda: tmp_path / "run")
    cfg, _ = _compose("evaluate", ["suite=single", f"graph.path={tmp_path / 'chain.json'}", "topology=2x_k80",
                                   f"plan={path}", "budget=4", "progress=false"], [])
    with pytest.raises(PlanError, match=rf"^{path}: .*{says}"):
        evaluate.run(OmegaConf.create(cfg))
