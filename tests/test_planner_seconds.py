"""Stage planners held to seconds (``evaluate seconds=``): the simulations stop when they are spent, ``exact`` says
what it left out, ``pp_exhaustive`` (the optimum or nothing) becomes a note, and ``evaluate`` shows the notes
whole and a bar over the placers."""

from __future__ import annotations

import time

import pytest
import torch

from placement_rl import baselines
from placement_rl.cost import resolve_costs
from placement_rl.errors import ConfigError
from placement_rl.evaluate import compare
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def case():
    g = synthetic.sample("dataflow", num_nodes=60, seed=0)
    topo = load_topology("4x_v100_pcie")
    return g, resolve_costs(g, topo), topo


def test_pp_exhaustive_out_of_seconds_is_a_note_not_a_partial_optimum(case):
    g, c, topo = case
    with pytest.raises(ConfigError, match=r"pp_exhaustive stopped at 0.05 s after \d+ of its \d+ simulations "
                                          r"\(not the optimum\)"):
        baselines.get_pipeline("pp_exhaustive")(g, c, topo, budget=10**9, seed=0, seconds=0.05)
    with pytest.raises(ConfigError, match="seconds must be a number > 0"):
        baselines.get_pipeline("dp")(g, c, topo, budget=10, seed=0, seconds=0)


def test_exact_out_of_seconds_keeps_its_best_plan_and_says_it_is_not_exhaustive(case):
    g, c, topo = case
    full = baselines.get_pipeline("exact")(g, c, topo, budget=10**9, seed=0)
    assert full.meta["exhaustive"] and full.meta["configurations_searched"] == full.meta["configurations"]
    t0 = time.perf_counter()
    cut = baselines.get_pipeline("exact")(g, c, topo, budget=10**9, seed=0, seconds=1e-4)
    assert time.perf_counter() - t0 < full.meta["search_seconds"] + 2.0
    assert cut.meta["exhaustive"] is False and cut.meta["configurations_searched"] < full.meta["configurations"]
    assert cut.meta["step_time"] >= full.meta["step_time"] * (1 - 1e-9)  # less searched, never better


def test_evaluate_notes_whole_and_a_bar_over_the_placers(case, capsys):
    from placement_rl.cli.evaluate import table_rows

    g, c, topo = case
    rows = compare(g, c, topo, budget=10**9, seed=0, placers=["sim_eft"], partitioners=["exact", "pp_exhaustive"],
                   seconds=1e-3, progress=True)
    err = capsys.readouterr().err
    assert "placers (1000000000 simulator calls and 0.001 s each)" in err and "4/4" in err  # single_device too
    note = {r.placer: r.note for r in rows}
    assert note["exact"].endswith("plans simulated before the budget or seconds ran out") \
        and "not exhaustive: " in note["exact"]
    assert "give it more seconds or use a smaller graph" in note["pp_exhaustive"]
    assert {d["placer"]: d["note"] for d in table_rows(rows)} == note  # the table keeps every note whole


def test_exact_and_hybrid_stop_building_candidates_when_the_seconds_are_spent(case, monkeypatch):
    """``evaluate seconds=2``: exact took 5.2 s under load and hybrid 3.0 s (one simulation): both built every
    candidate (the other planners' dynamic programs, every shape's cuts) before the clock was looked at."""
    from placement_rl.baselines import pipeline

    g, c, topo = case
    assert "others_cut_short" not in baselines.get_pipeline("exact")(g, c, topo, budget=10**9, seed=0).meta
    assert baselines.get_pipeline("exact")(g, c, topo, budget=10**9, seed=0, seconds=1e-4).meta["others_cut_short"]
    made = []
    real = pipeline._fitting_cuts
    monkeypatch.setattr(pipeline, "_fitting_cuts", lambda *a: made.append(1) or real(*a))
    baselines.get_pipeline("hybrid")(g, c, topo, budget=10**9, seed=0)
    whole = len(made)
    made.clear()
    plan = baselines.get_pipeline("hybrid")(g, c, topo, budget=10**9, seed=0, seconds=1e-4)
    assert plan.num_stages >= 1 and 0 < len(made) < whole


def test_exact_note_tells_configurations_reached_from_plans_searched():
    from placement_rl.evaluate import _search_note

    every = _search_note({"exhaustive": False, "configurations_searched": 22, "configurations": 22, "sim_calls": 9})
    assert "every one of the 22" in every and "22 of 22" not in every
    part = _search_note({"exhaustive": False, "configurations_searched": 5, "configurations": 22, "sim_calls": 9})
    assert "5 of 22 DP x TP x PP configurations searched" in part
