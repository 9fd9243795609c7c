"""``placement-rl place``: zero-shot placement of a graph with a trained policy (no training)."""

from __future__ import annotations

import time

import numpy as np
from omegaconf import DictConfig, OmegaConf

from placement_rl.cli.common import (Phases, build_graph, build_topology, files_on_interrupt, hydra_app, output_dir,
                                     plural, save_plan, warm_up, write_json)
from placement_rl.cli.place_search import FOLDER
from placement_rl.cli.place_notes import (GRAPH_OPTIONS, ONE_PASS_NOTE, bound_note, coarse_groups, env_setup, fit_row,
                                         graph_options_note, overflow_note, said_on_signal, samples_note,
                                         samples_status, unrecorded_note)
from placement_rl.errors import ConfigError, PlanError

BEST = "best"  # the fastest placement that fits of all the run computed (``write_best``)
# every file place may write in its run folder (a StagePlan policy writes plan.json, others placement.json)
WRITES = ("graph.json", "placement.json", "plan.json", "metrics.json", "comparison.md", "comparison.csv",
          "speedup.png")
# and with them, what an earlier run in a folder given again may have left: removed before a run (``hydra_app``)
REPLACES = (*WRITES, "timeline_*.png", *(f"{sub}/{name}" for sub in ("search", "fit", "cp", FOLDER, BEST)
                                          for name in ("graph.json", "placement.json", "plan.json")),
            *(f"{FOLDER}/{name}" for name in ("trace.csv", "anytime.png")))


def _artifacts(out, plan_file: str, compared: list[str], searched: bool = False, cp: bool = False,
               fitted: bool = False, timed: list[str] = (), best: str | None = None) -> str:
    return f"artifacts in {out}: " + ", ".join(["graph.json", plan_file, "metrics.json", *([best] if best else []),
                                                *(["search/placement.json"] if searched else []), *timed,
                                                *(["fit/placement.json"] if fitted else []),
                                                *(["cp/placement.json"] if cp else []), *compared])


def write_best(found: dict[str, dict], graph, topology, out, costs) -> dict:
    """The fastest placement that fits memory of ``found`` (its source -> ``step_time``, ``feasible``, ``devices``:
    a device array, or a StagePlan; a tie goes to the first, the policy's) as ``best/placement.json`` (a stage plan:
    ``best/plan.json``) with ``save_plan``; returns metrics.json's ``best_step_time``, ``best_source`` and
    ``best_file`` (None, and nothing written, where none fits). A source is ``policy``, the folder that also holds
    it (``search``, ``policy_search``, ``fit``, ``cp``), ``<search> for <s> s`` (one run beside policy_search) or
    ``<name> (baseline)`` (a row of the comparison)."""
    fits = [(r["step_time"], k, name) for k, (name, r) in enumerate(found.items()) if r["feasible"]]
    if not fits:
        return {"best_step_time": None, "best_source": None, "best_file": None}
    step_time, _, name = min(fits)
    (out / BEST).mkdir(exist_ok=True)
    _, file = save_plan(found[name]["devices"], graph, topology, out / BEST, costs=costs)
    return {"best_step_time": step_time, "best_source": name, "best_file": f"{BEST}/{file}"}


def best_line(metrics: dict, plan_file: str) -> str | None:
    """One line where ``best/`` holds another placement than the policy's (``write_best``), else None."""
    source = metrics["best_source"]
    if source in (None, "policy"):
        return None
    own = f"{metrics['step_time'] * 1e3:.3f} ms" + ("" if metrics["feasible"] else ", overflowing memory")
    folder = "/" if source in ("search", FOLDER, "fit", "cp") else ""
    return (f"{metrics['best_file']}: the placement of {source}{folder} ({metrics['best_step_time'] * 1e3:.3f} ms), the "
            f"fastest that fits of this run's; {plan_file} stays the policy's own ({own})")


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


def sampled(policy, res, samples: int, seed: int, phases: Phases, *, kept: str):
    """``res`` with ``samples`` sampled placements (``with_samples``), announced where they take long
    (``samples_note``), with a line every 10 s; SIGINT or SIGTERM meanwhile ends the run at once with one line
    saying that ``kept`` (the file written before) holds the greedy placement (``said_on_signal``)."""
    import torch

    from placement_rl.agents.constructive_eval import with_samples

    line = samples_note(samples, res.greedy_seconds)
    if line is not None:
        print(line, flush=True)
    over = "" if bool(res.greedy.feasible[0]) else ", over memory"
    stopped = (f"interrupted in the samples: {kept} holds the greedy placement ({res.greedy_time * 1e3:.3f} ms"
               f"{over}); metrics.json not written")
    done = [0]  # placements finished so far, for the line every 10 s on a long run (512 devices, 10,000 nodes)
    with said_on_signal(stopped), phases(plural(samples, "sampled placement"),
                                         f"the greedy one took {res.greedy_seconds:.1f} s",
                                         status=lambda: samples_status(done[0], samples)) as note:
        res = with_samples(policy, res, samples, torch.Generator().manual_seed(seed),
                           done=lambda k: done.__setitem__(0, k))
        note.append(f"best {res.best_time * 1e3:.3f} ms")
    return res


