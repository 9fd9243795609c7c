"""The repeated layers of a captured graph (``blocks.3``, ``model.layers.3``, ``transformer.h.3``) and the modules
around them: the granularity at which trainers cut pipelines (``placement_rl.export``) and recompute activations
(``placement_rl.cost.recompute``).

``modules(graph) -> Modules``: the layer container is the ``prefix.<i>`` of ``graph.module_paths`` with the most
distinct ``i``; every node gets the key of its layer (``prefix.<i>``) or of the module around the layers it belongs
to (its path cut to the container's depth), or None (the root, or a module holding the layers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph

_LAYER = re.compile(r"^(.*?)\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class Modules:
    """The graph's modules at export granularity: ``key[v]`` (None: a node of no such module, e.g. the loss),
    ``order`` (keys in program order), ``layer`` (key -> layer index, transformer layers only)."""

    key: tuple[str | None, ...]
    order: tuple[str, ...]
    layer: dict[str, int]
    container: str


def modules(graph: CompGraph) -> Modules:
    """Find the repeated layer container (the ``prefix.<i>`` with the most distinct ``i``) and key every node."""
    counts: dict[str, set[int]] = {}
    for p in graph.module_paths:
        m = _LAYER.match(p)
        if m:
            counts.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not counts:
        raise PlanError(f"graph '{graph.name}' has no repeated layers (module paths like 'layers.0'): torchtitan and "
                        "Megatron-LM split models between layers")
    container = max(counts, key=lambda c: (len(counts[c]), -len(c)))
    depth = container.count(".") + 1
    keys: list[str | None] = []
    layer: dict[str, int] = {}
    for p in graph.module_paths:
        if p.startswith(container + "."):
            idx = p[len(container) + 1:].split(".")[0]
            k = f"{container}.{idx}"
            layer[k] = int(idx)
        elif not p or container.startswith(p + "."):
            k = None  # the root, or a module holding the layers: no stage of its own
        else:
            k = ".".join(p.split(".")[:depth])
        keys.append(k)
    order: list[str] = []
    seen = set()
    for v in graph.topo_order.tolist():
        k = keys[v]
        if k is not None and k not in seen:
            seen.add(k)
            order.append(k)
    return Modules(tuple(keys), tuple(order), layer, container)


__all__ = ["Modules", "modules"]
