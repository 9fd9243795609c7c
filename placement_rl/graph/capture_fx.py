"""The ``fx`` path of ``capture``: ``torch.fx.symbolic_trace`` run on real tensors through a copy of the module,
with every call of a ``torch.nn`` module that has submodules replaced by the aten ops it runs (``make_fx``; nodes
named ``<call>__<op>``), then every node measured. See ``placement_rl.graph.capture``'s docstring."""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
from torch import fx, nn

from placement_rl.errors import GraphError
from placement_rl.graph._capture_engine import NodeFailure, OpCall, measure_graph, tensor_bytes


def _innermost_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    return path[len("L['self']."):] if path.startswith("L['self'].") else path


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        ns, name = target.name().split("::", 1)
        name = name.split(".", 1)[0]
        return name if ns == "aten" else f"{ns}::{name}"
    return getattr(target, "__name__", str(target))


def _attr(gm: nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _has_children(module: nn.Module) -> bool:
    return next(module.children(), None) is not None


class _CallInputs(fx.Interpreter):
    """Runs the traced graph once and keeps, for each node of ``wanted``, the values of its flattened
    ``(args, kwargs)`` (tensors detached, ``requires_grad`` kept)."""

    def __init__(self, gm: fx.GraphModule, wanted: set[fx.Node]) -> None:
        super().__init__(gm)
        self.wanted = wanted
        self.seen: dict[fx.Node, list[Any]] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n in self.wanted:
            flat = torch.utils._pytree.tree_leaves((n.args, n.kwargs))
            values = [self.env[x] if isinstance(x, fx.Node) else x for x in flat]
            self.seen[n] = [v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
                            for v in values]
        return super().run_node(n)


def _aten_program(sub: nn.Module, node: fx.Node, values: list[Any]) -> fx.GraphModule:
    """The aten ops ``sub`` runs on ``values`` (the flattened arguments of call node ``node``): ``make_fx`` on
    real tensors, so data-dependent branches (``TransformerDecoder``'s causal-mask check) are taken as these
    inputs take them. Raises where the program is not a plain list of aten ops."""
    from torch.fx.experimental.proxy_tensor import make_fx

    _, spec = torch.utils._pytree.tree_flatten((node.args, node.kwargs))
    if not all(isinstance(v, torch.Tensor) or v is None or isinstance(v, (bool, int, float, str)) for v in values):
        raise TypeError("arguments other than tensors and scalars")

    def call(*flat: Any) -> Any:
        args, kwargs = torch.utils._pytree.tree_unflatten(list(flat), spec)
        return sub(*args, **kwargs)

    call._orig_mod = sub  # make_fx records each op's submodule path (nn_module_stack) for a module given so
    with torch.enable_grad():
        gm = make_fx(call, tracing_mode="real", pre_dispatch=True, record_module_stack=True,
                     _error_on_data_dependent_ops=False)(*values)
    gm.graph.eliminate_dead_code()  # the values read by data-dependent branches (``item``) are baked in
    holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(holders) != len(values):
        raise TypeError(f"{len(holders)} placeholders for {len(values)} arguments")
    for n in gm.graph.nodes:  # plain aten ops on tensors: no grad-mode switches, higher-order ops or submodules
        if n.op == "call_function" and not (isinstance(n.target, torch._ops.OpOverload)
                                            or n.target is operator.getitem):
            raise TypeError(f"call of {n.target}")
        if n.op in ("call_module", "call_method") or (n.op == "get_attr"
                                                      and not isinstance(_attr(gm, n.target), torch.Tensor)):
            raise TypeError(f"{n.op} node '{n.name}'")
    return gm


def _splice(traced: fx.GraphModule, node: fx.Node, gm: fx.GraphModule) -> None:
    """Replace call node ``node`` of ``traced`` by the ops of ``gm`` (its aten program), named
    ``<node>__<op>``, with the module path of each op below the called module's."""
    graph, path = traced.graph, str(node.target)
    flat = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
    result = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    env: dict[fx.Node, Any] = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), flat))
    picks = {}
    if isinstance(result, (tuple, list)):  # e.g. MultiheadAttention's (output, weights): getitem users
        for user in node.users:
            index = user.args[1] if user.target is operator.getitem and len(user.args) == 2 else None
            if not isinstance(index, int) or (user.users and not isinstance(result[index], fx.Node)):
                raise TypeError(f"use '{user.name}' of a multi-output module")
            picks[user] = result[index]
    elif not isinstance(result, fx.Node):
        raise TypeError("module returns no tensor")
    if any(isinstance(r, fx.Node) and r.op == "placeholder" and not isinstance(env[r], fx.Node)
           for r in ([result] if isinstance(result, fx.Node) else picks.values())):
        raise TypeError("module returns a constant argument")
    names: dict[int, str] = {}
    for name, t in list(traced.named_parameters(remove_duplicate=False)) + list(traced.named_buffers()):
        names.setdefault(id(t), name)
    with graph.inserting_before(node):
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                value = _attr(gm, n.target)
                target = names.get(id(value))
                if target is None:  # a tensor the module holds outside its parameters and buffers
                    target = names[id(value)] = f"{node.name}__{n.target}"
                    setattr(traced, target, value)
                env[n] = graph.get_attr(target)
            elif n.op == "call_function":
                new = graph.create_node("call_function", n.target, fx.node.map_arg(n.args, env.__getitem__),
                                        fx.node.map_arg(n.kwargs, env.__getitem__), name=f"{node.name}__{n.name}")
                inner = _innermost_path(n)
                new.meta["nn_module_stack"] = {"expanded": (f"{path}.{inner}" if inner else path, "")}
                env[n] = new
    if isinstance(result, fx.Node):
        node.replace_all_uses_with(env[result])
    for user, picked in picks.items():
        if user.users:
            user.replace_all_uses_with(env[picked])
        graph.erase_node(user)
    graph.erase_node(node)


