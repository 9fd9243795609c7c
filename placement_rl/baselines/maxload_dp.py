"""The best contiguous split of a max-load instance (``placement_rl.baselines.maxload``) by dynamic programming over
the ideals of its block graph (``maxload_blocks``; the kernel in ``_maxload_kernel``).

A contiguous split gives each device the difference of two ideals of one chain, so the devices form a pipeline
whose forward edges never go back. ``contiguous_dp`` enumerates every ideal up to ``ideal_limit`` (those of the
blocks with an edge, placing the blocks with none after, where those make too many); past it, it runs on the ideals
with blocks of one neighbour kept beside it and on the prefixes of one topological order, keeps the better, and
says the split is not proven optimal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from placement_rl.baselines._maxload_kernel import maxload_dp
from placement_rl.baselines.maxload import Split, evaluate, lower_bound
from placement_rl.baselines.maxload_blocks import Blocks, merge_pendants
from placement_rl.errors import GraphError
from placement_rl.graph.ideals import enumerate_ideals_masks
from placement_rl.graph.maxload_file import MaxLoadInstance

IDEAL_LIMIT = 60_000  # as the original dynamic program (dnn-partitioning, throughput-dp), which fails past it


def _words(members: np.ndarray) -> np.ndarray:
    k, n = members.shape
    nw = max(1, (n + 63) // 64)
    padded = np.zeros((k, nw * 64), dtype=bool)
    padded[:, :n] = members
    packed = np.packbits(padded, axis=1, bitorder="little")
    return np.ascontiguousarray(packed.view(np.uint64).reshape(k, nw))


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


def _by_block(src_block: np.ndarray, cons_ptr: np.ndarray, cons: np.ndarray, count: int):
    """Per block, the sources in it or feeding it (CSR over ``_sources``' numbering): the only ones that can cross
    the boundary of a set holding the block."""
    pairs = [(int(b), s) for s, b in enumerate(src_block.tolist())]
    pairs += [(int(c), s) for s in range(len(src_block)) for c in cons[cons_ptr[s]:cons_ptr[s + 1]].tolist()]
    pairs = sorted(set(pairs))
    ptr = np.zeros(count + 1, dtype=np.int64)
    for b, _ in pairs:
        ptr[b + 1] += 1
    return np.cumsum(ptr), np.array([s for _, s in pairs], dtype=np.int64)


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
    preds: list[int]


def _families(inst: MaxLoadInstance, blocks: Blocks, ideal_limit: int, linear: bool) -> tuple[list[_Family], str]:
    """Every ideal of the block graph where there are at most ``ideal_limit`` (those of the blocks with an edge where
    the blocks with none make too many); past it, the ideals of the graph with blocks of one neighbour kept beside it
    (while that shrinks it) and the prefixes of one topological order, both tried (with a note saying so)."""
    core, pos, preds = _core(blocks, every=True)
    if linear:
        return [_Family(blocks, core, pos, _prefix_family(preds, len(core)), False, preds)], ""
    members = enumerate_ideals_masks(preds, len(core), limit=ideal_limit)
    if members is None and blocks.free.any():  # each block with no edge doubles the ideals: place them after
        core, pos, preds = _core(blocks)
        members = enumerate_ideals_masks(preds, len(core), limit=ideal_limit)
    if members is not None:
        return [_Family(blocks, core, pos, members, True, preds)], ""
    out = [_Family(blocks, core, pos, _prefix_family(preds, len(core)), False, preds)]
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
            out.append(_Family(coarse, c_core, c_pos, members, False, c_preds))
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
    if progress is not None and not linear and blocks.count > 200:
        progress(f"dynamic program: enumerating the ideals of {blocks.count} blocks (at most {ideal_limit})")
    families, note = _families(inst, blocks, ideal_limit, linear)
    best, pairs = None, 0
    for fam in families:
        # sets costing more than a split in hand are never tried: the best so far, else the best over the prefixes
        # of one topological order (ideals too, so no better than the best over every ideal)
        ub = best.max_load * (1 + 1e-9) if best is not None else np.inf
        if not np.isfinite(ub) and fam.members.shape[0] > len(fam.core) + 1:
            lin = _Family(fam.blocks, fam.core, fam.pos, _prefix_family(fam.preds, len(fam.core)), False, fam.preds)
            ub = _dp_guessing(inst, lin, None, t0).stats["dp_value"] * (1 + 1e-9)
        got = _dp_split(inst, fam, progress, t0, ub) if np.isfinite(ub) else _dp_guessing(inst, fam, progress, t0)
        pairs += got.stats["ideal_pairs"]
        if got.max_load < np.inf and (best is None or got.max_load < best.max_load):
            best = got
    if best is None or not np.isfinite(best.max_load):
        raise GraphError(f"{inst.path}: no contiguous split fits: {_why_infeasible(inst, blocks)}")
    best.notes[:0] = [note] if note else []
    best.stats.update(ideal_pairs=float(pairs), seconds=time.perf_counter() - t0)
    return best


def _dp_guessing(inst: MaxLoadInstance, fam: _Family, progress, t0: float) -> Split:
    """The dynamic program over one family with no split in hand: with bounds guessed from a lower bound up (x
    1.25 each time), each run trying only sets that cost no more, until one holds a split (then it is the best:
    every set of a split under the guess was tried), or the guess passes what any split costs."""
    blocks, core = fam.blocks, fam.core
    top = float(np.maximum(blocks.acc[core], blocks.cpu[core]).sum() + inst.out_cost.sum())  # every split's loads
    guess = lower_bound(inst, blocks)  # a start only: above the optimum, the first run just prunes less
    guess, pairs = max(guess if np.isfinite(guess) else 0.0, top * 1e-3), 0.0
    while guess < top:
        got = _dp_split(inst, fam, progress, t0, guess)
        pairs += got.stats["ideal_pairs"]
        if np.isfinite(got.stats["dp_value"]):
            got.stats["ideal_pairs"] = pairs
            return got
        guess *= 1.25
    got = _dp_split(inst, fam, progress, t0, np.inf)
    got.stats["ideal_pairs"] += pairs
    return got


def _dp_split(inst: MaxLoadInstance, fam: _Family, progress, t0: float, ub: float = np.inf) -> Split:
    """The dynamic program over one family (sets costing over ``ub`` left out); a split of max-load inf where none
    fits."""
    blocks, core, members = fam.blocks, fam.core, fam.members
    words = _words(members)
    card = members.sum(axis=1)
    fm = members.astype(np.float64)
    acc, cpu, size, bad = (fm @ blocks.acc[core], fm @ blocks.cpu[core], fm @ blocks.size[core],
                           fm @ blocks.bad[core])
    src = _sources(inst, blocks, fam.pos)
    src = (*src, *_by_block(src[0], src[2], src[3], members.shape[1]))
    k = members.shape[0]
    f = np.full((inst.cpus + 1, inst.accelerators + 1, k), np.inf)
    f[:, :, 0] = 0.0
    choice = np.full(f.shape, -1, dtype=np.int64)
    sub = np.full(f.shape, -1, dtype=np.int64)
    # ideals of one size are never inside each other: the kernel fills a run of them in parallel
    level_end = np.flatnonzero(np.diff(card) != 0) + 1
    pairs, j, step, last = 0, 1, 1, time.perf_counter()
    while j < k:
        hi = min(k, j + step, int(level_end[np.searchsorted(level_end, j, side="right")]) if
                 (level_end > j).any() else k)
        t = time.perf_counter()
        pairs += maxload_dp(words, card, acc, cpu, size, bad, inst.max_size, *src, j, hi, f, choice, sub, ub)
        step = max(1, min(4 * step, k, int(min(k, step * 0.5 / max(time.perf_counter() - t, 1e-6)))))
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


__all__ = ["IDEAL_LIMIT", "contiguous_dp"]
