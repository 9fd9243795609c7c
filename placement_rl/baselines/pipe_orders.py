"""Contiguous stage plans on every order of the device classes: what the fastest-first runs leave out.

``pp_exhaustive``'s first space (``pipeline._exhaustive_space``) gives stage ``k`` the ``k``-th consecutive run of
the devices sorted fastest first. On unequal devices the best pipeline may start on a slower one (an A100, then an
L4, then an H100 on a 6-node GPT: 12.5 ms, the best fastest-first plan 16.9 ms). Here a stage's group is any
*composition* (devices per class, mixed groups allowed; classes as ``pipe_ideals.device_classes``: same cost
columns, launch overheads, memory and restrictions), a plan's groups any sequence of compositions the classes hold,
so every order of the classes is covered; the devices of a class are handed out in index order, stage by stage
(devices of a class are interchangeable where their links are alike: one host, or one device per host on uniform
links). Cuts, micro-batch counts (``microbatch_choices``, the batch dividing every DP degree x micro-batches) and
DDP / FSDP are as in the first space (FSDP only where a group has more than one device: on one it is DDP). Plans
whose groups are fastest-first runs are left out (the first space has them). One class (equal devices): nothing.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

import numpy as np

from placement_rl.baselines.pipe_common import PipeProblem, Plan, Stages, microbatch_choices
from placement_rl.plans import SHARDINGS

MAX_STATES = 1 << 14  # product of (devices per class + 1) past which the orders are not listed (over any cap)
STEPS_PER_PLAN = 8  # sequences of groups visited per plan counted, at most, before the count gives up


def order_space(pp: PipeProblem, cap: int) -> tuple[int, Iterator[Plan]]:
    """The count of these plans (above ``cap`` once it passes ``cap``: then not listed) and an iterator of them."""
    from placement_rl.baselines.pipe_ideals import device_classes, restrictions

    classes = device_classes(pp, restrictions(pp)[0])
    avail = [len(c) for c in classes]
    if len(classes) < 2:
        return 0, iter(())
    if math.prod(a + 1 for a in avail) > MAX_STATES:
        return cap + 1, iter(())
    comps = [v for v in itertools.product(*[range(a + 1) for a in avail]) if any(v) and pp.degree_ok(sum(v), 1)]
    comps.sort(key=lambda v: (sum(v), v))
    n, smax = pp.n, min(pp.n, pp.d)
    ms = {s: microbatch_choices(s, 1, None, schedule=pp.schedule) for s in range(1, smax + 1)}
    runs: list[tuple[tuple[tuple[int, ...], ...], list[int], tuple[str, ...]]] = []
    total, steps, step_cap = 0, 0, STEPS_PER_PLAN * (cap + 1) + 4096
    stack: list[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]] = [((), tuple(avail))]
    while stack:  # depth first over sequences of compositions the classes hold
        seq, left = stack.pop()
        steps += 1
        if steps > step_cap:
            return cap + 1, iter(())
        if seq:
            groups = _concrete(classes, seq)
            degrees = [len(g) for g in groups]
            s = len(seq)
            good = [m for m in ms[s] if all(pp.degree_ok(r, m) for r in degrees)]
            if good and not _fastest_first(pp, groups):
                shs = SHARDINGS if max(degrees) > 1 else ("dp",)
                total += math.comb(n - 1, s - 1) * len(good) * len(shs)
                runs.append((groups, good, shs))
                if total > cap:
                    return total, iter(())
        if len(seq) < smax:
            for v in reversed(comps):
                if all(x <= y for x, y in zip(v, left)):
                    stack.append((seq + (v,), tuple(y - x for x, y in zip(v, left))))
    return total, _plans(pp, runs)


def _concrete(classes: list[list[int]], seq: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Devices of each stage: each class's devices in index order, stage by stage."""
    cursor = [0] * len(classes)
    groups = []
    for v in seq:
        g = []
        for k, cnt in enumerate(v):
            g += classes[k][cursor[k]:cursor[k] + cnt]
            cursor[k] += cnt
        groups.append(tuple(int(x) for x in g))
    return tuple(groups)


def _fastest_first(pp: PipeProblem, groups: tuple[tuple[int, ...], ...]) -> bool:
    """Whether the groups are consecutive runs of ``pp.devs`` (a plan of ``pipeline._exhaustive_space``)."""
    lo = 0
    for g in groups:
        if set(g) != {int(x) for x in pp.devs[lo:lo + len(g)]}:
            return False
        lo += len(g)
    return True


def _plans(pp: PipeProblem, runs: list) -> Iterator[Plan]:
    n = pp.n
    for groups, good, shs in runs:
        s = len(groups)
        degrees = tuple(len(g) for g in groups)
        for m in good:
            for bars in itertools.combinations(range(1, n), s - 1):
                cuts = [0, *bars, n]
                stage = np.empty(n, dtype=np.int64)
                for k in range(s):
                    stage[pp.order[cuts[k]:cuts[k + 1]]] = k
                st = Stages(tuple(int(x) for x in stage), groups)
                for sh in shs:
                    yield st, degrees, m, sh


__all__ = ["order_space"]
