"""Node-by-node measurement of an fx graph (shared by the export and fx capture paths).

The graph is interpreted in program order, like ``torch.fx.passes.shape_prop.ShapeProp``, but
each call node runs on its own: its tensor inputs that need a gradient are cut from their
producers (``detach`` shares storage) and made leaves, the op runs under ``FlopCounterMode``
and ``saved_tensors_hooks``, then ``autograd.grad`` of its outputs w.r.t. those leaves (and the
parameters the call owns) runs under a second ``FlopCounterMode``. So per node:

* ``fwd_flops``: FLOPs of the op (the sum over nodes is the module's forward count);
* ``bwd_flops``: FLOPs of the op's backward, measured (a convolution's with ``groups`` counted: torch's own
  formula for ``convolution_backward`` ignores them, so a depthwise conv's backward came out C x too large;
  ``_conv_backward_flops``). Fallback where the backward cannot run
  (no derivative, no meta kernel): ``2 x fwd`` if the op consumes trainable parameters (grads of
  inputs and weights), ``1 x fwd`` otherwise; such nodes are listed by the caller in ``meta``;
* ``act_bytes``: bytes of the storages saved for backward, each storage counted once over the
  whole graph (by the first node that saves it); parameter and buffer storages are excluded,
  saved model inputs (e.g. the image a first conv keeps for its weight grad) are included;
* ``param_bytes``: bytes of the trainable parameters this node consumes first (a parameter that several nodes
  consume, such as an embedding tied to the LM head, is listed with its users by ``measure_graph(ties=...)``);
* ``out_bytes`` and, per producer, the bytes of the tensors passed along each edge.

``getitem`` of a multi-output op (a list/tuple value) is folded into its producer. ``cond`` and
``map_impl`` are interpreted: the ops of the branch taken (of every slice) are measured as nodes of
their own, named after the higher-order node (see ``placement_rl.graph.hop``).

FLOP counts depend only on the op, its non-tensor arguments and its inputs' shapes, strides,
dtypes, aliasing and ``requires_grad``; they are cached under that signature within one capture,
so repeated layers (time steps, transformer blocks) run their backward once. Every node's forward
still runs (its outputs feed its consumers and its saved tensors are counted).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping

import torch
from torch import fx
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, sdpa_backward_flop_count, sdpa_flop_count

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
               torch.float64: "fp64"}  # the graph meta's names


@dataclass(frozen=True)
class OpCall:
    """How to run one call node: ``fn(*args, **kwargs)``, plus parameters it uses implicitly."""

    fn: Callable[..., Any]
    op_type: str
    module_path: str
    owned_params: tuple[torch.Tensor, ...] = ()
    cache_key: Hashable | None = None  # identity of the op for the FLOP cache (None: never cached)


@dataclass
class NodeRecord:
    name: str
    op_type: str
    module_path: str
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    bwd_measured: bool = True
    out_bytes: float = 0.0
    param_bytes: float = 0.0
    act_bytes: float = 0.0
    inputs: dict[str, float] = field(default_factory=dict)  # producer name -> edge bytes
    out_dtypes: dict[str, float] = field(default_factory=dict)  # output bytes per floating dtype (``DTYPE_NAMES``)


class NodeFailure(Exception):
    """Running node ``node_name`` failed (its forward raised); carries the cause."""

    def __init__(self, node_name: str, cause: BaseException) -> None:
        super().__init__(f"node '{node_name}': {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")
        self.node_name = node_name
        self.cause = cause


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a (nested) value."""
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _signature(call: OpCall, args: tuple, kwargs: dict) -> Hashable | None:
    """Hashable description of an op call that determines its FLOPs, or None if not cacheable."""
    if call.cache_key is None:
        return None
    flat, spec = tree_flatten((args, kwargs))
    first: dict[int, int] = {}
    parts: list[Hashable] = []
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            parts.append(("T", tuple(x.shape), x.stride(), x.dtype, x.requires_grad, first.setdefault(id(x), i)))
        elif x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device, torch.memory_format,
                                         torch.layout)):
            parts.append((type(x).__name__, x))
        else:
            return None
    return (call.cache_key, str(spec), tuple(parts))


