"""Reading a plan file (``placement_rl.plans``): its JSON object with one-line errors (a missing file, a folder,
text that is no JSON object), its schema and version, the graph it was made for (by fingerprint) and the device
names it stores, mapped onto a topology; ``naming_file`` makes every error met reading a file start with its path."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

VERSION = 1  # of both plan schemas


def _file_of(path_or_str: str | os.PathLike) -> Path | None:
    """The file a plan reader was given, or None where it was given the JSON text itself."""
    if isinstance(path_or_str, os.PathLike) or not str(path_or_str).lstrip().startswith("{"):
        return Path(path_or_str)
    return None


@contextmanager
def naming_file(path_or_str: str | os.PathLike) -> Iterator[None]:
    """Around the reading of a plan file: a ``PlanError`` raised inside starts with the file's path, as graph and
    topology errors do (once: not where the message names the file already, nor for JSON text)."""
    try:
        yield
    except PlanError as exc:
        p = _file_of(path_or_str)
        if p is None or str(p) in str(exc):
            raise
        raise type(exc)(f"{p}: {exc}") from None


def read_json(path_or_str: str | os.PathLike, what: str) -> dict[str, Any]:
    where = what
    p = _file_of(path_or_str)
    if p is not None:
        if p.is_dir():
            raise PlanError(f"{what} '{p}' is a folder, not a {what} file: name the plan.json or placement.json in it")
        if not p.is_file():
            raise PlanError(f"{what} file '{p}' does not exist")
        try:
            where, text = str(p), p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PlanError(f"{what} file '{p}' cannot be read as text ({exc})") from None
    else:
        text = str(path_or_str)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{where}: top level must be a JSON object")
    return data


def read_plan_file(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object of a plan file (``PlanError`` naming a missing file, a folder, text that is no JSON object),
    before a topology or graph is at hand to load it."""
    return read_json(Path(path), "plan")


def check_schema(data: Mapping[str, Any], schema: str) -> None:
    if data.get("schema") != schema:
        raise PlanError(f"field 'schema' is {data.get('schema')!r}, expected '{schema}'")
    if data.get("version") != VERSION:
        raise PlanError(f"unknown {schema} version {data.get('version')!r} (this release reads {VERSION})")
    if not isinstance(data.get("meta") or {}, dict):
        raise PlanError(f"field 'meta' must be a JSON object, got {data.get('meta')!r}")


def check_graph(data: Mapping[str, Any], graph: CompGraph, what: str, num_nodes: int) -> None:
    """A plan file names the graph it was made for by ``graph_fingerprint``: refuse it for any other graph, even
    one with as many nodes (its node indices would silently mean other ops). Files without one (written before
    plans carried it, or without a graph) are checked by ``validate`` alone."""
    fp = data.get("graph_fingerprint")
    if fp is None:
        return
    if not isinstance(fp, str):
        raise PlanError(f"{what} JSON field 'graph_fingerprint' must be a string, got {fp!r}")
    if fp != graph.fingerprint():
        raise PlanError(f"{what} was made for graph '{data.get('graph')}' (fingerprint {fp}, {num_nodes} nodes), "
                        f"not this one: graph '{graph.name}' has fingerprint {graph.fingerprint()} "
                        f"({graph.num_nodes} nodes); give the graph it was made for (the graph.json written beside "
                        "it), or make a new plan")


def device_map(names: Sequence[str], topology: DeviceTopology | None, what: str) -> np.ndarray:
    """Indices into ``topology.devices`` of the device names stored in a plan file."""
    if topology is None:
        return np.arange(len(names), dtype=np.int64)
    have = {d.name: i for i, d in enumerate(topology.devices)}
    out = []
    for nm in names:
        if not isinstance(nm, str) or nm not in have:
            raise PlanError(f"{what} uses device '{nm}' which topology '{topology.name}' lacks "
                            f"(devices: {', '.join(topology.device_names)})")
        out.append(have[nm])
    return np.array(out, dtype=np.int64)


__all__ = ["VERSION", "check_graph", "check_schema", "device_map", "naming_file", "read_json", "read_plan_file"]
