"""The one-step lookahead teacher (``eft_rollout``): never behind its base rule, consistent labels."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from placement_rl.envs.constructive_task import sim_eft
from placement_rl.envs.topology_sampler import random_topology
from placement_rl.cost import resolve_costs, simulate
from placement_rl.cost.lookahead import TIE, eft_rollout
from placement_rl.cost.schedule import ScheduleState, check_fits
from placement_rl.errors import PlanError
from placement_rl.graph import synthetic


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(["layered", "dataflow", "series_parallel", "cnn_like"]),
       n=st.integers(8, 40), seed=st.integers(0, 10_000), devices=st.integers(2, 6))
def test_rollout_is_never_behind_sim_eft(family, n, seed, devices) -> None:
    g = synthetic.sample(family, num_nodes=n, seed=seed)
    topo = random_topology(np.random.default_rng(seed), (devices, devices))
    try:  # a random cluster can be too small for the graph altogether (no placement to compare): not an input
        check_fits(g, topo)
    except PlanError:
        assume(False)
    costs = resolve_costs(g, topo)
    base = simulate(g, costs, topo, sim_eft(g, costs, topo))
    dev, labels, regret = eft_rollout(g, costs, topo)
    r = simulate(g, costs, topo, dev)
    assert labels.shape == (g.num_nodes,) and 0 <= labels.min() and labels.max() < devices
    order = ScheduleState(g, costs, topo).order
    assert np.array_equal(dev[order], labels)  # without actions, the labels are the placement
    assert regret.shape == (g.num_nodes, devices) and regret.min() >= 0.0
    assert np.all(regret[np.arange(g.num_nodes), labels] <= TIE + 1e-6)  # the label is (near) the best
    if base.feasible:  # rollout improvement: each step keeps the base rule's completion (up to near-ties)
        assert r.feasible and r.step_time <= base.step_time * (1 + TIE) ** g.num_nodes


def test_labels_in_the_states_of_given_actions() -> None:
    g = synthetic.sample("dataflow", num_nodes=30, seed=2)
    topo = random_topology(np.random.default_rng(4), (4, 4))
    costs = resolve_costs(g, topo)
    actions = np.zeros(g.num_nodes, dtype=np.int64)  # everything on device 0
    dev, labels, regret = eft_rollout(g, costs, topo, actions=actions)
    assert np.array_equal(dev, actions)
    assert labels.shape == (g.num_nodes,) and (labels != 0).any()  # the teacher would spread the work
    assert regret[np.arange(g.num_nodes), actions].max() > 0.0  # and says what keeping it on device 0 costs


def test_rules_out_of_seconds_leave_the_rest_to_the_earliest_finish() -> None:
    """A one-pass start given a deadline that has passed makes no lookahead decision: the earliest finish places
    every node (``sim_eft``'s placement) and the stats say so; with no deadline the rules are unchanged."""
    from placement_rl.baselines.eft import la_rule_devices
    from placement_rl.cost.decode import LA_RULE, decode, decode_until
    from placement_rl.cost.window import completions_until, window_completions

    g = synthetic.sample("dataflow", num_nodes=60, seed=3)
    topo = random_topology(np.random.default_rng(5), (4, 4))
    costs = resolve_costs(g, topo)
    eft = sim_eft(g, costs, topo)
    stats: dict[str, int] = {}
    dev, _, _ = eft_rollout(g, costs, topo, stats=stats, deadline=0.0)
    assert np.array_equal(dev, eft) and stats == {"completions": 0, "lookahead_steps": 0}
    dev, done = la_rule_devices(g, costs, topo, deadline=0.0, stats=stats)
    assert np.array_equal(dev, eft) and done == 0 and stats["lookahead_steps"] == 0
    full, calls = la_rule_devices(g, costs, topo, stats=stats)  # no deadline: one decode at the placing window
    st_ = ScheduleState(g, costs, topo, episodes=1, window=g.num_nodes)
    decode(st_, LA_RULE)
    assert np.array_equal(full, st_.devices[0]) and stats["lookahead_steps"] == g.num_nodes
    assert calls == window_completions(g.num_nodes, 4, g.num_nodes) and stats["windows"] == [[60, 60]]
    st_ = ScheduleState(g, costs, topo, episodes=1, window=g.num_nodes)
    assert decode_until(st_, LA_RULE, deadline=None) == g.num_nodes and np.array_equal(st_.devices[0], full)
    # a decode cut after k decisions is charged the completions among them (the last window + 1 decisions)
    assert completions_until(100, 4, 16, 100) == window_completions(100, 4, 16) == 17 * 4
    assert completions_until(100, 4, 16, 83) == 0 and completions_until(100, 4, 16, 90) == 7 * 4


def test_a_search_given_seconds_says_when_its_start_was_cut() -> None:
    from placement_rl import baselines

    g = synthetic.sample("layered", num_nodes=400, seed=1)
    topo = random_topology(np.random.default_rng(2), (8, 8))
    costs = resolve_costs(g, topo)
    for name in ("eft_rollout_search", "la_rule_search"):
        p = baselines.get(name)(g, costs, topo, budget=10**9, seed=0, seconds=1e-6)
        cut = p.meta["start_cut"]
        assert cut["rule"] == name.removesuffix("_search") and cut["lookahead_steps"] < cut["nodes"] == 400
        assert simulate(g, costs, topo, p.device_of_node).step_time == p.meta["step_time"]
    p = baselines.get("la_rule_search")(g, costs, topo, budget=400 * 8 + 100, seed=0)
    assert "start_cut" not in p.meta


def test_eft_rollout_search_keeps_half_its_seconds_for_the_annealing() -> None:
    """Given seconds, ``eft_rollout_search``'s lookahead stops after ``START_SHARE`` of them (as ``la_rule_search``'s
    start), so the annealing gets the rest: on a graph whose whole lookahead takes far longer, the start is cut and
    returns within the seconds, and the search then spends simulator calls of its own."""
    import time

    from placement_rl import baselines
    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.eft import eft_rollout
    from placement_rl.cost.decode import START_SHARE

    small = synthetic.sample("layered", num_nodes=20, seed=1)
    topo = random_topology(np.random.default_rng(2), (8, 8))
    eft_rollout(Problem(small, resolve_costs(small, topo), topo, budget=10**9, seed=0))  # compiled before timing
    g = synthetic.sample("layered", num_nodes=1500, seed=1)
    costs = resolve_costs(g, topo)
    seconds = 0.6
    prob = Problem(g, costs, topo, budget=10**9, seed=0, seconds=seconds)
    t0 = time.perf_counter()
    eft_rollout(prob, share=START_SHARE)
    took = time.perf_counter() - t0
    assert prob.meta["start_cut"]["lookahead_steps"] < g.num_nodes and took < seconds  # cut near half the seconds
    p = baselines.get("eft_rollout_search")(g, costs, topo, budget=10**9, seed=0, seconds=seconds)
    start_calls = p.meta["start_cut"]["lookahead_steps"] * topo.num_devices + 1
    assert p.meta["sim_calls"] > start_calls + 10  # the annealing's own calls


def test_a_start_with_seconds_to_spare_keeps_the_best_of_whole_decodes_at_several_windows() -> None:
    """``decode_windows``: a small window first, then the given window and its halvings, each whole and charged
    (its completions, and a step time for every decode after the first), the best kept; ``la_rule`` given seconds
    takes that start and says which windows it decoded."""
    from placement_rl.baselines.eft import la_rule_devices
    from placement_rl.cost.decode import LA_RULE, decode, decode_windows
    from placement_rl.cost.window import window_completions

    g = synthetic.sample("layered", num_nodes=70, seed=4)
    topo = random_topology(np.random.default_rng(6), (4, 4))
    costs = resolve_costs(g, topo)
    log: list = []
    st_, calls = decode_windows(g, costs, topo, LA_RULE, window=70, deadline=float("inf"), log=log)
    assert [e[:2] for e in log] == [(16, 70), (70, 70), (35, 70)]
    assert float(st_.finish()[0]) == min(e[2] for e in log)
    assert calls == sum(window_completions(70, 4, w) for w in (16, 70, 35)) + 2
    for w, _, t in log:  # each logged decode is the rule's own whole decode at that window
        one = ScheduleState(g, costs, topo, episodes=1, window=w)
        decode(one, LA_RULE)
        assert float(one.finish()[0]) == t
    stats: dict = {}
    dev, c = la_rule_devices(g, costs, topo, window=70, deadline=float("inf"), stats=stats)
    assert np.array_equal(dev, st_.devices[0]) and c == calls
    assert stats["windows"] == [[16, 70], [70, 70], [35, 70]] and stats["lookahead_steps"] == 70
    # a window under twice the small one is still decoded whole after it (the whole graph here)
    small_g = synthetic.sample("layered", num_nodes=24, seed=4)
    small_c = resolve_costs(small_g, topo)
    log = []
    decode_windows(small_g, small_c, topo, LA_RULE, window=24, deadline=float("inf"), log=log)
    assert [e[:2] for e in log] == [(16, 24), (24, 24)]
    # a deadline that has passed: one decode, cut before its first decision
    log = []
    st_, calls = decode_windows(g, costs, topo, LA_RULE, window=70, deadline=0.0, log=log)
    assert [e[:2] for e in log] == [(16, 0)] and calls == 0
    assert np.array_equal(st_.devices[0], sim_eft(g, costs, topo))
