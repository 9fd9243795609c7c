"""Build a graph from a plain spec (what the ``graph`` config group holds): a JSON file, a zoo model or a
synthetic family, then the configured coarsening.

    graph_from_spec({"source": "zoo", "name": "gpt", "overrides": {"n_layer": 4},
                     "coarsen": {"enabled": True, "depth": None, "max_nodes": None}})
    graph_from_spec({"path": "graph.json"})
    graph_from_spec({"source": "synthetic", "family": "layered", "num_nodes": 200, "seed": 0})
    graph_from_spec({"source": "hf", "config": "config.json", "overrides": {"num_hidden_layers": 4},
                     "batch_size": 1, "seq_len": 2048})   # any transformers model (graph/models/hf_auto.py)

A graph file that is already coarsened (its nodes carry ``members``) is used as it is, merged further only
when ``coarsen.max_nodes`` asks for fewer groups than it has.
"""

from __future__ import annotations

from typing import Any, Mapping

from placement_rl.errors import CaptureError, ConfigError, GraphError
from placement_rl.graph.ir import CompGraph


def graph_from_spec(spec: Mapping[str, Any]) -> CompGraph:
    spec = dict(spec)
    if spec.get("path"):
        graph = CompGraph.from_json(str(spec["path"]))
    else:
        source = spec.get("source", "zoo")
        if source == "zoo":
            from placement_rl.graph.capture import capture_zoo

            if not spec.get("name"):
                raise ConfigError("graph.name is empty: name a zoo model (graph=<name>) or set graph.path")
            graph = capture_zoo(str(spec["name"]), **dict(spec.get("overrides") or {}))
        elif source == "synthetic":
            from placement_rl.graph import synthetic

            try:
                graph = synthetic.sample(str(spec["family"]), num_nodes=int(spec["num_nodes"]),
                                         seed=int(spec.get("seed", 0)))
            except KeyError as exc:
                raise ConfigError(f"a synthetic graph needs graph.{exc.args[0]}") from None
        elif source == "hf":
            graph = _hf_graph(spec)
        else:
            raise ConfigError(f"graph.source is '{source}': choose zoo, synthetic or hf, or set graph.path")
    opts = dict(spec.get("coarsen") or {})
    if opts.pop("enabled", False):
        from placement_rl.graph.coarsen import coarsen

        cap = opts.get("max_nodes")
        fine = graph
        if graph.members is None:
            graph = coarsen(graph, **{k: v for k, v in opts.items() if v is not None})
        elif cap is not None and graph.num_nodes > int(cap):  # already coarsened: only merged further
            graph = coarsen(graph, max_nodes=int(cap))
        if graph is not fine:
            _say_if_serialised(fine, graph)
    return graph


SERIAL_WARN = 2.0  # a coarse graph whose longest path is this many times its source's: said


def longest_path(graph: CompGraph) -> float:
    """The graph's longest path in forward + backward FLOPs (every node at one speed, transfers free)."""
    import numpy as np

    work = graph.fwd_flops + graph.bwd_flops
    best = np.zeros(graph.num_nodes)
    pp, pi = graph.pred_ptr, graph.pred_idx
    for v in graph.topo_order.tolist():
        lo, hi = pp[v], pp[v + 1]
        best[v] = work[v] + (best[pi[lo:hi]].max() if hi > lo else 0.0)
    return float(best.max()) if graph.num_nodes else 0.0


def _say_if_serialised(fine: CompGraph, coarse: CompGraph) -> None:
    """A warning when coarsening lost most of the graph's parallelism (its longest path ``SERIAL_WARN`` x or more the
    source's, every node at one speed and transfers free: groups that run in sequence what the ops ran side by
    side, as merging a wide graph without module paths does): placements and bounds of the groups are then far from
    those of the ops."""
    import logging

    before, after = longest_path(fine), longest_path(coarse)
    if before <= 0 or after < SERIAL_WARN * before:
        return
    total = float((fine.fwd_flops + fine.bwd_flops).sum())
    logging.getLogger(__name__).warning(
        "coarsening '%s' from %d nodes to %d groups made its longest path %.1f x the nodes' (parallelism %.1f -> "
        "%.1f): placements and bounds of the groups can be far slower than placements of the nodes; "
        "graph.coarsen.max_nodes=<more groups> keeps more, graph.coarsen.enabled=false places every node (slower)",
        fine.name, fine.num_nodes, coarse.num_nodes, after / before, total / before, total / after)


HF_KEYS = ("config", "model_type", "task", "overrides", "batch_size", "seq_len", "seed", "attention")


def _hf_graph(spec: Mapping[str, Any]) -> CompGraph:
    """Capture a transformers model built from its config on the meta device (``graph.source=hf``)."""
    from placement_rl.graph.capture import capture
    from placement_rl.graph.models import hf_auto

    opts = {k: spec[k] for k in HF_KEYS if spec.get(k) is not None}
    opts["overrides"] = dict(opts.get("overrides") or {})
    module, inputs, desc = hf_auto.build(**opts)
    name = f"hf:{desc['model_type']}"
    try:
        graph = capture(module, inputs, name=name, meta={"hf": desc, "hf_spec": dict(opts)})
    except CaptureError as exc:  # its reason, not capture's method= / exec_mode= hints (not graph=hf options)
        raise GraphError(f"graph=hf: {desc['class']} ('{desc['model_type']}', {desc['task']}) cannot be captured "
                         f"on meta tensors: {exc.reason}") from None
    if desc["attention"] == "sdpa":
        graph = hf_auto.fused_attention_memory(graph, desc["head_dim"])
    return graph
