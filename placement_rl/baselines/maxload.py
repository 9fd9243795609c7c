"""Max-load (throughput) splits of a max-load instance (``placement_rl.graph.maxload_file``; the model of Tarnawski
et al., NeurIPS 2020): the time per sample of a pipeline is its busiest device's load, an accelerator's load its
nodes' accelerator times plus the cost of every output crossing its boundary (once per source, sent or received),
a CPU core's its nodes' CPU times. Nodes of one colour class share a device, an accelerator holds at most
``max_size`` bytes and only nodes it supports.

``blocks_of`` groups the nodes into blocks (colour classes; classes on a cycle of the forward graph merged, and
idle classes with one neighbour merged into it, which keeps the optimum). ``contiguous_dp`` finds the best
contiguous split (each device holds the difference of two ideals of a chain, so the devices form a pipeline whose
forward edges never go back) by dynamic programming over every ideal of the block graph, blocks with no edge placed
after it; past ``ideal_limit`` ideals it keeps blocks with one neighbour beside it, then cuts at the prefixes of one
topological order, and says the split is not proven optimal. ``improve`` makes single moves (any split);
``maxload_solve.solve`` runs them and CP-SAT (``maxload_cp``). ``evaluate`` scores any split, ``lower_bound`` holds
for every split, contiguous or not, and ``enumerate_splits`` checks tiny instances.
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
    of each block's predecessor blocks), per-block sums, and ``free`` (blocks with no edge to another block, which
    the dynamic program leaves out and places last)."""

    block: np.ndarray
    count: int
    preds: list[int]
    acc: np.ndarray
    cpu: np.ndarray
    size: np.ndarray
    bad: np.ndarray
    free: np.ndarray


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


def _classes(inst: MaxLoadInstance) -> tuple[np.ndarray, int]:
    """Colour class per node (a node without one is its own), numbered ``0 .. m-1``."""
    key: dict[int, int] = {}
    cls = np.empty(inst.num_nodes, dtype=np.int64)
    for v in range(inst.num_nodes):
        c = int(inst.colour[v])
        cls[v] = key.setdefault(c, len(key)) if c >= 0 else key.setdefault(-(v + 1) - 2**40, len(key))
    return cls, len(key)


def precedence(inst: MaxLoadInstance) -> list[tuple[int, int]]:
    """The node pairs ``(u, v)`` whose order a contiguous split keeps: every forward edge, and every backward edge
    touching a class with no forward node, mirrored (such a class sits where its gradient flow puts it)."""
    cls, m = _classes(inst)
    has_fwd = np.zeros(m, dtype=bool)
    has_fwd[cls[~inst.backward]] = True
    bwd = inst.backward
    out = []
    for u, v in inst.edges.tolist():
        if not bwd[u] and not bwd[v]:
            out.append((u, v))
        elif bwd[u] and bwd[v] and (not has_fwd[cls[u]] or not has_fwd[cls[v]]):
            out.append((v, u))
    return out


def blocks_of(inst: MaxLoadInstance, *, contiguous: bool = True) -> Blocks:
    """The colour classes, and a class with no time and no bytes whose every edge goes to one other class merged
    into it (beside it it costs nothing and saves its transfers, so the best split of either kind is kept); for
    ``contiguous`` splits also the classes on one cycle of the ``precedence`` graph merged (a contiguous split
    cannot separate them; a split of any shape can, so the searches for one and the bound use the classes)."""
    import networkx as nx

    cls, m = _classes(inst)
    g = nx.DiGraph()
    g.add_nodes_from(range(m))
    g.add_edges_from((int(cls[u]), int(cls[v])) for u, v in precedence(inst) if cls[u] != cls[v])
    parent = list(range(m))
    if contiguous:
        for comp in nx.strongly_connected_components(g):
            comp = sorted(comp)
            for c in comp[1:]:
                parent[_find(parent, c)] = _find(parent, comp[0])
    _merge_idle(inst, cls, parent)
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
    linked = np.zeros(count, dtype=bool)
    ends = block[inst.edges] if len(inst.edges) else np.zeros((0, 2), dtype=np.int64)
    cross = ends[ends[:, 0] != ends[:, 1]]
    linked[cross.ravel()] = True
    free = ~linked if linked.any() else np.arange(count) > 0
    acc = np.bincount(block, weights=inst.acc, minlength=count)
    cpu = np.bincount(block, weights=inst.cpu, minlength=count)
    size = np.bincount(block, weights=inst.size, minlength=count)
    bad = np.bincount(block, weights=(~inst.supported).astype(float), minlength=count)
    return Blocks(block, count, preds, acc, cpu, size, bad, free)


