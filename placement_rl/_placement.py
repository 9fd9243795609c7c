"""``Placement``: the op-level plan, a device per node (see ``placement_rl.plans``, which the rest of the code imports
it from): validated against a graph and a topology, written to and read from JSON by device name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from placement_rl._plan_values import _FILE_KEYS, _dumps, _index_list, _same_meta, check_keys
from placement_rl.errors import PlanError
from placement_rl.graph.io import atomic_write_text
from placement_rl.graph.ir import CompGraph, restore_read_only
from placement_rl.plan_files import VERSION, check_graph, check_schema, device_map, naming_file, read_json
from placement_rl.topology import DeviceTopology

PLACEMENT_SCHEMA = "placement_rl.placement"
PLACEMENT_KEYS = (*_FILE_KEYS, "devices", "device_of_node", "nodes")


@dataclass(frozen=True, eq=False)
class Placement:
    """``device_of_node[i]`` is the index (into ``topology.devices``) of the device running node ``i``."""

    device_of_node: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_of_node", _index_list(self.device_of_node, "device_of_node", "device index"))
        object.__setattr__(self, "meta", dict(self.meta))

    def __setstate__(self, state: dict) -> None:  # unpickled (another process): its array read-only again
        restore_read_only(self, state)

    def __len__(self) -> int:
        return int(self.device_of_node.shape[0])

    def __eq__(self, other: object) -> bool:  # by value (gymnasium's determinism check compares infos with ==)
        if not isinstance(other, Placement):
            return NotImplemented
        return (np.array_equal(self.device_of_node, other.device_of_node)
                and _same_meta(self.meta, other.meta))

    def __hash__(self) -> int:
        return hash(self.device_of_node.tobytes())

    def validate(self, graph: CompGraph, topology: DeviceTopology) -> "Placement":
        if len(self) != graph.num_nodes:
            raise PlanError(f"placement has {len(self)} entries but graph '{graph.name}' has "
                            f"{graph.num_nodes} nodes")
        bad = np.flatnonzero((self.device_of_node < 0) | (self.device_of_node >= topology.num_devices))
        if bad.size:
            i = int(bad[0])
            raise PlanError(f"node '{graph.names[i]}' is placed on device index {self.device_of_node[i]}, "
                            f"but topology '{topology.name}' has devices 0..{topology.num_devices - 1}")
        return self

    def to_dict(self, graph: CompGraph | None = None, topology: DeviceTopology | None = None) -> dict[str, Any]:
        if not len(self):
            raise PlanError("placement has no entries (a device per node): there is nothing to write")
        used = sorted(set(self.device_of_node.tolist()))
        names = [topology.devices[i].name if topology else f"dev{i}" for i in range(max(used) + 1)]
        out: dict[str, Any] = {"schema": PLACEMENT_SCHEMA, "version": VERSION,
                               "devices": names, "device_of_node": self.device_of_node.tolist(),
                               "meta": dict(self.meta)}
        if graph is not None:
            out.update(graph=graph.name, graph_fingerprint=graph.fingerprint(), nodes=list(graph.names))
        if topology is not None:
            out["topology"] = topology.name
        return out

    def to_json(self, path: str | os.PathLike | None = None, *, graph: CompGraph | None = None,
                topology: DeviceTopology | None = None) -> str:
        text = _dumps(self.to_dict(graph, topology), "placement")
        if path is not None:
            atomic_write_text(path, text)
        return text

    @staticmethod
    def from_json(path_or_str: str | os.PathLike, *, topology: DeviceTopology | None = None,
                  graph: CompGraph | None = None) -> "Placement":
        """The placement a file (or its JSON text) holds, checked against ``topology`` and ``graph`` where given;
        an error on a file starts with its path (``naming_file``)."""
        with naming_file(path_or_str):
            return Placement._from_data(read_json(path_or_str, "placement"), topology, graph)

    @staticmethod
    def _from_data(data: Mapping[str, Any], topology: DeviceTopology | None,
                   graph: CompGraph | None) -> "Placement":
        check_schema(data, PLACEMENT_SCHEMA)
        check_keys(data, PLACEMENT_KEYS, "placement")
        names, dev = data.get("devices"), data.get("device_of_node")
        if not isinstance(names, list) or not isinstance(dev, list):
            raise PlanError("placement JSON needs lists 'devices' and 'device_of_node'")
        if any(not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < len(names) for x in dev):
            raise PlanError(f"'device_of_node' entries must be integers in [0, {len(names)})")
        mapping = device_map(names, topology, "placement")
        device = mapping[np.array(dev, dtype=np.int64)] if dev else np.zeros(0, np.int64)
        nodes = data.get("nodes")
        if nodes is not None and (not isinstance(nodes, list) or len(nodes) != len(dev)
                                  or not all(isinstance(x, str) for x in nodes) or len(set(nodes)) != len(nodes)):
            raise PlanError("placement JSON field 'nodes' must name each node once, one per entry of "
                            "'device_of_node'")
        if graph is not None and nodes is not None and nodes != list(graph.names):  # the names say the order
            index = {x: v for v, x in enumerate(graph.names)}
            other = next((x for x in nodes if x not in index), None)
            if other is not None or len(nodes) != graph.num_nodes:
                raise PlanError(f"placement names node {other!r} (of {len(nodes)}), which graph '{graph.name}' ("
                                f"{graph.num_nodes} nodes) does not have: it was made for another graph")
            ordered = np.empty_like(device)
            ordered[[index[x] for x in nodes]] = device
            device = ordered
        p = Placement(device, meta=data.get("meta") or {})
        if graph is not None:
            check_graph(data, graph, "placement", len(dev))
            if topology is not None:
                p.validate(graph, topology)
        return p
