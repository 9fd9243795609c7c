"""Pretraining a general constructive placement policy: task building, the training run, its reports.

The pairs it trains on and is judged on are ``placement_rl.studies.splits`` (training distribution, the dev split
for every choice, the former test split now a second dev split, the fresh test split for the final figures);
its names are re-exported here. ``build_tasks`` captures / samples the graphs, resolves costs and runs the
teachers (one job per spec on ``placement_rl.scale``); ``pretrain`` runs imitation, then (as configured) policy
iteration, expert iteration with search as the teacher and RL, and writes checkpoints and reports.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from placement_rl.envs.constructive_task import ConstructiveTask, best_of
from placement_rl.cost import resolve_costs
from placement_rl.errors import ConfigError
from placement_rl.scale import Workers

from placement_rl.studies.splits import (HELDOUT_TOPOLOGIES, HELDOUT_ZOO, SPLITS, TEST_TOPOLOGIES,  # noqa: F401
                                         TEST_ZOO, TRAIN_FAMILIES, TRAIN_ZOO, comm_ratio, fresh_test_specs,
                                         graph_of as _graph, heldout_specs, split_specs, test_specs,
                                         topology_of as _topology, training_specs)


TEACHER_CODE = tuple(f"placement_rl/cost/{m}.py" for m in ("_op_kernel", "schedule", "window", "decode", "lookahead",
                                                            "features", "episodes", "simulate", "memory")) + tuple(
    f"placement_rl/baselines/{m}.py" for m in ("eft", "heft", "baechi", "metis", "common", "memory")) + (
    "envs/constructive_task.py", "placement_rl/studies/splits.py")  # what a built task's figures depend on (with
# the cost model's hash and the fits, ``agents.checkpoint.provenance``)


def build_task(spec: dict[str, Any], *, teachers: bool = True) -> ConstructiveTask | None:
    """The task of one spec (``None`` when the graph cannot fit the drawn cluster's memory at all)."""
    import torch

    torch.set_num_threads(1)
    graph, topo = _graph(spec["graph"]), _topology(spec["topology"])
    from placement_rl.cost.schedule import check_fits
    from placement_rl.errors import PlanError

    try:
        check_fits(graph, topo)
    except PlanError:
        return None
    costs = resolve_costs(graph, topo)
    return ConstructiveTask.build(graph, topo, costs, teachers=teachers, id=spec.get("id", graph.name),
                                  comm_ratio=comm_ratio(graph, costs))


def build_tasks(specs: Sequence[dict[str, Any]], *, workers: int | str | Workers = 1, address: str | None = None,
                progress: Callable[[int, int], None] | None = None,
                cache: str | Path | None = None) -> list[ConstructiveTask]:
    """Build every spec's task (teachers included), one job per spec on ``workers`` (``placement_rl.scale``: 1 in
    this process, N or ``auto`` on Ray, ``address`` a cluster); tasks that cannot fit are dropped. With
    ``cache`` (a directory), the built tasks are kept there keyed by the specs and reused (a local cache
    of this machine's own results, pickled: never load one from elsewhere)."""
    if cache is not None:
        import hashlib
        import json
        import pickle

        from placement_rl.agents.checkpoint import provenance

        from placement_rl.topology import conf_dir

        prov = provenance()  # the cost model's code and fits: a cache entry is only reused under the same rewards
        presets = sorted({s["topology"] for s in specs if isinstance(s.get("topology"), str)})
        topo = {n: hashlib.sha256(f.read_bytes()).hexdigest()[:16]  # and the same preset files (their figures)
                for n in presets if (f := conf_dir() / "topology" / f"{n}.yaml").is_file()}
        from placement_rl.results import source_digest

        teachers = source_digest(*TEACHER_CODE)  # and the code that built the tasks and their teachers
        key = hashlib.sha256(json.dumps([list(specs), prov["cost_model_sha"], prov["fits_sha"], topo, teachers],
                                        sort_keys=True).encode()).hexdigest()[:16]
        path = Path(cache) / f"tasks-{key}.pkl"
        if path.is_file():
            with open(path, "rb") as fh:
                return pickle.load(fh)
        tasks = build_tasks(specs, workers=workers, address=address, progress=progress)
        for t in tasks:
            t.meta = {k: v for k, v in t.meta.items() if isinstance(k, str) and k != "tensors"}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(tasks, fh)
        tmp.replace(path)
        return tasks
    cost = [float((s["graph"].get("num_nodes") or 200) ** 2) for s in specs]  # teachers: O(N^2 D)
    if isinstance(workers, Workers):
        built = workers.map(build_task, specs, progress=progress, cost=cost)
    else:
        with Workers(workers, address=address) as pool:
            built = pool.map(build_task, specs, progress=progress, cost=cost)
    return [t for t in built if t is not None]


# ----------------------------------------------------------------------------------------------- pretraining
@dataclass(frozen=True, kw_only=True)
class PretrainSpec:
    """What ``pretrain`` trains on and how it is judged; the defaults are ``conf/trainer/pretrain.yaml``'s."""

    train_tasks: int = 300
    val_tasks: int = 48  # early stopping (drawn from the training distribution, other seeds)
    sizes: tuple[int, int] = (16, 1000)
    devices: tuple[int, int] = (2, 16)
    zoo_frac: float = 0.15
    dev: bool = True  # evaluate on the dev split (``heldout_specs``) at the end
    seed: int = 0  # the training tasks' draw
    cache: str | None = None  # directory keeping built tasks between runs (``build_tasks``)

    def __post_init__(self) -> None:
        if self.train_tasks < 1 or self.val_tasks < 0:
            raise ConfigError(f"train_tasks must be >= 1 and val_tasks >= 0, got {self.train_tasks}, {self.val_tasks}")
        for name in ("sizes", "devices"):  # [lo, hi]: two integers (a one-element list was a traceback)
            v = getattr(self, name)
            if not (isinstance(v, (list, tuple)) and len(v) == 2
                    and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v)):
                raise ConfigError(f"{name} must be [lo, hi], two integers, got "
                                  f"{list(v) if isinstance(v, (list, tuple)) else v!r}")
        lo, hi = self.sizes
        if not 3 <= lo <= hi:
            raise ConfigError(f"sizes must be [lo, hi] with 3 <= lo <= hi, got {list(self.sizes)}")
        dlo, dhi = self.devices
        if not 1 <= dlo <= dhi <= 64:
            raise ConfigError(f"devices must be [lo, hi] with 1 <= lo <= hi <= 64, got {list(self.devices)}")


