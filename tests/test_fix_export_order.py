"""Export keeps which device runs which pipeline rank: a plan whose stages do not sit on devices 0..world-1 in rank
order gets a ``# rank_devices`` line and a ``# note:`` naming each rank's device (and the launch order per host), and
the readers take the devices back from that line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from placement_rl import export as ex
from placement_rl.errors import PlanError
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

torch.set_num_threads(1)

from tests.test_export import gpt  # noqa: E402,F401 - the small gpt fixture
@pytest.fixture(scope="module")
def mixed():
    """H100, A100 80GB and L4, each on its own host; then two L4s on host 3."""
    return DeviceTopology.from_dict({
        "name": "mixed", "links": {"intra_host": {"bandwidth": 64e9, "latency": 5e-6},
                                   "inter_host": {"bandwidth": 25e9, "latency": 1e-5}},
        "devices": [{"name": "h100", "model": "H100", "host": 0},
                    {"name": "a100", "model": "A100-SXM4-80GB", "host": 1},
                    {"name": "l4", "model": "L4", "host": 2},
                    {"name": "m", "model": "L4", "count": 2, "host": 3, "index_start": 4}]})


def cut_after(g, blocks):
    ends = [max(i for i, p in enumerate(g.module_paths) if p == f"blocks.{b}") + 1 for b in blocks]
    return np.searchsorted(np.array(ends), np.arange(g.num_nodes), side="right")


def test_a_plan_off_rank_order_names_each_ranks_device_and_reads_back(gpt, mixed):
    plan = StagePlan(cut_after(gpt, [0, 1]), ((1,), (2,), (0,)), num_microbatches=4)
    plan.validate(gpt, mixed)
    for write, read in ((ex.to_torchtitan, ex.from_torchtitan), (ex.to_megatron, ex.from_megatron)):
        text = write(plan, gpt, topology=mixed)
        assert "# rank_devices = [1, 2, 0]" in text
        notes = [x for x in text.splitlines() if x.startswith("# note:")]
        assert len(notes) == 1 and "rank 0 a100, rank 1 l4, rank 2 h100" in notes[0], notes
        assert "# node 0: host 1, rank 0 (a100), CUDA_VISIBLE_DEVICES=0" in text
        assert "# node 2: host 0, rank 2 (h100), CUDA_VISIBLE_DEVICES=0" in text
        back = read(text, gpt)
        assert back.stage_devices == plan.stage_devices and np.array_equal(back.stage_of_node, plan.stage_of_node)
    # without a topology the indices alone
    text = ex.to_torchtitan(plan, gpt)
    assert "# rank_devices = [1, 2, 0]" in text and "rank 0 device 1" in text
    assert ex.from_torchtitan(text, gpt).stage_devices == plan.stage_devices


def test_tp_and_dp_ranks_and_cuda_indices_per_host(gpt, mixed):
    # stage 0 on the two L4s of host 3 (cuda:5 then cuda:4), stage 1 on devices 0 and 2 (different hosts: DP)
    plan = StagePlan(cut_after(gpt, [1]), ((4, 3), (0, 2)), num_microbatches=2)
    text = ex.to_megatron(plan, gpt, topology=mixed)
    assert "# rank_devices = [4, 3, 0, 2]" in text
    assert "# node 0: host 3, ranks 0-1 (m1, m0), CUDA_VISIBLE_DEVICES=5,4" in text
    assert "# node 1: host 0, rank 2 (h100), CUDA_VISIBLE_DEVICES=0" in text
    assert ex.from_megatron(text, gpt).stage_devices == plan.stage_devices
    tp = StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((4, 3),), tp=(2,))
    text = ex.to_torchtitan(tp, gpt, topology=mixed)
    assert "# rank_devices = [4, 3]" in text and ex.from_torchtitan(text, gpt).stage_devices == ((4, 3),)


def test_a_host_whose_ranks_are_not_consecutive_is_said(gpt, mixed):
    plan = StagePlan(cut_after(gpt, [0, 1]), ((3,), (0,), (4,)), num_microbatches=4)
    text = ex.to_torchtitan(plan, gpt, topology=mixed)
    notes = [x for x in text.splitlines() if x.startswith("# note:")]
    assert len(notes) == 2 and "host 3 holds ranks 0, 2" in notes[1], notes


def test_rank_order_plans_are_written_as_before(gpt, mixed):
    plan = StagePlan(cut_after(gpt, [1]), ((0,), (1,)), num_microbatches=2)
    text = ex.to_torchtitan(plan, gpt, topology=mixed)
    assert "rank_devices" not in text and "# note:" not in text and "# node" not in text
    assert ex.from_torchtitan(text, gpt).stage_devices == ((0,), (1,))


def test_a_bad_rank_devices_line_is_one_line(gpt):
    plan = StagePlan(cut_after(gpt, [0, 1]), ((1,), (2,), (0,)), num_microbatches=4)
    text = ex.to_torchtitan(plan, gpt)
    with pytest.raises(PlanError, match=r"rank_devices names 2 devices.*3 ranks"):
        ex.from_torchtitan(text.replace("[1, 2, 0]", "[1, 2]"), gpt)
    with pytest.raises(PlanError, match=r"rank_devices names device 1 twice"):
        ex.from_megatron(ex.to_megatron(plan, gpt).replace("[1, 2, 0]", "[1, 1, 0]"), gpt)


def test_cli_warns_on_stderr(gpt, mixed, tmp_path, capsys):
    from placement_rl.cli.export import main

    gpt.to_json(tmp_path / "graph.json")
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump(mixed.to_dict()))
    StagePlan(cut_after(gpt, [0, 1]), ((1,), (2,), (0,)), num_microbatches=4).to_json(
        tmp_path / "plan.json", graph=gpt, topology=mixed)
    main([str(tmp_path / "plan.json"), "--to", "torchtitan", "--topology", str(tmp_path / "mixed.yaml"),
          "--out", str(tmp_path / "t.toml")])
    err = capsys.readouterr().err
    assert "note: pipeline ranks must run on the plan's devices" in err
    assert ex.from_torchtitan((tmp_path / "t.toml").read_text(), gpt).stage_devices == ((1,), (2,), (0,))
