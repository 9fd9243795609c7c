"""Cuts moved by the simulator: a hill climb over the cut positions of the best simulated plans.

``exact`` chooses cuts by an analytic objective that is the simulated step only at one micro-batch and DP degree 1
(``pipe_tp``); with more micro-batches the event-level schedule, the collectives and their overlap can rank cuts
otherwise (3 A100s and a T4, an 18-node MLP: its best 4-stage cuts simulated 1.8225 ms, one cut moved by one or two
positions each gave 1.7056 ms, the optimum of a brute force over 252,050 plans). Here the plans already simulated
are grouped by configuration (stage count, DP degrees, micro-batches, sharding, TP, recomputation, sequence
parallelism); the best plan of each of the ``REFINE_CONFIGS`` best configurations has each cut moved by +-2^k
positions, largest first, a move kept when the simulator says it is better, until no move is, within the
problem's simulations and seconds.
"""

from __future__ import annotations

from placement_rl.baselines.common import Score
from placement_rl.baselines.pipe_common import PipeProblem, Plan

REFINE_CONFIGS = 8


def _plan_of(key: tuple) -> Plan:
    """A ``PipeProblem.score`` cache key as a plan: ``(cuts, degrees, m, sharding, tp[, recompute][, "sp"])``."""
    cuts, degrees, m, sharding, tp = key[:5]
    rc = next((x for x in key[5:] if isinstance(x, tuple)), None)
    return list(cuts), tuple(degrees), int(m), sharding, tp, rc, "sp" in key[5:]


def _climb(pp: PipeProblem, plan: Plan, start: Score) -> tuple[Plan, Score, int]:
    cuts, rest = list(plan[0]), plan[1:]
    cur, moves = start, 0
    steps = [2**k for k in range(max(pp.n, 2).bit_length() - 1, -1, -1)]
    improved = True
    while improved:
        improved = False
        for i in range(1, len(cuts) - 1):
            for step in steps:
                for c in (cuts[i] - step, cuts[i] + step):
                    if not cuts[i - 1] < c < cuts[i + 1]:
                        continue
                    cand = cuts[:i] + [c] + cuts[i + 1:]
                    s = pp.score(cand, *rest)
                    if s is None:  # simulations or seconds spent
                        return (cuts, *rest), cur, moves
                    if s.key < cur.key:
                        cuts, cur, improved, moves = cand, s, True, moves + 1
                        break
                else:
                    continue
                break
    return (cuts, *rest), cur, moves


def refine(pp: PipeProblem, configs: int = REFINE_CONFIGS) -> tuple[Plan | None, dict[str, object]]:
    """The best plan the climbs reach from the ``configs`` best configurations simulated so far (None when no
    contiguous plan of two or more stages was simulated), and what they did (for ``meta``)."""
    best_per: dict[tuple, tuple[tuple, Score]] = {}
    for key, s in pp.scored_items():
        if not isinstance(key[0], tuple) or len(key[0]) < 3:  # a ``Stages`` plan, or one stage: no cut to move
            continue
        conf = (len(key[0]),) + key[1:]
        if conf not in best_per or s.key < best_per[conf][1].key:
            best_per[conf] = (key, s)
    tops = sorted(best_per.values(), key=lambda ks: ks[1].key)[:configs]
    best, best_s, moves = None, None, 0
    for key, s in tops:
        plan, got, n = _climb(pp, _plan_of(key), s)
        moves += n
        if best_s is None or got.key < best_s.key:
            best, best_s = plan, got
    info: dict[str, object] = {"refined_configurations": len(tops), "refine_moves": moves}
    return best, info


__all__ = ["REFINE_CONFIGS", "refine"]
