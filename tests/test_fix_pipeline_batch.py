"""A stage plan at another batch than its graph's is priced at that batch: the cost model's node times are for
the graph's own batch (capture records it), so a plan of twice that batch takes twice the compute (``evaluate
plan=`` priced it as the graph's batch while scaling its memory; ``deploy`` scaled both)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.graph import make_graph
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology


def _graph(batch: int | None):
    nodes = [{"name": f"n{i}", "fwd_flops": 4e9, "bwd_flops": 8e9, "param_bytes": 1e6, "act_bytes": 1e6,
              "out_bytes": 1e6} for i in range(4)]
    return make_graph(nodes, [[i, i + 1, 1e6] for i in range(3)], name="chain",
                      meta={} if batch is None else {"batch_size": batch})


def _plan(batch: int | None) -> StagePlan:
    return StagePlan(stage_of_node=np.zeros(4, dtype=np.int64), stage_devices=((0,),), num_microbatches=1,
                     batch_size=batch)


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_a_plan_at_twice_the_graphs_batch_takes_about_twice_the_compute(mode):
    g, topo = _graph(8), load_topology("2x_k80")
    costs = resolve_costs(g, topo)

    def sim(plan, **kw):
        return simulate_pipeline(g, costs, topo, plan, mode=mode, **kw)

    at = {b: sim(_plan(b)) for b in (None, 8, 16)}
    assert at[None].step_time == pytest.approx(at[8].step_time)
    explicit = sim(_plan(16), cost_batch_size=8).step_time
    assert at[16].step_time == pytest.approx(explicit)
    assert 1.8 * at[8].step_time < at[16].step_time < 2.05 * at[8].step_time
    if mode == "train":  # activations kept for the backward: scaled as before
        assert max(at[16].peak_memory) > max(at[8].peak_memory)


def test_a_graph_without_a_batch_keeps_costs_for_the_whole_batch():
    g, topo = _graph(None), load_topology("2x_k80")
    costs = resolve_costs(g, topo)
    a, b = (simulate_pipeline(g, costs, topo, _plan(x)).step_time for x in (8, 16))
    assert a == pytest.approx(b)


def test_costs_measured_at_a_batch_still_win():
    g, topo = _graph(8), load_topology("2x_k80")
    costs = resolve_costs(g, topo)
    costs = replace(costs, meta={**costs.meta, "batch_size": 4})
    a = simulate_pipeline(g, costs, topo, _plan(16)).step_time
    b = simulate_pipeline(g, costs, topo, _plan(16), cost_batch_size=4).step_time
    assert a == pytest.approx(b)


def test_evaluate_notes_a_given_plan_at_another_batch():
    from placement_rl.cli.evaluate import batch_note

    g = _graph(8)
    assert batch_note(_plan(16), g) == ("runs batch 16, the graph's is 8 (the single device's): the speed-up "
                                        "compares steps, 2 x the samples here")
    assert batch_note(_plan(8), g) == batch_note(_plan(None), g) == batch_note(_plan(16), _graph(None)) == ""
