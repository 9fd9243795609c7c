"""The ``cp`` part of the lower bound: the simulator's schedule as a CP-SAT model (OR-Tools), relaxed only in what a
chunk weighs and in memory.

The other parts each drop something: ``path`` and ``work`` every transfer, ``milp`` each device running one op at a
time, ``blocks`` all but one chain. This one keeps them together. Every node sits on one device (``x[v, d]``); its
forward and backward are intervals on that device. As in the simulator (``cost._op_kernel``):

* each device runs its forward ops in the priority order (``order``, the simulator's ``"program"`` order unless
  told), each after the one placed there before it ends, then its backward ops in the reverse order after its last
  forward (``_fifo``);
* along an edge ``u -> v`` the forward of ``v`` starts after the forward of ``u`` ends, plus ``c_u`` when the two
  sit on different devices; a node's backward starts after its own forward and, where its output needs a gradient,
  after each consumer's backward ends (plus ``c_u`` across devices); ``c_u`` is ``cut_costs``, the least time
  anything ``u`` sends can reach another device;
* each ordered pair of devices is a link carrying one transfer at a time (``_links``, up to ``LINKS_MAX`` = N x D^2):
  ``u`` on ``a`` with consumers on ``b`` sends one chunk over ``a -> b`` after its forward, each consumer there waits
  for it, and a gradient comes back over ``b -> a`` after their backward, each taking at least ``pair_costs[u, a,
  b]`` (the cheapest of ``u``'s out-edges over that link; a later chunk only adds);
* optionally (``hosts``) the least time between hosts on an edge whose ends sit on two hosts.

The simulator's schedule of any placement satisfies all of it, so the least makespan of the model is at most every
placement's step time, and CP-SAT's proven bound on it (``BestObjectiveBound``, valid when stopped early) is a lower
bound. Where every node's out-edges carry the same bytes and CP-SAT solves the model, its optimum is the simulator's
(the simulated solution meets the bound). Times are integer ticks, durations and transfer times rounded down (a
real schedule floored to ticks stays feasible, since ``floor(a + b) >= floor(a) + floor(b)``), so rounding never
lifts it. Memory limits are relaxed, as in every other part: the solution (``CpResult.placement``), simulated, is a
placement and an upper bound, but it may not fit memory (the ``cp_sat`` placer, ``baselines.cp_place``, adds them to
the model: ``_memory``).

Devices of one speed class (and, with the links modelled, that swap without changing any link's times) are
interchangeable in the model; the first node is pinned to the first device of its class (a symmetry cut that keeps
an optimum; before the links were checked, on links that tell devices apart it could cut the optimum off and lift
the bound above it). The model grows as N x D^2 with the links: it proves bounds in seconds
up to ~100 nodes on 4 devices; on several hundred nodes it proves no more than the other parts in a minute.

OR-Tools is optional (``pip install placement-rl[exact]``); without it ``cp_bound`` says what to install.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from placement_rl.baselines.transfer_floor import cut_costs, pair_costs
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

TICKS = 2_000_000  # integer ticks in the horizon (the upper bound given): ~1e-6 of it per tick
LINKS_MAX = 20_000  # N x D^2 up to which the links are modelled (``_links``) unless told
LINKS_SHARE = 0.3  # of the seconds, for the model without links first
ORBIT_MAX_DEVICES = 8  # up to this many devices, which devices the links cannot tell apart is found by enumeration
LOAD_SHARE = 0.3  # CP-SAT's loading and presolve run past its time limit by up to about this share of the seconds
# the model took to build (200 nodes on 8 devices with links and memory: built in 0.9 s, then 0.25-0.3 s past limits
# of 0.01-0.3 s): given a deadline, CP-SAT's time limit is that much less (``_solve``)
MIN_SEARCH = 0.05  # seconds: with less than this left for CP-SAT's search by the deadline, it does not run


@dataclass(frozen=True)
class CpResult:
    bound: float  # seconds: no placement's step time is below it
    placement: np.ndarray | None  # [N] device of each node in the best solution CP-SAT found (None: none)
    optimal: bool  # the model was solved to optimality (bound == makespan, in ticks)
    seconds: float
    note: str = ""  # what CP-SAT did not give in its seconds (no bound above ``lower``, no placement): one line


class _Late(Exception):
    """Building the model ran past its deadline."""


class _Solved(NamedTuple):
    """One CP-SAT run (``_solve``), in ticks."""
    bound: float  # proven lower bound on the makespan (0: none)
    makespan: float | None  # of the best solution found (None: none)
    placement: np.ndarray | None  # [N] of that solution
    optimal: bool  # solved to optimality
    infeasible: bool = False  # proved to have no solution within the horizon (not a timeout)


def _in_time(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise _Late


def _require_ortools():
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise ImportError("the cp bound needs OR-Tools: pip install 'placement-rl[exact]' (or ortools)") from e
    return cp_model


@dataclass
class _Problem:
    """The model's data, times in integer ticks."""
    fwd: np.ndarray  # [n, D]
    bwd: np.ndarray  # [n, D]
    edges: np.ndarray  # [m, 2]
    cut: np.ndarray  # [n] least transfer to another device
    across: np.ndarray  # [n] least transfer to another host (>= cut; 0 where hosts are not modelled)
    grad: np.ndarray  # [n] bool
    host: np.ndarray  # [D]
    key: np.ndarray  # [D] interchangeable devices share a key
    to_first: np.ndarray  # [D, D] a relabelling keeping the model that takes each device to the first of its key
    first: int  # a node to pin (symmetry)
    pair: np.ndarray | None = None  # [n, D, D] least transfer per ordered device pair: the links modelled
    order: np.ndarray | None = None  # the simulator's priority order, which each device follows (None: any order)
    memory: tuple | None = None  # (pinned [n], edge bytes [m], capacity [D]) in integer units: memory modelled


