"""Budgets and seconds together: the ``la_rule`` placers keep to their budget when also given seconds, the ``cp``
part of the lower bound runs on a model over the topology's memory, and ``exhaustive`` cut short by its seconds
says so."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.baselines.bounds import lower_bound, relaxed_start
from placement_rl.baselines.eft import first_window, la_rule_devices, sim_eft_devices, windows_calls
from placement_rl.cost import resolve_costs, simulate
from placement_rl.cost.memory import pinned_memory
from placement_rl.cost.window import placing_window, window_completions
from placement_rl.errors import PlanError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology
from tests.test_baselines import random_dag, topology


@pytest.fixture(scope="module")
def sp17():
    """17 nodes on 2 devices: one decode at the placing window charges 34 completions, the windows ``la_rule``
    decodes given seconds (16, then 17) 69."""
    g = synthetic.sample("series_parallel", num_nodes=17, seed=6)
    t = load_topology("2x_k80")
    return g, resolve_costs(g, t), t


@pytest.mark.parametrize("name", ["la_rule", "la_rule_links", "la_rule_search"])
@pytest.mark.parametrize("budget", [35, 60, 69])
def test_la_rule_placers_keep_to_the_budget_when_given_seconds(sp17, name, budget):
    g, c, t = sp17
    plain = baselines.get(name)(g, c, t, budget=budget, seed=0)
    timed = baselines.get(name)(g, c, t, budget=budget, seed=0, seconds=60.0)
    assert plain.meta["sim_calls"] <= budget and timed.meta["sim_calls"] <= budget
    assert "step_time" in timed.meta  # a call was left to score the result
    if name == "la_rule":
        assert plain.meta["sim_calls"] == 35  # without seconds: one decode and its score, as before


def test_la_rule_with_seconds_still_tries_its_windows_when_the_budget_covers_them(sp17):
    g, c, t = sp17
    p = baselines.get("la_rule")(g, c, t, budget=100, seed=0, seconds=60.0)
    assert [w for w, _ in p.meta["start_windows"]] == [16, 17] and p.meta["sim_calls"] == 70


@pytest.mark.parametrize("calls, tried", [(210, [70]), (300, [70]), (310, [32, 70]), (370, [32, 70]),
                                          (371, [16, 70, 35]), (10_000, [16, 70, 35])])
def test_windows_tried_fit_in_the_calls_given(calls, tried):
    """70 nodes on 3 devices: windows 16, 70, 35 charge 371 completions, 32 and 70 310, the one decode at 70 210.
    A deadline that never comes decodes every window tried, so the charge is the most they may."""
    g = random_dag(70, 2)
    t = topology(3, flops=[20e12, 10e12, 5e12])
    c = resolve_costs(g, t)
    n, d, w = g.num_nodes, t.num_devices, placing_window(g.num_nodes)
    assert windows_calls(n, d, w) == 371 and window_completions(n, d, w) == 210
    stats: dict = {}
    _, charged = la_rule_devices(g, c, t, deadline=float("inf"), stats=stats, calls=calls)
    assert [x for x, _ in stats["windows"]] == tried
    assert charged == windows_calls(n, d, w, first_window(n, d, w, calls)) <= calls


def test_cp_part_of_the_bound_runs_on_a_model_over_memory():
    """Memory limits are relaxed in every part: the cp part's default start ignores them where ``sim_eft`` refuses
    a model that exceeds all devices' memory together."""
    pytest.importorskip("ortools")
    g = random_dag(6, 4, param=4e8)
    cap = float(pinned_memory(g, resolve_costs(g, topology(2))).sum()) / 2.5  # 2 devices hold 80% of the model
    t = topology(2, memory=cap, flops=[20e12, 10e12])
    c = resolve_costs(g, t)
    with pytest.raises(PlanError):
        sim_eft_devices(g, c, t)
    start = relaxed_start(g, c, t)
    assert start.shape == (g.num_nodes,) and set(start.tolist()) <= {0, 1}
    b = lower_bound(g, c, t, cp_seconds=1.0)
    assert "cp" in b.parts
    for dev in (start, np.zeros(g.num_nodes, dtype=np.int64), np.ones(g.num_nodes, dtype=np.int64)):
        assert b.value <= simulate(g, c, t, dev).step_time * (1 + 1e-9)


def test_relaxed_start_is_sim_eft_where_the_model_fits():
    g = random_dag(12, 3)
    t = topology(3, flops=[20e12, 10e12, 5e12])
    c = resolve_costs(g, t)
    assert np.array_equal(relaxed_start(g, c, t), sim_eft_devices(g, c, t))


@pytest.fixture(scope="module")
def small_case():
    g = random_dag(6, 5)
    t = topology(3, flops=[20e12, 10e12, 5e12])
    return g, resolve_costs(g, t), t


def test_exhaustive_says_it_is_the_optimum(small_case):
    g, c, t = small_case
    p = baselines.get("exhaustive")(g, c, t, budget=1000, seed=0)
    q = baselines.get("exhaustive")(g, c, t, budget=1000, seed=0, seconds=600.0)
    assert p.meta["exhaustive"] is True and q.meta["exhaustive"] is True
    assert "note" not in p.meta and "note" not in q.meta
    assert np.array_equal(p.device_of_node, q.device_of_node)
    assert p.meta["sim_calls"] == 3 ** 6


def test_exhaustive_cut_short_by_its_seconds_says_so(small_case):
    g, c, t = small_case
    p = baselines.get("exhaustive")(g, c, t, budget=1000, seed=0, seconds=1e-9)
    assert p.meta["exhaustive"] is False
    note = p.meta["note"]
    assert note.startswith("not exhaustive: ") and "of 729 placements simulated" in note and "cut short at" in note
    assert "\n" not in note
    assert len(p.device_of_node) == g.num_nodes and "step_time" in p.meta  # a placement, scored


def test_the_evaluate_table_shows_a_placers_note(small_case):
    """An op-level placer's note (exhaustive cut short, CP-SAT not run) reached no table: only planners' did."""
    from placement_rl.evaluate import compare

    g, c, t = small_case
    rows = compare(g, c, t, budget=1000, seed=0, placers=["exhaustive", "single_device"], partitioners=[],
                   seconds=1e-9, progress=False)
    notes = {r.placer: r.note for r in rows}
    assert notes["exhaustive"].startswith("not exhaustive: ") and not notes["single_device"]
