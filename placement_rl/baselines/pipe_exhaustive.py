"""``pp_exhaustive``: every contiguous stage plan (stage count x cut set x DP-degree vector x micro-batch count x
sharding; see ``placement_rl.baselines.pipeline``'s module doc), and the size of that space (``compositions``,
``count_compositions``, ``_exhaustive_space``), which ``exact`` also enumerates where its budget holds it."""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np

from placement_rl.baselines.pipe_common import Plan, PipeProblem, microbatch_choices
from placement_rl.errors import ConfigError
from placement_rl.plans import SHARDINGS

FASTEST_FIRST_ONLY = "over fastest-first device runs only"  # ``pp_exhaustive``'s note where it is not the optimum


def compositions(s: int, total_max: int, allowed: Callable[[int], bool] = lambda r: True) -> list[tuple[int, ...]]:
    """Vectors of ``s`` allowed positive integers with sum <= ``total_max``."""
    if s == 0:
        return [()]
    return [(r, *rest) for r in range(1, total_max - s + 2) if allowed(r)
            for rest in compositions(s - 1, total_max - r, allowed)]


def count_compositions(s: int, total_max: int, allowed: Callable[[int], bool]) -> int:
    """``len(compositions(s, total_max, allowed))`` without listing them (DP over parts and sum)."""
    ways = np.zeros(total_max + 1, dtype=object)
    ways[0] = 1
    for _ in range(s):
        nxt = np.zeros(total_max + 1, dtype=object)
        for r in range(1, total_max + 1):
            if allowed(r):
                nxt[r:] += ways[:total_max + 1 - r]
        ways = nxt
    return int(ways.sum())


def _exhaustive_space(pp: PipeProblem, cap: int | None = None):
    """``pp_exhaustive``'s candidate count (with ``cap``: counted only until it passes ``cap``, which the count
    then exceeds; a 512-device count would take minutes) and a generator of them."""
    n, d = pp.n, pp.d
    stages = range(1, min(n, d) + 1)
    ms = {s: microbatch_choices(s, 1, None, schedule=pp.schedule) for s in stages}
    total = 0
    for s in stages:
        for m in ms[s]:
            total += len(SHARDINGS) * math.comb(n - 1, s - 1) * count_compositions(s, d, lambda r: pp.degree_ok(r, m))
            if cap is not None and total > cap:
                break
        if cap is not None and total > cap:
            break
    cands = (([0, *bars, n], degrees, m, sh) for s in stages for m in ms[s]
             for degrees in compositions(s, d, lambda r: pp.degree_ok(r, m))
             for bars in itertools.combinations(range(1, n), s - 1) for sh in SHARDINGS)
    return total, cands


def pp_exhaustive(pp: PipeProblem) -> Plan:
    """Every contiguous plan (TP 1, no recomputation): every stage count x cut set x DP-degree vector x micro-batch
    count x sharding on consecutive runs of the devices sorted fastest first and, on devices that differ (speed,
    memory or links), on every order and choice of their classes (``pipe_orders.order_space``) where the budget
    holds them all; where it does not, the fastest-first runs alone (where links split equal devices, also on the
    best-connected of them: ``pipe_orders.connected_space``), and ``meta["note"]`` says so."""
    from placement_rl.baselines.pipe_orders import device_orders

    n, d = pp.n, pp.d
    total, cands = _exhaustive_space(pp)
    if total > pp.budget:
        size = str(total) if total < 10**12 else f"~1e{len(str(total)) - 1}"
        raise ConfigError(f"pp_exhaustive needs {size} simulations (every cut set x DP degrees x micro-batch count "
                          f"x sharding for {n} nodes on {d} devices), but the budget is {pp.budget}: raise the "
                          "budget or use a smaller graph")
    more, orders, every_order = device_orders(pp, cap=pp.budget - total)
    if more > pp.budget - total:
        orders, more = iter(()), 0
        pp.extra_meta["note"] = (f"{FASTEST_FIRST_ONLY}: every order of the devices that differ (in speed, memory "
                                 f"or links) needs more than the budget of {pp.budget} simulations")
    elif not every_order:
        pp.extra_meta["note"] = (f"{FASTEST_FIRST_ONLY}, their devices also picked best-connected: every order and "
                                 f"choice of the devices (their links differ) needs more than the budget of "
                                 f"{pp.budget} simulations")
    best = pp.best_of(itertools.chain(cands, orders))
    if pp.cut_short:  # its row is the optimum or nothing
        raise ConfigError(f"pp_exhaustive stopped at {pp.seconds:g} s after {pp.calls} of its {total + more} "
                          "simulations (not the optimum): give it more seconds or use a smaller graph")
    return best
