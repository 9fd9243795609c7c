"""Export of a plan on a coarsened graph: a stage holds its groups' members' modules (a group named after one module
may hold the embedding or the output layer too), the same layer split as the uncoarsened graph's plan, and the
text reads back onto the groups."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
import torch

from placement_rl import export as ex
from placement_rl.errors import PlanError
from placement_rl.graph.capture import capture_zoo
from placement_rl.graph.coarsen import coarsen
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

torch.set_num_threads(1)
GPT = dict(batch_size=8, seq_len=8, vocab_size=50257, d_model=16, n_layers=4, n_heads=2, dropout=0.0)
SPLIT = [["wte", "wpe", "drop", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "ln_f", "lm_head"]]


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **GPT)


@pytest.fixture(scope="module")
def by_module(gpt):
    """Seven groups: 'wte' holds the dropout after the embeddings, 'ln_f' the output layer and the loss."""
    c = coarsen(gpt, depth=2)
    assert "ln_f" in c.names and "lm_head" not in c.names and "drop" not in c.names
    return c


@pytest.fixture(scope="module")
def few(gpt):
    """Five groups: 'blocks.0.ffn' holds the embeddings and all of blocks.0 but its last residual add, which is in
    'blocks.1.ffn' (and so on: each layer's last add is in the next layer's group)."""
    c = coarsen(gpt, max_nodes=5)
    assert c.names[0] == "blocks.0.ffn" and not {"wte", "wpe", "drop"} & set(c.names)
    return c


def uncoarsened(gpt):
    """The plan cut after blocks.1 on the graph itself (stages end after the layer's last node)."""
    end = max(i for i, p in enumerate(gpt.module_paths) if p == "blocks.1") + 1
    return StagePlan((np.arange(gpt.num_nodes) >= end).astype(np.int64), ((0,), (1,)), num_microbatches=2)


def parts(text: str) -> list[list[str]]:
    return tomllib.loads(text)["parallelism"]["module_fqns_per_model_part"]


def body(text: str) -> list[str]:
    return [x for x in text.splitlines() if not x.startswith("#")]


def test_a_stage_holds_its_groups_members_modules(gpt, by_module):
    plan = StagePlan(np.array([0, 0, 0, 0, 1, 1, 1]), ((0,), (1,)), num_microbatches=2)
    assert [by_module.names[i] for i in range(4)] == ["wpe", "wte", "blocks.0", "blocks.1"]
    titan = ex.to_torchtitan(plan, by_module)
    assert parts(titan) == SPLIT  # drop (in group 'wte') and lm_head (in group 'ln_f') in their stages
    assert body(titan) == body(ex.to_torchtitan(uncoarsened(gpt), gpt))
    megatron = ex.to_megatron(plan, by_module)
    assert body(megatron) == body(ex.to_megatron(uncoarsened(gpt), gpt))
    assert '--pipeline-model-parallel-layout "Et*2|t*2L"' in megatron
    for back in (ex.from_torchtitan(titan, by_module), ex.from_megatron(megatron, by_module)):
        assert np.array_equal(back.stage_of_node, plan.stage_of_node)
        assert (back.stage_devices, back.num_microbatches) == (plan.stage_devices, plan.num_microbatches)


def test_an_absorbed_embedding_goes_to_its_groups_stage(gpt, few):
    plan = StagePlan(np.array([0, 0, 1, 1, 1]), ((0,), (1,)), num_microbatches=2)
    with pytest.raises(PlanError, match=r"module 'blocks.1' is split between stages \[0, 1\] \(graph 'gpt' is "
                                        r"coarsened: its groups 'blocks.1.ffn', 'blocks.2.ffn' hold parts of it\)"):
        ex.to_megatron(plan, few)  # the groups cut before blocks.1's last residual add, as the plan does
    titan = ex.to_torchtitan(plan, few, snap=True)
    assert parts(titan) == SPLIT
    assert "--snap moved blocks.1 to stage 0" in titan
    megatron = ex.to_megatron(plan, few, snap=True, topology=load_topology("4x_v100_nvlink"))
    assert body(megatron) == body(ex.to_megatron(uncoarsened(gpt), gpt))
    assert "predicted step" in megatron and "not priced" not in megatron


def test_a_cut_inside_a_group_does_not_read_back_onto_the_groups(gpt, few):
    titan = ex.to_torchtitan(uncoarsened(gpt), gpt)  # blocks.1 whole in stage 0: group 'blocks.2.ffn' is cut
    with pytest.raises(PlanError, match=r"group 'blocks.2.ffn' of graph 'gpt' holds modules of stages 0 and 1"):
        ex.from_torchtitan(titan, few)


def test_cli_exports_a_coarsened_graph_json(by_module, tmp_path, capsys):
    from placement_rl.cli.export import main

    topo = load_topology("4x_v100_nvlink")
    by_module.to_json(tmp_path / "graph.json")  # the members' graph travels in the graph's meta
    StagePlan(np.array([0, 0, 0, 0, 1, 1, 1]), ((0,), (1,)), num_microbatches=2).to_json(
        tmp_path / "plan.json", graph=by_module, topology=topo)
    main([str(tmp_path / "plan.json"), "--to", "torchtitan"])
    assert parts(capsys.readouterr().out) == SPLIT