def _expand_torch_modules(traced: fx.GraphModule, inputs: tuple) -> list[str]:
    """fx keeps every ``torch.nn`` module whole (one call node); replace each call of one that has submodules
    (``TransformerEncoder``, ``TransformerDecoder``, ``MultiheadAttention``, ...) by the aten ops it runs, so
    its layers, attention and FLOPs are nodes of their own. Returns ``<node> (<class>)`` of the calls left
    whole (their program could not be traced op by op)."""
    calls = [n for n in traced.graph.nodes
             if n.op == "call_module" and _has_children(traced.get_submodule(str(n.target)))]
    if not calls:
        return []
    seen: dict[fx.Node, list[Any]] = {}
    try:
        recorder = _CallInputs(traced, set(calls))
        with torch.enable_grad():
            recorder.run(*(x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs))
        seen = recorder.seen
    except Exception:  # noqa: BLE001 -- the calls stay whole and capture says so
        pass
    whole = []
    for node in calls:
        sub = traced.get_submodule(str(node.target))
        try:
            _splice(traced, node, _aten_program(sub, node, seen[node]))
        except Exception:  # noqa: BLE001
            whole.append(f"{node.name} ({type(sub).__name__})")
    traced.graph.lint()
    return whole


def _measure_fx(module: nn.Module, inputs: tuple):
    root = copy.deepcopy(module)
    traced = fx.symbolic_trace(root)
    whole = _expand_torch_modules(traced, inputs)
    user_values = iter(inputs)
    leaves: dict[fx.Node, Any] = {}
    counts = {"input_bytes": 0, "buffer_bytes": 0, "param_bytes": 0, "num_params": 0}
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            val = next(user_values, node.args[0] if node.args else None)
            if isinstance(val, torch.Tensor):
                counts["input_bytes"] += tensor_bytes(val)
                val = val.detach().clone()
            leaves[node] = val
        elif node.op == "get_attr":
            obj: Any = traced
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            leaves[node] = obj
    trainable = [p for p in traced.parameters() if p.requires_grad]
    constants = list(traced.parameters()) + list(traced.buffers())
    counts["param_bytes"] = sum(tensor_bytes(p) for p in trainable)
    counts["num_params"] = sum(p.numel() for p in trainable)
    counts["buffer_bytes"] = sum(tensor_bytes(t) for t in constants) - counts["param_bytes"]

    def describe(node: fx.Node) -> OpCall:
        if node.op == "call_module":
            sub = traced.get_submodule(str(node.target))
            return OpCall(fn=sub, op_type=type(sub).__name__.lower(), module_path=str(node.target),
                          owned_params=tuple(sub.parameters()))
        if node.op == "call_method":
            name = str(node.target)
            return OpCall(fn=lambda obj, *a, **k: getattr(obj, name)(*a, **k), op_type=name,
                          module_path=_innermost_path(node), cache_key=("method", name))
        return OpCall(fn=node.target, op_type=_op_name(node.target), module_path=_innermost_path(node),
                      cache_key=node.target)

    ties: list[dict[str, Any]] = []
    try:
        records, unused = measure_graph(traced.graph, leaves=leaves, describe=describe, trainable=trainable,
                                        constants=constants, ties=ties)
    except NodeFailure as exc:
        raise GraphError(f"cannot measure the fx graph ({exc})") from None
    return records, dict(counts, unused_param_bytes=unused, exec="real", **({"tied": ties} if ties else {})), whole
