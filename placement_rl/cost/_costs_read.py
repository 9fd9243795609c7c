"""Reading a costs file (``placement_rl.cost.costs_file``): JSON or YAML that refuses a key given twice, and its
values -- numbers, per-device entries keyed by device name, model or kind, node names -- each a ``ProfileError`` line
naming the file and the entry to fix."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


class _DuplicateKey(ValueError):
    """A key given twice in one JSON object or YAML mapping (the parsers would keep the last in silence)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, refusing a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key '{key}' is given twice in one object")
        out[key] = value
    return out


def _unique_yaml_loader() -> type:
    """A ``yaml.SafeLoader`` that refuses a mapping key given twice (merge keys ``<<`` may still be overridden)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = self.construct_object(key_node, deep=deep)
                    if key in seen:
                        mark = key_node.start_mark
                        raise _DuplicateKey(f"key '{key}' is given twice in one mapping (line {mark.line + 1})")
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)
    return UniqueKeyLoader


def _read(path: str | os.PathLike) -> tuple[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"costs file '{p}' does not exist")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{p}: cannot read costs file ({exc.__class__.__name__})") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            return str(p), _load_yaml(p, text)
        try:
            return str(p), json.loads(text, object_pairs_hook=_unique_pairs)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{p}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise ProfileError(f"{p}: {exc}: give each entry once") from None


def _load_yaml(p: Path, text: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_unique_yaml_loader())  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ProfileError(f"{p}: malformed YAML ({str(exc).splitlines()[0]})") from None


def _number(where: str, value: Any, *, what: str) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 4.0e6 (no sign in the exponent) as a string, as the topology reader
        try:                    # takes it
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{where}: {what} must be a number >= 0, got {value!r}")
    return float(value)


def _per_device(where: str, value: Any, topology: DeviceTopology, what: str, scale: float) -> np.ndarray:
    """One value per device from a number or a mapping keyed by device name, model or kind."""
    if not isinstance(value, Mapping):
        return np.full(topology.num_devices, _number(where, value, what=what) * scale)
    out = np.empty(topology.num_devices)
    for j, dev in enumerate(topology.devices):
        key = next((k for k in (dev.name, dev.model, dev.kind) if k and k in value), None)
        if key is None:
            raise ProfileError(f"{where}: {what} has no entry for device '{dev.name}' (kind {dev.kind}"
                               f"{', model ' + dev.model if dev.model else ''}): give one keyed by its name, model "
                               "or kind")
        out[j] = _number(where, value[key], what=f"{what}['{key}']") * scale
    return out


def _node_name(at: str, value: Any, what: str) -> str:
    """A node name where the file must give one (a list or a mapping there is one line, not a ``TypeError``)."""
    if not isinstance(value, str):
        raise ProfileError(f"{at}: {what} must be a node name, got {value!r}")
    return value


def _warn(text: str) -> None:
    """One warning line on stderr."""
    import sys

    print(f"warning: {text}", file=sys.stderr)


def _device_keys(topology: DeviceTopology) -> set[str]:
    """What a per-device mapping may be keyed by: the topology's device names, models and kinds."""
    return {k for dev in topology.devices for k in (dev.name, dev.model, dev.kind) if k}


def _coarsened(graph: CompGraph) -> str:
    """The hint for a node name the graph lacks where the command coarsened it (a group renamed even one node)."""
    if graph.members and any(len(m) > 1 or m[0] != nm for nm, m in zip(graph.names, graph.members)):
        return (" (this graph is coarsened: its nodes are groups of the captured ones, named by module path; "
                "graph.coarsen.enabled=false keeps the names the file uses)")
    return ""
