"""The checks of a ``CompGraph``'s ``members`` and of the ``meta`` fields planners read (``batch_size``, the
precision, the TP annotation), split from ``placement_rl.graph.ir``: each raises ``GraphError`` naming the field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from placement_rl.errors import GraphError
from placement_rl.graph.tp_kinds import KINDS as TP_KINDS, SCHEMA_VERSION as TP_SCHEMA_VERSION

if TYPE_CHECKING:
    from placement_rl.graph.ir import CompGraph

GRAPH_DTYPES = ("fp32", "bf16", "fp16", "fp64")  # meta.dtype / meta.param_dtype: what the cost models price


def _is_int(x: Any, lo: int) -> bool:
    """An integer (not a bool) >= ``lo``."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= lo


def check_members(graph: CompGraph) -> None:
    """Coarse nodes partition the original ops: each lists at least one, and no op is in two nodes."""
    n = graph.num_nodes
    if len(graph.members) != n:
        raise GraphError(f"field 'members' has {len(graph.members)} entries, expected {n}")
    owner: dict[str, int] = {}
    for i, grp in enumerate(graph.members):
        if not grp:
            raise GraphError(f"node '{graph.names[i]}' (#{i}) has empty 'members': list the original ops it groups")
        for m in grp:  # one pass: a member seen before is either this node's twice or another node's
            j = owner.get(m)
            if j == i:
                raise GraphError(f"node '{graph.names[i]}' (#{i}) lists member '{m}' twice")
            if j is not None:
                raise GraphError(f"nodes '{graph.names[j]}' (#{j}) and '{graph.names[i]}' (#{i}) both list member "
                                 f"'{m}': each original op belongs to exactly one coarse node")
            owner[m] = i


def check_meta(graph: CompGraph) -> None:
    """The ``meta`` fields planners read: ``batch_size`` (and ``zoo_options.batch_size``), a positive integer
    or null, the precision ``dtype`` / ``param_dtype`` (one of ``GRAPH_DTYPES`` or absent), and the TP
    annotation ``tp`` (``placement_rl.graph.tp``), whose op names must exist."""
    meta, g = graph.meta, f"graph '{graph.name}'"
    for key in ("dtype", "param_dtype"):
        if meta.get(key) is not None and meta[key] not in GRAPH_DTYPES:
            raise GraphError(f"{g}: field 'meta.{key}' is {meta[key]!r}, expected one of {', '.join(GRAPH_DTYPES)} "
                             "(the elements its bytes count) or absent for fp32")
    opts = meta.get("zoo_options")
    if opts is not None and not isinstance(opts, Mapping):
        raise GraphError(f"{g}: field 'meta.zoo_options' must be an object, got {opts!r}")
    for key, val in (("meta.batch_size", meta.get("batch_size")),
                     ("meta.zoo_options.batch_size", (opts or {}).get("batch_size"))):
        if val is not None and not _is_int(val, 1):
            raise GraphError(f"{g}: field '{key}' must be a positive integer (the batch the graph was captured "
                             f"at) or null when unknown, got {val!r}")
    if meta.get("tp") is not None:
        _check_tp(graph, meta["tp"])


def _check_tp(graph: CompGraph, tp: Any) -> None:
    g = f"graph '{graph.name}'"
    if not isinstance(tp, Mapping):
        raise GraphError(f"{g}: field 'meta.tp' must be an object (the TP annotation capture writes) or absent, "
                         f"got {tp!r}")
    if tp.get("version") != TP_SCHEMA_VERSION:
        raise GraphError(f"{g}: field 'meta.tp.version' is {tp.get('version')!r}, expected {TP_SCHEMA_VERSION} "
                         "(capture the graph again, or drop 'meta.tp' to have it detected)")
    ops = set(graph.names) if graph.members is None else {m for grp in graph.members for m in grp}

    def known(key: str, name: Any) -> None:
        if not isinstance(name, str) or name not in ops:
            raise GraphError(f"{g}: field 'meta.tp.{key}' names op {name!r}, which the graph does not have")

    for key in ("nodes", "ar_fwd", "ar_bwd"):
        table = tp.get(key, {})
        if not isinstance(table, Mapping):
            raise GraphError(f"{g}: field 'meta.tp.{key}' must be an object keyed by op name, got {table!r}")
        for name, val in table.items():
            known(key, name)
            if key == "nodes" and val not in TP_KINDS:
                raise GraphError(f"{g}: field 'meta.tp.nodes' gives op '{name}' kind {val!r}, expected one of "
                                 f"{', '.join(TP_KINDS)}")
            if key != "nodes" and (isinstance(val, bool) or not isinstance(val, (int, float))
                                   or not np.isfinite(val) or val < 0):
                raise GraphError(f"{g}: field 'meta.tp.{key}' gives op '{name}' {val!r}: must be a finite "
                                 "number of bytes >= 0")
    pairs = tp.get("pairs", [])
    if not isinstance(pairs, list) or not all(isinstance(pr, Mapping) for pr in pairs):
        raise GraphError(f"{g}: field 'meta.tp.pairs' must be a list of objects, got {pairs!r}")
    for pr in pairs:
        cols = pr.get("columns", [])
        if not isinstance(cols, list):
            raise GraphError(f"{g}: field 'meta.tp.pairs' has columns={cols!r}: must be a list of op names")
        for name in cols:
            known("pairs", name)
        if "row" in pr:
            known("pairs", pr["row"])
    divisors = tp.get("divisors", [])
    if not isinstance(divisors, list) or not all(_is_int(d, 1) for d in divisors):
        raise GraphError(f"{g}: field 'meta.tp.divisors' must be a list of positive integers, got {divisors!r}")
    heads = tp.get("heads", {})
    if not isinstance(heads, Mapping) or not all(_is_int(h, 1) for h in heads.values()):
        raise GraphError(f"{g}: field 'meta.tp.heads' must map names to positive integers, got {heads!r}")
    vocab = tp.get("vocab")
    if vocab is not None and not _is_int(vocab, 0):
        raise GraphError(f"{g}: field 'meta.tp.vocab' must be an integer >= 0 or null, got {vocab!r}")