def run_constructive(cfg: DictConfig, ckpt_path: str, written: list[str]) -> dict:
    """A constructive (schedule-aware) policy: greedy and best of ``samples`` sampled placements, each a row; each
    file's name is appended to ``written`` once it is written (a signal in the greedy pass ends the run at once,
    the earlier run's files put back: ``said_on_signal``)."""
    import torch

    from placement_rl.agents.constructive import placement_calls, state_window
    from placement_rl.agents.constructive_eval import greedy_result
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
    from placement_rl.agents.place_graph import finetuned_note

    note = finetuned_note(ckpt_path, tuned, f"{graph.name}@{topology.name}", "drop checkpoint=")  # after its costs
    if note:
        print(note)
    window = state_window(policy, graph.num_nodes)
    # greedy, then the samples (the same draws as evaluate(samples=k): the greedy decode draws nothing), so that
    # each phase reports when it starts and ends
    with said_on_signal("interrupted: no file written", restore=True), \
            phases(f"greedy placement (window {window})",  # minutes on 50,000 nodes: a line every 10 s
                   status=lambda: f"one pass over {plural(graph.num_nodes, 'node')} running") as note:
        res = greedy_result(policy, task)
        note.append(f"{res.greedy_time * 1e3:.3f} ms")
    out = output_dir()
    # the greedy placement is the run's plan until a faster one is found: a run stopped later keeps it
    t_write = time.perf_counter()
    plan, plan_file = save_plan(res.greedy.devices[0], graph, topology, out, costs=costs)
    written += ["graph.json", plan_file]
    t0 += time.perf_counter() - t_write  # writing it is not the policy's time
    if samples > 0:
        res = sampled(policy, res, samples, seed, phases, kept=f"{plan_file} in {out}")
    wall = time.perf_counter() - t0
    if res.best_index >= 0:  # a sample is faster than the greedy placement: the plan now
        plan, plan_file = save_plan(res.best_devices, graph, topology, out, costs=costs)
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
        written.append("search/placement.json")
        metrics["search"] = {k: v for k, v in search.items() if k != "devices"}
    timed, timed_files = None, []
    if search_seconds > 0:  # the policy-guided search for that many seconds (anytime), and the searches a user
        from placement_rl.cli import place_search  # would run instead at the same seconds: rows of their own

        timed = place_search.run_searches(policy, graph, costs, topology, task, search_seconds, seed=seed,
                                          compare=bool(cfg.compare), phases=phases, start=res.best_devices)
        timed_files = place_search.write(timed, graph, topology, out, search_seconds, learned=step_time,
                                         costs=costs)
        written += timed_files
        metrics["policy_search"] = place_search.metrics(timed)
    ran = {} if timed is None else place_search.done(timed)  # policy_search and the same-seconds searches that ran
    fitted = None
    if not fits:  # the plan over memory: its nodes moved off the full devices (``memory.fit``), a row of its own
        fitted = fit_row(graph, costs, topology, res.best_devices, seed)
        if fitted is not None:
            (out / "fit").mkdir(exist_ok=True)
            save_plan(fitted["devices"], graph, topology, out / "fit", costs=costs)
            written.append("fit/placement.json")
            metrics["fitted"] = {k: v for k, v in fitted.items() if k != "devices"}
    if cp_row is not None:
        (out / "cp").mkdir(exist_ok=True)
        save_plan(cp_row["devices"], graph, topology, out / "cp", costs=costs)
        written.append("cp/placement.json")
        metrics["cp_solution"] = {k: v for k, v in cp_row.items() if k != "devices"}
    # every placement the run holds, the policy's first (then the baselines', with compare)
    held = {"policy": {"step_time": step_time, "feasible": fits, "devices": res.best_devices},
            **({} if search is None else {"search": search}),
            **{n if n == "policy_search" else f"{n} for {search_seconds:g} s": r for n, r in ran.items()},
            **({} if fitted is None else {"fit": fitted}), **({} if cp_row is None else {"cp": cp_row})}
    first = len(written)  # the comparison's files follow (``compare_learned`` appends each as it writes it)
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
                                       sim_calls=calls, seed=seed, what="zero-shot placement", files=written,
                                       progress=phases.enabled, learned=greedy_row, after=searched, timed=same,
                                       found=held))
        label_costs(out, costs)
    compared = written[first:]
    metrics.update(write_best(held, graph, topology, out, costs))
    if metrics["best_file"]:
        written.append(metrics["best_file"])
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
    best = metrics["best_step_time"]  # the fastest that fits, if any
    print(bound_note(bound, step_time if best is None else best, fits=best is not None, groups=groups))
    if cp_row is not None:
        over = "" if cp_row["feasible"] else " (overflows memory: the model relaxes it)"
        print(f"CP-SAT's own placement (its own row, not the plan): {cp_row['step_time'] * 1e3:.3f} ms{over}"
              + (", at the bound: optimal" if cp_row["feasible"] and bound.gap(cp_row["step_time"]) < 5e-4 else ""))
    line = best_line(metrics, plan_file)
    if line is not None:
        print(line)
    print(_artifacts(out, plan_file, compared, searched=search is not None, cp=cp_row is not None,
                     fitted=fitted is not None, timed=timed_files, best=metrics["best_file"]))
    return metrics


