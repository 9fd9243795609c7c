"""Max-load (throughput) splits of a max-load instance (``placement_rl.graph.maxload_file``; the model of Tarnawski
et al., NeurIPS 2020): the time per sample of a pipeline is its busiest device's load, an accelerator's load its
nodes' accelerator times plus the cost of every output crossing its boundary (once per source, sent or received),
a CPU core's its nodes' CPU times. Nodes of one colour class share a device, an accelerator holds at most
``max_size`` bytes and only nodes it supports.

This module scores splits (``evaluate``), bounds them (``lower_bound``, for every split, contiguous or not),
improves one by local search (``improve``; any shape), enumerates tiny instances (``enumerate_splits``), writes
a split in the solvers' format (``split_json``) and lets the searches run on no more devices of a kind than there
are blocks (``fewer_devices``, ``widen``). The units a split assigns are ``maxload_blocks``'; the best
contiguous split is ``maxload_dp``'s, CP-SAT's split of any shape ``maxload_cp``'s, and ``maxload_solve.solve``
runs them all.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from placement_rl.baselines._maxload_kernel import device_loads
from placement_rl.baselines._maxload_search import MAXLOAD, local_search, score_split
from placement_rl.baselines.maxload_blocks import Blocks, blocks_of, precedence
from placement_rl.errors import GraphError
from placement_rl.graph.maxload_file import MaxLoadInstance


KICK = 8  # the most blocks one kick of the local search moves
PATIENCE = 10  # local optima in a row without a better split, per block and device, before the search stops


@dataclass
class Split:
    """A split: ``device`` per node (accelerators ``0 .. A-1``, CPU cores ``A ..``), ``loads`` per device, its
    ``max_load``, what found it and whether it is proven the best contiguous split (None: not known, as for a given
    split, which is scored but not compared with one)."""

    device: np.ndarray
    loads: np.ndarray
    max_load: float
    method: str
    contiguous_optimum: bool | None = False
    notes: list[str] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


def _sorted_edges(inst: MaxLoadInstance) -> np.ndarray:
    e = inst.edges
    return np.ascontiguousarray(e[np.argsort(e[:, 0], kind="stable")]) if len(e) else e.reshape(0, 2)


def evaluate(inst: MaxLoadInstance, device: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per-device loads of a split and what it breaks (memory, unsupported nodes, colour classes split); accelerators
    first. A split that breaks something is scored all the same."""
    device = np.asarray(device, dtype=np.int64)
    n_dev = inst.accelerators + inst.cpus
    loads = device_loads(device, inst.accelerators, n_dev, inst.acc, inst.cpu, _sorted_edges(inst), inst.out_cost)
    broken = []
    on_acc = device < inst.accelerators
    mem = np.bincount(device[on_acc], weights=inst.size[on_acc], minlength=inst.accelerators)
    for d in np.flatnonzero(mem > inst.max_size * (1 + 1e-12)):
        broken.append(f"accelerator {d} holds {mem[d]:.6g} bytes, over maxSizePerFPGA {inst.max_size:.6g}")
    unsupported = np.flatnonzero(on_acc & ~inst.supported)
    if len(unsupported):
        broken.append(f"{len(unsupported)} nodes an accelerator cannot run are on one (first: node "
                      f"{inst.ids[unsupported[0]]})")
    _, first, cls = np.unique(inst.colour, return_index=True, return_inverse=True)
    lead = first[cls.reshape(-1)]  # the first node of each node's colour class
    apart = np.flatnonzero(device != device[lead])
    if len(apart):
        v = int(apart[0])
        u = int(lead[v])
        on = [f"accelerator {d}" if d < inst.accelerators else f"CPU core {d - inst.accelerators}"
              for d in (int(device[u]), int(device[v]))]
        broken.append(f"a colour class is split over devices: node {inst.ids[u]} on {on[0]}, node {inst.ids[v]} "
                      f"on {on[1]}")
    return loads, broken


