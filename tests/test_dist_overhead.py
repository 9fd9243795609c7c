"""Wrapper costs of DDP / FSDP2 on gloo: the fit, the prediction of a deployed plan, and a real measurement."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.errors import ProfileError
from placement_rl.graph import synthetic
from placement_rl.plans import StagePlan
from placement_rl.profiling.dist_overhead import (KINDS, DistOverheads, fit_dist_overheads, measure_dist_overheads,
                                                  predict_deploy_step)


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
    return {"rows": rows, "sizes": sizes, "backend": "gloo",
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
    assert DistOverheads.from_dict(o.to_dict()) == o
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


def test_only_gloo_is_measured():
    with pytest.raises(ProfileError, match="gloo"):
        measure_dist_overheads("nccl")


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
