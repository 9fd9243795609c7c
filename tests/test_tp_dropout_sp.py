"""Dropout on elements each TP rank holds alone draws the rank's own mask, as Megatron's model-parallel RNG tracker
does: in a TP region left to DTensor (sharded on its hidden features) and, under sequence parallelism, on the
sequence-sharded residual stream (each rank its slice of the sequence); dropout on the replicated stream outside
sequence parallelism draws one mask for the TP group."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from placement_rl.executor._stages import export_step, program_module
from placement_rl.executor._tp_region import local_regions, node_kinds
from placement_rl.executor._tp_rng import local_random_ops, own_streams, placed_stream, rank_stream
from placement_rl.executor.distributed import DeployConfig, DeploySpec, deploy_stage_plans, reference_step
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture, capture_zoo
from placement_rl.plans import StagePlan

torch.set_num_threads(1)
GPT = dict(batch_size=4, seq_len=8, vocab_size=32, d_model=16, n_layers=1, n_heads=2, dropout=0.5)
DROP = torch.ops.aten.dropout.default


class Fallback(nn.Module):
    """Column -> ``abs`` (no local-shard rule: the region runs on DTensors) -> dropout -> row. ``twin``: the column's
    two output halves equal and the row taking their difference, so the loss is 0 exactly when TP rank 0's mask of
    its half equals rank 1's of its half."""

    def __init__(self, p: float, twin: bool, f: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.col, self.row, self.drop = nn.Linear(f, 2 * f), nn.Linear(2 * f, f, bias=False), nn.Dropout(p)
        if twin:
            with torch.no_grad():
                self.col.weight[f:], self.col.bias[f:] = self.col.weight[:f], self.col.bias[:f]
                self.row.weight.copy_(torch.cat([torch.eye(f), -torch.eye(f)], 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.row(self.drop(self.col(x).abs())) ** 2).mean()


class SeqPair(nn.Module):
    """Two pre-LN MLPs, the first one's output dropped on the residual stream between them (which sequence
    parallelism shards on the sequence), and a loss on the difference of the sequence's two halves: with the
    input's halves equal it is 0 exactly when both halves drop the same elements (under sequence parallelism TP
    rank 0 holds the first half, rank 1 the second)."""

    def __init__(self, p: float, d: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ln1, self.ln2, self.drop = nn.LayerNorm(d), nn.LayerNorm(d), nn.Dropout(p)
        self.up1, self.down1 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.up2, self.down2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.drop(self.down1(F.gelu(self.up1(self.ln1(x)))))
        h = h + self.down2(F.gelu(self.up2(self.ln2(h))))
        s = h.shape[1] // 2
        return ((h[:, :s] - h[:, s:]) ** 2).mean()


def _fallback(p: float, twin: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(1)
    return Fallback(p, twin), (torch.randn(4, 8),)


def _seq_pair(p: float, twin: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(1)
    half = torch.randn(4, 2, 8)
    return SeqPair(p), (torch.cat([half, half if twin else torch.randn(4, 2, 8)], 1),)


def _routed(module: nn.Module, inputs: tuple, kinds: dict[str, str]) -> dict[str, tuple[str, tuple]]:
    """Dropout node name -> (the stream function :func:`own_streams` routes it through as TP rank 1 of 2, the rank
    and size it passes)."""
    gm = program_module(export_step(module, inputs))
    own_streams(gm, local_random_ops(gm, kinds, local_regions(gm, kinds, 2)), 1, 2)
    return {n.name: (n.target.__name__, n.args[1:3]) for n in gm.graph.nodes if n.target in (rank_stream,
                                                                                                placed_stream)}


def test_the_dropout_of_a_region_left_to_dtensor_draws_by_its_placements():
    module, inputs = _fallback(0.5, twin=False)
    kinds = node_kinds(capture(copy.deepcopy(module), inputs, name="fallback"))
    assert _routed(module, inputs, kinds) == {"dropout": ("placed_stream", (1, 2))}
    assert _routed(_fallback(0.0, twin=False)[0], inputs, kinds) == {}  # p = 0 draws nothing: left as it was


def test_gpt_dropouts_outside_the_local_heads_draw_by_their_placements():
    """The attention probabilities' dropout runs on the rank's heads (its own stream); the embeddings' and the
    residual stream's draw by what they receive: whole (the shared stream) or sequence-sharded (the rank's)."""
    kinds = node_kinds(capture_zoo("gpt", **GPT))
    assert _routed(*zoo.build("gpt", **GPT), kinds) == {  # embeddings, attention (local heads), 2 residuals
        "dropout": ("placed_stream", (1, 2)), "dropout_1": ("rank_stream", (1, 2)),
        "dropout_2": ("placed_stream", (1, 2)), "dropout_3": ("placed_stream", (1, 2))}


@pytest.fixture
def one_rank_mesh(tmp_path):
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    try:
        from torch.distributed.device_mesh import init_device_mesh

        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_placed_stream_draws_a_sharded_dtensor_from_the_rank_stream_and_a_replicated_one_from_the_shared(
        one_rank_mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    x = torch.rand(2, 4, 6) + 1
    for placement, ref in ((Shard(1), lambda t: rank_stream(DROP, 0, 1, t, 0.5, True)),
                           (Replicate(), lambda t: DROP(t, 0.5, True))):
        leaf = x.clone().requires_grad_()
        dx = DTensor.from_local(leaf, one_rank_mesh, [placement], run_check=False)
        torch.manual_seed(3)
        out = placed_stream(DROP, 0, 1, dx, 0.5, True)
        after = torch.rand(3)
        torch.manual_seed(3)
        want = ref(x)
        assert isinstance(out, DTensor) and tuple(out.placements) == (placement,)
        assert torch.equal(out.to_local(), want) and torch.equal(torch.rand(3), after)  # the same draws, in step
        out.to_local().sum().backward()
        assert torch.equal(leaf.grad, want / x)  # the mask's gradient: 2 where kept, 0 where dropped
    torch.manual_seed(3)
    plain = placed_stream(DROP, 0, 1, x, 0.5, True)  # a plain tensor: the shared stream, as the op itself
    torch.manual_seed(3)
    assert torch.equal(plain, DROP(x, 0.5, True))


@pytest.mark.slow
@pytest.mark.distributed
def test_dtensor_regions_and_the_sequence_sharded_stream_draw_per_tp_rank(tmp_path):
    """One launch of 2 ranks at TP 2. A region left to DTensor and the sequence-sharded stream under sequence
    parallelism, built so that the loss is 0 exactly when the two TP ranks drop the same elements of their shards:
    it was 0 on every step (one mask for the TP group); now it is not. Outside sequence parallelism the replicated
    stream drops the same elements on both ranks (their gradients equal), and with sequence parallelism the
    replicated parameters' gradients still agree. GPT under sequence parallelism recomputed (full) gives the same
    losses and gradients as keeping its activations; at dropout 0 every model's loss and gradients equal one
    process."""
    def spec(make, p, twin, sp=False):
        module, inputs = make(p, twin)
        g = capture(copy.deepcopy(module), inputs, name=make.__name__.strip("_"))
        plan = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), sequence_parallel=sp)
        return DeploySpec(plan=plan, graph=g, module=module, inputs=inputs)

    g_gpt = capture_zoo("gpt", **GPT)
    gpt = [DeploySpec(plan=StagePlan(np.zeros(g_gpt.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), recompute=(mode,),
                                     sequence_parallel=True), graph=g_gpt, model="gpt", overrides=GPT)
           for mode in ("none", "full")]
    specs = [spec(_fallback, 0.5, True), spec(_seq_pair, 0.5, True, sp=True), spec(_seq_pair, 0.5, False),
             spec(_seq_pair, 0.5, False, sp=True), *gpt, spec(_fallback, 0.0, False),
             spec(_seq_pair, 0.0, False, sp=True)]
    res = deploy_stage_plans(specs, job_dir=tmp_path / "j", config=DeployConfig(
        steps=2, warmup=0, lr=1e-6, collect_grads=True, device="cpu", timeout_s=240, keep_job_dir=True))
    assert min(res[0].losses) > 1e-3 and min(res[1].losses) > 1e-3  # the ranks' masks differ
    for k in (2, 3):  # the replicated stream, and the replicated parameters under sequence parallelism
        g0, g1 = (torch.load(tmp_path / "j" / f"part{k}" / "result" / f"rank{r}_grads.pt") for r in (0, 1))
        assert set(g0) == set(g1) and {"ln2.weight", "down1.bias"} <= set(g0)
        for key in g0:
            torch.testing.assert_close(g0[key], g1[key], atol=0, rtol=0, msg=lambda m, k=key: f"{k}: {m}")
    kept, recomputed = res[4], res[5]
    assert kept.losses == pytest.approx(recomputed.losses, abs=1e-6)
    for key, ref in kept.grads.items():
        torch.testing.assert_close(recomputed.grads[key], ref, atol=1e-6, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    for got, make in ((res[6], _fallback), (res[7], _seq_pair)):
        module, inputs = make(0.0, False)
        loss, grads = reference_step(module, inputs, chunks=1)
        assert got.losses[0] == pytest.approx(loss, abs=1e-6)
        for key, ref in grads.items():
            torch.testing.assert_close(got.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
