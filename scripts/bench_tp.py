"""Benchmark of tensor parallelism: planners with and without TP, deploy vs hand-written DTensor TP,
simulated vs measured TP step time on gloo.

    python scripts/bench_tp.py --out outputs/bench_tp [--parts abc] [--budget 4000] [--steps 10]

(a) Planners (simulated, calibrated GPU model): every registered pipeline planner on each case; for each the
    plan, step time, feasibility and TP degree; per case the best plan without TP (over all planners on the graph
    with its TP annotation removed: the DP x PP space) and with TP, and the exact search's optimum in both spaces.
    Cases: ``gpt2_hf`` at GPT-2 large size (36 layers, d_model 1280, 20 heads, seq 1024, batch 16, vocabulary
    50304 = 393 x 128 as nanoGPT pads it, kept so the figures compare with earlier runs; the plans' own padding,
    ``make_vocab_size_divisible_by``, now pads 50257 itself) on ``8x_h100_dgx`` and ``2x4_v100_ib``; a GPT whose
    training state does not fit one device (``gpt`` 12 layers, d_model 1024 on ``2x_small_gpu``: 2 GiB per device), where TP and FSDP are compared; a
    mid-size GPT (8 layers, d_model 1024, seq 256, batch 16) on ``2x4_v100_ib``.
(b) Deploy vs hand-written: our executor's step (``PartRunner``: export split, ``_tp.apply_tp`` on the stage
    program, mesh, Adam) against a hand-written TP step of the same zoo model on the same TP mesh written as
    Megatron-LM runs it -- the fused QKV's rows interleaved so that each rank's shard holds its heads of q, k and v,
    the attention on those local heads, column / row pairs on local shards (``megatron_attention`` +
    ``parallelize_module``), tied embedding / LM head re-tied, Adam; for the TP x PP plan the eager model cut by hand
    at the same block into two stage modules, each parallelized over its TP group of a (pp, tp) mesh,
    ``PipelineStage`` + GPipe over ``pp``, the loss under ``loss_parallel``, the tied embedding / head gradients
    summed across the stages (``HandWrittenTPxPP``). Both in the same processes, steps interleaved (the 2-core
    machine is shared), slowest rank per step; ratio of medians (target <= 1.05).
(c) Fidelity on gloo: measured step time of 11 TP plans (TP 2 / 4, TP x DP, TP x PP GPipe and 1F1B, one with full
    recomputation), DP / PP plans and single-process plans with selective / full recomputation of the same model,
    deployed on this machine's CPU processes, against ``simulate_pipeline`` on ``2x_cpu`` with per-op CPU profiles of the
    model at the plan's micro-batch (``placement_rl.profiling``: thread CPU clock), the profile's per-pass overhead
    and Adam share (split parameters divided by the TP degree), as ``bench_executor.py`` does ("predicted"); and
    "with the wrapper model": the same plus, measured in this run, the TP all-reduce as a TP step issues it (between
    compute, on the plans' process count, right before they run) as the links' latency / bandwidth, DTensor's cost
    per pass and per Adam step of each stage program on a one-rank mesh (``executor.tp_probe``), the DDP / FSDP /
    pipeline wrapper costs (``profiling.dist_overhead``) and the compute slowed by processes / cores.

Writes ``bench_tp.json`` and ``bench_tp.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from placement_rl import baselines
from placement_rl.cost import resolve_costs, simulate_pipeline
from placement_rl.cost.pipeline import with_step_overhead
from placement_rl.errors import PlacementRLError
from placement_rl.evaluate import describe_plan
from placement_rl.executor._launch import free_port
from placement_rl.executor.ab import run_ab
from placement_rl.executor.distributed import DeployConfig, DeploySpec, deploy_stage_plans
from placement_rl.executor.tp_probe import measure_tp_dispatch
from placement_rl.graph import tp as tpmod
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.graph.io import atomic_write_text
from placement_rl.plans import StagePlan
from placement_rl.profiling import ProfileDB, measured_costs, predict_step_time, profile_graph
from placement_rl.profiling.deploy_predict import (collective_links, core_sharing, predict_deploy_step,
                                                   tensors_per_param_node, with_core_sharing, with_links,
                                                   with_pipeline_overhead, with_tp_dispatch)
from placement_rl.profiling.dist_overhead import fit_dist_overheads, measure_dist_overheads, measure_tp_collectives
from placement_rl.profiling.fidelity import fidelity_stats
from placement_rl.profiling.run import select_devices
from placement_rl.topology import DeviceTopology, conf_dir, load_topology

GPT2_LARGE = dict(batch_size=16, seq_len=1024, vocab_size=50304, d_model=1280, n_layers=36, n_heads=20)
MID = dict(batch_size=16, seq_len=256, vocab_size=16384, d_model=1024, n_layers=8, n_heads=16)
NOT_FIT = dict(batch_size=8, seq_len=128, vocab_size=16384, d_model=1024, n_layers=12, n_heads=16)
CASES = [("gpt2-large/8xH100", "gpt2_hf", GPT2_LARGE, "8x_h100_dgx"),
         ("gpt2-large/2x4V100-IB", "gpt2_hf", GPT2_LARGE, "2x4_v100_ib"),
         ("gpt-12L-d1024/2xsmallGPU (state > 1 GPU)", "gpt", NOT_FIT, "2x_small_gpu"),
         ("gpt-8L-d1024/2x4V100-IB", "gpt", MID, "2x4_v100_ib")]
TP_PLANNERS = ("tp", "megatron", "exact")
SMALL = dict(batch_size=16, seq_len=64, vocab_size=512, d_model=128, n_layers=4, n_heads=4, dropout=0.0)


# ------------------------------------------------------------------------------ (a) planners
def bench_planners(budget: int) -> list[dict]:
    rows = []
    graphs: dict[str, object] = {}
    for case, model, ov, topo_name in CASES:
        key = f"{model}{sorted(ov.items())}"
        if key not in graphs:
            t0 = time.perf_counter()
            graphs[key] = capture_zoo(model, **ov)
            print(f"captured {model} ({graphs[key].num_nodes} nodes) in {time.perf_counter() - t0:.1f} s")
        graph = graphs[key]
        topo = load_topology(topo_name)
        costs = resolve_costs(graph, topo)
        plain = tpmod.without_tp(graph)
        for space, g in (("with TP", graph), ("without TP", plain)):
            for name in baselines.pipeline_names():
                if space == "without TP" and name not in TP_PLANNERS:
                    continue  # the DP x PP planners never split a layer: their one run is the no-TP figure
                t0 = time.perf_counter()
                try:
                    plan = baselines.get_pipeline(name)(g, costs, topo, budget=budget, seed=0)
                except PlacementRLError as exc:
                    rows.append({"case": case, "space": space, "planner": name, "note": str(exc)[:160]})
                    print(f"(a) {case} {space} {name}: {str(exc)[:120]}")
                    continue
                res = simulate_pipeline(g, costs, topo, plan)
                rows.append({"case": case, "space": space, "planner": name, "step_ms": res.step_time * 1e3,
                             "feasible": bool(res.feasible), "plan": describe_plan(plan), "tp": int(max(plan.tp)),
                             "pp": plan.num_stages, "dp": int(plan.dp_degrees[0]), "m": plan.num_microbatches,
                             "sharding": plan.sharding, "search_s": time.perf_counter() - t0,
                             "sim_calls": int(plan.meta.get("sim_calls", 0)),
                             "exhaustive": plan.meta.get("exhaustive"),
                             "peak_gib": float(res.peak_memory.max()) / 2**30})
                r = rows[-1]
                print(f"(a) {case} {space} {name}: {r['step_ms']:.2f} ms {'' if r['feasible'] else 'DOES NOT FIT '}"
                      f"({r['plan']}) {r['search_s']:.1f} s")
    return rows


# ------------------------------------------------------------------------------ (b) hand-written DTensor TP
def megatron_plan(blocks: range, *, embedding: bool = False, head: bool = False) -> dict:
    """``parallelize_module`` styles of the zoo GPT as Megatron-LM runs it: column / row pairs of the given blocks'
    attention and MLP on local shards (the column's output stays a plain local tensor, the row takes it as
    ``Shard(-1)``; see :func:`megatron_attention` for the attention's local heads), the vocabulary-parallel
    embedding and LM head when asked (the LM head's output a vocab-sharded DTensor for the loss)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"wte": RowwiseParallel(input_layouts=Replicate())} if embedding else {}
    if head:
        plan["lm_head"] = ColwiseParallel(use_local_output=False)
    for i in blocks:
        plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(), f"blocks.{i}.attn.proj": RowwiseParallel(
            input_layouts=Shard(-1)), f"blocks.{i}.ffn.fc1": ColwiseParallel(),
            f"blocks.{i}.ffn.fc2": RowwiseParallel(input_layouts=Shard(-1))})
    return plan


