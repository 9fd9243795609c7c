"""``placement-rl train``: learn a placement / pipeline policy; write checkpoint, plan, metrics, plots, comparison."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from placement_rl.cli.common import (build_graph, build_topology, files_on_interrupt, hydra_app, output_dir, plural,
                                     save_plan, to_container, warm_up, write_json)
from placement_rl.errors import ConfigError
from placement_rl.graph.io import atomic_write_text


def make_specs(cfg: DictConfig):
    from placement_rl.agents.reinforce import ReinforceConfig
    from placement_rl.agents.train import AgentSpec, EncoderSpec

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


CONSTRUCTIVE_ENV = "placement_rl/ConstructivePlacementEnv-v0"


def constructive_config(cfg: DictConfig, base=None):
    """The ``ConstructiveConfig`` of the agent and encoder groups (over ``base``, a checkpoint's config)."""
    import dataclasses

    from placement_rl.agents.constructive_config import ConstructiveConfig, FieldError

    known = {f.name for f in dataclasses.fields(ConstructiveConfig)}
    fields = dataclasses.asdict(base) if base is not None else {
        "encoder": str(cfg.encoder.name), "hidden": int(cfg.encoder.hidden), "layers": int(cfg.encoder.layers)}
    keep = ("window", "full_window", "full_window_train")  # null: the checkpoint's
    fields.update({k: v for k, v in to_container(cfg.agent).items() if k in known and not (k in keep and v is None)})
    if base is not None and int(fields.get("window", base.window)) != int(base.window):
        raise ConfigError(f"agent.window={fields['window']} does not match the checkpoint's lookahead window "
                          f"{base.window}: drop the override (a policy reads the states it was trained on)")
    fields["seed"] = int(cfg.seed)
    try:
        return ConstructiveConfig(**fields)
    except FieldError as exc:  # as the command line's other range errors: the key as typed, its rule
        raise ConfigError(f"agent.{exc.key}={exc.value}: must be {exc.rule}") from None
    except TypeError as exc:
        raise ConfigError(f"bad agent config: {exc}") from None


def _sweeping() -> bool:
    """Whether this job is one of a multirun (``-m``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_pretrain(cfg: DictConfig) -> dict:
    """``trainer=pretrain``: the general constructive policy over a distribution of graphs and clusters."""
    from placement_rl.studies.pretrain import PretrainSpec, pretrain

    p = dict(to_container(cfg.trainer.pretrain))
    try:
        spec = PretrainSpec(**{**p, "sizes": tuple(p["sizes"]), "devices": tuple(p["devices"])})
    except TypeError as exc:
        raise ConfigError(f"bad trainer.pretrain config: {exc}") from None
    out = output_dir()
    ray_cfg = cfg.get("ray") or {}
    workers = cfg.get("workers", 1)
    if workers == "auto" and _sweeping() and not ray_cfg.get("address"):
        workers = 1  # a multirun's launcher already runs one job per core
    metrics = pretrain(spec, constructive_config(cfg), out, workers=workers, address=ray_cfg.get("address"),
                       resume=bool(cfg.get("resume", False)))
    # the policy's seed is `seed`; the tasks' pretrain.seed; the checkpoint does not depend on `workers`
    h = metrics.get("dev", {})
    if h:
        print(f"dev split zero-shot over {h['pairs']} pairs (ratio to the best one-pass heuristic): greedy geomean "
              f"{h['greedy_geomean']:.4f}, <= 1.00 on {h['greedy_le_1_frac']:.0%}; best of 16 geomean "
              f"{h['best_of_k_geomean']:.4f}; greedy / sim_eft {h.get('greedy_over_sim_eft_geomean', float('nan')):.4f}"
              f", greedy / eft_rollout {h.get('greedy_over_eft_rollout_geomean', float('nan')):.4f}")
    print(f"checkpoint.pt sha256 {metrics['checkpoint_sha']}, policy weights {metrics['weights_sha']} "
          f"({metrics['workers']} workers, {metrics['train_seconds']:.0f} s)")
    wrote = [f for f in ("checkpoint.pt", "checkpoint_imitation.pt", "checkpoint_pi.pt", "checkpoint_ei.pt", "dev.md",
                         "dev.csv", "training.json", "metrics.json") if (out / f).is_file()]
    print(f"artifacts in {out}: {', '.join(wrote)}")
    return metrics


def _task_overrides() -> list[str]:
    """The command line's overrides of this job (none outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def constructive_ignores(overrides: list[str]) -> list[str]:
    """The overrides ``env=constructive`` does not read: the encoder group (a fine-tune keeps the checkpoint's
    encoder) and the trainer group but ``trainer.compare`` (its budget is the agent's search and RL keys)."""
    given = [o.lstrip("+~") for o in overrides]
    return [o for o in given if o.split("=", 1)[0].split(".")[0] in ("encoder", "trainer")
            and o.split("=", 1)[0] != "trainer.compare"]


def workers_note(cfg: DictConfig) -> str | None:
    """``workers`` / ``ray.address`` scale out ``trainer=pretrain`` only: one line when a run of another kind sets
    them (its results are the same with any count)."""
    set_ = [f"workers={cfg.get('workers')}"] if str(cfg.get("workers", "auto")) not in ("auto", "1") else []
    if (cfg.get("ray") or {}).get("address"):
        set_.append(f"ray.address={cfg.ray.address}")
    if not set_:
        return None
    verb = "apply" if len(set_) > 1 else "applies"
    return f"note: {' and '.join(set_)} {verb} to trainer=pretrain only: this run trains in this process"


# the searches run at the zero-shot rows' seconds too (policy_search, the slowest: at the fine-tuned policy's only)
ZERO_SHOT_SEARCHES = ("local_search", "la_rule_search")
FINE_TUNED = "policy fine-tuned (greedy)"  # the row the three searches (with policy_search) run for


def run_constructive(cfg: DictConfig) -> dict:
    """``env=constructive``: fine-tune the pretrained policy (or ``checkpoint=``) on one graph and topology. The
    checkpoint and the policy's placement are written as soon as fine-tuning ends, before the searches it is
    compared with; a Ctrl-C names the files written and those not (``files_on_interrupt``)."""
    import torch

    from placement_rl.agents.constructive_train import default_checkpoint, load_policy, set_windows
    from placement_rl.cli.place import check_memory, checkpoint_id
    from placement_rl.studies.finetune import describe, finetune

    if str(cfg.agent.get("algo")) != "constructive":
        raise ConfigError(f"env=constructive is trained by agent=constructive, not agent={cfg.agent.get('algo')}")
    torch.set_num_threads(1)
    graph, topology = build_graph(cfg.graph), build_topology(cfg.topology)
    ckpt = str(cfg.checkpoint) if cfg.checkpoint else str(default_checkpoint())
    policy, base, _ = load_policy(ckpt, strict=bool(cfg.get("strict_checkpoint", False)), log=print)
    fcfg = constructive_config(cfg, base)
    set_windows(policy, fcfg)  # the agent's full_window / full_window_train over the checkpoint's
    ignored = constructive_ignores(_task_overrides())
    if ignored:
        print(f"note: env=constructive ignores {', '.join(ignored)}: it fine-tunes the checkpoint's {fcfg.encoder} "
              f"encoder (hidden {fcfg.hidden}, {fcfg.layers} layers), its budget is agent.ft_search_rounds x "
              "agent.ft_search_seconds (+ agent.pi_rounds, agent.rl_iters), its best-of-k agent.eval_samples; of "
              "the trainer group it reads trainer.compare only")
    from placement_rl.cli.costs import build_costs

    graph, costs = build_costs(cfg, graph, topology)  # costs.path= (measured) or estimates
    check_memory(graph, topology, costs)
    out = output_dir()
    warm_s = warm_up(policy)  # numba's first compile after an install is no row's seconds
    print(f"fine-tuning the policy {ckpt} on {graph.name} ({plural(graph.num_nodes, 'node')}) / {topology.name} "
          f"({plural(topology.num_devices, 'device')}): up to {fcfg.pi_rounds} policy-iteration rounds, up to "
          f"{fcfg.ft_search_rounds} rounds of {fcfg.ft_search_seconds:g} s of search from the policy's placements "
          f"(cloned; stops when a round gains nothing), then {fcfg.rl_iters} iterations x {fcfg.samples} samples")
    import copy

    zero_shot = copy.deepcopy(policy)  # the policy before fine-tuning: policy_search's proposal
    log = print if cfg.progress else (lambda _: None)
    head = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name, **checkpoint_id(ckpt),
            "cost_source": costs.describe_source(topology.device_names), "warm_up_seconds": warm_s}
    written: list[str] = []  # the files written so far, in order
    with files_on_interrupt(written, _constructive_files(cfg)):
        res = finetune(graph, topology, costs, policy, fcfg, samples=int(cfg.agent.eval_samples),
                       search_budget=int(cfg.agent.get("search_budget", 0)), seed=int(cfg.seed), log=log)
        if res.note:
            print(f"note: {res.note}")
        res.trainer.save(out / "checkpoint.pt", extra={"finetuned_on": f"{graph.name}@{topology.name}"})
        best = res.best("learned")  # the searches below add search rows only
        plan, plan_file = save_plan(best.devices, graph, topology, out, costs=costs)
        written += ["checkpoint.pt", "graph.json", plan_file]
        if bool(cfg.agent.get("equal_seconds", True)):
            from placement_rl.studies.finetune import equal_seconds_rows

            learned = {r.label: r.seconds for r in res.rows if r.kind == "learned"}
            asks = [(k, learned[k], ZERO_SHOT_SEARCHES) for k in learned if k.startswith("policy zero-shot")]
            if FINE_TUNED in learned:
                asks.append((FINE_TUNED, learned[FINE_TUNED], ("policy_search", *ZERO_SHOT_SEARCHES)))
            equal_seconds_rows(res, zero_shot, asks, seed=int(cfg.seed), log=log)
        metrics = {**head, "rows": describe(res), "learned_step_time": best.step_time, "learned_row": best.label,
                   **({"finetune_note": res.note} if res.note else {})}
        _write_results(cfg, res, plan, metrics, written)
    print(f"artifacts in {out}: {', '.join(written)}")
    return metrics


