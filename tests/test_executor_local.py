"""The op-level executor: a placement over two devices (both the CPU) trains exactly like the module."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from placement_rl.errors import ExecutionError
from placement_rl.executor import MeasurementTimeout, PlacedProgram, memory_estimate, run_placement
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.graph.coarsen import coarsen
from placement_rl.topology import DeviceTopology, load_topology

CASES = {
    "mlp": dict(batch_size=8, in_features=32, hidden=32, layers=2),
    "gpt": dict(batch_size=2, seq_len=8, vocab_size=64, d_model=32, n_layers=2, n_heads=2, dropout=0.0),  # tied head
    "resnet18": dict(batch_size=2, image_size=32, num_classes=10, width=8),  # BatchNorm buffers, in-place ops
}


@pytest.fixture(scope="module")
def topo():
    return load_topology("2x_cpu")


def reference(module, inputs):
    ref = copy.deepcopy(module)
    loss = ref(*inputs)
    loss.backward()
    return float(loss.detach()), {k: p.grad for k, p in ref.named_parameters()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_device_placement_matches_unplaced_loss_and_grads(name, topo):
    module, inputs = zoo.build(name, **CASES[name])
    graph = capture(module, inputs, name=name)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    want_loss, want_grads = reference(module, inputs)
    placement = np.random.default_rng(1).integers(0, 2, graph.num_nodes)
    placed = PlacedProgram(module, inputs, graph, placement, topo)
    assert placed.num_transfers > 0  # the rewrite inserted copies on cross-device edges
    loss = placed.loss()
    loss.backward()
    assert float(loss.detach()) == pytest.approx(want_loss, abs=1e-5)
    grads = placed.grads()
    shared = [k for k in want_grads if k not in grads]  # tied parameters appear once, under their first name
    for k, g in grads.items():
        assert g is not None and torch.allclose(g, want_grads[k], atol=1e-5), k
    for k in shared:
        assert any(torch.equal(want_grads[k], want_grads[j]) for j in grads)
    assert all(torch.equal(v, module.state_dict()[k]) for k, v in before.items())  # caller's module untouched


def test_coarsened_placement_maps_through_members(topo):
    module, inputs = zoo.build("resnet18", **CASES["resnet18"])
    graph = coarsen(capture(module, inputs, name="resnet18"), target=(4, 12))
    want_loss, _ = reference(module, inputs)
    placed = PlacedProgram(module, inputs, graph, np.arange(graph.num_nodes) % 2, topo)
    assert float(placed.loss().detach()) == pytest.approx(want_loss, abs=1e-5)


def test_run_placement_trains_and_reports(topo):
    module, inputs = zoo.build("mlp", **CASES["mlp"])
    graph = capture(module, inputs, name="mlp")
    seen = []
    res = run_placement(module, inputs, graph, np.arange(graph.num_nodes) % 2, topo, steps=3, warmup=1,
                        progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]  # after every step, warm-up included
    assert len(res.step_times) == 3 and res.median_step_time == pytest.approx(np.median(res.step_times))
    assert len(res.losses) == 4 and res.losses[-1] < res.losses[0]  # Adam steps lower the loss
    assert res.loss == pytest.approx(reference(module, inputs)[0], abs=1e-5)
    assert len(res.peak_memory_per_device) == 2 and all(m > 0 for m in res.peak_memory_per_device)
    assert res.meta["memory_source"] == ["estimate", "estimate"]


def test_placement_over_memory_is_refused_before_running(topo):
    module, inputs = zoo.build("mlp", **CASES["mlp"])
    graph = capture(module, inputs, name="mlp")
    data = topo.to_dict()
    data["devices"][1]["memory_bytes"] = 1000.0
    small = DeviceTopology.from_dict(data)
    assert memory_estimate(graph, np.ones(graph.num_nodes, dtype=int), small)[1] > 1000
    with pytest.raises(ExecutionError, match="does not fit device 'cpu1'"):
        run_placement(module, inputs, graph, np.ones(graph.num_nodes, dtype=int), small, steps=1)
    with pytest.raises(ExecutionError, match="invalid placement"):
        run_placement(module, inputs, graph, np.full(graph.num_nodes, 5), topo, steps=1)


def test_time_limit_stops_the_measurement(topo):
    module, inputs = zoo.build("mlp", **CASES["mlp"])
    graph = capture(module, inputs, name="mlp")
    with pytest.raises(MeasurementTimeout, match="time limit"):
        run_placement(module, inputs, graph, np.zeros(graph.num_nodes, dtype=int), topo, steps=50,
                      time_limit_s=1e-9)


def test_cuda_device_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    module, inputs = zoo.build("mlp", **CASES["mlp"])
    graph = capture(module, inputs, name="mlp")
    with pytest.raises(ExecutionError, match="no CUDA GPU"):
        run_placement(module, inputs, graph, np.zeros(graph.num_nodes, dtype=int), load_topology("cpu_2gpu"))


@pytest.mark.gpu
def test_cpu_gpu_placement_matches_unplaced():
    module, inputs = zoo.build("gpt", **CASES["gpt"])
    graph = capture(module, inputs, name="gpt")
    local = load_topology("local")
    want_loss, want_grads = reference(module, inputs)
    placed = PlacedProgram(module, inputs, graph, np.arange(graph.num_nodes) % min(2, local.num_devices), local)
    loss = placed.loss()
    loss.backward()
    assert float(loss.detach()) == pytest.approx(want_loss, abs=1e-4)
    for k, g in placed.grads().items():
        assert torch.allclose(g, want_grads[k], atol=1e-4), k
    res = run_placement(module, inputs, graph, np.arange(graph.num_nodes) % 2, local, steps=2)
    assert res.meta["memory_source"][1] == "cuda" and res.peak_memory_per_device[1] > 0
