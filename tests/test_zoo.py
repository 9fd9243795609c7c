"""Zoo: names, defaults, option checking, seeded builds, and a real training step per model."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from placement_rl.errors import GraphError
from placement_rl.graph import zoo

HAS_HF = importlib.util.find_spec("transformers") is not None
CORE = ["mlp", "resnet18", "resnet50", "inception", "nmt", "gpt", "moe"]
LM = zoo.tiny("gpt")


def _build_tiny(name: str):
    if name.endswith("_hf"):
        pytest.importorskip("transformers")
    return zoo.build(name, **zoo.tiny(name))


def test_names_lists_core_models_and_hf_only_with_transformers():
    names = zoo.names()
    assert names[:len(CORE)] == CORE
    assert ("gpt2_hf" in names) == HAS_HF and ("bert_hf" in names) == HAS_HF


def test_tiny_overrides_are_valid_options_of_every_model():
    for name in zoo.names():
        assert set(zoo.tiny(name)) <= set(zoo.describe(name))
        assert zoo.tiny(name)["batch_size"] <= zoo.describe(name)["batch_size"]


def test_describe_returns_a_copy_of_the_defaults():
    d = zoo.describe("gpt")
    assert {"batch_size", "seq_len", "vocab_size", "d_model", "n_layers", "n_heads", "seed"} <= set(d)
    d["batch_size"] = -1
    assert zoo.describe("gpt")["batch_size"] > 0
    for name in zoo.names():
        assert zoo.describe(name)["batch_size"] > 0


def test_unknown_name_raises_graph_error_listing_valid_names():
    with pytest.raises(GraphError, match=r"unknown zoo model 'vgg'.*valid names: mlp, resnet18"):
        zoo.build("vgg")
    with pytest.raises(GraphError, match="unknown zoo model"):
        zoo.describe("vgg")


def test_bad_overrides_raise_graph_error_naming_the_option():
    with pytest.raises(GraphError, match=r"no option 'layers'.*valid options: batch_size, seq_len"):
        zoo.build("gpt", layers=2)
    with pytest.raises(GraphError, match=r"batch_size='8' must be of type int"):
        zoo.build("mlp", batch_size="8")
    with pytest.raises(GraphError, match=r"n_heads=5 must divide d_model=32"):
        zoo.build("gpt", **dict(LM, n_heads=5))
    with pytest.raises(GraphError, match=r"hidden=0 must be > 0"):
        zoo.build("mlp", hidden=0)
    with pytest.raises(GraphError, match=r"top_k=5 must be <= n_experts=4"):
        zoo.build("moe", **dict(LM, n_experts=4, top_k=5))


@pytest.mark.parametrize("name", CORE + ["gpt2_hf", "bert_hf"])
def test_every_model_trains_one_step_to_a_finite_loss(name):
    module, inputs = _build_tiny(name)
    assert module.training and isinstance(inputs, tuple)
    loss = module(*inputs)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in module.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_builds_are_seeded_and_leave_the_global_rng_alone():
    state = torch.get_rng_state()
    m1, x1 = zoo.build("gpt", **LM)
    m2, x2 = zoo.build("gpt", **LM)
    m3, x3 = zoo.build("gpt", **dict(LM, seed=1))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(x1, x2))
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert not torch.equal(x1[0], x3[0])


def test_mlp_defaults_train_and_gpt_defaults_have_the_documented_shapes():
    module, (x, y) = zoo.build("mlp")
    d = zoo.describe("mlp")
    assert x.shape == (d["batch_size"], d["in_features"]) and y.shape == (d["batch_size"],)
    module(x, y).backward()
    _, (idx, tgt) = zoo.build("gpt")
    d = zoo.describe("gpt")
    assert idx.shape == tgt.shape == (d["batch_size"], d["seq_len"])
    assert torch.equal(idx[:, 1:], tgt[:, :-1])  # next-token targets


def test_moe_routes_each_token_to_top_k_experts_within_capacity():
    module, (idx, _) = zoo.build("moe", **dict(LM, n_experts=4, top_k=2, capacity_factor=100.0))
    moe = module.blocks[0].ffn
    x = torch.randn(2, 16, 32)
    out, aux = moe(x)
    assert out.shape == x.shape and aux.dim() == 0
    # With ample capacity no token is dropped: the result equals the explicit top-k mixture.
    tokens = x.reshape(-1, 32)
    probs = torch.softmax(moe.router(tokens), -1)
    p, i = probs.topk(2, -1)
    p = p / p.sum(-1, keepdim=True)
    ref = sum(p[:, j:j + 1] * torch.stack([moe.experts[int(e)](t) for t, e in zip(tokens, i[:, j])])
              for j in range(2))
    moe.eval()
    out_eval, _ = moe(x)
    torch.testing.assert_close(out_eval.reshape(-1, 32), ref, rtol=1e-4, atol=1e-5)
