"""Where the room is: small communication-heavy problems solved exactly, against the rule, the policy, search, the bound.

    python scripts/probe_exact_room.py                    # writes results/probe_exact_room.json

On the large slow-link pairs the best placement any search found sits far above the lower bound (1.8-2.0 x on the
test split's dataflow pairs), and no one can say which of the two is far from the optimum. Here the optimum is
known: 48 problems small enough to enumerate (``search.exhaustive``; dev seeds 900-905, never a split's): four
synthetic families (not cnn_like), 10-12 nodes on 3 V100s and 16-18 nodes on 2, on links of 25, 5 and 1.5 GB/s
(each problem communication-heavy: a typical edge's transfer takes longer than its producer's op). Per problem:
the optimum, `la_rule`, the shipped policy's greedy placement and its best of 16 (the first five its greedy on
slower views of the links) against `la_rule_links` (the rule on the same views), `la_rule_search` at
``--seconds``, and the lower bound with and without its blocks part, each over the optimum. The summary per
family and overall: geometric means and how often each is optimal, and the optimum over `la_rule`: no placement,
learned or searched, can have a geometric mean below it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

FAMILIES = ("dataflow", "layered", "series_parallel", "transformer_like")
SHAPES = ((3, (10, 11, 12)), (2, (16, 17, 18)))  # devices, node counts
LINKS = (25e9, 5e9, 1.5e9)
SEEDS = range(900, 906)


def topology(devices: int, bandwidth: float, memory: float = 32e9):
    """V100s on one link speed; ``memory`` bytes each (other than 32 GB: named in the topology's name)."""
    from placement_rl.topology import DeviceTopology

    tight = "" if memory == 32e9 else f"_mem{memory / 1e9:.3g}GB"
    return DeviceTopology.from_dict({
        "name": f"{devices}x_v100_{bandwidth / 1e9:g}GBps{tight}",
        "devices": [dict(name=f"gpu{k}", kind="gpu", model="V100-SXM2-32GB", peak_flops=15.7e12,
                         mem_bandwidth=900e9, memory_bytes=memory) for k in range(devices)],
        "links": {"intra_host": {"bandwidth": bandwidth, "latency": 1e-5}}})


def shipped_policy():
    """The shipped checkpoint's policy, its kernels compiled (one thread, as every measurement here)."""
    import torch

    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.agents.constructive_eval import warm_kernels

    torch.set_num_threads(1)
    policy, _, _ = load_policy(default_checkpoint(), log=lambda *_: None)
    warm_kernels(policy)
    return policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="la_rule_search's seconds per problem")
    ap.add_argument("--stem", default="probe_exact_room")
    args = ap.parse_args()

    import torch

    from placement_rl import baselines
    from placement_rl.agents.constructive_eval import geomean, greedy_result, with_samples
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.baselines.common import Problem
    from placement_rl.cost import resolve_costs
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.graph import synthetic
    from placement_rl.results import write_result
    from placement_rl.studies.splits import comm_ratio

    t_start = time.perf_counter()
    policy = shipped_policy()
    rows = []
    for fam in FAMILIES:
        for k, seed in enumerate(SEEDS):
            for devices, sizes in SHAPES:
                g = synthetic.sample(fam, num_nodes=sizes[k % len(sizes)], seed=seed)
                t = topology(devices, LINKS[k % len(LINKS)])
                c = resolve_costs(g, t)
                exact = lower_bound(g, c, t, exact_budget=10**6, blocks=False)
                if not exact.exact:
                    raise SystemExit(f"{g.name} on {t.name}: too many placements to enumerate")
                opt = exact.value
                bound = lower_bound(g, c, t)
                prob = Problem(g, c, t, budget=10, seed=0)

                def time_of(devs) -> float:
                    return prob.score(np.asarray(devs, dtype=np.int64)).step_time

                rule = time_of(baselines.get("la_rule")(g, c, t, budget=10**9, seed=0).device_of_node)
                res = greedy_result(policy, ConstructiveTask.build(g, t, c, teachers=False))
                best16 = with_samples(policy, res, 16, torch.Generator().manual_seed(0)).best_time
                links = time_of(baselines.get("la_rule_links")(g, c, t, budget=10**9, seed=0).device_of_node)
                found = time_of(baselines.get("la_rule_search")(g, c, t, budget=10**9, seed=0,
                                                                seconds=args.seconds).device_of_node)
                row = {"family": fam, "problem": f"{g.name}@{t.name}", "nodes": g.num_nodes, "devices": devices,
                       "comm_ratio": comm_ratio(g, c),
                       "optimum_ms": opt * 1e3, "la_rule_over_optimum": rule / opt,
                       "policy_greedy_over_optimum": res.greedy_time / opt, "policy_best16_over_optimum": best16 / opt,
                       "la_rule_links_over_optimum": links / opt, "la_rule_search_over_optimum": found / opt,
                       "bound_over_optimum": bound.value / opt,
                       "bound_without_blocks_over_optimum": max(bound.parts["path"], bound.parts["work"]) / opt}
                rows.append(row)
                print(f"{row['problem']:36s} la_rule {row['la_rule_over_optimum']:.3f}  policy greedy "
                      f"{row['policy_greedy_over_optimum']:.3f}  la_rule_search {row['la_rule_search_over_optimum']:.3f}"
                      f"  bound {row['bound_over_optimum']:.3f} (without blocks "
                      f"{row['bound_without_blocks_over_optimum']:.3f})  x the optimum", flush=True)
    keys = ("la_rule", "policy_greedy", "policy_best16", "la_rule_links", "la_rule_search", "bound",
            "bound_without_blocks")

    def summarise(rs: list[dict]) -> dict:
        out = {"problems": len(rs), **{f"{k}_over_optimum": geomean([r[f"{k}_over_optimum"] for r in rs])
                                       for k in keys}}
        for k in ("la_rule", "policy_greedy", "policy_best16", "la_rule_links", "la_rule_search"):
            out[f"{k}_optimal"] = sum(r[f"{k}_over_optimum"] <= 1 + 1e-6 for r in rs)
            out[f"{k}_worst"] = max(r[f"{k}_over_optimum"] for r in rs)
        out["bound_lowest"] = min(r["bound_over_optimum"] for r in rs)
        out["optimum_over_la_rule"] = geomean([1.0 / r["la_rule_over_optimum"] for r in rs])
        out["comm_heavy"] = sum(r["comm_ratio"] >= 1 for r in rs)  # a typical edge's transfer >= its producer's op
        return out

    summary = {"all": summarise(rows), **{fam: summarise([r for r in rows if r["family"] == fam]) for fam in FAMILIES}}
    for name, s in summary.items():
        print(f"{name:17s} ({s['problems']}): la_rule {s['la_rule_over_optimum']:.3f} (optimal on {s['la_rule_optimal']}),"
              f" policy greedy {s['policy_greedy_over_optimum']:.3f} ({s['policy_greedy_optimal']}), best of 16 "
              f"{s['policy_best16_over_optimum']:.3f} ({s['policy_best16_optimal']}), la_rule_links "
              f"{s['la_rule_links_over_optimum']:.3f} ({s['la_rule_links_optimal']}), la_rule_search "
              f"{s['la_rule_search_over_optimum']:.3f} ({s['la_rule_search_optimal']}); bound "
              f"{s['bound_over_optimum']:.3f} (without blocks {s['bound_without_blocks_over_optimum']:.3f}) x the optimum")
    path = write_result(args.stem, {"seconds": args.seconds, "summary": summary, "rows": rows},
                        seconds=time.perf_counter() - t_start)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
