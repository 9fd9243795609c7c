"""Max-load (throughput) splits of a max-load instance (``placement_rl.graph.maxload_file``; the model of Tarnawski
et al., NeurIPS 2020): the time per sample of a pipeline is its busiest device's load, an accelerator's load its
nodes' accelerator times plus the cost of every output crossing its boundary (once per source, sent or received),
a CPU core's its nodes' CPU times. Nodes of one colour class share a device, an accelerator holds at most
``max_size`` bytes and only nodes it supports.

``maxload_solve.solve(instance)`` finds the optimal contiguous split (each device holds the difference of two ideals of a chain,
so the devices form a pipeline whose forward edges never go back) by dynamic programming over every ideal of the
graph of colour classes (all of them up to ``ideal_limit``; past it the prefixes of one topological order, and the
result says it is not proven optimal), then tries single moves of a class to another device (a split that need not
be contiguous) while the max-load falls. ``evaluate(instance, device)`` scores any split; ``lower_bound`` holds for
every split, contiguous or not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from placement_rl.baselines._maxload_kernel import device_loads, maxload_dp
from placement_rl.errors import GraphError
from placement_rl.graph.ideals import enumerate_ideals_masks
from placement_rl.graph.maxload_file import MaxLoadInstance

IDEAL_LIMIT = 20_000


@dataclass(frozen=True, eq=False)
class Blocks:
    """Colour classes merged until their forward graph is a DAG: ``block`` per node, ``count``, ``preds`` (bit mask
    of each block's predecessor blocks) and per-block sums."""

    block: np.ndarray
    count: int
    preds: list[int]
    acc: np.ndarray
    cpu: np.ndarray
    size: np.ndarray
    bad: np.ndarray


@dataclass
class Split:
    """A split: ``device`` per node (accelerators ``0 .. A-1``, CPU cores ``A ..``), ``loads`` per device, its
    ``max_load``, what found it and whether it is proven the best contiguous split."""

    device: np.ndarray
    loads: np.ndarray
    max_load: float
    method: str
    contiguous_optimum: bool = False
    notes: list[str] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


def _find(parent: list[int], x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def blocks_of(inst: MaxLoadInstance) -> Blocks:
    """The colour classes (a node without one is its own), each class's backward-only part placed by mirroring its
    backward edges, and classes on one cycle of the resulting forward graph merged (a contiguous split cannot
    separate them)."""
    import networkx as nx

    n = inst.num_nodes
    key: dict[int, int] = {}
    cls = np.empty(n, dtype=np.int64)
    for v in range(n):
        c = int(inst.colour[v])
        cls[v] = key.setdefault(c, len(key)) if c >= 0 else key.setdefault(-(v + 1) - 2**40, len(key))
    m = len(key)
    has_fwd = np.zeros(m, dtype=bool)
    has_fwd[cls[~inst.backward]] = True
    g = nx.DiGraph()
    g.add_nodes_from(range(m))
    bwd = inst.backward
    for u, v in inst.edges.tolist():
        a, b = int(cls[u]), int(cls[v])
        if a == b:
            continue
        if not bwd[u] and not bwd[v]:
            g.add_edge(a, b)
        elif bwd[u] and bwd[v] and (not has_fwd[a] or not has_fwd[b]):
            g.add_edge(b, a)  # a class with only backward nodes sits where its gradient flow puts it
    parent = list(range(m))
    for comp in nx.strongly_connected_components(g):
        comp = sorted(comp)
        for c in comp[1:]:
            parent[_find(parent, c)] = _find(parent, comp[0])
    roots = sorted({_find(parent, c) for c in range(m)})
    renum = {r: k for k, r in enumerate(roots)}
    of_class = np.array([renum[_find(parent, c)] for c in range(m)], dtype=np.int64)
    block = of_class[cls]
    count = len(roots)
    preds = [0] * count
    for a, b in g.edges():
        x, y = int(of_class[a]), int(of_class[b])
        if x != y:
            preds[y] |= 1 << x
    acc = np.bincount(block, weights=inst.acc, minlength=count)
    cpu = np.bincount(block, weights=inst.cpu, minlength=count)
    size = np.bincount(block, weights=inst.size, minlength=count)
    bad = np.bincount(block, weights=(~inst.supported).astype(float), minlength=count)
    return Blocks(block, count, preds, acc, cpu, size, bad)


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
    for c in np.unique(inst.colour[inst.colour >= 0]):
        if len(np.unique(device[inst.colour == c])) > 1:
            broken.append(f"colour class {c} is split over devices")
            break
    return loads, broken


def lower_bound(inst: MaxLoadInstance, blocks: Blocks | None = None) -> float:
    """A bound on the max-load of every split: the largest class at its cheapest device that can hold it, and the
    least total time over the number of devices (communication left out)."""
    b = blocks or blocks_of(inst)
    fits = (b.bad < 0.5) & (b.size <= inst.max_size * (1 + 1e-12)) & (inst.accelerators > 0)
    on_acc = np.where(fits, b.acc, np.inf)
    on_cpu = b.cpu if inst.cpus > 0 else np.full(b.count, np.inf)
    cheapest = np.minimum(on_acc, on_cpu)
    return float(max(cheapest.max(), cheapest.sum() / (inst.accelerators + inst.cpus)))


def _words(members: np.ndarray) -> np.ndarray:
    k, n = members.shape
    nw = max(1, (n + 63) // 64)
    padded = np.zeros((k, nw * 64), dtype=bool)
    padded[:, :n] = members
    packed = np.packbits(padded, axis=1, bitorder="little")
    return np.ascontiguousarray(packed.view(np.uint64).reshape(k, nw))


def _sources(inst: MaxLoadInstance, blocks: Blocks):
    """Per source node with a consumer in another block: its block, cost, and its consumers' blocks (CSR)."""
    src_block, src_cost, ptr, cons = [], [], [0], []
    by_src: dict[int, set[int]] = {}
    for u, v in inst.edges.tolist():
        bu, bv = int(blocks.block[u]), int(blocks.block[v])
        if bu != bv:
            by_src.setdefault(u, set()).add(bv)
    for u in sorted(by_src):
        if inst.out_cost[u] <= 0:
            continue
        src_block.append(int(blocks.block[u]))
        src_cost.append(float(inst.out_cost[u]))
        cons.extend(sorted(by_src[u]))
        ptr.append(len(cons))
    return (np.array(src_block, dtype=np.int64), np.array(src_cost, dtype=np.float64),
            np.array(ptr, dtype=np.int64), np.array(cons, dtype=np.int64))


def _prefix_family(blocks: Blocks) -> np.ndarray:
    order, placed = [], 0
    remaining = set(range(blocks.count))
    while remaining:
        ready = min(b for b in remaining if blocks.preds[b] & placed == blocks.preds[b])
        order.append(ready)
        remaining.discard(ready)
        placed |= 1 << ready
    members = np.zeros((blocks.count + 1, blocks.count), dtype=bool)
    for k, b in enumerate(order):
        members[k + 1:, b] = True
    return members


def contiguous_dp(inst: MaxLoadInstance, blocks: Blocks, *, ideal_limit: int = IDEAL_LIMIT,
                  progress: Callable[[str], None] | None = None) -> Split:
    """The best contiguous split by dynamic programming over the ideals of the block graph (see the module doc)."""
    t0 = time.perf_counter()
    members = enumerate_ideals_masks(blocks.preds, blocks.count, limit=ideal_limit)
    complete = members is not None
    notes = []
    if not complete:
        members = _prefix_family(blocks)
        notes.append(f"more than {ideal_limit} ideals: split at the prefixes of one topological order only, not "
                     "proven optimal (raise --ideals for the full space)")
    words = _words(members)
    card = members.sum(axis=1)
    fm = members.astype(np.float64)
    acc, cpu, size, bad = fm @ blocks.acc, fm @ blocks.cpu, fm @ blocks.size, fm @ blocks.bad
    src = _sources(inst, blocks)
    k = members.shape[0]
    f = np.full((inst.cpus + 1, inst.accelerators + 1, k), np.inf)
    f[:, :, 0] = 0.0
    choice = np.full(f.shape, -1, dtype=np.int64)
    sub = np.full(f.shape, -1, dtype=np.int64)
    pairs, j, step, last = 0, 1, 1, time.perf_counter()
    while j < k:
        hi = min(k, j + step)
        t = time.perf_counter()
        pairs += maxload_dp(words, card, acc, cpu, size, bad, inst.max_size, *src, j, hi, f, choice, sub)
        step = max(1, min(4 * step, int(step * 0.5 / max(time.perf_counter() - t, 1e-6))))
        j = hi
        if progress is not None and time.perf_counter() - last > 2.0:
            last = time.perf_counter()
            progress(f"dynamic program: {j}/{k} ideals, {pairs} pairs, {last - t0:.0f} s")
    best = float(f[inst.cpus, inst.accelerators, k - 1])
    if not np.isfinite(best):
        raise GraphError(f"{inst.path}: no split fits: {_why_infeasible(inst, blocks)}")
    device_of_block = np.full(blocks.count, -1, dtype=np.int64)
    c, a, jj = inst.cpus, inst.accelerators, k - 1
    stages = []
    while jj != 0:
        kind, ii = int(choice[c, a, jj]), int(sub[c, a, jj])
        if kind == 0:
            c -= 1
        elif kind == 1:
            a -= 1
        else:
            stages.append((kind, members[jj] & ~members[ii]))
            if kind == 2:
                c -= 1
            else:
                a -= 1
            jj = ii
    n_acc = n_cpu = 0
    for kind, blk in reversed(stages):  # pipeline order: the first stage gets the first device of its kind
        if kind == 3:
            device_of_block[blk] = n_acc
            n_acc += 1
        else:
            device_of_block[blk] = inst.accelerators + n_cpu
            n_cpu += 1
    device = device_of_block[blocks.block]
    loads, _ = evaluate(inst, device)
    stats = {"ideals": float(k), "ideal_pairs": float(pairs), "seconds": time.perf_counter() - t0,
             "dp_value": best}
    return Split(device, loads, float(loads.max()), "contiguous DP over ideals", complete, notes, stats)


def _why_infeasible(inst: MaxLoadInstance, blocks: Blocks) -> str:
    if inst.cpus == 0 and (blocks.bad > 0.5).any():
        return "some nodes cannot run on an accelerator and there is no CPU core (maxCPUs 0)"
    if inst.cpus == 0 and (blocks.size > inst.max_size).any():
        return "a colour class is larger than maxSizePerFPGA and there is no CPU core"
    return (f"the graph does not fit {inst.accelerators} accelerators of {inst.max_size:.6g} bytes as a "
            "pipeline (raise maxFPGAs or maxSizePerFPGA)")


def improve(inst: MaxLoadInstance, blocks: Blocks, start: Split, *, seconds: float) -> Split:
    """Single moves of a block to another device that lower (max-load, sum of squared loads) and keep the split
    feasible, until none does or ``seconds`` pass; the result need not be contiguous."""
    t0 = time.perf_counter()
    n_dev = inst.accelerators + inst.cpus
    edges = _sorted_edges(inst)
    dev_block = np.empty(blocks.count, dtype=np.int64)
    dev_block[blocks.block] = start.device
    members = [np.flatnonzero(blocks.block == b) for b in range(blocks.count)]

    def score(device):
        loads = device_loads(device, inst.accelerators, n_dev, inst.acc, inst.cpu, edges, inst.out_cost)
        return (float(loads.max()), float((loads ** 2).sum())), loads

    device = start.device.copy()
    best, loads = score(device)
    mem = np.bincount(dev_block, weights=blocks.size, minlength=n_dev)
    moves, improved = 0, True
    while improved and time.perf_counter() - t0 < seconds:
        improved = False
        for b in np.argsort(-blocks.acc):
            src = dev_block[b]
            for d in range(n_dev):
                if d == src or (d < inst.accelerators and (blocks.bad[b] > 0.5 or mem[d] + blocks.size[b]
                                                           > inst.max_size * (1 + 1e-12))):
                    continue
                device[members[b]] = d
                cand, cand_loads = score(device)
                if cand < best:
                    best, loads = cand, cand_loads
                    mem[src] -= blocks.size[b]
                    mem[d] += blocks.size[b]
                    dev_block[b] = src = d
                    moves += 1
                    improved = True
                else:
                    device[members[b]] = src
            if time.perf_counter() - t0 >= seconds:
                break
    notes = [] if not improved else [f"local search stopped at its {seconds:g} s"]
    stats = {"moves": float(moves), "seconds": time.perf_counter() - t0}
    return Split(device, loads, best[0], "single moves from the contiguous split", False, notes,
                 stats)


def split_json(inst: MaxLoadInstance, split: Split) -> dict:
    """The split in the solvers' output format (``maxLoad``, ``fpgas`` and ``cpus`` as ``{load, nodes}``, empty
    devices left out), with what found it."""
    groups: dict[str, list] = {"fpgas": [], "cpus": []}
    for d in range(inst.accelerators + inst.cpus):
        nodes = sorted(inst.ids[v] for v in np.flatnonzero(split.device == d))
        if nodes:
            groups["fpgas" if d < inst.accelerators else "cpus"].append({"load": float(split.loads[d]),
                                                                         "nodes": nodes})
    return {"maxLoad": split.max_load, **groups, "method": split.method,
            "contiguous_optimum": split.contiguous_optimum, "notes": split.notes, **split.stats}


__all__ = ["IDEAL_LIMIT", "Blocks", "Split", "blocks_of", "contiguous_dp", "evaluate", "improve", "lower_bound",
           "split_json"]
