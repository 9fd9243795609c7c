"""``placement-rl place``: zero-shot placement of a graph with a trained policy (no training)."""

from __future__ import annotations

import time

import numpy as np
from omegaconf import DictConfig, OmegaConf

from placement_rl.cli.common import (Phases, build_graph, build_topology, hydra_app, output_dir, plural, save_plan,
                                     warm_up, write_json)
from placement_rl.cli.place_search import FOLDER
from placement_rl.errors import ConfigError, PlanError

# every file place may write in its run folder (a StagePlan policy writes plan.json, others placement.json)
WRITES = ("graph.json", "placement.json", "plan.json", "metrics.json", "comparison.md", "comparison.csv",
          "speedup.png")
# and with them, what an earlier run in a folder given again may have left: removed before a run (``hydra_app``)
REPLACES = (*WRITES, "timeline_*.png", *(f"{sub}/{name}" for sub in ("search", "fit", "cp", FOLDER)
                                          for name in ("graph.json", "placement.json", "plan.json")),
            *(f"{FOLDER}/{name}" for name in ("trace.csv", "anytime.png")))


def _artifacts(out, plan_file: str, compared: list[str], searched: bool = False, cp: bool = False,
               fitted: bool = False, timed: list[str] = ()) -> str:
    return f"artifacts in {out}: " + ", ".join(["graph.json", plan_file, "metrics.json",
                                                *(["search/placement.json"] if searched else []), *timed,
                                                *(["fit/placement.json"] if fitted else []),
                                                *(["cp/placement.json"] if cp else []), *compared])


def costs_line(costs) -> str:
    """``costs: <source>, ...``: what priced the rows (as ``evaluate``'s header says it)."""
    return "costs: " + ", ".join(sorted(set(costs.source)))


def label_costs(out, costs, name: str = "comparison.md") -> None:
    """Put the ``costs: ...`` line under the title of ``out/name`` (written by ``compare_learned``)."""
    from placement_rl.graph.io import atomic_write_text

    path = out / name
    if path.is_file():
        title, _, rest = path.read_text().partition("\n\n")
        atomic_write_text(path, f"{title}\n\n{costs_line(costs)}\n\n{rest}")


def checkpoint_id(path: str) -> dict:
    """The checkpoint's identity, the same whatever the launcher: the shipped one as ``shipped:<its path in the
    package>`` (a Ray worker runs from a temporary copy of the package), any other as given; and its sha256."""
    import hashlib
    from pathlib import Path

    import placement_rl

    p, name = Path(path), str(path)
    package = Path(placement_rl.__file__).parent.resolve()
    if p.resolve().is_relative_to(package):
        name = "shipped:placement_rl/" + p.resolve().relative_to(package).as_posix()
    sha = hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.is_file() else None
    return {"checkpoint": name, "checkpoint_sha": sha}


def check_memory(graph, topology, costs) -> None:
    """``check_fits``'s refusal (the model's state exceeds all devices' memory together: no op-level placement
    fits), with where plans that split the batch or shard the state are found."""
    from placement_rl.cost.schedule import check_fits

    try:
        check_fits(graph, topology, costs)
    except PlanError as exc:
        raise PlanError(f"{exc}; stage plans that split the batch (micro-batches) or shard the state (FSDP) may "
                        "fit: `placement-rl evaluate suite=single` with this graph and topology lists them") from None


