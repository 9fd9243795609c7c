"""``nn.Module`` -> ``CompGraph``: capture one training step's forward and measure every op.

``capture(module, example_inputs)`` traces the module with ``torch.export.export(...,
strict=False)`` (or ``torch.fx.symbolic_trace`` with ``method="fx"``, which is also the automatic
fallback, with a warning, when export fails). One graph node per call node of the program, named
by its fx node name (deterministic: the executor re-captures the module and maps placements
back by name); ``getitem`` of a multi-output op is folded into its producer. Every node is then
measured on its own (see ``_capture_engine``): forward FLOPs, measured backward FLOPs, bytes of
its outputs, of the parameters it consumes first and of the tensors it saves for backward.

Higher-order ops of the exported program are handled by ``placement_rl.graph.hop``: grad-mode and
autocast wrapper regions are inlined (their ops become nodes run under the region's mode), ``cond``
and ``map`` are interpreted (the ops of the branch taken / of every slice become nodes).

Export graphs are interpreted on ``meta`` tensors (exact FLOPs and bytes, no compute, no memory);
if an op cannot run on meta (data-dependent shapes) the whole graph is interpreted again on real
copies of the inputs, parameters and buffers (``exec="real"`` in ``meta``). The fx path always runs
real tensors through a deep copy of the module (so buffers of the caller's module never change).
``symbolic_trace`` keeps every ``torch.nn`` module as one call; a call of one that has submodules
(``TransformerEncoder``/``Decoder``, ``MultiheadAttention``) is replaced by the aten ops it runs on the
example inputs (``make_fx`` on real tensors, nodes named ``<call>__<op>``), so its layers are nodes priced
op by op. One that cannot be traced so stays one node, with a warning naming it.

A ``torch.autograd.Function`` in the forward is traced through by both methods: the graph prices
autograd's backward of its forward ops, not its own backward; capture warns, naming the Function.

``meta`` of the graph records: ``batch_size`` (the first input's leading dimension), ``tp`` (tensor-parallel
split annotations, ``placement_rl.graph.tp.detect``), ``capture_method`` (export|fx), ``exec`` (meta|real),
``torch_version``, ``input_bytes``, ``buffer_bytes`` (buffers and constants), ``param_bytes`` and
``num_params`` (trainable), ``unused_param_bytes`` (trainable but consumed by no node), ``tied`` (only where a
trainable parameter is consumed by more than one node, e.g. an embedding tied to the LM head: per such parameter
``{"bytes": B, "nodes": [its users]}``, the first user being the node whose ``param_bytes`` count it),
``bwd_flops_fallback`` (nodes whose backward FLOPs use the fallback rule), ``export_error``
(when fx was the fallback), ``whole_modules`` (fx: calls of modules with submodules left one node; only
when there are), ``autograd_functions`` (custom Functions in the forward; only when there are), and
whatever the caller passes in ``meta=`` (e.g. zoo name/options).
"""

from __future__ import annotations

import traceback
import warnings
from typing import Any, Mapping, Sequence

import torch
from torch import fx, nn

from placement_rl.errors import CaptureError, GraphError
from placement_rl.graph._capture_engine import NodeFailure, NodeRecord, OpCall, graph_dtypes, measure_graph, tensor_bytes
from placement_rl.graph.capture_fx import _attr, _innermost_path, _measure_fx, _op_name
from placement_rl.graph.hop import RegionOp, base_op, flatten_wrappers
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.op_classes import base_name

METHODS = ("export", "fx")
EXEC_MODES = ("auto", "meta", "real")


class _UnsupportedProgram(Exception):
    """The exported program uses a feature this capture does not interpret."""


