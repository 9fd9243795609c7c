"""Contiguous stage plans on every order of the device classes: what the fastest-first runs leave out.

``pp_exhaustive``'s first space (``pipeline._exhaustive_space``) gives stage ``k`` the ``k``-th consecutive run of
the devices sorted fastest first (ties by index). On unequal devices the best pipeline may start on a slower one (an
A100, then an L4, then an H100 on a 6-node GPT: 12.5 ms, the best fastest-first plan 16.9 ms); where links differ
between equal devices, the run a tie hands out may be the worse connected (a DDP pair joined by one NVLink of
a DGX-1, where another pair has two: 8.1 ms against 6.4 ms). Here (``order_space``) a stage's group is any
*composition* (devices per class, mixed groups allowed; classes as ``pipe_ideals.device_classes``: same cost
columns, launch overheads, memory and restrictions, and a swap of two of them leaves the links unchanged), a plan's
groups any sequence of compositions the classes hold, so every order and choice of devices that can change a
plan's time is covered; the devices of a class, interchangeable, are handed out in index order, stage by stage.
Cuts, micro-batch counts (``microbatch_choices``, the batch dividing every DP degree x micro-batches) and DDP / FSDP
are as in the first space (FSDP only where a group has more than one device: on one it is DDP). Plans whose groups
are fastest-first runs are left out (the first space has them). One class (equal devices, alike links): nothing.

Where links split many classes (every GPU of a DGX-1 its own: orders of 8 classes) ``order_space`` outgrows any
budget; ``connected_space`` is then the bounded fallback: the sequences of compositions of the cost classes alone,
each stage's devices picked best-connected (``pipe_ideals.connected_groups``), which its callers say is not every order.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Iterator

import numpy as np

from placement_rl.baselines.pipe_common import PipeProblem, Plan, Stages, microbatch_choices
from placement_rl.plans import SHARDINGS

MAX_STATES = 1 << 14  # product of (devices per class + 1) past which the orders are not listed (over any cap)
STEPS_PER_PLAN = 8  # sequences of groups visited per plan counted, at most, before the count gives up
CONNECTED_DEVICES = 16  # ``connected_space`` on clusters up to this many devices
COUNT_PAIRS = 1 << 18  # (state, composition) pairs past which the count is not bounded first (listed alone)


def order_space(pp: PipeProblem, cap: int) -> tuple[int, Iterator[Plan]]:
    """The count of these plans (above ``cap`` once it passes ``cap``: then not listed) and an iterator of them."""
    from placement_rl.baselines.pipe_ideals import device_classes, restrictions

    classes = device_classes(pp, restrictions(pp)[0])
    if len(classes) < 2:
        return 0, iter(())
    return _space(pp, cap, classes, lambda groups, v, left: _next_concrete(classes, v, left))


def connected_space(pp: PipeProblem, cap: int) -> tuple[int, Iterator[Plan]]:
    """``order_space`` over the cost classes (``pipe_ideals.cost_classes``, links not looked at), each stage's
    devices of a class picked best-connected (``pipe_ideals.connected_groups``): where links split equal
    devices (every GPU of a DGX-1 its own class) and ``order_space`` is over its cap, the device choices that
    matter most. Its fastest-first runs are in (their devices picked best-connected, not in index order). Nothing
    where links split no class or on more than ``CONNECTED_DEVICES`` devices (the count is then ``cap + 1``: not
    listed)."""
    from placement_rl.baselines.pipe_ideals import connected_groups, link_arrays, split_classes

    classes = split_classes(pp)
    if classes is None:
        return 0, iter(())
    if pp.d > CONNECTED_DEVICES:
        return cap + 1, iter(())
    links = link_arrays(pp)
    return _space(pp, cap, classes, lambda groups, v, left: connected_groups(pp, classes, (v,), links, groups)[0])


def device_orders(pp: PipeProblem, cap: int) -> tuple[int, Iterator[Plan], bool]:
    """``order_space`` and True (every order and choice of devices that matters) where it fits ``cap``, else
    ``connected_space`` and False (where that fits, or over ``cap``: not listed)."""
    total, plans = order_space(pp, cap)
    if total <= cap:
        return total, plans, True
    more, connected = connected_space(pp, cap)
    return (more, connected, False) if 0 < more <= cap else (total, iter(()), False)


def _space(pp: PipeProblem, cap: int, classes: list[list[int]],
           next_group: Callable[[tuple, tuple[int, ...], tuple[int, ...]], tuple[int, ...]]
           ) -> tuple[int, Iterator[Plan]]:
    """Every sequence of compositions the classes hold, a stage's devices given by ``next_group(groups before,
    composition, devices left per class)``; plans whose groups are fastest-first runs left out."""
    avail = [len(c) for c in classes]
    if math.prod(a + 1 for a in avail) > MAX_STATES:
        return cap + 1, iter(())
    comps = [v for v in itertools.product(*[range(a + 1) for a in avail]) if any(v) and pp.degree_ok(sum(v), 1)]
    comps.sort(key=lambda v: (sum(v), v))
    n, smax = pp.n, min(pp.n, pp.d)
    ms = {s: microbatch_choices(s, 1, None, schedule=pp.schedule) for s in range(1, smax + 1)}
    least = _least_count(pp, avail, comps, ms)
    if least is not None and least > cap:  # (8 GPUs of a DGX-1, each its own class: the listing would take seconds)
        return max(int(least), cap + 1), iter(())
    runs: list[tuple[tuple[tuple[int, ...], ...], list[int], tuple[str, ...]]] = []
    total, steps, step_cap = 0, 0, STEPS_PER_PLAN * (cap + 1) + 4096
    stack: list[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]] = [((), tuple(avail))]
    while stack:  # depth first over sequences of compositions the classes hold
        groups, left = stack.pop()
        steps += 1
        if steps > step_cap or (steps % 4096 == 0 and pp.out_of_time()):  # (given seconds spent: not listed)
            return cap + 1, iter(())
        if groups:
            degrees = [len(g) for g in groups]
            s = len(groups)
            good = [m for m in ms[s] if all(pp.degree_ok(r, m) for r in degrees)]
            if good and not _fastest_first(pp, groups):
                shs = SHARDINGS if max(degrees) > 1 else ("dp",)
                total += math.comb(n - 1, s - 1) * len(good) * len(shs)
                runs.append((groups, good, shs))
                if total > cap:
                    return total, iter(())
        if len(groups) < smax:
            for v in reversed(comps):
                if all(x <= y for x, y in zip(v, left)):
                    stack.append((groups + (next_group(groups, v, left),), tuple(y - x for x, y in zip(v, left))))
    return total, _plans(pp, runs)


def _least_count(pp: PipeProblem, avail: list[int], comps: list[tuple[int, ...]], ms: dict[int, list[int]]
                 ) -> float | None:
    """A lower bound on ``_space``'s count: its formula summed over every sequence of compositions (a dynamic
    program over the devices left per class, one per micro-batch count), less the plans of the fastest-first runs
    (one sequence per DP-degree vector at most). None where that program would be large."""
    if math.prod((a + 1) * (a + 2) // 2 for a in avail) > COUNT_PAIRS:
        return None
    radix = np.array([a + 1 for a in avail], dtype=np.int64)
    stride = np.concatenate([[1], np.cumprod(radix)[:-1]]).astype(np.int64)
    ns = math.prod(a + 1 for a in avail)
    digits = (np.arange(ns)[:, None] // stride[None, :]) % radix[None, :]  # devices left per class, per state
    sizes, src, dst = [], [], []
    for v in comps:
        at = np.flatnonzero((digits >= np.array(v)[None, :]).all(axis=1))
        sizes.append(np.full(at.size, sum(v)))
        src.append(at)
        dst.append(at - int(np.dot(v, stride)))
    size, src_all, dst_all = (np.concatenate(x) for x in (sizes, src, dst))
    total = 0.0
    for m in sorted({m for ls in ms.values() for m in ls}):
        fit = np.array([r > 0 and pp.degree_ok(r, m) for r in range(pp.d + 1)])
        step = fit[size]
        one = step & (size == 1)
        seqs, ones = np.zeros(ns), np.zeros(ns)  # sequences of s compositions (of single devices) per state
        seqs[-1] = ones[-1] = 1.0
        runs = np.zeros(pp.d + 1)  # DP-degree vectors of s stages, per devices used
        runs[0] = 1.0
        for s in range(1, max(ms) + 1):
            seqs = np.bincount(dst_all[step], weights=seqs[src_all[step]], minlength=ns)
            ones = np.bincount(dst_all[one], weights=ones[src_all[one]], minlength=ns)
            runs = np.convolve(runs, fit)[:pp.d + 1]
            if m in ms[s]:  # a sequence's plans: cut sets x its micro-batch counts x (2 shardings, 1 on DP 1)
                mine = 2 * seqs.sum() - ones.sum()
                fastest = 2 * runs.sum() - (1.0 if s <= pp.d and fit[1] else 0.0)
                total += math.comb(pp.n - 1, s - 1) * (mine * (1 - 1e-9) - fastest)
    return total


def _next_concrete(classes: list[list[int]], v: tuple[int, ...], left: tuple[int, ...]) -> tuple[int, ...]:
    """The next stage's devices: each class's next ones in index order (its devices are interchangeable)."""
    out: list[int] = []
    for devs, cnt, rest in zip(classes, v, left):
        out += devs[len(devs) - rest:len(devs) - rest + cnt]
    return tuple(int(x) for x in out)


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


__all__ = ["connected_space", "device_orders", "order_space"]
