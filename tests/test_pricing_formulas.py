"""Pipeline pricing against closed forms: TP collectives reported as communication, the interleaved warm-up order,
and the plan errors ``evaluate plan=`` shows."""

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
    ``meta["tp_comm_time"]`` holds them, ``device_busy`` and the bubble fraction leave them out (the busy time is what
    the same plan keeps on free links). They were in busy, and reported nowhere."""
    topo = one_host(2)
    costs = resolve_costs(gpt, topo)
    plan = StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), num_microbatches=2)
    res, free = simulate_pipeline(gpt, costs, topo, plan), simulate_pipeline(gpt, _with_free_links(costs), topo, plan)
    tp_time = res.step_time - free.step_time  # one stage, no DP, no pipeline transfer: the TP collectives alone
    assert tp_time > 0 and free.meta["tp_comm_time"] == [0.0]
    assert res.meta["tp_comm_time"][0] == pytest.approx(tp_time, rel=1e-9)
    np.testing.assert_allclose(res.device_busy, free.device_busy, rtol=1e-12)
    assert res.meta["bubble_fraction"] == pytest.approx(1.0 - res.device_busy[0] / res.step_time, rel=1e-12)
    assert res.meta["bubble_fraction"] > 0.0


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
