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
