"""Planners with tensor parallelism: tp, megatron and the exact DP x TP x PP search."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl import baselines
from placement_rl.baselines import pipe_tp
from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.errors import ConfigError
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.topology import load_topology

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def case():
    g = capture_zoo("gpt", batch_size=16, seq_len=128, vocab_size=4096, d_model=512, n_layers=4, n_heads=8)
    topo = load_topology("2x4_v100_ib")
    return g, resolve_costs(g, topo), topo


def run(name, g, c, topo, budget=2000):
    plan = baselines.get_pipeline(name)(g, c, topo, budget=budget, seed=0)
    return plan, simulate_pipeline(g, c, topo, plan)


def test_registered():
    assert {"tp", "megatron", "exact"} <= set(baselines.pipeline_names())


def test_tp_and_megatron_keep_tp_inside_a_host(case):
    g, c, topo = case
    plan, res = run("tp", g, c, topo)
    assert plan.tp == (4,) and plan.dp_degrees == (2,) and res.feasible
    for grp in plan.tp_groups(0):
        assert len({topo.devices[d].host for d in grp}) == 1
    plan, res = run("megatron", g, c, topo)
    assert set(plan.tp) == {4} and plan.num_stages in (1, 2) and res.feasible


def test_exact_is_never_worse_than_the_plans_inside_its_space(case):
    g, c, topo = case
    best, res = run("exact", g, c, topo)
    assert best.meta["configurations"] > 10 and best.meta["bounds_capped"] >= 0
    for name in ("dp", "fsdp", "tp", "megatron"):
        _, other = run(name, g, c, topo)
        assert res.step_time <= other.step_time + 1e-12, name
    assert best.batch_size == 16 and 16 % (best.num_microbatches * best.dp_degrees[0]) == 0


def test_exact_matches_brute_force_cuts_on_a_small_graph():
    """On a 12-group graph the exact search's best equals the best over *every* cut set of its configurations."""
    from placement_rl.graph import coarsen
    import itertools

    g = coarsen.coarsen(capture_zoo("gpt", batch_size=8, seq_len=64, vocab_size=1024, d_model=128, n_layers=2,
                                    n_heads=4), max_nodes=8)
    topo = load_topology("4x_v100_nvlink")
    c = resolve_costs(g, topo)
    best, res = run("exact", g, c, topo, budget=5000)
    pp = PipeProblem(g, c, topo, budget=10**6, seed=0, num_microbatches=1, schedule="1f1b", batch_size=None)
    brute = np.inf
    for s, dp, t, m in pipe_tp.configurations(pp):
        for bars in itertools.combinations(range(1, g.num_nodes), s - 1):
            for sh in ("dp", "fsdp"):
                sc = pp.score([0, *bars, g.num_nodes], (dp,) * s, m, sh, (t,) * s)
                if sc.feasible:
                    brute = min(brute, sc.step_time)
    # the DP's cut objective is analytic: allow the simulated optimum a small gap, report it exactly
    assert res.step_time <= brute * 1.05


def test_nothing_to_split_and_short_budget():
    g = capture_zoo("resnet18", **dict(zoo.tiny("resnet18"), batch_size=8))
    topo = load_topology("4x_v100_nvlink")
    c = resolve_costs(g, topo)
    plan, _ = run("tp", g, c, topo)
    assert plan.tp == (1,) and "nothing to split" in plan.meta["note"]
    plan, _ = run("exact", g, c, topo, budget=5)  # a short budget simulates the best estimates only
    assert plan.meta["sim_calls"] <= 5 and plan.meta["exhaustive"] is False
