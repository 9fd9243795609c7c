"""Sequence parallelism deployed from a coarsened graph (what ``evaluate`` / ``place`` write): the norms and values
it shards are the exported program's node names, read from the graph the groups were made from, so a plan runs as
on the captured graph; a coarsened graph without that graph is refused before any process starts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from placement_rl.errors import PlanError
from placement_rl.executor.distributed import (DeployConfig, DeploySpec, deploy_stage_plans, prepare_job,
                                               reference_step, sequence_parallel_names)
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.graph.coarsen import coarsen
from placement_rl.graph.io import graph_from_dict, graph_to_dict
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import FINE_KEY, member_graph
from placement_rl.plans import StagePlan

torch.set_num_threads(1)
GPT = dict(batch_size=8, seq_len=8, vocab_size=32, d_model=16, n_layers=2, n_heads=2, dropout=0.0)


@pytest.fixture(scope="module")
def graphs() -> tuple[CompGraph, CompGraph]:
    """(captured, coarsened as written to JSON and read back)."""
    fine = capture_zoo("gpt", **GPT)
    coarse = CompGraph.from_json(coarsen(fine).to_json())
    assert coarse.members is not None and coarse.num_nodes < fine.num_nodes
    return fine, coarse


def whole(g: CompGraph) -> StagePlan:
    return StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), num_microbatches=2,
                     sequence_parallel=True)


def two_stages(coarse: CompGraph) -> StagePlan:
    """TP 2 x PP 2 cut after the group ending block 0's residual stream (``add_2`` of the program)."""
    fine, group_of = member_graph(coarse)
    cut = int(group_of[fine.index["add_2"]]) + 1
    son = np.array([0 if i < cut else 1 for i in range(coarse.num_nodes)])
    return StagePlan(son, ((0, 1), (2, 3)), tp=(2, 2), num_microbatches=2, schedule="gpipe", sequence_parallel=True)


def test_coarsened_graph_names_the_programs_sequence_parallel_nodes(graphs):
    fine, coarse = graphs
    norms, values = sequence_parallel_names(fine)
    assert len(norms) == 2 * GPT["n_layers"] + 1 and "add_2" in values
    assert sequence_parallel_names(coarse) == (norms, values)


def test_prepared_job_of_a_coarsened_graph_marks_the_programs_nodes(graphs, tmp_path):
    fine, coarse = graphs
    job = prepare_job([DeploySpec(plan=whole(coarse), graph=coarse, model="gpt", overrides=GPT)], job_dir=tmp_path)
    part = json.loads((job.job_dir / "part0" / "part.json").read_text())
    assert (part["tp_seq_norms"], part["tp_seq_values"]) == tuple(map(list, sequence_parallel_names(fine)))


def test_coarsened_graph_without_its_member_graph_refused(graphs, tmp_path):
    data = graph_to_dict(graphs[1])
    data["meta"] = {k: v for k, v in data["meta"].items() if k != FINE_KEY}
    bare = graph_from_dict(data)
    with pytest.raises(PlanError, match="graph.coarsen.enabled=false"):
        sequence_parallel_names(bare)
    with pytest.raises(PlanError, match="coarsened without the graph its groups were made from"):
        prepare_job([DeploySpec(plan=whole(bare), graph=bare, model="gpt", overrides=GPT)], job_dir=tmp_path / "j")
    assert not (tmp_path / "j").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_sequence_parallel_on_a_coarsened_graph_gradients_equal_one_process(graphs):
    """TP 2 (two micro-batches) and TP 2 x PP 2 GPipe with sequence parallelism, planned on the coarsened graph: loss
    and gradients equal one process (the pipeline crashed in its ranks before the SP names were the program's)."""
    coarse = graphs[1]
    module, inputs = zoo.build("gpt", **GPT)
    loss, grads = reference_step(module, inputs, chunks=2)
    for plan in (whole(coarse), two_stages(coarse)):
        res, = deploy_stage_plans([DeploySpec(plan=plan, graph=coarse, model="gpt", overrides=GPT)],
                                  config=DeployConfig(steps=1, warmup=0, collect_grads=True, timeout_s=180))
        assert res.losses[0] == pytest.approx(loss, abs=1e-5)
        assert set(res.grads) == set(grads)
        for key, ref in grads.items():
            torch.testing.assert_close(res.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
