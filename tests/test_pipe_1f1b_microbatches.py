"""Under 1F1B a plan has at least as many micro-batches as stages: torch's ``Schedule1F1B``, which ``deploy`` runs,
refuses fewer, so ``deploy`` and ``export`` refused the plans ``pp_time_dp`` and ``pp_uniform`` wrote at their
fixed micro-batch count (7 stages at m = 4 on 8 GPUs, shown as the best pipeline partitioner)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl import baselines
from placement_rl.cost import resolve_costs
from placement_rl.envs.pipeline import PipelineEnv
from placement_rl.executor._mesh import parallel_dims
from placement_rl.graph.capture import capture_zoo
from placement_rl.topology import load_topology

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def case():
    g = capture_zoo("gpt", batch_size=16, seq_len=32, vocab_size=512, d_model=64, n_layers=4, n_heads=4)
    topo = load_topology("2x4_v100_ib")
    return g, resolve_costs(g, topo), topo


@pytest.mark.parametrize("m", [1, 2, 4])
def test_every_planner_keeps_stages_to_micro_batches_under_1f1b(case, m):
    g, c, topo = case
    for name in baselines.pipeline_names():
        if name == "pp_exhaustive":
            continue  # its space is too big here; it builds its plans from microbatch_choices (tested there)
        plan = baselines.get_pipeline(name)(g, c, topo, budget=300, seed=0, num_microbatches=m, schedule="1f1b")
        assert plan.schedule != "1f1b" or plan.num_stages <= plan.num_microbatches, (name, plan.num_stages)
        if len(set(plan.dp_degrees)) == 1 and len(set(plan.tp)) == 1:
            parallel_dims(plan)  # the executor's own checks (1F1B among them)


def test_pipeline_env_with_a_fixed_micro_batch_count_cuts_at_most_that_many_stages(case):
    g, _, topo = case
    env = PipelineEnv(graph=g, topology=topo, num_microbatches=2, schedule="1f1b", max_devices=8)
    rng = np.random.default_rng(0)
    for ep in range(10):
        env.reset(seed=ep)
        done, info = False, {}
        while not done:
            mask = env.action_masks()
            a = 1 if mask[1] and rng.random() < 0.5 else int(rng.choice(np.flatnonzero(mask)))
            _, _, done, _, info = env.step(a)
        assert info["plan"].num_stages <= 2


def test_a_planner_held_to_fewer_stages_says_why(case):
    """At num_microbatches=1 under 1F1B the fixed-count planners return one stage on one device: the single
    device's time with an empty note, as if that were all they could find."""
    g, c, topo = case
    for name in ("pp_uniform", "pp_params", "pp_time_dp"):
        plan = baselines.get_pipeline(name)(g, c, topo, budget=300, seed=0, num_microbatches=1, schedule="1f1b")
        assert plan.num_stages == 1 and "1F1B needs as many micro-batches as stages" in plan.meta["note"]
        free = baselines.get_pipeline(name)(g, c, topo, budget=300, seed=0, num_microbatches=8, schedule="1f1b")
        assert "note" not in free.meta
