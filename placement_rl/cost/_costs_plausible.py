"""Plausibility of measured times (``placement_rl.cost.costs_file``), for a costs file and a profile alike: one
warning line on stderr per kind of implausible time -- zero for a node with FLOPs, over ``IMPLAUSIBLE`` x the
topology's estimate, most over ``LIKELY_UNIT`` x it (a unit mistake)."""

from __future__ import annotations

import numpy as np

from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph

IMPLAUSIBLE = 1e4  # a measured time this many times the topology's own estimate is a hand edit or a broken run
LIKELY_UNIT = 300.0  # most times this many times the estimate: one factor on every time, e.g. ms read as s


def _warn_implausible(where: str, graph: CompGraph, costs: CostTable, estimate: CostTable, show: int = 3, *,
                      fix: str = "check the file or re-profile") -> None:
    """One warning line on stderr per kind of implausible measured time: zero forward time for a node with FLOPs, a
    time over ``IMPLAUSIBLE`` x the topology's estimate (hand edits, broken runs), and most nodes' times over
    ``LIKELY_UNIT`` x it (a unit mistake: one factor on every time, under ``IMPLAUSIBLE``)."""
    import sys

    measured = [j for j, src in enumerate(costs.source) if src.startswith("measured:")]
    zero, huge = [], []
    for i, name in enumerate(graph.names):
        t = [(costs.fwd_time[i, j], costs.bwd_time[i, j], estimate.fwd_time[i, j], estimate.bwd_time[i, j])
             for j in measured]
        if graph.fwd_flops[i] > 0 and any(f == 0 for f, _, _, _ in t):
            zero.append(name)
        elif any(f > IMPLAUSIBLE * ef > 0 or b > IMPLAUSIBLE * eb > 0 for f, b, ef, eb in t):
            huge.append(f"{name} {max(max(f, b) for f, b, _, _ in t):.3g} s")
    for found, what in ((zero, f"a forward time of 0 for {'nodes' if len(zero) != 1 else 'a node'} with FLOPs"),
                        (huge, f"times over {IMPLAUSIBLE:g} x the topology's estimate")):
        if found:
            more = f", ... ({len(found)} in all)" if len(found) > show else ""
            print(f"warning: {where}: {what}: {', '.join(found[:show])}{more}; {fix}", file=sys.stderr)
    ratio = _typical_ratio(costs.fwd_time[:, measured], estimate.fwd_time[:, measured])
    if ratio > LIKELY_UNIT:
        print(f"warning: {where}: most forward times are over {LIKELY_UNIT:g} x the topology's estimate (typically "
              f"{ratio:.3g} x): a unit mistake? {fix}", file=sys.stderr)


def _typical_ratio(times: np.ndarray, estimate: np.ndarray) -> float:
    """The median over nodes of a node's largest measured / estimated forward time (nodes estimated at 0 left out);
    0 where no node has an estimate."""
    ok = (estimate > 0).all(axis=1) & (times > 0).any(axis=1)
    if not ok.any():
        return 0.0
    return float(np.median((times[ok] / estimate[ok]).max(axis=1)))