def _ticks(values, tick: float, cap: float) -> np.ndarray:
    """``values`` (seconds, at most ``cap``; inf: 0) in whole ticks, rounded down (``tick`` > 0)."""
    v = np.asarray(values, dtype=np.float64)
    return np.floor(np.where(np.isfinite(v), np.minimum(v, cap), 0.0) / tick).astype(np.int64)


def _device_keys(costs: CostTable, host: np.ndarray, by_host: bool) -> np.ndarray:
    """Devices with equal keys are interchangeable in the model: the same times, and (hosts modelled) hosts of the
    same make-up, so that a permutation of hosts and of devices within them maps one onto the other."""
    fb = np.concatenate([np.asarray(costs.fwd_time), np.asarray(costs.bwd_time)])
    _, base = np.unique(fb.T, axis=0, return_inverse=True)
    base = np.asarray(base).reshape(-1)
    if not by_host:
        return base
    make_up = {h: tuple(sorted(base[host == h].tolist())) for h in set(host.tolist())}
    keys = {k: i for i, k in enumerate(sorted({(int(b), make_up[h]) for b, h in zip(base, host)}))}
    return np.array([keys[(int(b), make_up[h])] for b, h in zip(base, host)], dtype=np.int64)


def _link_keys(key: np.ndarray, pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, to_first)``: ``key`` split where the links tell devices apart: two devices share a key when some
    relabelling of the devices that keeps every device's kind and every link's transfer times (``pair`` [n, D, D])
    maps one onto the other (their orbit; by enumeration up to ``ORBIT_MAX_DEVICES`` devices, else by swaps of two
    devices, which finds fewer); ``to_first[d]`` is such a relabelling taking ``d`` to the first device of its key.
    Pinning a node to the first device of its key then keeps an optimum on any links."""
    key = np.asarray(key, dtype=np.int64)
    nd = len(key)
    _, sig = np.unique(pair.reshape(pair.shape[0], nd * nd).T, axis=0, return_inverse=True)
    sig = np.asarray(sig).reshape(nd, nd)  # one id per link: equal ids, equal transfer times for every node
    if nd <= ORBIT_MAX_DEVICES:  # every relabelling at once (8 devices: 40,320 of them, one at a time took 0.5 s)
        perms = np.array(list(itertools.permutations(range(nd))), dtype=np.int64).reshape(-1, nd)
        ok = (key[perms] == key).all(axis=1) & (sig[perms[:, :, None], perms[:, None, :]] == sig).all(axis=(1, 2))
        kept = perms[ok]  # the identity among them
        first = np.minimum(kept.min(axis=0), np.arange(nd))
        return first, np.stack([kept[int(np.argmax(kept[:, d] == first[d]))] for d in range(nd)])
    # swaps (if a-b and b-c keep the model, so does a-c: every swap within a class is among them)
    perms = (_swap(nd, a, b) for a in range(nd) for b in range(a + 1, nd) if key[a] == key[b])
    kept = [q for q in perms if np.array_equal(key[q], key) and np.array_equal(sig[np.ix_(q, q)], sig)]
    orbit = [{int(q[d]) for q in kept} | {d} for d in range(nd)]
    first = np.array([min(o) for o in orbit], dtype=np.int64)
    return first, _swaps_to_first(first)


def _swap(nd: int, a: int, b: int) -> np.ndarray:
    """The relabelling of ``nd`` devices that swaps ``a`` and ``b``."""
    perm = np.arange(nd)
    perm[[a, b]] = b, a
    return perm


def _swaps_to_first(key: np.ndarray) -> np.ndarray:
    """[D, D] per device the swap with the first device of its key (devices of one key: interchangeable)."""
    nd = len(key)
    first = [int(np.flatnonzero(key == key[d])[0]) for d in range(nd)]
    return np.stack([_swap(nd, d, first[d]) for d in range(nd)])


def _solve(p: _Problem, *, horizon: int, lower: int, hint: np.ndarray | None, seconds: float, workers: int,
           seed: int, deadline: float | None = None) -> _Solved | None:
    """CP-SAT on ``p`` for at most ``seconds`` (``_Solved``). With a ``deadline`` (a ``time.perf_counter()``
    instant) the model is built and solved by then: CP-SAT's search gets at most the seconds left once it is built,
    less ``LOAD_SHARE`` of the building's; None where the building runs past the deadline or leaves less than
    ``MIN_SEARCH`` (CP-SAT not run)."""
    try:
        return _build_and_solve(p, horizon=horizon, lower=lower, hint=hint, seconds=seconds, workers=workers,
                                seed=seed, deadline=deadline)
    except _Late:
        return None


def _build_and_solve(p: _Problem, *, horizon: int, lower: int, hint: np.ndarray | None, seconds: float,
                     workers: int, seed: int, deadline: float | None) -> _Solved:
    cp_model = _require_ortools()
    t0 = time.perf_counter()
    n, nd = p.fwd.shape
    hosts = sorted(set(p.host.tolist()))
    m = cp_model.CpModel()
    x = [[m.NewBoolVar(f"x{v}_{d}") for d in range(nd)] for v in range(n)]
    fs = [m.NewIntVar(0, horizon, f"fs{v}") for v in range(n)]
    fe = [m.NewIntVar(0, horizon, f"fe{v}") for v in range(n)]
    bs = [m.NewIntVar(0, horizon, f"bs{v}") for v in range(n)]
    be = [m.NewIntVar(0, horizon, f"be{v}") for v in range(n)]
    mk = m.NewIntVar(max(int(lower), 0), horizon, "makespan")
    per_dev: list[list] = [[] for _ in range(nd)]
    load: list[list] = [[] for _ in range(nd)]
    for v in range(n):
        _in_time(deadline)
        m.AddExactlyOne(x[v])
        m.Add(fe[v] == fs[v] + sum(int(p.fwd[v, d]) * x[v][d] for d in range(nd)))
        m.Add(be[v] == bs[v] + sum(int(p.bwd[v, d]) * x[v][d] for d in range(nd)))
        m.Add(bs[v] >= fe[v])
        m.Add(mk >= be[v])
        for d in range(nd):
            per_dev[d].append(m.NewOptionalFixedSizeIntervalVar(fs[v], int(p.fwd[v, d]), x[v][d], f"f{v}_{d}"))
            per_dev[d].append(m.NewOptionalFixedSizeIntervalVar(bs[v], int(p.bwd[v, d]), x[v][d], f"b{v}_{d}"))
            load[d].append((int(p.fwd[v, d] + p.bwd[v, d]), x[v][d]))
    for d in range(nd):
        m.AddNoOverlap(per_dev[d])
        m.Add(sum(w * b for w, b in load[d]) <= mk)  # implied by NoOverlap; tightens the linear relaxation
    for u, v in p.edges.tolist():
        _in_time(deadline)
        c = int(p.cut[u])
        if c <= 0:
            m.Add(fs[v] >= fe[u])
            if p.grad[u]:
                m.Add(bs[u] >= be[v])
            continue
        same = m.NewBoolVar(f"s{u}_{v}")
        for d in range(nd):  # u on d and v elsewhere -> not the same device
            m.AddBoolOr([same.Not(), x[u][d].Not(), x[v][d]])
        wait = c - c * same
        extra = int(p.across[u] - c)
        if extra > 0:  # u and v on different hosts: the slower links' least time
            apart = m.NewBoolVar(f"h{u}_{v}")
            for k in hosts:
                m.Add(apart >= sum(x[u][d] for d in range(nd) if p.host[d] == k)
                      - sum(x[v][d] for d in range(nd) if p.host[d] == k))
            wait = wait + extra * apart
        m.Add(fs[v] >= fe[u] + wait)
        if p.grad[u]:
            m.Add(bs[u] >= be[v] + wait)
    if p.pair is not None:
        _links(m, p, x, fs, fe, bs, be, horizon, deadline)
    if p.order is not None:
        _fifo(m, p, x, fs, fe, bs, be, horizon, deadline)
    if p.memory is not None:
        _memory(m, p, x, deadline)
    for d in range(nd):  # symmetry: one node on the first device of its kind
        if int(p.to_first[d][d]) != d:
            m.Add(x[p.first][d] == 0)
    if hint is not None:  # the same placement relabelled so that the pinned node is on the first of its kind
        h = np.asarray(hint, dtype=np.int64)
        h = p.to_first[int(h[p.first])][h]
        for v in range(n):
            for d in range(nd):
                m.AddHint(x[v][d], int(h[v] == d))
    m.Minimize(mk)
    if deadline is not None:  # what is left once built, less CP-SAT's own loading of the model
        now = time.perf_counter()
        seconds = min(seconds, deadline - now - LOAD_SHARE * (now - t0))
        if seconds < MIN_SEARCH:
            raise _Late
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(max(seconds, 0.01))
    solver.parameters.num_workers = int(max(1, workers))
    solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the command, not just this search
    solver.parameters.random_seed = int(seed) % 2**31  # CP-SAT's seed is a 32-bit int; any integer >= 0 given
    status = solver.Solve(m)
    if status == cp_model.INFEASIBLE:  # cannot happen below a real placement's horizon; prove nothing
        return _Solved(0.0, None, None, False, infeasible=True)
    bound = float(solver.BestObjectiveBound())
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _Solved(bound, None, None, False)
    place = np.array([next(d for d in range(nd) if solver.Value(x[v][d])) for v in range(n)], dtype=np.int64)
    return _Solved(bound, float(solver.ObjectiveValue()), place, status == cp_model.OPTIMAL)


def _fifo(m, p: _Problem, x, fs, fe, bs, be, horizon: int, deadline: float | None = None) -> None:
    """The simulator runs each device's forward ops in its priority order, one after the other (no op starts
    before the one placed there before it ends, even when its own inputs came first), then the backward ops in
    the reverse order after the last forward: ``free[d][k]``, when device ``d`` is done with the first ``k`` nodes
    of the order, bounds the next start there from below."""
    n, nd = p.fwd.shape
    order = [int(v) for v in p.order]
    for d in range(nd):
        _in_time(deadline)
        prev = None
        for v in order:  # forward
            cur = m.NewIntVar(0, horizon, f"ff{d}_{v}")
            if prev is not None:
                m.Add(cur >= prev)
                m.Add(fs[v] >= prev).OnlyEnforceIf(x[v][d])
            m.Add(cur >= fe[v]).OnlyEnforceIf(x[v][d])
            prev = cur
        for v in reversed(order):  # backward, after the device's last forward
            cur = m.NewIntVar(0, horizon, f"bf{d}_{v}")
            m.Add(cur >= prev)
            m.Add(bs[v] >= prev).OnlyEnforceIf(x[v][d])
            m.Add(cur >= be[v]).OnlyEnforceIf(x[v][d])
            prev = cur


def _memory(m, p: _Problem, x, deadline: float | None = None) -> None:
    """Every device holds what the simulator counts (``cost.simulate``, as ``memory.fit``): the bytes its nodes pin
    and, per producer on another device, the largest tensor that producer sends it (``r[u, d]``, at least each
    edge's bytes where the consumer is on ``d`` and the producer is not)."""
    pinned, edge_bytes, capacity = p.memory
    n, nd = p.fwd.shape
    recv: dict[tuple[int, int], object] = {}
    for (u, v), b in zip(p.edges.tolist(), np.asarray(edge_bytes).tolist()):
        _in_time(deadline)
        if b <= 0:
            continue
        for d in range(nd):
            r = recv.get((u, d))
            if r is None:
                r = recv[u, d] = m.NewIntVar(0, int(capacity[d]) + 1, f"r{u}_{d}")
            m.Add(r >= int(b) * (x[v][d] - x[u][d]))
    for d in range(nd):
        m.Add(sum(int(pinned[v]) * x[v][d] for v in range(n) if pinned[v] > 0)
              + sum(r for (_, k), r in recv.items() if k == d) <= int(capacity[d]))


def _links(m, p: _Problem, x, fs, fe, bs, be, horizon: int, deadline: float | None = None) -> None:
    """Each ordered pair of devices is one link that carries one transfer at a time (the simulator's
    ``link_free``): node ``u`` on ``a`` with a consumer on ``b`` sends at least one chunk over ``a -> b`` after its
    forward ends, and each consumer there waits for it; with a gradient, one goes back over ``b -> a`` after every
    consumer's backward there, and ``u``'s backward waits for it. Each chunk takes at least ``pair[u, a, b]``; the
    simulator's first chunk occupies its link at least that long from its start, so those intervals never overlap.
    A chunk of no time (a zero-byte edge sends nothing; or one under a tick) holds no link: CP-SAT's ``NoOverlap``
    keeps even an interval of size 0 out of another's inside, which would delay a consumer the simulator does not."""
    n, nd = p.fwd.shape
    cons: list[list[int]] = [[] for _ in range(n)]
    for u, v in p.edges.tolist():
        cons[u].append(v)
    on_link: dict[tuple[int, int], list] = {(a, b): [] for a in range(nd) for b in range(nd) if a != b}
    for u in range(n):
        _in_time(deadline)
        if not cons[u]:
            continue
        for b in range(nd):
            s = m.NewIntVar(0, horizon, f"ts{u}_{b}")  # the first chunk to b leaves
            m.Add(s >= fe[u])
            g = m.NewIntVar(0, horizon, f"gs{u}_{b}") if p.grad[u] else None  # the gradient from b leaves
            for a in range(nd):
                if a == b:
                    continue
                z = m.NewBoolVar(f"z{u}_{a}_{b}")  # u on a, a consumer on b
                for v in cons[u]:
                    m.AddBoolOr([x[u][a].Not(), x[v][b].Not(), z])
                    m.Add(fs[v] >= s + int(p.pair[u, a, b])).OnlyEnforceIf([x[u][a], x[v][b]])
                out, back = int(p.pair[u, a, b]), int(p.pair[u, b, a])
                if out > 0:  # a chunk of no time holds no link
                    on_link[a, b].append(m.NewOptionalFixedSizeIntervalVar(s, out, z, f"t{u}_{a}_{b}"))
                if g is not None:
                    if back > 0:
                        on_link[b, a].append(m.NewOptionalFixedSizeIntervalVar(g, back, z, f"g{u}_{a}_{b}"))
                    m.Add(bs[u] >= g + back).OnlyEnforceIf(z)
            if g is not None:
                for v in cons[u]:
                    m.Add(g >= be[v]).OnlyEnforceIf(x[v][b])
    for items in on_link.values():
        if len(items) > 1:
            m.AddNoOverlap(items)


def _whole(graph: CompGraph, costs: CostTable, topology: DeviceTopology, upper: float, hosts: bool, links: bool,
           order: str | None, kinds: np.ndarray | None = None):
    """The model's data (``kinds``: a further per-device value, e.g. memory, that interchangeable devices share)."""
    from placement_rl.cost.modes import mode_of
    from placement_rl.cost.resolve import needs_grad
    from placement_rl.cost.simulate import priority_order

    n = graph.num_nodes
    tick = float(upper) / TICKS if upper > 0 else 1.0  # upper 0: every time is 0 (cap), in ticks of any size
    cap = 2.0 * float(upper)
    cut = _ticks(cut_costs(graph, costs, topology), tick, cap)
    host = np.array([dv.host for dv in topology.devices])
    by_host = hosts and len(set(host.tolist())) > 1
    pair = pair_costs(graph, costs, topology) if by_host or links else None  # seconds
    across = np.zeros(n, dtype=np.int64)
    if by_host:
        least = np.where((host[:, None] != host[None, :])[None], pair, np.inf).min(axis=(1, 2))
        across = np.maximum(_ticks(least, tick, cap), cut)
    grad = np.zeros(n, dtype=bool) if mode_of(costs) == "inference" else needs_grad(graph).astype(bool)
    key = _device_keys(costs, host, by_host)
    if kinds is not None:
        key = np.unique(np.stack([key, np.asarray(kinds)]), axis=1, return_inverse=True)[1].reshape(-1)
    if links:  # interchangeable only where the links are too
        key, to_first = _link_keys(key, pair)
    else:
        to_first = _swaps_to_first(key)
    return _Problem(_ticks(costs.fwd_time, tick, cap), _ticks(costs.bwd_time, tick, cap),
                    np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2), cut, across, grad,
                    host if by_host else np.zeros_like(host), key, to_first,
                    int(np.asarray(graph.topo_order)[0]), pair=_ticks(pair, tick, cap) if links else None,
                    order=None if order is None else priority_order(graph, costs, order)), tick


