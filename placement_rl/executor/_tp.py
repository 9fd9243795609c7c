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

Every column GEMM's region up to its row GEMM runs on local shards where ``_tp_region.local_region`` has a rule
for each of its ops (Megatron's way: no DTensor between the column and the row, so the executor runs what the cost model
prices); a fused projection (a QKV whose output is split into equal chunks) would otherwise make DTensor
all-gather before the split and run the heads replicated. Split sizes and view / reshape shapes are divided by the
TP degree along the tracked sharded dimension, and a fused GEMM's output rows are interleaved so that each rank's
contiguous shard holds its heads of every chunk (Megatron's layout); :class:`PartRunner.grads` un-permutes those
rows (``ROW_PERM``). The columns feeding one row GEMM (Llama's separate q / k / v) form one region
(``_tp_region.local_regions``). A replicated operand spanning the heads at their whole size (T5's cross-attention
position bias added to the scores) is cut to the rank's heads (:class:`RankSlice`). A region with an op this rewrite
has no rule for keeps the DTensor path. Each dropout draws from the stream ``_tp_rng`` routes it to (Megatron's
model-parallel RNG tracker): on elements a rank holds alone (a region on local shards or left to DTensor, the
sequence-sharded stream) from the rank's own stream, on replicated ones from the TP group's shared stream.

The step runs under ``implicit_replication`` (forward and backward; plain tensors meeting DTensors -- masks,
targets, the residual stream -- count as replicated; a floating-point one, not a parameter, goes through
:class:`Whole` so that its gradient comes back plain) and its outputs are plain tensors (a DTensor output, e.g. the
loss computed from vocab-sharded logits, is made whole). Parameters tied within a stage (GPT's embedding and LM
head) are tied again after sharding when both shard the same way. Replicated parameters (norms, biases of row GEMMs,
position embeddings) get identical gradients on every TP rank, as in Megatron without sequence parallelism.

Checked before any process starts (``_tp_region.check_program``): every annotated GEMM is an ``aten.linear`` or
``aten.embedding`` (GPT-2's ``Conv1D`` ``addmm`` is refused), every split size is divisible by the TP degree,
a region left to DTensor has nothing DTensor cannot run (``_tp_region.dtensor_blocker``: fused attention on CPU),
and no stage boundary cuts inside a TP region (only replicated tensors cross stages).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import fx, nn

from placement_rl.errors import PlanError
from placement_rl.executor._tp_region import (_COLUMN, _VOCAB, REAL_ROWS, ROW_PERM, LocalSlice, _gemm, _weight,
                                               local_regions)
from placement_rl.executor._tp_rng import local_random_ops, own_streams


def _interleave(w: torch.Tensor, k: int, tp: int) -> torch.Tensor:
    """Row order that puts rank r's rows of each of the ``k`` chunks in its contiguous shard: index [P] with
    ``P = W[perm]``."""
    c = w.shape[0] // k
    return torch.cat([torch.arange(j * c + r * (c // tp), j * c + (r + 1) * (c // tp))
                      for r in range(tp) for j in range(k)])


def pad_vocab(gm: fx.GraphModule, mod: nn.Module, call: fx.Node, kind: str, vocab: tuple[int, int],
              padded: dict[int, nn.Parameter]) -> None:
    """Pad vocab-parallel module ``mod`` (called by ``call``) from ``V`` to ``padded`` rows with zeros (a tied
    table is padded once and shared); after the LM head, add a mask that is ``-inf`` on the padded columns and
    widen the views between the head and the loss that name ``V``."""
    v, vp = vocab
    pid = id(mod.weight)
    if pid not in padded:
        w = mod.weight
        padded[pid] = nn.Parameter(torch.cat([w.data, w.data.new_zeros(vp - v, *w.shape[1:])]),
                                   requires_grad=w.requires_grad)
    mod.weight = padded[pid]
    setattr(mod, REAL_ROWS, v)
    if isinstance(mod, nn.Embedding):
        mod.num_embeddings = vp
        return
    mod.out_features = vp
    if mod.bias is not None:
        mod.bias = nn.Parameter(torch.cat([mod.bias.data, mod.bias.data.new_zeros(vp - v)]))
    mask = torch.zeros(vp, dtype=mod.weight.dtype)
    mask[v:] = float("-inf")
    name = f"{call.target}_vocab_mask"
    gm.register_buffer(name, mask)
    with gm.graph.inserting_after(call):
        ref = gm.graph.get_attr(name)
    with gm.graph.inserting_after(ref):
        masked = gm.graph.call_function(torch.ops.aten.add.Tensor, (call, ref))
    call.replace_all_uses_with(masked, delete_user_cb=lambda u: u is not masked)
    stack, seen = list(masked.users), set()
    while stack:  # views of the logits that spell the vocabulary out: widen them to the padded size
        u = stack.pop()
        if u in seen or u.op != "call_function":
            continue
        seen.add(u)
        t = str(u.target)
        if t.startswith(("aten.view.", "aten._unsafe_view.", "aten.reshape.")) and isinstance(u.args[1], (list, tuple)):
            u.args = (u.args[0], [vp if d == v else d for d in u.args[1]])
            stack.extend(u.users)
        elif t.startswith(("aten.flatten.", "aten.contiguous.", "aten.clone.", "aten.alias.", "aten.to.",
                           "aten._to_copy.")):
            stack.extend(u.users)


class SeqShard(nn.Module):
    """Sequence parallelism across a stage boundary: a whole activation received from the previous stage (which
    made it whole, :class:`TPStage`) as this rank's shard of the sequence (``Shard(1)``: a local slice, no
    communication; its gradient is all-gathered back to a whole one)."""

    def __init__(self, mesh: Any) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, x: torch.Tensor) -> Any:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        whole = DTensor.from_local(x, self.mesh, [Replicate()], run_check=False)
        return whole.redistribute(self.mesh, [Shard(1)])


def whole_or_dtensor_colwise(use_local_output: bool) -> Any:
    """``ColwiseParallel`` for sequence parallelism whose input layout follows the input: a DTensor (the
    sequence-sharded residual stream after a ``SequenceParallel`` norm or a row GEMM) is all-gathered by its own
    placements, a plain tensor is whole (``Replicate``: the first block's input when no vocab-parallel embedding or
    row GEMM precedes it -- a ViT's patches, features), so it is never read as a sequence shard."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    class _Colwise(ColwiseParallel):
        @staticmethod
        def _prepare_input_fn(input_layouts: Any, desired_input_layouts: Any, mod: nn.Module, inputs: Any,
                              device_mesh: Any) -> Any:
            x = inputs[0]
            if not isinstance(x, DTensor):
                return DTensor.from_local(x, device_mesh, (Replicate(),), run_check=False)
            return x if tuple(x.placements) == tuple(desired_input_layouts) else x.redistribute(
                placements=desired_input_layouts, async_op=True)

    return _Colwise(use_local_output=use_local_output)


class RankSlice(nn.Module):
    """This TP rank's contiguous slice of a replicated tensor along ``dim`` (the heads of a per-head position bias a
    local region adds to its scores; rank r holds heads ``[r h / t, (r + 1) h / t)`` of the column's shard): a
    narrow, no communication."""

    def __init__(self, mesh: Any) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        n = x.shape[dim] // int(self.mesh.size())
        return x.narrow(dim, int(self.mesh.get_local_rank()) * n, n)


def local_operands(gm: fx.GraphModule, args: tuple, mesh: Any, made: dict[tuple[fx.Node, int], fx.Node]) -> tuple:
    """``args`` of a local region's op with each :class:`LocalSlice` replaced by a call of :class:`RankSlice` on its
    node, placed right after that node (one per node and dim, shared by the regions reading it: ``made``)."""
    out = []
    for a in args:
        if isinstance(a, LocalSlice):
            if (a.node, a.dim) not in made:
                if not hasattr(gm, "tp_rank_slice"):
                    gm.add_submodule("tp_rank_slice", RankSlice(mesh))
                with gm.graph.inserting_after(a.node):
                    made[(a.node, a.dim)] = gm.graph.call_module("tp_rank_slice", (a.node, a.dim))
            a = made[(a.node, a.dim)]
        out.append(a)
    return tuple(out)


class Whole(nn.Module):
    """A plain (whole) tensor meeting a DTensor as a replicated DTensor (what ``implicit_replication`` would make
    of it) with an autograd boundary: its gradient comes back plain, so the ops that made it never see a DTensor
    gradient (a ViT's patch convolution before the sequence-sharded stream, an MoE's auxiliary loss added to the
    vocab-parallel loss: its gradient reaches the experts' row GEMMs)."""

    def __init__(self, mesh: Any) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, x: torch.Tensor) -> Any:
        from torch.distributed.tensor import DTensor, Replicate

        return x if isinstance(x, DTensor) else DTensor.from_local(x, self.mesh, [Replicate()], run_check=False)


def wrap_plain_operands(gm: fx.GraphModule, sources: Sequence[fx.Node], mesh: Any) -> None:
    """The floating-point plain operands of the ops that also read a DTensor (``sources``: the calls whose output
    is a DTensor, and every op fed by one) go through :class:`Whole`."""
    dt = set(sources)
    wrapped: dict[fx.Node, fx.Node] = {}
    for n in list(gm.graph.nodes):
        if n in dt or n.op != "call_function" or not any(a in dt for a in n.all_input_nodes):
            continue
        dt.add(n)
        for a in n.all_input_nodes:
            val = a.meta.get("val")
            if a in dt or a.op == "get_attr" or not isinstance(val, torch.Tensor) or not val.is_floating_point():
                continue
            if a not in wrapped:
                if not hasattr(gm, "tp_whole"):
                    gm.add_submodule("tp_whole", Whole(mesh))
                with gm.graph.inserting_before(n):
                    wrapped[a] = gm.graph.call_module("tp_whole", (a,))
                wrapped[a].meta = dict(a.meta)
            n.replace_input_with(a, wrapped[a])


class TPStage(nn.Module):
    """A stage module that returns plain tensors; run it (forward and backward) under ``implicit_replication``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        out = self.inner(*args)
        return tuple(plain(x) for x in out) if isinstance(out, tuple) else plain(out)


def plain(x: Any) -> Any:
    """``x`` as a whole plain tensor. A ``Partial("avg")`` DTensor (a mean over the sequence-sharded stream: the
    loss of a model without an LM head under sequence parallelism) first becomes a ``Partial("sum")`` of
    ``local / n``: DTensor's backward of the average gives every rank the whole gradient, not ``1/n`` of it."""
    from torch.distributed.tensor import DTensor, Partial

    if not isinstance(x, DTensor):
        return x
    avg = [i for i, p in enumerate(x.placements) if p.is_partial() and getattr(p, "reduce_op", "") == "avg"]
    if avg:
        n = 1
        for i in avg:
            n *= x.device_mesh.size(i)
        placements = [Partial("sum") if i in avg else p for i, p in enumerate(x.placements)]
        x = DTensor.from_local(x.to_local() / n, x.device_mesh, placements, run_check=False)
    return x.full_tensor()


def apply_tp(gm: fx.GraphModule, kinds: Mapping[str, str], tp_mesh: Any,
             names: Mapping[int, str], vocab: tuple[int, int] | None = None, seq_norms: frozenset[str] | None = None,
             seq_values: frozenset[str] | None = None) -> tuple[nn.Module, dict[str, tuple[nn.Module, str]]]:
    """Parallelize stage ``gm`` over ``tp_mesh`` (see the module docstring).

    ``vocab = (V, padded)``: the vocab-parallel embedding table and LM head get ``padded - V`` zero rows
    (:func:`pad_vocab`), the logits' padded columns are masked to ``-inf`` before the loss, so the loss and the
    real rows' gradients are those of the unpadded model (Megatron-LM's padded vocabulary).

    ``seq_norms``: sequence parallelism (Megatron-SP): the residual stream between TP regions stays a DTensor
    sharded on the sequence (dim 1); these ``aten.layer_norm`` nodes become ``nn.LayerNorm`` under
    ``SequenceParallel``, columns and the LM head all-gather their input when it arrives sequence-sharded (a plain
    input is whole: :func:`whole_or_dtensor_colwise`), rows and the vocab-parallel embedding reduce-scatter their
    output (``output_layouts=Shard(1)``). ``seq_values``: the values
    sequence parallelism keeps sharded along the sequence; a stage input among them (a later pipeline stage: the
    previous stage sent it whole) becomes this rank's sequence shard (:class:`SeqShard`) before its first use.

    ``names``: ``id(parameter) -> original name`` before sharding. Returns the wrapped stage and, for every
    parameter it holds, original name -> (module, attribute) holding it (read it after FSDP wraps the stage).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    plan: dict[str, Any] = {}
    made: list[tuple[str, nn.Module, str, list[int]]] = []  # (path, module, kind, ids of its original params)
    tp = int(tp_mesh.size())
    padded: dict[int, nn.Parameter] = {}  # id of a vocab table -> its padded copy (one per tied parameter)
    local = local_regions(gm, kinds, tp)
    slices: dict[tuple[fx.Node, int], fx.Node] = {}
    for rewrites, _ in local.values():  # local shapes and split sizes (args read the columns' calls once made)
        for m, args in rewrites.items():
            m.args = local_operands(gm, args, tp_mesh, slices)
    own_streams(gm, local_random_ops(gm, kinds, local), int(tp_mesh.get_local_rank()), tp)
    seq = seq_norms or frozenset()
    dtensors: list[fx.Node] = []  # the calls whose output is a DTensor
    entering = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name in (seq_values or ())]
    if entering:  # pipeline stage > 0 with sequence parallelism: the residual stream it receives, sharded again
        gm.add_submodule("tp_seq_in", SeqShard(tp_mesh))
        last = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
        for n in reversed(entering):
            with gm.graph.inserting_after(last):
                call = gm.graph.call_module("tp_seq_in", (n,))
            call.meta = dict(n.meta)
            n.replace_all_uses_with(call, delete_user_cb=lambda u, c=call: u is not c)
            dtensors.append(call)
    for n in list(gm.graph.nodes):
        kind = kinds.get(n.name)
        if n.name in seq and n.op == "call_function" and "layer_norm" in str(n.target):
            kind = "seq_norm"
        if kind not in ("column", "row", "vocab_head", "vocab_embedding", "seq_norm") or n.op != "call_function":
            continue
        op = "layer_norm" if kind == "seq_norm" else _gemm(n)
        if op == "layer_norm":
            w = _weight(gm, n, 2) if len(n.args) > 2 and n.args[2] is not None else None
            b = _weight(gm, n, 3) if len(n.args) > 3 and n.args[3] is not None else None
            mod = nn.LayerNorm.__new__(nn.LayerNorm)
            nn.Module.__init__(mod)
            mod.normalized_shape = tuple(n.args[1])
            mod.eps = float(n.args[4]) if len(n.args) > 4 else 1e-5
            mod.elementwise_affine, mod.weight, mod.bias = w is not None, (w[1] if w else None), (b[1] if b else None)
            ids = ([id(w[1])] if w else []) + ([id(b[1])] if b else [])
            x = n.args[0]
        elif op == "linear":
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
        gm.meta.setdefault("tp_renamed", {})[n.name] = call.name  # read by ``_recompute`` (its regions' names)
        if vocab is not None and vocab[1] > vocab[0] and kind in _VOCAB and int(mod.weight.shape[0]) == vocab[0]:
            pad_vocab(gm, mod, call, kind, vocab, padded)
        if n.name in local:  # a column GEMM whose region runs on local shards (a fused one: rows interleaved)
            k = local[n.name][1]
            if k > 1:
                perm = _interleave(mod.weight, k, tp)
                with torch.no_grad():
                    mod.weight.data = mod.weight.data[perm].clone()
                    if mod.bias is not None:
                        mod.bias.data = mod.bias.data[perm].clone()
                setattr(mod, ROW_PERM, perm)
            plan[path] = whole_or_dtensor_colwise(True) if seq else ColwiseParallel(use_local_output=True)
        elif kind == "seq_norm":
            plan[path] = SequenceParallel(use_local_output=False)
        elif kind in _COLUMN:
            plan[path] = whole_or_dtensor_colwise(False) if seq else ColwiseParallel(use_local_output=False)
        elif kind == "row":
            plan[path] = (RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False)
                          if seq else RowwiseParallel(input_layouts=Shard(-1)))
        else:
            plan[path] = (RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
                          if seq else RowwiseParallel(input_layouts=Replicate()))
        made.append((path, mod, kind, ids))
        if kind in _COLUMN and n.name not in local or seq and kind in ("row", "vocab_embedding", "seq_norm"):
            dtensors.append(call)
    wrap_plain_operands(gm, dtensors, tp_mesh)
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
    replaced = {id(p) for ps in before.values() for p in ps} | {pid for *_, ids in made for pid in ids}
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
        if g is not None and hasattr(g, "placements") and not hasattr(p, "placements"):
            p.grad = g.full_tensor()  # a plain parameter reached by a DTensor (sequence parallelism's position table)
        elif g is not None and hasattr(g, "placements") and hasattr(p, "placements") \
                and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)
