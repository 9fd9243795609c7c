"""Capture of users' own models: torch.nn container modules on the fx path, custom autograd Functions."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from placement_rl.graph import capture


class Seq2Seq(nn.Module):
    """The textbook PyTorch encoder-decoder: nn.TransformerEncoder + nn.TransformerDecoder with a causal mask
    buffer, tied LM head. torch.export cannot read the mask's values (the decoder checks whether it is causal)."""

    def __init__(self, causal_flag: bool = False, V: int = 50, D: int = 16, L: int = 2) -> None:
        super().__init__()
        self.causal_flag = causal_flag
        self.emb = nn.Embedding(V, D)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 2, 32, batch_first=True, dropout=0.0), L,
                                         enable_nested_tensor=False)
        self.dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, 2, 32, batch_first=True, dropout=0.0), L)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("mask", torch.triu(torch.full((6, 6), float("-inf")), 1))

    def forward(self, src, tgt_in, tgt_out):
        mem = self.enc(self.emb(src))
        if self.causal_flag:
            h = self.dec(self.emb(tgt_in), mem, tgt_mask=self.mask, tgt_is_causal=True)
        else:
            h = self.dec(self.emb(tgt_in), mem, tgt_mask=self.mask)
        return F.cross_entropy(self.head(h).flatten(0, 1), tgt_out.flatten())


def _seq2seq(causal_flag: bool):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 50, shape, generator=g) for shape in ((4, 8), (4, 6), (4, 6))]
    return Seq2Seq(causal_flag), tuple(ids)


def _capture(module, inputs, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture.capture(module, inputs, **kw)
    return g, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_fx_fallback_prices_transformer_modules_op_by_op_like_export():
    """Export fails on the causal-mask check and fx used to keep the encoder and the decoder as two nodes priced
    as one kernel each (attention FLOPs missing). Now their ops are nodes, the FLOPs equal the export capture of
    the same model told the mask is causal, and the warning names that fix."""
    g, warned = _capture(*_seq2seq(False))
    ref = capture.capture(*_seq2seq(True))
    assert g.meta["capture_method"] == "fx" and ref.meta["capture_method"] == "export"
    assert len(warned) == 1 and "likely fix: pass tgt_is_causal=True to TransformerDecoder" in warned[0]
    assert "whole_modules" not in g.meta
    assert not {"transformerencoder", "transformerdecoder"} & set(g.op_types)
    assert abs(g.num_nodes - ref.num_nodes) <= 2 and g.num_nodes > 100
    assert g.fwd_flops.sum() == ref.fwd_flops.sum()
    assert g.param_bytes.sum() == ref.param_bytes.sum() == g.meta["param_bytes"]
    attn = [i for i, op in enumerate(g.op_types) if op == "scaled_dot_product_attention"]
    assert len(attn) == 6 and all(g.fwd_flops[i] > 0 for i in attn)  # counted on CPU tensors too
    assert "enc.layers.1.self_attn" in g.module_paths and "dec.layers.0.multihead_attn" in g.module_paths
    assert g.bwd_flops.sum() == pytest.approx(ref.bwd_flops.sum(), rel=0.05)


class _Opaque(nn.Module):
    """A torch.nn-style container with a no-grad region: its ops are not a plain list of aten ops (the grad mode
    switches), so it cannot be traced op by op."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            s = self.inner(x).sigmoid()
        return x * s


_Opaque.__module__ = "torch.nn.modules.stub"  # fx keeps torch.nn modules whole


class UsesOpaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l, self.block = nn.Linear(8, 8), _Opaque()

    def forward(self, x):
        return self.block(self.l(x)).pow(2).mean()


def test_a_container_left_whole_is_named_in_one_warning():
    g, warned = _capture(UsesOpaque(), (torch.randn(4, 8),), method="fx")
    assert g.meta["whole_modules"] == ["block (_Opaque)"] and g.op_types == ("linear", "_opaque", "pow", "mean")
    assert warned == ["1 graph node(s) are whole modules priced as one op (no inner ops, FLOPs of ops torch "
                      "cannot count missing, no split inside): block (_Opaque)"]


class STE(torch.autograd.Function):
    """Straight-through estimator: clamps forward, passes the gradient unchanged."""

    @staticmethod
    def forward(ctx, x):
        return x.clamp(-0.5, 0.5)

    @staticmethod
    def backward(ctx, g):
        return g


class STEModel(nn.Module):
    def __init__(self, rows: bool = False) -> None:
        super().__init__()
        self.l1, self.l2, self.rows = nn.Linear(8, 8), nn.Linear(8, 3), rows

    def forward(self, x, y):
        h = STE.apply(self.l1(x) * 3)
        if self.rows:  # data-dependent shape: cannot run on meta tensors
            keep = (y >= 0).nonzero().squeeze(-1)
            h, y = h[keep], y[keep]
        return F.cross_entropy(self.l2(h), y)


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.l2(checkpoint(self.l1, x, use_reentrant=True)), y)


class Broken(nn.Module):
    def forward(self, x, y):
        raise RuntimeError("no forward")


def _xy():
    return torch.randn(4, 8), torch.randint(0, 3, (4,))


@pytest.mark.parametrize("method", ["export", "fx"])
def test_a_custom_autograd_function_is_named_in_one_warning(method):
    g, warned = _capture(STEModel(), _xy(), method=method)
    assert g.meta["autograd_functions"] == ["STE"]
    assert len(warned) == 1 and warned[0].startswith("STE: custom torch.autograd.Function backward not captured")


def names(module, inputs) -> list[str]:
    from placement_rl.graph.autograd_fns import custom_autograd_functions

    return [c.__qualname__ for c in custom_autograd_functions(module, inputs) or ()]


def test_the_autograd_function_check_is_quiet_elsewhere_and_never_raises():
    torch.set_num_threads(1)
    assert names(STEModel(rows=True), _xy()) == ["STE"]  # found on real tensors
    assert names(Checkpointed(), _xy()) == []  # torch's own Function
    assert names(Broken(), _xy()) == []
    module = STEModel()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    g, warned = _capture(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (torch.randn(4, 8),))
    assert warned == [] and "autograd_functions" not in g.meta
    names(module, _xy())
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters())
