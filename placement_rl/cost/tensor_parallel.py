"""Costs of one tensor-parallel rank: what ``simulate_pipeline`` uses for a stage with TP degree ``t > 1``.

Modelled (Megatron-LM TP without sequence parallelism; annotations from ``placement_rl.graph.tp``):

* Split ops (column / row GEMMs, the per-head and per-feature ops between them, vocab-parallel embedding, LM
  head and cross-entropy) run at their smaller shapes: ``shard_graph`` divides their FLOPs, parameters, saved
  activations and sharded tensors by ``t``, and the *same* per-op model that priced the graph prices the shard
  (``resolve_costs``: calibrated GPU model or roofline), so a smaller GEMM runs at its own, lower efficiency and
  a memory-bound op at its own bytes. Measured costs are scaled node by node by the model's ratio
  ``time(shard) / time(whole)`` (exact when the costs are the model's own).
* Replicated ops (norms, residual adds, position embeddings, dropout on the residual stream) run in full on
  every TP rank.
* TP collectives, every micro-batch, blocking (on the stage's critical path, as Megatron runs them): an
  all-reduce of each row GEMM's output and of the vocab-parallel embedding's output in forward, of each pair's
  input gradient and of the LM head's input gradient in backward, and the parallel cross-entropy's three
  one-number-per-token all-reduces; priced by ``collectives.coeff_array`` over the stage's first TP group (the
  measured NCCL fit where the topology names one, else ring / tree over its links), at the micro-batch's bytes
  ``bytes / (m x dp)``, each collective paying its own latency (``collective_counts``: the cross-entropy's bytes
  are three all-reduces, a coarsened group's its members' collectives).
* Memory: parameters, gradients and Adam state of split ops divided by ``t``, saved activations of split ops
  divided by ``t`` (replicated ones not, nor the whole input a column GEMM or the LM head keeps without sequence
  parallelism: ``TPAnnotation.col_act``), on top of which DP / FSDP shard as usual over the stage's DP group.
* Sequence parallelism (``StagePlan.sequence_parallel``, Megatron-SP): the replicated token-wise ops between TP
  regions (norms, dropout, residual adds: ``TPAnnotation.seq_frac``) run on 1/t of the sequence (FLOPs, saved
  activations, outputs / t), and each TP all-reduce of n bytes becomes a reduce-scatter plus an all-gather of n
  bytes (equal to it in the ring model; a measured NCCL fit prices them apart). Not modelled: the all-reduce of the
  norms' parameter gradients over the TP group, the pipeline boundary's tensors being 1/t (priced whole).
* Vocabulary padding (Megatron's ``make_vocab_size_divisible_by``, ``StagePlan.make_vocab_size_divisible_by``,
  default 128): the vocab-parallel embedding table, the LM head GEMM, the logits and the parallel cross-entropy
  are priced at the padded vocabulary ``ceil(V / (128 t)) 128 t`` over ``t`` (``graph.tp.padded_vocab``).

Not modelled: overlap of TP communication with compute, contention between the TP groups of one host and the
DP / pipeline traffic on shared links, the all-reduce's reduction compute, uneven splits (a degree that does
not divide the heads / hidden sizes is refused; the vocabulary is padded instead).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.tp import VOCAB_DIVISIBLE_BY, TPAnnotation, annotation, shard_graph
from placement_rl.graph.tp_detect import KINDS, SCHEMA_VERSION, collectives
from placement_rl.topology import DeviceTopology


def tp_cost_table(graph: CompGraph, costs: CostTable, topology: DeviceTopology, tp: int,
                  ann: TPAnnotation | None = None, *, divisible_by: int = VOCAB_DIVISIBLE_BY,
                  sequence_parallel: bool = False) -> tuple[CostTable, CompGraph]:
    """``(costs, shard)``: per-node times of one rank of a TP group of ``tp`` and the graph it runs (vocabulary
    padded to a multiple of ``divisible_by x tp``, Megatron's rule; 0: unpadded)."""
    if tp == 1:
        return costs, graph
    from placement_rl.cost.resolve import resolve_costs

    ann = ann if ann is not None else annotation(graph)
    shard = shard_graph(graph, tp, ann, divisible_by=divisible_by, sequence_parallel=sequence_parallel)
    whole, part = resolve_costs(graph, topology), resolve_costs(shard, topology)
    split = split_nodes(ann, sequence_parallel=sequence_parallel)[:, None]

    def scaled(have: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        r = np.divide(b, a, out=np.ones_like(b), where=a > 0)
        return np.where(split, have * r, have)

    fwd, bwd = scaled(costs.fwd_time, whole.fwd_time, part.fwd_time), scaled(costs.bwd_time, whole.bwd_time,
                                                                              part.bwd_time)
    return dataclasses.replace(costs, fwd_time=fwd, bwd_time=bwd,
                               launch_overhead=np.minimum(costs.launch_overhead, fwd),
                               meta={**dict(costs.meta), "tp": tp}), shard


def split_nodes(ann: TPAnnotation, *, sequence_parallel: bool = False) -> np.ndarray:
    """bool [N]: the nodes a TP rank runs at a smaller shape (their costs scaled by ``tp_cost_table``); the others
    (norms, residual adds, position embeddings, ...) run whole on every rank."""
    split = (ann.frac_flops > 0) | (ann.frac_params > 0) | (ann.frac_act > 0) | (ann.frac_out > 0)
    if sequence_parallel and ann.seq_frac is not None:
        split = split | (ann.seq_frac > 0)
    return np.asarray(split, dtype=bool)


def collective_counts(graph: CompGraph, ann: TPAnnotation) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd, bwd)`` float [N], each at least 1: how many TP collectives a node's ``ann.ar_fwd`` / ``ann.ar_bwd``
    bytes are, every micro-batch (``tp_detect.collectives``: three for the parallel cross-entropy, else one per op
    with bytes); a coarsened group's, the sum over its members (each collective pays its own latency). From the
    annotation's op kinds, so a graph file written before the counts were priced gets them too."""
    if graph.members is None:
        names = [KINDS[k] for k in ann.kind]
        fwd = np.array([collectives(k) for k in names], dtype=np.float64) * (ann.ar_fwd > 0)
        return np.maximum(fwd, 1.0), np.ones(graph.num_nodes)
    data = graph.meta.get("tp")
    if not isinstance(data, Mapping) or data.get("version") != SCHEMA_VERSION:  # no annotation: no bytes to count
        return np.ones(graph.num_nodes), np.ones(graph.num_nodes)
    kinds, arf, arb = (dict(data.get(key) or {}) for key in ("nodes", "ar_fwd", "ar_bwd"))
    fwd = [sum(collectives(kinds.get(m)) for m in grp if arf.get(m, 0) > 0) for grp in graph.members]
    bwd = [sum(1 for m in grp if arb.get(m, 0) > 0) for grp in graph.members]
    return np.maximum(np.array(fwd, dtype=np.float64), 1.0), np.maximum(np.array(bwd, dtype=np.float64), 1.0)


def collective_times(table: np.ndarray, nbytes: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Seconds of ``count`` collectives sharing ``nbytes`` evenly, per node (``segment_times`` of each share)."""
    return count * segment_times(table, nbytes / count)


def segment_times(table: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Vectorised ``comm_fit.segment_time``: ``alpha + beta * n`` of the first row with ``n < upper``; 0 bytes: 0."""
    upper = table[:, 0]
    k = np.minimum(np.searchsorted(upper, nbytes, side="right"), len(upper) - 1)
    out = table[k, 1] + table[k, 2] * nbytes
    return np.where(nbytes > 0, out, 0.0)


__all__ = ["collective_counts", "collective_times", "segment_times", "split_nodes", "tp_cost_table"]
