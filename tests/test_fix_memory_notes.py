"""Results that cannot fit memory say so: every op-level placer and stage planner where the graph exceeds all devices'
memory together, ``exhaustive`` and ``cp_sat`` where it fits them together but no split of it does, and ``exact``
returns the least over memory of the plans in its space where none fits."""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.baselines import pipeline
from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.cost import resolve_costs
from placement_rl.cost.pipeline import simulate_pipeline
from placement_rl.graph import make_graph
from test_fix_topology_seeds import _graph, _topology

GB, MB = 1e9, 2**20


def _split_graph():
    """Three nodes pinning 6 GB each (4 x 1.4 GB of state + 0.4 GB of activations): 18 GB, which two devices of
    10 GB hold together but no split of them does."""
    return make_graph([{"name": k, "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 1.4e9, "act_bytes": 0.4e9}
                       for k in "abc"], [["a", "b", 1e3], ["b", "c", 1e3]])


def _layered_graph():
    """Two layers (``blocks.<i>``, full recomputation checkpoints each) of two GEMMs with 40 MiB of activations each."""
    nodes = [{"name": f"b{b}fc{k}", "op_type": "linear", "module_path": f"blocks.{b}.fc{k}", "fwd_flops": 1e9,
              "bwd_flops": 2e9, "param_bytes": MB, "act_bytes": 40 * MB, "out_bytes": 4 * MB}
             for b in range(2) for k in (1, 2)]
    return make_graph(nodes, [[i, i + 1, 4 * MB] for i in range(3)])


def _over(plan, graph, costs, topology) -> float:
    res = simulate_pipeline(graph, costs, topology, plan)
    return float(np.maximum(res.peak_memory - topology.array("memory_bytes"), 0.0).sum())


@pytest.mark.parametrize("name", ["local_search", "exhaustive", "heft", "la_rule_search"])
def test_a_placer_says_no_placement_fits_where_the_graph_exceeds_all_devices(name):
    g, t = _graph(), _topology(3, mem=1e3)
    p = baselines.get(name)(g, resolve_costs(g, t), t, budget=100, seed=0)
    assert p.meta["feasible"] is False
    assert "no placement fits memory (the graph pins 15.64 MiB, the devices have 2.93 KiB in all)" in p.meta["note"]


def test_the_rules_note_is_not_repeated():
    g, t = _graph(), _topology(3, mem=1e3)
    note = baselines.get("sim_eft")(g, resolve_costs(g, t), t, budget=100, seed=0).meta["note"]
    assert note.count("no placement fits memory") == 1 and note.endswith("placed with memory ignored")


@pytest.mark.parametrize("name", ["dp", "pp_uniform", "pipedream", "hybrid", "exact"])
def test_a_stage_planner_says_no_plan_fits_where_the_parameters_exceed_all_devices(name):
    g, t = _graph(), _topology(3, mem=1e3)
    p = baselines.get_pipeline(name)(g, resolve_costs(g, t), t, budget=200, seed=0)
    assert p.meta["feasible"] is False
    assert ("no plan fits memory (the graph's parameters with their gradients and Adam state take 15.26 MiB, the "
            "devices have 2.93 KiB in all)") in p.meta["note"]


def test_exhaustive_says_no_placement_fits_and_returns_the_least_over():
    g, t = _split_graph(), _topology(2, mem=10 * GB)
    c = resolve_costs(g, t)
    p = baselines.get("exhaustive")(g, c, t, budget=100, seed=0)
    assert p.meta["feasible"] is False and p.meta["exhaustive"] is True
    assert p.meta["note"].startswith("no placement fits memory: all ")
    prob = baselines.common.Problem(g, c, t, budget=100, seed=0)
    least = min(prob.score(np.array(d)).overflow for d in itertools.product(range(2), repeat=3))
    assert prob.score(p.device_of_node).overflow == least
    assert "(1.86 GiB over capacity in all)" in p.meta["note"]


@pytest.mark.skipif(importlib.util.find_spec("ortools") is None, reason="cp_sat needs ortools")
def test_cp_sat_says_it_proved_no_placement_fits():
    g, t = _split_graph(), _topology(2, mem=10 * GB)
    p = baselines.get("cp_sat")(g, resolve_costs(g, t), t, budget=100, seed=0, seconds=4)
    assert p.meta["feasible"] is False
    assert p.meta["note"].startswith("no placement fits memory (CP-SAT proved it")


def test_exact_returns_the_least_over_memory_of_its_space_where_nothing_fits():
    """No plan fits 10 MiB devices; every stage recomputing its layers is the least over, which the cut search (each
    stage's recomputation chosen among those that fit it: none) left unsimulated (160 MiB over against 9 MiB)."""
    g, t = _layered_graph(), _topology(2, mem=10 * MB)
    c = resolve_costs(g, t)
    p = pipeline.get("exact")(g, c, t, budget=5000, seed=0, schedule="gpipe", num_microbatches=1)
    assert p.meta["feasible"] is False
    assert "no plan simulated fits memory: the least over it of the" in p.meta["note"]
    pp = PipeProblem(g, c, t, budget=10**6, seed=0, num_microbatches=1, schedule="gpipe", batch_size=None)
    least = min(pp.score([0, *bars, 4], degrees, m, "dp", None, rc).overflow
                for s in (1, 2) for bars in itertools.combinations(range(1, 4), s - 1)
                for degrees in ([(1,), (2,)] if s == 1 else [(1, 1)]) for m in (1, 2, 4, 8, 16, 32)
                for rc in itertools.product(("none", "full"), repeat=s))
    assert _over(p, g, c, t) <= least
