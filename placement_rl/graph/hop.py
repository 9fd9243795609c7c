"""Higher-order ops that ``torch.export`` emits, made measurable node by node.

``torch.export`` (non-strict, training IR) wraps some regions of a program in a higher-order op whose
body is a submodule of the exported graph module (a ``get_attr`` node):

* ``wrap_with_set_grad_enabled(enabled, body, *args)`` -- a ``torch.no_grad()`` / ``enable_grad``
  region (e.g. the rotary embedding of Llama-family models in ``transformers``);
* ``wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *args)`` -- a
  ``torch.autocast`` region;
* ``cond(pred, true_body, false_body, operands)`` -- ``torch.cond``;
* ``map_impl(body, xs, args)`` -- ``torch._higher_order_ops.map``.

``flatten_wrappers(gm)`` inlines the first two statically: every op of the body becomes a node of
the outer graph (named ``<wrapper node>__<op node>``) whose target runs the original op under the
region's grad / autocast mode (``RegionOp``). The result is an ordinary graph of ops, used alike by
capture, the profiler and the op-level executor, so node names agree everywhere.

``cond`` and ``map_impl`` depend on data (which branch, how many slices), so they are interpreted at
measurement time instead (``placement_rl.graph._capture_engine``): the branch taken, or every slice of
the map, runs op by op as nodes named ``<cond>__true__<op>`` / ``<map>__<k>__<op>``. Their truth value
needs real data, so capture measures such programs on real tensors (``exec="real"``).
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Callable

import torch
from torch import fx

SET_GRAD = torch.ops.higher_order.wrap_with_set_grad_enabled
AUTOCAST = torch.ops.higher_order.wrap_with_autocast
COND = torch.ops.higher_order.cond
MAP = torch.ops.higher_order.map_impl


def base_op(target: Any) -> Any:
    """The op a (possibly wrapped) call target runs."""
    return target.op if isinstance(target, RegionOp) else target


def _op_label(op: Any) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return op.name().replace("::", "_").replace(".", "_")
    return getattr(op, "__name__", type(op).__name__)


class RegionOp:
    """Run ``op`` under a grad mode and/or autocast setting (an inlined wrapper region's op).

    ``grad``: True/False, or None to leave the grad mode alone; ``autocast``: keyword arguments of
    ``torch.autocast`` or None. An enabled autocast region refuses meta tensors (autocast does not
    apply to them, so dtypes and bytes would be wrong), which makes capture use real tensors.
    """

    def __init__(self, op: Callable[..., Any], *, grad: bool | None = None,
                 autocast: dict[str, Any] | None = None) -> None:
        self.inner = op
        self.op = base_op(op)
        self.grad = grad
        self.autocast = autocast
        mode = ("grad" if grad else "nograd") if grad is not None else "autocast"
        self.__name__ = self.__qualname__ = f"{mode}_{_op_label(self.op)}"
        self.__module__ = __name__

    @property
    def mode(self) -> tuple:
        inner = self.inner.mode if isinstance(self.inner, RegionOp) else ()
        cast = tuple(sorted((k, str(v)) for k, v in self.autocast.items())) if self.autocast else None
        return (self.grad, cast) + inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            if self.grad is not None:
                stack.enter_context(torch.set_grad_enabled(self.grad))
            if self.autocast is not None and self.autocast.get("enabled", True):
                tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                if any(t.device.type == "meta" for t in tensors):
                    raise RuntimeError("an autocast region needs real tensors (autocast does not apply to meta)")
                stack.enter_context(torch.autocast(**self.autocast))
            return self.inner(*args, **kwargs)

    def __repr__(self) -> str:
        return f"RegionOp({self.__name__})"


def _wrapper_parts(node: fx.Node) -> tuple[dict[str, Any], fx.Node, tuple] | None:
    """(mode kwargs for RegionOp, body get_attr node, body args) of a wrapper node, else None."""
    if node.op != "call_function":
        return None
    if node.target is SET_GRAD:
        return {"grad": bool(node.args[0])}, node.args[1], tuple(node.args[2:])
    if node.target is AUTOCAST:
        device_type, dtype, enabled, cache_enabled = node.args[:4]
        cast = {"device_type": device_type, "dtype": dtype, "enabled": bool(enabled),
                "cache_enabled": cache_enabled}
        return {"autocast": cast}, node.args[4], tuple(node.args[5:])
    return None


def has_wrappers(gm: fx.GraphModule) -> bool:
    return any(_wrapper_parts(n) is not None for n in gm.graph.nodes)


def flatten_wrappers(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with every grad-mode / autocast wrapper region inlined (``gm`` itself if it has none).

    Placeholders, outputs and every other node keep their names and meta; ``cond`` / ``map_impl``
    bodies keep their own graphs (wrappers inside them are flattened too).
    """
    if not has_wrappers(gm) and not any(isinstance(m, fx.GraphModule) and has_wrappers(m)
                                        for m in gm.children()):
        return gm
    root = torch.nn.Module()
    graph = fx.Graph()
    out = _inline(gm, graph, root, args=None, mode={}, prefix="")
    graph.output(out)
    graph.lint()
    return fx.GraphModule(root, graph)


def _inline(src: fx.GraphModule, graph: fx.Graph, root: torch.nn.Module, *, args: tuple | None,
            mode: dict[str, Any], prefix: str) -> Any:
    """Copy ``src``'s nodes into ``graph``; ``args`` feed its placeholders (None: copy them). Returns the
    (mapped) output argument."""
    env: dict[fx.Node, Any] = {}
    feed = iter(args) if args is not None else None
    for node in src.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(feed) if feed is not None else graph.node_copy(node)
        elif node.op == "output":
            return fx.node.map_arg(node.args[0], env.__getitem__)
        elif node.op == "get_attr":
            value = _fetch(src, str(node.target))
            if isinstance(value, fx.GraphModule):
                value = flatten_wrappers(value)
            name = _fresh_attr(root, prefix + str(node.target).replace(".", "_"))
            setattr(root, name, value) if not isinstance(value, torch.nn.Module) else root.add_module(name, value)
            env[node] = graph.get_attr(name)
            env[node].meta = dict(node.meta)
        elif (parts := _wrapper_parts(node)) is not None:
            region, body, body_args = parts
            sub = _fetch(src, str(body.target))
            inner_mode = {**mode, **region}
            outs = _inline(sub, graph, root, args=fx.node.map_arg(body_args, env.__getitem__), mode=inner_mode,
                           prefix=f"{prefix}{node.name}__")
            env[node] = _Tuple(outs) if isinstance(outs, (tuple, list)) else outs
        elif (node.op == "call_function" and node.target is operator.getitem
              and isinstance(env.get(node.args[0]), _Tuple)):
            env[node] = env[node.args[0]][node.args[1]]
        else:
            target = node.target
            if mode and node.op == "call_function":
                for key in ("autocast", "grad"):  # innermost region applied last (closest to the op)
                    if key in mode:
                        target = RegionOp(target, **{key: mode[key]})
            new = graph.create_node(node.op, target, fx.node.map_arg(node.args, env.__getitem__),
                                    fx.node.map_arg(node.kwargs, env.__getitem__),
                                    name=f"{prefix}{node.name}" if args is not None else node.name)
            new.meta = dict(node.meta)
            env[node] = new
    raise ValueError("graph without an output node")


class _Tuple(tuple):
    """The outputs of an inlined region (consumed through getitem)."""


def _fetch(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _fresh_attr(root: torch.nn.Module, name: str) -> str:
    base, k = name or "attr", 0
    while hasattr(root, name):
        k += 1
        name = f"{base}_{k}"
    return name