def result_rows(results: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per evaluated task: the learned rows (greedy, best of k) and every heuristic, as ratios to the
    best one-pass heuristic (min of HEFT, m-ETF, m-SCT, METIS)."""
    from placement_rl.agents.constructive import episode_calls

    rows = []
    for r in results:
        t = r.task
        ref_name, ref = best_of(t.refs)
        k = 0 if r.sampled is None else len(r.sampled.times)
        per = episode_calls(t)  # a window over the whole graph: N x D completions per episode
        row = {"pair": t.meta.get("id", t.graph.name), "nodes": t.graph.num_nodes, "devices": t.topology.num_devices,
               "best_one_pass": ref_name, "best_one_pass_ms": ref * 1e3,
               "greedy": r.greedy_time / ref if bool(r.greedy.feasible[0]) else float("nan"),
               "best_of_k": r.best_time / ref, "greedy_s": r.greedy_seconds,
               "greedy_calls": per, "best_of_k_s": r.greedy_seconds + r.sampled_seconds,
               "best_of_k_calls": per * (1 + k)}
        for name, (time_, feasible, _) in t.refs.items():
            row[name] = time_ / ref if feasible else float("nan")
        for name in ("sim_eft", "eft_rollout", "la_rule"):
            if name in t.meta.get("ref_seconds", {}):
                row[f"{name}_s"] = t.meta["ref_seconds"][name]
                row[f"{name}_calls"] = t.meta["ref_calls"][name]
        rows.append(row)
    return rows


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    from placement_rl.agents.constructive_eval import geomean

    g = [r["greedy"] for r in rows]
    b = [r["best_of_k"] for r in rows]
    out = {"pairs": len(rows), "greedy_geomean": geomean(g), "best_of_k_geomean": geomean(b),
           "greedy_le_1_frac": float(np.mean([x <= 1.0 + 1e-9 for x in g])) if g else float("nan"),
           "greedy_lt_1_frac": float(np.mean([x < 1.0 - 1e-9 for x in g])) if g else float("nan")}
    if rows and "sim_eft" in rows[0]:
        out["sim_eft_geomean"] = geomean([r["sim_eft"] for r in rows])
        out["greedy_over_sim_eft_geomean"] = geomean([r["greedy"] / r["sim_eft"] for r in rows])
    rule = [r for r in rows if np.isfinite(r.get("la_rule", float("nan")))]
    if rule:  # the one-pass rule the policy's lookahead feature is: the bar a learned row must clear
        out["la_rule_pairs"] = len(rule)
        out["greedy_over_la_rule_geomean"] = geomean([r["greedy"] / r["la_rule"] for r in rule])
        out["best_of_k_over_la_rule_geomean"] = geomean([r["best_of_k"] / r["la_rule"] for r in rule])
        out["greedy_le_la_rule_frac"] = float(np.mean([r["greedy"] <= r["la_rule"] + 1e-9 for r in rule]))
    roll = [r for r in rows if np.isfinite(r.get("eft_rollout", float("nan")))]
    if roll:
        out["eft_rollout_pairs"] = len(roll)
        out["eft_rollout_geomean"] = geomean([r["eft_rollout"] for r in roll])
        out["greedy_over_eft_rollout_geomean"] = geomean([r["greedy"] / r["eft_rollout"] for r in roll])
        out["best_of_k_over_eft_rollout_geomean"] = geomean([r["best_of_k"] / r["eft_rollout"] for r in roll])
        out["greedy_le_eft_rollout_frac"] = float(np.mean([r["greedy"] <= r["eft_rollout"] + 1e-9 for r in roll]))
    for key in ("greedy_s", "best_of_k_s", "eft_rollout_s", "greedy_calls", "best_of_k_calls", "eft_rollout_calls"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[f"mean_{key}"] = float(np.mean(vals))
    return out


COLUMNS = ("pair", "nodes", "devices", "best_one_pass", "best_one_pass_ms", "greedy", "best_of_k", "heft", "m_etf",
           "m_sct", "metis", "sim_eft", "eft_rollout", "la_rule", "greedy_s", "greedy_calls", "best_of_k_s",
           "best_of_k_calls", "eft_rollout_s", "eft_rollout_calls", "la_rule_s", "la_rule_calls")


def write_report(rows: Sequence[dict[str, Any]], out: Path, *, title: str, stem: str = "generalization") -> str:
    """``<stem>.md`` and ``<stem>.csv``: every pair's row and the summary."""
    from placement_rl.graph.io import atomic_write_text
    from placement_rl.report import markdown_table, write_csv

    s = summarise(rows)
    md = (f"# {title}\n\nStep times are ratios to the best one-pass heuristic of each pair (min of HEFT, m-ETF, "
          f"m-SCT, METIS; its name and time in ms are given); lower is better. `greedy` and `best_of_k` are the "
          f"policy's own output (learned); `sim_eft` is the earliest-finish rule in the simulator's order and "
          f"`eft_rollout` its one-step lookahead (every device tried, the rest placed by `sim_eft`, the best full "
          f"step time kept; O(N^2 D) and the policy's imitation teacher): heuristic rows of their own.\n\n" + markdown_table(list(rows), COLUMNS, COLUMNS) +
          "\n\n" + "\n".join(f"* {k}: {v:.4f}" if isinstance(v, float) else f"* {k}: {v}" for k, v in s.items()) + "\n")
    atomic_write_text(out / f"{stem}.md", md)
    write_csv(out / f"{stem}.csv", list(rows), COLUMNS)
    return md


STATE = "resume"  # the run folder's sub-folder with what ``resume=True`` restarts from


def _trainer_state(trainer: Any) -> dict[str, Any]:
    import torch

    return {"policy": trainer.policy.state_dict(), "opt": trainer.opt.state_dict(), "decisions": trainer.decisions,
            "history": trainer.history, "gen": trainer.gen.get_state(), "rng": trainer.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state()}


def _restore(trainer: Any, state: dict[str, Any]) -> None:
    import torch

    trainer.policy.load_state_dict(state["policy"])
    trainer.opt.load_state_dict(state["opt"])
    trainer.decisions, trainer.history = state["decisions"], state["history"]
    trainer.gen.set_state(state["gen"])
    trainer.rng.bit_generator.state = state["rng"]
    torch.set_rng_state(state["torch_rng"])


def _save_phase(path: Path, trainer: Any, phases: dict[str, Any], run: dict[str, Any]) -> None:
    """The trainer's whole state after a phase (weights, optimiser, random streams, history): a local pickle."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"run": run, "trainer": _trainer_state(trainer), "phases": phases}, tmp)
    tmp.replace(path)


def _run_code() -> dict[str, Any]:
    """The resume key's code part: ``source_sha``, ``cost_model_sha``, ``fits_sha`` (``results.code_hashes``)."""
    from placement_rl.results import code_hashes

    h = code_hashes()
    return {k: h[k] for k in ("source_sha", "cost_model_sha", "fits_sha")}


def _load_phase(path: Path, run: dict[str, Any], log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """The state saved after a phase, or None. Saved by other code (``run["code"]`` differs): None, with a
    one-line note, and every phase state and label of that code is removed (recomputed, never reused)."""
    import shutil

    import torch

    if not path.is_file():
        return None
    data = torch.load(path, map_location="cpu", weights_only=False)  # written by this machine's own run
    before = data["run"].get("code", {})
    if before != run.get("code", {}) and {k: v for k, v in data["run"].items() if k != "code"} == \
            {k: v for k, v in run.items() if k != "code"}:
        changed = ", ".join(f"{k} {before.get(k)} -> {v}" for k, v in run.get("code", {}).items()
                            if before.get(k) != v)
        log(f"resume: the code changed since {path.parent.parent} was saved ({changed}): recomputing from the "
            f"start, nothing of the earlier run reused")
        for f in path.parent.glob("*.pt"):
            f.unlink()
        shutil.rmtree(path.parent / "labels", ignore_errors=True)
        return None
    if data["run"] != run:
        raise ConfigError(f"cannot resume from {path.parent.parent}: it was started with another configuration "
                          f"(pretrain and agent keys must match; start a new run folder instead)")
    return data


def _file_sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def pretrain(spec: PretrainSpec, cfg: Any, out: Path, *, workers: int | str | Workers = 1, address: str | None = None,
             resume: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Imitation, then approximate policy iteration, then RL with credit per decision over the training
    distribution (``cfg``: a ``ConstructiveConfig``; its ``seed`` is the pretraining seed), early stopping on
    validation tasks from the same distribution. Writes ``checkpoint_imitation.pt`` and ``checkpoint_pi.pt``
    (the policy after each phase, for the ablation), ``checkpoint.pt``, ``dev.md/.csv`` (the dev split),
    ``training.json`` and ``metrics.json``; returns the metrics.

    ``workers`` / ``address`` (``placement_rl.scale``): task building, the teacher labelling of policy iteration
    and RL, and the dev evaluation run as one job per task there; the checkpoints do not depend on the worker
    count. While it runs, ``out/resume/`` keeps the built tasks, the trainer's state after each phase and every
    finished label; ``resume=True`` on the same ``out`` restarts from the last finished phase and replays the
    rounds after it with the labels already made (nothing is labelled twice; the result equals an
    uninterrupted run). ``out/resume/`` is removed when the run finishes."""
    import contextlib
    import json
    import shutil
    import time

    import torch

    from placement_rl.agents.constructive_train import ConstructiveTrainer
    from placement_rl.agents.scaleout import evaluate_tasks, weights_digest
    from placement_rl.graph.io import atomic_write_text

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    state = out / STATE
    run = {"pretrain": dataclasses.asdict(spec), "agent": dataclasses.asdict(cfg), "code": _run_code()}
    if not resume and state.exists():
        shutil.rmtree(state)  # a new run in this folder: nothing of an earlier one is reused
    cache = spec.cache if spec.cache is not None else state / "tasks"

    def step(what: str) -> Callable[[int, int], None]:
        def show(i: int, n: int) -> None:
            if i == n or i % max(1, n // 10) == 0:
                log(f"  {what}: {i}/{n} ({time.perf_counter() - t0:.0f} s)")
        return show

    if isinstance(workers, Workers):  # the caller's workers (left open); finished labels kept for resume
        ctx: Any = contextlib.nullcontext(workers)
        if workers.store is None:
            workers.store = state / "labels"
    else:
        ctx = Workers(workers, address=address, store=state / "labels")
    with ctx as pool:
        log(f"running on {pool.describe()}")
        log(f"building {spec.train_tasks} training tasks (graphs, random clusters, teachers)")
        train = build_tasks(training_specs(spec.train_tasks, seed=spec.seed, size=spec.sizes,
                                           zoo_frac=spec.zoo_frac, devices=spec.devices),
                            workers=pool, progress=step("training tasks"), cache=cache)
        val = build_tasks(training_specs(spec.val_tasks, seed=spec.seed + 10_000, size=spec.sizes,
                                         devices=spec.devices), workers=pool, cache=cache) if spec.val_tasks else []
        build_seconds = time.perf_counter() - t0
        trainer = ConstructiveTrainer(cfg, workers=pool)

        def prog(phase: str, i: int, n: int, info: dict[str, float]) -> None:
            if i == n or i % max(1, n // 20) == 0:
                log(f"  {phase} {i}/{n}: " + ", ".join(f"{k} {v:.4f}" for k, v in info.items() if k != "decisions")
                    + f" ({time.perf_counter() - t0:.0f} s)")

        extra = {"pretrain": dataclasses.asdict(spec)}
        phases: dict[str, Any] = {}
        resumed = None
        saved = _load_phase(state / "imitation.pt", run, log) if resume else None
        if saved is not None:
            _restore(trainer, saved["trainer"])
            phases, resumed = saved["phases"], "imitation"
            log("resumed after imitation")
        else:
            log(f"imitation: behaviour cloning ({cfg.bc_epochs} epochs) + {cfg.dagger_rounds} DAgger rounds on "
                f"{len(train)} tasks (window W={cfg.window})")
            phases["imitation"] = {"agreement": trainer.imitate(train, progress=prog)}
            if val:
                phases["imitation"]["val_greedy_geomean"] = trainer._val_score(val)
                log(f"  validation greedy / best one-pass: {phases['imitation']['val_greedy_geomean']:.4f}")
            _save_phase(state / "imitation.pt", trainer, phases, run)
        trainer.save(out / "checkpoint_imitation.pt", with_optimizer=False, extra={**extra, "phase": "imitation"})
        if cfg.pi_rounds:
            saved = _load_phase(state / "policy_iteration.pt", run, log) if resume else None
            if saved is not None:
                _restore(trainer, saved["trainer"])
                phases, resumed = saved["phases"], "policy_iteration"
                log("resumed after policy iteration")
            else:
                log(f"policy iteration: {cfg.pi_rounds} rounds of rollout over the student (every "
                    f"{cfg.pi_label_every}th state, tasks <= {cfg.pi_max_nodes} nodes)")
                phases["policy_iteration"] = trainer.policy_iteration(train, val=val, progress=prog)
                _save_phase(state / "policy_iteration.pt", trainer, phases, run)
            trainer.save(out / "checkpoint_pi.pt", with_optimizer=False, extra={**extra, "phase": "policy_iteration"})
        if cfg.ei_rounds:
            from placement_rl.agents.expert_iteration import expert_iteration

            log(f"expert iteration: {cfg.ei_rounds} rounds of multi-start search ({cfg.ei_search_budget} simulator "
                f"calls per task, from the student's, la_rule's and the best known placements) then distillation")
            phases["expert_iteration"] = expert_iteration(trainer, train, val=val, progress=prog)
            trainer.save(out / "checkpoint_ei.pt", with_optimizer=False, extra={**extra, "phase": "expert_iteration"})
        if cfg.rl_iters:
            log(f"RL ({cfg.rl_algo}): {cfg.rl_iters} iterations, early stopping on {len(val)} validation tasks")
            phases["rl"] = trainer.improve(train, val=val, progress=prog)
        train_seconds = time.perf_counter() - t0
        trainer.save(out / "checkpoint.pt", with_optimizer=False, extra={**extra, "phase": "final"})
        metrics: dict[str, Any] = {"train_tasks": len(train), "val_tasks": len(val), "phases": phases,
                                   "decisions": trainer.decisions, "build_seconds": build_seconds,
                                   "train_seconds": train_seconds, "workers": pool.count,
                                   "weights_sha": weights_digest(trainer.policy.state_dict()),
                                   "checkpoint_sha": _file_sha(out / "checkpoint.pt"),
                                   "resumed_after": resumed, "labels_reused": pool.reused}
        atomic_write_text(out / "training.json", json.dumps(trainer.history, indent=1, default=float))
        if spec.dev:
            log("dev split (zero-shot: greedy and best of 16 samples)")
            dev = build_tasks(heldout_specs(), workers=pool, cache=spec.cache)
            rows = result_rows(evaluate_tasks(trainer.policy, dev, samples=16, seed=cfg.seed, workers=pool))
            write_report(rows, out, title="Zero-shot placement of the dev split", stem="dev")
            metrics["dev"] = summarise(rows)
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1, default=float))
    shutil.rmtree(state, ignore_errors=True)
    return metrics