def _constructive_files(cfg: DictConfig) -> list[str]:
    """The files a finished ``env=constructive`` run writes (``comparison.*``: the comparison's tables and plots)."""
    searched = int(cfg.agent.get("search_budget", 0)) > 0 or bool(cfg.agent.get("equal_seconds", True))
    return ["checkpoint.pt", "graph.json", "placement.json", *(["search/placement.json"] if searched else []),
            "learned.md", "training.png", *(["comparison.*"] if cfg.trainer.compare else []), "metrics.json"]


def _write_results(cfg: DictConfig, res, plan, metrics: dict, written: list[str]) -> None:
    """After fine-tuning (its checkpoint and placement written): the best search row's placement, learned.md,
    training.png, the comparison with the baselines (``trainer.compare``) and metrics.json, last; each file's name
    is appended to ``written`` once it is written."""
    from placement_rl.cli.place import costs_line, label_costs
    from placement_rl.report import training_curve

    graph, topology, costs, out = res.task.graph, res.task.topology, res.task.costs, output_dir()
    best = res.best("learned")
    if any(r.kind == "search" for r in res.rows):
        s = res.best("search")
        save_plan(s.devices, graph, topology, out / "search", costs=costs)
        metrics["search_step_time"] = s.step_time
        written.append("search/placement.json")
    md = learned_md(res, metrics["rows"], costs_line(costs))
    atomic_write_text(out / "learned.md", md)
    written.append("learned.md")
    refs = {r.label: r.step_time for r in res.rows if r.kind == "heuristic" and r.feasible}
    training_curve([(c, t, t) for c, t in res.curve], out / "training.png",
                   references=refs, title=f"fine-tuning on {graph.name} / {topology.name}")
    written.append("training.png")
    if cfg.trainer.compare:
        from placement_rl.cli.evaluate import compare_learned

        got = compare_learned(graph, costs, topology, out, label=f"learned: {best.label}", plan=plan,
                              step_time=best.step_time, feasible=best.feasible, seconds=best.seconds,
                              sim_calls=best.sim_calls, seed=int(cfg.seed), what="learned", files=written,
                              progress=bool(cfg.progress))
        label_costs(out, costs)
        metrics.update(got)
    write_json(out / "metrics.json", metrics)
    written.append("metrics.json")
    print(md.split("\n\n", 1)[1])  # the legend, the cost source, the note and the table