def _export_leaves(ep: Any, gm: fx.GraphModule, module: nn.Module, inputs: Sequence[Any], mode: str):
    """Values of the placeholders and get_attr nodes of ``gm`` (the exported program's graph, wrapper regions
    flattened): (leaves, trainable, constants, counts)."""
    from torch.export.graph_signature import InputKind

    named = dict(module.named_parameters(remove_duplicate=False))
    named_buffers = dict(module.named_buffers(remove_duplicate=False))
    user_values = iter(torch.utils._pytree.tree_leaves(tuple(inputs)))
    nodes = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    leaves: dict[fx.Node, Any] = {n: _attr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"}
    trainable, constants = [], []
    seen: dict[int, torch.Tensor] = {}
    counts = {"input_bytes": 0, "buffer_bytes": 0, "param_bytes": 0, "num_params": 0}

    def place(t: torch.Tensor, *, grad: bool = False, copy_: bool = True) -> torch.Tensor:
        if mode == "meta":
            t = t.detach().to("meta")
        else:
            t = t.detach().clone() if copy_ else t.detach()
        return t.requires_grad_(grad) if t.is_floating_point() or t.is_complex() else t

    for spec in ep.graph_signature.input_specs:
        node = nodes[spec.arg.name]
        if spec.kind == InputKind.PARAMETER:
            p = named.get(spec.target, ep.state_dict.get(spec.target))
            if id(p) in seen:  # a tied parameter lifted twice: one value, counted once
                leaves[node] = seen[id(p)]
                continue
            val = seen[id(p)] = place(p, grad=p.requires_grad, copy_=False)
            if p.requires_grad:
                trainable.append(val)
                counts["param_bytes"] += tensor_bytes(p)
                counts["num_params"] += p.numel()
            else:
                counts["buffer_bytes"] += tensor_bytes(p)
            constants.append(val)
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            src = named_buffers.get(spec.target)
            if src is None:
                src = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
            if id(src) in seen:
                leaves[node] = seen[id(src)]
                continue
            val = seen[id(src)] = place(src)
            counts["buffer_bytes"] += tensor_bytes(src)
            constants.append(val)
        elif spec.kind == InputKind.USER_INPUT:
            src = next(user_values)
            if isinstance(src, torch.Tensor):
                counts["input_bytes"] += tensor_bytes(src)
                val = place(src)
            else:
                val = src
        else:  # custom objects, effect tokens: let capture() fall back to fx
            raise _UnsupportedProgram(f"exported program has an input of kind {spec.kind.name} ('{spec.arg.name}')")
        leaves[node] = val
    return leaves, trainable, constants, counts


def _describe_export(node: fx.Node) -> OpCall:
    op = base_op(node.target)
    key = None
    if isinstance(op, torch._ops.OpOverload):
        key = (op, node.target.mode) if isinstance(node.target, RegionOp) else op
    return OpCall(fn=node.target, op_type=_op_name(op), module_path=_innermost_path(node), cache_key=key)


def _measure_export(module: nn.Module, inputs: tuple, exec_mode: str):
    ep = torch.export.export(module, inputs, strict=False)
    gm = flatten_wrappers(ep.graph_module)
    modes = ("meta", "real") if exec_mode == "auto" else (exec_mode,)
    failure: NodeFailure | None = None
    for mode in modes:
        leaves, trainable, constants, counts = _export_leaves(ep, gm, module, inputs, mode)
        ties: list[dict[str, Any]] = []
        try:
            records, unused = measure_graph(gm.graph, leaves=leaves, describe=_describe_export, trainable=trainable,
                                            constants=constants,
                                            device=torch.device("meta") if mode == "meta" else None, ties=ties)
        except NodeFailure as exc:
            failure = exc
            continue
        return records, dict(counts, unused_param_bytes=unused, exec=mode, **({"tied": ties} if ties else {}))
    reason = f"cannot measure the exported graph ({failure})"
    raise CaptureError(f"{reason}; try method='fx' or exec_mode='real'", reason)


def _export_hint(exc: BaseException) -> str:
    """``"; likely fix: ..."`` where the export failure has a known cause in the user's call, else ``""``."""
    try:
        frames, chain = [], []
        while exc is not None and exc not in chain:  # the exception, its cause, the cause's cause...
            chain.append(exc)
            frames += [f for f, _ in traceback.walk_tb(exc.__traceback__)]
            exc = exc.__cause__ or exc.__context__
        for caller, frame in zip(frames, frames[1:]):
            if frame.f_code.co_name == "_detect_is_causal_mask" and "transformer" in frame.f_code.co_filename:
                owner = type(caller.f_locals.get("self")).__name__
                arg = "tgt_is_causal" if owner in ("TransformerDecoder", "TransformerDecoderLayer") else "is_causal"
                return (f"; likely fix: pass {arg}=True to {owner} with a causal mask (torch.export cannot read the "
                        "mask's values to detect it)")
        if any("Cache" in type(x).__name__ or "cache_utils" in str(x) for x in chain):
            return ("; likely fix: call the transformers model with use_cache=False (its default returns the "
                    "key-value cache, which capture cannot follow), e.g. in a wrapper that returns the loss")
    except Exception:  # noqa: BLE001 -- a hint only
        pass
    return ""


# ------------------------------------------------------------------------------------------ public
_WEIGHT_VIEWS = {"t", "numpy_t", "transpose", "permute", "mt", "adjoint", "swapaxes", "swapdims", "getattr"}  # fx: w.T
_WEIGHT_USERS = {"matmul", "mm", "bmm", "linear", "addmm", "baddbmm", "einsum"}


def _weights_to_their_gemm(records: list[NodeRecord], ties: Sequence[dict[str, Any]] = ()) -> list[NodeRecord]:
    """``x @ self.weight.T`` (Falcon's linear, hand-written layers): the transpose is the first op to touch the
    weight and so claims its bytes, leaving a parameter-free ``matmul`` (priced as a batched matmul with no
    weight gradient, never split by TP) fed by a weight "activation". A transpose-like view whose only input is
    a parameter (no producer node) and whose one consumer is a matmul is folded into that matmul, as
    ``F.linear`` folds it: the matmul owns the weight, the view node and its edge go (and in ``ties``, the
    ``meta["tied"]`` entries, changed in place, the matmul stands for it)."""
    users: dict[str, list[NodeRecord]] = {}
    for r in records:
        for src in r.inputs:
            users.setdefault(src, []).append(r)
    folded: dict[str, str] = {}
    for r in records:
        got = users.get(r.name, [])
        if (r.param_bytes > 0 and not r.inputs and r.fwd_flops == 0 and base_name(r.op_type) in _WEIGHT_VIEWS
                and len(got) == 1 and base_name(got[0].op_type) in _WEIGHT_USERS):
            got[0].param_bytes += r.param_bytes
            got[0].inputs.pop(r.name)
            folded[r.name] = got[0].name
    for tie in ties if folded else ():
        tie["nodes"] = list(dict.fromkeys(folded.get(nm, nm) for nm in tie["nodes"]))
    return [r for r in records if r.name not in folded] if folded else records


def _to_graph(records: list[NodeRecord], *, name: str, meta: Mapping[str, Any]) -> CompGraph:
    if not records:
        raise GraphError(f"cannot capture '{name}': the traced program has no ops")
    ties = [dict(t) for t in meta.get("tied", ())]
    records = _weights_to_their_gemm(records, ties)
    if ties:  # a parameter whose users were a view and its matmul alone now has one user: no longer tied
        meta = {k: v for k, v in meta.items() if k != "tied"}
        if any(len(t["nodes"]) > 1 for t in ties):
            meta["tied"] = [t for t in ties if len(t["nodes"]) > 1]
    index = {r.name: i for i, r in enumerate(records)}
    edges, edge_bytes = [], []
    for i, r in enumerate(records):
        for src, nbytes in r.inputs.items():
            edges.append((index[src], i))
            edge_bytes.append(nbytes)
    return CompGraph(
        names=tuple(r.name for r in records), op_types=tuple(r.op_type for r in records),
        module_paths=tuple(r.module_path for r in records),
        fwd_flops=[r.fwd_flops for r in records], bwd_flops=[r.bwd_flops for r in records],
        out_bytes=[r.out_bytes for r in records], param_bytes=[r.param_bytes for r in records],
        act_bytes=[r.act_bytes for r in records], edges=edges, edge_bytes=edge_bytes, name=name, meta=meta)


def capture(module: nn.Module, example_inputs: Any, *, method: str = "export", name: str | None = None,
            exec_mode: str = "auto", meta: Mapping[str, Any] | None = None) -> CompGraph:
    """Capture ``module(*example_inputs)`` (a training step's forward, returning the loss) as a CompGraph.

    ``method``: ``"export"`` (torch.export non-strict; falls back to fx with a warning) or ``"fx"``.
    ``exec_mode`` (export path): ``"auto"`` (meta tensors, real ones if an op needs data), ``"meta"``
    or ``"real"``. ``meta`` entries are copied into the graph's meta (JSON values only).
    """
    if not isinstance(module, nn.Module):
        raise GraphError(f"capture needs an nn.Module, got {type(module).__name__}")
    if method not in METHODS:
        raise GraphError(f"unknown capture method '{method}'; valid methods: {', '.join(METHODS)}")
    if exec_mode not in EXEC_MODES:
        raise GraphError(f"unknown exec_mode '{exec_mode}'; valid modes: {', '.join(EXEC_MODES)}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise GraphError(f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}")
    inputs = tuple(example_inputs)
    info: dict[str, Any] = {}
    used, hint = method, ""
    if method == "export":
        try:
            records, counts = _measure_export(module, inputs, exec_mode)
        except GraphError:
            raise
        except Exception as exc:  # torch.export raises many types; fall back to fx
            info["export_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            hint = _export_hint(exc)
            warnings.warn(f"torch.export failed ({info['export_error']}){hint}; falling back to "
                          "torch.fx.symbolic_trace", RuntimeWarning, stacklevel=2)
            used = "fx"
    if used == "fx":
        try:
            records, counts, whole = _measure_fx(module, inputs)
        except GraphError as exc:
            if "export_error" not in info or type(exc) is not GraphError:
                raise
            raise GraphError(f"{exc}; torch.export failed first ({info['export_error']}){hint}") from None
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            extra = f"; export failed too ({info['export_error']}){hint}" if info else ""
            raise CaptureError(f"cannot trace {type(module).__name__} with torch.fx ({why}){extra}",
                               f"torch.export: {info['export_error']}" if info else f"torch.fx: {why}") from None
        if whole:
            info["whole_modules"] = whole
            warnings.warn(f"{len(whole)} graph node(s) are whole modules priced as one op (no inner ops, FLOPs of "
                          f"ops torch cannot count missing, no split inside): {', '.join(whole)}",
                          RuntimeWarning, stacklevel=2)
    from placement_rl.graph.autograd_fns import custom_autograd_functions

    functions = [c.__qualname__ for c in custom_autograd_functions(module, inputs) or ()]
    if functions:
        info["autograd_functions"] = functions
        warnings.warn(f"{', '.join(functions)}: custom torch.autograd.Function backward not captured: the graph "
                      "holds the forward's ops and prices autograd's backward of them, not the Function's own",
                      RuntimeWarning, stacklevel=2)
    info.update(graph_dtypes(records, module, inputs))  # the GPU model reads the bytes in it, runs it in bf16
    full_meta: dict[str, Any] = {
        "capture_method": used, "torch_version": torch.__version__, **counts, **info,
        "bwd_flops_fallback": [r.name for r in records if not r.bwd_measured],
    }
    first = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() > 0 else None
    if first is not None:  # the zoo convention: every input has the batch first
        full_meta["batch_size"] = int(first.shape[0])
    full_meta.update(dict(meta or {}))
    graph = _to_graph(records, name=name or type(module).__name__.lower(), meta=full_meta)
    from placement_rl.graph import tp  # TP split annotations, kept in meta through coarsening and JSON

    return graph.replace(meta={**graph.meta, "tp": tp.detect(graph)})


def capture_zoo(name: str, /, *, method: str = "export", **overrides: Any) -> CompGraph:
    """Build zoo model ``name`` with ``overrides`` and capture it; meta records name and overrides."""
    from placement_rl.graph import zoo

    module, inputs = zoo.build(name, **overrides)
    return capture(module, inputs, method=method, name=name,
                   meta={"zoo": name, "zoo_overrides": dict(overrides),
                         "zoo_options": zoo.resolve_options(name, overrides)})
