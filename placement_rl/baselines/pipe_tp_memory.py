"""The memory a stage of a TP / pipeline plan holds, counted as the simulator counts it, for ``pipe_tp``'s cut
search: the plan's batch over the graph's (``_size_ratio``) and the bytes a stage's parts of recomputed regions
keep (``_kept``)."""

from __future__ import annotations

import numpy as np

from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import graph_batch_size


def _size_ratio(pp: PipeProblem) -> float:
    """The plan's batch over the graph's own (1.0 where either is unknown): the simulator scales activations and
    crossing tensors by it (``PipelineSimulator.size_ratio``)."""
    own = graph_batch_size(pp.graph)
    return 1.0 if pp.batch_size is None or own is None else float(pp.batch_size) / own


def _kept(run: CompGraph, rid: np.ndarray, pos: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """``[G, G]``: for a stage of positions ``[grid[a], grid[b])``, the bytes its parts of the regions ``rid`` keep
    for their recomputation: each part's inputs from outside it, once per producer with its largest such edge
    (``cost.recompute.kept_bytes`` of the stage's own parts; ``run``: the graph a rank runs, ``pos``: each node's
    position). A producer inside the region is outside the part where it lies before the stage. The largest edge of
    a producer into a part is summed over weight levels: level ``w`` adds ``w`` less the level below it wherever an
    edge of at least ``w`` enters the part, which its first such edge at or after ``grid[a]`` decides."""
    size, n = len(grid), len(pos)
    out = np.zeros((size, size))
    src, dst = (run.edges[:, 0], run.edges[:, 1]) if run.num_edges else (np.zeros(0, np.int64),) * 2
    into = rid[dst] >= 0
    src, dst, w, reg = src[into], dst[into], run.edge_bytes[into], rid[dst[into]]
    if not src.size:
        return out
    first_of = np.where(rid[src] == reg, pos[src], -1)  # the part takes the edge only from a stage after this
    pair = np.unique(np.stack([src, reg], axis=1), axis=0, return_inverse=True)[1].ravel()
    by = np.lexsort((w, pair))
    pair, w, at, first_of = pair[by], w[by], pos[dst[by]], first_of[by]
    new_level = np.concatenate([[True], (pair[1:] != pair[:-1]) | (w[1:] != w[:-1])])
    level = np.cumsum(new_level) - 1  # per edge: its (producer, region, weight) level
    heads = np.flatnonzero(new_level)
    new_pair = np.concatenate([[True], pair[heads[1:]] != pair[heads[:-1]]])
    step = w[heads] - np.where(new_pair, 0.0, np.concatenate([[0.0], w[heads[:-1]]]))
    lowest = np.maximum.accumulate(np.where(new_pair, np.arange(heads.size), 0))[level]  # the pair's first level
    count = level - lowest + 1  # an edge enters every level of its pair up to its own
    edge = np.repeat(np.arange(level.size), count)
    lev = lowest[edge] + np.arange(edge.size) - np.repeat(np.cumsum(count) - count, count)
    keys = np.sort(lev * (n + 1) + at[edge])
    # per level and start cut a: the first edge of the level entering at or after grid[a]
    ask = (np.arange(heads.size)[:, None] * (n + 1) + grid[None, :]).ravel()
    got = np.minimum(np.searchsorted(keys, ask), keys.size - 1)
    hit = keys[got] - (ask - np.tile(grid, heads.size))  # its position, where it is of the level
    ok = (keys[got] >= ask) & (hit < n)
    ok &= np.tile(grid, heads.size) > np.repeat(first_of[heads], size)
    rows = np.tile(np.arange(size), heads.size)
    np.add.at(out, (rows[ok], np.searchsorted(grid, hit[ok], side="right")), np.repeat(step, size)[ok])
    return np.cumsum(out, axis=1)
