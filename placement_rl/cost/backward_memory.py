"""Backward working memory: the gradient buffers autograd holds while one node's backward runs.

A training step's backward holds, on top of everything saved for it, the gradient of the output of the node whose
backward is running (its consumers' backward made it) and the gradients of its inputs that it produces. ``grad_bytes``
is that sum per node, at the graph's batch:

* a tensor carries a gradient when it depends on a parameter (model inputs, position ids, masks and integer targets
  do not); in a graph without parameters every node's does (the simulators time its backward all the same);
* the output's gradient: the node's ``out_bytes``; its inputs' gradients: its incoming edges from tensors that carry
  one, once per producer (its largest edge), none for views and pass-through ops (``graph.op_classes`` classes
  ``view`` and ``ew_pass``: their input's gradient is the output's, or a view of it);
* a fused cross-entropy (``F.cross_entropy``: ``log_softmax`` and ``nll_loss`` captured as one node) also holds the
  gradient of its internal log-probabilities, the size of its input: an LM's loss holds two logits-sized tensors
  (``2 x b x s x V x 4`` bytes in fp32; with a real vocabulary more than its layers' activations);
* a coarsened group: the largest of its members' (they run their backward one at a time), from the graph it was
  made from (``graph.members.member_graph``); a group without that record, its own (its ``out_bytes`` is the sum of
  its members' outputs: an upper bound).

Stage plans (``cost.pipeline``): per stage, the largest ``grad_bytes`` of its nodes for one micro-batch (``/ (m p)``,
as its activations; a TP rank's share under TP, from the sharded graph) is added to the stage's memory at each
backward, on top of the micro-batches then in flight (and, in a recomputed region, with the region's recomputed
activations: ``cost.recompute``). So the peak is the larger of the forward-phase peak and the backward-phase peak
plus this transient. Op-level placement (``cost.simulate``) does not price it yet.

Not modelled: the gradient a tensor read by several consumers accumulates into, scratch memory inside kernels,
gradients of parameters (in the training state, ``cost.memory``), and that a step's first backward runs before any
parameter gradient exists (the state counts them throughout, so the priced peak is the larger).
"""

from __future__ import annotations

import weakref

import numpy as np

from placement_rl.graph.ir import CompGraph
from placement_rl.graph.op_classes import base_name, op_class

FUSED_LOSSES = frozenset({"cross_entropy_loss", "cross_entropy", "binary_cross_entropy_with_logits"})  # hold an
# internal tensor of their input's size whose gradient exists during their backward
_PASS = ("view", "ew_pass")
_CACHE: "weakref.WeakKeyDictionary[CompGraph, np.ndarray]" = weakref.WeakKeyDictionary()


def grad_bytes(graph: CompGraph) -> np.ndarray:
    """float [N]: bytes of the gradients a node's backward holds at once (its output's and the inputs' it makes; see
    the module docstring), at the graph's batch; cached per graph, read-only."""
    got = _CACHE.get(graph)
    if got is None:
        got = _grouped(graph)
        got.setflags(write=False)
        _CACHE[graph] = got
    return got


def _grouped(graph: CompGraph) -> np.ndarray:
    if graph.members is None:
        return _own(graph, by_class=True)
    from placement_rl.graph.members import member_graph

    fine = member_graph(graph)
    if fine is None:  # no record of its members: the group's own bytes, an upper bound
        return _own(graph, by_class=False)
    g0, gof = fine
    out = np.zeros(graph.num_nodes)
    np.maximum.at(out, gof, grad_bytes(g0))
    return out


def carries_gradient(graph: CompGraph) -> np.ndarray:
    """bool [N]: whether a node's output carries a gradient (it depends on a parameter; every node in a graph
    without parameters)."""
    seed = np.asarray(graph.param_bytes) > 0
    if not seed.any():
        return np.ones(graph.num_nodes, dtype=bool)
    out = seed.copy()
    ptr, idx = graph.pred_ptr, graph.pred_idx
    for v in graph.topo_order:
        if not out[v] and out[idx[ptr[v]:ptr[v + 1]]].any():
            out[v] = True
    return out


def _own(graph: CompGraph, by_class: bool) -> np.ndarray:
    n = graph.num_nodes
    carries = carries_gradient(graph)
    in_grad, largest = np.zeros(n), np.zeros(n)
    if graph.num_edges:
        src, dst, eb = graph.edges[:, 0], graph.edges[:, 1], np.asarray(graph.edge_bytes, dtype=np.float64)
        keep = carries[src]
        per = np.zeros(0)
        if keep.any():  # once per (consumer, producer): the largest edge
            key = dst[keep] * n + src[keep]
            order = np.argsort(key, kind="stable")
            key, b = key[order], eb[keep][order]
            start = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
            per = np.maximum.reduceat(b, start)
            cons = key[start] // n
            np.add.at(in_grad, cons, per)
            np.maximum.at(largest, cons, per)
    if by_class:
        ops = graph.op_types
        for v in range(n):
            name = base_name(str(ops[v]))
            if name in FUSED_LOSSES:
                in_grad[v] += largest[v]
            elif op_class(str(ops[v]), float(graph.param_bytes[v]), float(graph.fwd_flops[v])) in _PASS:
                in_grad[v] = 0.0
    return np.where(carries, np.asarray(graph.out_bytes, dtype=np.float64) + in_grad, 0.0)


def stage_grad_bytes(graph: CompGraph, stage_of_node: np.ndarray, num_stages: int) -> np.ndarray:
    """float [S]: each stage's largest ``grad_bytes`` at the graph's batch (per micro-batch and replica: divide by
    ``m p``, as the pipeline kernel does)."""
    out = np.zeros(num_stages)
    np.maximum.at(out, np.asarray(stage_of_node, dtype=np.int64), grad_bytes(graph))
    return out


__all__ = ["FUSED_LOSSES", "carries_gradient", "grad_bytes", "stage_grad_bytes"]
