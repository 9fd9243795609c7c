"""``placement-rl train``: learn a placement / pipeline policy; write checkpoint, plan, metrics, plots, comparison."""

from __future__ import annotations

import json

from omegaconf import DictConfig

from placement_rl.cli.common import build_graph, build_topology, hydra_app, output_dir, save_plan, to_container
from placement_rl.errors import ConfigError
from placement_rl.graph.io import atomic_write_text


def make_specs(cfg: DictConfig):
    from agents.reinforce import ReinforceConfig
    from agents.train import AgentSpec, EncoderSpec

    a = dict(to_container(cfg.agent))
    try:
        if "reinforce" in a:
            a["reinforce"] = ReinforceConfig(**a["reinforce"])
        return AgentSpec(**a), EncoderSpec(**to_container(cfg.encoder))
    except TypeError as exc:
        raise ConfigError(f"bad agent/encoder config: {exc}") from None


def env_kwargs(cfg: DictConfig, graph, topology) -> dict:
    opts = {k: v for k, v in (to_container(cfg.env.get("options")) or {}).items() if v is not None}
    return {"graph": graph, "topology": topology, **opts}


def run_family(cfg: DictConfig) -> dict:
    """``trainer=family``: train on a family of graphs/topologies, place held-out ones zero-shot."""
    from placement_rl.studies.generalize import FamilySpec, run_family as run_family_lib

    spec = FamilySpec.from_dict(to_container(cfg.trainer.family), samples=int(cfg.trainer.eval_samples))
    agent, encoder = make_specs(cfg)
    out = output_dir()
    print(f"training {agent.algo} + {encoder.name} on a family: {len(spec.synthetic)} synthetic families + zoo "
          f"{list(spec.zoo)} on {list(spec.topologies)}; held out {list(spec.held_out)} and "
          f"{list(spec.held_out_topologies)}; {int(cfg.trainer.total_steps)} steps")
    metrics = run_family_lib(spec, steps=int(cfg.trainer.total_steps), out=out, agent=agent, encoder=encoder,
                             seed=int(cfg.seed), progress=bool(cfg.progress), tensorboard=bool(cfg.trainer.tensorboard),
                             config=to_container(cfg))
    print(f"zero-shot on {metrics['held_out_pairs']} held-out pairs: {metrics['feasible']} feasible, mean speed-up "
          f"{metrics['mean_speedup_vs_single']:.3f}x over one device, mean ratio to the best baseline "
          f"{metrics['mean_ratio_to_best_baseline']}")
    print(f"artifacts in {out}: checkpoint.pt, generalization.md, generalization.csv, metrics.json")
    return metrics


def run(cfg: DictConfig) -> dict:
    from agents.train import Trainer, final_plan
    from placement_rl.report import training_curve

    if cfg.trainer.get("family"):
        return run_family(cfg)
    graph, topology = build_graph(cfg.graph), build_topology(cfg.topology)
    agent, encoder = make_specs(cfg)
    out = output_dir()
    tcfg = cfg.trainer
    print(f"training {agent.algo} + {encoder.name} on {cfg.env.id}: graph {graph.name} ({graph.num_nodes} nodes), "
          f"topology {topology.name} ({topology.num_devices} devices), {int(tcfg.total_steps)} steps")
    trainer = Trainer(env_id=str(cfg.env.id), env_kwargs=env_kwargs(cfg, graph, topology), agent=agent,
                      encoder=encoder, seed=int(cfg.seed), config=to_container(cfg),
                      tensorboard_dir=str(out / "tb") if tcfg.tensorboard else None)
    if cfg.checkpoint:
        trainer.load_weights(str(cfg.checkpoint))
        print(f"resumed from {cfg.checkpoint} at step {trainer.num_timesteps}")
    trainer.learn(int(tcfg.total_steps), progress=bool(cfg.progress))
    trainer.save(out / "checkpoint.pt")
    best = final_plan(trainer, samples=int(tcfg.eval_samples), seed=int(cfg.seed))
    plan, plan_file = save_plan(best["value"], graph, topology, out)
    tr = trainer.tracker
    single = tr.best_single_time
    metrics = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name, "env": str(cfg.env.id),
               "agent": agent.algo, "encoder": encoder.name, "seed": int(cfg.seed),
               "total_steps": trainer.num_timesteps, "episodes": tr.episodes, "sim_calls": tr.sim_calls,
               "train_seconds": trainer.train_seconds, "best_single_device_time": single,
               "step_time": best["step_time"], "feasible": best["feasible"], "plan_source": best["source"],
               "speedup_over_single_device": single / best["step_time"] if best["step_time"] > 0 else None,
               "policy_greedy_time": best["policy_greedy_time"],
               "policy_best_of_k_time": best["policy_best_of_k_time"]}
    refs = {"best single device": single}
    if tcfg.compare:
        from placement_rl.cli.evaluate import compare_learned

        got = compare_learned(graph, trainer.unwrapped_env.task.costs, topology, out,
                              label=f"learned:{agent.algo}+{encoder.name}", plan=plan, step_time=best["step_time"],
                              feasible=bool(best["feasible"]), seconds=trainer.train_seconds, sim_calls=tr.sim_calls,
                              seed=int(cfg.seed), what="learned")
        got.pop("best_single_device_time")
        metrics.update(got)
        if "best_baseline" in got:
            refs[f"best baseline ({got['best_baseline']})"] = got["best_baseline_time"]
    training_curve(tr.curve, out / "training.png", references=refs,
                   title=f"{agent.algo} + {encoder.name} on {graph.name} / {topology.name}")
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1, default=float))
    print(f"best step time {best['step_time'] * 1e3:.3f} ms (single device {single * 1e3:.3f} ms, "
          f"speed-up {metrics['speedup_over_single_device']:.3f}x)"
          + (f"; best baseline {metrics['best_baseline']} {metrics['best_baseline_time'] * 1e3:.3f} ms"
             if "best_baseline" in metrics else ""))
    print(f"artifacts in {out}: checkpoint.pt, {plan_file}, metrics.json, training.png"
          + (", comparison.md, comparison.csv" if tcfg.compare else "") + (", tb/" if tcfg.tensorboard else ""))
    return metrics


main = hydra_app("train")(run)
