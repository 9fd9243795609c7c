"""``placement-rl deploy``: run a plan for real (DP x PP job or op-level executor); measured vs predicted.

Every argument is checked before anything is written or started (the plan file, ``check_launch``, the plan
against its graph and topology, the profile against the graph): bad input is one line, exit 2, and no
``job/`` folder or ``deploy.json``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig

from placement_rl.cli.common import build_topology, hydra_app, output_dir, write_json
from placement_rl.cli.given import load_given, plan_graph, plan_topology, task_overrides
from placement_rl.errors import ConfigError, ExecutionError, ProfileError
from placement_rl.graph.ir import CompGraph

_NO_GPU = "the plan's devices are GPUs"  # the start of the executor's warning for a GPU plan run on CPUs
_CPU_FOR_GPU = ("warning: the plan is for the GPUs of '{topology}' and runs on this machine's CPUs (torch sees no "
                "CUDA GPU, or device=cpu); the ratio compares a CPU run with the GPU prediction")
# the unit of every number in deploy.json (key paths; ``ranks[]``: each entry of the list)
UNITS = {"measured_step_time": "s", "predicted_step_time": "s", "ratio_measured_to_predicted": "1",
         "result.step_time": "s", "result.step_times": "s", "result.optimizer_time": "s", "result.wall_time": "s",
         "result.throughput": "samples/s", "result.batch_size": "samples", "result.peak_memory_bytes": "bytes",
         "result.peak_memory_per_device": "bytes", "result.ranks[].step_times": "s",
         "result.ranks[].optimizer_times": "s", "result.ranks[].cpu_times": "s (process CPU time)",
         "result.ranks[].median_step_time": "s", "result.ranks[].peak_memory_bytes": "bytes",
         "result.ranks[].model_state_bytes": "bytes", "plan_layout.batch_size": "samples",
         "plan_layout.graph_batch_size": "samples", "plan_layout.stage_sizes": "graph nodes"}


def units_of(report: Mapping[str, Any]) -> dict[str, str]:
    """The entries of ``UNITS`` whose field ``report`` has (a stage plan's result has no per-device memory, an
    op-level one no ranks): ``a.b`` a nested key, ``a[].b`` a key of a list's items."""
    def has(node: Any, path: list[str]) -> bool:
        if not path:
            return node is not None
        key, rest = path[0], path[1:]
        if key.endswith("[]"):
            items = node.get(key[:-2]) if isinstance(node, Mapping) else None
            return isinstance(items, list) and any(has(x, rest) for x in items)
        return isinstance(node, Mapping) and key in node and has(node[key], rest)

    return {k: v for k, v in UNITS.items() if has(report, k.split("."))}


def check_launch(plan, *, nnodes: int, node_rank: int | None, rdzv_endpoint: str | None) -> None:
    """``ConfigError`` when the launch options do not fit ``plan``: several nodes need a stage plan whose
    process count ``nnodes`` divides, ``rdzv_endpoint='host:port'`` and ``node_rank < nnodes``; one node takes
    neither of those."""
    from placement_rl.plans import StagePlan

    if nnodes < 1:
        raise ConfigError(f"nnodes must be >= 1, got {nnodes}")
    if nnodes == 1:
        if rdzv_endpoint is not None or node_rank is not None:
            raise ConfigError("rdzv_endpoint and node_rank apply to a run over several machines: add nnodes=<n>, "
                              "or leave them out to run on this machine")
        return
    if not isinstance(plan, StagePlan):
        raise ConfigError(f"an op-level placement runs in one process on this machine: nnodes={nnodes} applies to "
                          "stage plans (plan.json) only; leave nnodes out")
    world = int(plan.world_size)
    if world % nnodes:
        fits = [n for n in range(1, world + 1) if world % n == 0]
        raise ConfigError(f"the plan runs {world} processes, which nnodes={nnodes} does not divide (every node "
                          f"runs as many): use nnodes in {{{', '.join(map(str, fits))}}}")
    if not rdzv_endpoint:
        raise ConfigError(f"nnodes={nnodes} needs rdzv_endpoint=host:port (the rendezvous address every node "
                          "reaches, e.g. the first node's 29500)")
    host, _, port = str(rdzv_endpoint).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"rdzv_endpoint '{rdzv_endpoint}' is not host:port (e.g. 10.0.0.1:29500)")
    if node_rank is not None and not 0 <= int(node_rank) < nnodes:
        raise ConfigError(f"node_rank {node_rank} is not in 0..{nnodes - 1} (nnodes={nnodes})")