def run(cfg: DictConfig) -> dict:
    """The command. A Ctrl-C or SIGTERM (``hydra_app(sigterm=True)``) once it wrote its plan keeps this run's files
    and names them, those not written and where the earlier run's files it replaced are (``files_on_interrupt``:
    put back beside this run's plan they would pass for its results); before, those come back."""
    written: list[str] = []  # the files written so far, in order
    with files_on_interrupt(written, planned(cfg)):
        return _place(cfg, written)


def planned(cfg: DictConfig) -> list[str]:
    """The files of a finished run that an interrupted one may not have written (shell patterns)."""
    return [*(["search/placement.json"] if float(cfg.get("search_budget", 0) or 0) > 0 else []),
            *([f"{FOLDER}/*"] if float(cfg.get("search_seconds", 0) or 0) > 0 else []),
            *(["comparison.*"] if cfg.compare else []), "metrics.json"]


def _place(cfg: DictConfig, written: list[str]) -> dict:
    """``run``'s work; each file's name is appended to ``written`` once it is written."""
    from placement_rl.agents.checkpoint import load_checkpoint
    from placement_rl.agents.rollout import load_policy_for, rollout
    from placement_rl.envs.warm_start import make_env

    if cfg.decode not in ("one_pass", "sequential"):
        raise ConfigError(f"decode is '{cfg.decode}': choose one_pass or sequential")
    if int(cfg.samples) < 0:
        raise ConfigError(f"samples must be >= 0, got {cfg.samples}")
    from placement_rl.cli.schema import check_not_files

    check_not_files(output_dir(), (BEST,), "place writes the fastest placement that fits")
    if not cfg.checkpoint:
        from placement_rl.agents.constructive_train import default_checkpoint

        return run_constructive(cfg, str(default_checkpoint()), written)
    ckpt = load_checkpoint(str(cfg.checkpoint))
    if ckpt.get("algo") == "constructive":
        return run_constructive(cfg, str(cfg.checkpoint), written)
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
    written += ["graph.json", plan_file]
    metrics = {"graph": graph.name, "nodes": graph.num_nodes, "topology": topology.name,
               **checkpoint_id(str(cfg.checkpoint)), "decode": cfg.decode, "samples": samples, "step_time": step_time,
               "feasible": not infeasible, "chosen": chosen, "sim_calls": calls, **({"start": start} if start else {}),
               "wall_seconds": wall, "cost_source": costs.describe_source(topology.device_names)}
    held = {"policy": {"step_time": step_time, "feasible": not infeasible, "devices": value}}
    first = len(written)  # the comparison's files follow
    if cfg.compare:
        from placement_rl.cli.evaluate import compare_learned

        metrics.update(compare_learned(graph, costs, topology, out, label="zero-shot policy", plan=plan,
                                       step_time=step_time, feasible=not infeasible, seconds=wall, sim_calls=calls,
                                       seed=int(cfg.seed), what="zero-shot placement", files=written,
                                       progress=phases.enabled, found=held))
        label_costs(out, costs)
    compared = written[first:]
    metrics.update(write_best(held, graph, topology, out, costs))
    if metrics["best_file"]:
        written.append(metrics["best_file"])
    write_json(out / "metrics.json", metrics)
    print(f"zero-shot placement of {graph.name} ({graph.num_nodes} nodes) on {topology.name}: "
          f"{step_time * 1e3:.3f} ms ({'feasible' if not infeasible else 'INFEASIBLE'}), {wall:.2f} s"
          + (f"; best baseline {metrics['best_baseline']} {metrics['best_baseline_time'] * 1e3:.3f} ms"
             if "best_baseline" in metrics else ""))
    print(costs_line(costs))
    line = best_line(metrics, plan_file)
    if line is not None:
        print(line)
    print(_artifacts(out, plan_file, compared, best=metrics["best_file"]))
    return metrics


main = hydra_app("place", writes=WRITES, replaces=REPLACES, sigterm=True)(run)
