"""One ``PipelineSimulator`` called from several threads at once gives each call its own answer (the kernel releases
the GIL: shared work buffers and outputs gave wrong step times and a spurious ``PlanError`` on valid plans)."""

import pickle
import threading

import numpy as np
import pytest

from placement_rl.cost import PipelineSimulator
from placement_rl.cost.resolve import resolve_costs
from placement_rl.graph.synthetic import sample
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

GROUPS = {2: ((0, 1, 2, 3), (4, 5, 6, 7)), 3: ((0,), (1, 2), (3,)), 4: ((0, 1), (2, 3), (4, 5), (6, 7))}


def answer(res) -> tuple:
    meta = res.meta
    return (res.step_time, res.comm_time, res.peak_memory.tolist(), res.device_busy.tolist(), meta["stage_end"],
            meta["allreduce_time"], meta.get("tied_allreduce_time"), meta.get("tied_copy_bytes"))


@pytest.fixture(scope="module")
def case():
    g = sample("layered", num_nodes=120, seed=3)
    first, last = g.names[g.topo_order[0]], g.names[g.topo_order[-1]]  # in different stages of every plan below
    g = g.replace(meta={**g.meta, "tied": [{"bytes": 4e6, "nodes": [first, last]}]})
    t = load_topology("2x4_v100_ib")
    sim = PipelineSimulator(g, resolve_costs(g, t), t)
    order = np.asarray(g.topo_order)
    rng = np.random.default_rng(0)
    plans = []
    for _ in range(1000):  # few layouts, so that threads often share one
        s = int(rng.integers(2, 5))
        cuts = np.sort(rng.choice(np.arange(1, g.num_nodes), s - 1, replace=False))
        stage = np.zeros(g.num_nodes, dtype=np.int64)
        stage[order] = np.searchsorted(cuts, np.arange(g.num_nodes), side="right")
        plans.append(StagePlan(stage, GROUPS[s], num_microbatches=int(rng.choice([1, 2, 4])),
                               schedule=str(rng.choice(["gpipe", "1f1b"])), sharding=str(rng.choice(["dp", "fsdp"]))))
    serial = [(sim.step_time(p), answer(sim.run(p))) for p in plans]
    return sim, plans, serial


def test_one_pipeline_simulator_shared_by_threads_gives_the_serial_answers(case):
    sim, plans, serial = case
    got: list = [None] * len(plans)

    def work(k: int) -> None:
        for i in range(k, len(plans), 4):
            try:
                got[i] = (sim.step_time(plans[i]), answer(sim.run(plans[i])))
            except Exception as exc:  # noqa: BLE001 -- shown by the assert below
                got[i] = repr(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wrong = [(i, a, b) for i, (a, b) in enumerate(zip(serial, got)) if a != b]
    assert not wrong, f"{len(wrong)} of {len(plans)} differ, first: {wrong[0]}"
    assert [sim.step_time(p) for p in plans[:50]] == [a for a, _ in serial[:50]]  # the creator's buffers still right


def test_a_pickled_pipeline_simulator_answers_alike(case):
    sim, plans, serial = case
    again = pickle.loads(pickle.dumps(sim))  # a copy in a worker owns its buffers
    assert [(again.step_time(p), answer(again.run(p))) for p in plans[:100]] == serial[:100]
