"""``cp_sat``: a placement from CP-SAT (OR-Tools) on the simulator's schedule as a constraint model, with every
device's memory a constraint; for graphs up to ``MAX_NODES`` nodes (a model, or a coarsened one, of a few layers or
blocks per node).

The model is ``bounds_cp``'s (each device runs its ops in the simulator's priority order, one at a time; every
edge across devices waits its producer's cheapest transfer; each link carries one transfer at a time), relaxed in
what a later chunk of a tensor weighs, plus memory as the simulator counts it: the bytes each node pins and, per
producer on another device, the largest tensor it sends there (``bounds_cp._memory``; bytes rounded up and
capacities down, so a placement the model admits fits). Devices of one speed and one capacity that a relabelling
keeping every link's times maps onto each other are interchangeable (a symmetry cut, ``bounds_cp._link_keys``).
CP-SAT starts from a hint: the better of ``sim_eft`` and ``la_rule_search`` run for ``HINT_SHARE`` of the seconds
(made to fit by ``memory.fit`` when over memory); its solution is simulated and the faster placement that fits is
returned (so never worse than the hint). The hint's search gets the budget less ``RESERVE`` calls, and its calls count
in the budget: given seconds, ``la_rule`` decodes at several windows (``cost.decode.decode_windows``); where the calls
left do not cover them the hint is ``la_rule_search`` without seconds (one decode at the placing window, then
annealing with the calls left), and where they do not cover that decode, ``sim_eft``'s placement annealed with them
(``cp_hint`` in the meta names the search that gave the second start). ``meta``: ``cp_bound`` (no placement that
fits memory is faster: CP-SAT's proven bound on the model, valid when stopped early), ``cp_optimal`` (the model
solved: on graphs whose producers send every consumer the same bytes its optimum is the simulator's),
``cp_improved`` (the solution beat the hint) and ``cp_seconds``; ``cp_bound`` is None where CP-SAT proved nothing in
its seconds (large models). Where the budget leaves no call to score CP-SAT's solution (a budget of 0 or 1; 2 where
a start overflows memory and its fit is scored), CP-SAT does not run: the best start comes back and ``note`` says why.
Nor does it where no placement fits memory (its model has no solution; ``note`` says so) or where the best start's
step time is 0 (every time 0: that start is optimal, ``cp_bound`` 0 and ``cp_optimal`` true). Where the best start is
over memory, CP-SAT first looks for a placement that fits memory alone (``_memory_fits``, in ``MEMORY_SHARE`` of the
seconds left): where it proves there is none (the graph fits all devices together, not any split of it), the best
start comes back and ``note`` says no placement fits memory; where CP-SAT's solution does not come either, ``note``
says it found none that fits.

Seconds: ``seconds`` when given, else ``CP_SECONDS``, for everything: the starts, building the model and CP-SAT's
search (``bounds_cp._solve``'s deadline: where the model is not built in time, or leaves CP-SAT too little, CP-SAT
does not run, the best start comes back and ``note`` says why); CP-SAT stops early when it proves its solution
optimal. The model grows as N x D^2 (links): on 4 devices it proves optima of ~10-20-node graphs in seconds; at
100-200 nodes it is a search from the hint that may find nothing better (on 8 devices its model alone takes about a
second to build at 200 nodes).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from placement_rl.baselines.common import NO_FIT, Problem, add_note
from placement_rl.errors import ConfigError

MAX_NODES = 200  # larger graphs: coarsen them first (``placement_rl.graph.coarsen``) or use a search
CP_SECONDS = 10.0  # CP-SAT's seconds when the placer is given none
HINT_SHARE = 0.3  # of the seconds for the hint: ``la_rule_search`` (the rule, then annealing)
RESERVE = 3  # calls kept from the hint's search: scoring ``sim_eft``'s start, the hint and CP-SAT's solution
UNITS = 10_000_000  # the largest capacity in integer memory units (a unit: ~1e-7 of it)
MEMORY_SHARE = 0.5  # of the seconds left, to prove that no placement fits memory where the best start is over it


def cp_sat(prob: Problem) -> np.ndarray:
    """The placement (module doc)."""
    from placement_rl.baselines.bounds_cp import LINKS_MAX, MIN_SEARCH, TICKS, _require_ortools, _solve, _whole
    from placement_rl.baselines.eft import la_rule_search, sim_eft, windows_calls
    from placement_rl.cost.window import placing_window, window_completions
    from placement_rl.baselines.memory import best_start
    from placement_rl.baselines.search import anneal

    n, nd = prob.n, prob.d
    if n > MAX_NODES:
        raise ConfigError(f"cp_sat places graphs of up to {MAX_NODES} nodes ({n} here): coarsen the graph "
                          f"(graph.coarsen.max_nodes={MAX_NODES}) or use la_rule_search")
    if prob.objective != "step":
        raise ConfigError(f"cp_sat models the step time, not objective={prob.objective}")
    try:
        _require_ortools()
    except ImportError as e:
        raise ConfigError(str(e)) from None
    t0 = prob.start
    seconds = float(prob.seconds) if prob.seconds is not None else CP_SECONDS
    deadline = t0 + seconds  # the starts, the model's building and CP-SAT's search all within the seconds
    g, c, t = prob.graph, prob.costs, prob.topology
    starts = [sim_eft(prob)]  # memory ignored where no placement fits it (``eft.state_topology``: a note says so)
    calls = prob.budget - RESERVE  # the hint's own budget, charged here; RESERVE calls kept to score the two starts
    hint_name = "sim_eft"          # and CP-SAT's solution (at budget - 1 the hint went unscored)
    window = min(placing_window(n), max(n, 1))
    if calls >= window_completions(n, nd, window) + 1:  # the rule's decode and the scoring of its placement
        timed = calls >= windows_calls(n, nd, window) + 1  # with seconds, the rule decodes at several windows
        sub = Problem(g, c, t, budget=calls, seed=prob.seed, seconds=HINT_SHARE * seconds if timed else None)
        starts.append(la_rule_search(sub))
        prob.charge(sub.calls)
        hint_name = "la_rule_search"
    elif calls > 1:  # too few calls for the rule: sim_eft's placement annealed with them
        sub = Problem(g, c, t, budget=calls, seed=prob.seed, seconds=HINT_SHARE * seconds)
        s = sub.score(starts[0])
        if s is not None:
            starts.append(anneal(sub, starts[0], s))
            hint_name = "sim_eft, annealed"
        prob.charge(sub.calls)
    scored = [(d_, prob.score(d_, after_time=True)) for d_ in starts]
    hint, hint_s = best_start(prob, scored)
    prob.meta["cp_hint"] = hint_name
    if nd == 1:
        return hint
    if not prob.fits_at_all:  # the model admits only placements that fit memory: it has no solution
        prob.meta["note"] = f"{prob.meta.get('note', 'no placement fits memory')}; CP-SAT not run (it models memory)"
        return hint
    if hint_s is not None and hint_s.feasible and hint_s.step_time <= 0:  # every time 0: nothing is faster
        prob.meta.update(cp_bound=0.0, cp_optimal=True, cp_improved=False, cp_seconds=time.perf_counter() - t0)
        return hint
    if hint_s is None or prob.budget - prob.calls < 1:
        prob.meta["note"] = (f"CP-SAT not run: the budget ({prob.budget} simulator call{'s' * (prob.budget != 1)}) "
                             f"leaves none to score its solution after its starts (give it {RESERVE} or more)")
        return hint
    # the horizon: the hint's step time when it fits; else one no schedule of a placement that fits runs past
    serial = float(prob.node_time.max(axis=1).sum())
    upper = hint_s.step_time if hint_s.feasible else 4.0 * (serial + _all_transfers(prob))
    unit = float(prob.capacity.max()) / UNITS
    pinned = np.ceil(prob.node_mem / unit)
    edge_bytes = np.ceil(np.asarray(g.edge_bytes, dtype=np.float64) / unit)
    capacity = np.floor(prob.capacity / unit)
    got = None
    if deadline - time.perf_counter() >= MIN_SEARCH:  # else the starts took the seconds
        p, tick = _whole(g, c, t, upper, False, n * nd ** 2 <= LINKS_MAX, "program", kinds=capacity)
        p = replace(p, memory=(pinned, edge_bytes, capacity))
        proof_end = deadline - (1.0 - MEMORY_SHARE) * (deadline - time.perf_counter())
        if not hint_s.feasible and _memory_fits(p, seed=prob.seed, deadline=proof_end) is False:  # no solution
            add_note(prob.meta, _no_solution(hint_fits=False))
            prob.meta.update(cp_bound=None, cp_optimal=False, cp_improved=False, cp_seconds=time.perf_counter() - t0)
            return hint
        got = _solve(p, horizon=TICKS + 1, lower=0, hint=hint, seconds=deadline - time.perf_counter(), workers=1,
                     seed=prob.seed, deadline=deadline)
    if got is None:  # building the model (or the starts) took the seconds: CP-SAT's search would run past them
        prob.meta.update(cp_bound=None, cp_optimal=False, cp_improved=False, cp_seconds=time.perf_counter() - t0,
                         note=f"CP-SAT not run: its starts and model of {n} nodes on {nd} devices took the "
                              f"{seconds:g} s (give it more seconds)")
        return hint
    bound, place, optimal = got.bound, got.placement, got.optimal
    best, best_s, improved = hint, hint_s, False
    if got.infeasible:  # proved, not out of time
        add_note(prob.meta, _no_solution(hint_fits=hint_s.feasible))
    elif place is None and not hint_s.feasible:
        add_note(prob.meta, f"CP-SAT found no placement that fits memory in its {seconds:g} s: the best start "
                            "returned")
    if place is not None:
        s = prob.score(place, after_time=True)
        if s is not None and s.key < best_s.key:
            best, best_s, improved = place, s, True
    prob.meta.update(cp_bound=bound * tick * (1.0 - 1e-9) if bound > 0 else None, cp_optimal=bool(optimal),
                     cp_improved=improved, cp_seconds=time.perf_counter() - t0)
    return best


def _no_solution(*, hint_fits: bool) -> str:
    """The note where CP-SAT proved its model (memory included, bytes rounded up) has no solution within the
    horizon: no placement fits memory, or (``hint_fits``) none within the best start's step time, that start
    included."""
    rounded = f"bytes rounded up to units of {1 / UNITS:g} of the largest device's memory"
    if not hint_fits:
        return f"{NO_FIT} (CP-SAT proved it on its model, {rounded}): the best start returned"
    return (f"CP-SAT proved that no placement within the best start's step time fits its model ({rounded}), "
            "though that start fits: the best start returned")


def _memory_fits(p, *, seed: int, deadline: float) -> bool | None:
    """Whether some placement fits memory in the model ``p`` (``bounds_cp._memory``, its times left out; devices that
    are interchangeable there pinned as in ``bounds_cp._solve``): False where CP-SAT proves none does, True where it
    finds one, None where the ``deadline`` (a ``time.perf_counter()`` instant) comes first."""
    from placement_rl.baselines.bounds_cp import _Late, _memory, _require_ortools

    cp_model = _require_ortools()
    n, nd = p.fwd.shape
    m = cp_model.CpModel()
    x = [[m.NewBoolVar(f"x{v}_{d}") for d in range(nd)] for v in range(n)]
    for v in range(n):
        m.AddExactlyOne(x[v])
    try:
        _memory(m, p, x, deadline)
    except _Late:
        return None
    for d in range(nd):  # symmetry: the pinned node on the first device of its kind
        if int(p.to_first[d][d]) != d:
            m.Add(x[p.first][d] == 0)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(max(deadline - time.perf_counter(), 0.01))
    solver.parameters.num_workers = 1
    solver.parameters.catch_sigint_signal = False  # Ctrl-C stops the command, not just this search
    solver.parameters.random_seed = int(seed) % 2**31
    status = solver.Solve(m)
    return {cp_model.INFEASIBLE: False, cp_model.FEASIBLE: True, cp_model.OPTIMAL: True}.get(status)


def _all_transfers(prob: Problem) -> float:
    """Every edge's bytes over the slowest link, plus its latency: more than all transfers of any placement take."""
    c = prob.costs
    off = ~np.eye(prob.d, dtype=bool)
    per_byte = float((1.0 / c.link_bandwidth[off]).max())
    return float(np.asarray(prob.graph.edge_bytes).sum() * per_byte + prob.graph.num_edges * c.link_latency[off].max())


__all__ = ["CP_SECONDS", "MAX_NODES", "cp_sat"]
