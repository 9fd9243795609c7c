"""Reading and writing graphs as versioned JSON (the schema is in ``placement_rl.graph.codec``), and atomic file
writes (``placement_rl.graph.files``)."""

from __future__ import annotations

import os
from typing import Any

from placement_rl.graph.codec import SCHEMA, VERSION, graph_fields, graph_to_dict  # noqa: F401 (re-exported)
from placement_rl.graph.files import atomic_write_text, file_mode  # noqa: F401 (re-exported)
from placement_rl.graph.ir import CompGraph


def graph_to_json(g: CompGraph, path: str | os.PathLike | None = None) -> str:
    return g.to_json(path)


def graph_from_dict(data: Any, *, where: str = "graph JSON") -> CompGraph:
    return CompGraph(**graph_fields(data, where=where))


def graph_from_json(path_or_str: str | os.PathLike) -> CompGraph:
    """Load a graph from a JSON file path or a JSON string; any problem is a ``GraphError``."""
    return CompGraph.from_json(path_or_str)
