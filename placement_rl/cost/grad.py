"""Which nodes of a graph need a gradient (the backward pass the cost model prices runs only there)."""

from __future__ import annotations

import numpy as np

from placement_rl.graph.ir import CompGraph


def needs_grad(graph: CompGraph) -> np.ndarray:
    """``True`` where a node's output needs a gradient: it or an ancestor has parameters or bwd flops."""
    need = (graph.param_bytes > 0) | (graph.bwd_flops > 0)
    pp, pi = graph.pred_ptr, graph.pred_idx
    for v in graph.topo_order.tolist():
        if not need[v] and pp[v + 1] > pp[v]:
            need[v] = bool(need[pi[pp[v]:pp[v + 1]]].any())
    return need
