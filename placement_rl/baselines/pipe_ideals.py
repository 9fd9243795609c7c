"""The full stage-plan space, searched exactly: a dynamic program over the ideals of the DAG.

Space: stage ``s`` is any ideal difference ``I_{s+1} minus I_s`` (a contiguous set of the DAG, not a cut of one
topological order, ``graph.ideals``); any device group serves any stage (a slow device may be any stage or
none); a plan may use any subset of the devices. Interchangeable devices form a class (``device_classes``: the
same cost column, memory and restrictions, and a swap of the two leaves the links unchanged; 6 accelerators on one
switch and a CPU have 2, the 4 V100s of a DGX-1 quad on their unequal NVLinks 4); a stage's group is a
*composition* (how many devices of each class), mixed groups allowed and paced by their slowest member in forward
and backward alike.

Objective minimised exactly: the bottleneck ``max`` over stages of the stage's per-micro-batch compute (forward
+ backward span on its slowest member, the simulator's ``tf + tb``) and its DDP gradient sync per micro-batch
(``allreduce(params) / m``), and over boundaries of the transfer per micro-batch (``latency + bytes / (m
min(p, p')) / bandwidth`` on the slowest link between the two groups), for every micro-batch count: ``m x`` that
bottleneck is ``cost.throughput``'s steady time per batch. The state is (ideal, devices used per class, last
stage's composition); a transition appends a stage. Work: ``pairs of nested ideals x device states x
compositions^2`` per micro-batch count; over ``WORK_LIMIT`` the family of ideals falls back to the prefixes of one
topological order (``meta["ideals"]`` says so, with the chain-cover bound on the ideal count).

It is the simulator's steady state exactly when (a) devices of one class are interchangeable (so by construction,
unless links split equal devices into more classes than their compositions (``MAX_COMPOSITIONS``) or the work
limit allow: the DP then takes the cost classes, prices each composition on its best-connected devices and
simulates each plan on them first, and ``meta["ideal_note"]`` says it is not exact over the device choices),
(b) a stage's parameters fit one DDP bucket (25 MiB; more buckets add a latency each), (c) a producer's edges out
of an ideal carry the same bytes (one tensor), (d) memory does not bind (a stage is kept within its group's
memory with ``min(m, D)`` micro-batches in flight, 1F1B holds at most the stages after it: conservative), (e) DDP;
FSDP variants of the best plans are simulated too. Every final state (each set of devices used, each last
composition) yields a plan; the best ``SIMULATED`` of them by estimate (time per sample: ``m x bottleneck``; step
time: ``(m + S - 1) x bottleneck``) are simulated, so ``exact`` is exact for time per sample and a strong search
for step time.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Callable

import numpy as np

from placement_rl.baselines._ideal_kernel import ideal_dp
from placement_rl.baselines.pipe_common import PipeProblem, Plan, Stages, microbatch_choices
from placement_rl.cost.collectives import coeff_array
from placement_rl.cost.comm_fit import pad_segments, split_segments
from placement_rl.cost.modes import mode_of
from placement_rl.graph.ideals import (IdealFamily, ideal_bound, ideal_family, magnitude, prefix_family,
                                       prefix_ideals)
from placement_rl.graph.ir import CompGraph

ENUM_LIMIT = 4096          # ideals listed at most before falling back to one order's prefixes
WORK_LIMIT = 4e9           # nested pairs x device states x compositions^2 x micro-batch counts
MAX_COMPOSITIONS = 64      # beyond: single-class groups of power-of-two sizes (and each whole class)
PICK_WORK = 1 << 18        # choices x group size^2 a best-connected pick compares whole, at most (beyond: grown)
FSDP_VARIANTS = 8          # the best plans with a replicated stage are also simulated sharded
LINKS_MERGED = ("equal devices taken as interchangeable although their links differ (each group's devices "
                "picked best-connected): not exact over the device choices")
SIMULATED = {"throughput": 8, "step": 64}  # DP plans handed to the simulator, best estimate first: the DP's
# estimate is the steady time itself (a few suffice), the step time only ranks them (more are worth a look)


def restrictions(pp: PipeProblem) -> tuple[np.ndarray, list[list[int]]]:
    """``allowed`` bool [N, D] and colocation groups (node indices) from the cost table (``cost.costs_file``)."""
    allowed = np.ones((pp.n, pp.d), dtype=bool)
    for node, devs in (pp.costs.meta.get("allowed") or {}).items():
        allowed[int(node)] = False
        allowed[int(node), [int(x) for x in devs]] = True
    return allowed, [list(map(int, g)) for g in pp.costs.meta.get("colocate") or []]


def cost_classes(pp: PipeProblem, allowed: np.ndarray) -> list[list[int]]:
    """Devices with identical cost columns, launch overheads, memory and restrictions (links not looked at),
    fastest class first."""
    c = pp.costs
    mem = pp.topology.array("memory_bytes")
    keys: dict[bytes, list[int]] = {}
    for d in range(pp.d):
        key = np.concatenate([c.fwd_time[:, d], c.bwd_time[:, d], c.launch_overhead[:, d], [mem[d]],
                              allowed[:, d].astype(float)]).tobytes()
        keys.setdefault(key, []).append(d)
    total = (c.fwd_time + c.bwd_time).sum(axis=0)
    return sorted(keys.values(), key=lambda ds: (total[ds[0]], ds[0]))


def device_classes(pp: PipeProblem, allowed: np.ndarray) -> list[list[int]]:
    """Interchangeable devices, fastest class first (ties: lowest device): a class of ``cost_classes`` split where
    links differ, two devices being in one class only where swapping them leaves the link latency and bandwidth
    matrices unchanged (a transposition automorphism; two such swaps compose into a third, so this is an
    equivalence). Uniform links keep the cost classes; on a DGX-1's NVLink mesh every GPU is its own class, on hosts
    joined by a slower network each host's devices are one."""
    mats = [np.asarray(pp.costs.link_latency, dtype=np.float64), np.asarray(pp.costs.link_bandwidth, dtype=np.float64)]
    total = (pp.costs.fwd_time + pp.costs.bwd_time).sum(axis=0)
    apart = any(np.isnan(m).any() for m in mats)  # NaN != NaN: no swap keeps such a matrix equal to itself
    out: list[list[int]] = []
    for members in cost_classes(pp, allowed):
        if apart:
            out += [[x] for x in members]
            continue
        left = list(members)
        while left:
            a, rest = left[0], np.asarray(left[1:], dtype=np.int64)
            same = np.ones(rest.size, dtype=bool)
            for m in mats:
                same &= _swap_keeps(m, a, rest)
            out.append([a, *rest[same].tolist()])
            left = rest[~same].tolist()
    return sorted(out, key=lambda ds: (total[ds[0]], ds[0]))


