"""TP and sequence parallelism on models whose first TP region is fed by a whole (replicated) input -- blocks on
features or a patch embedding, no vocab-parallel embedding in front --, GQA written with ``repeat_interleave``,
views written with ``unflatten``, an MoE's auxiliary loss, and the one-line refusals before launch (a sequence TP
does not divide, heads TP does not divide, an unequal fused split) that name their cause."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.errors import PlanError
from placement_rl.executor._tp_region import column_groups, local_region, node_kinds
from placement_rl.executor.distributed import (DeployConfig, DeploySpec, deploy_stage_plans, export_step,
                                               prepare_job, program_module, reference_step)
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture, capture_zoo
from placement_rl.plans import StagePlan

torch.set_num_threads(1)


class Block(nn.Module):
    """Pre-LN attention (SDPA, causal) + MLP. ``style``: ``view`` (HF), ``unflatten`` (heads by ``unflatten``),
    ``repeat`` (GQA by ``repeat_interleave``), ``fused`` (one QKV cut by ``split`` into q, k, v of GQA sizes)."""

    def __init__(self, d: int, h: int, kv: int, style: str) -> None:
        super().__init__()
        self.h, self.kv, self.dh, self.style = h, kv, d // h, style
        if style == "fused":
            self.qkv = nn.Linear(d, d + 2 * kv * self.dh)
        else:
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, kv * self.dh), nn.Linear(d, kv * self.dh)
        self.o, self.ln, self.ln2 = nn.Linear(d, d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        if self.style == "fused":
            q, k, v = self.qkv(x).split([d, self.kv * self.dh, self.kv * self.dh], -1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        if self.style == "unflatten":
            q, k, v = (z.unflatten(-1, (-1, self.dh)).transpose(1, 2) for z in (q, k, v))
        else:
            q, k, v = (z.view(b, t, -1, self.dh).transpose(1, 2) for z in (q, k, v))
        if self.h > self.kv:
            k, v = k.repeat_interleave(self.h // self.kv, 1), v.repeat_interleave(self.h // self.kv, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Net(nn.Module):
    """A patch embedding (``Conv1d``, as a ViT's) or plain features, two blocks and a regression loss."""

    def __init__(self, d: int = 32, h: int = 4, kv: int = 4, style: str = "view", patches: bool = False) -> None:
        super().__init__()
        self.patch = nn.Conv1d(3, d, 2, stride=2) if patches else None
        self.blocks = nn.ModuleList(Block(d, h, kv, style) for _ in range(2))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.patch is not None:
            x = self.patch(x).transpose(1, 2)
        for blk in self.blocks:
            x = blk(x)
        return F.mse_loss(self.head(x).squeeze(-1), y)


def _model(t: int = 6, **kw):
    torch.manual_seed(0)
    m = Net(**kw)
    x = torch.randn(4, 3, 2 * t) if kw.get("patches") else torch.randn(4, t, kw.get("d", 32))
    return m, (x, torch.randn(4, t))


def _spec(t: int = 6, sp: bool = False, **kw) -> DeploySpec:
    m, inputs = _model(t, **kw)
    g = capture(m, inputs, name="blocks")
    plan = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), sequence_parallel=sp)
    return DeploySpec(plan=plan, graph=g, module=m, inputs=inputs)


def _refusal(tmp_path, **kw) -> str:
    with pytest.raises(PlanError) as err:
        prepare_job([_spec(**kw)], job_dir=tmp_path / "job")
    assert not (tmp_path / "job").exists()
    return str(err.value)


# ----------------------------------------------------------------------------- no processes
def test_sequence_parallel_with_a_sequence_tp_does_not_divide_refused_before_launch(tmp_path):
    msg = _refusal(tmp_path, t=5, sp=True)
    assert "sequence length 5 is not divisible by TP 2: sequence_parallel needs it" in msg and "\n" not in msg
    prepare_job([_spec(t=5)], job_dir=tmp_path / "no_sp")  # without sequence parallelism it runs


@pytest.mark.parametrize("style,kv", [("repeat", 2), ("unflatten", 4)])
def test_repeat_interleave_and_unflatten_regions_run_on_local_heads(style, kv, tmp_path):
    m, inputs = _model(style=style, kv=kv)
    g = capture(m, inputs, name=style)
    gm, kinds = program_module(export_step(m, list(inputs))), node_kinds(g)
    for cols in column_groups(gm, kinds):
        assert local_region(gm, cols, kinds, 2) is not None, [c.name for c in cols]
    prepare_job([_spec(style=style, kv=kv)], job_dir=tmp_path / "job")


def test_refusals_name_the_heads_or_the_split_that_tp_cannot_divide(tmp_path):
    msg = _refusal(tmp_path, d=24, h=3, kv=3)
    assert "it has 3 heads; choose a TP degree dividing 3" in msg and "fused" not in msg
    msg = _refusal(tmp_path, kv=1, style="repeat")
    assert "it has a single head; use tp=1" in msg and "fused" not in msg
    msg = _refusal(tmp_path, kv=2, style="fused")
    assert "'split_with_sizes' cuts a projection into parts [32, 16, 16]" in msg and "mask" not in msg


# ----------------------------------------------------------------------------- gloo processes
def _check(specs, results, models) -> None:
    for spec, res, (m, inputs) in zip(specs, results, models):
        loss, grads = reference_step(m, inputs, chunks=1)
        assert res.losses[0] == pytest.approx(loss, abs=1e-5) and set(res.grads) == set(grads)
        for key, ref in grads.items():
            torch.testing.assert_close(res.grads[key], ref, atol=1e-5, rtol=1e-4, msg=lambda s, k=key: f"{k}: {s}")


@pytest.mark.slow
@pytest.mark.distributed
def test_sequence_parallel_on_whole_inputs_and_new_head_ops_gradients_equal_one_process():
    """TP 2 with sequence parallelism on blocks fed by features, by a patch convolution, with GQA by
    ``repeat_interleave``; and TP 2 with ``unflatten`` views: loss and gradients equal one process."""
    cases = [dict(sp=True), dict(sp=True, patches=True), dict(sp=True, style="repeat", kv=2),
             dict(style="unflatten")]
    specs = [_spec(**kw) for kw in cases]
    results = deploy_stage_plans(specs, config=DeployConfig(steps=1, warmup=0, collect_grads=True, device="cpu",
                                                            timeout_s=120))
    _check(specs, results, [_model(**{k: v for k, v in kw.items() if k != "sp"}) for kw in cases])


@pytest.mark.slow
@pytest.mark.distributed
def test_moe_at_tp2_gradients_equal_one_process():
    """The zoo MoE's auxiliary loss (plain) added to the vocab-parallel loss (a DTensor): its gradient reaches the
    experts' row GEMMs as a plain tensor."""
    opts = dict(zoo.tiny("moe"), dropout=0.0)
    g = capture_zoo("moe", **opts)
    plan = StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,))
    specs = [DeploySpec(plan=plan, graph=g, model="moe", overrides=opts)]
    results = deploy_stage_plans(specs, config=DeployConfig(steps=1, warmup=0, collect_grads=True, device="cpu",
                                                            timeout_s=120))
    _check(specs, results, [zoo.build("moe", **opts)])
