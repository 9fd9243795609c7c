"""Reachability in the coarsening's group graph, pruned by a topological position per group.

``GroupOrder`` keeps ``pos``, an integer per group with ``pos[x] < pos[y]`` for every edge ``x -> y``. Every node
on a path into ``t`` is placed before ``t``, so a search for ``t`` never enters a group placed after it: the
answer is the one an unbounded search gives, and the work is bounded by the groups placed between the two ends.

The order is repaired after each change of the group graph as in Pearce and Kelly's dynamic topological sort
("A dynamic topological sort algorithm for directed acyclic graphs", JEA 2007): when new edges ``f -> c`` run
backwards (``pos[f] > pos[c]``, and ``c`` reaches no such ``f``), let ``hi`` be the latest such ``f``,
``ahead`` be ``c`` with its descendants placed before ``hi`` and ``behind`` be those ``f`` with their ancestors
placed after ``c``. The two sets are disjoint (else ``c`` would reach an ``f``), and giving their pooled positions
first to ``behind`` then to ``ahead`` (each in its old order) makes every edge point forward again: ``behind``
only moves earlier, ``ahead`` only later, and any group that feeds ``behind`` or is fed by ``ahead`` from inside
the window already belongs to that set. Only groups between ``pos[c]`` and ``hi`` move. New edges ``c -> s``
with ``pos[s] < pos[c]`` are repaired the mirrored way.

Contracting two groups that no third path joins keeps the graph acyclic. The merged group takes the earlier
group's position (then only edges from the later group's predecessors can run backwards) or the later one's (then
only edges to the earlier group's successors can), whichever side has fewer such edges: a group feeding a hub of
thousands of predecessors joins it at the hub's position and moves nothing.
"""

from __future__ import annotations

from typing import Collection, Iterable, Mapping, Sequence


class GroupOrder:
    """A topological position per group of a mutable acyclic group graph, and searches pruned by it.

    ``succ`` and ``pred`` are the graph's adjacency (indexed by group; any container of group ids per entry),
    shared with the caller, who changes them and then calls ``place_after`` or ``finish_contract``. ``visits`` counts
    the groups entered by all searches, a measure of the work done.
    """

    def __init__(self, succ: Sequence[Mapping[int, float]], pred: Sequence[Collection[int]],
                 pos: Iterable[int] = ()) -> None:
        self.succ = succ
        self.pred = pred
        self.pos = list(pos)
        self.visits = 0

    def add(self) -> None:
        """Place a new group (one more than the groups so far) after all others."""
        self.pos.append(len(self.pos))

    def reaches(self, a: int, targets: Collection[int], *, skip: int = -1) -> bool:
        """Whether a group in ``targets`` is reachable from ``a`` without using the direct edge ``a -> skip``."""
        if not targets:
            return False
        pos = self.pos
        limit = max(pos[t] for t in targets)
        if limit <= pos[a]:
            return False
        return self._forward([x for x in self.succ[a] if x != skip], limit, set(targets))[1]

    def place_after(self, c: int, feeders: Iterable[int]) -> None:
        """Repair the order after edges ``f -> c`` were added for ``f`` in ``feeders`` (closing no cycle)."""
        pos = self.pos
        late = [f for f in feeders if pos[f] > pos[c]]
        if not late:
            return
        ahead = self._forward([c], max(pos[f] for f in late), ())[0]
        behind = self._backward(late, pos[c])
        self._reassign(behind, ahead)

    def place_before(self, c: int, consumers: Iterable[int]) -> None:
        """Repair the order after edges ``c -> s`` were added for ``s`` in ``consumers`` (closing no cycle)."""
        pos = self.pos
        early = [s for s in consumers if pos[s] < pos[c]]
        if not early:
            return
        behind = self._backward([c], min(pos[s] for s in early))
        ahead = self._forward(early, pos[c], ())[0]
        self._reassign(behind, ahead)

    def plan_contract(self, a: int, b: int) -> tuple[int, list[int], bool]:
        """Before ``a`` and ``b`` are merged: the merged group's position, and the groups whose edges to it may then
        run backwards (predecessors of the later group when the flag is true, else successors of the earlier one)."""
        pos = self.pos
        early, late = (a, b) if pos[a] < pos[b] else (b, a)
        if len(self.succ[early]) < len(self.pred[late]):
            return pos[late], [x for x in self.succ[early] if x != late], False
        return pos[early], [x for x in self.pred[late] if x != early], True

    def finish_contract(self, keep: int, plan: tuple[int, list[int], bool]) -> None:
        """Repair the order once the adjacency was merged into ``keep``; ``plan`` is ``plan_contract``'s answer."""
        slot, groups, feeders = plan
        self.pos[keep] = slot
        if feeders:
            self.place_after(keep, groups)
        else:
            self.place_before(keep, groups)

    def _reassign(self, behind: set[int], ahead: set[int]) -> None:
        """Give the pooled positions of both sets first to ``behind``, then to ``ahead``, each in its old order."""
        pos = self.pos
        moved = sorted(behind, key=pos.__getitem__) + sorted(ahead, key=pos.__getitem__)
        for x, p in zip(moved, sorted(pos[x] for x in moved)):
            pos[x] = p

    def _forward(self, starts: list[int], limit: int, stop: Collection[int]) -> tuple[set[int], bool]:
        """Groups reachable from ``starts`` placed at or before ``limit``; whether the search met ``stop``."""
        pos, succ = self.pos, self.succ
        stack = [x for x in starts if pos[x] <= limit]
        seen = set(stack)
        found = False
        while stack:
            x = stack.pop()
            if x in stop:
                found = True
                break
            for y in succ[x]:
                if pos[y] <= limit and y not in seen:
                    seen.add(y)
                    stack.append(y)
        self.visits += len(seen)
        return seen, found

    def _backward(self, starts: list[int], limit: int) -> set[int]:
        """Groups that reach one of ``starts`` (included) and are placed after ``limit``."""
        pos, pred = self.pos, self.pred
        stack = list(starts)
        seen = set(stack)
        while stack:
            x = stack.pop()
            for y in pred[x]:
                if pos[y] > limit and y not in seen:
                    seen.add(y)
                    stack.append(y)
        self.visits += len(seen)
        return seen