class _Measure:
    def __init__(self, *, trainable: Iterable[torch.Tensor], constants: Iterable[torch.Tensor],
                 device: torch.device | None) -> None:
        self.trainable = {id(p): p for p in trainable}
        self.claimed: set[int] = set()
        self.users: dict[int, list[str]] = {}  # id of a trainable parameter -> nodes consuming it, in program order
        self.constant_keys = {_storage_key(t) for t in constants}
        self.saved: dict[int, Any] = {}  # storage key -> storage, kept alive so keys stay unique
        self.device = device
        self.flops: dict[Hashable, tuple[float, float, bool]] = {}  # signature -> (fwd, bwd, measured)

    def ties(self) -> list[dict[str, Any]]:
        """``{"bytes": B, "nodes": [names]}`` per trainable parameter consumed by more than one node, in the
        order parameters were first used; ``nodes[0]`` is the node charged with its bytes."""
        return [{"bytes": float(self.trainable[pid].numel() * self.trainable[pid].element_size()), "nodes": list(names)}
                for pid, names in self.users.items() if len(names) > 1]

    def _retarget(self, x: Any) -> Any:
        return self.device if isinstance(x, torch.device) else x

    def run(self, node: fx.Node, call: OpCall, args: tuple, kwargs: dict, *,
            name: str | None = None) -> tuple[Any, NodeRecord]:
        rec = NodeRecord(name or node.name, call.op_type, call.module_path)
        if self.device is not None:
            args, kwargs = tree_map(self._retarget, (args, kwargs))
        used = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)] + list(call.owned_params)
        uses_params = False
        for t in used:
            if id(t) in self.trainable:
                uses_params = True
                users = self.users.setdefault(id(t), [])
                if not users or users[-1] != rec.name:
                    users.append(rec.name)
                if id(t) not in self.claimed:
                    self.claimed.add(id(t))
                    rec.param_bytes += t.numel() * t.element_size()
        sig = _signature(call, args, kwargs)
        cached = self.flops.get(sig) if sig is not None else None
        try:
            out, wrt, saved, fwd = self._forward(call, args, kwargs, clone=False, count=cached is None)
        except Exception as first:  # in-place op on a leaf that requires grad: retry on clones
            try:
                out, wrt, saved, fwd = self._forward(call, args, kwargs, clone=True, count=cached is None)
            except Exception:
                raise NodeFailure(rec.name, first) from first
        rec.fwd_flops = float(fwd)
        for t in saved:
            key = _storage_key(t)
            if key not in self.constant_keys and key not in self.saved:
                self.saved[key] = t.untyped_storage()
                rec.act_bytes += t.untyped_storage().nbytes()
        rec.out_bytes = float(tensor_bytes(out))
        rec.out_dtypes = dtype_bytes(tree_leaves(out))
        wrt += [p for p in call.owned_params if p.requires_grad]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if cached is not None:
            rec.fwd_flops, rec.bwd_flops, rec.bwd_measured = cached
        elif outs and wrt:
            try:
                with FlopCounterMode(display=False, custom_mapping=_FLOPS) as counter:
                    torch.autograd.grad(outs, wrt, [torch.ones_like(t) for t in outs], allow_unused=True)
                rec.bwd_flops = float(counter.get_total_flops())
            except Exception:
                rec.bwd_measured = False
                rec.bwd_flops = rec.fwd_flops * (2.0 if uses_params else 1.0)
        if sig is not None and cached is None:
            self.flops[sig] = (rec.fwd_flops, rec.bwd_flops, rec.bwd_measured)
        out = tree_map(lambda t: t.detach().requires_grad_(t.requires_grad)
                       if isinstance(t, torch.Tensor) else t, out)
        return out, rec

    @staticmethod
    def _forward(call: OpCall, args: tuple, kwargs: dict, *, clone: bool, count: bool):
        leaves: dict[int, torch.Tensor] = {}

        def to_leaf(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or not t.requires_grad:
                return t
            if id(t) not in leaves:
                leaves[id(t)] = t.detach().requires_grad_(True)
            return leaves[id(t)].clone() if clone else leaves[id(t)]

        args, kwargs = tree_map(to_leaf, (args, kwargs))
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t)
            return t

        with saved_tensors_hooks(pack, lambda t: t):
            if not count:
                return call.fn(*args, **kwargs), list(leaves.values()), saved, 0
            with FlopCounterMode(display=False, custom_mapping=_FLOPS) as counter:
                out = call.fn(*args, **kwargs)
        return out, list(leaves.values()), saved, counter.get_total_flops()


def _conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                         _output_padding, _groups, output_mask, out_shape=None) -> int:
    """``aten.convolution_backward``: each gradient asked for (input, weight) costs the forward convolution's
    multiply-adds, whose count reads the weight's ``C_in / groups`` (torch 2.13's formula does not)."""
    fwd = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed=bool(transposed))
    return fwd * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _cpu_attention_flops(q_shape, k_shape, v_shape, *_args, out_shape=None, **_kwargs) -> int:
    """``aten._scaled_dot_product_flash_attention_for_cpu`` (what ``scaled_dot_product_attention`` runs on CPU
    tensors): torch 2.13 counts its CUDA kernels only, so attention on real CPU tensors came out 0 FLOPs."""
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _cpu_attention_backward_flops(grad_out_shape, q_shape, k_shape, v_shape, *_args, out_shape=None,
                                  **_kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, q_shape, k_shape, v_shape)