def learned_md(res, rows: list[dict], costs: str) -> str:
    """learned.md: the legend, the cost source (``costs``), fine-tuning's note where it left the weights unchanged,
    and the ``rows`` (``studies.finetune.describe``)."""
    from placement_rl.report import markdown_table

    legend = ("Learned rows are the policy's own output; search rows are searches (seeded by the policy, or the ones "
              "a user would run instead at a learned row's seconds); the rest are heuristics (`la_rule`: the argmin "
              "of the policy's own lookahead feature). `vs best one-pass`: step time over the best of HEFT, m-ETF, "
              "m-SCT and METIS (the list schedulers the policy was first measured against; `sim_eft` and `la_rule` "
              "are one-pass too). Sim calls and seconds: a heuristic's and a zero-shot row's are its own; every row "
              "after the zero-shot ones (fine-tuning, fine-tuned, the searches seeded by the policy, `learned + local "
              "search` too) counts all the learned work from the zero-shot evaluation on; a search at a learned "
              "row's seconds counts its own.")
    table = markdown_table(rows, ("row", "kind", "step_time_ms", "vs_best_one_pass", "feasible", "sim_calls",
                                  "seconds"),
                           ("row", "kind", "step time (ms)", "vs best one-pass", "feasible", "sim calls", "s"))
    g, topo = res.task.graph, res.task.topology
    return "\n\n".join([f"# Learned placement of {g.name} on {topo.name}", legend, costs,
                         *([f"note: {res.note}"] if res.note else []), table])


