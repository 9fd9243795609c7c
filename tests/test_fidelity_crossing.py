"""The one-thread executor's CPU <-> GPU crossings in ``predict_step_time`` (no GPU needed).

A hand-made 3-node chain cpu -> gpu0 -> cpu with hand-written profiles: the host timeline's expected step time is
worked out below term by term. The shipped H200 / H100 executor rows of the ``mlp`` model are replayed from their
``profiles.json`` (``scripts/fidelity.py --replay``): the old model must reproduce the csv's predictions.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from placement_rl.cost import simulate
from placement_rl.graph.ir import make_graph
from placement_rl.plans import Placement
from placement_rl.profiling import ProfileDB, physical_topology
from placement_rl.profiling.fidelity import (HOST_CROSSING_FACTOR, measured_costs, mixes_host_cpu_and_cuda,
                                             predict_step_time)
from placement_rl.topology import Device, DeviceTopology, load_topology

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "placement_rl" / "data" / "measured"

FWD = {"cpu": (1e-3, 0.5e-3, 1e-3), "gpu0": (0.4e-3, 0.5e-3, 0.4e-3)}  # per node a, b, c
BWD = {"cpu": (2e-3, 1e-3, 2e-3), "gpu0": (0.8e-3, 1e-3, 0.8e-3)}
LAT, BW, NBYTES = 20e-6, 1e10, 1e6
ENGINE_START = 50e-6  # the GPU's bwd_call_overhead
OPT = {"cpu": 1e-3, "gpu0": 0.2e-3}  # one Adam step over the whole model


def _setup():
    graph = make_graph([{"name": "a", "param_bytes": 1000.0, "fwd_flops": 1.0, "bwd_flops": 2.0},
                        {"name": "b", "param_bytes": 2000.0, "fwd_flops": 1.0, "bwd_flops": 2.0},
                        {"name": "c", "param_bytes": 1000.0, "fwd_flops": 1.0, "bwd_flops": 2.0}],
                       [[0, 1, NBYTES], [1, 2, NBYTES]], name="chain3")
    devices = (Device(name="cpu", kind="cpu", torch_device="cpu", peak_flops=1e11, mem_bandwidth=1e10,
                      memory_bytes=1e12),
               Device(name="gpu0", kind="gpu", torch_device="cuda:0", peak_flops=1e13, mem_bandwidth=1e12,
                      memory_bytes=1e12))
    topo = DeviceTopology(name="local", devices=devices, link_bandwidth=np.array([[np.inf, 1e9], [1e9, np.inf]]),
                          link_latency=np.array([[0.0, 1e-3], [1e-3, 0.0]]),
                          link_kind=(("local", "pcie"), ("pcie", "local")))
    db = ProfileDB()
    for d in devices:  # recorded on another host: resolved by name and kind, like the shipped profiles
        db.data["devices"][d.name] = {"torch_device": d.torch_device, "kind": d.kind, "host": "elsewhere",
                                      "threads": 1, "model": d.name, "bwd_call_overhead": ENGINE_START}
        for i, node in enumerate(graph.names):
            db.put_node(graph, d.name, node, [FWD[d.name][i]], [BWD[d.name][i]])
        db.put_optimizer(graph, d.name, [OPT[d.name]], float(graph.param_bytes.sum()))
    db.put_link("cpu", "cuda:0", "copy", [1024.0], [LAT], LAT, BW)
    return graph, topo, db


def test_cpu_gpu_cpu_chain_is_one_host_timeline():
    graph, topo, db = _setup()
    split = np.array([0, 1, 0])  # a on the CPU, b on the GPU, c on the CPU: two crossings, each with a gradient
    pred = predict_step_time(graph, topo, split, db)
    compute = (1e-3 + 2e-3) + (0.5e-3 + 1e-3) + (1e-3 + 2e-3)  # every op on the one host thread
    links = 4 * (LAT + NBYTES / BW)  # a -> gpu0, b -> cpu, and both gradients back: 4 x 120 us
    crossings = 4 * HOST_CROSSING_FACTOR * ENGINE_START
    optimizer = OPT["cpu"] * 2000 / 4000 + OPT["gpu0"] * 2000 / 4000  # summed: one thread steps both devices
    assert pred.host_serial and pred.crossings == 4 and pred.num_transfers == 2
    assert pred.crossing_cost == pytest.approx(HOST_CROSSING_FACTOR * ENGINE_START)
    assert pred.simulated == pytest.approx(compute + links + crossings, rel=1e-12)
    assert pred.optimizer == pytest.approx(optimizer, rel=1e-12)
    assert pred.step_overhead == 0.0  # no whole-step time recorded
    assert pred.step_time == pytest.approx(compute + links + crossings + optimizer, rel=1e-12)
    if HOST_CROSSING_FACTOR == pytest.approx(1.8):
        assert pred.step_time == pytest.approx(8.94e-3, rel=1e-9)  # 7.5 + 0.48 + 0.36 + 0.6 ms

    # crossing=False: the simulator's free-running devices and the slowest device's optimizer share (the old model)
    old = predict_step_time(graph, topo, split, db, crossing=False)
    phys, _ = physical_topology(topo)
    sim = simulate(graph, measured_costs(graph, phys, db), phys, Placement(split)).step_time
    assert not old.host_serial and old.crossings == 0
    assert old.step_time == pytest.approx(sim + OPT["cpu"] * 0.5, rel=1e-12)
    assert pred.step_time > old.step_time

    # one device: nothing crosses, both models agree (the simulator on one device is the sum of its ops)
    for j in (0, 1):
        one = predict_step_time(graph, topo, np.full(3, j), db)
        assert not one.host_serial and one.step_time == pytest.approx(
            predict_step_time(graph, topo, np.full(3, j), db, crossing=False).step_time)


def test_only_cpu_plus_cuda_on_one_host_is_host_serial():
    _, topo, _ = _setup()
    assert mixes_host_cpu_and_cuda(topo, [0, 1]) and not mixes_host_cpu_and_cuda(topo, [0]) \
        and not mixes_host_cpu_and_cuda(topo, [1])
    two_cpu = load_topology("2x_cpu")
    assert not mixes_host_cpu_and_cuda(two_cpu, [0, 1])


def _fidelity_script():
    spec = importlib.util.spec_from_file_location("fidelity_script", REPO / "scripts" / "fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("gpu", ["nvidia_h200", "nvidia_h100"])
def test_replay_reproduces_shipped_mlp_rows(gpu):
    """The placements of the shipped executor run are rebuilt here and the old model reproduces its predictions
    (the csv keeps 6 significant digits); the host timeline moves every crossing row's prediction up."""
    rows = _fidelity_script().replay(MEASURED / gpu / "executor", None, models=["mlp"], num_random=4, budget=200,
                                     seed=0)
    assert len(rows) == 15
    assert max(abs(r["rel_diff"]) for r in rows) < 1e-5
    for r in rows:
        assert r["transfers"] == r["transfers_shipped"]
        if r["crossing"]:
            assert r["host_serial"] and r["predicted_host_s"] > r["predicted_s"]
        else:
            assert r["predicted_host_s"] == pytest.approx(r["predicted_s"], rel=1e-12)


@pytest.mark.slow
def test_measure_crossing_script_runs_on_the_cpu_and_refuses_without_a_gpu(tmp_path):
    """scripts/measure_crossing.py: the CPU smoke run writes every field; asking for CUDA without one exits 2."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "measure_crossing.py"
    out = tmp_path / "c.json"
    r = subprocess.run([sys.executable, str(script), "--out", str(out), "--device", "cpu", "--steps", "2",
                        "--rounds", "1", "--width", "32", "--batch", "4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    assert set(d["step_s"]) == {"1", "3", "7", "15", "31"} and all(v > 0 for v in d["step_s"].values())
    assert d["grad_call_overhead_s"] > 0 and d["d2h_after_op_s"] > 0 and "per_crossing_s" in d
    r = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "x.json")], capture_output=True,
                       text=True, timeout=120, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and not (tmp_path / "x.json").exists()
