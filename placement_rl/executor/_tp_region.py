"""What tensor parallelism may shard in a stage's exported program: the graph's TP node kinds, the check run
before any process starts (:func:`check_program`) and the local regions (:func:`local_region`: the ops from a
column GEMM to its row GEMM that run on local shards, with split sizes and view shapes divided by the TP degree).
``executor._tp`` applies them."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import torch
from torch import fx, nn

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph

_COLUMN = ("column", "vocab_head")
_SHARDED_OUT = ("column", "sharded", "vocab_head")
ROW_PERM = "_tp_row_perm"  # attribute of a column nn.Linear whose output rows were interleaved (fused chunks)
REAL_ROWS = "_tp_real_rows"  # attribute of a vocab-parallel module whose table was padded: the real vocabulary
_VOCAB = ("vocab_head", "vocab_embedding")
_PASS = ("aten.dropout.", "aten.gelu.", "aten.relu.", "aten.silu.", "aten.tanh.", "aten.sigmoid.", "aten.alias.",
         "aten.clone.", "aten.contiguous.", "aten.mul.", "aten.div.", "aten.add.", "aten.sub.", "aten.masked_fill.",
         "aten.where.", "aten.neg.", "aten.exp.", "aten.pow.")  # element-wise: the sharded dim stays put


def node_kinds(graph: CompGraph) -> dict[str, str]:
    """Exported node name -> TP kind (``column``, ``row``, ``sharded``, ``vocab_*``) of the graph's annotation.
    Every other lookup of the vocab-parallel table (``meta["tied"]``: an encoder-decoder's word table shared by
    the encoder and the decoder, as T5's) is vocab-parallel too: one table cannot be both split and whole."""
    data = graph.meta.get("tp")
    if not isinstance(data, Mapping):
        raise PlanError(f"graph '{graph.name}' carries no TP annotation (meta['tp']): capture it again")
    kinds = {str(k): str(v) for k, v in dict(data.get("nodes", {})).items()}
    for tie in graph.meta.get("tied") or ():
        users = [str(x) for x in (tie.get("nodes") or ())] if isinstance(tie, Mapping) else []
        if any(kinds.get(u) == "vocab_embedding" for u in users):
            for u in users:
                if u in graph.index and u not in kinds and graph.op_types[graph.index[u]] == "embedding":
                    kinds[u] = "vocab_embedding"
    return kinds


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
                  stage_map: Mapping[str, int] | None = None, vocab: tuple[int, int] | None = None) -> None:
    """``PlanError`` (one line) when ``gm``'s annotated ops cannot run at TP degree ``tp`` (``vocab``: the
    vocabulary and its padded size, when the plan pads it: the vocab-parallel tables are checked padded), or a TP
    region that cannot run on local shards cannot run on DTensors either (:func:`dtensor_blocker`)."""
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
        if vocab is not None and kind in _VOCAB and size == vocab[0]:
            size = vocab[1]
        if size % tp:
            raise PlanError(f"TP degree {tp} does not divide the {'input' if kind == 'row' else 'output'} size "
                            f"{size} of '{w[0]}' ({kind}); choose a TP degree dividing it")
    local = local_regions(gm, kinds, tp)
    for cols in column_groups(gm, kinds):
        why = None if cols[0].name in local else dtensor_blocker(gm, cols, kinds, tp)
        if why:
            raise PlanError(why)
    if stage_map:
        for n in gm.graph.nodes:
            if kinds.get(n.name) in _SHARDED_OUT and n.name in stage_map:
                for u in n.users:
                    if u.name in stage_map and stage_map[u.name] != stage_map[n.name]:
                        raise PlanError(f"the cut between stages {stage_map[n.name]} and {stage_map[u.name]} passes "
                                        f"the TP-sharded tensor '{n.name}'; move the cut outside the TP region "
                                        "(before a column-parallel or after a row-parallel GEMM)")


def _shape(x: Any) -> tuple[int, ...] | None:
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    return tuple(int(d) for d in v.shape) if hasattr(v, "shape") else None


