"""Split an exported training step into pipeline stages that hold exactly a ``StagePlan``'s nodes.

The model's ``forward(*inputs)`` returns the scalar loss (the zoo convention), so its exported program
is a whole training step's forward. ``ep.module()`` keeps the node names of the program that
``placement_rl.graph.capture`` turned into a ``CompGraph``; a plan's ``stage_of_node`` therefore maps
(through ``graph.members`` after coarsening) to those fx nodes; an export at micro-batch size 1 may fold ops
without compute of their own, which shifts the names of the later ops of their kinds, so :func:`align_programs`
pairs the two programs' nodes and :func:`assign_stages` takes the renaming. Nodes the captured graph left out
(e.g. ``getitem`` or in-place buffer updates) join the latest stage among their producers (or, having
none, the earliest stage among their consumers), so no tensor is shipped needlessly.

Each stage becomes an ``fx.GraphModule`` (:func:`split_stages`) whose positional inputs are the values
live across the boundary before it and whose outputs are the values live across the boundary after
it. Values a later stage needs are threaded through the stages in between: this is how the
**targets** reach the last stage, which computes the loss itself (its output *is* the loss, so the
schedule's ``loss_fn`` returns it unchanged). The first stage takes all user inputs in the model's order.
A value a later stage receives is a leaf of autograd there, so a stage that writes into it in place
(``nn.ReLU(inplace=True)`` right after a cut) works on a copy (``<value>__received``); gradients reach the
received value through the copy.

Parameters used by nodes of several stages (tied weights such as GPT's embedding and LM head) get an
independent copy per stage; :func:`tied_parameters` lists them so the executor can sum their
gradients over the owning stages before the optimizer step.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import fx, nn

from placement_rl.errors import ExecutionError, PlanError
from placement_rl.graph.ir import CompGraph


@dataclass(frozen=True)
class StageSplit:
    """One stage's module plus the original (fully-qualified) name of each of its parameters."""

    index: int
    module: fx.GraphModule
    param_names: tuple[str, ...]
    inputs: tuple[str, ...]  # names of the values it receives (stage 0: the user inputs)
    outputs: tuple[str, ...]  # names of the values it sends on (last stage: the loss)
    holders: tuple[tuple[nn.Module, str, str], ...]  # (owning module, attribute, original name)


