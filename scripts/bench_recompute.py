"""Activation recomputation on the CPU executor: saved bytes and step time of the deployed program against the
prediction.

    python scripts/bench_recompute.py [--parts mt] [--steps 15] [--repeats 5]

For the zoo GPT (d_model 128, seq 256, batch 8, 4 layers) exported as the executor runs it, with each layer (full)
or attention core (selective) outlined under ``torch.utils.checkpoint`` (``executor._recompute``):

(m) memory: the bytes saved for backward in one forward (``saved_bytes``: saved-tensor hooks, distinct storages,
    parameters excluded) against ``cost.recompute``'s kept activations (the other ops' ``act_bytes`` + each region's
    inputs; the simulator adds one micro-batch's transient of the largest region on top).
(t) step time: the deployed one-process plans (``PartRunner``: the executor's own step, gloo, one thread, Adam)
    for none / selective / full, steps interleaved (same load, same moment): median of ``--steps`` steps (wall), the
    fastest step (the least disturbed on a shared machine) and the median CPU time of the process, against ``simulate_pipeline`` on per-op CPU profiles of the model (``placement_rl.profiling``: thread
    CPU clock, the profile's per-pass overhead) plus the profile's Adam step, as ``bench_tp.py`` predicts its
    plans. The machine's load (``os.getloadavg``) before and after is recorded with the figures.

Prints a table; writes ``results/bench_recompute.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from placement_rl.cost.recompute import kept_bytes, regions
from placement_rl.executor._recompute import apply_recompute, regions_of, saved_bytes
from placement_rl.executor._stages import export_step, program_module
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import RECOMPUTE, StagePlan
from placement_rl.results import write_result

GPT = dict(batch_size=8, seq_len=256, vocab_size=512, d_model=128, n_layers=4, n_heads=4, dropout=0.0)


def one_stage(graph, mode: str) -> StagePlan:
    return StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), ((0,),), recompute=(mode,),
                     batch_size=GPT["batch_size"])


def bench_memory(graph) -> list[dict]:
    module, inputs = zoo.build("gpt", **GPT)
    rows = []
    for mode in RECOMPUTE:
        gm = program_module(export_step(module, inputs))
        priced = float(graph.act_bytes.sum())
        if mode != "none":
            apply_recompute(gm, regions_of(one_stage(graph, mode), graph)["0"])
            rid = regions(graph, mode)
            priced = float(graph.act_bytes[rid < 0].sum() + kept_bytes(graph, rid).sum())
        measured = saved_bytes(gm, inputs)
        rows.append({"recompute": mode, "measured_mb": measured / 1e6, "priced_mb": priced / 1e6,
                     "ratio": measured / priced})
        print(f"(m) {mode:>9}: saved {measured / 1e6:8.2f} MB, priced {priced / 1e6:8.2f} MB "
              f"(measured / priced {measured / priced:.4f})")
    return rows


def predicted_steps(graph, *, repeats: int) -> dict[str, dict]:
    """Per mode: the simulated step on this CPU's per-op profile, plus the profile's Adam step (seconds)."""
    from placement_rl.cost import simulate_pipeline
    from placement_rl.cost.pipeline import with_step_overhead
    from placement_rl.profiling import ProfileDB, measured_costs, predict_step_time, profile_graph
    from placement_rl.profiling.run import select_devices
    from placement_rl.topology import load_topology

    module, inputs = zoo.build("gpt", **GPT)
    db = ProfileDB()
    profile_graph(module, inputs, graph, select_devices(["cpu"])[0], db=db, warmup=3, repeats=repeats,
                  progress=False, clock="thread")
    topo = load_topology("2x_cpu")
    costs = measured_costs(graph, topo, db, backend="gloo")
    overhead = predict_step_time(graph, topo, np.zeros(graph.num_nodes, dtype=np.int64), db,
                                 optimizer=False).step_overhead
    costs = with_step_overhead(costs, overhead)
    adam = (db.optimizer_time(graph, db.device_names[0]) or (0.0,))[0]
    out = {}
    for mode in RECOMPUTE:
        res = simulate_pipeline(graph, costs, topo, one_stage(graph, mode), cost_batch_size=GPT["batch_size"])
        out[mode] = {"simulated": res.step_time, "adam": adam, "predicted": res.step_time + adam,
                     "bwd": res.meta["stage_bwd_time"][0], "fwd": res.meta["stage_fwd_time"][0]}
    out["none"]["step_overhead"] = float(overhead)
    return out


def measured_steps(graph, *, steps: int, warmup: int) -> dict[str, dict]:
    """Per mode: the deployed plan's step (``PartRunner``, one gloo process), steps of the three plans interleaved."""
    import torch.distributed as dist

    from placement_rl.executor._runner import PartRunner
    from placement_rl.executor.distributed import DeployConfig, DeploySpec, prepare_job

    with tempfile.TemporaryDirectory(prefix="bench_recompute_") as tmp:
        job = prepare_job([DeploySpec(plan=one_stage(graph, mode), graph=graph, model="gpt", overrides=GPT)
                           for mode in RECOMPUTE], config=DeployConfig(device="cpu"), job_dir=Path(tmp) / "job")
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{Path(tmp) / 'pg'}")
        try:
            runners = {mode: PartRunner({"lr": 1e-3}, job.job_dir / f"part{i}", rank=0, device=torch.device("cpu"))
                       for i, mode in enumerate(RECOMPUTE)}
            wall: dict[str, list[float]] = {m: [] for m in RECOMPUTE}
            cpu: dict[str, list[float]] = {m: [] for m in RECOMPUTE}
            for step in range(warmup + steps):
                order = RECOMPUTE[step % 3:] + RECOMPUTE[:step % 3]  # each mode first as often as the others
                for mode in order:
                    got = runners[mode].step()
                    if step >= warmup:
                        wall[mode].append(got.wall)
                        cpu[mode].append(got.cpu)
        finally:
            dist.destroy_process_group()
    return {m: {"wall": float(np.median(wall[m])), "cpu": float(np.median(cpu[m])), "fastest": float(np.min(wall[m])),
                "wall_iqr": float(np.subtract(*np.percentile(wall[m], [75, 25])))} for m in RECOMPUTE}


