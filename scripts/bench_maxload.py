"""Max-load splits (``placement-rl maxload``) checked against enumeration on small instances and run on the zoo's
graphs.

    python scripts/bench_maxload.py [--seconds 10]          # writes results/maxload.json

Part ``exact``: 24 random instances of 6-7 classes on 2 accelerators and a CPU core (``random_instance``: some with
backward nodes, a colour class, memory that binds, nodes an accelerator cannot run): the dynamic program's split
against the best contiguous split by enumeration, the whole search's (CP-SAT, ``--seconds``) against the best split
of any shape. Part ``zoo``: the zoo's graphs (layer graphs as the zoo coarsens them, and three operator graphs) as
training instances on ``cpu_2gpu`` (two V100s and a CPU) and ``8x_v100_dgx1`` (``instance_from_graph``: the
calibrated model's times): per graph the max-load with everything on one accelerator, the dynamic program over the
prefixes of one topological order (a linearised graph: PipeDream's space), over every ideal (the best contiguous
split), the best split of any shape (``--seconds``) and the lower bound, with ideals and seconds. Part ``latency``:
the latency objective (``maxload_latency``) on 8 random 6-node inference instances against enumeration, and on the
zoo's layer graphs and four operator graphs for inference on ``cpu_2gpu`` against the paper's two baselines (every
node on a CPU, the max-load split) with the bound (CP-SAT's or the longest path).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

ZOO = ("resnet50", "inception", "gpt", "nmt", "moe", "mlp", "resnet50-ops", "inception-ops", "gpt-ops")
TOPOLOGIES = ("cpu_2gpu", "8x_v100_dgx1")
LATENCY_ZOO = ("resnet50", "inception", "gpt", "nmt", "moe", "mlp", "resnet50-ops", "inception-ops", "gpt-ops",
               "moe-ops")


def _geo(xs: list[float]) -> float | None:
    return float(np.exp(np.mean(np.log(xs)))) if xs else None


def exact_part(seconds: float, limit: int | None, folder: Path) -> tuple[list[dict], dict]:
    from placement_rl.baselines.maxload import enumerate_splits
    from placement_rl.baselines.maxload_blocks import blocks_of
    from placement_rl.baselines.maxload_dp import contiguous_dp
    from placement_rl.baselines.maxload_instances import random_instance
    from placement_rl.baselines.maxload_solve import solve
    from placement_rl.graph.maxload_file import read_instance

    rows = []
    for seed in range(24)[:limit]:
        kw = dict(backward=seed % 3 == 1, colour=seed % 3 == 2, max_size=12 if seed % 2 else 1e9,
                  unsupported=0.15 if seed % 4 == 3 else 0.0, n=6 if seed % 3 == 1 else 7)
        path = folder / f"exact_{seed}.json"
        path.write_text(json.dumps(random_instance(1000 + seed, **kw)))
        inst = read_instance(path)
        best_contiguous, best_any = enumerate_splits(inst)
        t0 = time.perf_counter()
        dp = contiguous_dp(inst, blocks_of(inst))
        res = solve(inst, seconds=seconds)
        rows.append({"seed": 1000 + seed, "dp_over_enumeration": dp.max_load / best_contiguous,
                     "best_over_enumeration": res.best.max_load / best_any, "proved": res.optimal,
                     "contiguous_over_any": best_contiguous / best_any, "seconds": time.perf_counter() - t0})
        print(f"exact {seed}: dp {rows[-1]['dp_over_enumeration']:.6f}, best {rows[-1]['best_over_enumeration']:.6f}",
              flush=True)
    summary = {"instances": len(rows),
               "dp_equal": sum(abs(r["dp_over_enumeration"] - 1) < 1e-9 for r in rows),
               "best_equal": sum(abs(r["best_over_enumeration"] - 1) < 1e-9 for r in rows),
               "proved": sum(r["proved"] for r in rows),
               "contiguous_over_any": _geo([r["contiguous_over_any"] for r in rows]),
               "seconds_max": max((r["seconds"] for r in rows), default=None)}
    return rows, summary


def _instance(name: str, topology: str, folder: Path) -> Path:
    from placement_rl.baselines.maxload_instances import instance_from_graph
    from placement_rl.cost.resolve import resolve_costs
    from placement_rl.graph.spec import graph_from_spec
    from placement_rl.topology import load_topology

    base = name.removesuffix("-ops")
    graph = graph_from_spec({"source": "zoo", "name": base, "overrides": {},
                             "coarsen": {"enabled": not name.endswith("-ops"), "depth": None, "max_nodes": None}})
    topo = load_topology(topology)
    path = folder / f"{name}@{topology}.json"
    path.write_text(json.dumps(instance_from_graph(graph, resolve_costs(graph, topo), topo)))
    return path


def zoo_part(seconds: float, limit: int | None, folder: Path) -> tuple[list[dict], dict]:
    from placement_rl.baselines.maxload import evaluate
    from placement_rl.baselines.maxload_blocks import blocks_of
    from placement_rl.baselines.maxload_dp import contiguous_dp
    from placement_rl.baselines.maxload_solve import solve
    from placement_rl.graph.maxload_file import read_instance

    rows = []
    cases = [(g, t) for t in TOPOLOGIES for g in ZOO][:limit]
    for name, topology in cases:
        inst = read_instance(_instance(name, topology, folder))
        blocks = blocks_of(inst)
        one, broken = evaluate(inst, np.zeros(inst.num_nodes, dtype=np.int64))
        linear = contiguous_dp(inst, blocks, linear=True)
        t0 = time.perf_counter()
        res = solve(inst, seconds=seconds)
        dp = res.contiguous
        rows.append({"graph": name, "topology": topology, "nodes": inst.num_nodes, "classes": blocks.count,
                     "accelerators": inst.accelerators, "cpus": inst.cpus,
                     "one_accelerator_ms": None if broken else float(one.max()) * 1e3,
                     "linear_ms": linear.max_load * 1e3, "contiguous_ms": dp.max_load * 1e3,
                     "contiguous_proved": dp.contiguous_optimum, "best_ms": res.best.max_load * 1e3,
                     "best_method": res.best.method, "bound_ms": res.lower_bound * 1e3, "proved": res.optimal,
                     "ideals": int(dp.stats["ideals"]), "ideal_pairs": int(dp.stats["ideal_pairs"]),
                     "dp_seconds": dp.stats["seconds"], "seconds": time.perf_counter() - t0,
                     "notes": dp.notes + res.notes})
        r = rows[-1]
        print(f"{name}@{topology}: linear {r['linear_ms']:.3f} contiguous {r['contiguous_ms']:.3f} best "
              f"{r['best_ms']:.3f} bound {r['bound_ms']:.3f} ms; {r['ideals']} ideals, {r['dp_seconds']:.1f} s",
              flush=True)
    summary = {"cases": len(rows),
               "contiguous_over_linear": _geo([r["contiguous_ms"] / r["linear_ms"] for r in rows]),
               "best_over_contiguous": _geo([r["best_ms"] / r["contiguous_ms"] for r in rows]),
               "best_over_bound": _geo([r["best_ms"] / r["bound_ms"] for r in rows]),
               "contiguous_over_one": _geo([r["contiguous_ms"] / r["one_accelerator_ms"] for r in rows
                                            if r["one_accelerator_ms"]]),
               "contiguous_proved": sum(r["contiguous_proved"] for r in rows),
               "proved": sum(r["proved"] for r in rows),
               "dp_seconds_max": max((r["dp_seconds"] for r in rows), default=None),
               "ideals_max": max((r["ideals"] for r in rows), default=None)}
    return rows, summary


def latency_part(seconds: float, limit: int | None, folder: Path) -> tuple[list[dict], dict]:
    """The latency objective: random 6-node inference instances against enumeration, then the zoo's layer graphs
    for inference on ``cpu_2gpu``."""
    import itertools

    from placement_rl.baselines.maxload import evaluate
    from placement_rl.baselines.maxload_instances import instance_from_graph, random_instance
    from placement_rl.baselines.maxload_latency import latency_of, solve_latency
    from placement_rl.cost.modes import inference_costs
    from placement_rl.cost.resolve import resolve_costs
    from placement_rl.graph.maxload_file import read_instance
    from placement_rl.graph.spec import graph_from_spec
    from placement_rl.topology import load_topology

    rows = []
    for seed in range(8)[:limit]:
        path = folder / f"latency_{seed}.json"
        path.write_text(json.dumps(random_instance(2000 + seed, n=6, colour=seed % 3 == 2,
                                                   max_size=10 if seed % 2 else 1e9)))
        inst = read_instance(path)
        best = min(latency_of(inst, np.array(a)) for a in itertools.product(range(3), repeat=inst.num_nodes)
                   if not evaluate(inst, np.array(a))[1])
        res = solve_latency(inst, seconds=seconds)
        rows.append({"case": f"random-{2000 + seed}", "over_enumeration": res.latency / best, "proved": res.optimal,
                     **{f"{k}": v for k, v in res.candidates.items()}, "seconds": res.seconds})
    topo = load_topology("cpu_2gpu")
    for name in LATENCY_ZOO[:limit]:
        graph = graph_from_spec({"source": "zoo", "name": name.removesuffix("-ops"), "overrides": {},
                                 "coarsen": {"enabled": not name.endswith("-ops"), "depth": None, "max_nodes": None}})
        path = folder / f"latency_{name}.json"
        path.write_text(json.dumps(instance_from_graph(graph, inference_costs(resolve_costs(graph, topo)), topo)))
        inst = read_instance(path)
        res = solve_latency(inst, seconds=seconds)
        rows.append({"case": f"{name}@cpu_2gpu", "nodes": inst.num_nodes, "latency_ms": res.latency * 1e3,
                     "bound_ms": res.bound * 1e3, "proved": res.optimal, "method": res.method,
                     **{f"{k}_ms": None if v is None else v * 1e3 for k, v in res.candidates.items()},
                     "seconds": res.seconds})
        print(f"latency {name}: {res.candidates} -> {res.latency * 1e3:.3f} ms (bound {res.bound * 1e3:.3f})",
              flush=True)
    exact = [r for r in rows if "over_enumeration" in r]
    zoo = [r for r in rows if "latency_ms" in r and "-ops@" not in r["case"]]
    ops = [r for r in rows if "latency_ms" in r and "-ops@" in r["case"]]
    summary = {"random": len(exact), "random_equal": sum(abs(r["over_enumeration"] - 1) < 1e-9 for r in exact),
               "random_proved": sum(r["proved"] for r in exact), "zoo": len(zoo),
               "zoo_over_maxload_split": _geo([r["latency_ms"] / r["maxload_split_ms"] for r in zoo
                                               if r["maxload_split_ms"]]),
               "zoo_over_all_cpu": _geo([r["latency_ms"] / r["all_cpu_ms"] for r in zoo]),
               "zoo_over_bound": _geo([r["latency_ms"] / r["bound_ms"] for r in zoo if r["bound_ms"] > 0]),
               "zoo_proved": sum(r["proved"] for r in zoo), "ops": len(ops),
               "ops_over_maxload_split": _geo([r["latency_ms"] / r["maxload_split_ms"] for r in ops
                                               if r["maxload_split_ms"]]),
               "ops_over_bound": _geo([r["latency_ms"] / r["bound_ms"] for r in ops if r["bound_ms"] > 0]),
               "ops_proved": sum(r["proved"] for r in ops)}
    return rows, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="search after the dynamic program, per instance")
    ap.add_argument("--parts", nargs="+", default=["exact", "zoo", "latency"], choices=["exact", "zoo", "latency"])
    ap.add_argument("--limit", type=int, default=None, help="at most this many instances per part (a smoke run)")
    ap.add_argument("--stem", default="maxload")
    args = ap.parse_args()

    from placement_rl.results import write_result

    t_start = time.perf_counter()
    figures: dict = {"seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        if "exact" in args.parts:
            figures["exact"], figures["exact_summary"] = exact_part(args.seconds, args.limit, Path(tmp))
        if "zoo" in args.parts:
            figures["zoo"], figures["zoo_summary"] = zoo_part(args.seconds, args.limit, Path(tmp))
        if "latency" in args.parts:
            figures["latency"], figures["latency_summary"] = latency_part(args.seconds, args.limit, Path(tmp))
    path = write_result(args.stem, figures, seconds=time.perf_counter() - t_start)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
