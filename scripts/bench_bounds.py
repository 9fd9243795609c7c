"""How tight the lower bounds are: each part per pair, against `la_rule` and the best placement any search found.

    python scripts/bench_bounds.py --cache <dir>          # writes results/bounds.json

Sets: the `test` and `dev` splits and the 2,000-node graphs of seeds 5 8 9 (`bench_learned.load_tasks`). Per pair:
the parts of `baselines.bounds.lower_bound` (path, work, blocks; milp with `--milp-seconds`) and the seconds the
blocks part took, `la_rule`'s step time, and the best feasible step time of any method in the search results files
(`--best-from`: `results/search_*.json` rows of the same pair, every budget). The summary per set gives geometric
means of `la_rule` (on the pairs where it fits memory) and of the best known placement over the bound without
the blocks part (`path`, `work`) and with it: the room a placement can still gain lies between the best known and the bound, and a tighter bound
shrinks it from below.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_learned import SCALE_SEED, load_tasks  # noqa: E402

SETS = ("test", "dev", "scale2000")
BEST_FROM = ("results/search_test.json", "results/search_test_60s.json", "results/search_dev.json",
             "results/search_scale2000.json", "results/search_scale2000_seeds.json")


def best_known(files: list[str]) -> dict[str, float]:
    """pair id -> the least feasible step time (ms) of any method in the search results files."""
    best: dict[str, float] = {}
    for f in files:
        p = Path(f)
        if not p.exists():
            continue
        for r in json.loads(p.read_text())["figures"]["rows"]:
            for k, v in r.items():
                if not k.endswith("_ms") or k == "bound_ms" or r.get(k[:-3] + "_feasible") is False:
                    continue
                best[r["pair"]] = min(best.get(r["pair"], float("inf")), float(v))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--graph-seeds", type=int, nargs="+", default=[SCALE_SEED, 8, 9], help="of the 2,000-node set")
    ap.add_argument("--milp-seconds", type=float, default=0.0)
    ap.add_argument("--best-from", nargs="*", default=list(BEST_FROM))
    ap.add_argument("--cache", default=None)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--stem", default="bounds")
    args = ap.parse_args()

    from placement_rl.agents.constructive_eval import geomean
    from placement_rl.baselines.bounds import block_bound, lower_bound
    from placement_rl.results import write_result

    t_start = time.perf_counter()
    best = best_known(args.best_from)
    rows, summary = [], {}
    for name in args.sets:
        tasks = load_tasks("test", 2000, args.cache, args.workers, tuple(args.graph_seeds)) if name == "scale2000" \
            else load_tasks(name, 0, args.cache, args.workers)
        mine = []
        for t in tasks:
            g, c, topo = t.graph, t.costs, t.topology
            b = lower_bound(g, c, topo, milp_seconds=args.milp_seconds, blocks=False)
            t0 = time.perf_counter()
            blocks = block_bound(g, c, topo)
            secs = time.perf_counter() - t0
            before, after = b.value, max(b.value, blocks)
            la, la_fits = float(t.refs["la_rule"][0]) * 1e3, bool(t.refs["la_rule"][1])
            row = {"set": name, "pair": t.meta["id"], "nodes": g.num_nodes, "devices": topo.num_devices,
                   **{f"{k}_ms": v * 1e3 for k, v in b.parts.items()}, "blocks_ms": blocks * 1e3,
                   "blocks_s": secs, "bound_before_ms": before * 1e3, "bound_ms": after * 1e3, "la_rule_ms": la,
                   "la_rule_feasible": la_fits,
                   "best_known_ms": best.get(t.meta["id"])}
            mine.append(row)
            known = "" if row["best_known_ms"] is None else f"  best known / bound {row['best_known_ms'] / before / 1e3:.3f}" \
                                                             f" -> {row['best_known_ms'] / after / 1e3:.3f}"
            print(f"{name:9s} {row['pair']:44s} la_rule / bound {la / before / 1e3:.3f} -> {la / after / 1e3:.3f}"
                  f"{known}  (blocks {secs:.2f} s)", flush=True)
        known = [r for r in mine if r["best_known_ms"] is not None]
        fits = [r for r in mine if r["la_rule_feasible"]]  # la_rule over memory is no placement: left out
        summary[name] = {
            "pairs": len(mine), "pairs_with_best_known": len(known), "pairs_la_rule_fits": len(fits),
            "la_rule_over_bound_before": geomean([r["la_rule_ms"] / r["bound_before_ms"] for r in fits]),
            "la_rule_over_bound": geomean([r["la_rule_ms"] / r["bound_ms"] for r in fits]),
            "best_known_over_bound_before": geomean([r["best_known_ms"] / r["bound_before_ms"] for r in known])
            if known else None,
            "best_known_over_bound": geomean([r["best_known_ms"] / r["bound_ms"] for r in known]) if known else None,
            "best_known_over_la_rule": geomean([r["best_known_ms"] / r["la_rule_ms"] for r in known])
            if known else None,
            "pairs_blocks_tighter": sum(r["blocks_ms"] > r["bound_before_ms"] * 1.001 for r in mine),
            "pairs_la_rule_within_1pct": sum(r["la_rule_ms"] <= r["bound_ms"] * 1.01 for r in fits),
            "blocks_seconds_max": max(r["blocks_s"] for r in mine),
        }
        rows += mine
        s = summary[name]
        print(f"{name}: la_rule / bound {s['la_rule_over_bound_before']:.3f} -> {s['la_rule_over_bound']:.3f}"
              + ("" if s["best_known_over_bound"] is None else
                 f"; best known / bound {s['best_known_over_bound_before']:.3f} -> {s['best_known_over_bound']:.3f}"
                 f" ({s['pairs_with_best_known']} pairs)")
              + f"; blocks tighter on {s['pairs_blocks_tighter']}/{s['pairs']}; at most {s['blocks_seconds_max']:.2f} s",
              flush=True)
    path = write_result(args.stem, {"summary": summary, "rows": rows, "best_from": args.best_from,
                                    "milp_seconds": args.milp_seconds}, seconds=time.perf_counter() - t_start)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
