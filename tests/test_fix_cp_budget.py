"""``cp_sat`` under small simulator-call budgets: the hint's calls are counted, CP-SAT runs whenever the budget
leaves a call to score its solution, and a note says why where it cannot."""

from __future__ import annotations

import pytest

from placement_rl import baselines
from placement_rl.cost import resolve_costs
from tests.test_baselines import random_dag, topology

pytest.importorskip("ortools")


@pytest.fixture(scope="module")
def case():
    """34 nodes on 4 devices: ``la_rule`` needs 137 calls at its one window and 206 at the windows it decodes
    when given seconds (16, then 34)."""
    g, t = random_dag(34, 3), topology(4, flops=[20e12, 10e12, 10e12, 5e12])
    c = resolve_costs(g, t)
    eft = baselines.get("sim_eft")(g, c, t, budget=1, seed=0).meta["step_time"]
    rule = baselines.get("la_rule")(g, c, t, budget=137, seed=0).meta["step_time"]
    return g, c, t, eft, rule


@pytest.mark.parametrize("budget", [50, 150, 200, 300])
def test_cp_sat_keeps_to_small_budgets_and_runs_cp_sat(case, budget):
    """Within the budget (at 150 and 200 the hint's rule decoded two windows: 205 calls), CP-SAT ran (its bound in
    the meta, no note), and the result is never slower than ``sim_eft``'s start, nor than ``la_rule``'s where the
    budget covers the rule."""
    g, c, t, eft, rule = case
    p = baselines.get("cp_sat")(g, c, t, budget=budget, seed=0, seconds=1.0)
    assert p.meta["sim_calls"] <= budget
    assert "cp_bound" in p.meta and "cp_optimal" in p.meta and "note" not in p.meta
    assert p.meta["step_time"] <= eft * (1 + 1e-9)
    if budget >= 137 + 3:
        assert p.meta["step_time"] <= rule * (1 + 1e-9)


def test_cp_sat_says_why_when_the_budget_leaves_no_call_for_its_solution(case):
    """At one call only ``sim_eft``'s start is scored: CP-SAT does not run and the note says so."""
    g, c, t, eft, _ = case
    p = baselines.get("cp_sat")(g, c, t, budget=1, seed=0, seconds=1.0)
    assert p.meta["sim_calls"] <= 1 and "cp_bound" not in p.meta
    assert "CP-SAT" in p.meta["note"] and "budget" in p.meta["note"] and "\n" not in p.meta["note"]
    assert p.meta["step_time"] == pytest.approx(eft)
