"""The cost table every command prices plans with: ``costs.path=<file>`` (``cost.costs_file``: measured times,
or a profile written by ``placement-rl profile``) else the topology's estimates; ``mode=inference`` makes it
forward-only (``cost.modes``)."""

from __future__ import annotations

from typing import Any

from placement_rl.cost import resolve_costs
from placement_rl.cost.modes import for_mode
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology


def costs_path(cfg: Any) -> str | None:
    node = cfg.get("costs") if hasattr(cfg, "get") else None
    path = node.get("path") if node is not None and hasattr(node, "get") else None
    return str(path) if path else None


def build_costs(cfg: Any, graph: CompGraph, topology: DeviceTopology, *, profiles=None) -> tuple[CompGraph, CostTable]:
    """(graph, costs) for a command: the costs file's graph (its memory fields and edge bytes) and table, else the
    graph and ``resolve_costs(graph, topology, profiles)``; in ``cfg.mode`` (default train)."""
    path = costs_path(cfg)
    if path:
        from placement_rl.cost.costs_file import load_costs

        graph, costs = load_costs(path, graph, topology)
    else:
        costs = resolve_costs(graph, topology, profiles=profiles)
    mode = cfg.get("mode") if hasattr(cfg, "get") else None
    return graph, for_mode(costs, str(mode or "train"))


__all__ = ["build_costs", "costs_path"]