def describe_plan(plan) -> str:
    """``2 stage(s) x DP 2 x TP 2 = 8 processes``; per-stage degrees when the stages differ."""
    dp, tp = tuple(plan.dp_degrees), tuple(plan.tp) or (1,) * plan.num_stages
    kind = plan.sharding.upper()
    if len(set(dp)) == 1 and len(set(tp)) == 1:
        width = f"{kind} {dp[0]}" + (f" x TP {tp[0]}" if tp[0] > 1 else "")
        return f"{plan.num_stages} stage(s) x {width} = {plan.world_size} processes"
    width = f"{kind} per stage {', '.join(map(str, dp))}"
    if any(t > 1 for t in tp):
        width += f"; TP per stage {', '.join(map(str, tp))}"
    return f"{plan.num_stages} stages ({width}) = {plan.world_size} processes"


def run_mode(plan) -> str:
    """How a stage plan's micro-batches run, for the line announcing it: ``1f1b, 4 micro-batches``; one stage has no
    pipeline schedule (``1 micro-batch, no pipeline schedule``; several micro-batches accumulate gradients)."""
    m = int(plan.num_microbatches)
    count = f"{m} micro-batch{'es' if m != 1 else ''}"
    if plan.num_stages > 1:
        return f"{plan.schedule}, {count}"
    return f"{count}{', gradients accumulated' if m > 1 else ''}, no pipeline schedule"


def _model(graph: CompGraph) -> tuple[str, dict]:
    zoo_name = graph.meta.get("zoo")
    if not zoo_name and graph.meta.get("hf"):
        raise ConfigError(f"graph '{graph.name}' is a transformers config captured without weights (graph=hf): "
                          "deploy runs built-in zoo models; build the model with weights and call "
                          "placement_rl.executor from Python")
    if not zoo_name:
        raise ConfigError(f"graph '{graph.name}' does not name a zoo model (meta.zoo): deploy runs built-in models; "
                          "for your own module call placement_rl.executor from Python")
    return str(zoo_name), dict(graph.meta.get("zoo_overrides") or {})


def load_profile(path: str, graph: CompGraph, topology):
    """The ``ProfileDB`` at ``path`` for ``graph`` on ``topology``; ``ProfileError`` (the nodes it lacks named)
    when it has times for none of the topology's devices, as ``costs.path`` refuses it; a warning line naming
    the devices priced by the cost model when it covers some only.

    A coarsened graph (``place`` writes one) the profile holds uncoarsened (``profile`` records the captured graph)
    is priced from its members' times (``ProfileDB.with_coarsened``)."""
    from placement_rl.profiling import ProfileDB

    db = ProfileDB.load(path).with_coarsened(graph)
    covered = [d.name for d in topology.devices if db.lookup(graph, d) is not None]
    if not covered:
        raise ProfileError(f"{path}: {db.why_no_times(graph, topology)}: profile this graph (`placement-rl profile` "
                           "with the graph settings the plan was made with), or leave profile out for the cost model")
    rest = [d.name for d in topology.devices if d.name not in covered]
    if rest:
        print(f"warning: profile {path} has no times for devices {', '.join(rest)}: the prediction prices them by "
              "the cost model (calibrated for GPUs, roofline for CPUs)", file=sys.stderr)
    return db


def _predict(graph, topology, plan, profile: str | None, costs_file: str | None = None
             ) -> tuple[float | None, str]:
    """Predicted step time: with a ProfileDB, the executor-aware prediction of ``placement_rl.profiling`` for
    op-level placements (devices sharing one torch device merged, optimizer and step overheads measured), the
    measured cost table for stage plans; without one, the cost model (``resolve_costs``: the calibrated model for
    GPUs unless the topology says ``cost_model: roofline``, the roofline for CPUs). ``(None, why)`` for a stage plan
    whose schedule the simulator does not model (the executor still runs it)."""
    from placement_rl.cost import resolve_costs, simulate, simulate_pipeline
    from placement_rl.cost.pipeline import PIPELINE_SCHEDULES
    from placement_rl.plans import StagePlan

    if isinstance(plan, StagePlan) and plan.schedule not in PIPELINE_SCHEDULES:
        return None, f"the simulator does not model schedule '{plan.schedule}'"
    if costs_file:  # measured costs from a file (cost.costs_file) price the plan
        from placement_rl.cost.costs_file import load_costs

        graph, costs = load_costs(costs_file, graph, topology)
    else:
        db = load_profile(profile, graph, topology) if profile else None
        if db is not None and not isinstance(plan, StagePlan):
            from placement_rl.profiling.fidelity import predict_step_time

            pred = predict_step_time(graph, topology, plan, db)
            return float(pred.step_time), ", ".join(sorted(set(pred.source)))
        costs = resolve_costs(graph, topology, profiles=None if db is None else [db])
    if not isinstance(plan, StagePlan):
        return float(simulate(graph, costs, topology, plan).step_time), _sources(costs, topology, plan)
    plan, cost_batch = _priced_batch(graph, plan, costs.meta.get("batch_size"))
    step = simulate_pipeline(graph, costs, topology, plan, cost_batch_size=cost_batch).step_time
    return float(step), _sources(costs, topology, plan)


