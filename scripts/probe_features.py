"""Probe of the constructive state with no learning: place every node by the argmin of one device feature.

    python scripts/probe_features.py                      # la_end, la_back on the dev split's synthetic pairs
    python scripts/probe_features.py --features la_end la_step la_back --window 256 --min-nodes 300
    python scripts/probe_features.py --scale 2000         # five synthetic families at 2,000 nodes (seed 5) instead

At every decision the device with the smallest value of the feature among those the node fits on is chosen
(ties: the earliest finish), on the dev split's pairs of at least ``--min-nodes`` nodes (the synthetic ones: 16
pairs of 449-857 nodes at the default). A feature a student cannot do better than following tells how much of
its teacher's criterion the state shows: ``eft_rollout`` (the teacher) is printed beside it. Ratios are to
``sim_eft``; geometric means at the end. No checkpoint is read. ``--scale N`` probes ``layered``, ``dataflow``,
``series_parallel``, ``transformer_like`` and ``cnn_like`` graphs of N nodes (seed 5: not the graphs of
``bench_generalization.py --part scale``, seed 1) on five presets with 1 TiB per device.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def follow(graph, costs, topology, feature: str, window: int) -> float:
    """Step time of the placement that follows ``argmin feature`` at every decision."""
    from placement_rl.cost.schedule import DEVICE_FEATURES, ScheduleState

    col, eft = DEVICE_FEATURES.index(feature), DEVICE_FEATURES.index("eft_gap")
    st = ScheduleState(graph, costs, topology, episodes=1, window=window)
    while not st.done:
        f, m = st.features()
        key = np.where(m[0], f[0, :, col].astype(np.float64), np.inf)
        near = key <= key.min() + 1e-9
        st.place(int(np.argmin(np.where(near, f[0, :, eft], np.inf))))
    return float(st.finish()[0])


def cases(min_nodes: int, scale: int):
    """``(name, graph, topology, costs)`` of the dev split's pairs of at least ``min_nodes`` nodes, or of the
    ``scale``-node synthetic graphs."""
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.studies.pretrain import build_task, heldout_specs
    from placement_rl.topology import DeviceTopology, load_topology

    if scale:
        for fam, tname in (("layered", "2x4_v100_ib"), ("dataflow", "8x_v100_dgx1"), ("series_parallel",
                           "8x_a100_nvswitch"), ("transformer_like", "4x_v100_nvlink"), ("cnn_like", "cpu_2gpu")):
            g = synthetic.sample(fam, num_nodes=scale, seed=5)
            d = load_topology(tname).to_dict()
            for dev in d["devices"]:
                dev["memory_bytes"] = 2.0**40
            topo = DeviceTopology.from_dict({**d, "name": f"{tname}_1TiB"})
            yield f"{fam}-{scale}@{tname}", g, topo, resolve_costs(g, topo)
        return
    for spec in heldout_specs(hf=False):
        if spec["graph"].get("num_nodes", 0) < min_nodes:  # zoo models (no size in the spec): with --min-nodes 0
            continue
        task = build_task(spec, teachers=False)
        yield spec["id"], task.graph, task.topology, task.costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", nargs="+", default=["la_end", "la_back"])
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--min-nodes", type=int, default=300)
    ap.add_argument("--scale", type=int, default=0, help="probe synthetic graphs of this many nodes instead")
    args = ap.parse_args()

    from placement_rl.envs.constructive_task import sim_eft
    from placement_rl.cost import simulate
    from placement_rl.cost.lookahead import eft_rollout

    ratios: dict[str, list[float]] = {f: [] for f in [*args.features, "eft_rollout"]}
    for name, g, topo, costs in cases(args.min_nodes, args.scale):
        base = simulate(g, costs, topo, sim_eft(g, costs, topo)).step_time
        t0 = time.perf_counter()
        roll = simulate(g, costs, topo, eft_rollout(g, costs, topo)[0]).step_time
        line = f"{name:40s} {g.num_nodes:5d} eft_rollout {roll / base:.4f} ({time.perf_counter() - t0:.2f} s)"
        ratios["eft_rollout"].append(roll / base)
        for feat in args.features:
            t0 = time.perf_counter()
            r = follow(g, costs, topo, feat, args.window) / base
            ratios[feat].append(r)
            line += f" | {feat} {r:.4f} ({time.perf_counter() - t0:.2f} s)"
        print(line, flush=True)
    print(f"geometric mean over {len(ratios['eft_rollout'])} pairs, x sim_eft (window W = {args.window}):")
    for name, v in ratios.items():
        print(f"  {name:12s} {float(np.exp(np.mean(np.log(v)))):.4f}")


if __name__ == "__main__":
    main()
