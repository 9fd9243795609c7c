"""METIS k-way partitioning (pymetis) of the communication-weighted graph, balanced by compute.

Vertex weight = mean fwd + bwd time, edge weight = bytes (both scaled to positive integers, the
undirected sum of both directions); target partition weights are proportional to the speed of the device
that will receive the partition. For every ``k = 2 .. D`` the ``k`` fastest devices are used, the heaviest
partition goes to the fastest device, and each candidate is simulated; the best (feasible first) is kept.
``k = 1`` (all on the fastest device) is tried too, so METIS never loses to its own trivial case.

The METIS C library ``printf``s ``***Cannot bisect a graph with 0 vertices!`` whenever its initial recursive
bisection leaves a side with fewer vertices than parts (a small graph, heavy vertices, many devices: the partition
then just has empty parts, which is fine here). Each call runs with the process's stdout (file descriptor 1)
pointed at ``os.devnull`` so that chatter never reaches the user; a lock keeps concurrent calls from restoring
each other's descriptor. The partitions, and so the placements, are unchanged.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator

import numpy as np
import pymetis

from placement_rl.baselines.common import Problem
from placement_rl.baselines.memory import repair

SCALE = 10_000  # integer resolution of the METIS weights
_STDOUT_LOCK = threading.Lock()  # one redirect of file descriptor 1 at a time (see the module doc)


@contextlib.contextmanager
def _quiet_c_stdout() -> Iterator[None]:
    """Send what C code writes to file descriptor 1 to ``os.devnull`` for the duration (Python's own buffered
    output is flushed first, so nothing printed before is lost); a no-op where fd 1 cannot be duplicated."""
    with _STDOUT_LOCK:
        try:
            sys.stdout.flush()
        except (AttributeError, OSError, ValueError):
            pass
        try:
            saved = os.dup(1)
        except OSError:
            yield
            return
        try:
            with open(os.devnull, "w") as sink:
                os.dup2(sink.fileno(), 1)
                try:
                    yield
                finally:
                    os.dup2(saved, 1)
        finally:
            os.close(saved)


def _csr_undirected(prob: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g, n = prob.graph, prob.n
    if g.num_edges == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    src, dst = g.edges[:, 0], g.edges[:, 1]
    a, b = np.minimum(src, dst), np.maximum(src, dst)
    key, inv = np.unique(a * n + b, return_inverse=True)
    wts = np.bincount(inv, weights=g.edge_bytes)
    top = wts.max() if wts.size and wts.max() > 0 else 1.0
    iw = np.maximum(np.rint(wts / top * SCALE), 1).astype(np.int64)
    u, v = key // n, key % n
    rows, cols, w = np.concatenate([u, v]), np.concatenate([v, u]), np.concatenate([iw, iw])
    order = np.lexsort((cols, rows))
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.add.at(xadj, rows + 1, 1)
    return np.cumsum(xadj), cols[order], w[order]


def metis(prob: Problem) -> np.ndarray:
    n = prob.n
    fastest = prob.device_order
    work = prob.node_time.mean(axis=1)
    top = work.max() if work.max() > 0 else 1.0
    vw = np.maximum(np.rint(work / top * SCALE), 1).astype(np.int64)
    xadj, adjncy, ew = _csr_undirected(prob)
    speed = 1.0 / np.maximum(prob.node_time.sum(axis=0), 1e-30)
    best = np.full(n, int(fastest[0]), dtype=np.int64)
    best_key = None
    s = prob.score(best)
    if s is not None:
        best_key = s.key
    for k in range(2, min(prob.d, n) + 1):
        if best_key is not None and prob.left <= 0:
            break
        devs = fastest[:k]
        tp = speed[devs] / speed[devs].sum()
        tp[-1] = 1.0 - tp[:-1].sum()
        opts = pymetis.Options(seed=prob.seed % (2**31), ufactor=30)
        with _quiet_c_stdout():
            _, parts = pymetis.part_graph(k, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw, eweights=ew,
                                          tpwgts=tp.tolist(), options=opts)
        parts = np.asarray(parts, dtype=np.int64)
        # heaviest partition -> fastest device
        weight = np.bincount(parts, weights=work, minlength=k)
        dev_of_part = np.empty(k, dtype=np.int64)
        dev_of_part[np.argsort(-weight, kind="stable")] = devs
        cand = repair(prob, dev_of_part[parts])
        s = prob.score(cand)
        if s is None:
            if best_key is None:
                best = cand
            break
        if best_key is None or s.key < best_key:
            best, best_key = cand, s.key
    return best


MEMORY_UFACTORS = (10, 30)  # the imbalance METIS may leave in ``memory_splits`` (x 1/1000 of a part's target)
MEMORY_SEEDS = 3  # METIS seeds per imbalance (which split fits after ``memory.fit`` moves with the seed)


def memory_splits(prob: Problem) -> list[np.ndarray]:
    """Partitions of the communication-weighted graph into ``D`` parts balanced by the bytes each node pins, part
    ``k``'s share of them ``k``'s share of the devices' memory (per ``MEMORY_UFACTORS``, ``MEMORY_SEEDS`` seeds
    each): few tensors cross devices, so few are received and kept, the start a memory-tight cluster needs when the
    one-pass placements overflow (``search.anneal`` makes each fit with ``memory.fit``)."""
    mem = prob.node_mem
    top = mem.max() if prob.n and mem.max() > 0 else 1.0
    vw = np.maximum(np.rint(mem / top * SCALE), 1).astype(np.int64)
    xadj, adjncy, ew = _csr_undirected(prob)
    cap = np.asarray(prob.capacity, dtype=np.float64)
    tp = cap / cap.sum()
    tp[-1] = 1.0 - tp[:-1].sum()
    out = []
    for uf, k in ((uf, k) for uf in MEMORY_UFACTORS for k in range(MEMORY_SEEDS)):
        opts = pymetis.Options(seed=(prob.seed + k) % (2**31), ufactor=uf)
        with _quiet_c_stdout():
            _, parts = pymetis.part_graph(prob.d, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw, eweights=ew,
                                          tpwgts=tp.tolist(), options=opts)
        out.append(np.asarray(parts, dtype=np.int64))
    return out