def _regroup(s_in: tuple[int, ...], d: int, s_out: tuple[int, ...], tp: int) -> int | None:
    """The output dim of a view from ``s_in`` (sharded on ``d``) to ``s_out`` that carries the shard: the first
    output dim after the same leading elements; the shard must be the outermost of its (un)merged group."""
    lead, acc = 1, 1
    for x in s_in[:d]:
        lead *= x
    for j, x in enumerate(s_out):
        if acc == lead:
            return j if x % tp == 0 and (x <= s_in[d] and s_in[d] % x == 0 or x % s_in[d] == 0) else None
        acc *= x
    return None


def _fused_view(s_in: tuple[int, ...], d: int, s_out: tuple[int, ...], tp: int) -> tuple[int, int] | None:
    """``(j, k)`` when a view splits the fused output dim ``d`` (the last) into ``(k, heads, ...)`` with ``k`` chunks
    (timm / ViT: ``reshape(b, t, 3, h, dh)``) and ``tp`` divides ``heads``: with the rows interleaved (each rank's
    share of every chunk contiguous) the shard is then output dim ``j + 1``; else None."""
    lead = 1
    for x in s_in[:d]:
        lead *= x
    acc = 1
    for j, x in enumerate(s_out[:-1]):
        if acc == lead:
            h = s_out[j + 1]
            ok = d == len(s_in) - 1 and x > 1 and s_in[d] % x == 0 and h % tp == 0 and (s_in[d] // x) % h == 0
            return (j, x) if ok else None
        acc *= x
    return None


_LISTS = ("aten.split.Tensor", "aten.split_with_sizes", "aten.chunk.", "aten.unbind.")  # values: lists of tensors
_SDPA = "aten.scaled_dot_product_attention."


def _split(n: fx.Node, x: fx.Node, sx: tuple[int, ...], d: int, col: fx.Node | None, tp: int
           ) -> tuple[tuple | None, int] | None:
    """A split / chunk of ``x`` (sharded on ``d``): ``(new args or None, k)`` -- on another dim nothing changes
    (``k = 0``); on ``d`` only the column's own output may be cut, into ``k`` equal chunks each ``tp`` divides
    (sizes divided by ``tp``; a chunk count stays); None otherwise."""
    chunk = str(n.target).startswith("aten.chunk.")
    dim = int(n.args[2] if len(n.args) > 2 else 0) % len(sx)
    if dim != d:
        return None, 0
    if chunk:
        sizes = [sx[dim] // int(n.args[1])] * int(n.args[1]) if sx[dim] % int(n.args[1]) == 0 else []
    else:
        sizes = [n.args[1]] * (sx[dim] // n.args[1]) if isinstance(n.args[1], int) else list(n.args[1])
    if x is not col or not sizes or len(set(sizes)) != 1 or sum(sizes) != sx[dim] or sizes[0] % tp:
        return None
    k, size = len(sizes), sizes[0] // tp
    if chunk:
        return None, k
    return (x, size if isinstance(n.args[1], int) else [size] * k, *n.args[2:]), k


def _view(n: fx.Node, x: fx.Node, sx: tuple[int, ...], d: int, shp: tuple[int, ...], col: fx.Node | None,
          tp: int) -> tuple[tuple, int, int] | None:
    """A view / reshape of ``x`` (sharded on ``d``): ``(new args, sharded output dim, k)``, ``k > 0`` when it cuts
    the column's fused output into ``k`` chunks (:func:`_fused_view`); None when the shard cannot follow."""
    if not isinstance(n.args[1], (list, tuple)) or any(not isinstance(v, int) or v < -1 for v in n.args[1]):
        return None
    j, k = _regroup(sx, d, shp, tp), 0
    if j is None and x is col:
        fused = _fused_view(sx, d, shp, tp)
        if fused is None:
            return None
        j, k = fused[0] + 1, fused[1]
    if j is None:
        return None
    target = list(n.args[1])
    target[j] //= 1 if target[j] == -1 else tp  # a -1 infers the local size
    return (x, target), j, k


def _unflatten(n: fx.Node, sx: tuple[int, ...], d: int, shp: tuple[int, ...], tp: int) -> tuple[tuple, int] | None:
    """``unflatten(x, dim, sizes)`` of ``x`` (sharded on ``d``): ``(new args, sharded output dim)``; on ``d`` the
    shard is the outermost of ``sizes`` (divided by ``tp`` unless -1), as for a view (:func:`_regroup`)."""
    dim, sizes = int(n.args[1]) % len(sx), list(n.args[2])
    if dim != d:
        return n.args, d + (len(sizes) - 1 if d > dim else 0)
    j = _regroup(sx, d, shp, tp)
    if j is None or not dim <= j < dim + len(sizes):
        return None
    sizes[j - dim] //= 1 if sizes[j - dim] == -1 else tp
    return (n.args[0], n.args[1], sizes), j


def _sdpa(n: fx.Node, sdim: Mapping[fx.Node, int], shp: tuple[int, ...]) -> int | None:
    """Fused attention (``scaled_dot_product_attention``) runs per head: its sharded output dim when q, k and v
    are sharded on the same head dim and a mask does not span it (e.g. ``[b, 1, s, s]``), else None."""
    q, k, v = n.args[:3]
    mask = n.args[3] if len(n.args) > 3 else n.kwargs.get("attn_mask")
    if any(a not in sdim for a in (q, k, v)):
        return None
    rel = {sdim[a] - len(_shape(a) or ()) for a in (q, k, v)}
    if len(rel) != 1 or min(rel) > -3:
        return None
    d = rel.pop()
    if isinstance(mask, fx.Node):
        sm = _shape(mask)
        if mask in sdim or sm is None or (len(sm) >= -d and sm[d] != 1):
            return None
    return len(shp) + d


def _moved(n: fx.Node, t: str, sx: tuple[int, ...], d: int) -> int | None:
    """Where the sharded dim ``d`` of a transpose / permute / unbind / select's input ends up (None: it is
    removed, the op has no rule)."""
    if t.startswith("aten.transpose.int"):
        a, b = (int(v) % len(sx) for v in n.args[1:3])
        return b if d == a else a if d == b else d
    if t.startswith("aten.permute."):
        return [int(v) % len(sx) for v in n.args[1]].index(d)
    if t.startswith("aten.unsqueeze."):
        return d + (int(n.args[1]) % (len(sx) + 1) <= d)
    if t.startswith("aten.slice.Tensor"):  # along another dim only
        return None if int(n.args[1] if len(n.args) > 1 else 0) % len(sx) == d else d
    dim = int(n.args[1] if len(n.args) > 1 else 0) % len(sx)  # unbind / select: that dim disappears
    return None if dim == d else d - (dim < d)


def _cat(n: fx.Node, sdim: Mapping[fx.Node, int], shp: tuple[int, ...] | None) -> tuple[int, tuple, int] | None:
    """Concatenation of tensors all sharded on the same dim, along another one (RoPE's ``rotate_half``); empty
    operands (T5's cross-attention cache before its first step: ``(0,)``) are dropped."""
    parts = n.args[0]
    if shp is None or not isinstance(parts, (list, tuple)):
        return None
    parts = [a for a in parts if a in sdim or _shape(a) != (0,)]
    if not parts or any(a not in sdim for a in parts):
        return None
    rel = {sdim[a] - len(_shape(a) or ()) for a in parts}
    dim = int(n.args[1] if len(n.args) > 1 else 0) % len(shp)
    if len(rel) != 1 or len(shp) + min(rel) == dim:
        return None
    return len(shp) + rel.pop(), (parts, *n.args[1:]), 0


class LocalSlice(NamedTuple):
    """An operand of a local region's op that is replicated but spans the sharded dim at its whole size (T5's
    cross-attention position bias ``(1, heads, q, k)`` added to the scores): each rank reads its own slice along
    ``dim`` (``executor._tp.local_operands`` inserts the call that cuts it; no communication)."""

    node: fx.Node
    dim: int


def _elementwise(n: fx.Node, ins: list[fx.Node], sdim: Mapping[fx.Node, int], shp: tuple[int, ...], tp: int,
                 needs_grad: set[fx.Node]) -> tuple[int, tuple | None] | None:
    """Element-wise op: ``(sharded output dim, new args or None)``. The sharded dim stays put when every sharded
    operand agrees; a replicated operand spanning it is cut to the rank's slice (:class:`LocalSlice`) when the
    shard is on a head dim (not the last: a fused column's output features may be interleaved), the operand spans
    all of it and needs no gradient (computed from neither a parameter nor a floating-point input: a slice would
    give each rank its heads' share of the gradient only); else the op has no rule."""
    s0 = _shape(ins[0])
    d = sdim[ins[0]] - len(s0)
    args, cut = list(n.args), False
    for i, a in enumerate(n.args):
        sa = _shape(a)
        if isinstance(a, fx.Node) and a not in sdim and sa is not None and len(sa) >= -d and sa[d] != 1:
            if d == -1 or sa[d] != s0[d] or s0[d] % tp or a in needs_grad:
                return None  # a replicated operand spans the sharded dim
            args[i], cut = LocalSlice(a, len(sa) + d), True
        if isinstance(a, fx.Node) and a in sdim and sdim[a] - len(sa) != d:
            return None
    return None if len(shp) < -d else (len(shp) + d, tuple(args) if cut else None)


def grad_sources(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes of ``gm`` computed from a trainable parameter or a floating-point input (a gradient may flow
    into them)."""
    out: set[fx.Node] = set()
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if n.op == "placeholder" and isinstance(val, torch.Tensor) and val.is_floating_point():
            out.add(n)
        elif n.op == "get_attr":
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, nn.Parameter) and obj.requires_grad:
                out.add(n)
        elif any(a in out for a in n.all_input_nodes):
            out.add(n)
    return out


def _step(n: fx.Node, col: fx.Node | None, sdim: Mapping[fx.Node, int], ins: list[fx.Node], tp: int,
          needs_grad: set[fx.Node]) -> tuple[int, tuple | None, int] | None:
    """One op of a column's region: ``(its sharded output dim, its new args or None, k of a fused cut or 0)``,
    None when the op has no rule (then the region keeps the DTensor path)."""
    t = str(n.target)
    x, shp = n.args[0], _shape(n)
    if t.startswith("aten.cat."):
        return _cat(n, sdim, shp)
    sx = _shape(x)
    if sx is None or (shp is None and not t.startswith(_LISTS)):
        return None
    d = sdim.get(x)
    if t.startswith(("aten.split.Tensor", "aten.split_with_sizes", "aten.chunk.")):
        got = _split(n, x, sx, d, col, tp) if d is not None else None
        return None if got is None else (d, got[0], got[1])
    if t.startswith(("aten.view.", "aten._unsafe_view.", "aten.reshape.")):
        got = _view(n, x, sx, d, shp, col, tp) if d is not None else None
        return None if got is None else (got[1], got[0], got[2])
    if t.startswith("aten.unflatten.int"):
        got = _unflatten(n, sx, d, shp, tp) if d is not None else None
        return None if got is None else (got[1], got[0], 0)
    if t.startswith("aten.repeat_interleave.self_int"):  # each rank repeats its own contiguous heads
        if d is None or not isinstance(n.args[1], int) or len(n.args) > 3 and n.args[3] is not None:
            return None
        return d, None, 0
    if t.startswith(("aten.transpose.int", "aten.permute.", "aten.unbind.int", "aten.select.int", "aten.unsqueeze.",
                     "aten.slice.Tensor")):
        j = _moved(n, t, sx, d) if d is not None else None
        return None if j is None else (j, None, 0)
    if t.startswith("aten.expand."):  # the sharded dim keeps its (local) size
        if d is None or not isinstance(n.args[1], (list, tuple)) or len(n.args[1]) != len(sx) \
                or n.args[1][d] not in (-1, sx[d]):
            return None
        size = [v if i != d or v == -1 else v // tp for i, v in enumerate(n.args[1])]
        return d, (x, size, *n.args[2:]), 0
    if t.startswith(_SDPA):
        j = _sdpa(n, sdim, shp)
        return None if j is None else (j, None, 0)
    if t.startswith(("aten.matmul.", "aten.bmm.")):
        a, b = n.args[0], n.args[1]
        if a not in sdim or b not in sdim:
            return None
        da, db = sdim[a] - len(_shape(a)), sdim[b] - len(_shape(b))
        return (len(shp) + da, None, 0) if da == db and da <= -3 else None  # both sharded on one batch dim
    if t.startswith(("aten.softmax.", "aten._softmax.", "aten.log_softmax.", "aten._log_softmax.")):
        return None if d is None or int(n.args[1]) % len(sx) == d else (d, None, 0)
    if t.startswith(_PASS):
        got = _elementwise(n, ins, sdim, shp, tp, needs_grad)
        return None if got is None else (got[0], got[1], 0)
    return None


def local_region(gm: fx.GraphModule, col: fx.Node | Sequence[fx.Node], kinds: Mapping[str, str], tp: int,
                 needs_grad: set[fx.Node] | None = None) -> tuple[dict[fx.Node, tuple], int] | None:
    """For column GEMM(s) ``col`` feeding one row GEMM (several: Llama's separate q / k / v, a gated MLP): the new
    args of every op of their TP region when it runs on local shards (``{node: args}``) and ``k``: the number of
    equal chunks a single fused column's output is cut into on its last dim (``split``, ``chunk`` or a
    ``(k, heads, ...)`` view), else 1. None if an op of the region has no rule here (then the DTensor path stays).
    ``needs_grad``: :func:`grad_sources` of ``gm`` where the caller has it (one walk of the graph for all regions)."""
    got = _walk(gm, [col] if isinstance(col, fx.Node) else list(col), kinds, tp, needs_grad)
    return None if isinstance(got, fx.Node) or got is None else got


def _walk(gm: fx.GraphModule, cols: list[fx.Node], kinds: Mapping[str, str], tp: int,
          needs_grad: set[fx.Node] | None = None) -> tuple[dict[fx.Node, tuple], int] | fx.Node | None:
    """:func:`local_region`'s result, or the first op of the region that cannot run on local shards (None: a
    column's output has no shape)."""
    sdim: dict[fx.Node, int] = {}
    for c in cols:
        out = _shape(c)
        if out is None:
            return None
        sdim[c] = len(out) - 1
    fused = cols[0] if len(cols) == 1 else None  # only a lone column's output may be cut into chunks
    needs_grad = grad_sources(gm) if needs_grad is None else needs_grad
    new: dict[fx.Node, tuple] = {}
    k = 0
    for n in gm.graph.nodes:
        ins = [a for a in n.all_input_nodes if a in sdim]
        if not ins or n in cols:
            continue
        if kinds.get(n.name) == "row":
            if len(ins) != 1 or n.args[0] is not ins[0] or sdim[ins[0]] != len(_shape(ins[0]) or ()) - 1:
                return n
            continue
        if getattr(n.target, "__name__", "") == "getitem":
            sdim[n] = sdim[n.args[0]]
            continue
        got = _step(n, fused, sdim, ins, tp, needs_grad) if kinds.get(n.name) == "sharded" else None
        if got is None or (got[2] and k and got[2] != k):
            return n  # the sharded tensor leaves the region some other way, or an op has no rule
        sdim[n], k = got[0], got[2] or k
        if got[1] is not None:
            new[n] = got[1]
    return new, max(k, 1)


def column_groups(gm: fx.GraphModule, kinds: Mapping[str, str]) -> list[list[fx.Node]]:
    """The column GEMMs (``aten.linear``) of ``gm`` grouped by the row GEMM their sharded ops reach, in program
    order."""
    groups: dict[fx.Node, list[fx.Node]] = {}
    for c in gm.graph.nodes:
        if kinds.get(c.name) != "column" or c.op != "call_function" or _gemm(c) != "linear":
            continue
        stack, seen, row = list(c.users), set(), None
        while stack and row is None:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            if kinds.get(u.name) == "row":
                row = u
            elif kinds.get(u.name) == "sharded" or getattr(u.target, "__name__", "") == "getitem":
                stack.extend(u.users)
        groups.setdefault(row if row is not None else c, []).append(c)
    return list(groups.values())


def local_regions(gm: fx.GraphModule, kinds: Mapping[str, str], tp: int) -> dict[str, tuple[dict[fx.Node, tuple], int]]:
    """Column name -> ``(rewrites, k)`` (:func:`local_region`) of every column whose region runs on local shards
    (the columns of one region share its rewrites)."""
    out: dict[str, tuple[dict[fx.Node, tuple], int]] = {}
    needs_grad = grad_sources(gm)
    for cols in column_groups(gm, kinds):
        got = local_region(gm, cols, kinds, tp, needs_grad)
        if got is not None:
            out.update({c.name: got for c in cols})
    return out


def _region(cols: Sequence[fx.Node], kinds: Mapping[str, str]) -> list[fx.Node]:
    """The sharded ops fed by columns ``cols`` up to their row GEMM."""
    stack, seen = [u for c in cols for u in c.users], []
    while stack:
        u = stack.pop()
        if u not in seen and (kinds.get(u.name) == "sharded" or getattr(u.target, "__name__", "") == "getitem"):
            seen.append(u)
            stack.extend(u.users)
    return seen


def dtensor_blocker(gm: fx.GraphModule, cols: Sequence[fx.Node], kinds: Mapping[str, str], tp: int) -> str | None:
    """Why the region of ``cols`` (not run on local shards) cannot run on DTensors either, or None: fused attention
    (DTensor has no rule for ``scaled_dot_product_attention`` on CPU: the ranks fail or hang), a concatenation with
    an empty tensor (a cache before its first step) or a view cutting a column's sharded output into heads ``tp``
    does not divide. The message names the op that kept the region off local shards."""
    where = f"the TP region of '{cols[0].name}'"
    for n in _region(cols, kinds):
        t = str(n.target)
        if t.startswith(("aten.view.", "aten._unsafe_view.", "aten.reshape.")) and n.args[0] in cols:
            sx, shp = _shape(n.args[0]), _shape(n)
            if sx and shp and _regroup(sx, len(sx) - 1, shp, tp) is None:
                return (f"{where} reshapes its output to {list(shp)} ('{n.name}', of '{n.args[0].name}'), which "
                        f"TP {tp} cannot split into whole heads: {_heads_advice(sx, shp, tp)}")
    for n in _region(cols, kinds):
        t = str(n.target)
        if t.startswith(_SDPA):
            return (f"{where} runs scaled_dot_product_attention ('{n.name}'), which DTensor cannot run on CPU, and "
                    f"cannot run on local heads: {_not_local(gm, cols, kinds, tp)}, or use tp=1")
        if t.startswith("aten.cat.") and any(_shape(a) == (0,) for a in n.args[0]):
            return f"{where} concatenates an empty tensor ('{n.name}', a cache), which DTensor cannot shard: use tp=1"
    return None


def _heads_advice(sx: tuple[int, ...], shp: tuple[int, ...], tp: int) -> str:
    """What to change when a view of a column's output ``sx`` into ``shp`` cannot be split by TP ``tp``: the head
    count when ``tp`` does not divide it (a fused ``(k, heads, head_dim)`` view: the dim after the chunks), else the
    fused layout."""
    lead, acc, heads = 1, 1, None
    for x in sx[:-1]:
        lead *= x
    for j, x in enumerate(shp):
        if acc == lead:
            heads = shp[j + 1] if len(shp) >= len(sx) + 2 and j + 1 < len(shp) else x
            break
        acc *= x
    if heads == 1:
        return "it has a single head; use tp=1"
    if heads is not None and heads % tp:
        return f"it has {heads} heads; choose a TP degree dividing {heads}, or use tp=1"
    return "cut the fused projection with split / chunk on its last dim, or use tp=1"


def _not_local(gm: fx.GraphModule, cols: Sequence[fx.Node], kinds: Mapping[str, str], tp: int) -> str:
    """Why the region of ``cols`` does not run on local shards, naming the op (:func:`_walk`)."""
    n = _walk(gm, list(cols), kinds, tp)
    if not isinstance(n, fx.Node):
        return "the columns' outputs have no recorded shape"
    t = str(n.target)
    if t.startswith(_SDPA):
        return ("its mask spans the heads, or q / k / v are not split alike; compute attention without it (HF: "
                "attn_implementation='eager')")
    if t.startswith(("aten.split.Tensor", "aten.split_with_sizes", "aten.chunk.")):
        return (f"'{n.name}' cuts a projection into parts {n.args[1]} that are not equal or not divisible by TP "
                f"{tp}; use equal parts or separate projections")
    return (f"'{n.name}' ({t}) has no local-shard rule; write it with view / reshape / transpose / expand (as HF's "
            "repeat_kv does)")