def run_constructive(cfg: DictConfig, ckpt_path: str) -> dict:
    """A constructive (schedule-aware) policy: greedy and best of ``samples`` sampled placements, each a row."""
    import torch

    from placement_rl.agents.constructive import placement_calls, state_window
    from placement_rl.agents.constructive_eval import greedy_result, with_samples
    from placement_rl.agents.constructive_train import load_policy
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.plans import Placement

    torch.set_num_threads(1)
    phases = Phases(bool(cfg.get("progress", True)))
    policy, _, data = load_policy(ckpt_path, strict=bool(cfg.get("strict_checkpoint", False)), log=print)
    for key in ("window", "full_window"):  # trade quality for seconds (typed by cli.schema: ints >= 0 or null)
        if cfg.get(key) is not None:
            setattr(policy, key, int(cfg.get(key)))
    graph, topology = build_graph(cfg.graph), build_topology(cfg.topology)
    from placement_rl.cost.limits import check_devices

    check_devices(topology)  # before the costs of every device are built
    tuned = data["config"].get("finetuned_on")  # a checkpoint ``train`` fine-tuned on one graph and cluster
    samples, seed = int(cfg.samples), int(cfg.seed)
    where = f"{graph.name} ({plural(graph.num_nodes, 'node')}) on {topology.name} " \
            f"({plural(topology.num_devices, 'device')})"
    budget = int(cfg.get("search_budget", 0) or 0)
    search_seconds = float(cfg.get("search_seconds", 0) or 0)
    bound_seconds = float(cfg.get("bound_seconds", 0) or 0)
    if bound_seconds > 0:
        from importlib.util import find_spec

        if find_spec("ortools") is None:
            raise ConfigError("bound_seconds > 0 needs OR-Tools for its CP-SAT bound: pip install "
                              "'placement-rl[exact]' (or set bound_seconds=0)")
    if budget > 0 or bound_seconds > 0 or search_seconds > 0:
        from placement_rl.cli.schema import check_not_files

        if search_seconds > 0:
            check_not_files(output_dir(), (FOLDER,), f"search_seconds={search_seconds:g} writes policy_search's "
                                                     "placement and traces")
        if budget > 0:
            check_not_files(output_dir(), ("search",), f"search_budget={budget} writes the search's placement")
        if bound_seconds > 0:
            check_not_files(output_dir(), ("cp",), f"bound_seconds={bound_seconds:g} writes CP-SAT's placement")
    warm_s = warm_up(policy)  # numba compiles on the first run after an install: not the placement's time
    t0 = time.perf_counter()
    with phases(f"costs and schedule state of {where}"):
        from placement_rl.cli.costs import build_costs

        graph, costs = build_costs(cfg, graph, topology)  # costs.path= (measured) or estimates
        check_memory(graph, topology, costs)
        task = ConstructiveTask.build(graph, topology, costs, teachers=False)
    if tuned and tuned != f"{graph.name}@{topology.name}":  # the names ``train`` recorded (after its costs)
        print(f"note: {ckpt_path} was fine-tuned on {tuned}, not {graph.name}@{topology.name}: a fine-tuned policy "
              f"places what it was fitted to and other graphs or clusters worse than the shipped one (drop "
              f"checkpoint= for that)")
    window = state_window(policy, graph.num_nodes)
    # greedy, then the samples (the same draws as evaluate(samples=k): the greedy decode draws nothing), so that
    # each phase reports when it starts and ends
    with phases(f"greedy placement (window {window})",  # minutes on 50,000 nodes: a line every 10 s
                status=lambda: f"one pass over {plural(graph.num_nodes, 'node')} running") as note:
        res = greedy_result(policy, task)
        note.append(f"{res.greedy_time * 1e3:.3f} ms")
    if samples > 0:
        done = [0]  # placements finished so far, for the line every 10 s on a long run (512 devices, 10,000 nodes)
        with phases(plural(samples, "sampled placement"), f"the greedy one took {res.greedy_seconds:.1f} s",
                    status=lambda: samples_status(done[0], samples)) as note:
            res = with_samples(policy, res, samples, torch.Generator().manual_seed(seed),
                               done=lambda k: done.__setitem__(0, k))
            note.append(f"best {res.best_time * 1e3:.3f} ms")
    wall = time.perf_counter() - t0
    # the plan is the fastest placement that fits memory (the greedy one when none does), and the metrics say so
    step_time, fits = res.best_time, res.best_feasible
    groups = coarse_groups(graph)
    what = ("lower bound on any placement's step time" if groups is None else
            f"lower bound on the step time of any placement of these {plural(groups, 'group')}") \
        + (f" (CP-SAT for {bound_seconds:g} s)" if bound_seconds else "")
    with phases(what) as note:  # how much any placement could still gain
        from placement_rl.baselines.bounds import lower_bound

        bound = lower_bound(graph, costs, topology, cp_seconds=bound_seconds, cp_start=res.best_devices)
        note.append(f"{bound.value * 1e3:.3f} ms")
    if bound.cp_note:  # CP-SAT ran out of seconds building its model, or proved and found nothing in them
        print(bound.cp_note + ("" if bound.cp_placement is not None else ": no cp/ placement written"))
    cp_row = None
    if bound.cp_placement is not None:  # CP-SAT's own solution: a search row of its own, never the plan
        from placement_rl.baselines.common import Problem

        sc = Problem(graph, costs, topology, budget=2, seed=seed).score(np.asarray(bound.cp_placement))
        cp_row = {"step_time": float(sc.step_time), "feasible": bool(sc.feasible), "seconds": bound_seconds,
                  "devices": np.asarray(bound.cp_placement)}
    chosen = res.best_label  # greedy, greedy on links x slower (the first samples), or sample k
    out = output_dir()
    plan, plan_file = save_plan(res.best_devices, graph, topology, out, costs=costs)
    # every placement's simulator calls: N x D + 1 with the whole-graph window (its completions), else 1
    calls = placement_calls(policy, task) * (1 + samples)
    metrics = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name, **checkpoint_id(ckpt_path),
               "policy": "constructive", "window": window, "finetuned_on": tuned,
               "samples": samples, "greedy_step_time": res.greedy_time,
               "best_of_k_step_time": res.best_time, "step_time": step_time, "chosen": chosen,
               "feasible": fits, "sim_calls": calls, "wall_seconds": wall,
               "warm_up_seconds": warm_s, "lower_bound": bound.value, "lower_bound_parts": bound.parts,
               "cost_source": costs.describe_source(topology.device_names)}
    search = None
    if budget > 0:
        from placement_rl.baselines.search import refine

        with phases(f"local search from the learned placement ({budget} more simulator calls)") as note:
            t1 = time.perf_counter()
            p = refine(graph, costs, topology, res.best_devices, budget=budget, seed=seed)  # meta: its best's score
            search = {"step_time": float(p.meta["step_time"]), "feasible": bool(p.meta["feasible"]),
                      "sim_calls": calls + int(p.meta.get("sim_calls", budget)),
                      "seconds": wall + time.perf_counter() - t1, "devices": np.asarray(p.device_of_node)}
            note.append(f"{search['step_time'] * 1e3:.3f} ms")
        (out / "search").mkdir(exist_ok=True)
        save_plan(search["devices"], graph, topology, out / "search", costs=costs)
        metrics["search"] = {k: v for k, v in search.items() if k != "devices"}
    timed, timed_files = None, []
    if search_seconds > 0:  # the policy-guided search for that many seconds (anytime), and the searches a user
        from placement_rl.cli import place_search  # would run instead at the same seconds: rows of their own

        timed = place_search.run_searches(policy, graph, costs, topology, task, search_seconds, seed=seed,
                                          compare=bool(cfg.compare), phases=phases)
        timed_files = place_search.write(timed, graph, topology, out, search_seconds, learned=step_time,
                                         costs=costs)
        metrics["policy_search"] = place_search.metrics(timed)
    ran = {} if timed is None else place_search.done(timed)  # policy_search and the same-seconds searches that ran
    fitted = None
    if not fits:  # the plan over memory: its nodes moved off the full devices (``memory.fit``), a row of its own
        fitted = fit_row(graph, costs, topology, res.best_devices, seed)
        if fitted is not None:
            (out / "fit").mkdir(exist_ok=True)
            save_plan(fitted["devices"], graph, topology, out / "fit", costs=costs)
            metrics["fitted"] = {k: v for k, v in fitted.items() if k != "devices"}
    if cp_row is not None:
        (out / "cp").mkdir(exist_ok=True)
        save_plan(cp_row["devices"], graph, topology, out / "cp", costs=costs)
        metrics["cp_solution"] = {k: v for k, v in cp_row.items() if k != "devices"}
    compared: list[str] = []
    if cfg.compare:
        from placement_rl.cli.evaluate import ExtraRow, compare_learned

        one = placement_calls(policy, task)
        greedy_row = [ExtraRow("zero-shot policy (greedy)", res.greedy_time, bool(res.greedy.feasible[0]),
                               res.greedy_seconds, one, Placement(res.greedy.devices[0]))] if samples > 0 else []
        label = f"zero-shot policy (best of greedy + {plural(samples, 'sample')})" if samples > 0 else \
            "zero-shot policy (greedy)"
        searched = [] if search is None else [ExtraRow(
            "search: local search from the learned placement", search["step_time"], search["feasible"],
            search["seconds"], search["sim_calls"], Placement(search["devices"]))]
        same = [ExtraRow(f"search: {name} for {search_seconds:g} s", r["step_time"], r["feasible"], r["seconds"],
                         r["sim_calls"], Placement(r["devices"])) for name, r in ran.items()]
        metrics.update(compare_learned(graph, costs, topology, out, label=label, plan=plan,
                                       step_time=step_time, feasible=metrics["feasible"], seconds=wall,
                                       sim_calls=calls, seed=seed, what="zero-shot placement", files=compared,
                                       progress=phases.enabled, learned=greedy_row, after=searched, timed=same))
        label_costs(out, costs)
    write_json(out / "metrics.json", metrics)
    found = (f"best of {plural(samples, 'sample')} {res.best_time * 1e3:.3f} ms" if samples > 0
             else "no samples (samples=0: greedy only)")
    if search is not None:
        print(f"local search from the learned placement: {search['step_time'] * 1e3:.3f} ms "
              f"({search['sim_calls']} simulator calls in all" + ("; the baselines had the same)" if cfg.compare
                                                                   else ")"))
    if timed is not None:
        print(place_search.summary(timed))
    teacher = metrics.get("heuristics", {}).get("eft_rollout")
    over = "" if bool(res.greedy.feasible[0]) else " (overflows memory)"
    print(f"zero-shot placement of {where}, {wall:.2f} s: greedy {res.greedy_time * 1e3:.3f} ms{over}, {found}"
          + (f"; eft_rollout (the teacher) {teacher['step_time'] * 1e3:.3f} ms in {teacher['seconds']:.2f} s"
             if teacher else "")
          + (f"; best baseline {metrics['best_baseline']} {metrics['best_baseline_time'] * 1e3:.3f} ms"
             if "best_baseline" in metrics else ""))
    print(costs_line(costs))
    if not fits:
        print(overflow_note(graph, costs, topology, res.best_devices, samples, searched=search, fitted=fitted,
                            policy_searched=None if timed is None else timed["policy_search"]))
    found = [r["step_time"] for r in [search, *ran.values()] if r is not None and r["feasible"]]
    best = min([step_time, *found]) if fits else min(found, default=step_time)  # the fastest that fits, if any
    print(bound_note(bound, best, fits=fits or bool(found), groups=groups))
    if cp_row is not None:
        over = "" if cp_row["feasible"] else " (overflows memory: the model relaxes it)"
        print(f"CP-SAT's own placement (its own row, not the plan): {cp_row['step_time'] * 1e3:.3f} ms{over}"
              + (", at the bound: optimal" if cp_row["feasible"] and bound.gap(cp_row["step_time"]) < 5e-4 else ""))
    print(_artifacts(out, plan_file, compared, searched=search is not None, cp=cp_row is not None,
                     fitted=fitted is not None, timed=timed_files))
    return metrics


