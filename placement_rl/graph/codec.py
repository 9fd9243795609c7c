"""Versioned JSON for ``CompGraph`` (never pickle): the dict a graph writes and the fields a dict reads back
(``CompGraph.to_json`` / ``from_json`` and ``placement_rl.graph.io`` use them).

Schema ``placement_rl.graph`` version 1::

    {"schema": "placement_rl.graph", "version": 1, "name": str, "meta": {...},
     "nodes": [{"name", "op_type", "module_path", "fwd_flops", "bwd_flops", "out_bytes",
                "param_bytes", "act_bytes", ["members": [str, ...]]}, ...],
     "edges": [[src_index, dst_index, bytes], ...]}

Floats are written with ``repr`` precision, so a round trip is exact.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placement_rl.errors import GraphError

if TYPE_CHECKING:
    from placement_rl.graph.ir import CompGraph

SCHEMA = "placement_rl.graph"
VERSION = 1
STRING_WHERE = "graph JSON"  # what ``read_graph_json`` says a graph given as a JSON string came from
NODE_ARRAYS = ("fwd_flops", "bwd_flops", "out_bytes", "param_bytes", "act_bytes")


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)


def graph_to_dict(g: "CompGraph") -> dict[str, Any]:
    nodes = []
    cols = {k: getattr(g, k).tolist() for k in NODE_ARRAYS}
    for i, nm in enumerate(g.names):
        nd: dict[str, Any] = {"name": nm, "op_type": g.op_types[i], "module_path": g.module_paths[i]}
        nd.update({k: _num(cols[k][i]) for k in NODE_ARRAYS})
        if g.members is not None:
            nd["members"] = list(g.members[i])
        nodes.append(nd)
    edges = [[s, d, _num(b)] for (s, d), b in zip(g.edges.tolist(), g.edge_bytes.tolist())]
    return {"schema": SCHEMA, "version": VERSION, "name": g.name, "meta": dict(g.meta),
            "nodes": nodes, "edges": edges}


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity inside ``value`` (nested lists and objects), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        got = _non_finite(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}")
        if got:
            return got
    return None


def _is_amount(v: Any) -> bool:
    """A number a float holds, finite and >= 0: not a bool, a string, NaN, an infinity or an integer too large for
    a float (``10**400``)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v)) and v >= 0
    except OverflowError:
        return False


def _show(v: Any) -> str:
    """``repr(v)``, with an integer of many digits cut short (the message stays one readable line)."""
    text = repr(v)
    return f"{text[:12]}... ({len(text.lstrip('-'))} digits)" if isinstance(v, int) and len(text) > 24 else text


def graph_fields(data: Any, *, where: str = STRING_WHERE) -> dict[str, Any]:
    """The ``CompGraph`` fields a graph JSON object holds (``CompGraph(**graph_fields(data))``); any problem is a
    ``GraphError``."""
    if not isinstance(data, dict):
        raise GraphError(f"{where}: top level must be an object with 'schema', 'version', 'nodes', 'edges'")
    if data.get("schema") != SCHEMA:
        raise GraphError(f"{where}: field 'schema' is {data.get('schema')!r}, expected '{SCHEMA}'")
    if data.get("version") != VERSION:
        raise GraphError(f"{where}: unknown schema version {data.get('version')!r} "
                         f"(this release reads version {VERSION})")
    nodes, edges = data.get("nodes"), data.get("edges")
    if not isinstance(nodes, list):
        raise GraphError(f"{where}: field 'nodes' must be a list")
    if not isinstance(edges, list):
        raise GraphError(f"{where}: field 'edges' must be a list")
    if not isinstance(data.get("meta") or {}, dict):
        raise GraphError(f"{where}: field 'meta' must be an object")
    bad = _non_finite(data.get("meta") or {}, "meta")
    if bad:  # the graph is written back out (graph.json) as strict JSON
        raise GraphError(f"{where}: {bad} is not a finite number (NaN and infinity are not JSON): fix or remove it")
    for i, nd in enumerate(nodes):
        if not isinstance(nd, dict) or not isinstance(nd.get("name"), str):
            raise GraphError(f"{where}: node #{i} must be an object with a string 'name'")
        for k in ("op_type", "module_path"):
            if k in nd and not isinstance(nd[k], str):
                raise GraphError(f"{where}: node '{nd['name']}' (#{i}) has {k}={nd[k]!r}: must be a string")
        if "members" in nd and (not isinstance(nd["members"], list)
                                or not all(isinstance(m, str) for m in nd["members"])):
            raise GraphError(f"{where}: node '{nd['name']}' (#{i}) has members={nd['members']!r}: "
                             "must be a list of op names")
        for k in NODE_ARRAYS:
            if k not in nd:
                raise GraphError(f"{where}: node '{nd['name']}' (#{i}) lacks field '{k}'")
            v = nd[k]
            if not _is_amount(v):
                raise GraphError(f"{where}: node '{nd['name']}' (#{i}) has invalid {k}={_show(v)}: "
                                 "costs must be finite and non-negative numbers")
    for e, ed in enumerate(edges):
        if (not isinstance(ed, list) or len(ed) != 3 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                 for x in ed[:2])):
            raise GraphError(f"{where}: edge #{e} must be [src_index, dst_index, bytes], got {ed!r}")
        if not all(0 <= x < len(nodes) for x in ed[:2]):
            raise GraphError(f"{where}: edge #{e} [{_show(ed[0])}, {_show(ed[1])}] is dangling: node indices must "
                             f"be in [0, {len(nodes)})")
        if not _is_amount(ed[2]):
            raise GraphError(f"{where}: edge #{e} '{nodes[ed[0]]['name']}' -> '{nodes[ed[1]]['name']}' has invalid "
                             f"edge_bytes={_show(ed[2])}: edge bytes must be finite and non-negative numbers")
    has_members = any("members" in nd for nd in nodes)
    return dict(
        names=tuple(nd["name"] for nd in nodes),
        op_types=tuple(nd.get("op_type", "op") for nd in nodes),
        module_paths=tuple(nd.get("module_path", "") for nd in nodes),
        **{k: [nd[k] for nd in nodes] for k in NODE_ARRAYS},
        edges=[[ed[0], ed[1]] for ed in edges],
        edge_bytes=[ed[2] for ed in edges],
        name=str(data.get("name", "graph")),
        members=[tuple(nd.get("members", (nd["name"],))) for nd in nodes] if has_members else None,
        meta=data.get("meta") or {},
    )


def read_graph_json(path_or_str: str | os.PathLike) -> tuple[Any, str]:
    """``(the parsed JSON, where it came from)`` of a graph JSON file path or JSON string; a missing file or
    malformed JSON is a ``GraphError``."""
    text: str
    where = STRING_WHERE
    if isinstance(path_or_str, os.PathLike) or (isinstance(path_or_str, str)
                                               and not path_or_str.lstrip().startswith("{")):
        p = Path(path_or_str)
        if not p.is_file():
            raise GraphError(f"graph file '{p}' does not exist")
        where = str(p)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise GraphError(f"{where}: is not a UTF-8 text file (byte {exc.start}: {exc.reason}); a graph file is "
                             "JSON text (docs/graph_file.md)") from None
    else:
        text = str(path_or_str)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError:  # an integer past Python's digit limit for parsing
        raise GraphError(f"{where}: holds a number with too many digits to read (Python's limit for an integer): "
                         "costs must be finite numbers") from None
    return data, where