def export_step(module: nn.Module, inputs: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """``torch.export`` of the training step (the same call ``capture`` makes, so node names agree)."""
    return torch.export.export(module, tuple(inputs), strict=False)


def check_autograd_functions(module: nn.Module, inputs: Sequence[torch.Tensor]) -> str | None:
    """A one-line refusal naming the custom ``torch.autograd.Function`` classes ``module`` uses, or None."""
    found = custom_autograd_functions(module, inputs)
    if not found:
        return None
    return (f"the model uses custom torch.autograd.Function {', '.join(found)}: the executors run its exported "
            "program, which differentiates the Function's forward ops instead of calling its backward, so the "
            "gradients would differ; write it as a torch.library.custom_op with register_autograd")


def check_unused_parameters(module: nn.Module, inputs: Sequence[torch.Tensor], *, dp: int, ddp: bool) -> str | None:
    """A one-line refusal naming the trainable parameters that get no gradient when ``ddp`` wraps the stages at DP
    degree ``dp`` > 1 (DDP then leaves the other gradients of their bucket unaveraged, silently on one step), or
    None. FSDP and the executor's own all-reduce (zero-bubble schedules, TP) average them right."""
    if dp == 1 or not ddp:
        return None
    from placement_rl.graph.autograd_fns import params_without_grad

    unused = params_without_grad(module, inputs)
    if not unused:
        return None
    names = ", ".join(unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
    return (f"parameter(s) {names} get no gradient from the loss (used only through ops such as argmax, or not at "
            f"all): DDP at DP degree {dp} would leave the other gradients of their bucket unaveraged; set "
            "requires_grad=False on them, or use sharding fsdp")


def custom_autograd_functions(module: nn.Module, inputs: Sequence[torch.Tensor]) -> list[str]:
    """The custom ``torch.autograd.Function`` classes (qualified names) one forward of ``module(*inputs)``
    differentiates through (``graph.autograd_fns``): ``torch.export`` traces through a Function's forward, so a
    program differentiates those ops and the Function's own backward never runs. ``ExecutionError`` where the
    forward does not run."""
    from placement_rl.graph.autograd_fns import custom_autograd_functions as found, qualified

    classes = found(module, inputs)
    if classes is None:
        raise ExecutionError("cannot run the model's forward on its inputs: check them with module(*inputs)")
    return [qualified(c) for c in classes]


def program_module(ep: torch.export.ExportedProgram) -> fx.GraphModule:
    """The unlifted module of ``ep`` (parameters as attributes), without the input-guard call."""
    return ep.module(check_guards=False)


def param_aliases(module: nn.Module) -> dict[str, str]:
    """Every name of a parameter -> its canonical name (the first one ``named_parameters`` gives).

    A saved and reloaded exported program loses the identity of tied parameters (GPT's
    ``lm_head.weight`` and ``wte.weight`` come back as two tensors), so names are canonicalised.
    """
    first: dict[int, str] = {}
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


def original_param_names(gm: nn.Module, aliases: dict[str, str] | None = None) -> dict[int, str]:
    """``id(parameter) -> canonical fully-qualified name`` of the model it was exported from."""
    aliases = aliases or {}
    return {id(p): aliases.get(name, name) for name, p in gm.named_parameters()}


TORCH_NAMESPACES = frozenset({  # op namespaces a bare ``import torch`` defines
    "aten", "prims", "debugprims", "rngprims", "inductor_prims", "_native", "_quantized", "quantized", "quantization",
    "_c10d_functional", "_c10d_functional_autograd", "c10d", "c10d_functional", "_dtensor", "symm_mem", "mkl",
    "mkldnn", "mkldnn_prepacked", "onednn", "sparse", "profiler", "export", "inductor", "higher_order"})


def _defining_module(op: torch._ops.OpOverload) -> str | None:
    """The Python module that registered ``op`` (``torch.library.custom_op``, or its fake / kernel registration)."""
    import sys

    from torch._library import custom_ops, simple_registry

    qualname = op._schema.name
    opdef = custom_ops.OPDEFS.get(qualname)
    if opdef is not None and getattr(opdef._init_fn, "__module__", None):
        return opdef._init_fn.__module__
    fake = simple_registry.singleton.find(qualname).fake_impl.kernel
    source = getattr(fake, "source", "") if fake is not None else ""
    path = source.rpartition(":")[0]
    if path:
        for name, mod in list(sys.modules.items()):
            if getattr(mod, "__file__", None) == path:
                return name
    return None


def op_modules(gm: fx.GraphModule) -> list[tuple[str, str]]:
    """``(module, sys.path entry)`` of every Python module that defines a non-torch op of ``gm`` (its body
    sub-graphs included), for a fresh interpreter to import before it loads the saved program.

    ``PlanError`` naming the op when its module cannot be found or is not importable from a file (defined in
    ``__main__`` or interactively).
    """
    import importlib.util
    import sys

    out: dict[str, str] = {}
    for sub in gm.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        for n in sub.graph.nodes:
            op = n.target
            if n.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
                continue
            if op.namespace in TORCH_NAMESPACES:
                continue
            name = _defining_module(op)
            if name is None and importlib.util.find_spec(op.namespace) is not None:
                name = op.namespace  # an extension's C++ op (torchvision::nms): importing the package loads it
            if name is not None and (name.split(".")[0] == "torch" or name in out):
                continue
            file = getattr(sys.modules.get(name), "__file__", None) if name else None
            if name is None or name == "__main__" or not file:
                where = f"is defined in {name}" if name else "comes from no module found"
                raise PlanError(f"custom op '{op._schema.name}' (node '{n.name}') {where}: the ranks load the "
                                "program in fresh processes and cannot import it; define the op in an importable "
                                "module (a .py file or package)")
            path = Path(file).resolve()
            depth = name.count(".") + (path.name == "__init__.py")
            out[name] = str(path.parents[depth])
    return sorted(out.items())


def import_op_modules(modules: Sequence[Sequence[str]]) -> None:
    """Import the modules :func:`op_modules` listed (their ``sys.path`` entries appended where missing)."""
    import importlib
    import sys

    for name, root in modules:
        if root not in sys.path:
            sys.path.append(root)
        importlib.import_module(name)


def check_static_shapes(gm: fx.GraphModule) -> None:
    """``PlanError`` naming the first value of ``gm`` whose shape depends on the data (``nonzero``, boolean masks):
    pipeline stages send and receive buffers of shapes fixed before the first step."""
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape):
            frames = [ln.strip() for ln in str(n.meta.get("stack_trace") or "").strip().splitlines()]
            at = re.match(r'File "(.*)", line (\d+)', frames[-2]) if len(frames) >= 2 else None
            where = f" ({Path(at[1]).name}:{at[2]}: {frames[-1]})" if at else ""
            raise PlanError(f"node '{n.name}'{where} has a data-dependent shape {list(val.shape)}; the distributed "
                            "executor's pipeline stages need static shapes: compute it with fixed shapes (masks) or "
                            "use a one-stage plan")


def value_meta(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> dict[str, tuple[list[int], str, bool]]:
    """``name -> (shape, dtype, requires_grad)`` of every tensor value of one micro-batch's forward.

    Propagated with fake tensors (no compute, buffers untouched). The pipeline stages are built in
    torch's *static* mode from these (the dynamic mode runs a stage once on uninitialised buffers,
    which breaks integer inputs such as the targets).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.shape_prop import ShapeProp

    with warnings.catch_warnings():  # torch's own pytree deprecation noise while deep-copying the graph
        warnings.simplefilter("ignore", FutureWarning)
        ShapeProp(gm, fake_mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)
    out = {}
    for n in gm.graph.nodes:
        tm = n.meta.get("tensor_meta")
        if hasattr(tm, "shape"):
            out[n.name] = (list(tm.shape), str(tm.dtype).removeprefix("torch."), bool(tm.requires_grad))
    return out


def crossing_values(splits: Sequence[StageSplit]) -> list[str]:
    """Names of the values entering or leaving a stage (user inputs, values sent between stages, the loss)."""
    return sorted({v for sp in splits for v in sp.outputs + sp.inputs})


def plan_node_stages(graph: CompGraph, stage_of_node: np.ndarray) -> dict[str, int]:
    """Stage of every original node name (expanding coarsened groups through ``graph.members``)."""
    groups = graph.members if graph.members is not None else tuple((nm,) for nm in graph.names)
    return {m: int(stage_of_node[i]) for i, grp in enumerate(groups) for m in grp}


def interpreted_region(gm: fx.GraphModule, names: Sequence[str]) -> str | None:
    """A message when one of ``names`` (graph node names) is an op of a ``torch.cond`` / ``map`` region that capture
    interpreted (``<cond>__true__<op>``): the program holds the region as one higher-order op, which the executors
    do not split. None when no name is such an op."""
    from placement_rl.graph.hop import COND, MAP

    hops = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.target in (COND, MAP)]
    have = {n.name for n in gm.graph.nodes}
    for m in names:
        if m not in have and any(m.startswith(f"{h}__") for h in hops):
            return (f"node '{m}' is an op of an interpreted torch.cond / map region; graphs with such regions can be "
                    "priced and placed but not executed")
    return None


COMPUTE = ("call_function", "call_method", "call_module")
NO_COMPUTE = ("aten.expand.", "aten.expand_as.", "aten.contiguous.", "aten.clone.", "aten.alias.", "aten.view.",
              "aten._unsafe_view.", "aten.reshape.", "aten.squeeze.", "aten.unsqueeze.", "aten.flatten.",
              "aten.detach.")  # ops without compute or parameters of their own: an export may fold them away


def align_programs(ref: fx.GraphModule, got: fx.GraphModule) -> tuple[dict[str, str | None], fx.Node | None]:
    """Pair the compute nodes of ``ref`` with those of ``got``, the same model exported at another batch size (at
    micro-batch size 1 an export folds the ops that size-1 dims make no-ops, and later ops of their kinds take the
    freed names). Returns ``(ref name -> got name, or None for an op got folded away; None)`` when ``got`` is ``ref``
    less :data:`NO_COMPUTE` ops (every other op in the same order, reading the paired inputs), else ``({}, the first
    node without a counterpart)``."""
    inputs = {n.name: n for n in got.graph.nodes if n.op not in COMPUTE}
    pair: dict[fx.Node, fx.Node] = {}
    todo = iter([n for n in got.graph.nodes if n.op in COMPUTE])
    nxt = next(todo, None)
    names: dict[str, str | None] = {}
    for n in ref.graph.nodes:
        if n.op == "output":
            continue
        if n.op not in COMPUTE:
            if n.name not in inputs:
                return {}, n
            pair[n] = inputs[n.name]
            continue
        want = list(dict.fromkeys(pair[a] for a in n.all_input_nodes))
        if nxt is not None and nxt.target == n.target and nxt.all_input_nodes == want:
            pair[n], names[n.name], nxt = nxt, nxt.name, next(todo, None)
        elif str(n.target).startswith(NO_COMPUTE) and n.args and isinstance(n.args[0], fx.Node):
            pair[n], names[n.name] = pair[n.args[0]], None
        else:
            return {}, n
    return ({}, nxt) if nxt is not None else (names, None)


def assign_stages(gm: fx.GraphModule, graph: CompGraph, stage_of_node: np.ndarray,
                  rename: Mapping[str, str | None] | None = None) -> dict[str, int]:
    """Stage of every compute node of ``gm``; ``PlanError`` if the plan and the program disagree. ``rename``: graph
    node name -> ``gm``'s name where they differ (None: an op ``gm``'s export folded away; :func:`align_programs`)."""
    rename = rename or {}
    named = {rename.get(k, k): s for k, s in plan_node_stages(graph, stage_of_node).items()
             if rename.get(k, k) is not None}
    compute = [n for n in gm.graph.nodes if n.op in COMPUTE]
    have = {n.name for n in compute}
    missing = [m for m in named if m not in have]
    region = interpreted_region(gm, missing)
    if region:
        raise PlanError(f"graph '{graph.name}': {region}")
    if missing:
        raise PlanError(f"graph '{graph.name}' and the model do not match: {len(missing)} plan node(s) are not in "
                        f"the model's exported program (first: '{missing[0]}'); capture the graph from this "
                        "model with the same options")
    if not any(n.name in named for n in compute):
        raise PlanError(f"graph '{graph.name}' shares no node with the model's exported program")
    stage: dict[str, int] = {}
    consumers_min: dict[str, int] = {}
    for n in reversed(compute):  # earliest consumer stage, for nodes without producers
        if n.name in named:
            consumers_min[n.name] = named[n.name]
        else:
            users = [consumers_min[u.name] for u in n.users if u.name in consumers_min]
            consumers_min[n.name] = min(users) if users else 0
    for n in compute:
        if n.name in named:
            stage[n.name] = named[n.name]
            continue
        prods = [stage[a.name] for a in n.all_input_nodes if a.name in stage]
        stage[n.name] = max(prods) if prods else consumers_min[n.name]
    for n in compute:
        for a in n.all_input_nodes:
            if a.name in stage and stage[a.name] > stage[n.name]:
                raise PlanError(f"stages are not contiguous in the model's program: '{a.name}' (stage "
                                f"{stage[a.name]}) feeds '{n.name}' (stage {stage[n.name]})")
    return stage


def _loss_node(gm: fx.GraphModule) -> fx.Node:
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0]
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    if len(outs) != 1 or not isinstance(outs[0], fx.Node):
        raise PlanError(f"the model must return one scalar loss tensor (its forward returns {len(outs)} values)")
    return outs[0]


def alias_roots(nodes: Sequence[fx.Node], values: Sequence[fx.Node]) -> tuple[dict[fx.Node, fx.Node], list[fx.Node]]:
    """Which of ``values`` each node aliases, and which of ``values`` ``nodes`` (in program order) write in place.

    Returns ``root`` (every value maps to itself, every node of ``nodes`` whose result is one of them or a view of
    one to that value) and the values written, directly or through a view. Read from the ops' schemas: an
    argument marked ``Tensor(a!)`` is written, an op whose result aliases an argument (``view``, ``transpose``,
    ``relu_``) passes the alias on; ``getitem`` and other ops without a schema alias what they read when that is
    itself an alias (an element of ``split``'s views, not of ``max``'s results).
    """
    root: dict[fx.Node, fx.Node] = {v: v for v in values}
    written: dict[fx.Node, None] = {}
    for n in nodes:
        schema = getattr(n.target, "_schema", None)
        if schema is None:
            srcs = [root[a] for a in n.all_input_nodes if a in root and root[a] is not a]
            if srcs and n.op == "call_function":
                root[n] = srcs[0]
            continue
        aliased = any(r.alias_info is not None for r in schema.returns)
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None:
                continue
            value = n.args[i] if i < len(n.args) else n.kwargs.get(arg.name)
            for a in (value if isinstance(value, (list, tuple)) else (value,)):
                if isinstance(a, fx.Node) and a in root:
                    if arg.alias_info.is_write:
                        written[root[a]] = None
                    if aliased:
                        root[n] = root[a]
    return root, list(written)


def split_stages(gm: fx.GraphModule, stage: dict[str, int], num_stages: int, *,
                 aliases: dict[str, str] | None = None) -> list[StageSplit]:
    """Cut ``gm`` into ``num_stages`` GraphModules; stage k holds the compute nodes mapped to k.

    Stage k's forward takes the values live across boundary k-1 -> k (stage 0: the user inputs) and
    returns the values live across k -> k+1 as a tuple; the last stage returns the loss. Parameters
    and buffers (``get_attr``) are copied into every stage that reads them (the same tensor objects,
    keeping their original attribute paths).
    """
    fqn = original_param_names(gm, aliases)
    nodes = list(gm.graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    loss = _loss_node(gm)
    made_in = {n: -1 for n in inputs}
    made_in.update({n: stage[n.name] for n in nodes if n.name in stage})
    if sorted(set(stage.values())) != list(range(num_stages)):
        absent = sorted(set(range(num_stages)) - set(stage.values()))
        raise PlanError(f"stage(s) {absent} of the plan hold no operation of the model's program")
    last_use: dict[fx.Node, int] = {loss: num_stages}
    for n in nodes:
        if n.name in stage:
            for a in n.all_input_nodes:
                if a in made_in:
                    last_use[a] = max(last_use.get(a, -1), stage[n.name])
    same = alias_roots(nodes, nodes)[0]  # values sharing memory in the program
    splits = []
    for k in range(num_stages):
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        live_in = inputs if k == 0 else [v for v in made_in if made_in[v] < k and last_use.get(v, -1) >= k]
        for v in live_in:
            env[v] = g.placeholder(v.name)
            env[v].meta = v.meta.copy()
        if k > 0:  # a received activation is a leaf: the stage writes into its own copy
            for v in alias_roots([n for n in nodes if stage.get(n.name) == k], live_in)[1]:
                twin = next((u for u in live_in if u is not v and same[u] is same[v]), None)
                if twin is not None:  # sent as two tensors, they no longer share memory
                    raise PlanError(f"stage {k} writes in place into '{v.name}', which it receives together with "
                                    f"its alias '{twin.name}'; move the cut so that both are made in stage {k}")
                env[v] = g.create_node("call_function", torch.ops.aten.clone.default, (env[v],),
                                        name=f"{v.name}__received")
                env[v].meta = v.meta.copy()
        for n in nodes:
            if stage.get(n.name) != k:
                continue
            for a in n.all_input_nodes:
                if a.op == "get_attr" and a not in env:
                    env[a] = g.get_attr(a.target)
            env[n] = g.node_copy(n, env.__getitem__)
        last = k == num_stages - 1
        live_out = [loss] if last else [v for v in made_in if made_in[v] <= k and last_use.get(v, -1) > k]
        sent = [g.call_method("contiguous", (env[v],)) for v in live_out]  # p2p sends need contiguous tensors
        g.output(sent[0] if last else tuple(sent))
        sub = fx.GraphModule(gm, g, class_name=f"Stage{k}")
        holders = tuple((m, attr, fqn[id(p)]) for m in sub.modules() for attr, p in m._parameters.items()
                        if p is not None and id(p) in fqn)
        names = tuple(dict.fromkeys(h[2] for h in holders))
        splits.append(StageSplit(index=k, module=sub, param_names=names, inputs=tuple(v.name for v in live_in),
                                 outputs=tuple(v.name for v in live_out), holders=holders))
    return splits


def retarget(module: fx.GraphModule, device: torch.device) -> None:
    """Point ops that create tensors on an explicit device (``arange(..., device=cpu)``: the device the
    program was exported on) at ``device``; params and buffers move with ``module.to(device)``."""
    changed = False
    for n in module.graph.nodes:
        dev = n.kwargs.get("device")
        if isinstance(dev, torch.device) and dev != device:
            n.kwargs = {**n.kwargs, "device": device}
            changed = True
    if changed:
        module.recompile()


def tied_parameters(splits: Sequence[StageSplit]) -> dict[str, tuple[int, ...]]:
    """Original parameter names used by several stages -> the stages using them."""
    users: dict[str, list[int]] = {}
    for sp in splits:
        for name in sp.param_names:
            users.setdefault(name, []).append(sp.index)
    return {name: tuple(ks) for name, ks in users.items() if len(ks) > 1}


def untie(split: StageSplit, names: Sequence[str]) -> None:
    """Give ``split`` its own copy of each tied parameter in ``names`` (so stages never share one).

    All attributes of the stage that hold one canonical name end up holding the same copy (a reloaded
    program may hold a tied weight under two attribute paths as two tensors).
    """
    wanted = set(names)
    by_name: dict[str, list[tuple[nn.Module, str]]] = {}
    for mod, attr, name in split.holders:
        by_name.setdefault(name, []).append((mod, attr))
    for name, places in by_name.items():
        distinct = {id(mod._parameters[attr]) for mod, attr in places}
        if name not in wanted and len(distinct) == 1:
            continue
        first = places[0][0]._parameters[places[0][1]]
        copy = nn.Parameter(first.detach().clone(), requires_grad=first.requires_grad)
        for mod, attr in places:
            mod._parameters[attr] = copy


def stage_parameters(split: StageSplit) -> dict[str, nn.Parameter]:
    """Original fully-qualified name -> this stage's parameter (its own copy after :func:`untie`)."""
    out: dict[str, nn.Parameter] = {}
    for mod, attr, name in split.holders:
        out.setdefault(name, mod._parameters[attr])
    return out
