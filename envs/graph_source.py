"""``GraphSource``: where an environment's (graph, topology, costs) come from at each reset.

Kinds of graph source (one per constructor):

* ``GraphSource.fixed(graph, topology)``: one graph, every episode.
* ``GraphSource.from_graphs(graphs, topology)``: a list of graphs, one drawn uniformly per reset.
* ``GraphSource.zoo(names, topology)``: built-in models, captured and coarsened once when the source is
  built, then drawn like a list.
* ``GraphSource.folder(path, topology)``: every ``*.json`` graph file of a folder (sorted by name).
* ``GraphSource.synthetic(family, topology, num_nodes=(lo, hi))``: a fresh random graph of a synthetic
  family (or of one of several families) each reset, its size drawn in ``[lo, hi]``.

``topology`` is a ``DeviceTopology``, a preset name / YAML path, or a sequence of those (one drawn per
reset). Every draw uses the ``numpy.random.Generator`` the environment passes (its ``np_random``, seeded
by ``reset(seed=)``), so the same seed gives the same sequence of tasks.

Costs are resolved by ``cost_fn(graph, topology) -> CostTable`` (default ``resolve_costs``) once per
(graph, topology) pair of a finite source and kept in this instance; synthetic graphs are new each reset,
so their costs are resolved per reset and not kept. Nothing is cached at module level.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from placement_rl.cost import resolve_costs
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology, load_topology

__all__ = ["CostFn", "GraphSource", "Task", "as_topologies"]

CostFn = Callable[[CompGraph, DeviceTopology], CostTable]
# A synthetic graph that does not fit the observation (more edges than ``max_edges``) is drawn again.
_MAX_REDRAWS = 32


@dataclass(eq=False)
class Task:
    """One problem an episode runs on. ``cache`` holds what environments derive from it (features, the
    reward source, best single-device time); it lives as long as the task does."""

    graph: CompGraph
    topology: DeviceTopology
    costs: CostTable
    key: tuple[int, int] | None = None  # (graph index, topology index) for finite sources
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        source = self.costs.describe_source(self.topology.device_names)
        return (f"Task(graph={self.graph.name!r} ({self.graph.num_nodes} nodes), topology={self.topology.name!r} "
                f"({self.topology.num_devices} devices), costs={source!r}, key={self.key})")


def as_topologies(topology: DeviceTopology | str | os.PathLike | Sequence[Any]) -> tuple[DeviceTopology, ...]:
    """One or several topologies from objects, preset names or YAML paths."""
    if isinstance(topology, (DeviceTopology, str, os.PathLike)):
        items: list[Any] = [topology]
    elif isinstance(topology, Sequence) and len(topology) > 0:
        items = list(topology)
    else:
        raise ConfigError(f"topology must be a DeviceTopology, a preset name, a YAML path or a non-empty list of "
                          f"them, got {type(topology).__name__}")
    return tuple(t if isinstance(t, DeviceTopology) else load_topology(t) for t in items)


def _size_range(num_nodes: int | Sequence[int]) -> tuple[int, int]:
    lo_hi = (num_nodes, num_nodes) if isinstance(num_nodes, (int, np.integer)) else tuple(num_nodes)
    if (len(lo_hi) != 2 or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in lo_hi)
            or not 3 <= lo_hi[0] <= lo_hi[1]):
        raise ConfigError(f"num_nodes must be an integer >= 3 or a range (lo, hi) with 3 <= lo <= hi, "
                          f"got {num_nodes!r}")
    return int(lo_hi[0]), int(lo_hi[1])


class GraphSource:
    """Draws a ``Task`` per reset. Build it with one of the class methods; see the module docstring."""

    def __init__(self, *, topologies: Sequence[DeviceTopology], graphs: Sequence[CompGraph] = (),
                 families: Sequence[str] = (), num_nodes: tuple[int, int] = (16, 32),
                 cost_fn: CostFn | None = None, name: str = "graphs") -> None:
        if bool(graphs) == bool(families):
            raise ConfigError("a graph source needs either graphs or synthetic families (exactly one of them)")
        for g in graphs:
            if not isinstance(g, CompGraph):
                raise ConfigError(f"graph source entries must be CompGraphs, got {type(g).__name__}")
        if families:
            from placement_rl.graph import synthetic

            unknown = [f for f in families if f not in synthetic.families()]
            if unknown:
                raise ConfigError(f"unknown synthetic family '{unknown[0]}' (choose from "
                                  f"{', '.join(synthetic.families())})")
        if cost_fn is not None and not callable(cost_fn):
            raise ConfigError(f"cost_fn must be callable (graph, topology) -> CostTable, got {type(cost_fn).__name__}")
        self.graphs: tuple[CompGraph, ...] = tuple(graphs)
        self.families: tuple[str, ...] = tuple(families)
        self.num_nodes = _size_range(num_nodes)
        self.topologies: tuple[DeviceTopology, ...] = tuple(topologies)
        self.cost_fn: CostFn = cost_fn or resolve_costs
        self.name = name
        self.redraws = 0  # synthetic graphs drawn again because they did not fit the observation
        self._tasks: dict[tuple[int, int], Task] = {}
        self._edge_limit: int | None = None

    # ------------------------------------------------------------ builders
    @classmethod
    def fixed(cls, graph: CompGraph, topology: Any, *, cost_fn: CostFn | None = None) -> "GraphSource":
        return cls(graphs=[graph], topologies=as_topologies(topology), cost_fn=cost_fn, name=graph.name)

    @classmethod
    def from_graphs(cls, graphs: Sequence[CompGraph], topology: Any, *,
                    cost_fn: CostFn | None = None, name: str = "graphs") -> "GraphSource":
        if not graphs:
            raise ConfigError("graph list is empty: give at least one graph")
        return cls(graphs=list(graphs), topologies=as_topologies(topology), cost_fn=cost_fn, name=name)

    @classmethod
    def zoo(cls, names: str | Sequence[str], topology: Any, *, overrides: Mapping[str, Mapping[str, Any]] | None = None,
            coarsen: bool | Mapping[str, Any] = True, cost_fn: CostFn | None = None) -> "GraphSource":
        """Zoo models captured once (``capture_zoo(name, **overrides[name])``), then coarsened with the default
        options (``coarsen=True``), the given options (a mapping) or not at all (``False``)."""
        from placement_rl.graph.capture import capture_zoo
        from placement_rl.graph.coarsen import coarsen as coarsen_graph

        names = [names] if isinstance(names, str) else list(names)
        if not names:
            raise ConfigError("zoo graph source needs at least one model name")
        graphs = []
        for nm in names:
            g = capture_zoo(nm, **dict((overrides or {}).get(nm, {})))
            if coarsen is not False:
                g = coarsen_graph(g, **(dict(coarsen) if isinstance(coarsen, Mapping) else {}))
            graphs.append(g)
        return cls(graphs=graphs, topologies=as_topologies(topology), cost_fn=cost_fn, name="+".join(names))

    @classmethod
    def folder(cls, path: str | os.PathLike, topology: Any, *, pattern: str = "*.json",
               cost_fn: CostFn | None = None) -> "GraphSource":
        p = Path(path)
        if not p.is_dir():
            raise ConfigError(f"graph folder '{p}' does not exist or is not a folder")
        files = sorted(p.glob(pattern))
        if not files:
            raise ConfigError(f"graph folder '{p}' holds no files matching '{pattern}'")
        return cls(graphs=[CompGraph.from_json(f) for f in files], topologies=as_topologies(topology),
                   cost_fn=cost_fn, name=p.name)

    @classmethod
    def synthetic(cls, family: str | Sequence[str], topology: Any, *, num_nodes: int | Sequence[int] = (16, 32),
                  cost_fn: CostFn | None = None) -> "GraphSource":
        families = [family] if isinstance(family, str) else list(family)
        if not families:
            raise ConfigError("synthetic graph source needs at least one family")
        return cls(families=families, topologies=as_topologies(topology), num_nodes=_size_range(num_nodes),
                   cost_fn=cost_fn, name="+".join(families))

    @classmethod
    def from_spec(cls, graph: Any, topology: Any, *, cost_fn: CostFn | None = None) -> "GraphSource":
        """A source from what a user passes an environment: a ``GraphSource`` (returned as is), a ``CompGraph``,
        a list of CompGraphs, a graph JSON file, a folder of them, ``"synthetic:<family>[,<family>...]"``
        or ``"zoo:<name>[,<name>...]"``."""
        if isinstance(graph, GraphSource):
            return graph
        if isinstance(graph, CompGraph):
            return cls.fixed(graph, topology, cost_fn=cost_fn)
        if isinstance(graph, (str, os.PathLike)):
            s = str(graph)
            kind, _, rest = s.partition(":")
            if kind == "synthetic" and rest:
                return cls.synthetic(rest.split(","), topology, cost_fn=cost_fn)
            if kind == "zoo" and rest:
                return cls.zoo(rest.split(","), topology, cost_fn=cost_fn)
            p = Path(s)
            if p.is_dir():
                return cls.folder(p, topology, cost_fn=cost_fn)
            if p.is_file():
                return cls.fixed(CompGraph.from_json(p), topology, cost_fn=cost_fn)
            raise ConfigError(f"graph '{s}' is neither a graph JSON file, a folder, 'synthetic:<family>' nor "
                              "'zoo:<name>'")
        if isinstance(graph, Sequence) and graph and all(isinstance(g, CompGraph) for g in graph):
            return cls.from_graphs(graph, topology, cost_fn=cost_fn)
        raise ConfigError(f"graph must be a GraphSource, a CompGraph, a list of CompGraphs or a path, "
                          f"got {type(graph).__name__}")

    # -------------------------------------------------------------- sizes
    @property
    def is_finite(self) -> bool:
        return bool(self.graphs)

    @property
    def max_nodes(self) -> int:
        return max(g.num_nodes for g in self.graphs) if self.graphs else self.num_nodes[1]

    @property
    def max_devices(self) -> int:
        return max(t.num_devices for t in self.topologies)

    def max_edges(self, probes: int = 16) -> int:
        """Exact for finite sources; for synthetic families 1.5x the most edges of ``probes`` graphs of the
        largest size per family (seeds 0..probes-1), since a bigger draw is drawn again."""
        if self.graphs:
            return max(max(g.num_edges for g in self.graphs), 1)
        from placement_rl.graph import synthetic

        most = max(synthetic.sample(f, num_nodes=self.num_nodes[1], seed=s).num_edges
                   for f in self.families for s in range(probes))
        return int(np.ceil(1.5 * most)) + 8

    def set_edge_limit(self, max_edges: int) -> None:
        """Synthetic draws with more edges than this are drawn again (up to 32 times, then ``ConfigError``)."""
        self._edge_limit = int(max_edges)

    # ------------------------------------------------------------ sampling
    def sample(self, rng: np.random.Generator) -> Task:
        t = int(rng.integers(len(self.topologies))) if len(self.topologies) > 1 else 0
        if self.graphs:
            g = int(rng.integers(len(self.graphs))) if len(self.graphs) > 1 else 0
            task = self._tasks.get((g, t))
            if task is None:
                task = self._make(self.graphs[g], self.topologies[t], (g, t))
                self._tasks[(g, t)] = task
            return task
        from placement_rl.graph import synthetic

        for _ in range(_MAX_REDRAWS):
            fam = self.families[int(rng.integers(len(self.families)))] if len(self.families) > 1 else self.families[0]
            lo, hi = self.num_nodes
            n = int(rng.integers(lo, hi + 1))
            graph = synthetic.sample(fam, num_nodes=n, seed=int(rng.integers(2**31 - 1)))
            if self._edge_limit is None or graph.num_edges <= self._edge_limit:
                return self._make(graph, self.topologies[t], None)
            self.redraws += 1
        raise ConfigError(f"synthetic family {fam!r} keeps drawing graphs with more than {self._edge_limit} edges: "
                          "raise the environment's max_edges")

    def _make(self, graph: CompGraph, topology: DeviceTopology, key: tuple[int, int] | None) -> Task:
        costs = self.cost_fn(graph, topology)
        if not isinstance(costs, CostTable):
            raise ConfigError(f"cost_fn returned {type(costs).__name__}, expected a CostTable")
        if costs.fwd_time.shape != (graph.num_nodes, topology.num_devices):
            raise ConfigError(f"cost_fn returned a {costs.fwd_time.shape} cost table for graph '{graph.name}' "
                              f"({graph.num_nodes} nodes) on topology '{topology.name}' "
                              f"({topology.num_devices} devices)")
        return Task(graph=graph, topology=topology, costs=costs, key=key)

    def __repr__(self) -> str:
        what = f"{len(self.graphs)} graph(s)" if self.graphs else f"synthetic {self.families} sizes {self.num_nodes}"
        return f"GraphSource({self.name!r}: {what}, {len(self.topologies)} topology(ies))"
