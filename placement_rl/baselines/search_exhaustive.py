"""``exhaustive``: every placement of the ``N`` nodes on the ``D`` devices up to relabelling of interchangeable
devices, and the counting it rests on (``device_classes``, ``count_placements``, ``size_text``); split from
``placement_rl.baselines.search``, which re-exports them (see its docstring for what ``exhaustive`` returns)."""

from __future__ import annotations

import math

import numpy as np

from placement_rl.baselines.common import NO_FIT, Problem, add_note
from placement_rl.errors import ConfigError, fmt_bytes


def device_classes(prob: Problem) -> np.ndarray:
    """Class id per device (the lowest device of its class); devices are in one class when swapping them is a
    symmetry of the problem: the same forward and backward times and capacity, and link latencies and bandwidths
    that the swap leaves unchanged (a link matrix holding NaN keeps every device apart).

    Devices are first grouped by what a swap cannot change (their times, capacity, own link and sorted links to
    and from the others); within a group, each class's first device is checked against all devices left at once
    (at most O(D^3) vectorised: 512 devices in hosts of 8 in a fraction of a second, where a check per pair copying
    the link matrices took minutes)."""
    d = prob.d
    c, cap = prob.costs, prob.capacity
    mats = [np.asarray(c.link_latency), np.asarray(c.link_bandwidth)]
    cls = np.arange(d)
    if any(np.isnan(m).any() for m in mats):  # NaN != NaN: no swap keeps such a matrix equal to itself
        return cls
    cols = np.concatenate([np.asarray(c.fwd_time), np.asarray(c.bwd_time)]).T  # [D, 2N]
    off = ~np.eye(d, dtype=bool)
    parts = [cols, np.asarray(cap, dtype=np.float64).reshape(d, 1)]
    for m in mats:  # a swap keeps the diagonal entry and the multisets of the off-diagonal row and column
        parts += [np.diagonal(m).reshape(d, 1), np.sort(m[off].reshape(d, d - 1), axis=1),
                  np.sort(m.T[off].reshape(d, d - 1), axis=1)]
    profile = np.concatenate([np.asarray(x, dtype=np.float64) for x in parts], axis=1)
    groups: dict[tuple, list[int]] = {}
    for k, row in enumerate(profile.tolist()):  # float keys: 0.0 == -0.0 as in the pairwise test
        groups.setdefault(tuple(row), []).append(k)
    for members in groups.values():
        if len(members) < 2 or np.isnan(profile[members[0]]).any():  # NaN times or capacity: no equal device
            continue
        idx = np.asarray(members)
        for i, a in enumerate(members[:-1]):
            if cls[a] != a:  # in an earlier device's class: every device a swap with it keeps is in there too
                continue     # (two swaps that keep the problem compose into a third)
            b = idx[i + 1:]
            b = b[cls[b] == b]  # not yet in a class
            if b.size:
                same = np.ones(b.size, dtype=bool)
                for m in mats:
                    same &= _swap_keeps(m, a, b)
                cls[b[same]] = cls[a]
    return cls


def _swap_keeps(m: np.ndarray, a: int, b: np.ndarray) -> np.ndarray:
    """Per device ``b[k]``: whether swapping devices ``a`` and ``b[k]`` leaves the matrix ``m`` (no NaN) unchanged:
    rows ``a`` and ``b`` equal off columns ``a``, ``b`` (and columns likewise), equal diagonal entries, and
    ``m[a, b] == m[b, a]``."""
    k = np.arange(b.size)
    rows = m[b] == m[a]
    rows[:, a] = True
    rows[k, b] = True
    cols = m[:, b].T == m[:, a]
    cols[:, a] = True
    cols[k, b] = True
    return rows.all(axis=1) & cols.all(axis=1) & (m[b, b] == m[a, a]) & (m[a, b] == m[b, a])


