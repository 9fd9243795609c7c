"""Dropout streams of a deployed plan: each pipeline rank draws its own masks, a TP group shares one stream for the
replicated regions, and a region on local shards (heads, hidden features between a column and its row) draws each
TP rank's own mask, the same again when the region is recomputed."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from placement_rl.executor._mesh import parallel_dims
from placement_rl.executor._tp_rng import rank_stream
from placement_rl.executor.distributed import DeployConfig, DeploySpec, deploy_stage_plans
from placement_rl.executor.distributed_worker import dropout_seed
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture, capture_zoo
from placement_rl.plans import StagePlan

torch.set_num_threads(1)
GPT = dict(batch_size=4, seq_len=8, vocab_size=32, d_model=16, n_layers=2, n_heads=2, dropout=0.5)


class TwoDrop(nn.Module):
    """Two dropouts of one shape: the loss is 0 exactly when they drop the same elements."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.a, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.drop1, self.drop2 = nn.Dropout(0.5), nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((self.drop1(x) * self.a - self.drop2(x) * self.b) ** 2).mean()


class Pair(nn.Module):
    """Column -> dropout -> row, the column's two output halves equal and the row taking their difference: the loss
    is 0 exactly when TP rank 0's mask of its half equals rank 1's of its half."""

    def __init__(self, f: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.col, self.row, self.drop = nn.Linear(f, 2 * f), nn.Linear(2 * f, f, bias=False), nn.Dropout(0.5)
        with torch.no_grad():
            self.col.weight[f:], self.col.bias[f:] = self.col.weight[:f], self.col.bias[:f]
            self.row.weight.copy_(torch.cat([torch.eye(f), -torch.eye(f)], 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.row(self.drop(self.col(x))) ** 2).mean()


def test_dropout_seed_differs_per_pipeline_rank_and_replica_and_is_shared_by_a_tp_group():
    n = 12
    plan = StagePlan(np.minimum(np.arange(n) // 4, 2), ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)), tp=(2, 2, 2),
                     num_microbatches=3, schedule="gpipe")
    dims = parallel_dims(plan)  # dp 2 x pp 3 x tp 2
    seeds = {}
    for rank in range(dims.world_size):
        seeds.setdefault(dims.coords(rank), set()).add(dropout_seed(dims, rank))
    assert len(seeds) == 6 and all(len(s) == 1 for s in seeds.values())  # one seed per TP group
    assert len({s.pop() for s in seeds.values()}) == 6  # ... and a different one per (replica, pipeline rank)


def test_rank_stream_draws_per_rank_masks_keeps_the_shared_stream_in_step_and_repeats_on_recompute():
    x = torch.ones(64)
    masks, after = [], []
    for rank in (0, 1):  # the two ranks of a TP group, their shared stream seeded alike
        torch.manual_seed(7)
        masks.append(rank_stream(torch.ops.aten.dropout.default, rank, 2, x, 0.5, True))
        after.append(torch.rand(4))
    assert not torch.equal(masks[0], masks[1])  # each rank's shard gets its own mask
    assert torch.equal(after[0], after[1])  # the replicated regions still draw one mask for the group
    torch.manual_seed(7)  # what recomputation does: the region's stream restored
    assert torch.equal(rank_stream(torch.ops.aten.dropout.default, 1, 2, x, 0.5, True), masks[1])


def test_only_the_dropouts_of_regions_on_local_shards_draw_per_rank():
    from placement_rl.executor._stages import export_step, program_module
    from placement_rl.executor._tp_rng import local_random_ops
    from placement_rl.executor._tp_region import local_regions, node_kinds

    ov = dict(GPT, n_layers=1)
    kinds = node_kinds(capture_zoo("gpt", **ov))
    for p, want in ((0.5, ["dropout_1"]), (0.0, [])):  # p = 0: the program runs as it was
        module, inputs = zoo.build("gpt", **dict(ov, dropout=p))
        gm = program_module(export_step(module, inputs))
        got = local_random_ops(gm, kinds, local_regions(gm, kinds, 2))
        drops = [n.name for n in gm.graph.nodes if "dropout" in str(n.target)]
        assert drops == ["dropout", "dropout_1", "dropout_2", "dropout_3"]  # embeddings, attention, 2 residuals
        assert [n.name for n in got] == want  # the attention probabilities' dropout, on the rank's heads


@pytest.mark.slow
@pytest.mark.distributed
def test_pipeline_stages_and_tp_shards_draw_their_own_masks_and_recompute_repeats_them():
    """One launch of 2 ranks. PP 2 with a dropout per stage and TP 2 with a dropout between a column and its row:
    the loss was exactly 0 on every step (the masks equal); now it is not. GPT (dropout 0.5) at TP 2: the
    attention's dropout draws per TP rank, and recomputing the attention (selective) gives the same losses and
    gradients as keeping its activations."""
    torch.manual_seed(0)
    two, x = TwoDrop(), torch.randn(8, 64)
    g_two = capture(copy.deepcopy(two), (x,), name="twodrop")
    son = np.zeros(g_two.num_nodes, dtype=np.int64)
    son[[i for i, t in enumerate(g_two.op_types) if t == "dropout"][1]:] = 1
    pair, xp = Pair(), torch.randn(4, 8)
    g_pair = capture(copy.deepcopy(pair), (xp,), name="pair")
    g_gpt = capture_zoo("gpt", **GPT)
    whole = np.zeros(g_gpt.num_nodes, dtype=np.int64)
    specs = [DeploySpec(plan=StagePlan(son, ((0,), (1,)), num_microbatches=2, schedule="gpipe"), graph=g_two,
                        module=two, inputs=(x,)),
             DeploySpec(plan=StagePlan(np.zeros(g_pair.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,)),
                        graph=g_pair, module=pair, inputs=(xp,))]
    specs += [DeploySpec(plan=StagePlan(whole, ((0, 1),), tp=(2,), recompute=(mode,)), graph=g_gpt, model="gpt",
                         overrides=GPT) for mode in ("none", "selective")]
    pp, tp, kept, recomputed = deploy_stage_plans(specs, config=DeployConfig(
        steps=2, warmup=0, lr=1e-6, collect_grads=True, device="cpu", timeout_s=180))
    assert min(pp.losses) > 0.5 and min(tp.losses) > 0.05
    assert kept.losses == pytest.approx(recomputed.losses, abs=1e-6)
    for key, ref in kept.grads.items():
        torch.testing.assert_close(recomputed.grads[key], ref, atol=1e-6, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
