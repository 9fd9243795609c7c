"""Tied parameters (an embedding used again as the LM head): capture lists them with their users, coarsening and
graph JSON keep the list, and the pipeline simulator gives every other stage holding a user its own copy (weight,
gradient, Adam state) and prices the gradient sum between those stages, as the executor runs them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from placement_rl.cost import CostTable, PipelineSimulator, resolve_costs
from placement_rl.cost.collectives import coeff_array
from placement_rl.cost.tensor_parallel import segment_times
from placement_rl.errors import GraphError
from placement_rl.graph._capture_engine import OpCall, measure_graph
from placement_rl.graph.coarsen import coarsen
from placement_rl.graph.ir import CompGraph, make_graph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

torch.set_num_threads(1)
P = 1000.0  # bytes of the tied matrix


class Tied(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.mid(self.emb(ids))))
        return F.cross_entropy(torch.flatten(logits, 0, 1), torch.flatten(tgt))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 50, (2, 3)), torch.randint(0, 50, (2, 3))


def topology(d: int) -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": f"t{d}", "devices": [{"name": "gpu", "count": d, "kind": "gpu", "peak_flops": 1e12,
                                      "mem_bandwidth": 1e15, "memory_bytes": 1e12}],
        "links": {"intra_host": {"bandwidth": 1e3, "latency": 0.0}}})


def table(n: int, d: int) -> CostTable:
    lat, bw = np.zeros((d, d)), np.full((d, d), 1e3)
    np.fill_diagonal(bw, np.inf)
    return CostTable(fwd_time=np.ones((n, d)), bwd_time=np.full((n, d), 2.0), link_latency=lat, link_bandwidth=bw,
                     source=("hand",) * d)


def lm(tied: bool = True) -> CompGraph:
    """emb (the tied matrix) -> mid -> head (uses it again, no bytes of its own) -> loss."""
    nodes = [dict(name="emb", bwd_flops=1.0, param_bytes=P, act_bytes=8.0),
             dict(name="mid", bwd_flops=1.0, param_bytes=100.0, act_bytes=8.0),
             dict(name="head", bwd_flops=1.0, act_bytes=8.0), dict(name="loss", bwd_flops=1.0, act_bytes=8.0)]
    meta = {"tied": [{"bytes": P, "nodes": ["emb", "head"]}]} if tied else {}
    return make_graph(nodes, [(0, 1, 4.0), (1, 2, 4.0), (2, 3, 4.0)], name="lm", meta=meta)


def run(graph: CompGraph, stages, groups, *, sharding: str = "dp", schedule: str = "1f1b", mode: str | None = None):
    d = len({x for g in groups for x in g})
    plan = StagePlan(np.array(stages), tuple(groups), num_microbatches=2, schedule=schedule, sharding=sharding)
    return PipelineSimulator(graph, table(graph.num_nodes, d), topology(d), mode=mode).run(plan, timeline=True)


def allreduce(devices: tuple[int, ...], nbytes: float) -> float:
    return float(segment_times(coeff_array("allreduce", devices, topology(4), table(4, 4)), np.array([nbytes]))[0])


# ------------------------------------------------------------------------------------------------ capture
def test_measure_graph_lists_a_parameter_that_two_nodes_consume() -> None:
    traced = fx.symbolic_trace(Tied())
    values = iter(_inputs())
    leaves = {}
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            leaves[node] = next(values)
        elif node.op == "get_attr":
            leaves[node] = traced.get_parameter(str(node.target))
    trainable = list(traced.parameters())
    ties: list = []

    def describe(node: fx.Node) -> OpCall:
        if node.op == "call_module":
            sub = traced.get_submodule(str(node.target))
            return OpCall(fn=sub, op_type=type(sub).__name__.lower(), module_path=str(node.target),
                          owned_params=tuple(sub.parameters()))
        return OpCall(fn=node.target, op_type=str(node.target), module_path="")

    records, unused = measure_graph(traced.graph, leaves=leaves, describe=describe, trainable=trainable,
                                    constants=trainable, ties=ties)
    by_name = {r.name: r.param_bytes for r in records}
    assert ties == [{"bytes": 50 * 8 * 4.0, "nodes": ["emb", "head"]}]
    assert by_name["emb"] == 50 * 8 * 4 and by_name["head"] == 0.0  # the parameter counts once, on its first user
    assert unused == 0


@pytest.mark.parametrize("method", ["export", "fx"])
def test_capture_records_the_tie_in_meta(method: str) -> None:
    from placement_rl.graph.capture import capture

    g = capture(Tied(), _inputs(), method=method)
    ties = g.meta["tied"]
    assert len(ties) == 1 and ties[0]["bytes"] == 50 * 8 * 4.0
    owner, user = ties[0]["nodes"]
    assert g.param_bytes[g.index[owner]] >= 50 * 8 * 4 and g.param_bytes[g.index[user]] == 0.0
    assert float(g.param_bytes.sum()) == g.meta["param_bytes"]  # counted once in the graph
    assert "tied" not in capture(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.ones(2, 4),)).meta


class Square(nn.Module):
    """``x @ w.T`` then ``@ w``: the transpose view that first touches ``w`` is folded into its matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(torch.matmul(x, self.w.T), self.w).sum()


