"""A user's own module through the executors (``deploy_stage_plan(module=, inputs=)``, ``run_placement``): in-place
ops on a received activation, custom ``torch.library`` ops in the ranks, data-dependent shapes, interpreted
``torch.cond`` regions and custom ``torch.autograd.Function`` backward passes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.errors import ExecutionError, GraphError, PlanError
from placement_rl.executor._stages import (assign_stages, custom_autograd_functions, export_step, op_modules,
                                           program_module, split_stages)
from placement_rl.executor.distributed import (DeployConfig, DeploySpec, deploy_stage_plans, prepare_job,
                                               reference_step)
from placement_rl.executor.local import run_placement
from placement_rl.graph.capture import capture
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

from tests.test_fix_capture_user import STE  # noqa: E402 - a straight-through estimator

torch.set_num_threads(1)
B = 8


class InPlaceNet(nn.Module):
    """In-place ops on activations: ``mul_``, ``+=``, ``relu_`` and an in-place op through a view."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x, y):
        h = self.l1(x)
        h.mul_(0.5)
        h += x
        h.relu_()
        g = self.l2(h)
        g.view(-1, 4).sigmoid_()
        return F.cross_entropy(self.l3(g), y)


class InPlaceCNN(nn.Module):
    """torchvision-style Conv -> BatchNorm -> ReLU(inplace=True)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
                                  nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        self.fc = nn.Linear(4, 5)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(self.body(x).mean((2, 3))), y)


@torch.library.custom_op("prl_user_models::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.tanh(x) * s


@scaled_tanh.register_fake
def _(x, s):
    return torch.empty_like(x)


def _scaled_tanh_setup(ctx, inputs, output):
    ctx.s = inputs[1]
    ctx.save_for_backward(output)


def _scaled_tanh_backward(ctx, g):
    (y,) = ctx.saved_tensors
    return g * (ctx.s - y * y / ctx.s), None


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_scaled_tanh_setup)


class CustomOpNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.l2(scaled_tanh(self.l1(x), 2.0)), y)


class RoutedMoE(nn.Module):
    """Top-1 routing with ``nonzero``: data-dependent shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(16, 2)
        self.experts = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.head = nn.Linear(16, 3)

    def forward(self, x, y):
        probs = self.gate(x).softmax(-1)
        top = probs.argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = (top == e).nonzero().squeeze(-1)
            out = out.index_add(0, rows, expert(x[rows]) * probs[rows, e:e + 1])
        return F.cross_entropy(self.head(out), y)


class CondNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.l1(x)
        h = torch.cond(h.sum() > 0, lambda t: self.l2(t), lambda t: torch.relu(t), (h,))
        return self.l3(h).pow(2).mean()


class STENet(nn.Module):
    """A custom backward (straight-through estimator), BatchNorm and a cache the forward assigns."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.bn, self.l2 = nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)

    def forward(self, x, y):
        self.cache = x.detach()
        return F.cross_entropy(self.l2(STE.apply(self.bn(self.l1(x)) * 3)), y)


def _build(cls, *, image: bool = False, width: int = 16):
    torch.manual_seed(0)
    x = torch.randn(B, 3, 6, 6) if image else torch.randn(B, width)
    return cls(), (x, torch.randint(0, 5 if image else 3, (B,)))


def _two_stages(graph, cut: int) -> StagePlan:
    son = (np.arange(graph.num_nodes) >= cut).astype(np.int64)
    return StagePlan(stage_of_node=son, stage_devices=((0,), (1,)), num_microbatches=2, schedule="gpipe")


def _pipeline_step(splits, inputs) -> torch.Tensor:
    """Run stages one after the other as the pipeline does: every received value a fresh leaf (requires_grad as
    sent), backward stage by stage through the leaves' gradients."""
    sent, leaves = [], []
    values = tuple(inputs)
    for sp in splits:
        if sp.index > 0:
            values = tuple(v.detach().requires_grad_(v.requires_grad) for v in values)
            leaves.append(values)
        out = sp.module(*values)
        values = out if isinstance(out, tuple) else (out,)
        sent.append(values)
    (loss,) = sent[-1]
    loss.backward()
    for k in range(len(splits) - 2, -1, -1):
        pairs = [(o, leaf.grad) for o, leaf in zip(sent[k], leaves[k]) if leaf.grad is not None]
        assert pairs, f"no gradient reached stage {k}"
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return loss


