"""A stage that is an ideal difference of the DAG but no cut of the topological order: validated, round-tripped
through JSON, simulated, and run by the executor's stage split with the single-process loss and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.executor._stages import (assign_stages, export_step, program_module, split_stages,
                                           stage_parameters, tied_parameters, untie)
from placement_rl.executor.distributed import reference_step
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

CNN = dict(batch_size=8, image_size=16, num_classes=5, width=4)


def non_prefix_ideal(graph) -> np.ndarray:
    """The ancestors of some node (and it): an ideal that is not a prefix of ``graph.topo_order``."""
    order = graph.topo_order.tolist()
    pp, pi = graph.pred_ptr, graph.pred_idx
    for k, x in enumerate(order[1:-1], start=1):
        keep = np.zeros(graph.num_nodes, dtype=bool)
        stack = [x]
        while stack:
            v = stack.pop()
            if not keep[v]:
                keep[v] = True
                stack += pi[pp[v]:pp[v + 1]].tolist()
        if keep.sum() < k + 1 and keep.sum() > graph.num_nodes // 4:  # skips a parallel branch before x
            return keep
    raise AssertionError("no branch in this graph")


def test_ideal_difference_stage_validates_round_trips_simulates_and_runs():
    torch.set_num_threads(1)
    module, inputs = zoo.build("resnet18", **CNN)
    g = capture(module, inputs, name="resnet18")
    stage0 = non_prefix_ideal(g)
    son = np.where(stage0, 0, 1)
    assert not (np.diff(son[g.topo_order]) >= 0).all()  # not a cut of the topological order
    topo = load_topology("4x_v100_pcie")
    plan = StagePlan(stage_of_node=son, stage_devices=((0,), (1,)), num_microbatches=2).validate(g, topo)
    again = StagePlan.from_json(plan.to_json(graph=g, topology=topo), topology=topo, graph=g)
    assert np.array_equal(again.stage_of_node, son)
    res = simulate_pipeline(g, resolve_costs(g, topo), topo, plan)
    assert res.step_time > 0 and res.meta["link_time"][0] > 0
    gm = program_module(export_step(module, inputs))
    splits = split_stages(gm, assign_stages(gm, g, son), 2)
    for sp in splits:
        untie(sp, list(tied_parameters(splits)))
    values = tuple(inputs)
    for sp in splits:
        values = sp.module(*values)
        values = values if isinstance(values, tuple) else (values,)
    (loss,) = values
    loss.backward()
    ref_module, _ = zoo.build("resnet18", **CNN)
    ref_loss, ref_grads = reference_step(ref_module, inputs, chunks=1)
    assert float(loss.detach()) == pytest.approx(ref_loss, abs=1e-6)
    got: dict[str, torch.Tensor] = {}
    for sp in splits:
        for key, p in stage_parameters(sp).items():
            got[key] = got.get(key, 0) + p.grad
    for key in ref_grads:
        torch.testing.assert_close(got[key], ref_grads[key], atol=1e-5, rtol=1e-5)
