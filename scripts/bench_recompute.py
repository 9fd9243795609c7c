"""Activation recomputation: the bytes autograd saves in the deployed program against the priced activations.

    python scripts/bench_recompute.py

For the zoo GPT (d_model 128, seq 256, batch 8, 4 layers) exported as the executor runs it, with each layer (full)
or attention core (selective) outlined under ``torch.utils.checkpoint`` (``executor._recompute``): the bytes saved
for backward in one forward (``saved_bytes``: saved-tensor hooks, distinct storages, parameters excluded) against
``cost.recompute``'s kept activations (the other ops' ``act_bytes`` + each region's inputs; the simulator adds one
micro-batch's transient of the largest region on top). Prints a table; writes ``results/bench_recompute.json``.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from placement_rl.cost.recompute import kept_bytes, regions
from placement_rl.executor._recompute import apply_recompute, regions_of, saved_bytes
from placement_rl.executor._stages import export_step, program_module
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.results import write_result

GPT = dict(batch_size=8, seq_len=256, vocab_size=512, d_model=128, n_layers=4, n_heads=4, dropout=0.0)


def main() -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    graph = capture_zoo("gpt", **GPT)
    module, inputs = zoo.build("gpt", **GPT)
    rows = []
    for mode in ("none", "selective", "full"):
        gm = program_module(export_step(module, inputs))
        priced = float(graph.act_bytes.sum())
        if mode != "none":
            plan = StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), ((0,),), recompute=(mode,))
            apply_recompute(gm, regions_of(plan, graph)["0"])
            rid = regions(graph, mode)
            priced = float(graph.act_bytes[rid < 0].sum() + kept_bytes(graph, rid).sum())
        measured = saved_bytes(gm, inputs)
        rows.append({"recompute": mode, "measured_mb": measured / 1e6, "priced_mb": priced / 1e6,
                     "ratio": measured / priced})
        print(f"{mode:>9}: saved {measured / 1e6:8.2f} MB, priced {priced / 1e6:8.2f} MB "
              f"(measured / priced {measured / priced:.4f})")
    write_result("bench_recompute", {"model": "gpt", "overrides": GPT, "rows": rows},
                 seconds=time.perf_counter() - start)


if __name__ == "__main__":
    main()