def _merge_idle(inst: MaxLoadInstance, cls: np.ndarray, parent: list[int]) -> None:
    """Merge (in ``parent``) every class with no time, no bytes and no node an accelerator cannot run whose edges
    all go to one other class into that class, until none is left."""
    load = np.abs(inst.acc) + np.abs(inst.cpu) + np.abs(inst.size) + (~inst.supported)
    busy: dict[int, bool] = {}
    for v in range(inst.num_nodes):
        r = _find(parent, int(cls[v]))
        busy[r] = busy.get(r, False) or bool(load[v] > 0)
    nbrs: dict[int, set[int]] = {}
    for u, v in inst.edges.tolist():
        a, b = _find(parent, int(cls[u])), _find(parent, int(cls[v]))
        if a != b:
            nbrs.setdefault(a, set()).add(b)
            nbrs.setdefault(b, set()).add(a)
    work = [r for r, ns in nbrs.items() if len(ns) == 1 and not busy.get(r, True)]
    while work:
        r = work.pop()
        if _find(parent, r) != r or len(nbrs.get(r, ())) != 1 or busy.get(r, True):
            continue
        (target,) = nbrs.pop(r)
        parent[r] = target
        nbrs[target].discard(r)
        if len(nbrs[target]) == 1 and not busy.get(target, True):
            work.append(target)


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


def merge_pendants(inst: MaxLoadInstance, blocks: Blocks) -> Blocks:
    """Coarser blocks: each block whose edges all go to one other block (with more than one neighbour itself)
    merged into it. A smaller space of splits (a block beside its only neighbour), for graphs with too many
    ideals."""
    ends = blocks.block[inst.edges] if len(inst.edges) else np.zeros((0, 2), dtype=np.int64)
    nbrs: list[set[int]] = [set() for _ in range(blocks.count)]
    for a, b in ends[ends[:, 0] != ends[:, 1]].tolist():
        nbrs[a].add(b)
        nbrs[b].add(a)
    target = np.arange(blocks.count)
    for b in range(blocks.count):
        if len(nbrs[b]) == 1:
            (t,) = nbrs[b]
            if len(nbrs[t]) > 1:
                target[b] = t
    _, renum = np.unique(target, return_inverse=True)
    count = int(renum.max()) + 1
    block = renum[blocks.block]
    preds = [0] * count
    for y in range(blocks.count):
        bits = blocks.preds[y]
        while bits:
            low = bits & -bits
            x = low.bit_length() - 1
            if renum[x] != renum[y]:
                preds[renum[y]] |= 1 << int(renum[x])
            bits ^= low

    def total(values):
        return np.bincount(renum, weights=values, minlength=count)

    free = np.bincount(renum, weights=(~blocks.free).astype(float), minlength=count) < 0.5
    return Blocks(block, count, preds, total(blocks.acc), total(blocks.cpu), total(blocks.size), total(blocks.bad),
                  free)


def _sources(inst: MaxLoadInstance, blocks: Blocks, pos: np.ndarray):
    """Per source node with a consumer in another block: its block, cost, and its consumers' blocks (CSR), blocks
    numbered by ``pos``."""
    src_block, src_cost, ptr, cons = [], [], [0], []
    by_src: dict[int, set[int]] = {}
    for u, v in inst.edges.tolist():
        bu, bv = int(blocks.block[u]), int(blocks.block[v])
        if bu != bv:
            by_src.setdefault(u, set()).add(int(pos[bv]))
    for u in sorted(by_src):
        if inst.out_cost[u] <= 0:
            continue
        src_block.append(int(pos[blocks.block[u]]))
        src_cost.append(float(inst.out_cost[u]))
        cons.extend(sorted(by_src[u]))
        ptr.append(len(cons))
    return (np.array(src_block, dtype=np.int64), np.array(src_cost, dtype=np.float64),
            np.array(ptr, dtype=np.int64), np.array(cons, dtype=np.int64))


def _prefix_family(preds: list[int], count: int) -> np.ndarray:
    order, placed = [], 0
    remaining = set(range(count))
    while remaining:
        ready = min(b for b in remaining if preds[b] & placed == preds[b])
        order.append(ready)
        remaining.discard(ready)
        placed |= 1 << ready
    members = np.zeros((count + 1, count), dtype=bool)
    for k, b in enumerate(order):
        members[k + 1:, b] = True
    return members