def samples_status(done: int, samples: int) -> str:
    """``0 of 16 done (the 5 on slower links decoded together)``: each part of ``with_samples`` is one batched
    decode, counted when it ends."""
    from placement_rl.baselines.eft import LINK_SCALES

    scaled = min(samples, len(LINK_SCALES))
    part = (f"the {scaled} on slower links" if done < scaled else f"the {samples - scaled} drawn ones")
    return f"{done} of {samples} done" + (f" ({part} decoded together)" if done < samples else "")


def coarse_groups(graph) -> int | None:
    """The number of groups when ``graph`` is a coarsened one (its nodes group more ops than it has nodes), else
    None: a bound on placing it bounds placements of those groups, not of the ops."""
    source = (graph.meta.get("coarsen") or {}).get("source_nodes", 0)
    return graph.num_nodes if graph.members is not None and int(source) > graph.num_nodes else None


def bound_note(bound, step_time: float, fits: bool = True, groups: int | None = None) -> str:
    """One line: no placement is faster than the bound (which part gives it), and how far the plan is above it
    (``fits`` false: the plan overflows memory, which the bound sets aside; ``groups``: the graph placed is
    coarsened into that many groups, and the bound holds for placements of those)."""
    part = max(bound.parts, key=bound.parts.get)
    gap = bound.gap(step_time)
    which = "no placement" if groups is None else f"no placement of these {plural(groups, 'group')}"
    return (f"lower bound {bound.value * 1e3:.3f} ms ({which} is faster; from its {part} part): the plan is "
            + ("at the bound" if gap < 5e-4 else f"{gap:.1%} above it, at most {1 - 1 / (1 + gap):.1%} to gain")
            + (" (the bound sets memory aside: where memory is tight no placement may come near it)" if fits and
               gap >= 5e-4 else "" if fits else " (memory aside: the bound does not count it, and the plan does "
                                                 "not fit)"))