@pytest.mark.parametrize("cls, image", [(InPlaceNet, False), (InPlaceCNN, True)])
def test_a_stage_that_writes_into_a_received_activation_runs_and_matches_the_reference(cls, image):
    """Every cut of the graph: the stages run and match one process, except a cut between a view and an in-place
    op on it (``g.view(-1, 4).sigmoid_()``: the view and ``g`` would cross as two tensors), which is refused."""
    module, inputs = _build(cls, image=image)
    graph = capture(copy.deepcopy(module), inputs, name=cls.__name__)
    refused = []
    for cut in range(1, graph.num_nodes):
        model = copy.deepcopy(module)
        gm = program_module(export_step(model, inputs))
        plan = _two_stages(graph, cut)
        try:
            splits = split_stages(gm, assign_stages(gm, graph, plan.stage_of_node), 2)
        except PlanError as exc:
            assert "writes in place into 'view', which it receives together with its alias 'linear_1'" in str(exc)
            refused.append(graph.names[cut])
            continue
        loss = _pipeline_step(splits, inputs)
        ref_loss, ref_grads = reference_step(copy.deepcopy(module), inputs, chunks=1)
        assert float(loss.detach()) == pytest.approx(ref_loss, abs=1e-6), f"cut {cut}"
        got = {n: p.grad for n, p in gm.named_parameters() if p.grad is not None}
        assert set(got) == set(ref_grads), f"cut {cut}"
        for name, ref in ref_grads.items():
            torch.testing.assert_close(got[name], ref, atol=1e-6, rtol=1e-5, msg=lambda m, c=cut: f"cut {c}: {m}")
    assert refused == (["sigmoid_"] if cls is InPlaceNet else [])


def test_ops_of_an_importable_module_are_recorded_and_ops_of_main_are_refused():
    module, inputs = _build(CustomOpNet)
    ((name, root),) = op_modules(program_module(export_step(module, inputs)))
    assert name == __name__ and root == str(__import__("pathlib").Path(__file__).resolve().parent)

    scope = {"__name__": "__main__", "torch": torch}
    exec("def twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n", scope)
    twice = torch.library.custom_op("prl_user_models_main::twice", scope["twice"], mutates_args=())
    twice.register_fake(lambda x: torch.empty_like(x))
    g = torch.fx.Graph()
    g.output(g.call_function(torch.ops.prl_user_models_main.twice.default, (g.placeholder("x"),)))
    with pytest.raises(PlanError, match=r"custom op 'prl_user_models_main::twice' .* defined in __main__.*importable"):
        op_modules(torch.fx.GraphModule(nn.Module(), g))