def _core(blocks: Blocks, *, every: bool = False) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The blocks the dynamic program splits (those with an edge, or ``every`` block), their positions and
    predecessor masks."""
    core = np.arange(blocks.count) if every else np.flatnonzero(~blocks.free)
    pos = np.full(blocks.count, -1, dtype=np.int64)
    pos[core] = np.arange(len(core))
    preds = []
    for y in core.tolist():
        mask, bits = 0, blocks.preds[y]
        while bits:
            low = bits & -bits
            mask |= 1 << int(pos[low.bit_length() - 1])
            bits ^= low
        preds.append(mask)
    return core, pos, preds


def _backtrack(choice, sub, members, cpus, accelerators) -> list[tuple[int, np.ndarray]]:
    """The dynamic program's sets in pipeline order, each with its kind (2: a CPU core, 3: an accelerator)."""
    c, a, jj = cpus, accelerators, members.shape[0] - 1
    stages = []
    while jj != 0:
        kind, ii = int(choice[c, a, jj]), int(sub[c, a, jj])
        if kind in (0, 2):
            c -= 1
        else:
            a -= 1
        if kind >= 2:
            stages.append((kind, members[jj] & ~members[ii]))
            jj = ii
    return stages[::-1]


@dataclass
class _Family:
    """Ideals the dynamic program cuts at: of ``blocks`` restricted to ``core``, whether they are all of them."""

    blocks: Blocks
    core: np.ndarray
    pos: np.ndarray
    members: np.ndarray
    complete: bool


def _families(inst: MaxLoadInstance, blocks: Blocks, ideal_limit: int, linear: bool) -> tuple[list[_Family], str]:
    """Every ideal of the block graph where there are at most ``ideal_limit`` (those of the blocks with an edge where
    the blocks with none make too many); past it, the ideals of the graph with blocks of one neighbour kept beside it
    (while that shrinks it) and the prefixes of one topological order, both tried (with a note saying so)."""
    core, pos, preds = _core(blocks, every=True)
    if linear:
        return [_Family(blocks, core, pos, _prefix_family(preds, len(core)), False)], ""
    members = enumerate_ideals_masks(preds, len(core), limit=ideal_limit)
    if members is None and blocks.free.any():  # each block with no edge doubles the ideals: place them after
        core, pos, preds = _core(blocks)
        members = enumerate_ideals_masks(preds, len(core), limit=ideal_limit)
    if members is not None:
        return [_Family(blocks, core, pos, members, True)], ""
    out = [_Family(blocks, core, pos, _prefix_family(preds, len(core)), False)]
    coarse, merged = blocks, 0
    while True:
        coarser = merge_pendants(inst, coarse)
        if coarser.count == coarse.count:
            break
        merged += coarse.count - coarser.count
        coarse = coarser
        c_core, c_pos, c_preds = _core(coarse)
        members = enumerate_ideals_masks(c_preds, len(c_core), limit=ideal_limit)
        if members is not None:
            out.append(_Family(coarse, c_core, c_pos, members, False))
            break
    tried = (f"the ideals with {merged} classes of one neighbour kept beside it and " if len(out) > 1 else "")
    return out, (f"more than {ideal_limit} ideals: the better of {tried}the prefixes of one topological order, not "
                 "proven optimal (raise --ideals for the full space)")


def contiguous_dp(inst: MaxLoadInstance, blocks: Blocks, *, ideal_limit: int = IDEAL_LIMIT, linear: bool = False,
                  progress: Callable[[str], None] | None = None) -> Split:
    """The best contiguous split by dynamic programming over the ideals of the block graph (see the module doc);
    where blocks with no edge make too many ideals, they join it last, each on the device it raises least.
    ``linear``: over the prefixes of one topological order only (the splits of a linearised graph, as PipeDream
    plans). Raises ``GraphError`` where no contiguous split fits."""
    t0 = time.perf_counter()
    families, note = _families(inst, blocks, ideal_limit, linear)
    best, pairs = None, 0
    for fam in families:
        got = _dp_split(inst, fam, progress, t0)
        pairs += got.stats["ideal_pairs"]
        if got.max_load < np.inf and (best is None or got.max_load < best.max_load):
            best = got
    if best is None or not np.isfinite(best.max_load):
        raise GraphError(f"{inst.path}: no contiguous split fits: {_why_infeasible(inst, blocks)}")
    best.notes[:0] = [note] if note else []
    best.stats.update(ideal_pairs=float(pairs), seconds=time.perf_counter() - t0)
    return best