def fit_row(graph, costs, topology, devices, seed: int) -> dict | None:
    """The plan with nodes moved off the devices over memory (``baselines.memory.fit``: no simulator call but the
    one that scores it), or None when that does not make it fit."""
    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.memory import fit

    t0 = time.perf_counter()
    prob = Problem(graph, costs, topology, budget=1, seed=seed)
    dev, over = fit(prob, np.asarray(devices, dtype=np.int64))
    if over > 0.0:
        return None
    sc = prob.score(dev)
    return {"step_time": float(sc.step_time), "feasible": bool(sc.feasible), "moved": int((dev != devices).sum()),
            "seconds": time.perf_counter() - t0, "devices": dev}


def overflow_note(graph, costs, topology, devices, samples: int, *, searched: dict | None,
                  fitted: dict | None = None, policy_searched: dict | None = None) -> str:
    """One line for a written placement that does not fit memory: by how much, on which devices, what to do."""
    from placement_rl.cost import simulate
    from placement_rl.errors import fmt_bytes

    peak, cap = simulate(graph, costs, topology, devices).peak_memory, topology.array("memory_bytes")
    over = [f"{topology.device_names[d]} {fmt_bytes(peak[d])} of {fmt_bytes(cap[d])}"
            for d in np.flatnonzero(peak > cap)]
    which = "the greedy placement" + (f" and its {plural(samples, 'sample')}" if samples > 0 else "")
    alone = too_big_node(graph, costs, topology)
    if alone is not None:  # nothing op-level can fit: no search or move helps
        name, need, most = alone
        return (f"warning: {which} {_verb(samples)} memory ({', '.join(over)}), and no op-level placement fits: "
                f"node '{name}' alone pins {fmt_bytes(need)} and the largest device holds {fmt_bytes(most)}; shard it "
                "(the FSDP and tensor-parallel stage plans of `placement-rl evaluate suite=single` with this graph and "
                "topology) or give the devices more memory")
    fix = ("the search from it fits (search/placement.json)" if searched and searched["feasible"] else
           "policy_search's placement fits (policy_search/placement.json)" if policy_searched
           and policy_searched["feasible"] else
           "search_seconds=<s> or search_budget=<calls> runs a search that repairs memory first, or give the devices "
           "more memory")
    if fitted is not None:
        fix = (f"with {plural(fitted['moved'], 'node')} moved it fits at {fitted['step_time'] * 1e3:.3f} ms "
               f"(fit/placement.json); " + fix)
    return f"warning: {which} {_verb(samples)} memory ({', '.join(over)}); placement.json holds the greedy one: {fix}"


