"""export: a plan planned for inference is not headed with a training step, and a plan whose stages recompute
differently is refused with what to do, or exported with ``--uniform-recompute``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl import export as ex
from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.errors import PlanError
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

from tests.test_export import gpt  # noqa: E402,F401 - the fixture: a small GPT

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def topo():
    return load_topology("8x_a100_nvswitch")


def cut_after(g, blocks):
    ends = [max(i for i, p in enumerate(g.module_paths) if p == f"blocks.{b}") + 1 for b in blocks]
    return np.searchsorted(np.array(ends), np.arange(g.num_nodes), side="right")


def test_an_inference_plan_is_headed_with_the_training_step_not_its_forward_time(gpt, topo):
    son = np.zeros(gpt.num_nodes, dtype=np.int64)
    inference = StagePlan(son, ((0, 1, 2, 3),), meta={"step_time": 0.00123, "mode": "inference"})
    train = simulate_pipeline(gpt, resolve_costs(gpt, topo), topo, inference).step_time
    for fmt in ex.FORMATS:
        header = ex.export_plan(inference, gpt, fmt, topology=topo).splitlines()[1]
        assert f"predicted training step {train:.6g} s (topology estimates)" in header, header
        assert "0.00123 s is one forward pass (planned with mode=inference), not a training step" in header
        assert "predicted step 0.00123" not in header
    header = ex.to_megatron(inference, gpt).splitlines()[1]  # no topology: not priced, and says why
    assert "predicted training step not priced (no topology: pass --topology)" in header
    # a plan with no mode (older files) or mode train: its own step time, as before
    for meta in ({"step_time": 0.00123}, {"step_time": 0.00123, "mode": "train"}):
        plan = StagePlan(son, ((0, 1, 2, 3),), meta=meta)
        assert ex.to_megatron(plan, gpt, topology=topo).splitlines()[1] == "# 1 stage(s), predicted step 0.00123 s"


def test_stages_that_recompute_differently_say_what_to_do_and_export_uniformly_on_request(gpt, topo):
    two = cut_after(gpt, [1])
    mixed = StagePlan(two, ((0,), (1,)), num_microbatches=2, recompute=("none", "full"), meta={"step_time": 777.0})
    for fmt in ex.FORMATS:
        with pytest.raises(PlanError, match=r"export with --uniform-recompute to recompute 'full' in every stage"):
            ex.export_plan(mixed, gpt, fmt, topology=topo)
    text = ex.export_plan(mixed, gpt, "megatron", topology=topo, uniform=True)
    assert "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" in " ".join(
        text.replace("\\\n", " ").split())
    uniform = ex.uniform_recompute(mixed)
    assert uniform.recompute == ("full", "full") and uniform.meta["recompute_as_planned"] == ["none", "full"]
    want = simulate_pipeline(gpt, resolve_costs(gpt, topo), topo, uniform).step_time
    lines = text.splitlines()
    assert f"predicted training step {want:.6g} s (topology estimates)" in lines[1] and "777" not in lines[1]
    assert lines[2].startswith("# note: the plan recomputes ['none', 'full'] per stage; exported with 'full' in every "
                               "stage (--uniform-recompute)")
    assert ex.from_megatron(text, gpt).recompute == ("full", "full")
    sel = StagePlan(two, ((0,), (1,)), num_microbatches=2, recompute=("selective", "none"))
    titan = ex.export_plan(sel, gpt, "torchtitan", uniform=True)
    assert 'mode = "selective"' in titan and "'selective' in every stage" in titan
    same = StagePlan(two, ((0,), (1,)), num_microbatches=2, recompute=("full", "full"), meta={"step_time": 777.0})
    assert ex.uniform_recompute(same) is same  # nothing to change: its own step time stays in the header
    assert "predicted step 777 s" in ex.export_plan(same, gpt, "megatron", uniform=True)


def test_cli_uniform_recompute_flag(gpt, topo, tmp_path, capsys):
    from placement_rl.cli.export import main

    gpt.to_json(tmp_path / "graph.json")
    StagePlan(cut_after(gpt, [1]), ((0,), (1,)), num_microbatches=2, recompute=("full", "none")).to_json(
        tmp_path / "plan.json", graph=gpt, topology=topo)

    def run(*args):
        try:
            main([str(tmp_path / "plan.json"), "--to", "megatron", *args])
        except SystemExit as exc:
            return exc.code, *capsys.readouterr()
        return 0, *capsys.readouterr()

    code, _, err = run()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--uniform-recompute" in err, err
    code, out, err = run("--uniform-recompute", "--out", str(tmp_path / "args.txt"))
    assert code == 0 and "--recompute-granularity full" in (tmp_path / "args.txt").read_text()
    assert "note: the plan recomputes ['full', 'none'] per stage" in err  # notes go to stderr with --out
