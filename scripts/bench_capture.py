"""Capture every zoo model at its defaults: nodes before/after the default coarsening, FLOPs, parameters,
capture seconds, and whether the per-node forward FLOPs add up to FlopCounterMode's count of the module.
Usage: python scripts/bench_capture.py [--models gpt,resnet50] [--out capture.md]"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.graph.coarsen import coarsen
from placement_rl.report import markdown_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        module, inputs = zoo.build(name)
        t0 = time.perf_counter()
        graph = capture(module, inputs, name=name)
        secs = time.perf_counter() - t0
        t1 = time.perf_counter()
        groups = coarsen(graph)
        csecs = time.perf_counter() - t1
        params = sum(p.numel() for p in module.parameters())
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(*inputs)
        exact = "yes" if graph.fwd_flops.sum() == counter.get_total_flops() else "NO"
        rows.append({"model": name, "nodes": graph.num_nodes, "groups": groups.num_nodes,
                     "fwd_gflops": graph.fwd_flops.sum() / 1e9, "bwd_gflops": graph.bwd_flops.sum() / 1e9,
                     "params_m": params / 1e6, "capture_s": secs, "coarsen_s": csecs, "exec": graph.meta["exec"],
                     "exact": exact})
        print(f"{name:<10} nodes {graph.num_nodes:>4} -> groups {groups.num_nodes:>4}  "
              f"fwd {rows[-1]['fwd_gflops']:9.2f} GFLOP  params {rows[-1]['params_m']:7.2f} M  "
              f"capture {secs:6.2f} s ({graph.meta['exec']})  coarsen {csecs:5.3f} s  FLOPs exact {exact}", flush=True)
    table = markdown_table(rows, ["model", "nodes", "groups", "fwd_gflops", "bwd_gflops", "params_m", "capture_s",
                                  "exec", "coarsen_s", "exact"],
                           ["model", "nodes", "groups (default coarsening)", "fwd GFLOP", "bwd GFLOP", "params (M)",
                            "capture s", "exec", "coarsen s", "fwd FLOPs == FlopCounterMode"])
    print()
    print(table)
    if args.out:
        from placement_rl.graph.io import atomic_write_text

        atomic_write_text(args.out, table)


if __name__ == "__main__":
    main()
