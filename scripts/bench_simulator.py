"""Simulator throughput on one core: evaluations/s of ``Simulator`` and ``PipelineSimulator``.

    python scripts/bench_simulator.py [--seconds 1.0] [--family layered]

Op placement: synthetic graphs of 100, 1,000 and 5,000 nodes over 4 and 8 GPUs, random placements.
Pipeline: a 1,000-node graph cut into 8 and 32 contiguous stages at random cut points, 32 micro-batches.
Rates are per second of this thread's CPU time (other processes sharing the core do not count).
Targets: >= 20,000/s at 100 nodes, >= 2,000/s at 1,000 nodes, >= 10,000/s for 32 stages.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from placement_rl.cost import PipelineSimulator, Simulator, resolve_costs  # noqa: E402
from placement_rl.graph import synthetic  # noqa: E402
from placement_rl.plans import StagePlan  # noqa: E402
from placement_rl.topology import DeviceTopology  # noqa: E402


def gpu_cluster(num_devices: int, per_host: int = 8) -> DeviceTopology:
    """V100-like GPUs, NVLink inside a host, InfiniBand across hosts."""
    devices = [{"name": f"h{h}gpu", "count": min(per_host, num_devices - h * per_host), "numbered": True,
                "kind": "gpu", "host": h, "peak_flops": 15.7e12, "mem_bandwidth": 900e9, "memory_bytes": 32e9}
               for h in range((num_devices + per_host - 1) // per_host)]
    return DeviceTopology.from_dict({"name": f"{num_devices}x_gpu", "devices": devices, "links": {
        "intra_host": {"bandwidth": 150e9, "latency": 5e-6}, "inter_host": {"bandwidth": 12.5e9, "latency": 1e-5}}})


def rate(fn, items: list, seconds: float) -> float:
    """Calls per CPU-second of ``fn`` cycling over ``items`` for about ``seconds`` of this thread's CPU time
    (``time.thread_time``: time the core spends on other processes does not count)."""
    fn(items[0])  # compile / warm up
    calls, start = 0, time.thread_time()
    while True:
        for x in items:
            fn(x)
        calls += len(items)
        elapsed = time.thread_time() - start
        if elapsed >= seconds:
            return calls / elapsed


def random_plan(rng: np.random.Generator, num_nodes: int, num_stages: int, m: int) -> StagePlan:
    cuts = np.sort(rng.choice(np.arange(1, num_nodes), num_stages - 1, replace=False))
    stage = np.searchsorted(cuts, np.arange(num_nodes), side="right")
    return StagePlan(stage_of_node=stage, stage_devices=[(s,) for s in range(num_stages)], num_microbatches=m,
                     schedule="1f1b")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per case")
    ap.add_argument("--family", default="layered", choices=synthetic.families())
    ap.add_argument("--microbatches", type=int, default=32)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"simulate (op placement), family {args.family}, one core")
    print(f"{'nodes':>6} {'edges':>6} {'devices':>7} {'step_time/s':>12} {'run/s':>9}")
    for n in (100, 1000, 5000):
        graph = synthetic.sample(args.family, num_nodes=n, seed=0)
        for d in (4, 8):
            topo = gpu_cluster(d, per_host=4)
            sim = Simulator(graph, resolve_costs(graph, topo), topo)
            placements = [rng.integers(0, d, n) for _ in range(32)]
            fast = rate(sim.step_time, placements, args.seconds)
            full = rate(sim.run, placements, args.seconds / 2)
            print(f"{n:>6} {graph.num_edges:>6} {d:>7} {fast:>12,.0f} {full:>9,.0f}")
    graph = synthetic.sample("transformer_like", num_nodes=1000, seed=0)
    print(f"simulate_pipeline, transformer_like 1000 nodes, 1f1b, {args.microbatches} micro-batches, one core")
    print(f"{'stages':>6} {'step_time/s':>12} {'run/s':>9}")
    for s in (8, 32):
        topo = gpu_cluster(s)
        psim = PipelineSimulator(graph, resolve_costs(graph, topo), topo)
        plans = [random_plan(rng, graph.num_nodes, s, args.microbatches) for _ in range(32)]
        fast = rate(psim.step_time, plans, args.seconds)
        full = rate(psim.run, plans, args.seconds / 2)
        print(f"{s:>6} {fast:>12,.0f} {full:>9,.0f}")


if __name__ == "__main__":
    main()