def _sources(costs, topology, plan) -> str:
    """Where the numbers of the devices ``plan`` uses came from (``CostTable.describe_source``, those alone)."""
    from placement_rl.plans import StagePlan

    used = sorted({d for g in plan.stage_devices for d in g} if isinstance(plan, StagePlan)
                  else {int(d) for d in plan.device_of_node})
    return ", ".join(f"{topology.device_names[d]}={costs.source[d]}" for d in used)


def _priced_batch(graph, plan, costs_batch: float | None):
    """``(plan, cost_batch_size)`` for ``simulate_pipeline``: the batch the executor runs (the plan's ``batch_size``,
    else the graph's) against the batch the costs are for (``costs_batch``, else the graph's), so a plan of batch 16
    on a graph captured at 8 is priced at 16 (op times scaled by 2; one line says so). ``(plan, None)`` when the
    graph does not record its batch (costs taken for the whole batch, as before)."""
    from placement_rl.plans import graph_batch_size

    captured = graph_batch_size(graph)
    if captured is None and costs_batch is None:
        return plan, None
    if plan.batch_size is None:
        plan = replace(plan, batch_size=captured)
    measured = costs_batch if costs_batch is not None else captured
    if plan.batch_size is None or measured is None:
        return plan, None
    if plan.batch_size != measured:
        print(f"note: the plan runs batch {plan.batch_size} and the costs are for batch {measured:g}: the prediction "
              f"scales the ops' times, activations and boundary tensors by {plan.batch_size / measured:g}")
    return plan, float(measured)


def priced_precision(source: str | None, graph: CompGraph, topology) -> str:
    """The precision that priced the plan: the suffix of its devices' cost source labels (``source``:
    ``h0=calibrated:neusight-v2:bf16, ...``; a label without one, e.g. ``roofline``: fp32), ``bf16/fp32`` where they
    differ; without a prediction (``source`` None) the topology's ``dtype``, else the graph's."""
    from placement_rl.executor.distributed import PRECISIONS

    if source is None:
        declared = topology.meta.get("dtype") or graph.meta.get("dtype")
        return str(declared) if declared in PRECISIONS else "fp32"
    labels = [item.rpartition("=")[2] for item in source.split(", ")]
    return "/".join(sorted({x if x in PRECISIONS else "fp32" for x in (lab.rpartition(":")[2] for lab in labels)}))


def precision_note(precision: Mapping[str, str] | None) -> str | None:
    """The line saying that the run's precision is not the one that priced the plan, and why; None when they agree."""
    if not precision or precision["run"] == precision["priced"]:
        return None
    return (f"note: the plan was priced in {precision['priced']} and ran in {precision['run']} ({precision['why']}): "
            f"the ratio compares a run in {precision['run']} with a prediction in {precision['priced']}")


def choose_topology(cfg: DictConfig, plan_data: Mapping[str, Any], overrides: list[str] | None):
    """``(topology, line)``: the topology the plan file names when it is a preset and the user gave no ``topology``
    override (``cli.given.plan_topology``), else the composed one (default ``2x_cpu``), at ``threads=``."""
    return plan_topology(cfg, plan_data, overrides, build=lambda t: build_topology(t, threads=int(cfg.threads)))