def bench_time(graph, *, steps: int, repeats: int) -> dict:
    load_before = list(os.getloadavg())
    pred = predicted_steps(graph, repeats=repeats)
    meas = measured_steps(graph, steps=steps, warmup=3)
    rows = []
    for mode in RECOMPUTE:
        p, m = pred[mode], meas[mode]
        rows.append({"recompute": mode, "measured_ms": m["wall"] * 1e3, "measured_cpu_ms": m["cpu"] * 1e3,
                     "measured_fastest_ms": m["fastest"] * 1e3, "measured_iqr_ms": m["wall_iqr"] * 1e3,
                     "predicted_ms": p["predicted"] * 1e3, "simulated_ms": p["simulated"] * 1e3,
                     "adam_ms": p["adam"] * 1e3, "ratio": m["wall"] / p["predicted"],
                     "ratio_cpu": m["cpu"] / p["predicted"], "ratio_fastest": m["fastest"] / p["predicted"],
                     "increase_measured": m["wall"] / meas["none"]["wall"] - 1.0,
                     "increase_measured_cpu": m["cpu"] / meas["none"]["cpu"] - 1.0,
                     "increase_predicted": p["predicted"] / pred["none"]["predicted"] - 1.0})
        r = rows[-1]
        print(f"(t) {mode:>9}: measured {r['measured_ms']:7.2f} ms (fastest {r['measured_fastest_ms']:7.2f}, CPU "
              f"{r['measured_cpu_ms']:7.2f}), predicted {r['predicted_ms']:7.2f} ms, measured / predicted "
              f"{r['ratio']:.3f} (fastest {r['ratio_fastest']:.3f}, CPU {r['ratio_cpu']:.3f}); over none: measured "
              f"{100 * r['increase_measured']:+.1f}% (CPU {100 * r['increase_measured_cpu']:+.1f}%), predicted "
              f"{100 * r['increase_predicted']:+.1f}%")
    return {"rows": rows, "steps": steps, "profile_repeats": repeats, "threads": torch.get_num_threads(),
            "step_overhead_ms": pred["none"]["step_overhead"] * 1e3, "load_before": load_before,
            "load_after": list(os.getloadavg())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="mt", help="m: saved bytes, t: step time")
    ap.add_argument("--steps", type=int, default=15, help="measured steps per plan (t)")
    ap.add_argument("--repeats", type=int, default=5, help="profiling repeats per op (t)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    graph = capture_zoo("gpt", **GPT)
    figures: dict = {"model": "gpt", "overrides": GPT}
    if "m" in args.parts:
        figures["rows"] = bench_memory(graph)
    if "t" in args.parts:
        figures["time"] = bench_time(graph, steps=args.steps, repeats=args.repeats)
    write_result("bench_recompute", figures, seconds=time.perf_counter() - start)


if __name__ == "__main__":
    main()
