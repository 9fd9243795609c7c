"""Tensor parallelism for the stages of a deployed plan: ``parallelize_module`` on the exported program's GEMMs.

The graph's TP annotation (``placement_rl.graph.tp``, the one the cost model prices) names, per exported node,
how it splits. :func:`apply_tp` turns each annotated ``aten.linear`` / ``aten.embedding`` node of a stage's
``fx.GraphModule`` into a call of a real ``nn.Linear`` / ``nn.Embedding`` submodule holding the same
parameters, then calls ``torch.distributed.tensor.parallel.parallelize_module`` over the ``tp`` mesh
dimension with the Megatron styles:

* column-parallel GEMM and LM head: ``ColwiseParallel(use_local_output=False)`` -- weight ``Shard(0)``, the
  output stays a DTensor sharded on its last dimension, so the per-head ops that follow (the exported program's
  views carry *global* shapes) run on DTensors with global semantics;
* row-parallel GEMM: ``RowwiseParallel(input_layouts=Shard(-1))`` -- weight ``Shard(1)``, output all-reduced
  into a plain replicated tensor (Megatron's ``g``);
* vocab-parallel embedding: ``RowwiseParallel(input_layouts=Replicate())`` on the embedding -- table
  ``Shard(0)``, masked lookup, output all-reduced.

The step runs under ``implicit_replication`` (forward and backward; plain tensors meeting DTensors -- masks, targets, the residual
stream -- count as replicated) and its outputs are plain tensors (a DTensor output, e.g. the loss computed from
vocab-sharded logits, is made whole). Parameters tied within a stage (GPT's embedding and LM head) are tied
again after sharding when both shard the same way. Replicated parameters (norms, biases of row GEMMs, position
embeddings) get identical gradients on every TP rank, as in Megatron without sequence parallelism.

Checked before any process starts (:func:`check_program`): every annotated GEMM is an ``aten.linear`` or
``aten.embedding`` (GPT-2's ``Conv1D`` ``addmm`` is refused), every split size is divisible by the TP degree,
and no stage boundary cuts inside a TP region (only replicated tensors cross stages).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import fx, nn

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph

_COLUMN = ("column", "vocab_head")
_SHARDED_OUT = ("column", "sharded", "vocab_head")


def node_kinds(graph: CompGraph) -> dict[str, str]:
    """Exported node name -> TP kind (``column``, ``row``, ``sharded``, ``vocab_*``) of the graph's annotation."""
    data = graph.meta.get("tp")
    if not isinstance(data, Mapping):
        raise PlanError(f"graph '{graph.name}' carries no TP annotation (meta['tp']): capture it again")
    return {str(k): str(v) for k, v in dict(data.get("nodes", {})).items()}


def _weight(gm: fx.GraphModule, node: fx.Node, arg: int) -> tuple[str, nn.Parameter] | None:
    a = node.args[arg] if len(node.args) > arg else None
    if not isinstance(a, fx.Node) or a.op != "get_attr":
        return None
    obj: Any = gm
    for part in str(a.target).split("."):
        obj = getattr(obj, part)
    return str(a.target), obj


def _gemm(node: fx.Node) -> str | None:
    name = getattr(node.target, "__name__", str(node.target))
    if "linear" in name:
        return "linear"
    if "embedding" in name:
        return "embedding"
    return None


def check_program(gm: fx.GraphModule, kinds: Mapping[str, str], tp: int,
                  stage_map: Mapping[str, int] | None = None) -> None:
    """``PlanError`` (one line) when ``gm``'s annotated ops cannot run at TP degree ``tp``."""
    if tp == 1:
        return
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, kind in kinds.items():
        n = nodes.get(name)
        if n is None or kind not in ("column", "row", "vocab_head", "vocab_embedding"):
            continue
        op = _gemm(n)
        w = _weight(gm, n, 0 if op == "embedding" else 1)
        if op is None or w is None:
            raise PlanError(f"TP needs '{name}' ({kind}) to be an nn.Linear / nn.Embedding call on a parameter, "
                            f"found {n.target}; GPT-2's Conv1D (addmm) layers cannot be split by the executor")
        size = w[1].shape[1] if kind == "row" else w[1].shape[0]
        if size % tp:
            raise PlanError(f"TP degree {tp} does not divide the {'input' if kind == 'row' else 'output'} size "
                            f"{size} of '{w[0]}' ({kind}); choose a TP degree dividing it")
    if stage_map:
        for n in gm.graph.nodes:
            if kinds.get(n.name) in _SHARDED_OUT and n.name in stage_map:
                for u in n.users:
                    if u.name in stage_map and stage_map[u.name] != stage_map[n.name]:
                        raise PlanError(f"the cut between stages {stage_map[n.name]} and {stage_map[u.name]} passes "
                                        f"the TP-sharded tensor '{n.name}'; move the cut outside the TP region "
                                        "(before a column-parallel or after a row-parallel GEMM)")