@pytest.mark.parametrize("method", ["export", "fx"])
def test_a_folded_weight_view_is_replaced_by_its_matmul_among_the_users(method: str) -> None:
    from placement_rl.graph.capture import capture

    g = capture(Square(), (torch.ones(2, 6),), method=method)
    (tie,) = g.meta["tied"]
    assert len(tie["nodes"]) == 2 and all(g.op_types[g.index[nm]] in ("matmul", "mm") for nm in tie["nodes"])
    assert g.param_bytes[g.index[tie["nodes"][0]]] == 6 * 6 * 4


# ---------------------------------------------------------------------------------------- coarsen, JSON
def test_coarsening_maps_users_to_groups_and_json_keeps_them() -> None:
    nodes = [dict(name=n, module_path=p, bwd_flops=1.0, param_bytes=b) for n, p, b in
             [("e", "emb", P), ("a", "blk", 10.0), ("b", "blk", 10.0), ("h", "head", 0.0), ("l", "head", 5.0)]]
    meta = {"tied": [{"bytes": P, "nodes": ["e", "h"]}, {"bytes": 10.0, "nodes": ["a", "b"]}]}
    g = make_graph(nodes, [(i, i + 1, 4.0) for i in range(4)], name="g", meta=meta)
    c = coarsen(g, depth=1, fold_param_free=False)
    assert c.meta["tied"] == [{"bytes": P, "nodes": [c.names[c.members.index(("e",))],
                                                     next(nm for nm, m in zip(c.names, c.members) if "h" in m)]}]
    assert CompGraph.from_json(c.to_json()).meta["tied"] == c.meta["tied"]
    inside = coarsen(g.replace(meta={"tied": meta["tied"][1:]}), depth=1, fold_param_free=False)
    assert "tied" not in inside.meta  # both users in one group: nothing to copy between stages


# ----------------------------------------------------------------------------------------------- pipeline
def test_stage_holding_the_head_keeps_a_copy_and_the_gradients_are_summed() -> None:
    base, tied = run(lm(False), [0, 0, 1, 1], [(0,), (1,)]), run(lm(), [0, 0, 1, 1], [(0,), (1,)])
    np.testing.assert_array_equal(tied.peak_memory - base.peak_memory, [0.0, 4 * P])  # weight, grad, 2 Adam moments
    sync = allreduce((0, 1), P)
    assert sync > 0
    assert tied.meta["tied_allreduce_time"] == pytest.approx(sync)
    assert tied.step_time == pytest.approx(base.step_time + sync)
    assert tied.comm_time == pytest.approx(base.comm_time + sync)
    assert tied.meta["tied_copy_bytes"] == [0.0, P]
    assert [iv.resource for iv in tied.timeline if iv.label == "tied"] == ["gpu0", "gpu1"]


def test_users_in_one_stage_and_graphs_without_ties_are_unchanged() -> None:
    base, tied = run(lm(False), [0, 0, 0, 1], [(0,), (1,)]), run(lm(), [0, 0, 0, 1], [(0,), (1,)])
    assert tied.step_time == base.step_time and tied.comm_time == base.comm_time
    np.testing.assert_array_equal(tied.peak_memory, base.peak_memory)
    assert "tied_allreduce_time" not in base.meta and tied.meta["tied_allreduce_time"] == 0.0


def test_fsdp_stage_shards_its_copy_and_sums_its_shard() -> None:
    base = run(lm(False), [0, 0, 1, 1], [(0, 1), (2, 3)], sharding="fsdp")
    tied = run(lm(), [0, 0, 1, 1], [(0, 1), (2, 3)], sharding="fsdp")
    # 4 x P / 2 sharded state + the gathered unit (3 x its parameters, here the copy alone)
    np.testing.assert_allclose(tied.peak_memory - base.peak_memory, [0, 0, 2 * P + 3 * P, 2 * P + 3 * P])
    assert tied.meta["tied_allreduce_time"] == pytest.approx(allreduce((0, 2), P / 2))


def test_stages_on_one_device_group_keep_a_copy_each_and_sum_locally() -> None:
    base = run(lm(False), [0, 0, 1, 1], [(0,), (0,)], schedule="interleaved1f1b")
    tied = run(lm(), [0, 0, 1, 1], [(0,), (0,)], schedule="interleaved1f1b")
    assert tied.peak_memory[0] - base.peak_memory[0] == 4 * P
    assert tied.step_time == base.step_time and tied.meta["tied_allreduce_time"] == 0.0


