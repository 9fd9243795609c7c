"""The ``cp_sat`` placer against the known optimum on small problems and against search on medium ones.

    python scripts/bench_cp_sat.py [--seconds 10]           # writes results/cp_sat.json

Part ``exact``: the 48 problems of ``probe_exact_room.py`` (four synthetic families, 10-12 nodes on 3 V100s and
16-18 on 2, links of 25 / 5 / 1.5 GB/s; dev seeds 900-905), each as it is and with every device holding
``--tight`` of what the optimal placement's fullest device holds (so the fastest placement does not fit): the
optimum by enumeration (``search.exhaustive``: placements that fit first), ``cp_sat`` at ``--seconds`` (its step
time over the optimum, whether it fits, whether it proved its optimum, its seconds) and ``la_rule_search`` at the
seconds ``cp_sat`` took. Part ``medium``: 24-60-node graphs of the four families on 4 devices, ``cp_sat`` and
``la_rule_search`` at ``--seconds`` each, and ``cp_sat``'s proven bound (none where it proved nothing).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

MEDIUM = (("dataflow", 24, "4x_v100_nvlink"), ("layered", 30, "4x_v100_pcie"),
          ("series_parallel", 40, "4x_v100_pcie"), ("transformer_like", 30, "4x_v100_pcie"),
          ("dataflow", 40, "4x_v100_pcie"), ("layered", 48, "4x_v100_nvlink"),
          ("series_parallel", 60, "4x_v100_nvlink"), ("transformer_like", 60, "4x_v100_nvlink"))
MEDIUM_SEEDS = (950, 951)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="cp_sat's seconds per problem")
    ap.add_argument("--tight", type=float, default=0.9,
                    help="the tight variant's device memory, as a share of the optimum's fullest device")
    ap.add_argument("--parts", nargs="+", default=["exact", "medium"], choices=["exact", "medium"])
    ap.add_argument("--limit", type=int, default=None, help="at most this many problems per part (a smoke run)")
    ap.add_argument("--stem", default="cp_sat")
    args = ap.parse_args()

    from probe_exact_room import FAMILIES, LINKS, SEEDS, SHAPES, topology

    from placement_rl import baselines
    from placement_rl.agents.constructive_eval import geomean
    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.graph import synthetic
    from placement_rl.results import write_result
    from placement_rl.topology import load_topology

    t_start = time.perf_counter()

    def place(name, g, c, t, seconds=None):
        t0 = time.perf_counter()
        p = baselines.get(name)(g, c, t, budget=10**9, seed=0, seconds=seconds)
        return p, time.perf_counter() - t0

    exact_rows, medium_rows = [], []
    if "exact" in args.parts:
        problems = [(fam, seed, k, devices, sizes) for fam in FAMILIES for k, seed in enumerate(SEEDS)
                    for devices, sizes in SHAPES][:args.limit]
        for fam, seed, k, devices, sizes in problems:
            g = synthetic.sample(fam, num_nodes=sizes[k % len(sizes)], seed=seed)
            t0 = topology(devices, LINKS[k % len(LINKS)])
            for variant in ("as_is", "tight"):
                t = t0
                if variant == "tight":  # devices that cannot hold the optimum found as it is
                    peak = simulate(g, resolve_costs(g, t0), t0, opt_devices).peak_memory
                    t = topology(devices, LINKS[k % len(LINKS)], args.tight * float(np.max(peak)))
                c = resolve_costs(g, t)
                opt, opt_s = place("exhaustive", g, c, t)
                if variant == "as_is":
                    opt_devices = np.asarray(opt.device_of_node)
                if not opt.meta["feasible"]:
                    continue  # nothing fits: no optimum to compare with
                cp, cp_s = place("cp_sat", g, c, t, args.seconds)
                rs, _ = place("la_rule_search", g, c, t, max(cp_s, 0.05))
                o = opt.meta["step_time"]
                row = {"family": fam, "problem": f"{g.name}@{t.name}", "variant": variant, "nodes": g.num_nodes,
                       "devices": devices, "optimum_ms": o * 1e3, "enumeration_seconds": opt_s,
                       "cp_sat_over_optimum": cp.meta["step_time"] / o, "cp_sat_fits": bool(cp.meta["feasible"]),
                       "cp_sat_proved": bool(cp.meta["cp_optimal"]), "cp_sat_seconds": cp_s,
                       "cp_bound_over_optimum": (cp.meta["cp_bound"] or 0.0) / o,
                       "la_rule_search_over_optimum": rs.meta["step_time"] / o if rs.meta["feasible"] else None}
                exact_rows.append(row)
                print(f"{row['problem']:44s} cp_sat {row['cp_sat_over_optimum']:.4f} (proved "
                      f"{row['cp_sat_proved']}, {cp_s:.2f} s)  la_rule_search {row['la_rule_search_over_optimum']}"
                      f"  x the optimum", flush=True)
    if "medium" in args.parts:
        for fam, n, topo in MEDIUM[:args.limit]:
            for seed in MEDIUM_SEEDS:
                g = synthetic.sample(fam, num_nodes=n, seed=seed)
                t = load_topology(topo)
                c = resolve_costs(g, t)
                cp, cp_s = place("cp_sat", g, c, t, args.seconds)
                rs, rs_s = place("la_rule_search", g, c, t, args.seconds)
                rule, _ = place("la_rule", g, c, t)
                bound = cp.meta["cp_bound"]
                row = {"family": fam, "problem": f"{g.name}@{t.name}", "nodes": n, "devices": t.num_devices,
                       "cp_sat_ms": cp.meta["step_time"] * 1e3, "cp_sat_seconds": cp_s,
                       "cp_sat_proved": bool(cp.meta["cp_optimal"]), "cp_sat_improved": bool(cp.meta["cp_improved"]),
                       "la_rule_search_ms": rs.meta["step_time"] * 1e3, "la_rule_search_seconds": rs_s,
                       "la_rule_ms": rule.meta["step_time"] * 1e3,
                       "cp_sat_over_la_rule_search": cp.meta["step_time"] / rs.meta["step_time"],
                       "cp_bound_ms": None if bound is None else bound * 1e3}
                medium_rows.append(row)
                print(f"{row['problem']:40s} cp_sat {row['cp_sat_ms']:.3f} ms (proved {row['cp_sat_proved']}, "
                      f"{cp_s:.1f} s)  la_rule_search {row['la_rule_search_ms']:.3f} ms  bound "
                      f"{row['cp_bound_ms']}", flush=True)

    def exact_summary(rs: list[dict]) -> dict:
        found = [r["la_rule_search_over_optimum"] for r in rs if r["la_rule_search_over_optimum"] is not None]
        return {"problems": len(rs), "cp_sat_over_optimum": geomean([r["cp_sat_over_optimum"] for r in rs]),
                "cp_sat_optimal": sum(r["cp_sat_over_optimum"] <= 1 + 1e-6 for r in rs),
                "cp_sat_proved": sum(r["cp_sat_proved"] for r in rs),
                "cp_sat_fits": sum(r["cp_sat_fits"] for r in rs),
                "cp_sat_worst": max(r["cp_sat_over_optimum"] for r in rs),
                "cp_sat_seconds_median": float(np.median([r["cp_sat_seconds"] for r in rs])),
                "cp_sat_seconds_max": max(r["cp_sat_seconds"] for r in rs),
                "la_rule_search_over_optimum": geomean(found) if found else None,
                "la_rule_search_optimal": sum(x <= 1 + 1e-6 for x in found), "la_rule_search_fits": len(found)}

    summary: dict = {}
    for variant in ("as_is", "tight"):
        rs = [r for r in exact_rows if r["variant"] == variant]
        if rs:
            summary[f"exact_{variant}"] = exact_summary(rs)
    if medium_rows:
        gaps = [min(r["cp_sat_ms"], r["la_rule_search_ms"]) / r["cp_bound_ms"] for r in medium_rows if r["cp_bound_ms"]]
        summary["medium"] = {
            "pairs": len(medium_rows),
            "cp_sat_over_la_rule_search": geomean([r["cp_sat_over_la_rule_search"] for r in medium_rows]),
            "cp_sat_proved": sum(r["cp_sat_proved"] for r in medium_rows),
            "cp_sat_improved": sum(r["cp_sat_improved"] for r in medium_rows),
            "with_bound": sum(r["cp_bound_ms"] is not None for r in medium_rows),
            "best_over_cp_bound": geomean(gaps) if gaps else None}
    for name, s in summary.items():
        print(name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()})
    path = write_result(args.stem, {"seconds": args.seconds, "tight": args.tight, "summary": summary,
                                    "exact": exact_rows, "medium": medium_rows},
                        seconds=time.perf_counter() - t_start)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