def count_placements(n: int, class_sizes: list[int], cap: int | None = None) -> int:
    """Number of placements up to relabelling within classes (DP over how many of each class are used).

    Classes of one size are interchangeable, so a state is, per size, the sorted counts used (a partition, not a
    tuple per class: 9 classes of 8 devices gave 10^5 states at 14 nodes and ran 11 s). With ``cap``, counts
    saturate at ``cap + 1`` and the count stops once it is past ``cap`` (it never falls as nodes are added).
    """
    sizes = sorted(set(int(s) for s in class_sizes))
    groups = [sum(1 for c in class_sizes if c == s) for s in sizes]
    states: dict[tuple[tuple[int, ...], ...], int] = {tuple((0,) * g for g in groups): 1}
    for _ in range(n):
        nxt: dict[tuple[tuple[int, ...], ...], int] = {}
        for used, ways in states.items():
            k = sum(map(sum, used))
            if k:  # a device already in use
                nxt[used] = nxt.get(used, 0) + ways * k
            for gi, counts in enumerate(used):  # a new device: any class of the group with this many in use
                for v in set(counts):
                    if v < sizes[gi]:
                        lst = list(counts)
                        lst[lst.index(v)] = v + 1
                        u2 = used[:gi] + (tuple(sorted(lst)),) + used[gi + 1:]
                        nxt[u2] = nxt.get(u2, 0) + ways * counts.count(v)
        if cap is not None:
            nxt = {u: min(w, cap + 1) for u, w in nxt.items()}
        states = nxt
        if cap is not None and sum(states.values()) > cap:
            return cap + 1
    total = sum(states.values())
    return total if cap is None else min(total, cap + 1)


def size_text(n: int, d: int) -> str:
    """``d^n`` and, when large, its order of magnitude."""
    digits = n * math.log10(d) if d > 1 else 0.0
    return f"{d}^{n} = {d ** n}" if digits < 12 else f"{d}^{n} ~ 1e{int(digits)}"


def exhaustive(prob: Problem) -> np.ndarray:
    """Every placement up to relabelling of interchangeable devices (module doc): the optimum, ``meta["exhaustive"]``
    true. Given seconds that end before the enumeration, it stops there and returns the best placement simulated,
    ``meta["exhaustive"]`` false and a ``note`` saying how many it simulated (not the optimum). Where it simulated
    them all and none fits memory, the one least over it, with a ``note`` saying so."""
    n, d = prob.n, prob.d
    if count_placements(n, [d], cap=prob.budget) > prob.budget:  # over the budget even were every device alike
        _too_many(prob)  # (the fewest placements): refused before the classes are worked out
    cls = device_classes(prob)
    labels = sorted(set(cls.tolist()))
    members = [np.flatnonzero(cls == lab).tolist() for lab in labels]
    total = count_placements(n, [len(m) for m in members], cap=prob.budget)
    if total > prob.budget:
        _too_many(prob)
    best, best_s = None, None
    cur = np.zeros(n, dtype=np.int64)
    nxt_new = [0] * len(members)  # per class: how many of its devices are already used
    done = 0  # placements simulated; the enumeration stops at the first the seconds leave unscored

    def rec(i: int) -> bool:
        """False once the seconds are spent (the enumeration stops)."""
        nonlocal best, best_s, done
        if i == n:
            s = prob.score(cur)
            if s is None:
                return False
            done += 1
            if best_s is None or s.key < best_s.key:
                best, best_s = cur.copy(), s
            return True
        for c, devs in enumerate(members):
            for k in devs[:nxt_new[c]]:  # devices of this class already in use
                cur[i] = k
                if not rec(i + 1):
                    return False
            if nxt_new[c] < len(devs):  # the lowest unused device of the class
                cur[i] = devs[nxt_new[c]]
                nxt_new[c] += 1
                going = rec(i + 1)
                nxt_new[c] -= 1
                if not going:
                    return False
        return True

    whole = rec(0)
    prob.meta["exhaustive"] = whole
    if not whole:
        why = "the budget ran out" if prob.seconds is None else f"cut short at {prob.seconds:g} s"
        prob.meta["note"] = (f"not exhaustive: {done} of {total} placements simulated, {why} (the best of them, "
                             "not the optimum)")
    elif best_s is not None and not best_s.feasible:  # every placement simulated: none fits
        why = NO_FIT if prob.fits_at_all else prob.no_fit_text()
        add_note(prob.meta, f"{why}: all {done} placements (up to interchangeable devices) are over it, the "
                            f"least over returned ({fmt_bytes(best_s.overflow)} over capacity in all)")
    return best if best is not None else cur  # none simulated: the first placement, scored by ``finish``


def _too_many(prob: Problem) -> None:
    n, d = prob.n, prob.d
    raise ConfigError(f"exhaustive search needs more than {prob.budget} simulations (the budget) for {n} "
                      f"nodes on {d} devices ({size_text(n, d)} placements before symmetry breaking): "
                      "raise the budget or use a smaller graph")