_FLOPS = {torch.ops.aten.convolution_backward: _conv_backward_flops,
          torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops,
          torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward_flops}


class _PerItem(tuple):
    """Producers of each element of a tuple value (the outputs of an interpreted cond / map)."""


def measure_graph(graph: fx.Graph, *, leaves: Mapping[fx.Node, Any], describe: Callable[[fx.Node], OpCall],
                  trainable: Iterable[torch.Tensor], constants: Iterable[torch.Tensor],
                  device: torch.device | None = None,
                  ties: list[dict[str, Any]] | None = None) -> tuple[list[NodeRecord], int]:
    """Measure every call node of ``graph``; returns the records (program order) and unclaimed param bytes.

    ``leaves`` gives the value of every placeholder and get_attr node (trainable parameters must
    require grad); ``device`` (e.g. meta) replaces every ``torch.device`` argument of the ops.
    ``cond`` and ``map_impl`` nodes are interpreted: their bodies' ops become nodes (see ``hop``).
    ``ties``, when given a list, receives one ``{"bytes": B, "nodes": [names]}`` per trainable parameter
    that more than one node consumes (an embedding tied to the LM head, a weight used at every step of an
    unrolled loop): its bytes and its users in program order, the first being the node whose ``param_bytes``
    count them. Raises ``NodeFailure`` if a node's forward fails.
    """
    trainable = list(trainable)
    walker = _Walker(_Measure(trainable=trainable, constants=constants, device=device), describe)
    with torch.enable_grad():
        walker.run(graph, dict(leaves), {n: [] for n in leaves}, prefix="")
    unclaimed = sum(p.numel() * p.element_size() for p in trainable if id(p) not in walker.m.claimed)
    if ties is not None:
        ties.extend(walker.m.ties())
    return walker.records, unclaimed


class _Walker:
    """Runs a graph in program order; ``src[node]`` lists (producer record name, bytes) of its value."""

    def __init__(self, m: _Measure, describe: Callable[[fx.Node], OpCall]) -> None:
        self.m, self.describe = m, describe
        self.records: list[NodeRecord] = []

    def run(self, graph: fx.Graph, env: dict, src: dict, *, prefix: str, path: str = "") -> tuple[Any, Any]:
        from placement_rl.graph.hop import COND, MAP

        for node in graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                continue  # given by the caller
            if node.op == "output":
                return (fx.node.map_arg(node.args[0], env.__getitem__),
                        fx.node.map_arg(node.args[0], src.__getitem__))
            if node.op == "call_function" and node.target is operator.getitem:
                parent = node.args[0]
                if isinstance(src.get(parent), _PerItem):
                    env[node], src[node] = env[parent][node.args[1]], src[parent][node.args[1]]
                    continue
                if isinstance(env.get(parent), (list, tuple)):
                    env[node] = env[parent][node.args[1]]
                    src[node] = [(name, float(tensor_bytes(env[node]))) for name, _ in src[parent]]
                    continue
            if node.op == "call_function" and node.target in (COND, MAP):
                run_hop = self._cond if node.target is COND else self._map
                env[node], src[node] = run_hop(node, env, src, prefix=prefix, path=path)
                continue
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            call = self.describe(node)
            if path and not call.module_path:
                call = OpCall(call.fn, call.op_type, path, call.owned_params, call.cache_key)
            name = prefix + node.name
            env[node], rec = self.m.run(node, call, args, kwargs, name=name)
            for inp in node.all_input_nodes:
                for producer, nbytes in src[inp]:
                    rec.inputs[producer] = rec.inputs.get(producer, 0.0) + nbytes
            src[node] = [(name, float(tensor_bytes(env[node])))]
            self.records.append(rec)
        raise ValueError("graph without an output node")

    def _body(self, body: fx.GraphModule, values: list, sources: list, *, prefix: str, path: str):
        holders = [n for n in body.graph.nodes if n.op == "placeholder"]
        env = dict(zip(holders, values))
        src = dict(zip(holders, sources))
        for n in body.graph.nodes:
            if n.op == "get_attr":
                obj: Any = body
                for part in str(n.target).split("."):
                    obj = getattr(obj, part)
                env[n], src[n] = obj, []
        return self.run(body.graph, env, src, prefix=prefix, path=path)

    def _path(self, node: fx.Node, path: str) -> str:
        return self.describe(node).module_path or path if node.meta.get("nn_module_stack") else path

    def _cond(self, node: fx.Node, env: dict, src: dict, *, prefix: str, path: str):
        pred, true_body, false_body, operands = node.args[:4]
        value = env[pred]
        try:
            taken = bool(value)
        except Exception as exc:  # a meta tensor has no truth value: measure on real tensors
            raise NodeFailure(prefix + node.name, exc) from exc
        body = env[true_body] if taken else env[false_body]
        first = len(self.records)
        out, out_src = self._body(body, [env[o] for o in operands], [src[o] for o in operands],
                                  prefix=f"{prefix}{node.name}__{'true' if taken else 'false'}__",
                                  path=self._path(node, path))
        for k, rec in enumerate(self.records[first:]):  # the branch waits for its predicate
            if k == 0 or not rec.inputs:
                for producer, nbytes in src[pred]:
                    rec.inputs[producer] = rec.inputs.get(producer, 0.0) + nbytes
        return tuple(out), _PerItem(out_src)

    def _map(self, node: fx.Node, env: dict, src: dict, *, prefix: str, path: str):
        body, xs, pos = env[node.args[0]], list(node.args[1]), list(node.args[2])
        count = int(env[xs[0]].shape[0])
        per_out: list[list] = []
        per_src: list[list] = []
        for k in range(count):
            vals = [env[x][k] for x in xs] + [env[a] for a in pos]
            srcs = [[(n, b / count) for n, b in src[x]] for x in xs] + [src[a] for a in pos]
            out, out_src = self._body(body, vals, srcs, prefix=f"{prefix}{node.name}__{k}__",
                                      path=self._path(node, path))
            for i, (o, s) in enumerate(zip(out, out_src)):
                if k == 0:
                    per_out.append([])
                    per_src.append([])
                per_out[i].append(o)
                per_src[i].extend(s)
        with torch.no_grad():
            stacked = [torch.stack(o) for o in per_out]
        stacked = [t.requires_grad_(True) if any(x.requires_grad for x in o) else t for t, o in zip(stacked, per_out)]
        return tuple(stacked), _PerItem(per_src)