def _local_attention(self, x: torch.Tensor) -> torch.Tensor:
    """The zoo GPT's attention on one TP rank: its ``n_heads / tp`` heads of the interleaved fused QKV shard."""
    b, t, c = x.shape
    tp, hd = self.tp_degree, c // self.n_heads
    q, k, v = (z.view(b, t, self.n_heads // tp, hd).transpose(1, 2) for z in self.qkv(x).split(c // tp, 2))
    att = (q @ k.transpose(-2, -1)) * hd ** -0.5
    att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
    y = self.attn_drop(torch.softmax(att, -1)) @ v
    return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c // tp)))


def megatron_attention(blocks, tp: int) -> None:
    """Megatron's interleaved QKV, by hand: each block's fused QKV rows reordered so that rank r's contiguous shard
    holds its heads of q, k and v, and the attention run on those local heads (call before ``parallelize_module``)."""
    import types

    for block in blocks:
        attn = block.attn
        c = attn.qkv.out_features // 3
        perm = torch.cat([torch.arange(j * c + r * (c // tp), j * c + (r + 1) * (c // tp))
                          for r in range(tp) for j in range(3)])
        with torch.no_grad():
            attn.qkv.weight.data = attn.qkv.weight.data[perm].clone()
            attn.qkv.bias.data = attn.qkv.bias.data[perm].clone()
        attn.tp_degree = tp
        attn.forward = types.MethodType(_local_attention, attn)


class HandWrittenTP:
    """The eager zoo GPT on a 1-D TP mesh as Megatron runs it: interleaved fused QKV and local heads
    (``megatron_attention``), ``parallelize_module`` with the Megatron styles on local shards, tied head re-tied,
    the vocab-parallel cross-entropy (``loss_parallel``, as the executor), Adam."""

    def __init__(self, part_dir: Path, rank: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        part = json.loads((part_dir / "part.json").read_text())
        model = part["model"]
        module, inputs = zoo.build(model["zoo"], **{**model["overrides"], "batch_size": part["batch_size"]})
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        megatron_attention(module.blocks, dist.get_world_size())
        parallelize_module(module, mesh, megatron_plan(range(len(module.blocks)), embedding=True, head=True))
        module.lm_head.weight = module.wte.weight  # tie again (both Shard(0))
        self.model = module.train()
        self.m = int(part["dims"]["num_microbatches"])
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.batch = inputs

    def step(self) -> float:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.experimental import implicit_replication
        from torch.distributed.tensor.parallel import loss_parallel

        self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        size = self.batch[0].shape[0] // self.m
        with implicit_replication(), loss_parallel():
            for i in range(self.m):
                loss = self.model(*(t[i * size:(i + 1) * size] for t in self.batch))
                loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
                (loss / self.m).backward()
        for p in self.model.parameters():  # the embedding's gradient comes back partial: give it its shards
            if hasattr(p, "placements") and p.grad is not None and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        self.opt.step()
        return time.perf_counter() - t0


class _Stage0(torch.nn.Module):
    """Embeddings and the first blocks of the eager zoo GPT; passes the targets on to the last stage."""

    def __init__(self, lm, blocks) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop, self.blocks = lm.wte, lm.wpe, lm.drop, torch.nn.ModuleList(blocks)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for block in self.blocks:
            x, _ = block(x)
        return x, targets


class _Stage1(torch.nn.Module):
    """The last blocks, final norm, LM head (its own copy of the tied weight) and the vocabulary-parallel loss."""

    def __init__(self, lm, blocks) -> None:
        super().__init__()
        self.blocks, self.ln_f = torch.nn.ModuleList(blocks), lm.ln_f
        self.lm_head = torch.nn.Linear(lm.lm_head.in_features, lm.lm_head.out_features, bias=False)
        self.lm_head.weight = torch.nn.Parameter(lm.lm_head.weight.detach().clone())

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F
        from torch.distributed.tensor import DTensor

        for block in self.blocks:
            x, _ = block(x)
        loss = F.cross_entropy(self.lm_head(self.ln_f(x)).flatten(0, 1), targets.flatten())
        return loss.full_tensor() if isinstance(loss, DTensor) else loss


class HandWrittenTPxPP:
    """The eager zoo GPT cut into two stage modules by hand at the same block as the plan, each parallelized over
    its TP group of a (pp, tp) mesh with the same Megatron styles, ``PipelineStage`` + GPipe over ``pp``, the
    loss under ``loss_parallel``, the tied embedding / LM head gradients summed across the two stages, Adam."""

    def __init__(self, part_dir: Path, rank: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
        from torch.distributed.tensor.parallel import parallelize_module

        part = json.loads((part_dir / "part.json").read_text())
        dims = part["dims"]
        model = part["model"]
        lm, inputs = zoo.build(model["zoo"], **{**model["overrides"], "batch_size": part["batch_size"]})
        tp = int(dims["tp"])
        mesh = init_device_mesh("cpu", (2, tp), mesh_dim_names=("pp", "tp"))
        self.stage_index = rank // tp
        half = len(lm.blocks) // 2  # each stage module numbers its own blocks from 0
        first = self.stage_index == 0
        module = _Stage0(lm, lm.blocks[:half]) if first else _Stage1(lm, lm.blocks[half:])
        self.tied = module.wte if first else module.lm_head
        megatron_attention(module.blocks, tp)
        parallelize_module(module, mesh["tp"], megatron_plan(range(len(module.blocks)), embedding=first,
                                                             head=not first))
        self.m = int(dims["num_microbatches"])
        b = inputs[0].shape[0] // self.m
        idx, targets = (t[:b] for t in inputs)
        x = torch.zeros(b, idx.shape[1], lm.ln_f.normalized_shape[0])
        if self.stage_index == 0:
            ins, outs = (idx, targets), (x, targets)
            stage = PipelineStage(module, 0, 2, torch.device("cpu"), input_args=ins, output_args=outs,
                                  output_grads=(torch.zeros_like(x), None), group=mesh.get_group("pp"))
        else:
            ins = (x.clone().requires_grad_(True), targets)
            stage = PipelineStage(module, 1, 2, torch.device("cpu"), input_args=ins, output_args=torch.zeros(()),
                                  input_grads=(torch.zeros_like(x), None), group=mesh.get_group("pp"))
        self.schedule = ScheduleGPipe(stage, n_microbatches=self.m, loss_fn=lambda out, target: out)
        self.opt = torch.optim.Adam(module.parameters(), lr=1e-3)
        self.module, self.batch, self.pp_group = module, inputs, mesh.get_group("pp")

    def step(self) -> float:
        from torch.distributed.tensor.experimental import implicit_replication
        from torch.distributed.tensor.parallel import loss_parallel

        self.opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        with implicit_replication(), loss_parallel():
            if self.stage_index == 0:
                self.schedule.step(*self.batch, return_outputs=False)
            else:
                self.schedule.step(target=torch.zeros(self.m), losses=[], return_outputs=False)
        for p in self.module.parameters():  # the embedding's gradient comes back partial: give it its shards
            if hasattr(p, "placements") and p.grad is not None and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        g = self.tied.weight.grad  # tied embedding / head: the two stages' gradients summed
        dist.all_reduce(g.to_local() if hasattr(g, "to_local") else g, group=self.pp_group)
        self.opt.step()
        return time.perf_counter() - t0


def _hand(part_dir: Path, rank: int, stages: int):
    """The hand-written reference of a part (``placement_rl.executor.ab.run_ab``): TP, or TP x PP."""
    return HandWrittenTP(part_dir, rank) if stages == 1 else HandWrittenTPxPP(part_dir, rank)


def bench_overhead(*, steps: int, work: Path) -> list[dict]:
    graph = capture_zoo("gpt", **SMALL)
    rows = []
    for label, plan in (("tp2 m=1", StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,))),
                        ("tp2 m=2", StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,),
                                              num_microbatches=2)),
                        ("tp2 x pp2 gpipe m=2", fid_plan(graph, 2, 1, 2, 2))):
        job = work / f"a_{label.replace(' ', '_')}"
        deployed = deploy_stage_plans([DeploySpec(plan=plan, graph=graph, model="gpt", overrides=SMALL)],
                                      config=DeployConfig(steps=steps, warmup=2, timeout_s=900), job_dir=job)[0]
        ours, hand = run_ab(job / "part0", steps=steps, warmup=2, world=plan.world_size, make_hand=_hand)
        rows.append({"model": "gpt", "overrides": SMALL, "plan": label, "deploy_ms": deployed.step_time * 1e3,
                     "ours_ms": float(np.median(ours)) * 1e3, "hand_ms": float(np.median(hand)) * 1e3,
                     "ratio": float(np.median(ours) / np.median(hand)),
                     "ratio_paired_steps": float(np.median(ours / hand)), "steps": int(ours.size)})
        r = rows[-1]
        print(f"(b) {label}: deploy {r['deploy_ms']:.2f} ms; A/B ours {r['ours_ms']:.2f} / hand {r['hand_ms']:.2f} ms "
              f"= {r['ratio']:.3f} (paired {r['ratio_paired_steps']:.3f})")
    return rows


# ------------------------------------------------------------------------------ (c) fidelity on gloo
def cpu_topology(count: int) -> DeviceTopology:
    import yaml

    data = yaml.safe_load((conf_dir() / "topology" / "2x_cpu.yaml").read_text())
    data["devices"][0]["count"] = count
    data["name"] = f"{count}x_cpu"
    return DeviceTopology.from_dict(data)


FID_PLANS = [("single m=1", 1, 1, 1, 1), ("dp2 m=1", 1, 2, 1, 1), ("pp2 gpipe m=2", 2, 1, 1, 2),
             ("tp2 m=1", 1, 1, 2, 1), ("tp2 m=2", 1, 1, 2, 2), ("tp2 m=4", 1, 1, 2, 4),
             ("tp4 m=1", 1, 1, 4, 1), ("tp4 m=2", 1, 1, 4, 2),
             ("tp2 x dp2 m=1", 1, 2, 2, 1), ("tp2 x dp2 m=2", 1, 2, 2, 2),
             ("tp2 x pp2 gpipe m=2", 2, 1, 2, 2), ("tp2 x pp2 gpipe m=4", 2, 1, 2, 4),
             ("tp2 x pp2 1f1b m=4", 2, 1, 2, 4, "1f1b"),
             ("single m=1 selective recompute", 1, 1, 1, 1, "gpipe", "selective"),
             ("single m=1 full recompute", 1, 1, 1, 1, "gpipe", "full"),
             ("tp2 m=2 full recompute", 1, 1, 2, 2, "gpipe", "full")]


def fid_plan(graph, stages: int, dp: int, t: int, m: int, schedule: str = "gpipe",
             recompute: str = "none") -> StagePlan:
    n = graph.num_nodes
    if stages == 1:
        son = np.zeros(n, dtype=np.int64)
    else:  # cut at the residual stream half way (outside every TP region)
        adds = [i for i in graph.topo_order if graph.op_types[i] == "add" and graph.module_paths[i].count(".") == 1]
        cut = int(np.searchsorted(graph.topo_order, adds[len(adds) // 2 - 1])) + 1
        son = np.zeros(n, dtype=np.int64)
        son[graph.topo_order[cut:]] = 1
    width = dp * t
    groups = tuple(tuple(range(k * width, (k + 1) * width)) for k in range(stages))
    return StagePlan(son, groups, num_microbatches=m, tp=(t,) * stages, schedule=schedule,
                     batch_size=SMALL["batch_size"], recompute=(recompute,) * stages)


def bench_fidelity(*, steps: int, work: Path, repeats: int) -> dict:
    graph = capture_zoo("gpt", **SMALL)
    plans = [(label, fid_plan(graph, *spec)) for label, *spec in FID_PLANS]
    db = ProfileDB()
    cpu = select_devices(["cpu"])[0]
    sizes = sorted({SMALL["batch_size"] // (p.num_microbatches * p.dp_degrees[0]) for _, p in plans}, reverse=True)
    costs_at = {}
    for b in sizes:
        ov = {**SMALL, "batch_size": b}
        module, inputs = zoo.build("gpt", **ov)
        g = capture_zoo("gpt", **ov)
        profile_graph(module, inputs, g, cpu, db=db, warmup=3, repeats=repeats, progress=False, clock="thread")
        costs_at[b] = (g, module)
    print("(c) measuring DDP / FSDP2 / TP wrapper costs on 2 gloo processes (profiling.dist_overhead)")
    overheads = fit_dist_overheads(measure_dist_overheads("gloo"))
    link_runs: list[dict] = []  # gloo's all-reduce as a TP step issues it, as link latency / bandwidth, per group
    per_node = tensors_per_param_node(zoo.build("gpt", **SMALL)[0], graph)
    split = tpmod.annotation(graph).frac_params > 0
    rows = []
    for world in sorted({p.world_size for _, p in plans}):
        idx = [i for i, (_, p) in enumerate(plans) if p.world_size == world]
        topo = cpu_topology(max(world, 2))
        # the TP all-reduce measured right before these plans run, on as many processes as they use (every TP group
        # at once), under the host's load of that moment; links per group size (DP-only plans: groups of 2)
        degrees = sorted({int(plans[i][1].tp[0]) for i in idx} - {1} | {2}) if world > 1 else []
        curves = measure_tp_collectives("gloo", world=world, degrees=degrees, repeats=repeats + 4) if degrees else {}
        links_of = {t: collective_links(c, ranks=t) for t, c in curves.items()}
        for t, lk in links_of.items():
            print(f"(c) {world} processes, groups of {t}: links from the TP all-reduce measured now: latency "
                  f"{lk[0] * 1e6:.1f} us, bandwidth {lk[1] / 1e9:.2f} GB/s (load {os.getloadavg()[0]:.1f})")
            link_runs.append({"world": world, "ranks": t, "latency_s": lk[0], "bandwidth_Bps": lk[1],
                              "tp_all_reduce": [list(curves[t][0]), list(curves[t][1])], "load": os.getloadavg()[0]})
        results = deploy_stage_plans([DeploySpec(plan=plans[i][1], graph=graph, model="gpt", overrides=SMALL)
                                      for i in idx], config=DeployConfig(steps=steps, warmup=2, timeout_s=900),
                                     job_dir=work / f"c_{world}")
        for k, (i, res) in enumerate(zip(idx, results)):
            label, plan = plans[i]
            probe = (measure_tp_dispatch(work / f"c_{world}" / f"part{k}", repeats=repeats * 2)
                     if plan.uses_tp else None)  # DTensor's cost on this plan's stage programs, one-rank mesh
            b = SMALL["batch_size"] // (plan.num_microbatches * plan.dp_degrees[0])
            g, _ = costs_at[b]
            costs = measured_costs(g, topo, db, backend="gloo")
            overhead = predict_step_time(g, topo.subset([0, 1]), np.zeros(g.num_nodes, dtype=np.int64), db,
                                         optimizer=False).step_overhead
            costs = with_step_overhead(costs, overhead)
            sim = simulate_pipeline(graph, costs, topo, plan, cost_batch_size=b)
            adam = (db.optimizer_time(g, db.device_names[0]) or (0.0,))[0]
            per_rank = tpmod.shard_graph(graph, int(plan.tp[0])).param_bytes
            share = max(float(per_rank[plan.stage_of_node == s].sum()) for s in range(plan.num_stages))
            if plan.sharding == "fsdp":
                share /= plan.dp_degrees[0]
            opt = adam * share / float(graph.param_bytes.sum())
            staged = costs
            if links_of:  # collectives priced from the measurement on this many processes (links of its group size)
                staged = with_links(staged, *links_of[int(plan.tp[0]) if plan.uses_tp else 2])
            staged = with_pipeline_overhead(staged, plan, graph, overheads)  # the pipeline schedule's cost
            if probe is not None:
                staged = with_tp_dispatch(staged, plan, graph, [p["pass_s"] for p in probe])
            staged = with_core_sharing(staged, core_sharing(plan))  # compute at cores / processes of a core
            sim_model = simulate_pipeline(graph, staged, topo, plan, cost_batch_size=b).step_time
            model = predict_deploy_step(sim_model, plan=plan, graph=graph, adam_seconds=adam, overheads=overheads,
                                        tensors_per_node=per_node, tp_split=split, scale_simulated=False,
                                        tp_adam_seconds=None if probe is None else [p["adam_s"] for p in probe])
            rows.append({"plan": label, "world": world, "micro_batch": b, "measured_ms": res.step_time * 1e3,
                         "predicted_ms": (sim.step_time + opt) * 1e3, "simulated_ms": sim.step_time * 1e3,
                         "adam_ms": opt * 1e3, "tp": int(plan.tp[0]), "model_ms": model["predicted_s"] * 1e3,
                         "recompute": plan.recompute[0], "model_simulated_ms": sim_model * 1e3,
                         "wrapper_ms": model["wrapper_s"] * 1e3, "model_optimizer_ms": model["optimizer_s"] * 1e3,
                         "oversubscription": model["oversubscription"],
                         "tp_dispatch_ms": [p["pass_s"] * 1e3 for p in probe] if probe else None,
                         "tp_adam_dispatch_ms": [p["adam_s"] * 1e3 for p in probe] if probe else None,
                         "load": os.getloadavg()[0]})
            r = rows[-1]
            print(f"(c) {label}: measured {r['measured_ms']:.2f} ms, predicted {r['predicted_ms']:.2f} ms, with the "
                  f"wrapper model {r['model_ms']:.2f} ms")
    meas = np.array([r["measured_ms"] for r in rows])
    pred = np.array([r["predicted_ms"] for r in rows])
    model = np.array([r["model_ms"] for r in rows])
    tp_rows = [i for i, r in enumerate(rows) if r["tp"] > 1]
    rc_rows = [i for i, r in enumerate(rows) if r["recompute"] != "none"]
    return {"rows": rows, "stats": fidelity_stats(pred, meas),
            "model_recompute_stats": fidelity_stats(model[rc_rows], meas[rc_rows]) if len(rc_rows) > 1 else None,
            "tp_stats": fidelity_stats(pred[tp_rows], meas[tp_rows]) if len(tp_rows) > 1 else None,
            "model_stats": fidelity_stats(model, meas),
            "model_tp_stats": fidelity_stats(model[tp_rows], meas[tp_rows]) if len(tp_rows) > 1 else None,
            "overheads": overheads.to_dict(), "links": link_runs}


def dtensor_overhead(steps: int) -> dict:
    """Step time of the eager model vs the same model parallelized with the TP styles on a 1-rank mesh (DTensor
    dispatch, no communication): the framework cost per step that the per-op profiles do not see."""
    import tempfile as _tf

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.distributed.tensor.parallel import parallelize_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{_tf.mktemp()}")
    try:
        out = {}
        for label in ("eager", "dtensor_tp1"):
            module, inputs = zoo.build("gpt", **SMALL)
            if label != "eager":
                parallelize_module(module, init_device_mesh("cpu", (1,)),
                                   megatron_plan(range(len(module.blocks)), embedding=True, head=True))
                module.lm_head.weight = module.wte.weight
            opt = torch.optim.Adam(module.parameters(), lr=1e-3)
            times = []
            for step in range(steps + 2):
                opt.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                with implicit_replication():
                    loss = module(*inputs)
                    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
                    loss.backward()
                opt.step()
                if step >= 2:
                    times.append(time.perf_counter() - t0)
            out[label + "_ms"] = float(np.median(times)) * 1e3
        out["overhead_ms"] = out["dtensor_tp1_ms"] - out["eager_ms"]
        print(f"(c) DTensor dispatch, 1 process: eager {out['eager_ms']:.2f} ms, TP styles on a 1-rank mesh "
              f"{out['dtensor_tp1_ms']:.2f} ms")
        return out
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ report
def write_report(out: Path, data: dict) -> None:
    lines = ["# Tensor parallelism benchmark", "", f"Machine: {data['machine']}; torch {torch.__version__}.", ""]
    if data.get("planners"):
        lines += ["## (a) planners (simulated, calibrated GPU model, fp32)", "",
                  "| case | space | planner | step (ms) | fits | plan | search s | sim calls |", "|---|---|---|---|---|---|---|---|"]
        for r in data["planners"]:
            if "step_ms" in r:
                lines.append(f"| {r['case']} | {r['space']} | {r['planner']} | {r['step_ms']:.2f} | "
                             f"{'yes' if r['feasible'] else 'no'} | {r['plan']} | {r['search_s']:.1f} | {r['sim_calls']} |")
            else:
                lines.append(f"| {r['case']} | {r['space']} | {r['planner']} | - | - | {r['note']} | - | - |")
        lines += [""]
    if data.get("overhead"):
        lines += ["## (b) deploy vs hand-written DTensor TP (same model, same 1-D TP mesh, interleaved steps)", "",
                  "| plan | deploy (ms) | ours (ms) | hand-written (ms) | ratio of medians | median of per-step ratios |",
                  "|---|---|---|---|---|---|"]
        for r in data["overhead"]:
            lines.append(f"| {r['plan']} | {r['deploy_ms']:.2f} | {r['ours_ms']:.2f} | {r['hand_ms']:.2f} | "
                         f"{r['ratio']:.3f} | {r['ratio_paired_steps']:.3f} |")
        lines += [""]
    if data.get("fidelity"):
        f = data["fidelity"]
        lines += ["## (c) simulated vs measured on gloo (2 CPU cores, one thread per process)", "",
                  "| plan | procs | micro-batch | measured (ms) | with the wrapper model (ms) | predicted (ms) | "
                  "simulated (ms) | Adam share (ms) | DTensor per pass, per stage (ms) | load |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in f["rows"]:
            disp = " / ".join(f"{x:.2f}" for x in r.get("tp_dispatch_ms") or ()) or "-"
            lines.append(f"| {r['plan']} | {r['world']} | {r['micro_batch']} | {r['measured_ms']:.2f} | "
                         f"{r.get('model_ms', float('nan')):.2f} | {r['predicted_ms']:.2f} | {r['simulated_ms']:.2f} | "
                         f"{r['adam_ms']:.2f} | {disp} | {r.get('load', float('nan')):.1f} |")
        for lk in f.get("links") or ():
            lines += ["", f"Links from the TP all-reduce measured before the {lk['world']}-process plans (groups of "
                          f"{lk.get('ranks', 2)} gloo ranks, "
                          f"between compute; load {lk['load']:.1f}): latency {lk['latency_s'] * 1e6:.1f} us, bandwidth "
                          f"{lk['bandwidth_Bps'] / 1e9:.2f} GB/s."]
        lines += ["", f"All plans: {json.dumps(f['stats'])}", f"TP plans: {json.dumps(f['tp_stats'])}",
                  f"With the wrapper model: all plans {json.dumps(f.get('model_stats'))}, TP plans "
                  f"{json.dumps(f.get('model_tp_stats'))}, recomputing plans "
                  f"{json.dumps(f.get('model_recompute_stats'))}", ""]
        if f.get("dtensor"):
            d = f["dtensor"]
            lines += [f"DTensor dispatch (1 process, no communication): eager step {d['eager_ms']:.2f} ms, the same "
                      f"model with the TP styles on a 1-rank mesh {d['dtensor_tp1_ms']:.2f} ms.", ""]
    atomic_write_text(out / "bench_tp.md", "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/bench_tp")
    ap.add_argument("--parts", default="abc")
    ap.add_argument("--budget", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5, help="profiling repeats per op (c)")
    args = ap.parse_args()
    start = time.perf_counter()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data: dict = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
                  "args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="bench_tp_") as tmp:
        if "a" in args.parts:
            data["planners"] = bench_planners(args.budget)
        if "b" in args.parts:
            data["overhead"] = bench_overhead(steps=args.steps, work=Path(tmp))
        if "c" in args.parts:
            data["fidelity"] = bench_fidelity(steps=args.steps, work=Path(tmp), repeats=args.repeats)
            data["fidelity"]["dtensor"] = dtensor_overhead(args.steps)
    data["load_after"] = os.getloadavg()[0]
    atomic_write_text(out / "bench_tp.json", json.dumps(data, indent=1, default=float))
    from placement_rl.results import write_result

    # results/bench_tp.json holds parts b and c (the README's rows); other parts their own file (bench_tp_a.json), so a
    # run of one part never drops another's figures measured at another commit
    parts = "".join(sorted(set(args.parts)))
    write_result("bench_tp" if set("bc") <= set(parts) else f"bench_tp_{parts}", data,
                 seconds=time.perf_counter() - start)
    write_report(out, data)
    print(f"wrote {out / 'bench_tp.md'}")


if __name__ == "__main__":
    main()
