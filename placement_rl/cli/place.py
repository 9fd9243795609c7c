"""``placement-rl place``: zero-shot placement of a graph with a trained policy (no training)."""

from __future__ import annotations

import json
import time

import numpy as np
from omegaconf import DictConfig

from placement_rl.cli.common import build_graph, build_topology, hydra_app, output_dir, save_plan, warm_up
from placement_rl.errors import ConfigError
from placement_rl.graph.io import atomic_write_text


def run_constructive(cfg: DictConfig, ckpt_path: str) -> dict:
    """A constructive (schedule-aware) policy: greedy and best of ``samples`` sampled placements, each a row."""
    import torch

    from agents.constructive_eval import evaluate
    from agents.constructive_train import load_policy
    from envs.constructive_task import ConstructiveTask
    from placement_rl.cost import resolve_costs

    from agents.constructive import placement_calls, state_window

    torch.set_num_threads(1)
    policy, _, _ = load_policy(ckpt_path)
    for key in ("window", "full_window"):  # trade quality for seconds (typed by cli.schema: ints >= 0 or null)
        if cfg.get(key) is not None:
            setattr(policy, key, int(cfg.get(key)))
    graph, topology = build_graph(cfg.graph), build_topology(cfg.topology)
    costs = resolve_costs(graph, topology)
    warm_s = warm_up(policy)  # numba compiles on the first run after an install: not the placement's time
    t0 = time.perf_counter()
    task = ConstructiveTask.build(graph, topology, costs, teachers=False)
    res = evaluate(policy, [task], samples=int(cfg.samples), seed=int(cfg.seed))[0]
    wall = time.perf_counter() - t0
    use_best = res.best_time < res.greedy_time
    step_time = res.best_time if use_best else res.greedy_time
    chosen = f"best of {int(cfg.samples)} samples" if use_best else "greedy"
    out = output_dir()
    plan, plan_file = save_plan(res.best_devices, graph, topology, out)
    # every placement's simulator calls: N x D + 1 with the whole-graph window (its completions), else 1
    calls = placement_calls(policy, task) * (1 + int(cfg.samples))
    metrics = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name, "checkpoint": ckpt_path,
               "policy": "constructive", "window": state_window(policy, graph.num_nodes),
               "samples": int(cfg.samples), "greedy_step_time": res.greedy_time,
               "best_of_k_step_time": res.best_time, "step_time": step_time, "chosen": chosen,
               "feasible": bool(res.greedy.feasible[0]) or use_best, "sim_calls": calls, "wall_seconds": wall,
               "warm_up_seconds": warm_s,
               "cost_source": costs.describe_source(topology.device_names)}
    if cfg.compare:
        from placement_rl.cli.evaluate import compare_learned

        metrics.update(compare_learned(graph, costs, topology, out, label=f"zero-shot policy ({chosen})", plan=plan,
                                       step_time=step_time, feasible=metrics["feasible"], seconds=wall,
                                       sim_calls=calls, seed=int(cfg.seed), what="zero-shot placement"))
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1, default=float))
    print(f"zero-shot placement of {graph.name} ({graph.num_nodes} nodes) on {topology.name} ({topology.num_devices} "
          f"devices), {wall:.2f} s: greedy {res.greedy_time * 1e3:.3f} ms, best of {int(cfg.samples)} samples "
          f"{res.best_time * 1e3:.3f} ms" + (f"; best baseline {metrics['best_baseline']} "
                                             f"{metrics['best_baseline_time'] * 1e3:.3f} ms" if "best_baseline" in metrics else ""))
    print(f"artifacts in {out}: {plan_file}, metrics.json" + (", comparison.md, comparison.csv" if cfg.compare else ""))
    return metrics


