"""What tensor parallelism may shard in a stage's exported program: the graph's TP node kinds, the check run
before any process starts (:func:`check_program`) and the local regions (:func:`local_region`: the ops from a
column GEMM to its row GEMM that run on local shards, with split sizes and view shapes divided by the TP degree).
``executor._tp`` applies them."""

from __future__ import annotations

from typing import Any, Mapping

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
                  stage_map: Mapping[str, int] | None = None, vocab: tuple[int, int] | None = None) -> None:
    """``PlanError`` (one line) when ``gm``'s annotated ops cannot run at TP degree ``tp`` (``vocab``: the
    vocabulary and its padded size, when the plan pads it: the vocab-parallel tables are checked padded)."""
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


def local_region(gm: fx.GraphModule, col: fx.Node, kinds: Mapping[str, str], tp: int
                 ) -> tuple[dict[fx.Node, tuple], int] | None:
    """For column GEMM ``col`` (its output split into ``k`` equal chunks on its last dim when fused, else ``k = 1``):
    the new args of every op of its TP region when it runs on local shards (``{node: args}``) and ``k``; None if an
    op of the region has no rule here (then the DTensor path stays)."""
    out = _shape(col)
    if out is None:
        return None
    sdim: dict[fx.Node, int] = {col: len(out) - 1}
    new: dict[fx.Node, tuple] = {}
    k = 0
    for n in gm.graph.nodes:
        ins = [a for a in n.all_input_nodes if a in sdim]
        if not ins or n is col:
            continue
        t = str(n.target)
        name = getattr(n.target, "__name__", "")
        if kinds.get(n.name) == "row":
            if len(ins) != 1 or n.args[0] is not ins[0] or sdim[ins[0]] != len(_shape(ins[0]) or ()) - 1:
                return None
            continue
        shp = _shape(n)
        if name == "getitem":
            sdim[n] = sdim[n.args[0]]
            continue
        x = n.args[0]
        sx = _shape(x)
        split = t.startswith(("aten.split.Tensor", "aten.split_with_sizes"))  # its value is a list of tensors
        if kinds.get(n.name) != "sharded" or sx is None or (shp is None and not split):
            return None  # the sharded tensor leaves the region some other way
        if split:
            dim = (n.args[2] if len(n.args) > 2 else 0) % len(sx)
            sizes = [n.args[1]] * (sx[dim] // n.args[1]) if isinstance(n.args[1], int) else list(n.args[1])
            if x is not col or dim != sdim[x] or len(set(sizes)) != 1 or sum(sizes) != sx[dim] or sizes[0] % tp:
                return None
            k = len(sizes)
            size = sizes[0] // tp
            new[n] = (x, size if isinstance(n.args[1], int) else [size] * k, *n.args[2:])
            sdim[n] = dim
        elif t.startswith(("aten.view.", "aten._unsafe_view.", "aten.reshape.")):
            if not isinstance(n.args[1], (list, tuple)) or any(not isinstance(v, int) or v < 0 for v in n.args[1]):
                return None
            j = _regroup(sx, sdim[x], shp, tp)
            if j is None:
                return None
            target = list(n.args[1])
            target[j] //= tp
            new[n] = (x, target)
            sdim[n] = j
        elif t.startswith("aten.transpose.int"):
            a, b = (int(v) % len(sx) for v in n.args[1:3])
            d = sdim[x]
            sdim[n] = b if d == a else a if d == b else d
        elif t.startswith(("aten.matmul.", "aten.bmm.")):
            a, b = n.args[0], n.args[1]
            if a not in sdim or b not in sdim:
                return None
            da, db = sdim[a] - len(_shape(a)), sdim[b] - len(_shape(b))
            if da != db or da > -3:
                return None  # both sharded on the same batch dim
            sdim[n] = len(shp) + da
        elif t.startswith(("aten.softmax.", "aten._softmax.", "aten.log_softmax.", "aten._log_softmax.")):
            if int(n.args[1]) % len(sx) == sdim[x]:
                return None
            sdim[n] = sdim[x]
        elif t.startswith(_PASS):
            d = sdim[ins[0]] - len(_shape(ins[0]))
            for a in n.args:
                sa = _shape(a)
                if isinstance(a, fx.Node) and a not in sdim and sa is not None and len(sa) >= -d and sa[d] != 1:
                    return None  # a replicated operand spans the sharded dim
                if isinstance(a, fx.Node) and a in sdim and sdim[a] - len(sa) != d:
                    return None
            if len(shp) < -d:
                return None
            sdim[n] = len(shp) + d
        else:
            return None
    return new, max(k, 1)