def cp_bound(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, upper: float, seconds: float,
             lower: float = 0.0, hint: np.ndarray | None = None, workers: int = 2, seed: int = 0,
             hosts: bool = False, links: bool | None = None, order: str | None = "program") -> CpResult:
    """The ``cp`` part (module doc) after at most ``seconds`` of CP-SAT. ``upper``: the step time of a known
    placement (the horizon; the model's optimum is never above it); ``lower``: a bound already known (a constraint
    that helps the search); ``hint``: a placement to start from (e.g. the one ``upper`` came from); ``hosts``:
    model the slower links between hosts; ``links``: model each link carrying one transfer at a time (default: up
    to ``LINKS_MAX`` = N x D^2); ``order``: the simulator's priority order each device follows (None: any order,
    a bound for every order). With the links, the model without them is solved first (``LINKS_SHARE`` of the
    seconds: it proves a bound fast), then the one with them, from that bound. Building the models counts in the
    seconds (a model built past them is not solved: ``_solve``'s deadline); ``note`` says where CP-SAT proved no
    bound above ``lower`` or found no placement in them, or proved that a model has no schedule within ``upper``
    (which the hint's own schedule should meet: then neither model gives a bound or a placement)."""
    t0 = time.perf_counter()
    n = graph.num_nodes
    if n == 0:
        return CpResult(0.0, np.zeros(0, dtype=np.int64), True, 0.0)
    if not (upper > 0 and np.isfinite(upper)):
        raise ValueError(f"upper must be a finite step time > 0 of some placement, got {upper}")
    if links is None:
        links = n * topology.num_devices ** 2 <= LINKS_MAX
    deadline = t0 + seconds
    p, tick = _whole(graph, costs, topology, upper, hosts, links, order)
    lo = given = int(np.floor(lower / tick)) if lower > 0 else 0
    first = None
    if links:  # the model without links first
        quick = replace(p, pair=None)
        first = _solve(quick, horizon=TICKS + 1, lower=lo, hint=hint, seconds=LINKS_SHARE * seconds, workers=workers,
                       seed=seed, deadline=deadline)
        if first is not None:
            lo = max(lo, int(np.floor(first.bound)))
    left = deadline - time.perf_counter()
    got = None
    if first is None or not first.infeasible:  # (the model with the links has no schedule where that one has none)
        got = _solve(p, horizon=TICKS + 1, lower=lo, hint=hint, seconds=max(left, 0.01), workers=workers, seed=seed,
                     deadline=deadline)
    bound, place, optimal = (0.0, None, False) if got is None else (got.bound, got.placement, got.optimal)
    if first is not None:
        bound = max(bound, first.bound)
        if place is None:
            place = first.placement
    infeasible = any(r is not None and r.infeasible for r in (first, got))
    if infeasible:  # a model that excludes a real schedule is no relaxation: nothing from either
        bound, place, optimal = 0.0, None, False
    note = _note(seconds, n, topology.num_devices, ran=first is not None or got is not None,
                 proved=bound > given, placed=place is not None, linked=links and got is None, infeasible=infeasible)
    return CpResult(max(bound * tick * (1.0 - 1e-9), 0.0), place, optimal, time.perf_counter() - t0, note)


def _note(seconds: float, n: int, nd: int, *, ran: bool, proved: bool, placed: bool, linked: bool,
          infeasible: bool = False) -> str:
    """``CpResult.note``: what CP-SAT did not give in its seconds (empty: a bound above the known one, a
    placement); ``linked``: the model with the links was not solved for want of time; ``infeasible``: CP-SAT proved
    a model has no schedule within the horizon (not a timeout)."""
    size = f"{n} nodes on {nd} devices"
    if not ran:
        return f"CP-SAT did not run: building its model of {size} took its {seconds:g} s"
    if infeasible:
        return (f"CP-SAT proved that its model of {size} has no schedule within the start's step time, which the "
                "start's own schedule meets: the model does not hold here, no bound or placement from it")
    missing = [what for what, got in (("proved no lower bound above the known one", proved),
                                      ("found no placement", placed)) if not got]
    if not missing:
        return ""
    return (f"CP-SAT {' and '.join(missing)} in {seconds:g} s ({size}"
            + ("; the model with the links was not built in time)" if linked else ")"))


__all__ = ["CpResult", "TICKS", "cp_bound"]