def lower_bound(inst: MaxLoadInstance, blocks: Blocks | None = None) -> float:
    """A bound on the max-load of every split: the largest class at its cheapest device that can hold it, and the
    least total time over the number of devices (communication left out); ``blocks`` default to the colour classes
    (``blocks_of(inst, contiguous=False)``: blocks merged for contiguous splits would bound those alone)."""
    b = blocks or blocks_of(inst, contiguous=False)
    fits = (b.bad < 0.5) & (b.size <= inst.max_size * (1 + 1e-12)) & (inst.accelerators > 0)
    on_acc = np.where(fits, b.acc, np.inf)
    on_cpu = b.cpu if inst.cpus > 0 else np.full(b.count, np.inf)
    cheapest = np.minimum(on_acc, on_cpu)
    return float(max(cheapest.max(), cheapest.sum() / (inst.accelerators + inst.cpus)))


def fewer_devices(inst: MaxLoadInstance, count: int) -> MaxLoadInstance:
    """``inst`` with at most ``count`` accelerators and ``count`` CPU cores (``inst`` itself where it has no more):
    a split of ``count`` blocks, each whole on one device, uses at most that many devices of a kind, and devices of
    a kind are interchangeable, so the best splits are the same while the searches' work, which grows with the
    devices, is bounded. ``widen`` maps a split of it back."""
    if inst.accelerators <= count and inst.cpus <= count:
        return inst
    return dataclasses.replace(inst, accelerators=min(inst.accelerators, count), cpus=min(inst.cpus, count))


def widen(inst: MaxLoadInstance, small: MaxLoadInstance, split: Split) -> Split:
    """A split of ``fewer_devices(inst, ...)`` (``small``) as a split of ``inst``: its CPU cores numbered after all
    of ``inst``'s accelerators (``widen_devices``), the loads of every device of ``inst``."""
    if small is inst:
        return split
    device = widen_devices(inst, small, split.device)
    return dataclasses.replace(split, device=device, loads=evaluate(inst, device)[0])


def widen_devices(inst: MaxLoadInstance, small: MaxLoadInstance, device: np.ndarray) -> np.ndarray:
    """Devices of ``fewer_devices(inst, ...)`` (``small``) as devices of ``inst``: the same accelerators, the CPU
    cores after all of ``inst``'s accelerators."""
    device = np.asarray(device, dtype=np.int64)
    return np.where(device >= small.accelerators, device - small.accelerators + inst.accelerators, device)


def improve(inst: MaxLoadInstance, blocks: Blocks, start: Split, *, seconds: float, seed: int = 0) -> Split:
    """Local search from ``start`` for ``seconds`` (``_maxload_search``): moves of a block, and of a block with its
    neighbours on its device, to another device while they lower (max-load, sum of squared loads); at each local
    optimum a kick (a connected group of blocks on one device moved elsewhere) from the best split so far. The
    result need not be contiguous; it keeps every block whole, memory and the nodes accelerators cannot run. It
    stops early after ``PATIENCE`` x blocks x devices local optima in a row that improve nothing."""
    device, stats = search_blocks(inst, blocks, start.device, inst.accelerators + inst.cpus, MAXLOAD,
                                  seconds=seconds, seed=seed)
    loads, _ = evaluate(inst, device)
    return Split(device, loads, float(loads.max()), "local search from the contiguous split", False, [], stats)


