"""``placement-rl place``: zero-shot placement of a graph with a trained policy (no training)."""

from __future__ import annotations

import json
import time

import numpy as np
from omegaconf import DictConfig

from placement_rl.cli.common import build_graph, build_topology, hydra_app, output_dir, save_plan
from placement_rl.errors import ConfigError
from placement_rl.graph.io import atomic_write_text


def run(cfg: DictConfig) -> dict:
    import gymnasium as gym

    import envs  # noqa: F401 - registers the environments
    from agents.checkpoint import load_checkpoint
    from agents.rollout import load_policy_for, rollout

    if cfg.decode not in ("one_pass", "sequential"):
        raise ConfigError(f"decode is '{cfg.decode}': choose one_pass or sequential")
    ckpt = load_checkpoint(str(cfg.checkpoint))
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