def run(cfg: DictConfig) -> dict:
    import gymnasium as gym

    import envs  # noqa: F401 - registers the environments
    from agents.checkpoint import load_checkpoint
    from agents.rollout import load_policy_for, rollout

    if cfg.decode not in ("one_pass", "sequential"):
        raise ConfigError(f"decode is '{cfg.decode}': choose one_pass or sequential")
    if int(cfg.samples) < 0:
        raise ConfigError(f"samples must be >= 0, got {cfg.samples}")
    if not cfg.checkpoint:
        from agents.constructive_train import default_checkpoint

        return run_constructive(cfg, str(default_checkpoint()))
    ckpt = load_checkpoint(str(cfg.checkpoint))
    if ckpt.get("algo") == "constructive":
        return run_constructive(cfg, str(cfg.checkpoint))
    graph, topology = build_graph(cfg.graph), build_topology(cfg.topology)
    env_id = ckpt["config"]["env_id"]
    enc = dict(ckpt["config"]["encoder"])
    enc_kwargs = {"encoder": enc["name"], "hidden": enc["hidden"], "layers": enc["layers"]}
    obs_cfg = ckpt["obs"]
    if topology.num_devices > obs_cfg["max_devices"]:
        raise ConfigError(f"topology '{topology.name}' has {topology.num_devices} devices but the policy was trained "
                          f"with max_devices={obs_cfg['max_devices']}")
    pipeline = env_id.startswith("placement_rl/PipelineEnv")
    t0 = time.perf_counter()
    env = gym.make(env_id, graph=graph, topology=topology, max_devices=obs_cfg["max_devices"],
                   op_type_buckets=obs_cfg["op_type_buckets"], max_nodes=graph.num_nodes)
    policy = load_policy_for(env, ckpt["policy"], enc_kwargs)
    rng = np.random.default_rng(int(cfg.seed))
    samples = int(cfg.samples)
    if cfg.decode == "one_pass" and not pipeline:
        from agents.rollout import zero_shot_place

        res = zero_shot_place(policy, env, samples=samples, seed=int(cfg.seed))
        infeasible, step_time, value, calls = not res.feasible, res.step_time, res.device_of_node, res.sim_calls
        chosen = res.chosen
    else:
        results = []
        for k in range(samples + 1):
            info = rollout(policy, env, deterministic=(k == 0), rng=rng, seed=int(cfg.seed) + k)
            results.append((not bool(info.get("feasible", True)), float(info["step_time"]), k,
                            info.get("plan", info.get("placement"))))
        infeasible, step_time, k, value = min(results, key=lambda r: (r[0], r[1]))
        calls = int(getattr(env.unwrapped.state.source, "calls", samples + 1))
        chosen = "greedy" if k == 0 else f"sample {k}"
    costs = env.unwrapped.task.costs
    wall = time.perf_counter() - t0
    out = output_dir()
    plan, plan_file = save_plan(value, graph, topology, out)
    metrics = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name, "checkpoint":
               str(cfg.checkpoint), "decode": cfg.decode, "samples": samples, "step_time": step_time,
               "feasible": not infeasible, "chosen": chosen, "sim_calls": calls,
               "wall_seconds": wall}
    if cfg.compare:
        from placement_rl.cli.evaluate import compare_learned

        metrics.update(compare_learned(graph, costs, topology, out, label="zero-shot policy", plan=plan,
                                       step_time=step_time, feasible=not infeasible, seconds=wall, sim_calls=calls,
                                       seed=int(cfg.seed), what="zero-shot placement"))
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1, default=float))
    print(f"zero-shot placement of {graph.name} ({graph.num_nodes} nodes) on {topology.name}: "
          f"{step_time * 1e3:.3f} ms ({'feasible' if not infeasible else 'INFEASIBLE'}), {wall:.2f} s"
          + (f"; best baseline {metrics['best_baseline']} {metrics['best_baseline_time'] * 1e3:.3f} ms"
             if "best_baseline" in metrics else ""))
    print(f"artifacts in {out}: {plan_file}, metrics.json" + (", comparison.md, comparison.csv" if cfg.compare else ""))
    return metrics


main = hydra_app("place")(run)