def search_blocks(inst: MaxLoadInstance, blocks: Blocks, start: np.ndarray, n_dev: int, objective: int, *,
                  seconds: float, seed: int = 0) -> tuple[np.ndarray, dict[str, float]]:
    """The local search of ``improve`` for ``objective`` (``_maxload_search.MAXLOAD`` over ``n_dev`` devices, or
    ``LATENCY`` with the CPUs as device ``n_dev - 1``) from the split ``start`` (device per node): the best split
    found (device per node) and its figures."""
    t0 = time.perf_counter()
    nb = blocks.count
    edges = _sorted_edges(inst)
    nodes = np.argsort(blocks.block, kind="stable").astype(np.int64)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(blocks.block, minlength=nb))]).astype(np.int64)
    bu, bv = blocks.block[edges[:, 0]], blocks.block[edges[:, 1]]
    cut = bu != bv
    pairs = np.unique(np.concatenate([np.stack([bu[cut], bv[cut]], 1), np.stack([bv[cut], bu[cut]], 1)]), axis=0)
    aptr = np.concatenate([[0], np.cumsum(np.bincount(pairs[:, 0], minlength=nb))]).astype(np.int64)
    adj = np.ascontiguousarray(pairs[:, 1], dtype=np.int64)
    dev_block = np.empty(nb, dtype=np.int64)
    dev_block[blocks.block] = start
    best_block = dev_block.copy()
    best = np.array(score_split(objective, start.astype(np.int64), inst.accelerators, n_dev, inst.acc, inst.cpu,
                                edges, inst.out_cost))
    scored, chunk, calls, stall = 0, 200, 0, np.zeros(1, dtype=np.int64)
    patience = PATIENCE * nb * n_dev
    while time.perf_counter() - t0 < seconds and stall[0] < patience:  # chunks of about 0.2 s
        t = time.perf_counter()
        scored += local_search(dev_block, best_block, best, ptr, nodes, aptr, adj, inst.accelerators, n_dev,
                               inst.acc, inst.cpu, edges, inst.out_cost, blocks.size, blocks.bad, inst.max_size,
                               KICK, seed + calls, chunk, stall, patience, objective)
        calls += 1
        took, left = time.perf_counter() - t, seconds - (time.perf_counter() - t0)
        chunk = int(max(50, min(4 * chunk, chunk * min(0.2, max(left, 0.0)) / max(took, 1e-6))))
    stats = {"scored": float(scored), "seconds": time.perf_counter() - t0, "stalled": float(stall[0] >= patience)}
    return best_block[blocks.block], stats


def enumerate_splits(inst: MaxLoadInstance, *, limit: int = 1_000_000) -> tuple[float, float]:
    """(the best contiguous max-load, the best max-load) over every assignment of blocks to devices that breaks
    nothing, for tiny instances (at most ``limit`` assignments); a split is contiguous when the quotient of the
    block graph by its devices has no cycle (a pipeline order of the devices exists)."""
    import itertools

    import networkx as nx

    blocks = blocks_of(inst, contiguous=False)
    nd = inst.accelerators + inst.cpus
    if nd ** blocks.count > limit:
        raise GraphError(f"{inst.path}: {nd}^{blocks.count} assignments, more than {limit} to enumerate")
    order = precedence(inst)
    best_contiguous = best_any = np.inf
    for assign in itertools.product(range(nd), repeat=blocks.count):
        device = np.array(assign)[blocks.block]
        loads, broken = evaluate(inst, device)
        if broken:
            continue
        best_any = min(best_any, float(loads.max()))
        quotient = nx.DiGraph((int(device[u]), int(device[v])) for u, v in order if device[u] != device[v])
        if nx.is_directed_acyclic_graph(quotient):
            best_contiguous = min(best_contiguous, float(loads.max()))
    return best_contiguous, best_any


def split_json(inst: MaxLoadInstance, split: Split) -> dict:
    """The split in the solvers' output format (``maxLoad``, ``fpgas`` and ``cpus`` as ``{load, nodes}``, empty
    devices left out), with what found it: ``method``, ``contiguous_optimum`` (null where not known), ``notes`` and
    ``figures`` (the method's own: ``Split.stats``, its ``seconds`` included)."""
    groups: dict[str, list] = {"fpgas": [], "cpus": []}
    for d in range(inst.accelerators + inst.cpus):
        nodes = sorted(inst.ids[v] for v in np.flatnonzero(split.device == d))
        if nodes:
            groups["fpgas" if d < inst.accelerators else "cpus"].append({"load": float(split.loads[d]),
                                                                         "nodes": nodes})
    return {"maxLoad": split.max_load, **groups, "method": split.method,
            "contiguous_optimum": split.contiguous_optimum, "notes": list(split.notes), "figures": dict(split.stats)}


__all__ = ["Split", "enumerate_splits", "evaluate", "fewer_devices", "improve", "lower_bound", "split_json",
           "widen", "widen_devices"]
