"""A one-stage plan's schedule through the export round trip (docs/export.md, Round trip): neither trainer's text
records one, both run the micro-batches as gradient-accumulation steps (1F1B order), so a one-stage ``gpipe`` plan
comes back as the ``1f1b`` plan, equal in every other field, and that plan is priced at the same step time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from placement_rl import export as ex
from placement_rl.cost.pipeline import simulate_pipeline
from placement_rl.cost.resolve import resolve_costs
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

torch.set_num_threads(1)
GPT = dict(batch_size=8, seq_len=8, vocab_size=64, d_model=16, n_layers=2, n_heads=2, dropout=0.0)


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **GPT)


def one_stage(graph, schedule: str) -> StagePlan:
    """TP 2 x DP 2 on one stage, two micro-batches (the TP benchmark's ``tp2 x dp2 m=2``)."""
    return StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), ((0, 1, 2, 3),), tp=(2,), num_microbatches=2,
                     schedule=schedule, batch_size=GPT["batch_size"])


def differing(a: StagePlan, b: StagePlan) -> list[str]:
    """The fields in which two plans differ."""
    def eq(x, y):
        return np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
    return [f.name for f in dataclasses.fields(a) if not eq(getattr(a, f.name), getattr(b, f.name))]


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron"])
def test_one_stage_plan_comes_back_1f1b_and_equal_otherwise(gpt, fmt):
    write, read = {"torchtitan": (ex.to_torchtitan, ex.from_torchtitan),
                   "megatron": (ex.to_megatron, ex.from_megatron)}[fmt]
    onef1b, gpipe = one_stage(gpt, "1f1b"), one_stage(gpt, "gpipe")
    assert differing(read(write(onef1b, gpt), gpt), onef1b) == []
    back = read(write(gpipe, gpt), gpt)
    assert back.schedule == "1f1b"
    assert differing(back, gpipe) == ["schedule"]
    assert write(gpipe, gpt) == write(onef1b, gpt)  # the text records no schedule for one stage


def test_one_stage_schedules_share_the_step_time(gpt):
    topo = load_topology("8x_a100_nvswitch")
    costs = resolve_costs(gpt, topo)
    gp, f1 = (simulate_pipeline(gpt, costs, topo, one_stage(gpt, s)) for s in ("gpipe", "1f1b"))
    assert f1.step_time == pytest.approx(gp.step_time, rel=1e-9)
    assert f1.peak_memory.max() <= gp.peak_memory.max()