class TPStage(nn.Module):
    """A stage module that returns plain tensors; run it (forward and backward) under ``implicit_replication``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        from torch.distributed.tensor import DTensor

        out = self.inner(*args)

        def plain(x: Any) -> Any:
            return x.full_tensor() if isinstance(x, DTensor) else x

        return tuple(plain(x) for x in out) if isinstance(out, tuple) else plain(out)


def apply_tp(gm: fx.GraphModule, kinds: Mapping[str, str], tp_mesh: Any,
             names: Mapping[int, str]) -> tuple[nn.Module, dict[str, tuple[nn.Module, str]]]:
    """Parallelize stage ``gm`` over ``tp_mesh`` (see the module docstring).

    ``names``: ``id(parameter) -> original name`` before sharding. Returns the wrapped stage and, for every
    parameter it holds, original name -> (module, attribute) holding it (read it after FSDP wraps the stage).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan: dict[str, Any] = {}
    made: list[tuple[str, nn.Module, str, list[int]]] = []  # (path, module, kind, ids of its original params)
    for n in list(gm.graph.nodes):
        kind = kinds.get(n.name)
        if kind not in ("column", "row", "vocab_head", "vocab_embedding") or n.op != "call_function":
            continue
        op = _gemm(n)
        if op == "linear":
            w = _weight(gm, n, 1)
            b = _weight(gm, n, 2) if len(n.args) > 2 and n.args[2] is not None else None
            mod = nn.Linear.__new__(nn.Linear)
            nn.Module.__init__(mod)
            mod.in_features, mod.out_features = int(w[1].shape[1]), int(w[1].shape[0])
            mod.weight, mod.bias = w[1], (b[1] if b is not None else None)
            ids = [id(w[1])] + ([id(b[1])] if b is not None else [])
            x = n.args[0]
        elif op == "embedding":
            w = _weight(gm, n, 0)
            mod = nn.Embedding.__new__(nn.Embedding)
            nn.Module.__init__(mod)
            mod.num_embeddings, mod.embedding_dim = int(w[1].shape[0]), int(w[1].shape[1])
            mod.padding_idx, mod.max_norm, mod.norm_type, mod.scale_grad_by_freq, mod.sparse = None, None, 2.0, \
                False, False
            mod.weight = w[1]
            ids = [id(w[1])]
            x = n.args[1]
        else:
            continue
        path = f"tp_{n.name}"
        gm.add_submodule(path, mod)
        with gm.graph.inserting_before(n):
            call = gm.graph.call_module(path, (x,))
        call.meta = dict(n.meta)
        n.replace_all_uses_with(call)
        gm.graph.erase_node(n)
        if kind in _COLUMN:
            plan[path] = ColwiseParallel(use_local_output=False)
        elif kind == "row":
            plan[path] = RowwiseParallel(input_layouts=Shard(-1))
        else:
            plan[path] = RowwiseParallel(input_layouts=Replicate())
        made.append((path, mod, kind, ids))
    for n in list(gm.graph.nodes):  # export's dtype / shape asserts have no DTensor rule and produce nothing
        if n.op == "call_function" and "_assert_tensor_metadata" in str(n.target) and not n.users:
            gm.graph.erase_node(n)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    before = {path: [mod._parameters[a] for a in ("weight", "bias") if mod._parameters.get(a) is not None]
              for path, mod, _, _ in made}
    parallelize_module(gm, tp_mesh, plan)
    # re-tie parameters shared by several split modules of this stage when they shard alike
    first: dict[int, tuple[nn.Module, str]] = {}
    for path, mod, _, ids in made:
        for attr, pid in zip(("weight", "bias"), ids):
            new = mod._parameters.get(attr)
            if pid in first:
                m0, a0 = first[pid]
                old = m0._parameters[a0]
                if getattr(old, "placements", None) != getattr(new, "placements", None):
                    raise PlanError(f"parameter '{names.get(pid, '?')}' is tied between TP modules that shard it "
                                    "differently; untie it or keep one of its users replicated")
                mod._parameters[attr] = old
            else:
                first[pid] = (mod, attr)
    out: dict[str, tuple[nn.Module, str]] = {}
    replaced = {id(p) for ps in before.values() for p in ps}
    for mod in gm.modules():
        for attr, p in mod._parameters.items():
            if p is None or id(p) in replaced:
                continue
            out.setdefault(names.get(id(p), ""), (mod, attr))
    for path, mod, _, ids in made:
        for attr, pid in zip(("weight", "bias"), ids):
            if names.get(pid):
                out[names[pid]] = (mod, attr)
    out.pop("", None)
    # the attributes that held the split parameters are no longer read: drop them (no stale copy to shard)
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for path, holder in list(gm.named_modules()):
        if path.startswith("tp_"):
            continue
        for attr, p in list(holder._parameters.items()):
            full = f"{path}.{attr}" if path else attr
            if p is not None and id(p) in replaced and full not in used:
                del holder._parameters[attr]
    return TPStage(gm), out


@torch.no_grad()
def normalize_grads(params: Sequence[nn.Parameter]) -> None:
    """Give every DTensor gradient its parameter's placements (a vocab-parallel embedding's gradient comes back
    partial or replicated), so that local shards line up for the DP / tied-parameter all-reduces and Adam."""
    for p in params:
        g = p.grad
        if g is not None and hasattr(g, "placements") and hasattr(p, "placements") \
                and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)