def _rollout_note(agent, steps: int) -> str:
    """What PPO runs of ``steps``: whole rollouts of ``n_envs x n_steps`` (SB3 rounds up; REINFORCE does not)."""
    roll = int(agent.n_envs) * int(agent.n_steps)
    if agent.algo == "reinforce" or steps % roll == 0:
        return ""
    return f" (run as {-(-steps // roll) * roll}: whole rollouts of n_envs x n_steps = {roll})"


def check_run_folder(cfg: DictConfig, out: Path) -> None:
    """Before any work: a folder holding an earlier run's results is refused (this run would replace some of its
    files and leave the others: one folder, two runs), unless the run continues from a checkpoint in it; and
    ``resume=true`` means continuing an unfinished ``trainer=pretrain`` run (it was ignored elsewhere, and said
    nothing where there was nothing to resume)."""
    from placement_rl.studies.pretrain import STATE

    pretrain = bool(cfg.trainer.get("pretrain"))
    if cfg.get("resume", False):
        if not pretrain:
            raise ConfigError("resume=true continues an unfinished trainer=pretrain run; to go on from a checkpoint "
                              "give checkpoint=<checkpoint.pt>")
        if not (out / STATE).is_dir():
            print(f"resume: {out} holds no unfinished pretraining ({STATE}/): starting a new run")
        return
    ckpt = cfg.get("checkpoint")
    if ckpt and Path(str(ckpt)).resolve().parent == out.resolve():
        return  # continuing from this folder's own checkpoint
    earlier = [f for f in ("checkpoint.pt", "metrics.json") if (out / f).is_file()]
    if earlier:
        raise ConfigError(f"{out} holds an earlier run ({', '.join(earlier)}): choose another hydra.run.dir or "
                          "remove those files" + (" (resume=true continues an unfinished pretraining)" if pretrain
                                                  else ""))


