"""The constructive placer's own heuristics, as baselines: the bar the learned policy must clear.

* ``sim_eft``: each node, in the simulator's own order, on the device where its forward pass ends first given
  everything placed before it (transfers over the links included; devices it does not fit on are masked). One
  pass over the schedule state; 1 simulator call (the final placement's).
* ``eft_rollout``: one-step lookahead over ``sim_eft`` (``placement_rl.cost.lookahead``): at every decision each
  device the node fits on is tried and the rest of the graph completed by ``sim_eft``; the device whose completed
  step is shortest wins. Never worse than ``sim_eft`` on the step it sees; it is the pretrained policy's teacher.
  It evaluates up to N x D completed placements, each counted as a simulator call, and costs O(N^2 D): it runs
  only when the budget covers N x D + 1 calls and the graph has at most ``ROLLOUT_MAX_NODES`` nodes (otherwise a
  one-line ``ConfigError``, a row with a note in a comparison).
* ``la_rule``: at every decision (the simulator's order) the device with the smallest ``la_step``, the completed
  step of each device's earliest-finish completion (near-ties by the earliest finish), at the learned policy's
  window (the whole rest of the graph up to ``FULL_WINDOW`` nodes, else ``POLICY_WINDOW``): the rule the policy's
  lookahead feature is, with no network (``cost.decode.LA_RULE``). Charged every completed placement it evaluates
  (``window_completions``: N x D + 1 at the whole-graph window) like ``eft_rollout``; O(N^2 D^2) at the whole-graph
  window, O(N W D^2) above ``FULL_WINDOW`` nodes, so it runs at any size the policy places (layered-4500 on 8 H100s:
  2.7 s, the policy's greedy 1.6 s). It had been skipped above ``ROLLOUT_MAX_NODES`` like ``eft_rollout``, which
  left the rule the policy must beat out of every table there.
* ``la_rule_search``: ``la_rule`` and, while they fit in half the seconds, the rule on links ``LINK_SCALES`` x
  slower (``link_starts``), then annealing from the best with the rest of the budget (or seconds).

Where no placement fits memory (the graph's pinned memory exceeds all devices' together, which the schedule state
these rules decide on refuses: ``cost.schedule.check_fits``), each decides with memory ignored (``state_topology``:
every device holding the whole graph, as ``bounds.relaxed_start``) and its placement is scored on the true memory: it
returns an infeasible placement, as every other placer does (a ``note`` in the meta says so).

Given seconds (``Problem.seconds``), ``eft_rollout`` stops its lookahead when the seconds run out and places the
rest by the earliest finish (the meta's ``start_cut`` says where), and ``la_rule`` takes the best of whole decodes
at the windows that fit in its seconds (``cost.decode.decode_windows``, the same start ``policy_search`` takes with
the policy), so their searches return in their seconds like every other search (at 2,000 nodes ``eft_rollout``
alone takes 4-8 s on this machine, ``la_rule`` at its window 0.3-0.9 s). Those windows are also held to its calls
(``first_window``: fewer of them where the budget does not cover them all, down to the one decode at its window it
makes without seconds), so a placer given seconds never spends more calls than its budget.
* ``eft_rollout_search``: ``eft_rollout``, then simulated annealing (``search.anneal``, the local-search placer's
  moves and temperature) from its placement with the rest of the budget: the cheap heuristic + search a learned
  placer is measured against in fine-tuning (``scripts/bench_generalization.py --part finetune``). Never worse
  than ``eft_rollout``. Given seconds, its lookahead stops after ``START_SHARE`` of them (the rest placed by the
  earliest finish), as ``la_rule_search``'s start does, so the annealing (and the memory repair of a start that
  overflows) keeps the other half; before, at 2,000 nodes the lookahead took all of a 0.5 or 2 s budget. Dev
  (the eight 2,000-node graphs of seeds 6-7, 0.5 / 2 / 10 s): half the seconds over all of them 1.002 / 1.001 /
  1.000 where both fit, and a result that fits memory on 6 / 7 / 7 of 8 graphs against 5 / 6 / 7.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

import placement_rl.baselines.search as search
from placement_rl.baselines.common import Problem
from placement_rl.baselines.memory import best_start
from placement_rl.cost.lookahead import complete_eft, eft_rollout as _eft_rollout
from placement_rl.cost.decode import LA_RULE, SMALL_WINDOW, START_SHARE, _halvings, decode, decode_windows
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.window import placing_window, window_completions
from placement_rl.errors import ConfigError, fmt_bytes
from placement_rl.topology import DeviceTopology

ROLLOUT_MAX_NODES = 4000  # O(N^2 D): about 10 s at 4,000 nodes on 8 devices on one core
LINK_SCALES = (1.5, 2.0, 0.75, 3.0, 4.0)  # the link slowdowns a one-pass rule also decides on (``la_rule_links``,
# the policy's best of k, ``agents.constructive_eval``): dev-comm pairs (scripts/probe_learning_comm.py), la_rule
# deciding on each alone 0.976 / 1.006 / 0.999 / 1.013 / 1.083 x la_rule, the best of all six 0.950; on the dev split
# 1.005 / 1.024 / 1.009 / 1.054 / 1.067, the best of all six 0.997 (each placement run on the true links)


def la_rule_devices(graph, costs, topology, window: int | None = None, *, deadline: float | None = None,
                    stats: dict[str, int] | None = None, calls: int | None = None) -> tuple[np.ndarray, int]:
    """``(devices, completions)``: the ``la_step`` rule at ``window`` (default: the policy's placing window); with a
    ``deadline`` (a ``time.perf_counter()`` value) the best of whole decodes at the windows that fit before it
    (``cost.decode.decode_windows``; one cut short places the rest by the earliest finish; ``stats``:
    ``lookahead_steps``, the most decisions the rule made in one decode, and ``windows``) and, given ``calls``, whose
    completions fit in them (``first_window``; at least one decode at ``window``, whatever ``calls`` says)."""
    w = placing_window(graph.num_nodes) if window is None else int(window)
    small = SMALL_WINDOW if deadline is None or calls is None else first_window(graph.num_nodes,
                                                                                topology.num_devices, w, calls)
    log: list = []
    st, completions = decode_windows(graph, costs, topology, LA_RULE, window=w, deadline=deadline, small=small,
                                     log=log)
    if stats is not None:
        stats["lookahead_steps"] = max(e[1] for e in log)
        stats["windows"] = [list(e[:2]) for e in log]
    return st.devices[0].copy(), completions


def windows_calls(n: int, d: int, window: int, small: int = SMALL_WINDOW) -> int:
    """The most completions ``decode_windows`` charges with a deadline and first window ``small``: a whole decode at
    each window it may try (``small``, then ``window`` and its halvings), plus one step time per decode after the
    first."""
    window = min(int(window), max(n, 1))
    todo = [min(int(small), window), *_halvings(window, int(small))]
    return sum(window_completions(n, d, x) for x in todo) + len(todo) - 1


def first_window(n: int, d: int, window: int, calls: int) -> int:
    """``decode_windows``' first window such that its decodes charge at most ``calls`` completions: ``SMALL_WINDOW``,
    doubled while they would charge more (fewer halvings of ``window`` tried); from ``window`` on, the one decode at
    ``window`` (the least any of them charges)."""
    small = SMALL_WINDOW
    while small < min(int(window), max(n, 1)) and windows_calls(n, d, window, small) > calls:
        small *= 2
    return small


def la_rule(prob: Problem, share: float = 1.0) -> np.ndarray:
    """The rule (module doc); with seconds, its decodes fit in ``share`` of them and in the budget (its calls left
    less one, the score of its placement: ``first_window``; ``la_rule_search``: the search's start share,
    ``cost.decode.START_SHARE``)."""
    n, d = prob.n, prob.d
    need = window_completions(n, d, placing_window(n)) + 1
    if prob.budget < need:
        raise ConfigError(f"la_rule completes up to {need - 1} placements: it needs a budget of {need} simulator "
                          f"calls (the budget is {prob.budget})")
    stats: dict[str, int] = {}
    deadline = None if prob.seconds is None else prob.start + float(share) * prob.seconds
    devices, completions = la_rule_devices(prob.graph, prob.costs, state_topology(prob), deadline=deadline, stats=stats,
                                           calls=prob.budget - prob.calls - 1)
    prob.charge(completions)
    _note_cut(prob, "la_rule", stats)
    if deadline is not None:
        prob.meta["start_windows"] = stats["windows"]
    return devices


def link_scaled_devices(graph, costs, topology, chooser: int = LA_RULE, head: tuple | None = None, *, window: int,
                        scale: float) -> np.ndarray:
    """The placement a one-pass chooser (``cost.decode``: ``LA_RULE``, or the policy's ``POLICY`` with its head)
    makes when every transfer takes ``scale`` times its time (latency and per-byte time of every link, measured
    curves included); run it on the true links to score it. Where the rule underrates the cost of spreading a
    graph over slow links (communication-heavy pairs), a slower view of the links keeps more of it together."""
    st = ScheduleState(graph, costs, topology, episodes=1, window=int(window))
    if scale != 1.0:
        st._link_coef[...] = st._link_coef * float(scale)  # (alpha, beta) of every segment of every link
    decode(st, chooser, head)
    return st.devices[0].copy()


def link_views(graph, costs, topology, chooser: int = LA_RULE, head: tuple | None = None, *, window: int,
               fits: Callable[[float | None], bool]) -> Iterator[tuple[float, np.ndarray]]:
    """``(scale, devices)`` for each of ``LINK_SCALES`` in order (``link_scaled_devices``), while ``fits(slowest)``
    says one more fits: ``slowest`` is the most wall seconds one view took so far (None before the first), each
    counted from its decode until the caller asks for the next (its scoring included). The one loop of
    ``la_rule_links``, ``link_starts`` and ``policy_search``'s link-scaled starts."""
    slowest: float | None = None
    for scale in LINK_SCALES:
        if not fits(slowest):
            return
        t0 = time.perf_counter()
        yield scale, link_scaled_devices(graph, costs, topology, chooser, head, window=window, scale=scale)
        took = time.perf_counter() - t0
        slowest = took if slowest is None else max(slowest, took)


def la_rule_links(prob: Problem) -> np.ndarray:
    """``la_rule``, and the rule deciding on links ``LINK_SCALES`` x slower, each run on the true links: the best
    (a multi-pass rule: each decode charged as ``la_rule``'s; given seconds or calls, the scales that fit after the
    plain rule, in ``LINK_SCALES``' order; ``link_scales`` in the meta). Given seconds, the views decode at the
    largest window the plain rule decoded whole, while one more fits in them (timed as ``link_starts`` does: at
    first by the seconds the plain rule took, then by the slowest view)."""
    best = la_rule(prob)
    best_s = prob.score(best)
    w = placing_window(prob.n)
    first = prob.elapsed  # the plain rule's seconds: at least one whole decode at the window below
    if prob.seconds is not None:  # its seconds may have left none whole at the placing window
        whole = [int(e[0]) for e in prob.meta.get("start_windows", []) if int(e[1]) >= prob.n]
        w = max(whole, default=0)
    need = window_completions(prob.n, prob.d, w) if w else 0
    done = [1.0]

    def fits(slowest: float | None) -> bool:  # calls left, and with seconds the time for one more view
        one = first if slowest is None else slowest
        return (w > 0 and best_s is not None and prob.left >= need + 1
                and (prob.seconds is None or prob.elapsed + one <= prob.seconds))

    for scale, dev in link_views(prob.graph, prob.costs, state_topology(prob), LA_RULE, window=w, fits=fits):
        prob.charge(need)
        s = prob.score(dev)
        done.append(scale)
        if s is not None and s.key < best_s.key:
            best, best_s = dev, s
    prob.meta["link_scales"] = done
    return best


def sim_eft_devices(graph, costs, topology) -> np.ndarray:
    """The earliest-finish-time rule in the simulator's order, on the constructive state (memory-masked)."""
    st = ScheduleState(graph, costs, topology, episodes=1, window=0)
    complete_eft(st)
    return st.devices[0].copy()


def sim_eft(prob: Problem) -> np.ndarray:
    return sim_eft_devices(prob.graph, prob.costs, state_topology(prob))


def state_topology(prob: Problem) -> DeviceTopology:
    """The topology the rules build their schedule state on: ``prob.topology``, or where no placement fits memory
    (``Problem.fits_at_all``: the state refuses such a graph) the same devices each holding the whole graph (memory
    ignored, as ``bounds.relaxed_start``), with a ``note`` in the meta saying so; placements are still scored on
    ``prob.topology``, so the result is infeasible."""
    if prob.fits_at_all:
        return prob.topology
    need, have = float(prob.node_mem.sum()), float(prob.capacity.sum())
    prob.meta["note"] = (f"no placement fits memory (the graph pins {fmt_bytes(need)}, the devices have "
                         f"{fmt_bytes(have)} in all): placed with memory ignored")
    return holding(prob.topology, need)


def holding(topology: DeviceTopology, need: float) -> DeviceTopology:
    """``topology`` with every device holding at least ``need`` bytes (memory relaxed: the whole graph fits on any)."""
    return replace(topology, devices=[replace(d, memory_bytes=max(float(d.memory_bytes), need))
                                      for d in topology.devices])


def eft_rollout(prob: Problem, share: float = 1.0) -> np.ndarray:
    """The lookahead (module doc); with seconds, it stops looking ahead after ``share`` of them (``eft_rollout_search``:
    the search's start share, ``cost.decode.START_SHARE``, as ``la_rule_search``'s start)."""
    n, d = prob.n, prob.d
    if n > ROLLOUT_MAX_NODES:
        raise ConfigError(f"eft_rollout is O(N^2 D): skipped above {ROLLOUT_MAX_NODES} nodes ({n} here)")
    if prob.budget < n * d + 1:
        raise ConfigError(f"eft_rollout completes up to N x D = {n * d} placements: it needs a budget of {n * d + 1} "
                          f"simulator calls (the budget is {prob.budget})")
    stats: dict[str, int] = {}
    deadline = None if prob.seconds is None else prob.start + float(share) * prob.seconds
    devices, _, _ = _eft_rollout(prob.graph, prob.costs, state_topology(prob), stats=stats, deadline=deadline)
    prob.charge(int(stats["completions"]))
    _note_cut(prob, "eft_rollout", stats)
    return devices


def start_cut(rule: str, steps: int, nodes: int) -> dict[str, object] | None:
    """The meta's ``start_cut`` of a one-pass start whose lookahead made ``steps`` of its ``nodes`` decisions before
    the seconds ran out (None when it made them all)."""
    return {"rule": rule, "lookahead_steps": int(steps), "nodes": int(nodes)} if steps < nodes else None


def _note_cut(prob: Problem, rule: str, stats: dict[str, int]) -> None:
    cut = start_cut(rule, stats["lookahead_steps"], prob.n)
    if cut is not None:
        prob.meta["start_cut"] = cut


def link_starts(prob: Problem, start: np.ndarray, score, chooser: int = LA_RULE, head: tuple | None = None, *,
                window: int | None = None):
    """``(start, score)``: the best of ``start`` and the chooser's placements on links ``LINK_SCALES`` x slower
    (``link_scaled_devices``, each charged as a whole-window decode; ``memory.best_start``: each over memory weighed
    as ``memory.fit`` makes it fit), taken while each fits in the calls left and,
    with seconds, before ``START_SHARE`` of them (each decode's time predicted by the slowest so far, at first by
    the seconds the start took); ``link_starts`` in the meta lists the scales taken. Dev (la_rule_search at equal
    seconds, over it without them): the communication-heavy pairs of scripts/probe_learning_comm.py 0.982 / 0.980
    at 2 / 10 s, 8 dev-split pairs 0.999 / 0.991."""
    n, d = prob.n, prob.d
    if window is None:  # the largest window a whole decode of the start ran at (its seconds bound one more)
        done = [int(e[0]) for e in prob.meta.get("start_windows", [[placing_window(n), n]]) if int(e[1]) >= n]
        if not done:
            prob.meta["link_starts"] = []
            return start, score
        window = max(done)
    w = int(window)
    need = window_completions(n, d, w)
    first = prob.elapsed  # the start's own seconds: at least one decode at that window
    taken, scored = [], [(start, score)]

    def fits(slowest: float | None) -> bool:
        one = first if slowest is None else slowest
        return prob.left >= need + 1 and (prob.seconds is None or prob.elapsed + one <= START_SHARE * prob.seconds)

    for scale, dev in link_views(prob.graph, prob.costs, state_topology(prob), chooser, head, window=w, fits=fits):
        prob.charge(need)
        scored.append((dev, prob.score(dev)))
        taken.append(scale)
    prob.meta["link_starts"] = taken
    return best_start(prob, scored)  # each over memory as ``memory.fit`` makes it fit


def la_rule_search(prob: Problem) -> np.ndarray:
    """``la_rule`` and the rule on slower views of the links (``link_starts``), then annealing from the best with
    the rest of the budget (never worse than ``la_rule``)."""
    start = la_rule(prob, share=START_SHARE)
    score = prob.score(start)
    if score is None:
        return start
    start, score = link_starts(prob, start, score)
    return search.anneal(prob, start, score)


def eft_rollout_search(prob: Problem) -> np.ndarray:
    """``eft_rollout`` (its lookahead held to the start share of the seconds), then annealing with the rest."""
    start = eft_rollout(prob, share=START_SHARE)
    score = prob.score(start)
    return start if score is None else search.anneal(prob, start, score)