def _swap_keeps(m: np.ndarray, a: int, b: np.ndarray) -> np.ndarray:
    """Per device ``b[k]``: whether swapping devices ``a`` and ``b[k]`` leaves ``m`` unchanged (rows and columns
    equal off ``a`` and ``b``, equal diagonal entries, ``m[a, b] == m[b, a]``)."""
    k = np.arange(b.size)
    rows, cols = m[b] == m[a], m[:, b].T == m[:, a]
    for x in (rows, cols):
        x[:, a] = True
        x[k, b] = True
    return rows.all(axis=1) & cols.all(axis=1) & (m[b, b] == m[a, a]) & (m[a, b] == m[b, a])


# ------------------------------------------------------------------ best-connected device choices
def split_classes(pp: PipeProblem) -> list[list[int]] | None:
    """The cost classes (``cost_classes``) where links split one of them (``device_classes`` has more classes:
    equal devices that are not interchangeable), else None."""
    allowed = restrictions(pp)[0]
    classes = cost_classes(pp, allowed)
    return classes if len(device_classes(pp, allowed)) > len(classes) else None


def link_arrays(pp: PipeProblem) -> tuple[np.ndarray, np.ndarray]:
    """Link latency and inverse bandwidth (NaN as the slowest link)."""
    lat = np.nan_to_num(np.asarray(pp.costs.link_latency, dtype=np.float64), nan=np.inf)
    bw = np.asarray(pp.costs.link_bandwidth, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(np.isnan(bw), np.inf, 1.0 / bw)
    return lat, inv


def connected_groups(pp: PipeProblem, classes: list[list[int]], seq: tuple[tuple[int, ...], ...],
                     links: tuple[np.ndarray, np.ndarray] | None = None, before: tuple[tuple[int, ...], ...] = ()
                     ) -> tuple[tuple[int, ...], ...]:
    """Devices of each stage for a sequence of compositions (devices per class), stage by stage after the groups
    ``before`` (their devices taken): each class's share picked from its devices left (``_pick``: the group's
    slowest link least, then its slowest link from the previous stage's group). Where every pair's links are alike:
    each class's devices in index order."""
    lat, inv = links if links is not None else link_arrays(pp)
    groups = tuple(before)
    for v in seq:
        groups += (_next_connected(lat, inv, classes, groups, v),)
    return groups[len(before):]


def _next_connected(lat: np.ndarray, inv: np.ndarray, classes: list[list[int]], groups: tuple,
                    v: tuple[int, ...]) -> tuple[int, ...]:
    used = {x for g in groups for x in g}
    prev = groups[-1] if groups else ()
    out: tuple[int, ...] = ()
    for devs, cnt in zip(classes, v):
        if cnt:
            out += _pick(lat, inv, tuple(x for x in devs if x not in used), cnt, out, prev)
    return out


def _pick(lat: np.ndarray, inv: np.ndarray, pool: tuple[int, ...], k: int, fixed: tuple[int, ...],
          prev: tuple[int, ...]) -> tuple[int, ...]:
    """``k`` devices of ``pool`` (ascending) joining ``fixed`` in a group that follows the group ``prev``: least
    slowest link inside the group (1 / bandwidth, then latency), then least slowest link from ``prev``, then the
    lowest devices. Every choice compared where that is at most ``PICK_WORK`` link entries; beyond, the group grown
    a device at a time."""
    if k >= len(pool):
        return pool
    if math.comb(len(pool), k) * (len(fixed) + k) ** 2 <= PICK_WORK:
        combos = np.array(list(itertools.combinations(pool, k)), dtype=np.int64)
        grp = np.concatenate([np.broadcast_to(np.array(fixed, dtype=np.int64), (len(combos), len(fixed))), combos],
                             axis=1)
        off = ~np.eye(grp.shape[1], dtype=bool)
        before = np.array(prev, dtype=np.int64)
        keys = [np.where(off, m[grp[:, :, None], grp[:, None, :]], -np.inf).max(axis=(1, 2)) for m in (inv, lat)]
        keys += [m[before[None, :, None], grp[:, None, :]].max(axis=(1, 2)) if prev else np.zeros(len(combos))
                 for m in (inv, lat)]
        best = int(np.lexsort(keys[::-1])[0])  # stable: the lowest devices among equals (combinations in order)
        return tuple(int(x) for x in combos[best])
    cand = np.array(pool, dtype=np.int64)
    inside = [np.zeros(cand.size) for _ in range(2)]  # slowest link from each candidate to the group
    worst = [0.0, 0.0]  # slowest link inside the group so far
    for x in fixed:
        for i, m in enumerate((inv, lat)):
            inside[i] = np.maximum(inside[i], np.maximum(m[cand, x], m[x, cand]))
    for i, m in enumerate((inv, lat)):
        if len(fixed) > 1:
            f = np.array(fixed, dtype=np.int64)
            worst[i] = float(np.where(~np.eye(f.size, dtype=bool), m[np.ix_(f, f)], -np.inf).max())
    back = [m[np.array(prev, dtype=np.int64)][:, cand].max(axis=0) if prev else np.zeros(cand.size)
            for m in (inv, lat)]
    free = np.ones(cand.size, dtype=bool)
    chosen: list[int] = []
    for _ in range(k):
        keys = [np.maximum(worst[0], inside[0]), np.maximum(worst[1], inside[1]), back[0], back[1]]
        j = int(np.lexsort([*keys[::-1], ~free])[0])
        chosen.append(int(cand[j]))
        free[j] = False
        worst = [float(keys[0][j]), float(keys[1][j])]
        for i, m in enumerate((inv, lat)):
            inside[i] = np.maximum(inside[i], np.maximum(m[cand, cand[j]], m[cand[j], cand]))
    return tuple(sorted(chosen))


def compositions(avail: list[int]) -> np.ndarray:
    """Group compositions ``[G, C]`` (devices per class, not all zero)."""
    full = math.prod(a + 1 for a in avail) - 1  # Python ints: 64 classes of 8 overflow int64
    if full <= MAX_COMPOSITIONS:
        out = [v for v in itertools.product(*[range(a + 1) for a in avail]) if any(v)]
    else:
        out = []
        for k, a in enumerate(avail):
            sizes = sorted({2**e for e in range(a.bit_length()) if 2**e <= a} | {a})
            out += [tuple(s if j == k else 0 for j in range(len(avail))) for s in sizes]
    return np.array(out, dtype=np.int64).reshape(-1, len(avail))


def _next_states(avail: list[int], comp: np.ndarray) -> np.ndarray:
    radix = np.array([a + 1 for a in avail])
    stride = np.concatenate([[1], np.cumprod(radix)[:-1]]).astype(np.int64)
    ns = math.prod(a + 1 for a in avail)
    digits = (np.arange(ns)[:, None] // stride[None, :]) % radix[None, :]
    out = np.full((ns, comp.shape[0]), -1, dtype=np.int64)
    for g, vec in enumerate(comp):
        new = digits + vec[None, :]
        ok = (new <= np.array(avail)[None, :]).all(axis=1)
        out[ok, g] = (new[ok] * stride).sum(axis=1)
    return out


def antichain_size(graph: CompGraph) -> int:
    """The size of an antichain of the DAG, found in linear time: the most nodes of one depth (edges on the
    longest path from a source) or free together after a prefix of ``graph.topo_order`` (outside it, each
    predecessor in it). Each subset of an antichain spans an ideal of its own (the subset and its ancestors), so
    the graph has at least ``2 ** size`` ideals."""
    n = graph.num_nodes
    sp, si = graph.succ_ptr.tolist(), graph.succ_idx.tolist()
    waiting = np.diff(graph.pred_ptr).tolist()  # predecessors outside the prefix
    depth = [0] * n
    free = best = waiting.count(0)
    for v in graph.topo_order.tolist():
        free -= 1
        for w in si[sp[v]:sp[v + 1]]:
            depth[w] = max(depth[w], depth[v] + 1)
            waiting[w] -= 1
            free += waiting[w] == 0
        best = max(best, free)
    return max(best, max(np.bincount(depth).tolist(), default=0))


def listed_family(graph: CompGraph, limit: int, colocate: list[list[int]],
                  searchable: Callable[[int], bool] = lambda count: True) -> IdealFamily:
    """``ideal_family``, without listing the ideals where an antichain (``antichain_size``) already proves more
    than ``limit``: the listing would fail, but only after building a level of up to width^2 / 2 sets (seconds on
    a graph of a few hundred parallel branches, past any planner's seconds). A prefix family whose count is not
    ``searchable`` is counted, not built (``prefix_family``)."""
    width = antichain_size(graph)
    if 2**width <= limit:
        return ideal_family(graph, limit=limit, colocate=colocate, searchable=searchable)
    bound = ideal_bound(graph)
    return prefix_family(graph, colocate, bound,
                         f"more than {limit} ideals (at least 2^{width}: an antichain of {width} nodes; chain-cover "
                         f"bound {magnitude(bound)}): searched the prefixes of one topological order instead "
                         "(coarsen the graph or raise the limit for the full space)", searchable)


class IdealSearch:
    """Arrays of the DP for one problem (classes, compositions, per-ideal prefix sums), reused per m."""

    def __init__(self, pp: PipeProblem, *, enum_limit: int = ENUM_LIMIT, work_limit: float = WORK_LIMIT) -> None:
        self.pp = pp
        self.allowed, self.colocate = restrictions(pp)
        self.train = mode_of(pp.costs) == "train"
        self.ms = microbatch_choices(1, 1, pp.batch_size, schedule=pp.schedule) or [1]

        def work_per_pair(classes: list[list[int]]) -> int:
            avail = [len(c) for c in classes]
            g = compositions(avail).shape[0]
            return math.prod(a + 1 for a in avail) * g * (g + 1) * len(self.ms)

        coarse = cost_classes(pp, self.allowed)
        per_pair = work_per_pair(coarse)
        limit = max(2, int(np.sqrt(2 * work_limit / per_pair)))
        # a prefix family over the work limit on the cost classes is over it on any finer ones: not built
        fam = listed_family(pp.graph, min(enum_limit, limit), self.colocate,
                            lambda count: count * (count - 1) / 2 * per_pair <= work_limit)
        # links split a cost class: its devices as the classes of ``device_classes`` where each of their
        # compositions is listed and the family's DP stays within the work limit, else the cost classes with each
        # composition priced on its best-connected devices (``concrete``) and each plan simulated on them first
        # (``connected_first``; ``self.linked`` false)
        self.classes, self.linked = coarse, True
        fine = device_classes(pp, self.allowed)
        if len(fine) > len(coarse):
            fine_pair = work_per_pair(fine)
            if (math.prod(len(c) + 1 for c in fine) - 1 <= MAX_COMPOSITIONS
                    and fam.count * (fam.count - 1) / 2 * fine_pair <= work_limit):
                self.classes, per_pair = fine, fine_pair
            else:
                self.linked = False
        self.avail = [len(c) for c in self.classes]
        self.comp = compositions(self.avail)
        self.nxt = _next_states(self.avail, self.comp)
        self._links = None if self.linked else link_arrays(pp)
        self._picked: dict[tuple, tuple[tuple[int, ...], ...]] = {}  # best-connected groups per composition sequence
        if not fam.complete and (fam.count**2 / 2) * per_pair > work_limit:
            fam = dataclasses.replace(fam, note=fam.note + "; the prefix family is over the work limit too "
                                      f"({fam.count} prefixes x {per_pair} per pair)")
        self.family = fam
        self.work = fam.count * (fam.count - 1) / 2 * per_pair
        self.over_limit = self.work > work_limit
        if not self.over_limit:  # else skipped: no arrays (at 20,000 prefixes they took a minute and 3 GB)
            self._arrays()

    def _arrays(self) -> None:
        pp, mem = self.pp, self.family.members
        fmem = mem.astype(np.float64)
        c = pp.costs
        ffix = np.minimum(c.launch_overhead, c.fwd_time)
        bfix = np.minimum(c.launch_overhead, c.bwd_time)
        rep = [cls[0] for cls in self.classes]
        self.fv = np.ascontiguousarray((fmem @ (c.fwd_time - ffix)[:, rep]).T)
        self.fx = np.ascontiguousarray((fmem @ ffix[:, rep]).T)
        self.bv = np.ascontiguousarray((fmem @ (c.bwd_time - bfix)[:, rep]).T)
        self.bx = np.ascontiguousarray((fmem @ bfix[:, rep]).T)
        self.dis = np.ascontiguousarray((fmem @ (~self.allowed[:, rep]).astype(float)).T)
        self.par = fmem @ pp.graph.param_bytes
        self.act = fmem @ pp.graph.act_bytes
        self.size = mem.sum(axis=1).astype(np.int64)
        g = pp.graph
        cut = np.zeros(mem.shape[0])
        if g.num_edges:
            src, dst, eb = g.edges[:, 0], g.edges[:, 1], g.edge_bytes
            cross = mem[:, src] & ~mem[:, dst]
            for u in np.unique(src):
                es = np.flatnonzero(src == u)
                cut += (cross[:, es] * eb[es][None, :]).max(axis=1)
        self.cut = cut
        packed = np.packbits(mem, axis=1, bitorder="little")
        pad = (-packed.shape[1]) % 8
        self.words = np.ascontiguousarray(np.pad(packed, ((0, 0), (0, pad)))).view(np.uint64)
        # per composition: a concrete group (first devices of each class), capacity, links, all-reduce table
        cap = pp.topology.array("memory_bytes")
        lat, inv = c.link_latency, 1.0 / c.link_bandwidth
        ncls = len(self.classes)
        lat_c, inv_c = np.zeros((ncls, ncls)), np.zeros((ncls, ncls))
        for a in range(ncls):
            for b in range(ncls):
                pairs = [(x, y) for x in self.classes[a] for y in self.classes[b] if x != y]
                if pairs:
                    lat_c[a, b] = max(lat[x, y] for x, y in pairs)
                    inv_c[a, b] = max(inv[x, y] for x, y in pairs)
        ng = self.comp.shape[0]
        self.psize = self.comp.sum(axis=1)
        present = [np.flatnonzero(v) for v in self.comp]
        self.cap = np.array([min(cap[self.classes[k][0]] for k in ks) for ks in present])
        self.lat = np.array([[lat_c[np.ix_(present[a], present[b])].max() for b in range(ng)] for a in range(ng)])
        self.inv = np.array([[inv_c[np.ix_(present[a], present[b])].max() for b in range(ng)] for a in range(ng)])
        tables = pad_segments([coeff_array("allreduce", self.concrete(g), pp.topology, c) for g in range(ng)])
        self.ar_up, self.ar_coef = split_segments(tables.reshape(ng, 1, *tables.shape[1:]))
        ratio = 1.0
        if pp.sim.cost_batch_size is not None:
            ratio = float(pp.batch_size) / pp.sim.cost_batch_size if pp.batch_size else 1.0
        self.ratio = ratio

    def concrete(self, g: int) -> tuple[int, ...]:
        """The devices composition ``g`` is priced on: each class's first ones (best-connected where links split
        a class, ``linked`` false)."""
        if not self.linked:
            return self._connected((tuple(int(x) for x in self.comp[g]),))[0]
        return tuple(d for k, cnt in enumerate(self.comp[g]) for d in self.classes[k][:cnt])

    def _connected(self, seq: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        if seq not in self._picked:
            self._picked[seq] = connected_groups(self.pp, self.classes, seq, self._links)
        return self._picked[seq]

    def run(self, m: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], int]:
        k, ns, ng = self.family.count, self.nxt.shape[0], self.comp.shape[0]
        f = np.empty((k, ns, ng + 1))
        parents = tuple(np.zeros((k, ns, ng), dtype=np.int64) for _ in range(3))
        b = self.pp.batch_size
        allowed = np.array([b is None or b % (m * int(p)) == 0 for p in self.psize])
        inflight = float(m if self.pp.schedule == "gpipe" else min(m, self.pp.d))
        pairs = ideal_dp(self.words, self.size, self.fv, self.fx, self.bv, self.bx, self.par, self.act, self.cut,
                         self.dis, self.comp, self.psize, allowed, self.cap, self.lat, self.inv, self.ar_up,
                         self.ar_coef, self.ratio, float(m), self.train, inflight, self.nxt, f, *parents)
        return f, parents, int(pairs)

    def plan_of(self, parents: tuple[np.ndarray, ...], ci: int, g: int) -> Stages:
        p_i, p_c, p_g = parents
        mem = self.family.members
        j, chain = self.family.count - 1, []
        while j > 0:
            i, pc, pg = int(p_i[j, ci, g]), int(p_c[j, ci, g]), int(p_g[j, ci, g])
            chain.append((i, j, g))
            j, ci, g = i, pc, pg
        chain.reverse()
        stage = np.empty(self.pp.n, dtype=np.int64)
        for s, (i, j, _) in enumerate(chain):
            stage[mem[j] & ~mem[i]] = s
        # devices of each class handed out largest group first, in index order: power-of-two groups then sit on
        # aligned blocks (inside one host, or whole hosts), as the DP priced them (``concrete``)
        groups: list[list[int]] = [[] for _ in chain]
        for k, devs in enumerate(self.classes):
            cursor = 0
            for s in sorted(range(len(chain)), key=lambda s: -int(self.comp[chain[s][2], k])):
                cnt = int(self.comp[chain[s][2], k])
                groups[s] += devs[cursor:cursor + cnt]
                cursor += cnt
        return Stages(tuple(int(x) for x in stage), tuple(tuple(int(x) for x in g) for g in groups))

    def connected_first(self, cand: tuple[float, Plan]) -> list[tuple[float, Plan]]:
        """Where links split a class (``linked`` false): the plan on the best-connected devices of its classes
        (``connected_groups``, as ``concrete`` priced its groups), then the plan itself (index order) where they
        differ; else the plan alone."""
        est, (st, *rest) = cand
        if self.linked:
            return [cand]
        class_of = {d: k for k, devs in enumerate(self.classes) for d in devs}
        seq = tuple(tuple(sum(class_of[x] == k for x in g) for k in range(len(self.classes))) for g in st.groups)
        picked = self._connected(seq)
        if [set(g) for g in picked] == [set(g) for g in st.groups]:
            return [cand]
        return [(est, (Stages(st.stage_of_node, picked), *rest)), cand]


def ideal_candidates(pp: PipeProblem) -> tuple[list[tuple[float, Plan]], dict[str, object]]:
    """Plans from the DP over ideals with their estimates (best first) and what the search reports."""
    t0 = time.perf_counter()
    search = IdealSearch(pp)
    fam = search.family
    note = fam.note if search.linked else "; ".join(x for x in (fam.note, LINKS_MERGED) if x)
    info: dict[str, object] = {"ideals": fam.count, "ideals_complete": fam.complete, "ideal_bound": fam.bound,
                               "ideal_note": note, "device_classes": len(search.classes),
                               "compositions": int(search.comp.shape[0]), "dp_work": search.work}
    if search.over_limit:
        info["ideal_search_seconds"] = time.perf_counter() - t0
        info["ideal_note"] = (f"{note}; skipped: {search.work:.3g} DP steps is over the limit {WORK_LIMIT:.3g} "
                              "(coarsen the graph)")
        return [], info
    cands: list[tuple[float, Plan]] = []
    seen: set[tuple[Stages, int]] = set()
    best_bottleneck = np.inf
    for m in search.ms:
        if cands and pp.out_of_time(0.25):  # given seconds: the micro-batch counts searched so far (then
            # ``pipe_tp.exact``'s configurations up to half of them, and the simulations)
            info["ideal_note"] = f"{note}; micro-batch counts cut short at {pp.seconds:g} s"
            info["ideals_complete"] = False
            break
        f, parents, _ = search.run(m)
        final = f[-1, :, :-1]
        for ci, g in zip(*np.nonzero(np.isfinite(final))):
            val = float(final[ci, g])
            stages = search.plan_of(parents, int(ci), int(g))
            est = m * val
            best_bottleneck = min(best_bottleneck, est)
            s = max(stages.stage_of_node) + 1
            if pp.schedule == "1f1b" and s > m:  # torch's Schedule1F1B (what deploy runs) refuses it
                continue
            if pp.objective == "step":
                est = val * (m + s - 1)
            key = (stages, m)
            if key in seen:
                continue
            seen.add(key)
            degrees = tuple(len(gr) for gr in stages.groups)
            cands.append((est, (stages, degrees, m, "dp")))
    cands.sort(key=lambda c: c[0])
    total = len(cands)
    cands = [c for cand in cands[:SIMULATED[pp.objective]] for c in search.connected_first(cand)]
    fsdp = [(est, (st, deg, m, "fsdp")) for est, (st, deg, m, _) in cands if max(deg) > 1][:FSDP_VARIANTS]
    info.update(ideal_candidates=total, ideal_best_steady=best_bottleneck,
                ideal_search_seconds=time.perf_counter() - t0)
    return cands[:1] + fsdp + cands[1:], info


__all__ = ["IdealSearch", "antichain_size", "compositions", "connected_groups", "cost_classes", "device_classes",
           "ideal_candidates", "link_arrays", "listed_family", "prefix_ideals", "split_classes"]