def test_data_dependent_shapes_are_one_line_naming_the_node(tmp_path):
    module, inputs = _build(RoutedMoE)
    graph = capture(copy.deepcopy(module), inputs, name="moe")
    spec = DeploySpec(plan=_two_stages(graph, graph.num_nodes // 2), graph=graph, module=module, inputs=inputs)
    with pytest.raises(PlanError) as err:
        prepare_job([spec], config=DeployConfig(device="cpu"), job_dir=tmp_path / "job")
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 300 and not (tmp_path / "job").exists()
    assert "node 'nonzero' (test_fix_user_models_exec.py:" in msg and "need static shapes" in msg


def test_interpreted_cond_regions_are_said_to_be_placeable_but_not_executable(tmp_path):
    torch.manual_seed(1)
    module, inputs = CondNet(), (torch.randn(B, 8) + 1.0,)
    graph = capture(copy.deepcopy(module), inputs, name="cond")
    assert any("__true__" in n for n in graph.names)
    pattern = r"node 'cond__true__.*interpreted torch.cond / map region; .* placed but not executed"
    with pytest.raises(GraphError, match=pattern):
        run_placement(module, inputs, graph, [i % 2 for i in range(graph.num_nodes)], load_topology("2x_cpu"),
                      steps=1, warmup=0)
    spec = DeploySpec(plan=_two_stages(graph, 2), graph=graph, module=module, inputs=inputs)
    with pytest.raises(PlanError, match=pattern):
        prepare_job([spec], config=DeployConfig(device="cpu"), job_dir=tmp_path / "job")


@pytest.mark.filterwarnings("ignore:The tensor attribute self.cache was assigned during export")
@pytest.mark.filterwarnings("ignore:.*custom torch.autograd.Function backward not captured")
def test_a_custom_autograd_function_is_refused_by_both_executors_naming_it(tmp_path):
    module, inputs = _build(STENet)
    graph = capture(copy.deepcopy(module), inputs, name="ste")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert custom_autograd_functions(module, inputs) == [f"{STE.__module__}.STE"]
    assert not hasattr(module, "cache")  # the probe's forward leaves the module as it was
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    pattern = rf"custom torch.autograd.Function {STE.__module__}.STE: .* gradients would differ"
    plan = StagePlan(stage_of_node=np.zeros(graph.num_nodes, dtype=np.int64), stage_devices=((0, 1),))
    with pytest.raises(PlanError, match=pattern):
        prepare_job([DeploySpec(plan=plan, graph=graph, module=module, inputs=inputs)],
                    config=DeployConfig(device="cpu"), job_dir=tmp_path / "job")
    assert not (tmp_path / "job").exists()
    with pytest.raises(ExecutionError, match=pattern):
        run_placement(module, inputs, graph, [0] * graph.num_nodes, load_topology("2x_cpu"), steps=1, warmup=0)
    assert custom_autograd_functions(*_build(CustomOpNet)) == []  # a custom op's registered backward is exported


class Gated(nn.Module):
    """A gate used only through ``argmax``: its parameters get no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.gate, self.l2 = nn.Linear(16, 32), nn.Linear(32, 2), nn.Linear(32, 3)

    def forward(self, x, y):
        h = torch.relu(self.l1(x))
        return F.cross_entropy(self.l2(h * (1 + self.gate(h).argmax(-1, keepdim=True).float())), y)


def test_parameters_without_gradient_are_refused_under_ddp_only(tmp_path):
    """DDP over DP 2 left the other gradients of the gate's bucket unaveraged (0.58 off after one step, silently);
    FSDP, DP 1 and a frozen gate are right and run."""
    from placement_rl.executor._stages import check_unused_parameters
    from placement_rl.graph.autograd_fns import params_without_grad

    module, inputs = _build(Gated)
    assert params_without_grad(module, inputs) == ["gate.weight", "gate.bias"]
    graph = capture(copy.deepcopy(module), inputs, name="gated")
    plan = StagePlan(stage_of_node=np.zeros(graph.num_nodes, dtype=np.int64), stage_devices=((0, 1),))
    with pytest.raises(PlanError, match=r"^parameter\(s\) gate.weight, gate.bias get no gradient .* sharding fsdp$"):
        prepare_job([DeploySpec(plan=plan, graph=graph, module=module, inputs=inputs)],
                    config=DeployConfig(device="cpu"), job_dir=tmp_path / "job")
    assert not (tmp_path / "job").exists()
    assert check_unused_parameters(module, inputs, dp=2, ddp=False) is None  # fsdp / the executor's own all-reduce
    assert check_unused_parameters(module, inputs, dp=1, ddp=True) is None
    module.gate.requires_grad_(False)
    assert params_without_grad(module, inputs) == [] and check_unused_parameters(module, inputs, dp=2, ddp=True) is None
    for cls in (InPlaceNet, STENet):  # every other parameter gets its gradient
        assert params_without_grad(*_build(cls)) == []


@pytest.mark.distributed
def test_user_models_deploy_and_match_the_reference():
    """One launch: an in-place op first in stage 1, a custom op in the ranks, data-dependent shapes on one stage."""
    cases = [(InPlaceNet, 1, "pp"), (InPlaceCNN, 3, "pp"), (CustomOpNet, 2, "pp"), (RoutedMoE, 0, "dp")]
    first = {"InPlaceNet": "mul_", "InPlaceCNN": "relu_", "CustomOpNet": "linear_1"}  # stage 1's first op
    specs, refs = [], []
    for cls, cut, kind in cases:
        module, inputs = _build(cls, image=cls is InPlaceCNN)
        graph = capture(copy.deepcopy(module), inputs, name=cls.__name__)
        assert kind == "dp" or graph.names[cut] == first[cls.__name__]
        plan = (_two_stages(graph, cut) if kind == "pp" else
                StagePlan(stage_of_node=np.zeros(graph.num_nodes, dtype=np.int64), stage_devices=((0, 1),)))
        specs.append(DeploySpec(plan=plan, graph=graph, module=module, inputs=inputs))
        refs.append(reference_step(copy.deepcopy(module), inputs, chunks=2))
    results = deploy_stage_plans(specs, config=DeployConfig(steps=1, warmup=0, collect_grads=True, device="cpu",
                                                            timeout_s=120))
    for (cls, _, _), res, (loss, grads) in zip(cases, results, refs):
        assert res.losses[0] == pytest.approx(loss, abs=1e-5), cls.__name__
        assert set(res.grads) == set(grads), cls.__name__
        for name, ref in grads.items():
            torch.testing.assert_close(res.grads[name], ref, atol=1e-5, rtol=1e-5,
                                       msg=lambda m, k=f"{cls.__name__} {name}": f"{k}: {m}")