def plan_layout(plan, graph: CompGraph, topology) -> dict[str, Any]:
    """What a stage plan runs, for ``deploy.json``: schedule (None for one stage: no pipeline), micro-batches, batch,
    sharding, DP / TP degrees, recomputation, sequence parallelism, the stages' devices (by name) and sizes (nodes),
    each rank's plan device."""
    import numpy as np

    from placement_rl.executor._mesh import parallel_dims, rank_devices
    from placement_rl.plans import graph_batch_size

    names = topology.device_names
    return {"schedule": plan.schedule if plan.num_stages > 1 else None, "num_microbatches": int(plan.num_microbatches),
            "batch_size": plan.batch_size if plan.batch_size is not None else graph_batch_size(graph),
            "graph_batch_size": graph_batch_size(graph), "sharding": plan.sharding, "dp": list(plan.dp_degrees),
            "tp": list(plan.tp), "recompute": list(plan.recompute), "sequence_parallel": plan.sequence_parallel,
            "stage_devices": [[names[d] for d in grp] for grp in plan.stage_devices],
            "stage_sizes": np.bincount(plan.stage_of_node, minlength=plan.num_stages).tolist(),
            "rank_devices": [names[d] for d in rank_devices(plan, parallel_dims(plan))]}


def _gpu_plan_on_cpu(plan, topology, device: str) -> bool:
    """Whether a stage plan for GPUs will run on this machine's CPUs (no CUDA here, or device=cpu); the op-level
    executor refuses that (``check_devices``)."""
    import torch

    from placement_rl.plans import StagePlan

    if not isinstance(plan, StagePlan):
        return False
    used = {d for g in plan.stage_devices for d in g}
    gpus = bool(used) and all(topology.devices[d].kind == "gpu" for d in used)
    return gpus and (device == "cpu" or not torch.cuda.is_available())


def _every(seconds: float):
    """A ``progress(done, total)`` that prints a line at most every ``seconds`` (long measurements say how far)."""
    import time

    start = last = time.perf_counter()

    def progress(done: int, total: int) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= seconds and done < total:
            last = now
            print(f"  step {done}/{total} ({now - start:.0f} s)", flush=True)

    return progress