SEEN = "training_best"  # the folder of the best placement seen in training (not the policy's output)
SEEN_ROW = "best seen in training (exploration, not the policy's output)"


def run(cfg: DictConfig) -> dict:
    from placement_rl.agents.train import Trainer, final_plan
    from placement_rl.report import training_curve

    check_run_folder(cfg, output_dir())
    if cfg.trainer.get("pretrain"):
        return run_pretrain(cfg)
    note = workers_note(cfg)
    if note:
        print(note)
    if cfg.trainer.get("family"):
        return run_family(cfg)
    if str(cfg.env.id) == CONSTRUCTIVE_ENV:
        return run_constructive(cfg)
    if str(cfg.agent.get("algo")) == "constructive":
        raise ConfigError(f"env {cfg.env.id} is trained by agent=maskable_ppo|ppo|reinforce, not the constructive "
                          f"agent (the default): add agent=maskable_ppo")
    graph, topology = build_graph(cfg.graph), build_topology(cfg.topology)
    agent, encoder = make_specs(cfg)
    out = output_dir()
    tcfg = cfg.trainer
    print(f"training {agent.algo} + {encoder.name} on {cfg.env.id}: graph {graph.name} "
          f"({plural(graph.num_nodes, 'node')}), topology {topology.name} ({plural(topology.num_devices, 'device')}), "
          f"{int(tcfg.total_steps)} steps{_rollout_note(agent, int(tcfg.total_steps))}")
    trainer = Trainer(env_id=str(cfg.env.id), env_kwargs=env_kwargs(cfg, graph, topology), agent=agent,
                      encoder=encoder, seed=int(cfg.seed), config=to_container(cfg),
                      tensorboard_dir=str(out / "tb") if tcfg.tensorboard else None)
    if cfg.checkpoint:
        trainer.load_weights(str(cfg.checkpoint))
        print(f"resumed from {cfg.checkpoint} at step {trainer.num_timesteps}")
    trainer.learn(int(tcfg.total_steps), progress=bool(cfg.progress))
    trained_episodes = int(trainer.tracker.episodes)  # before the final rollouts add theirs
    if trained_episodes == 0:  # no reward reached the policy: its rows are an untrained policy's
        print(f"note: no training episode finished in {trainer.num_timesteps} steps (an episode of {cfg.env.id} takes "
              f"about one step per node or more; {graph.num_nodes} nodes): the policy saw no reward; raise "
              "trainer.total_steps or lower agent.n_envs (each env gets total_steps / n_envs steps)")
    # the best placement training evaluated (exploration included), before the final rollouts add theirs
    explored = (trainer.tracker.best_value, trainer.tracker.best_time, trainer.tracker.best_feasible)
    trainer.save(out / "checkpoint.pt")
    res = final_plan(trainer, samples=int(tcfg.eval_samples), seed=int(cfg.seed))
    best = res["policy"]  # the learned row: the policy's own output (greedy, or the best of it and its samples)
    plan, plan_file = save_plan(best["value"], graph, topology, out)
    tr = trainer.tracker
    seen = None  # the best placement evaluated during training (exploration included): a row of its own
    if explored[0] is not None and trained_episodes > 0:
        (out / SEEN).mkdir(exist_ok=True)
        seen_plan, seen_file = save_plan(explored[0], graph, topology, out / SEEN)
        seen = {"step_time": explored[1], "feasible": explored[2], "plan": seen_plan, "file": f"{SEEN}/{seen_file}"}
    single = tr.best_single_time
    state = getattr(trainer.unwrapped_env, "state", None)
    single_fits = bool(getattr(state, "best_single_feasible", True))
    costs = trainer.unwrapped_env.task.costs
    k = int(tcfg.eval_samples)
    policy_what = f"best of greedy + {plural(k, 'sample')}" if k > 0 else "greedy"
    metrics = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name, "env": str(cfg.env.id),
               "agent": agent.algo, "encoder": encoder.name, "seed": int(cfg.seed),
               "total_steps": trainer.num_timesteps, "episodes": tr.episodes, "training_episodes": trained_episodes,
               "sim_calls": tr.sim_calls,
               "train_seconds": trainer.train_seconds, "best_single_device_time": single,
               "step_time": best["step_time"], "feasible": best["feasible"], "plan_source": best["source"],
               # no speed-up where either does not fit memory (as evaluate's tables)
               "speedup_over_single_device": (single / best["step_time"] if best["step_time"] > 0 and best["feasible"]
                                              and single_fits else None),
               "policy_greedy_time": res["policy_greedy_time"],
               "policy_best_of_k_time": res["policy_best_of_k_time"],
               "cost_source": costs.describe_source(topology.device_names)}
    if seen is not None:
        metrics["best_seen_in_training"] = {"step_time": seen["step_time"], "feasible": seen["feasible"],
                                            "file": seen["file"]}
    refs = {"best single device": single}
    compared: list[str] = []
    if tcfg.compare:
        from placement_rl.cli.evaluate import ExtraRow, compare_learned
        from placement_rl.cli.place import label_costs

        before = [] if seen is None else [ExtraRow(SEEN_ROW, seen["step_time"], bool(seen["feasible"]),
                                                   trainer.train_seconds, tr.sim_calls, seen["plan"])]
        got = compare_learned(graph, costs, topology, out,
                              label=f"learned:{agent.algo}+{encoder.name} ({policy_what})", plan=plan,
                              step_time=best["step_time"], feasible=bool(best["feasible"]),
                              seconds=trainer.train_seconds, sim_calls=tr.sim_calls, seed=int(cfg.seed),
                              what="learned", files=compared, progress=bool(cfg.progress), learned=before)
        label_costs(out, costs)
        got.pop("best_single_device_time")
        metrics.update(got)
        if "best_baseline" in got:
            refs[f"best baseline ({got['best_baseline']})"] = got["best_baseline_time"]
    training_curve(tr.curve, out / "training.png", references=refs,
                   title=f"{agent.algo} + {encoder.name} on {graph.name} / {topology.name}")
    write_json(out / "metrics.json", metrics)
    from placement_rl.cli.place import costs_line

    speedup = metrics["speedup_over_single_device"]
    print(f"policy ({policy_what}) {best['step_time'] * 1e3:.3f} ms"
          + ("" if best["feasible"] else " (overflows memory)")
          + f", greedy {res['policy_greedy_time'] * 1e3:.3f} ms (single device {single * 1e3:.3f} ms"
          + ("" if single_fits else ", does not fit")
          + (f", speed-up {speedup:.3f}x)" if speedup is not None else ")")
          + (f"; {SEEN_ROW} {seen['step_time'] * 1e3:.3f} ms ({seen['file']})" if seen is not None else "")
          + (f"; best baseline {metrics['best_baseline']} {metrics['best_baseline_time'] * 1e3:.3f} ms"
             if "best_baseline" in metrics else ""))
    print(costs_line(costs))
    print(f"artifacts in {out}: " + ", ".join(["checkpoint.pt", "graph.json", plan_file, "metrics.json",
                                                *([seen["file"]] if seen is not None else []), "training.png",
                                                *compared] + (["tb/"] if tcfg.tensorboard else [])))
    return metrics


# files train may write in its run folder: a folder of such a name there is refused before training; SIGTERM
# (``timeout``, Slurm) ends a run as Ctrl-C does: exit code 130 and its interrupt line
main = hydra_app("train", writes=("checkpoint.pt", "metrics.json", "graph.json", "placement.json", "plan.json",
                                  "training.png"), sigterm=True)(run)
