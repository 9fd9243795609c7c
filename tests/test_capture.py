"""Capture: per-node FLOPs/bytes measured on every zoo model, determinism, fx path and fallbacks."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from placement_rl.errors import GraphError
from placement_rl.graph import CompGraph, capture, zoo
from placement_rl.graph.zoo import tiny


MATMUL_OPS = {"conv2d", "linear", "matmul", "mm", "addmm", "bmm", "einsum", "lstm_cell", "baddbmm"}


def _forward_flops(module: nn.Module, inputs: tuple) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(*inputs)
    return counter.get_total_flops()


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", ["mlp", "resnet18", "resnet50", "inception", "nmt", "gpt", "moe", "gpt2_hf", "bert_hf",
                                  "opt_hf", "llama_hf", "mixtral_hf"])
def test_zoo_model_capture_is_exact_and_deterministic(name):
    if name.endswith("_hf"):
        pytest.importorskip("transformers")
    module, inputs = zoo.build(name, **tiny(name))
    g = capture.capture(module, inputs, name=name)
    g.validate()
    assert g.meta["capture_method"] == "export" and g.meta["exec"] == "meta"
    assert g.meta["bwd_flops_fallback"] == [] and g.meta["unused_param_bytes"] == 0
    # The hard requirement: per-node forward FLOPs add up to the module's forward count.
    assert g.fwd_flops.sum() == _forward_flops(module, inputs) > 0
    assert g.param_bytes.sum() == _param_bytes(module) == g.meta["param_bytes"]
    heavy = [i for i, op in enumerate(g.op_types) if op in MATMUL_OPS]
    assert heavy and all(g.bwd_flops[i] > 0 for i in heavy)
    assert g.bwd_flops.sum() >= g.fwd_flops.sum()  # grads of weights (and of most inputs)
    assert g.act_bytes.sum() > 0 and g.out_bytes.sum() > 0 and g.num_edges > 0
    assert g.meta["input_bytes"] == sum(x.numel() * x.element_size() for x in inputs)
    assert any(p for p in g.module_paths)
    again = capture.capture(*zoo.build(name, **tiny(name)), name=name)
    assert again.names == g.names and again.fingerprint() == g.fingerprint()


def test_resnet_nodes_carry_aten_ops_module_paths_and_exact_conv_costs():
    g = capture.capture_zoo("resnet18", **tiny("resnet18"))
    i = g.index["conv2d_1"]
    assert (g.op_types[i], g.module_paths[i]) == ("conv2d", "layer1.0.conv1")
    # 3x3 conv, 8 -> 8 channels on 8x8 maps, batch 2: 2 * B*H*W*Cout*Cin*k*k FLOPs.
    assert g.fwd_flops[i] == 2 * 2 * 8 * 8 * 8 * 8 * 9
    assert g.bwd_flops[i] == 2 * g.fwd_flops[i]  # grad of input and of weight
    assert g.param_bytes[i] == 8 * 8 * 9 * 4
    first = g.index["conv2d"]
    assert g.bwd_flops[first] == g.fwd_flops[first]  # the image needs no grad: weight grad only
    assert g.name == "resnet18" and g.meta["zoo"] == "resnet18"
    assert g.meta["zoo_overrides"] == tiny("resnet18") and g.meta["zoo_options"]["num_classes"] == 10
    assert CompGraph.from_json(g.to_json()).fingerprint() == g.fingerprint()
    json.loads(g.to_json())


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)).sum()


@pytest.mark.parametrize("method", ["export", "fx"])
def test_bytes_saved_for_backward_and_edges_on_a_hand_checked_model(method):
    g = capture.capture(Tiny(), (torch.randn(4, 8),), method=method)
    assert g.num_nodes == 3 and g.meta["capture_method"] == method
    # linear saves its input x [4, 8] (its weight is a parameter, not an activation); relu saves
    # its output [4, 16]; sum saves nothing.
    assert g.act_bytes.tolist() == [4 * 8 * 4, 4 * 16 * 4, 0]
    assert g.out_bytes.tolist() == [256, 256, 4]
    assert g.param_bytes.tolist() == [(8 * 16 + 16) * 4, 0, 0]
    assert g.edges.tolist() == [[0, 1], [1, 2]] and g.edge_bytes.tolist() == [256, 256]
    assert g.fwd_flops.tolist() == [2 * 4 * 8 * 16, 0, 0]
    assert g.bwd_flops.tolist() == [2 * 4 * 8 * 16, 0, 0]  # weight grad only


def test_fx_path_on_mlp_matches_the_export_path():
    module, inputs = zoo.build("mlp", **tiny("mlp"))
    gx = capture.capture(module, inputs, method="fx")
    ge = capture.capture(module, inputs)
    assert gx.meta["capture_method"] == "fx" and gx.meta["exec"] == "real"
    assert gx.fwd_flops.sum() == _forward_flops(module, inputs)
    assert gx.totals() == ge.totals()
    assert gx.op_types.count("linear") == 3 and "hidden.0" in gx.module_paths
    assert gx.fingerprint() == capture.capture(module, inputs, method="fx").fingerprint()


def test_frozen_parameters_count_as_buffers_and_need_no_weight_grad():
    module, inputs = zoo.build("mlp", **tiny("mlp"))
    module.hidden[0].requires_grad_(False)
    g = capture.capture(module, inputs)
    assert g.param_bytes.sum() == _param_bytes(module)
    assert g.meta["buffer_bytes"] == sum(p.numel() * 4 for p in module.hidden[0].parameters())
    assert g.bwd_flops[g.index["linear"]] == 0


def test_capture_leaves_the_module_unchanged():
    module, inputs = zoo.build("resnet18", **tiny("resnet18"))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    capture.capture(module, inputs)
    capture.capture(module, inputs, exec_mode="real")
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


@torch.fx.wrap
def host_scale(x: torch.Tensor) -> torch.Tensor:
    """Host-side numpy preprocessing: fx keeps it as one call, torch.export cannot trace it."""
    return torch.from_numpy(abs(x.detach().numpy()) + 1.0)


class NumpyScaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.fc(x) * host_scale(x), y)


class MaskedRows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.fc2(h[h.sum(1) > 0]).pow(2).mean()  # data-dependent shape


def test_export_failure_falls_back_to_fx_with_a_warning():
    module, inputs = NumpyScaled(), (torch.randn(16, 8), torch.randn(16, 8))
    with pytest.warns(RuntimeWarning, match="falling back to torch.fx"):
        g = capture.capture(module, inputs)
    assert g.meta["capture_method"] == "fx" and "numpy" in g.meta["export_error"]
    assert "host_scale" in g.names
    assert g.fwd_flops.sum() == _forward_flops(module, inputs)


def test_data_dependent_shapes_are_measured_on_real_tensors():
    module, inputs = MaskedRows(), (torch.randn(16, 8, generator=torch.Generator().manual_seed(0)),)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        g = capture.capture(module, inputs)
    assert g.meta["capture_method"] == "export" and g.meta["exec"] == "real"
    assert g.fwd_flops.sum() == _forward_flops(module, inputs)
    with pytest.raises(GraphError, match="cannot measure the exported graph"):
        capture.capture(module, inputs, exec_mode="meta")


def test_bad_arguments_raise_graph_error():
    module, inputs = zoo.build("mlp", **tiny("mlp"))
    with pytest.raises(GraphError, match="unknown capture method 'jit'"):
        capture.capture(module, inputs, method="jit")
    with pytest.raises(GraphError, match="unknown exec_mode"):
        capture.capture(module, inputs, exec_mode="gpu")
    with pytest.raises(GraphError, match="needs an nn.Module"):
        capture.capture(lambda x: x, inputs)
    with pytest.raises(GraphError, match="example_inputs must be a tuple"):
        capture.capture(module, {"x": inputs[0]})
    with pytest.raises(GraphError, match="unknown zoo model"):
        capture.capture_zoo("alexnet")


def test_capture_of_defaults_for_cheap_models():
    for name in ("mlp", "resnet18"):
        g = capture.capture_zoo(name)
        assert g.meta["zoo_overrides"] == {} and g.meta["bwd_flops_fallback"] == []
        assert np.isclose(g.fwd_flops.sum(), {"mlp": 2.1173e9, "resnet18": 1.1610e11}[name], rtol=1e-4)


class _TransposedWeights(nn.Module):
    """``x @ self.weight.T`` layers (Falcon's linear, hand-written models): the transpose touches the weight
    first."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(64, 32))
        self.w2 = nn.Parameter(torch.randn(32, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x @ self.w1.T) @ self.w2.T).pow(2).mean()


def test_a_transposed_weight_belongs_to_its_matmul():
    """The matmul owns the weight (priced as a linear with its weight gradient, split by TP as a Megatron pair);
    the transpose is folded into it (no weight-sized edge, no parameter on a view). Mutation check: without the
    fold the matmuls carry no parameters and TP finds no pair."""
    from placement_rl.graph.op_classes import op_class
    from placement_rl.graph import tp

    for method in ("export", "fx"):
        g = capture.capture(_TransposedWeights(), (torch.randn(8, 32),), method=method)
        mm = [v for v in range(g.num_nodes) if g.op_types[v] in ("matmul", "linear", "mm")]
        assert len(mm) == 2, (method, g.op_types)
        assert [g.param_bytes[v] for v in mm] == [64 * 32 * 4, 32 * 64 * 4]
        assert {op_class(g.op_types[v], g.param_bytes[v], g.fwd_flops[v]) for v in mm} == {"linear"}
        assert g.param_bytes.sum() == (64 * 32 + 32 * 64) * 4 and g.num_nodes == 5
        kinds = tp.annotation(g).kind
        assert [tp.KINDS[kinds[v]] for v in mm] == ["column", "row"]


@pytest.mark.parametrize("method", ["export", "fx"])
def test_a_grouped_convolution_backward_counts_its_groups(method):
    """torch's FLOP formula for ``convolution_backward`` ignores ``groups``: a depthwise conv's backward came out
    C x its forward. Each gradient (input, weight) costs the forward's multiply-adds, grouped or not; the first
    conv reads the model input (no gradient), so only its weight gradient is counted."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(), nn.Conv2d(16, 32, 1),
                      nn.Conv2d(32, 32, 3, groups=4), nn.ConvTranspose2d(32, 32, 2, stride=2, groups=8))
    g = capture.capture(m, (torch.randn(2, 16, 8, 8),), method=method)
    convs = [i for i, op in enumerate(g.op_types) if "conv" in op]
    assert len(convs) == 4
    ratios = [g.bwd_flops[i] / g.fwd_flops[i] for i in convs]
    assert ratios == pytest.approx([1.0, 2.0, 2.0, 2.0])
    dw = 2 * 2 * 16 * 8 * 8 * 9  # the depthwise conv: batch x channels x 8 x 8 outputs x 3 x 3 taps, 2 FLOPs each
    assert g.fwd_flops[convs[0]] == dw
