"""Stage planners on the full stage-plan space: measured-style graphs, a slow device in the cluster.

    python scripts/bench_stage_space.py [--part all|table|step|scale] [--budget 2000] [--steps 10000] [--quick]

(a) table: every stage planner's time per sample in steady state (throughput objective) and search seconds, with
    its gap to ``exact``, on a layer graph and an operator graph of one model (``studies.stage_space``), on 6 and
    3 accelerators + 1 CPU, training and inference.
(c) step: training step time with the step-time objective (``exact`` a search there, not a proof).
(b) scale: at 8, 64 and 512 devices (hosts of 8 accelerators, plus a CPU): ``exact``'s seconds (its DP over
    ideals apart), the learned ``PipelineEnv`` policy's gap to it and its seconds; and where ``exact`` stops
    being exact (the operator graph's DP over the work limit: one order's prefixes, or skipped).
Writes ``results/stage_space.json``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from placement_rl.results import write_result
from placement_rl.studies.stage_space import (PLANNERS, hosts, layer_graph, learned_row, measured_costs, mixed,
                                              operator_graph, planner_table)


def gap(x: float, ref: float) -> float | None:
    return None if not (math.isfinite(x) and math.isfinite(ref)) else x / ref - 1.0


def part_table(args) -> list[dict]:
    rows = []
    graphs = {"layers24": layer_graph(24), "operators6": operator_graph(6)}
    print("(a) time per sample in steady state (ms), search seconds; gap to exact")
    for gname, graph in graphs.items():
        for acc in (6, 3):
            topo = mixed(acc)
            costs = measured_costs(graph, topo)
            for mode in ("train", "inference"):
                cells = planner_table(graph, costs, topo, mode=mode, budget=args.budget)
                ref = cells[0].time_per_sample
                for c in cells:
                    g = gap(c.time_per_sample, ref)
                    rows.append({"graph": gname, "cluster": topo.name, "mode": mode, "planner": c.planner,
                                 "time_per_sample_ms": c.time_per_sample * 1e3, "gap_to_exact": g,
                                 "feasible": c.feasible, "seconds": c.seconds, "sim_calls": c.sim_calls,
                                 "plan": c.plan, "note": c.note})
                    print(f"  {gname:<11} {topo.name:<9} {mode:<9} {c.planner:<11} "
                          f"{c.time_per_sample * 1e3:9.4f} {'' if g is None else f'{100 * g:+7.2f}%':>8} "
                          f"{c.seconds:7.2f}s  {c.plan} {c.note}", flush=True)
    return rows


def part_step(args) -> list[dict]:
    """Training with the step-time objective (one batch through the pipeline, bubble included): ``exact`` is a
    search there (its DP ranks plans by estimate, the simulator picks), not a proof."""
    rows = []
    print("(c) training step time (ms) with the step-time objective; gap to exact")
    for gname, graph in (("layers24", layer_graph(24)), ("operators6", operator_graph(6))):
        for acc in (6, 3):
            topo = mixed(acc)
            cells = planner_table(graph, measured_costs(graph, topo), topo, mode="train", budget=args.budget,
                                  objective="step")
            ref = cells[0].step_time
            for c in cells:
                g = gap(c.step_time, ref)
                rows.append({"graph": gname, "cluster": topo.name, "planner": c.planner, "step_ms": c.step_time * 1e3,
                             "gap_to_exact": g, "feasible": c.feasible, "seconds": c.seconds, "plan": c.plan})
                print(f"  {gname:<11} {topo.name:<9} {c.planner:<11} {c.step_time * 1e3:9.3f} "
                      f"{'' if g is None else f'{100 * g:+7.2f}%':>8} {c.seconds:7.2f}s  {c.plan}", flush=True)
    return rows


def part_scale(args) -> list[dict]:
    rows = []
    print("(b) exact and the learned PipelineEnv policy at 8 / 64 / 512 devices (train, throughput objective)")
    for d in ((8, 64) if args.quick else (8, 64, 512)):
        topo = hosts(d)
        for gname, graph in (("layers24", layer_graph(24)), ("operators24", operator_graph(24))):
            costs = measured_costs(graph, topo)
            (ex,) = planner_table(graph, costs, topo, mode="train", budget=args.budget, planners=("exact",))
            row = {"devices": d, "graph": gname, "exact_ms": ex.time_per_sample * 1e3, "exact_seconds": ex.seconds,
                   "exact_note": ex.note, "exact_plan": ex.plan}
            if gname == "layers24":
                lr = learned_row(graph, costs, topo, mode="train", steps=args.steps)
                row.update(learned_ms=lr.time_per_sample * 1e3, learned_seconds=lr.seconds,
                           learned_gap=gap(lr.time_per_sample, ex.time_per_sample), learned_plan=lr.plan,
                           learned_steps=args.steps, learned_sim_calls=lr.sim_calls)
            rows.append(row)
            extra = "" if "learned_ms" not in row else (
                f" | learned {row['learned_ms']:.4f} ms ({100 * row['learned_gap']:+.2f}%) in "
                f"{row['learned_seconds']:.1f}s")
            print(f"  {d:4d} devices {gname:<11} exact {row['exact_ms']:.4f} ms in {ex.seconds:.2f}s "
                  f"[{ex.note}]{extra}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="all", choices=("all", "table", "step", "scale"))
    ap.add_argument("--budget", type=int, default=2000, help="simulator calls per planner")
    ap.add_argument("--steps", type=int, default=10000, help="PPO steps of the learned policy per size")
    ap.add_argument("--quick", action="store_true", help="8 and 64 devices only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    figures: dict = {"planners": list(PLANNERS), "budget": args.budget, "objective": "throughput"}
    if args.part in ("all", "table"):
        figures["table"] = part_table(args)
    if args.part in ("all", "step"):
        figures["step"] = part_step(args)
    if args.part in ("all", "scale"):
        figures["scale"] = part_scale(args)
    seconds = time.perf_counter() - t0
    calls = sum(int(r.get("sim_calls", 0)) for r in figures.get("table", []))
    print(f"wrote {write_result('stage_space', figures, seconds=seconds, sim_calls=calls)} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