def _verb(samples: int) -> str:
    return "overflow" if samples > 0 else "overflows"


def too_big_node(graph, costs, topology) -> tuple[str, float, float] | None:
    """``(name, bytes, largest capacity)`` of the node that pins the most memory when that alone is more than
    any device holds (then no op-level placement fits), else None."""
    from placement_rl.cost.memory import pinned_memory

    mem = pinned_memory(graph, costs)  # what each placer counts a node to pin (``Problem.node_mem``)
    most = float(topology.array("memory_bytes").max())
    v = int(np.argmax(mem)) if len(mem) else 0
    return (graph.names[v], float(mem[v]), most) if len(mem) and mem[v] > most else None


# decode=one_pass embeds the graph once (agents.rollout.zero_shot_place); training scored step-by-step rollouts
ONE_PASS_NOTE = ("note: decode=one_pass embeds the graph once and places every node from that, an approximation of "
                 "this PlacementEnv policy; decode=sequential replays its step-by-step rollout: on the graph and "
                 "topology it trained on, the greedy placement training scored (policy_greedy_time in train's "
                 "metrics.json), as place runs the env with the options the checkpoint records and starts where "
                 "training's next episode would have")
# the env options a checkpoint records that place sets itself: the observation's padding
LAYOUT_OPTIONS = ("max_nodes", "max_edges", "max_devices", "op_type_buckets")
# and those tied to the graph trained on (``envs.pipeline.PipelineConfig``): its batch, the micro-batches that
# divide it, a TP degree its split sizes allow; on another graph the env takes that graph's (and chooses the rest)
GRAPH_OPTIONS = ("batch_size", "num_microbatches", "tp")