def _torchrun(cmd: list[str], *, job_dir: Path, timeout_s: float, endpoint: str | None) -> None:
    """Run ``cmd`` (torchrun) in its own process group; ``ExecutionError`` when it fails or outlives
    ``timeout_s`` (its whole group is stopped then). The ranks' output is torchrun's, on this terminal."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
    errors = sorted(str(p) for p in (job_dir / "result").glob("rank*.error.json"))
    where = (f"; errors the ranks raised: {', '.join(errors)}" if errors
             else "; torchrun's output (the ranks' too) is above")
    if code is None:
        raise ExecutionError(f"torchrun did not finish within {timeout_s:g} s: every node must start the same "
                             f"deploy with its node_rank and reach the rendezvous at {endpoint}{where}")
    if code != 0:
        raise ExecutionError(f"torchrun exited with code {code}{where}")


def run(cfg: DictConfig) -> dict:
    from placement_rl.cli.costs import costs_path
    from placement_rl.executor.distributed import DeployConfig
    from placement_rl.plan_files import read_plan_file
    from placement_rl.plans import StagePlan

    if cfg.profile and costs_path(cfg):
        raise ConfigError(f"profile={cfg.profile} and costs.path={costs_path(cfg)} both price the prediction: give "
                          "one of the two")
    data = read_plan_file(str(cfg.plan))  # a missing file, a folder, no JSON: said before the graph is built
    dcfg = DeployConfig(steps=int(cfg.steps), warmup=int(cfg.warmup), lr=float(cfg.lr), device=str(cfg.device),
                        timeout_s=float(cfg.timeout_s), threads=int(cfg.threads)).validate()
    graph = plan_graph(cfg, str(cfg.plan), always_beside=True)
    topology, line = choose_topology(cfg, data, task_overrides())
    plan = load_given(str(cfg.plan), data, graph, topology, line)
    model, overrides = _model(graph)  # a graph deploy cannot build is said before what it would run on
    nnodes = int(cfg.nnodes)
    node_rank = None if cfg.node_rank is None else int(cfg.node_rank)
    check_launch(plan, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=cfg.rdzv_endpoint)
    if isinstance(plan, StagePlan):
        from placement_rl.executor._mesh import parallel_dims

        parallel_dims(plan)  # what the distributed executor runs: one DP degree, a schedule it has, ...
    else:
        from placement_rl.executor.local import check_devices

        check_devices(topology)
    if line:
        print(line)
    predicted, source = _predict(graph, topology, plan, cfg.profile, costs_path(cfg))
    if predicted is None:
        print(f"note: no predicted step time ({source}); deploying the plan all the same")
    priced = priced_precision(None if predicted is None else source, graph, topology)
    on_cpu = _gpu_plan_on_cpu(plan, topology, str(cfg.device))
    out = output_dir()
    if isinstance(plan, StagePlan):
        from placement_rl.executor.distributed import (DeploySpec, build_torchrun_command, collect_results,
                                                       launch_local, prepare_job)

        print(f"deploying {describe_plan(plan)} ({run_mode(plan)}{f' over {nnodes} nodes' if nnodes > 1 else ''}) ...")
        spec = DeploySpec(plan=plan, graph=graph, model=model, overrides=overrides, topology=topology,
                          precision=priced)
        # one node: a temporary job directory, kept after a failure (the error names the ranks' logs in it)
        job_dir = out / "job" if nnodes > 1 else Path(tempfile.mkdtemp(prefix="prl-deploy-"))
        try:
            with warnings.catch_warnings():  # said below, in one line, once the plan is accepted
                warnings.filterwarnings("ignore", message=_NO_GPU, category=RuntimeWarning)
                job = prepare_job([spec], config=dcfg, job_dir=job_dir)
        except BaseException:
            if nnodes == 1:
                shutil.rmtree(job_dir, ignore_errors=True)
            raise
        if on_cpu:
            print(_CPU_FOR_GPU.format(topology=topology.name), file=sys.stderr)
        if nnodes > 1:
            cmd = build_torchrun_command(job.job_dir, nproc_per_node=job.world_size // nnodes, nnodes=nnodes,
                                         node_rank=node_rank, rdzv_endpoint=cfg.rdzv_endpoint)
            print("running:", " ".join(cmd))
            print(f"waiting up to {float(cfg.timeout_s) + 60:g} s for {nnodes} nodes at {cfg.rdzv_endpoint}",
                  flush=True)
            _torchrun(cmd, job_dir=job.job_dir, timeout_s=float(cfg.timeout_s) + 60, endpoint=str(cfg.rdzv_endpoint))
            result = collect_results(job.job_dir)[0].to_dict()
        else:
            result = launch_local(job)[0].to_dict()
            shutil.rmtree(job_dir, ignore_errors=True)
        measured = float(result["step_time"])
        precision = result.get("precision")  # the ranks' (``DeployResult.precision``)
        kind = "stage_plan"
    else:
        from placement_rl.executor.local import run_placement
        from placement_rl.graph import zoo

        import torch

        torch.set_num_threads(int(cfg.threads))
        module, inputs = zoo.build(model, **overrides)
        print(f"running the op-level placement on {topology.name} ({int(cfg.steps)} steps) ...")
        res = run_placement(module, inputs, graph, plan, topology, steps=int(cfg.steps), warmup=int(cfg.warmup),
                            lr=float(cfg.lr), time_limit_s=float(cfg.timeout_s), progress=_every(10.0))
        measured = float(res.median_step_time)
        result = {"step_time": measured, "step_times": list(map(float, res.step_times)),
                  "peak_memory_per_device": [float(x) for x in res.peak_memory_per_device], "loss": float(res.loss),
                  "losses": [float(x) for x in res.losses]}  # loss: the first step; losses: all, warm-up included
        precision = {"priced": priced, "run": "fp32"}
        if priced != "fp32":
            precision["why"] = "the op-level executor runs the model as built, in fp32"
        kind = "placement"
    ratio = measured / predicted if predicted else None
    report = {"plan": str(cfg.plan), "kind": kind, "graph": graph.name, "topology": topology.name,
              "measured_step_time": measured, "predicted_step_time": predicted, "prediction_source": source,
              "ratio_measured_to_predicted": ratio, "ran_on_cpu_for_gpus": on_cpu, "precision": precision,
              "result": result,
              "plan_layout": plan_layout(plan, graph, topology) if kind == "stage_plan" else None}
    report["units"] = units_of(report)
    write_json(out / "deploy.json", report)
    note = precision_note(precision)
    if note:
        print(note)
    if ratio is None:
        print(f"measured {measured * 1e3:.3f} ms per step; no prediction ({source})")
    else:
        print(f"measured {measured * 1e3:.3f} ms per step, predicted {predicted * 1e3:.3f} ms ({source}); "
              f"ratio {ratio:.2f}" + (" (a CPU run against the GPU prediction)" if on_cpu else ""))
    print(f"wrote {out / 'deploy.json'}")
    return report


main = hydra_app("deploy", writes=("deploy.json",))(run)
