"""The ``cp_sat`` placer: CP-SAT on the simulator's schedule with memory as a constraint."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.cost import resolve_costs, simulate
from placement_rl.errors import ConfigError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology
from tests.test_baselines import GB, random_dag, topology

pytest.importorskip("ortools")


def _place(name, g, c, t, **kw):
    return baselines.get(name)(g, c, t, budget=10**6, seed=0, **kw)


@pytest.mark.parametrize("n,d,seed", [(8, 2, 0), (8, 3, 2), (7, 3, 5)])
def test_cp_sat_proves_the_optimum_exhaustive_enumeration_finds(n, d, seed):
    """On small DAGs whose producers send every consumer the same bytes the model's optimum is the simulator's:
    ``cp_sat`` returns the step time of the best of all placements, says it proved it, and its bound is below."""
    g, t = random_dag(n, seed), topology(d)
    c = resolve_costs(g, t)
    p = _place("cp_sat", g, c, t, seconds=30)
    best = _place("exhaustive", g, c, t).meta["step_time"]
    assert p.meta["cp_optimal"] and p.meta["feasible"]
    assert p.meta["step_time"] == pytest.approx(best, rel=1e-6)
    assert p.meta["cp_bound"] <= p.meta["step_time"] * (1 + 1e-9)
    assert simulate(g, c, t, np.asarray(p.device_of_node)).step_time == pytest.approx(p.meta["step_time"])


def test_cp_sat_keeps_every_device_within_its_memory():
    """With devices that cannot hold the fastest placement, ``cp_sat`` returns the fastest placement that fits,
    as exhaustive enumeration (which ranks placements that fit first) finds it: received tensors counted."""
    g, big = random_dag(8, 3, param=4e8), topology(2, memory=1e3 * GB)
    c = resolve_costs(g, big)
    free = _place("exhaustive", g, c, big)
    peak = simulate(g, c, big, np.asarray(free.device_of_node)).peak_memory
    t = topology(2, memory=0.97 * float(np.max(peak)))  # the fastest placement no longer fits
    c = resolve_costs(g, t)
    assert not simulate(g, c, t, np.asarray(free.device_of_node)).feasible
    best = _place("exhaustive", g, c, t)
    assert best.meta["feasible"]
    p = _place("cp_sat", g, c, t, seconds=30)
    assert p.meta["feasible"] and p.meta["cp_optimal"]
    assert p.meta["step_time"] == pytest.approx(best.meta["step_time"], rel=1e-6)


def test_cp_sat_is_never_worse_than_its_hint_and_refuses_large_graphs():
    """On a 30-node graph in 3 s the result is never slower than ``la_rule`` (the hint is ``la_rule_search``'s);
    above ``MAX_NODES`` nodes one line says to coarsen."""
    g, t = synthetic.sample("layered", num_nodes=30, seed=1), load_topology("4x_v100_nvlink")
    c = resolve_costs(g, t)
    p = _place("cp_sat", g, c, t, seconds=3)
    rule = _place("la_rule", g, c, t)
    assert p.meta["feasible"] and p.meta["step_time"] <= rule.meta["step_time"] * (1 + 1e-9)
    assert p.meta["cp_bound"] is None or p.meta["cp_bound"] <= p.meta["step_time"] * (1 + 1e-9)
    big = synthetic.sample("dataflow", num_nodes=baselines.cp_place.MAX_NODES + 20, seed=0)
    with pytest.raises(ConfigError, match="coarsen") as e:
        _place("cp_sat", big, resolve_costs(big, t), t, seconds=1)
    assert "\n" not in str(e.value)
