"""Non-learned placers and pipeline partitioners: the bar a learned placer must clear, under the same budget.

Op-level placers (``names()``, ``get(name)``), each called as
``placer(graph, costs, topology, *, budget: int, seed: int, seconds=None) -> Placement``. ``budget`` is the number
of simulator calls the placer may spend (heuristics use a few to check and repair memory; search uses all);
``seconds`` a wall-clock budget as well (searches stop when it is spent: comparisons at equal seconds).
``register(name, fn)`` adds a placer of one's own: ``fn(problem: Problem) -> device per node``, as the built-in ones
(``docs/baselines.md``).
The returned ``Placement.meta`` records ``placer``, ``budget``, ``seed``, ``sim_calls`` (counted by the
``Simulator``), ``search_seconds``, ``trace`` (the anytime curve: ``[seconds, calls, best step time]`` at each
improvement) and, when it was simulated, ``step_time`` and ``feasible``. ``objective="throughput"``: every
simulated candidate is scored by its steady-state time per batch (``cost.throughput``), so searches minimise it
(constructive heuristics still build for the step time); meta adds ``objective`` and ``steady_time``.
A bad ``budget``, ``seconds``, ``objective`` or ``seed`` (an integer >= 0; CP-SAT takes it modulo 2**31) is a one-line
``ConfigError``, and so is a case a placer cannot run (too large for ``exhaustive`` or ``cp_sat``, a budget short of
``la_rule``'s completions): ``evaluate`` shows it as a row with that note. A graph whose memory exceeds all devices'
together (no placement fits) is placed all the same, as is one no placer happens to fit: every placer returns a
placement with ``meta["feasible"]`` False (the schedule-state rules decide with memory ignored,
``eft.state_topology``, and say so in ``meta["note"]``; ``cp_sat`` then returns its best start), so ``evaluate`` lists
those rows as not fitting beside the stage plans that may fit, while ``place`` and ``train`` refuse such a graph up
front (``cost.schedule.check_fits``).

Pipeline partitioners (``pipeline_names()``, ``get_pipeline(name)``), each called as
``partitioner(graph, costs, topology, *, budget, seed, num_microbatches=4, schedule="1f1b",
batch_size=None, objective="step") -> StagePlan``, with the same meta (calls counted by the
``PipelineSimulator``).
"""

from __future__ import annotations

import inspect
import sys
from typing import Callable, Protocol

import numpy as np

from placement_rl.baselines import baechi, cp_place, eft, heft, metis, search, simple
from placement_rl.baselines.common import Problem
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement, StagePlan
from placement_rl.topology import DeviceTopology


class Placer(Protocol):
    def __call__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, budget: int,
                 seed: int, seconds: float | None = None, objective: str = "step") -> Placement: ...


class Partitioner(Protocol):
    def __call__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, budget: int, seed: int,
                 num_microbatches: int = 4, schedule: str = "1f1b",
                 batch_size: int | None = None) -> StagePlan: ...


_PLACERS: dict[str, Callable[[Problem], np.ndarray]] = {
    "single_device": simple.single_device,
    "round_robin": simple.round_robin,
    "random": simple.random_placement,
    "metis": metis.metis,
    "heft": heft.heft,
    "m_topo": baechi.m_topo,
    "m_etf": baechi.m_etf,
    "m_sct": baechi.m_sct,
    "sim_eft": eft.sim_eft,
    "eft_rollout": eft.eft_rollout,
    "la_rule": eft.la_rule,
    "la_rule_links": eft.la_rule_links,
    "la_rule_search": eft.la_rule_search,
    "eft_rollout_search": eft.eft_rollout_search,
    "local_search": search.local_search,
    "exhaustive": search.exhaustive,
    "cp_sat": cp_place.cp_sat,
}


def names() -> list[str]:
    """The op-level placers' names, built-in ones first, then those added by ``register``, in order."""
    return list(_PLACERS)


def register(name: str, fn: Callable[[Problem], np.ndarray], *, overwrite: bool = False) -> None:
    """Add an op-level placer under ``name``, so ``get(name)``, ``names()`` and ``evaluate.compare`` run it as they
    run the built-in ones. ``fn(problem)`` takes a ``Problem`` (graph, costs, topology, budget, seed; simulate a
    candidate only through ``problem.score``, which counts the calls) and returns a device index per node. A name
    already taken (a built-in one included) is refused unless ``overwrite``; a bad name or ``fn`` is a one-line
    ``ConfigError``. The registry lives in this process only (``evaluate``'s side-by-side workers run the
    built-in searches)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"a placer's name must be a non-empty string, got {name!r}")
    if name in _PLACERS and not overwrite:
        raise ConfigError(f"placer '{name}' is already registered: pass overwrite=True to replace it")
    if not callable(fn):
        raise ConfigError(f"placer '{name}' must be a function fn(problem) -> device per node, got {fn!r}"[:200])
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise ConfigError(f"placer '{name}' must take one argument, the Problem: fn(problem) -> device per node "
                          f"(get(name) wraps it into the full placer call)") from None
    except ValueError:  # no signature to read (some built-in callables): the first call tells
        pass
    _PLACERS[name] = fn


def get(name: str) -> Placer:
    """The placer registered under ``name`` (``ConfigError`` listing the names otherwise)."""
    if name not in _PLACERS:
        raise ConfigError(f"unknown placer '{name}' (choose one of {', '.join(_PLACERS)})")
    fn = _PLACERS[name]

    def placer(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, budget: int,
               seed: int, seconds: float | None = None, objective: str = "step") -> Placement:
        prob = Problem(graph, costs, topology, budget=budget, seed=seed, seconds=seconds, objective=objective)
        return prob.finish(fn(prob), name)

    placer.__name__ = placer.__qualname__ = name
    placer.__doc__ = fn.__doc__ or sys.modules[fn.__module__].__doc__
    return placer


def pipeline_names() -> list[str]:
    """The pipeline partitioners' names (``get_pipeline``)."""
    from placement_rl.baselines import pipeline

    return list(pipeline.PARTITIONERS)


def get_pipeline(name: str) -> Partitioner:
    """The pipeline partitioner registered under ``name`` (``ConfigError`` listing the names otherwise)."""
    from placement_rl.baselines import pipeline

    return pipeline.get(name)


__all__ = ["Partitioner", "Placer", "Problem", "get", "get_pipeline", "names", "pipeline_names", "register"]
