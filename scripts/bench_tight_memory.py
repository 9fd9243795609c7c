"""Searches on memory-tight pairs: which ones return a placement that fits, and how fast it is.

    python scripts/bench_tight_memory.py --seconds 2          # writes results/tight_memory.json

Pairs (dev seeds 3100-3109 by default, never a split's): one synthetic graph of 400 nodes per seed (the five families in
turn) on a cluster of 4, 6 or 8 GPUs with mixed speeds (10 / 15 / 20 TFLOP/s) and one link speed (5 or 25 GB/s), whose
memory per device is the graph's static memory over ``fraction`` x the devices, for ``fraction`` 0.7 and 0.85 (the
devices together hold 1 / 0.7 and 1 / 0.85 of what the graph pins). Per pair: ``la_rule`` (one pass) and
``la_rule_search``, ``eft_rollout_search``, ``local_search`` and ``policy_search`` (the shipped policy) at
``--seconds``: step time and whether it fits (``can_fit``: no node alone pins more than a device holds, a condition any
placement that fits needs). The summary counts the results that fit per method and gives each search's geometric-mean
step time over ``local_search``'s on the pairs where both fit.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

FAMILIES = ("layered", "dataflow", "transformer_like", "series_parallel", "cnn_like")
FRACTIONS = (0.7, 0.85)
SEARCHES = ("la_rule_search", "eft_rollout_search", "local_search", "policy_search")


def tight_topology(graph, devices: int, fraction: float, seed: int):
    from placement_rl.cost.simulate import static_memory
    from placement_rl.topology import DeviceTopology

    rng = np.random.default_rng(seed)
    mem = float(static_memory(graph).sum()) / (fraction * devices)
    flops = [float(rng.choice([10e12, 15e12, 20e12])) for _ in range(devices)]
    bw = float(rng.choice([5e9, 25e9]))
    return DeviceTopology.from_dict({
        "name": f"tight{devices}x{fraction:g}s{seed}",
        "devices": [dict(name=f"gpu{k}", kind="gpu", model="V100-SXM2-32GB", peak_flops=flops[k], mem_bandwidth=900e9,
                         memory_bytes=mem) for k in range(devices)],
        "links": {"intra_host": {"bandwidth": bw, "latency": 1e-5}}})


def compare_before(path: str, rows: list[dict]) -> dict:
    """Each search's results that fit in the run at ``path`` and here (on the pairs both ran), and its step time here
    over there in geometric mean where both fit."""
    import json

    from placement_rl.agents.constructive_eval import geomean

    doc = json.loads(open(path).read())
    prev = {r["pair"]: r for r in doc["figures"]["rows"]}
    both = [(r, prev[r["pair"]]) for r in rows if r["pair"] in prev]
    out = {"file": path, "commit": doc["provenance"]["commit"][:7], "pairs": len(both),
           "fits_before": {m: sum(p[f"{m}_feasible"] for _, p in both) for m in SEARCHES},
           "fits_after": {m: sum(r[f"{m}_feasible"] for r, _ in both) for m in SEARCHES}}
    for m in SEARCHES:
        out[f"{m}_over_before"] = geomean([r[f"{m}_ms"] / p[f"{m}_ms"] for r, p in both
                                           if r[f"{m}_feasible"] and p[f"{m}_feasible"]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="each search's wall-clock seconds")
    ap.add_argument("--graphs", type=int, default=10, help="graphs (seeds --first-seed ..)")
    ap.add_argument("--first-seed", type=int, default=3100, help="the first graph's seed (3200: the set the "
                    "memory fit's choices were made on)")
    ap.add_argument("--nodes", type=int, default=400)
    ap.add_argument("--stem", default="tight_memory")
    ap.add_argument("--before", default=None, help="a results file of the same pairs from other code (e.g. "
                    "results/tight_memory_prefit.json): each search's fits there and its step times here over there")
    args = ap.parse_args()

    import torch

    from placement_rl import baselines
    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.agents.constructive_eval import geomean, warm_kernels
    from placement_rl.agents.policy_search import policy_search
    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.cost.simulate import static_memory
    from placement_rl.graph import synthetic
    from placement_rl.results import write_result

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    policy, _, _ = load_policy(default_checkpoint())
    warm_kernels(policy)
    rows = []
    for i in range(args.graphs):
        seed = args.first_seed + i
        g = synthetic.sample(FAMILIES[i % len(FAMILIES)], num_nodes=args.nodes, seed=seed)
        for frac in FRACTIONS:
            topo = tight_topology(g, 4 + 2 * (i % 3), frac, seed)
            c = resolve_costs(g, topo)
            # a node pinning more than a device holds: no placement can fit (the pair still counts)
            row = {"pair": f"{g.name}@{topo.name}", "fraction": frac, "devices": topo.num_devices,
                   "can_fit": bool(static_memory(g).max() <= min(d.memory_bytes for d in topo.devices))}
            for m in ("la_rule", *SEARCHES):
                t0 = time.perf_counter()
                if m == "policy_search":
                    p = policy_search(policy, g, c, topo, seconds=args.seconds, seed=0)
                else:
                    p = baselines.get(m)(g, c, topo, budget=10**9, seed=0,
                                         seconds=None if m == "la_rule" else args.seconds)
                r = simulate(g, c, topo, np.asarray(p.device_of_node, np.int64))
                row[f"{m}_ms"], row[f"{m}_feasible"] = r.step_time * 1e3, bool(r.feasible)
                row[f"{m}_s"] = time.perf_counter() - t0
            rows.append(row)
            print(f"{row['pair']:40s} " + "  ".join(
                f"{m} {row[f'{m}_ms']:.1f}{'' if row[f'{m}_feasible'] else ' (over memory)'}"
                for m in ("la_rule", *SEARCHES)), flush=True)
    summary = {"pairs": len(rows),
               "fits": {m: sum(r[f"{m}_feasible"] for r in rows) for m in ("la_rule", *SEARCHES)},
               "pairs_some_search_fits": sum(any(r[f"{m}_feasible"] for m in SEARCHES) for r in rows),
               "pairs_a_node_alone_overflows": sum(not r["can_fit"] for r in rows),
               **{f"{m}_over_local_search": geomean([r[f"{m}_ms"] / r["local_search_ms"] for r in rows
                                                if r[f"{m}_feasible"] and r["local_search_feasible"]])
                  for m in SEARCHES if m != "local_search"},
               "most_seconds_used": max(r[f"{m}_s"] for r in rows for m in SEARCHES) / args.seconds}
    if args.before:
        summary["before"] = compare_before(args.before, rows)
        b = summary["before"]
        print(f"over {args.before} (code {b['commit']}): " + ", ".join(
            f"{m} fits {b['fits_before'][m]} -> {b['fits_after'][m]}, {b[f'{m}_over_before']:.4f}" for m in SEARCHES))
    print("fits: " + ", ".join(f"{m} {v}/{len(rows)}" for m, v in summary["fits"].items())
          + f"; some search fits {summary['pairs_some_search_fits']}/{len(rows)}"
          + f" (on {summary['pairs_a_node_alone_overflows']} a node alone overflows a device: nothing can fit)")
    print(", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k.endswith("_over_local_search")))
    path = write_result(args.stem, {"seconds": args.seconds, "nodes": args.nodes, "first_seed": args.first_seed,
                                    "summary": summary, "rows": rows},
                        seconds=time.perf_counter() - t_start)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
