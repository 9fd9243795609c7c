"""TP regions of attention written the common ways: fused ``scaled_dot_product_attention`` (SDPA) on each rank's
local heads, a fused QKV cut by ``chunk``, laid out head-major or reshaped ``(3, heads, head_dim)`` (timm / ViT),
separate q / k / v projections (one region of three columns); a region that cannot run is refused before launch."""

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
from placement_rl.graph.capture import capture
from placement_rl.plans import StagePlan

torch.set_num_threads(1)


class Attn(nn.Module):
    """One attention block with SDPA; ``style`` says how q, k and v come out of the projection(s)."""

    def __init__(self, style: str, d: int = 32, h: int = 4) -> None:
        super().__init__()
        self.style, self.h = style, h
        self.qkv = nn.Linear(d, 3 * d) if style != "separate" else None
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3)) if style == "separate" else (None,) * 3
        self.o = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h, dh = self.h, d // self.h
        mask = None
        if self.style == "timm":
            q, k, v = self.qkv(x).reshape(b, t, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
        elif self.style == "chunk":
            q, k, v = (z.view(b, t, h, dh).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        elif self.style == "headmajor":
            q, k, v = self.qkv(x).view(b, t, h, 3 * dh).transpose(1, 2).split(dh, -1)
        else:
            q, k, v = (p(x).view(b, t, -1, dh).transpose(1, 2) for p in (self.q, self.k, self.v))
            if self.style == "heads_mask":  # a replicated mask that differs per head: no local rule
                mask = torch.arange(h, dtype=x.dtype).view(1, h, 1, 1).expand(1, h, t, t)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.o(a.transpose(1, 2).reshape(b, t, d)).square().mean()


def _model(style: str, h: int = 4, d: int = 32):
    torch.manual_seed(0)
    if style == "heads_mask":
        m = Attn("separate", d, h)
        m.style = "heads_mask"
    else:
        m = Attn(style, d, h)
    return m, (torch.randn(4, 6, d),)


def _program(style: str, h: int = 4, d: int = 32):
    m, inputs = _model(style, h, d)
    g = capture(m, inputs, name=style)
    return g, program_module(export_step(m, list(inputs))), node_kinds(g)


def _plan(g) -> StagePlan:
    return StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,))


@pytest.mark.parametrize("style,k", [("timm", 3), ("chunk", 3), ("headmajor", 1), ("separate", 1)])
def test_sdpa_regions_run_on_local_heads(style, k):
    """Each layout's region gets a local rule for every op, SDPA included; the fused cuts interleave 3 chunks (the
    head-major layout already gives each rank whole heads of q, k and v)."""
    _, gm, kinds = _program(style)
    [cols] = column_groups(gm, kinds)
    assert len(cols) == (3 if style == "separate" else 1)
    got = local_region(gm, cols, kinds, 2)
    assert got is not None and got[1] == k
    views = [a[1] for n, a in got[0].items() if "view" in str(n.target) or "reshape" in str(n.target)]
    if style == "timm":
        assert [4, 6, 3, 2, 8] in views  # 2 of the 4 heads of each of q, k and v per rank
    if style == "separate":
        assert views.count([4, 6, -1, 8]) == 3  # a -1 infers the local heads


def test_unsplittable_attention_refused_before_launch(tmp_path):
    """SDPA with a mask that differs per head, and a (3, heads, head_dim) view of 3 heads at TP 2: one-line
    PlanErrors before any process starts, not a rank traceback or a hang."""
    g, _, _ = _program("heads_mask")
    m, inputs = _model("heads_mask")
    with pytest.raises(PlanError, match="scaled_dot_product_attention.*attn_implementation='eager'"):
        prepare_job([DeploySpec(plan=_plan(g), graph=g, module=m, inputs=inputs)], job_dir=tmp_path / "a")
    g, _, _ = _program("timm", h=3, d=24)
    m, inputs = _model("timm", h=3, d=24)
    with pytest.raises(PlanError, match=r"reshapes its output to \[4, 6, 3, 3, 8\].*whole heads"):
        prepare_job([DeploySpec(plan=_plan(g), graph=g, module=m, inputs=inputs)], job_dir=tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_sdpa_attention_at_tp2_gradients_equal_one_process():
    """The four layouts at TP 2 on gloo in one launch: loss and gradients equal one process."""
    styles = ("timm", "chunk", "headmajor", "separate")
    specs = []
    for style in styles:
        g, _, _ = _program(style)
        m, inputs = _model(style)
        specs.append(DeploySpec(plan=_plan(g), graph=g, module=m, inputs=inputs))
    results = deploy_stage_plans(specs, config=DeployConfig(steps=1, warmup=0, collect_grads=True, device="cpu",
                                                            timeout_s=120))
    for style, res in zip(styles, results):
        loss, grads = reference_step(_model(style)[0], _model(style)[1], chunks=1)
        assert res.losses[0] == pytest.approx(loss, abs=1e-6) and set(res.grads) == set(grads), style
        for key, ref in grads.items():
            torch.testing.assert_close(res.grads[key], ref, atol=1e-6, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
