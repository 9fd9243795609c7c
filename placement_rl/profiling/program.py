"""The exported program of a module, run node by node with real tensors (shared by profiler and executor).

``export_program`` calls ``torch.export.export(module, inputs, strict=False)`` exactly as
``placement_rl.graph.capture`` does, so the program's ``call_function`` node names are the CompGraph's
node names. ``Program.flat_values`` lists the tensors fed to the program's placeholders (parameters,
buffers and constants of the *given* module, then the flattened user inputs), so gradients reach the
module's own parameters. ``record`` runs the program once and keeps every node's concrete inputs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import fx
from torch.utils import _pytree as pytree

from placement_rl.errors import GraphError
from placement_rl.graph._capture_engine import DTYPE_NAMES
from placement_rl.graph.ir import CompGraph


@dataclass(frozen=True)
class Slot:
    """One placeholder of the program: ``kind`` is parameter, buffer, constant or input."""

    node: str
    kind: str
    target: str  # state-dict key (parameters/buffers/constants) or "" for user inputs
    index: int  # position among the flattened user inputs (-1 for the others)


@dataclass(frozen=True, eq=False)
class Program:
    exported: Any  # torch.export.ExportedProgram
    graph_module: fx.GraphModule
    slots: tuple[Slot, ...]
    loss_index: int  # position of the scalar loss among the program's outputs

    @property
    def call_nodes(self) -> list[fx.Node]:
        return [n for n in self.graph_module.graph.nodes if n.op == "call_function"]

    def flat_values(self, module: torch.nn.Module, inputs: Sequence[Any]) -> list[Any]:
        """Placeholder values: the module's own parameters/buffers and the flattened inputs."""
        flat_inputs = pytree.tree_leaves(tuple(inputs))
        out: list[Any] = []
        for s in self.slots:
            if s.kind == "parameter":
                out.append(module.get_parameter(s.target))
            elif s.kind == "buffer":
                out.append(module.get_buffer(s.target))
            elif s.kind == "constant":
                out.append(self.exported.constants[s.target])
            else:
                out.append(flat_inputs[s.index])
        return out

    def check_graph(self, graph: CompGraph) -> dict[str, str]:
        """Map every original node name the graph stands for to itself; a name the program lacks is an error."""
        have = {n.name for n in self.call_nodes}
        names = [m for grp in graph.members for m in grp] if graph.members is not None else list(graph.names)
        missing = [m for m in names if m not in have]
        if missing:
            raise GraphError(f"graph '{graph.name}' node '{missing[0]}' is not an op of this module's exported "
                             f"program ({len(missing)} missing): capture the graph from the same module and inputs")
        return {m: m for m in names}


def export_program(module: torch.nn.Module, inputs: Sequence[Any]) -> Program:
    """Export ``module`` on ``inputs`` (non-strict, training IR) and describe its placeholders."""
    from torch.export.graph_signature import InputKind, OutputKind

    try:
        ep = torch.export.export(module, tuple(inputs), strict=False)
    except Exception as exc:  # torch raises many types; the user must change the model or inputs
        raise GraphError(f"torch.export failed on {type(module).__name__}: {str(exc).splitlines()[0]}") from None
    kinds = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer", InputKind.CONSTANT_TENSOR: "constant",
             InputKind.USER_INPUT: "input"}
    slots, k = [], 0
    for spec in ep.graph_signature.input_specs:
        kind = kinds.get(spec.kind)
        if kind is None:
            raise GraphError(f"exported program input '{spec.arg.name}' has unsupported kind {spec.kind}")
        slots.append(Slot(node=spec.arg.name, kind=kind, target=spec.target or "", index=k if kind == "input" else -1))
        k += kind == "input"
    user_out = [i for i, s in enumerate(ep.graph_signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    if len(user_out) != 1:
        raise GraphError(f"{type(module).__name__}.forward must return one scalar loss, got {len(user_out)} outputs")
    from placement_rl.graph.hop import flatten_wrappers  # grad-mode / autocast regions inlined, as capture does

    return Program(exported=ep, graph_module=flatten_wrappers(ep.graph_module), slots=tuple(slots),
                   loss_index=user_out[0])


def is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def needs_grad(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


def transfer(x: Any, device: torch.device) -> Any:
    """The copy the executor inserts on a cross-device edge (``Tensor.to``; other values pass through)."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    return pytree.tree_map(lambda t: t.to(device) if is_tensor(t) else t, x)


def retarget(kwargs: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """kwargs of a factory op (``device=...``) sent to ``device``; other kwargs unchanged."""
    out = dict(kwargs)
    if "device" in out and out["device"] is not None:
        out["device"] = device
    return out


def mutated_args(node: fx.Node) -> list[int]:
    """Positional arguments an op writes to in place (from its schema), e.g. BN running stats, ``add_``'s self."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


@dataclass(frozen=True, eq=False)
class Record:
    """One node of a reference run: concrete inputs (tensors detached, ``requires_grad`` kept) and output."""

    node: str
    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any

    @property
    def signature(self) -> str:
        """``op[shapes]`` of the tensor inputs, then ``:`` and the floating dtypes other than fp32 among the inputs
        and outputs where there are any (``aten.mm.default[(8, 32), (32, 64)]:bf16``): another precision's op is
        another op, an fp32 op's signature has no suffix."""
        inputs = [x for x in pytree.tree_leaves((self.args, self.kwargs)) if is_tensor(x)]
        shapes = [tuple(x.shape) for x in inputs]
        return f"{op_name(self.target)}{shapes}{precision_suffix(inputs + pytree.tree_leaves(self.output))}"


def precision_suffix(values: Sequence[Any]) -> str:
    """``:bf16`` (``:bf16+fp16`` for several, sorted) for the floating tensors among ``values`` that are not fp32,
    named as the graph meta names them; ``""`` where there are none."""
    names = {DTYPE_NAMES.get(x.dtype, str(x.dtype).removeprefix("torch.")) for x in values
             if is_tensor(x) and x.is_floating_point() and x.dtype != torch.float32}
    return ":" + "+".join(sorted(names)) if names else ""


def op_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(getattr(target, "__name__", target)) if not hasattr(target, "_schema") else str(target)


def record(program: Program, values: Sequence[Any], *, device: torch.device | None = None) -> dict[str, Record]:
    """Run the program once (autograd on) and keep each call_function node's inputs and output.

    ``values`` are the placeholder values; factory ops are sent to ``device`` when given.
    """
    env: dict[str, Any] = {}
    out: dict[str, Record] = {}
    ph = iter(values)
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = next(ph)
        elif node.op == "call_function":
            args = fx.node.map_arg(node.args, lambda n: env[n.name])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n.name])
            if device is not None:
                kwargs = retarget(kwargs, device)
            env[node.name] = node.target(*args, **kwargs)
            out[node.name] = Record(node=node.name, target=node.target, args=tuple(args), kwargs=dict(kwargs),
                                    output=env[node.name])
        elif node.op == "get_attr":
            env[node.name] = getattr(program.graph_module, node.target)
    return out
