"""Plans at micro-batch size 1: the export there folds ops without compute of their own (a contiguous of a one-row
slice, Llama's mask expand, OPT's label contiguous), which frees their names for the later ops of their kinds; the
graph's names are realigned and the plan deploys, and a micro-batch export that changes a computing op is refused
naming the cause and the fix. And what a one-stage plan is announced and recorded as running."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from placement_rl.errors import PlanError
from placement_rl.executor.distributed import (DeployConfig, DeploySpec, deploy_stage_plans, prepare_job,
                                               reference_step)
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture, capture_zoo
from placement_rl.plans import StagePlan

torch.set_num_threads(1)
LLAMA = dict(zoo.tiny("llama_hf"), batch_size=4, seq_len=8, vocab_size=37)


class Folds(nn.Module):
    """``contiguous`` of a one-row slice is a no-op at micro-batch size 1 (the export drops it); the second
    ``contiguous`` (of an expanded tensor) stays and takes the first one's name there."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.w = nn.Linear(5, 5), nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)[:, 1:].contiguous()
        return ((h * self.w).unsqueeze(1).expand(-1, 2, -1).contiguous() ** 2).mean()


class SkipsAtOne(Folds):
    """A computing op (tanh) the model leaves out at batch size 1: not a program the graph describes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return (torch.tanh(h) if x.shape[0] > 1 else h).pow(2).mean()


def _cut_after(graph, name: str) -> np.ndarray:
    return (np.arange(graph.num_nodes) > graph.index[name]).astype(np.int64)


def test_align_programs_pairs_the_ops_past_the_ones_folded_at_micro_batch_one():
    from placement_rl.executor._stages import align_programs, export_step, program_module

    module, x = Folds(), torch.randn(4, 5)
    whole, one = (program_module(export_step(module, (t,))) for t in (x, x[:1]))
    names, odd = align_programs(whole, one)
    assert odd is None and names["contiguous"] is None and names["contiguous_1"] == "contiguous"
    assert all(names[k] == k for k in ("linear", "slice_1", "mul", "unsqueeze", "expand", "pow_1", "mean"))
    names, odd = align_programs(one, whole)  # no op appears out of nothing: the first one without a counterpart
    assert names == {} and odd.name == "mul"


def test_micro_batch_one_plan_deploys_on_the_realigned_names(tmp_path):
    module, x = Folds(), torch.randn(4, 5)
    g = capture(copy.deepcopy(module), (x,), name="folds")
    plan = StagePlan(_cut_after(g, "contiguous"), ((0,), (1,)), num_microbatches=4, schedule="gpipe")
    prepare_job([DeploySpec(plan=plan, graph=g, module=module, inputs=(x,))], job_dir=tmp_path)
    stage_map = json.loads((tmp_path / "part0" / "part.json").read_text())["stage_map"]
    # the program's 'contiguous' is the graph's 'contiguous_1', which the plan puts in stage 1
    assert stage_map == {"linear": 0, "slice_1": 0, "mul": 1, "unsqueeze": 1, "expand": 1, "contiguous": 1,
                         "pow_1": 1, "mean": 1}


def test_micro_batch_one_changing_a_computing_op_is_refused_naming_the_cause_and_the_fix(tmp_path):
    module, x = SkipsAtOne(), torch.randn(4, 5)
    g = capture(copy.deepcopy(module), (x,), name="skips")
    plan = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0,),), num_microbatches=4)
    with pytest.raises(PlanError, match=r"micro-batch size 1 \(batch 4 / \(DP 1 x 4 micro-batches\)\) changes its "
                                        r"program at 'tanh'.*micro-batch holds 2 or more samples$") as err:
        prepare_job([DeploySpec(plan=plan, graph=g, module=module, inputs=(x,))], job_dir=tmp_path)
    assert "capture" not in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "job.json").exists()


def test_one_stage_plan_is_announced_and_recorded_without_a_pipeline_schedule():
    from placement_rl.cli.deploy import plan_layout, run_mode
    from placement_rl.topology import load_topology

    g = capture(Folds(), (torch.randn(4, 5),), name="folds")
    one = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1, 2),), num_microbatches=1)
    assert run_mode(one) == "1 micro-batch, no pipeline schedule"
    assert run_mode(StagePlan(one.stage_of_node, ((0, 1),), num_microbatches=2)) == (
        "2 micro-batches, gradients accumulated, no pipeline schedule")
    two = StagePlan(_cut_after(g, "mul"), ((0,), (1,)), num_microbatches=2, schedule="gpipe")
    assert run_mode(two) == "gpipe, 2 micro-batches"
    topo = load_topology("4x_v100_nvlink")
    assert plan_layout(one, g, topo)["schedule"] is None and plan_layout(two, g, topo)["schedule"] == "gpipe"


@pytest.mark.slow
@pytest.mark.distributed
def test_llama_and_a_folded_program_at_micro_batch_one_equal_one_process():
    """Llama (its mask's expand and the labels' contiguous folded away at micro-batch size 1) at TP 2 and PP 2, and
    :class:`Folds` cut between its two contiguous ops: losses and gradients equal one process over the same
    micro-batches. A one-stage plan's result records no pipeline schedule."""
    from placement_rl.executor._stages import align_programs, export_step, program_module

    module, inputs = zoo.build("llama_hf", **LLAMA)
    names, _ = align_programs(program_module(export_step(module, inputs)),
                              program_module(export_step(module, [t[:1] for t in inputs])))
    assert {k for k, v in names.items() if v is None} == {"expand", "contiguous_2"}  # folded away
    assert names["expand_1"] == "expand" and names["expand_6"] == "expand_5"  # the later expands' names shift
    g = capture_zoo("llama_hf", **LLAMA)
    whole = np.zeros(g.num_nodes, dtype=np.int64)
    cut = g.index["add_9"] + 1  # the residual stream after the first layer
    plans = [StagePlan(whole, ((0, 1),), tp=(2,), num_microbatches=4),
             StagePlan((np.arange(g.num_nodes) >= cut).astype(np.int64), ((0,), (1,)), num_microbatches=4,
                       schedule="gpipe")]
    folds, x = Folds(), torch.randn(4, 5)
    gf = capture(copy.deepcopy(folds), (x,), name="folds")
    fplan = StagePlan(_cut_after(gf, "contiguous"), ((0,), (1,)), num_microbatches=4, schedule="gpipe")
    specs = [DeploySpec(plan=p, graph=g, model="llama_hf", overrides=LLAMA) for p in plans]
    results = deploy_stage_plans(specs + [DeploySpec(plan=fplan, graph=gf, module=folds, inputs=(x,))],
                                 config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=180))
    assert results[0].schedule is None and results[1].schedule == "gpipe"
    for res, (mod, batch) in zip(results, [(module, inputs)] * 2 + [(folds, (x,))]):
        loss, grads = reference_step(copy.deepcopy(mod), batch, chunks=4)
        assert res.losses[0] == pytest.approx(loss, abs=1e-5) and set(res.grads) == set(grads)
        for key, ref in grads.items():
            torch.testing.assert_close(res.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
