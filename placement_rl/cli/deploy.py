"""``placement-rl deploy``: run a plan for real (DP x PP job or op-level executor); measured vs predicted."""

from __future__ import annotations

import subprocess
from pathlib import Path

from omegaconf import DictConfig

from placement_rl.cli.common import build_graph, build_topology, hydra_app, output_dir, write_json
from placement_rl.errors import ConfigError, ExecutionError
from placement_rl.graph.ir import CompGraph


def _graph(cfg: DictConfig) -> CompGraph:
    if not cfg.graph.get("path"):
        beside = Path(str(cfg.plan)).parent / "graph.json"
        if beside.is_file():
            return CompGraph.from_json(beside)
    return build_graph(cfg.graph)


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


def _predict(graph, topology, plan, profile: str | None, costs_file: str | None = None) -> tuple[float, str]:
    """Predicted step time: with a ProfileDB, the executor-aware prediction of ``placement_rl.profiling`` for
    op-level placements (devices sharing one torch device merged, optimizer and step overheads measured), the
    measured cost table for stage plans; without one, the topology's roofline."""
    from placement_rl.cost import resolve_costs, simulate, simulate_pipeline
    from placement_rl.plans import StagePlan

    if costs_file:  # measured costs from a file (cost.costs_file) price the plan
        from placement_rl.cost.costs_file import load_costs

        graph, costs = load_costs(costs_file, graph, topology)
        sim = simulate_pipeline if isinstance(plan, StagePlan) else simulate
        return float(sim(graph, costs, topology, plan).step_time), costs.describe_source(topology.device_names)
    if profile and not isinstance(plan, StagePlan):
        from placement_rl.profiling import ProfileDB
        from placement_rl.profiling.fidelity import predict_step_time

        pred = predict_step_time(graph, topology, plan, ProfileDB.load(profile))
        return float(pred.step_time), ", ".join(sorted(set(pred.source)))
    profiles = None
    if profile:
        from placement_rl.profiling import ProfileDB

        profiles = [ProfileDB.load(profile)]
    costs = resolve_costs(graph, topology, profiles=profiles)
    sim = simulate_pipeline if isinstance(plan, StagePlan) else simulate
    return float(sim(graph, costs, topology, plan).step_time), costs.describe_source(topology.device_names)


def run(cfg: DictConfig) -> dict:
    from placement_rl.plans import StagePlan, load_plan

    graph, topology = _graph(cfg), build_topology(cfg.topology, threads=int(cfg.threads))
    plan = load_plan(str(cfg.plan), topology=topology, graph=graph)
    plan.validate(graph, topology)
    model, overrides = _model(graph)
    from placement_rl.cli.costs import costs_path

    predicted, source = _predict(graph, topology, plan, cfg.profile, costs_path(cfg))
    out = output_dir()
    if isinstance(plan, StagePlan):
        from placement_rl.executor.distributed import (DeployConfig, build_torchrun_command, collect_results,
                                                       deploy_stage_plan, prepare_job, DeploySpec)

        dcfg = DeployConfig(steps=int(cfg.steps), warmup=int(cfg.warmup), lr=float(cfg.lr), device=str(cfg.device),
                            timeout_s=float(cfg.timeout_s), threads=int(cfg.threads)).validate()
        if int(cfg.nnodes) > 1:
            job = prepare_job([DeploySpec(plan=plan, graph=graph, model=model, overrides=overrides,
                                          topology=topology)], config=dcfg, job_dir=out / "job")
            per_node = job.world_size // int(cfg.nnodes)
            cmd = build_torchrun_command(job.job_dir, nproc_per_node=per_node, nnodes=int(cfg.nnodes),
                                         node_rank=cfg.node_rank, rdzv_endpoint=cfg.rdzv_endpoint)
            print("running:", " ".join(cmd))
            try:
                subprocess.run(cmd, check=True, timeout=float(cfg.timeout_s) + 60)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                raise ExecutionError(f"torchrun failed ({exc}); rank logs are in {job.job_dir}") from None
            result = collect_results(job.job_dir)[0].to_dict()
        else:
            print(f"deploying {plan.num_stages} stage(s) x {plan.sharding.upper()} {plan.dp_degrees[0]} = "
                  f"{plan.world_size} processes ({plan.schedule}, {plan.num_microbatches} micro-batches) ...")
            result = deploy_stage_plan(plan, graph, model=model, overrides=overrides, config=dcfg,
                                       topology=topology).to_dict()
        measured = float(result["step_time"])
        kind = "stage_plan"
    else:
        from placement_rl.executor.local import run_placement
        from placement_rl.graph import zoo

        import torch

        torch.set_num_threads(int(cfg.threads))
        module, inputs = zoo.build(model, **overrides)
        print(f"running the op-level placement on {topology.name} ({int(cfg.steps)} steps) ...")
        res = run_placement(module, inputs, graph, plan, topology, steps=int(cfg.steps), warmup=int(cfg.warmup),
                            lr=float(cfg.lr), time_limit_s=float(cfg.timeout_s))
        measured = float(res.median_step_time)
        result = {"step_time": measured, "step_times": list(map(float, res.step_times)),
                  "peak_memory_per_device": [float(x) for x in res.peak_memory_per_device], "loss": float(res.loss)}
        kind = "placement"
    report = {"plan": str(cfg.plan), "kind": kind, "graph": graph.name, "topology": topology.name,
              "measured_step_time": measured, "predicted_step_time": predicted, "prediction_source": source,
              "ratio_measured_to_predicted": measured / predicted if predicted > 0 else None, "result": result}
    write_json(out / "deploy.json", report)
    print(f"measured {measured * 1e3:.3f} ms per step, predicted {predicted * 1e3:.3f} ms ({source}); "
          f"ratio {measured / predicted:.2f}")
    print(f"wrote {out / 'deploy.json'}")
    return report


main = hydra_app("deploy", writes=("deploy.json",))(run)