def dtype_bytes(values: Iterable[Any]) -> dict[str, float]:
    """Bytes of the floating-point tensors among ``values`` per dtype (``DTYPE_NAMES``, else ``other``)."""
    size: dict[str, float] = {}
    for t in values:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            k = DTYPE_NAMES.get(t.dtype, "other")
            size[k] = size.get(k, 0.0) + float(t.numel() * t.element_size())
    return size


def _top(size: dict[str, float]) -> str | None:
    return max(size, key=size.get) if size else None


def activation_dtype(records: list[NodeRecord]) -> str | None:
    """The floating dtype the captured ops compute in (``bf16``, ``fp16``, ``fp32``, ``fp64`` or ``other``; None
    where no op puts out a floating tensor): the dtype of most forward FLOPs, each op's FLOPs counted for the dtypes
    of its outputs (split by their bytes), so the GEMMs, convolutions and attention decide; where no op counts
    FLOPs, the dtype of most output bytes. Under ``torch.autocast`` a model of fp32 parameters computes in bf16 /
    fp16; a bf16 model whose loss upcasts its logits to fp32 computes in bf16 (the cast and the cross-entropy count
    no FLOPs, though by bytes the fp32 logits of a small model outweigh its bf16 activations; the cost model then
    reads their bytes as bf16 elements, twice as many as there are). Where the GEMMs are mixed, the dtype of most
    of their FLOPs is the graph's and its other ops are priced in it too."""
    by_flops: dict[str, float] = {}
    by_bytes: dict[str, float] = {}
    for r in records:
        total = sum(r.out_dtypes.values())
        for k, b in r.out_dtypes.items():
            by_bytes[k] = by_bytes.get(k, 0.0) + b
            if r.fwd_flops > 0 and total > 0:
                by_flops[k] = by_flops.get(k, 0.0) + r.fwd_flops * b / total
    return _top(by_flops) or _top(by_bytes)


def param_dtype(module: torch.nn.Module, inputs: tuple) -> str | None:
    """The floating dtype of most bytes of the module's parameters (else of its tensor inputs), as
    ``activation_dtype`` names it; buffers do not count (a large bf16 table beside fp32 weights is no bf16 model)."""
    for tensors in (module.parameters(), tree_leaves(inputs)):
        size = dtype_bytes(tensors)
        if size:
            return _top(size)
    return None


def graph_dtypes(records: list[NodeRecord], module: torch.nn.Module, inputs: tuple) -> dict[str, str]:
    """The graph meta's precision keys (none for an fp32 model): ``dtype`` (``bf16`` / ``fp16`` / ``fp64``: the ops'
    outputs, the bytes of ``out_bytes`` / edges, are elements of it; the model runs in it) and ``param_dtype``
    (where the parameters' dtype differs from that: ``fp32`` under autocast)."""
    act, par = activation_dtype(records), param_dtype(module, inputs)
    half = act if act in ("bf16", "fp16", "fp64") else None
    par = par if par in ("bf16", "fp16", "fp32", "fp64") else "fp32"
    out = {"dtype": half} if half else {}
    if par != (half or "fp32"):
        out["param_dtype"] = par
    return out
