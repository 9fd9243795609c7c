"""Benchmark of the DP x PP executor (``placement_rl.executor.distributed``) on this machine's CPU processes.

    python scripts/bench_executor.py --out outputs/bench_executor [--steps 20] [--quick] [--parts ab]

(a) Overhead: our executor's step (``_runner.PartRunner``: mesh, DDP / FSDP2 wrapper, tie groups, schedule by
    name, Adam) against a minimal hand-written run of the same model. Pipeline plans: a hand-written
    ``torch.distributed.pipelining`` run of the very same split (same stage modules and static metadata,
    plain ``PipelineStage`` + schedule + Adam, default group). One-stage ``dp`` / ``fsdp`` plans: the eager
    zoo ``nn.Module`` itself wrapped in ``DistributedDataParallel`` / FSDP2 ``fully_shard``, Adam, the same
    micro-batches (what a user writes from the torch tutorials). A shared 2-core machine's load swings step
    times by 2x between runs, so both run in the same processes with their steps interleaved (ours, hand,
    hand, ours, ...): both see the same load. Each step is timed the same way (barrier, then forward /
    backward / gradient sync + Adam; the slowest rank counts). Ratio of median step times (target <= 1.05),
    also the median of per-step ratios. A full ``deploy_stage_plans`` run of the plan is timed too.
(b) Fidelity: measured step time of DP (DDP), FSDP, PP and DP x PP plans (1, 2 and 4 processes, one torch
    thread each) against ``simulate_pipeline`` with costs from per-op CPU profiles (``placement_rl.profiling``,
    thread CPU clock, gloo send/recv link fit) on CPU "devices" (``2x_cpu``; 4 of them for DP x PP, which
    then runs 4 processes on the 2 cores: reported apart). Each model is captured and profiled at every
    per-replica micro-batch size a plan deploys (``batch / (m * p)``, same node names as the full-batch
    capture); a plan is simulated with the costs of its micro-batch (``cost_batch_size``: no linear 1/(m p)
    scaling) plus that profile's measured per-pass overhead that no op owns (``with_step_overhead``). The
    simulator has no optimizer, so the prediction adds the profile's measured Adam time scaled by the
    largest stage's parameter share (``+opt``; FSDP: divided by the DP degree). MAPE and Spearman's rank
    correlation, overall and per plan kind.

Writes ``bench_executor.json`` and ``bench_executor.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from placement_rl.cost import simulate_pipeline
from placement_rl.cost.pipeline import with_step_overhead
from placement_rl.executor.ab import run_ab
from placement_rl.executor._stages import program_module, split_stages, stage_parameters, tied_parameters, untie
from placement_rl.executor.distributed import DeployConfig, DeploySpec, deploy_stage_plans
from placement_rl.graph.io import atomic_write_text
from placement_rl.plans import StagePlan
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.profiling import ProfileDB, local_link_benchmarks, measured_costs, predict_step_time, profile_graph
from placement_rl.profiling.deploy_predict import predict_deploy_step, tensors_per_param_node, with_pipeline_overhead
from placement_rl.profiling.dist_overhead import DistOverheads, fit_dist_overheads, measure_dist_overheads
from placement_rl.profiling.fidelity import fidelity_stats
from placement_rl.profiling.run import select_devices

MODELS = {
    "gpt": dict(batch_size=16, seq_len=64, vocab_size=512, d_model=64, n_layers=4, n_heads=4, dropout=0.0),
    "resnet18": dict(batch_size=16, image_size=32, num_classes=10, width=8),
}


def even_plan(n: int, *, cuts: list[float], dp: int, m: int, schedule: str, batch: int,
              sharding: str = "dp") -> StagePlan:
    """Stages split at the given fractions of the node order; stage s on devices s, s + S, ... (mesh layout)."""
    bounds = [int(round(c * n)) for c in cuts]
    son = np.searchsorted(np.array(bounds), np.arange(n), side="right")
    stages = len(cuts) + 1
    devices = tuple(tuple(s + k * stages for k in range(dp)) for s in range(stages))
    return StagePlan(stage_of_node=son, stage_devices=devices, num_microbatches=m, schedule=schedule,
                     batch_size=batch, sharding=sharding)


def plan_label(kw: dict) -> str:
    kind = kw.get("sharding", "dp")
    head = f"{kind}{kw['dp']}" if not kw["cuts"] else f"{kind}{kw['dp']} x pp2@{kw['cuts'][0]:.2f}"
    return f"{head} {kw['schedule']} m={kw['m']}"


# ------------------------------------------------------------------------------ (a) hand-written
class HandWritten:
    """Minimal torch.distributed.pipelining run of a prepared part (PP only, one stage per rank), written
    straight from the torch docs: the same stage module, ``PipelineStage`` + schedule + Adam, default group."""

    def __init__(self, part_dir: Path, rank: int) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        part = json.loads((part_dir / "part.json").read_text())
        meta, self.m, n_stages = part["value_meta"], part["dims"]["num_microbatches"], part["dims"]["num_stages"]
        gm = program_module(torch.export.load(str(part_dir / "program.pt2")))
        splits = split_stages(gm, part["stage_map"], n_stages, aliases=part["param_aliases"])
        ties = tied_parameters(splits)
        sp = splits[rank]
        untie(sp, list(ties))

        def ex(name: str, grad: bool = False) -> torch.Tensor:
            shape, dtype, rg = meta[name]
            t = torch.zeros(shape, dtype=getattr(torch, dtype))
            return t if grad else t.requires_grad_(rg)

        self.first, self.last = rank == 0, rank == n_stages - 1
        stage = PipelineStage(
            sp.module, rank, n_stages, torch.device("cpu"), input_args=tuple(ex(v) for v in sp.inputs),
            output_args=ex(sp.outputs[0]) if self.last else tuple(ex(v) for v in sp.outputs),
            input_grads=None if self.first else tuple(ex(v, True) if meta[v][2] else None for v in sp.inputs),
            output_grads=None if self.last else tuple(ex(v, True) if meta[v][2] else None for v in sp.outputs))
        cls = Schedule1F1B if part["dims"]["schedule"] == "1f1b" else ScheduleGPipe
        self.schedule = cls(stage, n_microbatches=self.m, loss_fn=lambda out, target: out)
        params = stage_parameters(sp)
        self.opt = torch.optim.Adam(params.values(), lr=1e-3)
        self.batch = torch.load(part_dir / "inputs.pt", weights_only=True)
        self.tied = [params[k] for k in sorted(ties) if k in params]

    def step(self) -> float:
        self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        self.schedule.step(*(self.batch if self.first else ()), target=torch.zeros(self.m) if self.last else None,
                           losses=[] if self.last else None, return_outputs=False)
        for p in self.tied:  # stage 0 and the last stage share the tied weight: sum its gradient
            dist.all_reduce(p.grad)
        self.opt.step()
        return time.perf_counter() - t0


class HandWrittenDP:
    """The eager zoo model in ``DistributedDataParallel`` or FSDP2 ``fully_shard`` (default group), Adam,
    ``m`` micro-batches per step (``no_sync`` before the last for DDP), from the torch tutorials."""

    def __init__(self, part_dir: Path, rank: int) -> None:
        part = json.loads((part_dir / "part.json").read_text())
        dims, world = part["dims"], dist.get_world_size()
        model = part["model"]
        module, inputs = zoo.build(model["zoo"], **{**model["overrides"], "batch_size": part["batch_size"]})
        module.train()
        self.m = int(dims["num_microbatches"])
        if dims.get("sharding", "dp") == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            self.model = fully_shard(module, mesh=init_device_mesh("cpu", (world,)))
            self.ddp = False
        else:
            self.model = torch.nn.parallel.DistributedDataParallel(module)
            self.ddp = True
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        per = inputs[0].shape[0] // world
        self.batch = tuple(t[rank * per:(rank + 1) * per] for t in inputs)

    def step(self) -> float:
        import contextlib

        self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        size = self.batch[0].shape[0] // self.m
        for i in range(self.m):
            ctx = self.model.no_sync() if self.ddp and i < self.m - 1 else contextlib.nullcontext()
            with ctx:
                (self.model(*(t[i * size:(i + 1) * size] for t in self.batch)) / self.m).backward()
        self.opt.step()
        return time.perf_counter() - t0


def _hand(part_dir: Path, rank: int, stages: int):
    """The hand-written reference of a part (``placement_rl.executor.ab.run_ab``): DDP / FSDP2 on one stage,
    torch pipelining on several."""
    return HandWrittenDP(part_dir, rank) if stages == 1 else HandWritten(part_dir, rank)


def bench_overhead(graphs, *, steps: int, repeats: int, work: Path) -> list[dict]:
    rows = []
    cases = [("gpt", dict(cuts=[0.5], dp=1, m=4, schedule="1f1b")),
             ("resnet18", dict(cuts=[0.5], dp=1, m=2, schedule="gpipe")),
             ("gpt", dict(cuts=[], dp=2, m=1, schedule="1f1b")),
             ("gpt", dict(cuts=[], dp=2, m=1, schedule="1f1b", sharding="fsdp")),
             ("resnet18", dict(cuts=[], dp=2, m=1, schedule="1f1b")),
             ("resnet18", dict(cuts=[], dp=2, m=1, schedule="1f1b", sharding="fsdp"))]
    for name, kw in cases:
        if name not in graphs:
            continue
        plan = even_plan(graphs[name].num_nodes, batch=MODELS[name]["batch_size"], **kw)
        spec = DeploySpec(plan=plan, graph=graphs[name], model=name, overrides=MODELS[name])
        cfg = DeployConfig(steps=steps, warmup=3, timeout_s=600)
        job = work / f"a_{name}_{len(rows)}"
        deployed = deploy_stage_plans([spec], config=cfg, job_dir=job)[0]  # the full path, launcher included
        ours, hand = run_ab(job / "part0", steps=steps * repeats, warmup=3, world=2, make_hand=_hand, join_timeout=600)
        paired = float(np.median(ours / hand))
        row = {"model": name, "plan": plan_label(kw), "deploy_s": deployed.step_time,
               "baseline": "eager module + DDP" if not kw["cuts"] and kw.get("sharding", "dp") == "dp" else
               "eager module + FSDP2 fully_shard" if not kw["cuts"] else "torch pipelining, same split",
               "ours_s": float(np.median(ours)), "hand_s": float(np.median(hand)),
               "ratio": float(np.median(ours) / np.median(hand)), "ratio_paired_steps": paired,
               "ratio_best_step": float(ours.min() / hand.min()), "steps": int(ours.size)}
        rows.append(row)
        print(f"(a) {name} {row['plan']}: deploy {deployed.step_time * 1e3:.2f} ms; in-process A/B ours {row['ours_s'] * 1e3:.2f} / "
              f"hand {row['hand_s'] * 1e3:.2f} ms: ratio {row['ratio']:.3f}, paired {paired:.3f}, "
              f"best {row['ratio_best_step']:.3f}")
    return rows


# ------------------------------------------------------------------------------ (b) fidelity
PLANS = [dict(cuts=[], dp=1, m=1, schedule="gpipe"), dict(cuts=[], dp=1, m=4, schedule="gpipe"),
         dict(cuts=[], dp=2, m=1, schedule="gpipe"), dict(cuts=[], dp=2, m=2, schedule="gpipe"),
         dict(cuts=[], dp=2, m=1, schedule="gpipe", sharding="fsdp"),
         dict(cuts=[], dp=2, m=2, schedule="gpipe", sharding="fsdp"),
         dict(cuts=[0.5], dp=1, m=1, schedule="gpipe"), dict(cuts=[0.5], dp=1, m=4, schedule="gpipe"),
         dict(cuts=[0.5], dp=1, m=4, schedule="1f1b"), dict(cuts=[0.25], dp=1, m=2, schedule="1f1b"),
         dict(cuts=[0.75], dp=1, m=2, schedule="gpipe"),
         dict(cuts=[0.5], dp=2, m=2, schedule="gpipe"), dict(cuts=[0.5], dp=2, m=2, schedule="1f1b")]


def plan_kind(kw: dict) -> str:
    if kw["cuts"] and kw["dp"] > 1:
        return "dp x pp (4 procs on 2 cores)"
    if kw["cuts"]:
        return "pp"
    return kw.get("sharding", "dp") if kw["dp"] > 1 else "single"


def cpu_topology(count: int):
    """``2x_cpu`` with ``count`` CPU devices (the same measured figures)."""
    import yaml

    from placement_rl.topology import DeviceTopology, conf_dir

    data = yaml.safe_load((conf_dir() / "topology" / "2x_cpu.yaml").read_text())
    data["devices"][0]["count"] = count
    data["name"] = f"{count}x_cpu"
    return DeviceTopology.from_dict(data)


def micro_batch(plan: StagePlan) -> int:
    """Per-replica micro-batch size of a plan whose stages share one DP degree."""
    return int(plan.batch_size) // (plan.num_microbatches * len(plan.stage_devices[0]))


def profile_model(name: str, sizes: set[int], *, db: ProfileDB, repeats: int) -> dict[int, object]:
    """Capture and profile zoo model ``name`` at each batch size (thread CPU clock, one thread) into ``db``."""
    cpu = select_devices(["cpu"])[0]
    graphs = {}
    for b in sorted(sizes, reverse=True):
        ov = {**MODELS[name], "batch_size": b}
        module, inputs = zoo.build(name, **ov)
        graphs[b] = capture(module, inputs, name=name, meta={"zoo": name, "zoo_overrides": ov,
                                                            "zoo_options": zoo.resolve_options(name, ov)})
        profile_graph(module, inputs, graphs[b], cpu, db=db, warmup=3, repeats=repeats, progress=False,
                      clock="thread")
    full = graphs[MODELS[name]["batch_size"]]
    for b, g in graphs.items():
        if list(g.names) != list(full.names) or not np.array_equal(g.edges, full.edges):
            raise RuntimeError(f"{name} captured at batch {b} does not match its full-batch graph node for node")
    return graphs


class Predictor:
    """Predictions for one model: per-micro-batch costs + step overhead (new) and full-batch linear (old)."""

    def __init__(self, graphs: dict[int, object], full_batch: int, topology, db: ProfileDB, *,
                 overheads: DistOverheads | None = None, tensors_per_node: float = 2.0) -> None:
        self.graph, self.topology, self.db = graphs[full_batch], topology, db
        self.overheads, self.tensors_per_node = overheads, tensors_per_node
        self.linear_costs = measured_costs(self.graph, topology, db, backend="gloo")
        self.micro: dict[int, tuple] = {}
        for b, g in graphs.items():
            costs = measured_costs(g, topology, db, backend="gloo")
            overhead = predict_step_time(g, topology.subset([0, 1]), np.zeros(g.num_nodes, dtype=np.int64), db,
                                         optimizer=False).step_overhead
            self.micro[b] = (with_step_overhead(costs, overhead), overhead)
        got = db.optimizer_time(self.graph, db.device_names[0])
        self.adam = got[0] if got else 0.0

    def adam_share(self, plan: StagePlan) -> float:
        share = max(float(self.graph.param_bytes[plan.stage_of_node == s].sum()) for s in range(plan.num_stages))
        shards = len(plan.stage_devices[0]) if plan.sharding == "fsdp" else 1
        return self.adam * share / shards / (float(self.graph.param_bytes.sum()) or 1.0)

    def __call__(self, plan: StagePlan) -> dict[str, float]:
        b = micro_batch(plan)
        costs, overhead = self.micro[b]
        sim_old = simulate_pipeline(self.graph, costs, self.topology, plan, cost_batch_size=b).step_time
        staged = with_pipeline_overhead(costs, plan, self.graph, self.overheads)
        sim = simulate_pipeline(self.graph, staged, self.topology, plan, cost_batch_size=b).step_time
        linear = simulate_pipeline(self.graph, self.linear_costs, self.topology, plan).step_time
        opt = self.adam_share(plan)
        model = predict_deploy_step(sim, plan=plan, graph=self.graph, adam_seconds=self.adam,
                                    overheads=self.overheads, tensors_per_node=self.tensors_per_node)
        return {"simulated_s": sim_old, "predicted_old_s": sim_old + opt, "predicted_s": model["predicted_s"],
                "linear_s": linear + opt, "micro_batch": b, "step_overhead_s": overhead,
                "wrapper_s": model["wrapper_s"], "optimizer_s": model["optimizer_s"],
                "oversubscription": model["oversubscription"]}


def bench_fidelity(graphs, *, steps: int, work: Path, predictors: dict, refresh=None) -> dict:
    """Deploy every plan (one job per model and world size) and predict it. ``refresh(name)``, when given,
    returns a predictor from a profile made just then: called before each job, so a plan is predicted from a
    profile taken seconds before it runs rather than at the start of the bench."""
    rows = []
    for name, graph in graphs.items():
        predictor = predictors[name]
        plans = [even_plan(graph.num_nodes, batch=MODELS[name]["batch_size"], **kw) for kw in PLANS]
        cfg = DeployConfig(steps=steps, warmup=2, timeout_s=600)
        for world in (1, 2, 4):
            if refresh is not None:
                predictor = refresh(name)
            idx = [i for i, p in enumerate(plans) if p.world_size == world]
            specs = [DeploySpec(plan=plans[i], graph=graph, model=name, overrides=MODELS[name]) for i in idx]
            results = deploy_stage_plans(specs, config=cfg, job_dir=work / f"b_{name}_{world}")
            for i, res in zip(idx, results):
                got = predictor(plans[i])
                kw = PLANS[i]
                label = plan_label(kw)
                rows.append({"model": name, "plan": label, "kind": plan_kind(kw), "world": world,
                             "measured_s": res.step_time,
                             "measured_no_opt_s": res.step_time - res.optimizer_time, **got,
                             "source": predictor.linear_costs.source[0]})
                print(f"(b) {name} {label}: measured {res.step_time * 1e3:.2f} ms, predicted "
                      f"{got['predicted_s'] * 1e3:.2f} ms (linear {got['linear_s'] * 1e3:.2f} ms)")
    meas = np.array([r["measured_s"] for r in rows])

    def col(key: str, sel=None) -> np.ndarray:
        return np.array([r[key] for r in rows if sel is None or r["model"] == sel])

    stats = {"with_optimizer": fidelity_stats(col("predicted_s"), meas),
             "before_wrapper_model": fidelity_stats(col("predicted_old_s"), meas),
             "linear_with_optimizer": fidelity_stats(col("linear_s"), meas),
             "simulator_only_vs_no_optimizer": fidelity_stats(col("simulated_s"), col("measured_no_opt_s"))}
    per_model = {m: fidelity_stats(col("predicted_s", m), col("measured_s", m)) for m in graphs}
    per_model_linear = {m: fidelity_stats(col("linear_s", m), col("measured_s", m)) for m in graphs}
    kinds = sorted({r["kind"] for r in rows})
    per_kind = {k: fidelity_stats(np.array([r["predicted_s"] for r in rows if r["kind"] == k]),
                                  np.array([r["measured_s"] for r in rows if r["kind"] == k])) for k in kinds}
    two_cores = [r for r in rows if r["world"] <= 2]
    stats["up_to_2_procs"] = fidelity_stats(np.array([r["predicted_s"] for r in two_cores]),
                                            np.array([r["measured_s"] for r in two_cores]))
    return {"rows": rows, "stats": stats, "per_model": per_model, "per_model_linear": per_model_linear,
            "per_kind": per_kind}


def write_report(out: Path, a_rows: list[dict], b: dict, meta: dict) -> None:
    lines = ["# Executor benchmark", "", f"Machine: {meta['machine']}; torch {torch.__version__}; one torch thread "
             "per process; gloo on CPU. Not run on a GPU.", "",
             "## (a) our deploy vs hand-written runs (pipelining of the same split; eager DDP / FSDP2)", "",
             "Both in the same two processes, steps interleaved (ours, hand, hand, ours, ...), so both see the "
             "same load; step time = slowest rank. `deploy` = the median step of a full `deploy_stage_plans` run.",
             "", "| model | plan | hand-written | deploy (ms) | ours (ms) | hand-written (ms) | ratio of medians | "
             "median of per-step ratios | best / best |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['plan']} | {r['baseline']} | {r['deploy_s'] * 1e3:.2f} | {r['ours_s'] * 1e3:.2f} | "
              f"{r['hand_s'] * 1e3:.2f} | {r['ratio']:.3f} | {r['ratio_paired_steps']:.3f} | "
              f"{r['ratio_best_step']:.3f} |" for r in a_rows]
    if b["rows"]:
        lines += ["", "## (b) measured vs predicted (simulate_pipeline, measured CPU profiles)", "",
                  "Predicted: costs profiled (thread CPU clock) at the plan's per-replica micro-batch + that "
                  "profile's step overhead + Adam share. Linear: full-batch costs scaled by 1/(m p), + Adam share.", "",
                  "Model: the same + the wrappers' measured per-pass costs (DDP / FSDP2), Adam over DTensor shards and "
                  "the oversubscription of the cores (`profiling.dist_overhead`).", "",
                  "| model | plan | procs | micro-batch | measured (ms) | model (ms) | wrappers (ms) | Adam (ms) | "
                  "predicted +opt, before (ms) | linear +opt (ms) | sim only (ms) | measured - Adam (ms) | "
                  "measured Adam (ms) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['plan']} | {r['world']} | {r['micro_batch']} | {r['measured_s'] * 1e3:.2f} | "
                  f"{r['predicted_s'] * 1e3:.2f} | {r['wrapper_s'] * 1e3:.2f} | {r['optimizer_s'] * 1e3:.2f} | "
                  f"{r['predicted_old_s'] * 1e3:.2f} | {r['linear_s'] * 1e3:.2f} | {r['simulated_s'] * 1e3:.2f} | "
                  f"{r['measured_no_opt_s'] * 1e3:.2f} | {(r['measured_s'] - r['measured_no_opt_s']) * 1e3:.2f} |"
                  for r in b["rows"]]
        s = b["stats"]
        lines += ["", f"All {s['with_optimizer']['n']} plans: MAPE {s['with_optimizer']['mape']:.1f}%, Spearman "
                  f"{s['with_optimizer']['spearman']:.3f} (the model vs measured step); before the wrapper model "
                  f"(simulated + plain Adam share): MAPE {s['before_wrapper_model']['mape']:.1f}%, Spearman "
                  f"{s['before_wrapper_model']['spearman']:.3f}; linear model: MAPE "
                  f"{s['linear_with_optimizer']['mape']:.1f}%, Spearman {s['linear_with_optimizer']['spearman']:.3f}; "
                  "simulator alone vs measured step minus Adam: MAPE "
                  f"{s['simulator_only_vs_no_optimizer']['mape']:.1f}%, "
                  f"Spearman {s['simulator_only_vs_no_optimizer']['spearman']:.3f}. Plans on at most 2 processes "
                  f"(one core each): MAPE {s['up_to_2_procs']['mape']:.1f}%, Spearman "
                  f"{s['up_to_2_procs']['spearman']:.3f} (n={s['up_to_2_procs']['n']})."]
        lines += [f"{k}: MAPE {v['mape']:.1f}%, Spearman {v['spearman']:.3f} (n={v['n']})"
                  for k, v in b["per_kind"].items()]
        lines += [f"{m}: MAPE {v['mape']:.1f}%, Spearman {v['spearman']:.3f} (n={v['n']}); linear: MAPE "
                  f"{b['per_model_linear'][m]['mape']:.1f}%, Spearman {b['per_model_linear'][m]['spearman']:.3f}"
                  for m, v in b["per_model"].items()]
    atomic_write_text(out / "bench_executor.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "bench_executor.json", json.dumps({"meta": meta, "overhead": a_rows, "fidelity": b},
                                                              indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/bench_executor")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="(a) runs repeats x steps interleaved steps per variant")
    ap.add_argument("--quick", action="store_true", help="fewer steps (smoke run)")
    ap.add_argument("--fresh-profiles", action="store_true", help="(b) profile each model again right before each "
                    "of its deployment jobs (one per world size) and predict those plans from that profile")
    ap.add_argument("--parts", default="ab", choices=("ab", "a", "b"), help="which parts to run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    steps = 5 if args.quick else args.steps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp:
        work = Path(tmp)
        db, graphs, predictors = ProfileDB(work / "profile.json"), {}, {}
        topology = cpu_topology(4)
        repeats = 5 if args.quick else 10  # profile passes and link-benchmark repeats
        sizes_of = {}
        for name in MODELS:
            full = MODELS[name]["batch_size"]
            sizes_of[name] = sizes = {full} | {full // (kw["m"] * kw["dp"]) for kw in PLANS}
            by_batch = profile_model(name, sizes, db=db, repeats=repeats)
            graphs[name] = by_batch[full]
            predictors[name] = by_batch
        links = local_link_benchmarks(["cpu"], repeats=repeats)

        def put_links(into: ProfileDB) -> ProfileDB:
            for fit in links:
                into.put_link(fit.src, fit.dst, fit.backend, fit.sizes, fit.times, fit.latency, fit.bandwidth)
            return into

        put_links(db).save()
        overheads = None
        if "b" in args.parts:
            print("measuring DDP / FSDP2 wrapper costs and gloo collectives (2 processes)")
            overheads = fit_dist_overheads(measure_dist_overheads("gloo", repeats=5 if args.quick else 9))
            print(f"  DDP per pass {overheads.ddp_pass}, FSDP per pass {overheads.fsdp_pass}, "
                  f"FSDP Adam {overheads.fsdp_adam} (a, b per tensor; seconds), pipeline stage {overheads.pp_stage} "
                  "(per step, per micro-batch, per boundary byte per micro-batch)")
        per_node = {name: tensors_per_param_node(zoo.build(name, **MODELS[name])[0], graphs[name]) for name in MODELS}

        def predictor(name: str, by_batch: dict, pdb: ProfileDB) -> "Predictor":
            return Predictor(by_batch, MODELS[name]["batch_size"], topology, pdb, overheads=overheads,
                             tensors_per_node=per_node[name])

        predictors = {name: predictor(name, by_batch, db) for name, by_batch in predictors.items()}
        fresh = itertools.count(1)

        def refresh(name: str) -> "Predictor":
            """A new profile of ``name`` at every size its plans deploy (a new database, the same link fits)."""
            new_db = put_links(ProfileDB(work / f"profile_{next(fresh)}.json"))
            return predictor(name, profile_model(name, sizes_of[name], db=new_db, repeats=repeats), new_db)
        a_rows = bench_overhead(graphs, steps=steps, repeats=args.repeats, work=work) if "a" in args.parts else []
        b = bench_fidelity(graphs, steps=steps, work=work, predictors=predictors,
                           refresh=refresh if args.fresh_profiles else None) if "b" in args.parts else \
            {"rows": [], "stats": {}, "per_model": {}, "per_model_linear": {}}
    meta = {"machine": f"{os.cpu_count()} CPU cores", "steps": steps, "models": MODELS, "profile_clock": "thread",
            "fresh_profiles": bool(args.fresh_profiles),
            "dist_overheads": None if overheads is None else overheads.to_dict()}
    write_report(out, a_rows, b, meta)
    print((out / "bench_executor.md").read_text())


if __name__ == "__main__":
    main()
