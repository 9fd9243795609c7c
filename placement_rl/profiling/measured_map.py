"""Map public measurements onto the project's own captured graphs, and build a ``ProfileDB`` from them.

NeuSight labels (``torch.fx`` nodes of one transformer layer plus embedding and head) map onto a graph captured
from ``gpt2_hf`` / ``bert_hf`` / ``opt_hf`` with the same configuration: per module path (the zoo wrapper's
``model.`` dropped, every layer index sent to layer 0 since NeuSight measured one layer) the i-th op of a cost
class in the captured module takes the i-th measured op of that class in the same module, then leftovers match
within the parent module. PipeDream layers map onto a captured CNN by class order (the i-th convolution takes
the i-th measured ``Conv2d`` ...; scalar updates inside a layer, such as batch norm's counter, map to zero).
View ops (no kernel) map to zero. ``MapResult`` says what mapped.

``mapped_profile(...)`` turns a mapping into a ``ProfileDB`` that ``resolve_costs`` reads like one measured
here: its label names the dataset, workload and GPU (``neusight-<GPU>-<workload>``). Nodes that did not map
are filled with the calibrated estimate and listed in the DB (``graphs[fp]["filled"]``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from placement_rl.graph.op_classes import op_class

_LAYER = re.compile(r"\.(h|layer|layers)\.\d+(\.|$)")


@dataclass(frozen=True)
class MapResult:
    fwd: np.ndarray            # [N] seconds (mapped measurements; 0 for views; nan where unmapped)
    bwd: np.ndarray
    source: tuple[str, ...]    # per node: the measured node's name, "view" or "" (unmapped)

    @property
    def mapped(self) -> int:
        return sum(1 for s in self.source if s and s != "view")

    @property
    def views(self) -> int:
        return sum(1 for s in self.source if s == "view")

    @property
    def unmapped(self) -> list[int]:
        return [i for i, s in enumerate(self.source) if not s]


def _norm(path: str, wrapper: bool = False) -> str:
    """A module path with every layer index sent to 0; ``wrapper=True`` also drops the zoo's loss wrapper
    (``model.``) that a captured graph's paths start with (a measured path keeps its own ``model.``, as OPT's)."""
    p = path[len("model."):] if wrapper and path.startswith("model.") else path
    return _LAYER.sub(lambda m: f".{m.group(1)}.0{m.group(2)}", p)


def map_neusight(workload, graph) -> MapResult:
    """Map a NeuSight ``LabelWorkload`` onto a captured ``gpt2_hf`` / ``bert_hf`` / ``opt_hf`` graph (same config)."""
    rows = [r for r in workload.rows if r.op_type not in ("input", "get_attr", "output")]
    pools: dict[tuple[str, str], list] = defaultdict(list)
    for r in rows:
        c = op_class(r.op_type, r.param_bytes, r.fwd_flops)
        if c != "view":
            pools[(_norm(r.module_path), c)].append(r)
    n = graph.num_nodes
    fwd, bwd = np.full(n, np.nan), np.full(n, np.nan)
    source = [""] * n
    taken: dict[tuple[str, str], int] = defaultdict(int)
    pending = []
    for i in range(n):
        c = op_class(graph.op_types[i], graph.param_bytes[i], graph.fwd_flops[i])
        if c == "view":
            fwd[i], bwd[i], source[i] = 0.0, 0.0, "view"
            continue
        key = (_norm(graph.module_paths[i], wrapper=True), c)
        pool = pools.get(key, [])
        if taken[key] < len(pool) and (pool is not None):
            r = pool[taken[key]]
            taken[key] += 1
            fwd[i], bwd[i], source[i] = r.fwd, r.bwd, r.name
        else:
            pending.append((i, key))
    for i, (path, c) in pending:  # leftovers: a measured op of the class in a child or parent module
        for (mpath, mc), pool in pools.items():
            if mc != c or taken[(mpath, mc)] >= len(pool):
                continue
            if mpath.startswith(path + ".") or path.startswith(mpath + ".") or mpath == path.rsplit(".", 1)[0]:
                r = pool[taken[(mpath, mc)]]
                taken[(mpath, mc)] += 1
                fwd[i], bwd[i], source[i] = r.fwd, r.bwd, r.name
                break
    return MapResult(fwd, bwd, tuple(source))


def map_pipedream(profile, graph) -> MapResult:
    """Map a ``PipeDreamProfile`` onto a captured CNN by class order (same batch and image size assumed)."""
    pools: dict[str, list] = defaultdict(list)
    for x in profile.layers:
        c = op_class(x.op_type, x.param_bytes)
        if x.op_type != "input" and c != "view":
            pools[c].append(x)
    n = graph.num_nodes
    fwd, bwd = np.full(n, np.nan), np.full(n, np.nan)
    source = [""] * n
    used: dict[str, int] = defaultdict(int)
    for i in range(n):
        c = op_class(graph.op_types[i], graph.param_bytes[i], graph.fwd_flops[i])
        if c == "view" or (graph.out_bytes[i] <= 8 and graph.fwd_flops[i] == 0 and c != "loss"):
            # no kernel, or a scalar update inside a measured layer (batch norm's num_batches_tracked += 1)
            fwd[i], bwd[i], source[i] = 0.0, 0.0, "view"
        elif used[c] < len(pools[c]):
            x = pools[c][used[c]]
            used[c] += 1
            fwd[i], bwd[i], source[i] = x.fwd, x.bwd, x.node
    return MapResult(fwd, bwd, tuple(source))


def mapped_profile(graph, result: MapResult, *, label: str, gpu_model: str, device_name: str = "gpu0",
                   fill_topology=None):
    """A ``ProfileDB`` holding ``result`` for ``graph`` on a device named ``device_name``.

    Unmapped nodes take the calibrated estimate on ``fill_topology``'s first device (a preset of the same
    GPU); they are listed under ``graphs[fp]["filled"]``.
    """
    from placement_rl.cost import resolve_costs
    from placement_rl.profiling.db import SCHEMA, VERSION, ProfileDB

    fwd, bwd = result.fwd.copy(), result.bwd.copy()
    missing = np.isnan(fwd)
    filled: list[str] = []
    if missing.any():
        if fill_topology is None:
            from placement_rl.errors import ProfileError

            raise ProfileError(f"{int(missing.sum())} nodes of '{graph.name}' have no measurement: "
                               "give fill_topology (a preset of the same GPU) to estimate them")
        est = resolve_costs(graph, fill_topology.subset([0]))
        fwd[missing], bwd[missing] = est.fwd_time[missing, 0], est.bwd_time[missing, 0]
        filled = [graph.names[i] for i in np.flatnonzero(missing)]
    data = {"schema": SCHEMA, "version": VERSION,
            "env": {"host": "neusight", "source": label, "created": "imported"},
            "devices": {device_name: {"torch_device": "cuda:0", "kind": "gpu", "host": f"imported:{label}",
                                      "model": gpu_model}},
            "graphs": {graph.fingerprint(): {
                "name": graph.name, "nodes": list(graph.names), "signatures": [], "step": {},
                "times": {device_name: {nm: [float(f), 0.0, float(b), 0.0, 1] for nm, f, b in
                                        zip(graph.names, fwd, bwd)}},
                "filled": filled}},
            "ops": {}, "links": []}
    return ProfileDB(Path(f"{label}.json"), data=data)


def layer_weights(graph, num_layer: int) -> np.ndarray:
    """Multiplicity of each node of a one-layer capture in the ``num_layer`` model (layer-0 nodes x L)."""
    return np.array([float(num_layer) if re.search(r"\.(h|layer|layers)\.0(\.|$)", m) else 1.0
                     for m in graph.module_paths])


def coverage(result: MapResult, measured_total: float, weights: Sequence[float] | None = None) -> float:
    """Share of the measured time (fwd + bwd, weighted) that the mapping placed on graph nodes."""
    w = np.ones_like(result.fwd) if weights is None else np.asarray(weights, dtype=float)
    got = np.nansum(w * (np.nan_to_num(result.fwd) + np.nan_to_num(result.bwd)))
    return float(got / measured_total) if measured_total > 0 else 0.0


ZOO_OF_MODEL = {"gpt2_large": "gpt2_hf", "gpt3_xl": "gpt2_hf", "gpt3_27": "gpt2_hf", "bert_large": "bert_hf",
                "opt_13": "opt_hf"}


def zoo_config(workload) -> tuple[str, dict] | None:
    """The project zoo model and overrides (one layer) of a NeuSight workload, or None (no zoo entry).

    ``d_model`` comes from the embedding's output shape and ``n_heads`` from the attention scores' shape;
    NeuSight's GPT-3 configurations are GPT-2 architectures (``transformers.models.gpt2``)."""
    from placement_rl.profiling.neusight import VOCAB

    zoo = ZOO_OF_MODEL.get(workload.model)
    if zoo is None:
        return None
    emb = next((r for r in workload.rows if r.op_type == "embedding" and r.output_shape), None)
    # attention scores: [B, heads, T, T] (matmul), or [B * heads, T, T] (bmm, as OPT's attention runs it)
    att = next((r for r in workload.rows if r.op_type in ("matmul", "bmm") and len(r.output_shape) in (3, 4)
                and r.output_shape[-1] == r.output_shape[-2] == workload.seq_len), None)
    if emb is None or att is None:
        return None
    heads = att.output_shape[1] if len(att.output_shape) == 4 else att.output_shape[0] // max(workload.batch, 1)
    return zoo, dict(batch_size=workload.batch, seq_len=workload.seq_len, d_model=int(emb.output_shape[-1]),
                     n_layers=1, n_heads=int(heads), vocab_size=VOCAB[workload.model])