def same_graph(config: dict, graph, graph_cfg: dict | None) -> bool:
    """Whether ``graph`` is the one training ran on: its fingerprint against the one the checkpoint records (a
    graph file edited since, or a zoo model captured at another batch, differs), else (an earlier checkpoint)
    its graph config against training's."""
    recorded = config.get("graph_fingerprint")
    if recorded is not None:
        return recorded == graph.fingerprint()
    return graph_cfg is not None and graph_cfg == config.get("graph")


def env_setup(ckpt: dict, graph, topology, graph_cfg: dict | None = None) -> tuple[dict, str | None]:
    """``(env options, start)``: the options the checkpoint records (less the padding, which place sets, and less
    ``GRAPH_OPTIONS`` unless ``graph`` is the one training ran on: ``same_graph``), with
    ``start_devices`` where it records the start of a warm-started ``PlacementEnv`` (``envs.warm_start``) on this
    graph and topology; ``start`` says where a ``PlacementEnv``'s episodes start (None for the other envs)."""
    from placement_rl.envs.warm_start import STARTS

    config = ckpt["config"]
    opts = {k: v for k, v in (config.get("env_options") or {}).items() if k not in LAYOUT_OPTIONS}
    if not same_graph(config, graph, graph_cfg):
        opts = {k: v for k, v in opts.items() if k not in GRAPH_OPTIONS}
    if not config["env_id"].startswith("placement_rl/PlacementEnv"):
        return opts, None
    if "env_options" not in config:
        return opts, "initial_placement=best_single (the env's default: the checkpoint records no env options)"
    ip = str(opts.get("initial_placement", "best_single"))
    rec = config.get("start")
    if ip in STARTS and rec and rec["graph"] == graph.fingerprint() and rec["topology"] == topology.name \
            and rec.get("num_devices") == topology.num_devices and len(rec["devices"]) == graph.num_nodes:
        opts["start_devices"] = list(rec["devices"])
        return opts, f"initial_placement={ip}: the placement training recorded on this graph and topology"
    return opts, f"initial_placement={ip}" + (": the best cheap heuristic's placement" if ip in STARTS else "")


def graph_options_note(path: str, left: dict, graph) -> str:
    """One line: the options of training's graph that place leaves out on this one, and the batch it runs at."""
    from placement_rl.plans import graph_batch_size

    batch = graph_batch_size(graph)
    chosen = [name for key, name in (("num_microbatches", "the micro-batch count"), ("tp", "the TP degree"))
              if key in left]
    return (f"note: {path} was trained with {', '.join(f'{k}={v}' for k, v in left.items())}, options of the "
            f"graph it trained on: {graph.name} is planned "
            + (f"at its own batch ({batch})" if batch else "with no batch size (it records none)")
            + ", as the baselines are" + (f", and the policy chooses {' and '.join(chosen)}" if chosen else ""))


def unrecorded_note(path: str) -> str:
    return (f"note: {path} records no env options (an earlier release wrote it): the env runs with its defaults "
            "(PlacementEnv: every node starts on the best single device), which may not be training's, so a "
            "sequential rollout may not be the one training scored")