def test_inference_keeps_the_copy_without_a_gradient_sum() -> None:
    base = run(lm(False), [0, 0, 1, 1], [(0,), (1,)], mode="inference")
    tied = run(lm(), [0, 0, 1, 1], [(0,), (1,)], mode="inference")
    np.testing.assert_array_equal(tied.peak_memory - base.peak_memory, [0.0, P])
    assert tied.step_time == base.step_time


@pytest.mark.parametrize("bad,what", [({"tied": [{"bytes": P, "nodes": ["emb", "nope"]}]}, "'nope'"),
                                      ({"tied": [{"bytes": -1.0, "nodes": ["emb", "head"]}]}, "tied'][0]"),
                                      ({"tied": {"emb": "head"}}, "must be a list")])
def test_a_malformed_tie_list_is_named(bad: dict, what: str) -> None:
    g = lm().replace(meta=bad)
    with pytest.raises(GraphError, match=what.replace("[", r"\[").replace("]", r"\]")):
        PipelineSimulator(g, table(4, 2), topology(2))


def test_tp_stage_copy_is_the_first_users_shard() -> None:
    from placement_rl.graph.capture import capture_zoo
    from placement_rl.graph.tp import shard_graph

    g = capture_zoo("gpt", batch_size=2, seq_len=8, vocab_size=96, d_model=32, n_layers=2, n_heads=2)
    head = next(nm for nm in reversed(g.names) if nm.startswith("linear"))
    g = g.replace(meta={**g.meta, "tied": [{"bytes": float(g.param_bytes[g.index["embedding"]]),
                                            "nodes": ["embedding", head]}]})
    topo = topology(4)
    stages = np.array([0 if i < g.index[head] - 1 else 1 for i in range(g.num_nodes)])
    plan = StagePlan(stages, ((0, 1), (2, 3)), num_microbatches=2, tp=(2, 2))
    res = PipelineSimulator(g, resolve_costs(g, topo), topo).run(plan)
    assert res.meta["tied_copy_bytes"][1] == pytest.approx(shard_graph(g, 2).param_bytes[g.index["embedding"]])


# ----------------------------------------------------------------------------------------------- planners
def _problem(graph: CompGraph, d: int, memory: float = 1e12):
    from placement_rl.baselines.pipe_common import PipeProblem

    topo = DeviceTopology.from_dict({**topology(d).to_dict(), "devices": [
        {"name": "gpu", "count": d, "kind": "gpu", "peak_flops": 1e12, "mem_bandwidth": 1e15,
         "memory_bytes": memory}]})
    return PipeProblem(graph, table(graph.num_nodes, d), topo, budget=100, seed=0, num_microbatches=1,
                       schedule="1f1b", batch_size=None)


@pytest.mark.parametrize("sharding", ["dp", "fsdp"])
def test_exacts_objective_prices_the_tied_gradient_sum_as_the_simulator(sharding: str) -> None:
    from placement_rl.baselines import pipe_tp

    pp = _problem(lm(), 3)
    for cuts in ([0, 2, 4], [0, 1, 4], [0, 3, 4], [0, 1, 3, 4], [0, 1, 2, 4]):
        s = len(cuts) - 1
        sim = pp.sim.run(pp.plan(cuts, (1,) * s, m=1, sharding=sharding))
        assert pipe_tp.cut_objective(pp, cuts, 1, 1, sharding) == pytest.approx(sim.step_time, rel=1e-12, abs=0)
    assert pp.sim.run(pp.plan([0, 2, 4], (1, 1), m=1)).meta["tied_allreduce_time"] > 0


def test_planner_memory_counts_the_copy_of_a_tied_parameter() -> None:
    from placement_rl.baselines import pipe_tp
    from placement_rl.baselines.pipe_common import cut_grid

    tied, untied = _problem(lm(), 2, memory=4.2 * P), _problem(lm(False), 2, memory=4.2 * P)
    # positions [1, 4) (mid, head, loss): 100 bytes of their own, plus a copy of the embedding when tied
    assert untied.stage_fits(4, 1, 2, 1, 1, 1)[1] and not tied.stage_fits(4, 1, 2, 1, 1, 1)[1]
    assert tied.copy_bytes(np.array([0, 1, 2, 3]), 4).tolist() == [0.0, P, P, 0.0]  # [3, 4): the loss alone
    assert pipe_tp._Stages(tied, cut_grid(4, pipe_tp.EXACT_GRID), 1, 1, 1).params[1, 4] == 100.0 + P
    assert np.isfinite(pipe_tp.cut_objective(untied, [0, 1, 4], 1, 1))
    assert pipe_tp.cut_objective(tied, [0, 1, 4], 1, 1) == np.inf  # as the simulator, which finds it over memory
    assert not tied.sim.run(tied.plan([0, 1, 4], (1, 1), m=1)).feasible
    assert untied.sim.run(untied.plan([0, 1, 4], (1, 1), m=1)).feasible
