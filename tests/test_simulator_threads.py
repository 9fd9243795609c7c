"""One ``Simulator`` called from several threads at once gives each call its own answer (the kernel releases the
GIL: shared scratch buffers gave wrong step times and memory)."""

import pickle
import threading

import numpy as np

from placement_rl.cost import Simulator
from placement_rl.cost.resolve import resolve_costs
from placement_rl.graph.synthetic import sample
from placement_rl.topology import load_topology


def test_one_simulator_shared_by_threads_gives_the_serial_answers():
    g = sample("layered", num_nodes=120, seed=3)
    t = load_topology("2x4_v100_ib")
    sim = Simulator(g, resolve_costs(g, t), t)
    rng = np.random.default_rng(0)
    placements = [rng.integers(0, t.num_devices, g.num_nodes) for _ in range(1200)]
    serial = [(sim.step_time(p), sim.run(p).peak_memory.copy()) for p in placements]
    got: list = [None] * len(placements)

    def work(k: int) -> None:
        for i in range(k, len(placements), 4):
            got[i] = (sim.step_time(placements[i]), sim.run(placements[i]).peak_memory.copy())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(serial, got))
    again = pickle.loads(pickle.dumps(sim))  # a copy in a worker owns its buffers and answers alike
    assert again.step_time(placements[0]) == serial[0][0]