def run(cfg: DictConfig) -> dict:
    from placement_rl.agents.checkpoint import load_checkpoint
    from placement_rl.agents.rollout import load_policy_for, rollout
    from placement_rl.envs.warm_start import make_env

    if cfg.decode not in ("one_pass", "sequential"):
        raise ConfigError(f"decode is '{cfg.decode}': choose one_pass or sequential")
    if int(cfg.samples) < 0:
        raise ConfigError(f"samples must be >= 0, got {cfg.samples}")
    if not cfg.checkpoint:
        from placement_rl.agents.constructive_train import default_checkpoint

        return run_constructive(cfg, str(default_checkpoint()))
    ckpt = load_checkpoint(str(cfg.checkpoint))
    if ckpt.get("algo") == "constructive":
        return run_constructive(cfg, str(cfg.checkpoint))
    for key in ("search_budget", "search_seconds", "bound_seconds"):
        if float(cfg.get(key, 0) or 0) > 0:
            raise ConfigError(f"{key} applies to the constructive policy's placements; {cfg.checkpoint} is a "
                              f"{ckpt.get('algo', 'PlacementEnv')} checkpoint (set {key}=0)")
    phases = Phases(bool(cfg.get("progress", True)))
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
    opts, start = env_setup(ckpt, graph, topology, OmegaConf.to_container(cfg.graph, resolve=True))
    if "env_options" not in ckpt["config"]:
        print(unrecorded_note(str(cfg.checkpoint)))
    left = {k: v for k, v in (ckpt["config"].get("env_options") or {}).items()
            if k in GRAPH_OPTIONS and k not in opts and v is not None}  # training's graph's, not this one's
    if left:
        print(graph_options_note(str(cfg.checkpoint), left, graph))
    env = make_env(env_id, {"graph": graph, "topology": topology, **opts, "max_devices": obs_cfg["max_devices"],
                            "op_type_buckets": obs_cfg["op_type_buckets"], "max_nodes": graph.num_nodes})
    policy = load_policy_for(env, ckpt["policy"], enc_kwargs)
    rng = np.random.default_rng(int(cfg.seed))
    samples = int(cfg.samples)
    if cfg.decode == "one_pass" and not pipeline:
        from placement_rl.agents.rollout import zero_shot_place

        with phases(f"{cfg.decode} decode of {graph.name} ({plural(graph.num_nodes, 'node')}), greedy and "
                    f"{plural(samples, 'sample')}"):
            res = zero_shot_place(policy, env, samples=samples, seed=int(cfg.seed))
        infeasible, step_time, value, calls = not res.feasible, res.step_time, res.device_of_node, res.sim_calls
        calls += int(env.unwrapped.state.extra.get("start_calls", 0))  # a warm start's heuristics
        chosen = res.chosen
        print(ONE_PASS_NOTE)
    else:
        def episode(k: int) -> tuple[bool, float, int, object]:  # k = 0: greedy
            info = rollout(policy, env, deterministic=(k == 0), rng=rng, seed=int(cfg.seed) + k)
            return (not bool(info.get("feasible", True)), float(info["step_time"]), k,
                    info.get("plan", info.get("placement")))

        with phases(f"greedy rollout of {graph.name} ({plural(graph.num_nodes, 'node')})"):
            results = [episode(0)]
        if samples > 0:
            with phases(f"{plural(samples, 'sampled rollout')}"):
                results += [episode(k) for k in range(1, samples + 1)]
        infeasible, step_time, k, value = min(results, key=lambda r: (r[0], r[1]))
        st = env.unwrapped.state
        calls = int(getattr(st.source, "calls", samples + 1)) + int(st.extra.get("start_calls", 0))
        chosen = "greedy" if k == 0 else f"sample {k}"
    costs = env.unwrapped.task.costs
    wall = time.perf_counter() - t0
    out = output_dir()
    plan, plan_file = save_plan(value, graph, topology, out, costs=costs)
    metrics = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name,
               **checkpoint_id(str(cfg.checkpoint)), "decode": cfg.decode, "samples": samples, "step_time": step_time,
               "feasible": not infeasible, "chosen": chosen, "sim_calls": calls, **({"start": start} if start else {}),
               "wall_seconds": wall, "cost_source": costs.describe_source(topology.device_names)}
    compared: list[str] = []
    if cfg.compare:
        from placement_rl.cli.evaluate import compare_learned

        metrics.update(compare_learned(graph, costs, topology, out, label="zero-shot policy", plan=plan,
                                       step_time=step_time, feasible=not infeasible, seconds=wall, sim_calls=calls,
                                       seed=int(cfg.seed), what="zero-shot placement", files=compared,
                                       progress=phases.enabled))
        label_costs(out, costs)
    write_json(out / "metrics.json", metrics)
    print(f"zero-shot placement of {graph.name} ({graph.num_nodes} nodes) on {topology.name}: "
          f"{step_time * 1e3:.3f} ms ({'feasible' if not infeasible else 'INFEASIBLE'}), {wall:.2f} s"
          + (f"; best baseline {metrics['best_baseline']} {metrics['best_baseline_time'] * 1e3:.3f} ms"
             if "best_baseline" in metrics else ""))
    print(costs_line(costs))
    print(_artifacts(out, plan_file, compared))
    return metrics


main = hydra_app("place", writes=WRITES, replaces=REPLACES)(run)
