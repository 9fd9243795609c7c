"""The annealing every search shares (``baselines.search.anneal``), against its former settings, at equal seconds.

    python scripts/bench_anneal.py --split dev --seconds 2 10 --seeds 3 --pairs 8

Per pair of the split (``placement_rl.studies.splits``; every choice of the annealing is made on ``dev``), per
wall-clock budget and seed: annealing from ``la_rule``'s placement with the current settings (``T0_FRAC``, region
moves ``REGION_SHARE``) and with the former ones (start temperature 0.2% of the start's step time, single-node
moves only) in the same process, one after the other, from the same start. Prints and writes
``results/anneal_<split>.json``: per budget the geometric mean of each over ``la_rule`` and of current / former,
the share of runs where the former never went below its start, and the pair's lower bound beside every row.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

def gm(x) -> float:
    return float(np.exp(np.mean(np.log(x))))


def run(prob_args, start, settings: dict) -> tuple[float, int]:
    import placement_rl.baselines.search as search
    from placement_rl.baselines.common import Problem

    with search.annealing_settings(**settings):
        prob = Problem(*prob_args[:3], budget=10**12, seed=prob_args[3], seconds=prob_args[4])
        s0 = prob.score(start)
        best = search.anneal(prob, start, s0)
        return prob.score(best, after_time=True).step_time, prob.calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="dev", choices=("dev", "test2024", "test"))
    ap.add_argument("--seconds", nargs="+", type=float, default=[2.0, 10.0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=8, help="this many pairs of the split, evenly spread (0: all)")
    ap.add_argument("--offset", type=int, default=1, help="the first pair taken")
    ap.add_argument("--cache", default=None, help="a directory keeping built tasks between runs")
    ap.add_argument("--stem", default=None)
    args = ap.parse_args()

    import torch

    import placement_rl.baselines.search as search
    from placement_rl import baselines
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.results import write_result
    from placement_rl.studies.pretrain import build_tasks, split_specs

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    tasks = build_tasks(split_specs(args.split), workers=1, cache=args.cache)
    if args.pairs:
        tasks = tasks[args.offset:: max(1, len(tasks) // args.pairs)][: args.pairs]
    current = {"T0_FRAC": search.T0_FRAC, "REGION_SHARE": search.REGION_SHARE}
    rows = []
    for sec in args.seconds:
        for t in tasks:
            g, c, topo = t.graph, t.costs, t.topology
            rule = baselines.get("la_rule")(g, c, topo, budget=10**9, seed=0)
            start = np.asarray(rule.device_of_node, dtype=np.int64)
            r = float(rule.meta["step_time"])
            bound = lower_bound(g, c, topo).value
            for seed in range(args.seeds):
                cur, cur_calls = run((g, c, topo, seed, sec), start, current)
                old, old_calls = run((g, c, topo, seed, sec), start, search.FORMER_SETTINGS)
                row = {"pair": t.meta["id"], "nodes": g.num_nodes, "devices": topo.num_devices, "seconds": sec,
                       "seed": seed, "bound_over_la_rule": bound / r, "current_over_la_rule": cur / r,
                       "former_over_la_rule": old / r, "current_over_former": cur / old,
                       "current_calls": cur_calls, "former_calls": old_calls}
                rows.append(row)
                print(f"{row['pair']:40s} {sec:5g} s seed {seed}: current {cur / r:.4f} former {old / r:.4f} "
                      f"x la_rule (bound {bound / r:.3f})", flush=True)
    summary = {}
    for sec in args.seconds:
        sel = [r for r in rows if r["seconds"] == sec]
        summary[str(sec)] = {
            "runs": len(sel), "current_over_la_rule": gm([r["current_over_la_rule"] for r in sel]),
            "former_over_la_rule": gm([r["former_over_la_rule"] for r in sel]),
            "current_over_former": gm([r["current_over_former"] for r in sel]),
            "current_better_frac": float(np.mean([r["current_over_former"] < 1 - 1e-9 for r in sel])),
            "current_worse_frac": float(np.mean([r["current_over_former"] > 1 + 1e-9 for r in sel])),
            "former_found_nothing_frac": float(np.mean([r["former_over_la_rule"] >= 1 - 1e-12 for r in sel])),
            "current_found_nothing_frac": float(np.mean([r["current_over_la_rule"] >= 1 - 1e-12 for r in sel])),
            "bound_over_la_rule": gm([r["bound_over_la_rule"] for r in sel])}
        print(f"{sec:g} s: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in summary[str(sec)].items()))
    figures = {"split": args.split, "current": current, "former": search.FORMER_SETTINGS, "summary": summary,
               "rows": rows}
    path = write_result(args.stem or f"anneal_{args.split}", figures, seconds=time.perf_counter() - t_start)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