def _dp_split(inst: MaxLoadInstance, fam: _Family, progress, t0: float) -> Split:
    """The dynamic program over one family; a split of max-load inf where none fits."""
    blocks, core, members = fam.blocks, fam.core, fam.members
    words = _words(members)
    card = members.sum(axis=1)
    fm = members.astype(np.float64)
    acc, cpu, size, bad = (fm @ blocks.acc[core], fm @ blocks.cpu[core], fm @ blocks.size[core],
                           fm @ blocks.bad[core])
    src = _sources(inst, blocks, fam.pos)
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
        if progress is not None and time.perf_counter() - last > 10.0:
            last = time.perf_counter()
            progress(f"dynamic program: {j}/{k} ideals, {pairs} pairs, {last - t0:.0f} s")
    best = float(f[inst.cpus, inst.accelerators, k - 1])
    stats = {"ideals": float(k), "ideal_pairs": float(pairs), "dp_value": best, "free_classes": 0.0}
    if not np.isfinite(best):
        return Split(np.zeros(inst.num_nodes, dtype=np.int64), np.zeros(0), np.inf, "", False, [], stats)
    device_of_block = np.full(blocks.count, -1, dtype=np.int64)
    counts = {2: 0, 3: 0}
    for kind, blk in _backtrack(choice, sub, members, inst.cpus, inst.accelerators):
        first = 0 if kind == 3 else inst.accelerators  # the first stage gets the first device of its kind
        device_of_block[core[blk]] = first + counts[kind]
        counts[kind] += 1
    loose = np.flatnonzero(device_of_block < 0)
    if len(loose) and not _place_free(inst, blocks, device_of_block, loose):
        return Split(np.zeros(inst.num_nodes, dtype=np.int64), np.zeros(0), np.inf, "", False, [], stats)
    device = device_of_block[blocks.block]
    loads, _ = evaluate(inst, device)
    optimum = fam.complete and float(loads.max()) <= best * (1 + 1e-12)
    notes = []
    if fam.complete and not optimum:
        notes.append(f"{len(loose)} classes with no edge placed last on the least-loaded device that holds them: the "
                     f"split without them ({best:.6g}) bounds the best contiguous one")
    stats["free_classes"] = float(len(loose))
    return Split(device, loads, float(loads.max()), "contiguous DP over ideals", optimum, notes, stats)


def _place_free(inst: MaxLoadInstance, blocks: Blocks, device_of_block: np.ndarray, loose: np.ndarray) -> bool:
    """Blocks with no edge, largest first, each on the device whose load it raises least (an accelerator only
    where it fits and runs); False where one fits nowhere."""
    na, nd = inst.accelerators, inst.accelerators + inst.cpus
    placed = device_of_block >= 0
    loads = evaluate(inst, np.where(placed, device_of_block, 0)[blocks.block])[0]
    loads[0] -= (blocks.acc if na else blocks.cpu)[loose].sum()  # they have no edge: only their times moved
    mem = np.bincount(device_of_block[placed], weights=blocks.size[placed], minlength=nd)
    for b in sorted(loose.tolist(), key=lambda x: -max(blocks.acc[x], blocks.cpu[x])):
        best, arg = np.inf, -1
        for d in range(nd):
            if d < na and (blocks.bad[b] > 0.5 or mem[d] + blocks.size[b] > inst.max_size * (1 + 1e-12)):
                continue
            new = loads[d] + (blocks.acc[b] if d < na else blocks.cpu[b])
            if new < best:
                best, arg = new, d
        if arg < 0:
            return False
        device_of_block[b], loads[arg], mem[arg] = arg, best, mem[arg] + blocks.size[b]
    return True


def _why_infeasible(inst: MaxLoadInstance, blocks: Blocks) -> str:
    if inst.cpus == 0 and (blocks.bad > 0.5).any():
        return ("some nodes cannot run on an accelerator (or share a colour class, or what a contiguous split keeps "
                "with one, with such a node) and there is no CPU core (maxCPUs 0)")
    if inst.cpus == 0 and (blocks.size > inst.max_size).any():
        return ("a colour class (with what a contiguous split keeps with it) is larger than maxSizePerFPGA and "
                "there is no CPU core")
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
           "enumerate_splits", "merge_pendants", "precedence", "split_json"]
