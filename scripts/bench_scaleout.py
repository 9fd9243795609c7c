"""Scale-out benchmark: 2 workers vs 1 on this machine, Ray's overhead, and a cost model of pretraining.

    python scripts/bench_scaleout.py --quick     # a few minutes on 2 cores: 12 training tasks
    python scripts/bench_scaleout.py             # 32 training tasks: a steadier cost model

1. A small pretraining (the ``trainer=pretrain`` settings with ``RECIPE``, ``--tasks`` tasks drawn from its training
   distribution) runs on one worker, every phase timed and every job timed: per-task costs of building a task
   (graph, costs, teachers), of labelling it (rollout over the student), and of the driver's own serial work
   (imitation with DAgger, distillation, student rollouts, validation, RL updates).
2. Teacher labelling and evaluation (greedy + best of 16) of those tasks with its policy, on 1 worker (in this
   process, no Ray) and on 2 Ray workers: wall times, and whether every label, regret, placement and step time is
   identical. Ray's start (``ray.init`` + the workers' imports) is timed apart: paid once per run.
3. Ray's overhead per job (a no-op job, round trip through the driver) and the bytes a task ships.
4. The projected wall time of pretraining at 4x and 16x today's task count on 8, 64 and 256 cores:
   ``T(P) = serial + parallel / min(P, jobs per call) + the longest job of each call + jobs x overhead + start``
   (on Ray a trajectory's labelling is split into jobs of ``agents.scaleout.CHUNK`` states).

The last line reads ``speed-up <x>`` (labelling + evaluation, 2 workers over 1) and ``identical`` (or
``NOT identical``); the figures go to ``results/bench_scaleout[_quick][_ray_running].json`` (``_ray_running``: a Ray
instance was already running on the machine, e.g. ``ray start --head --num-cpus=1``; the bench's workers run on a
private instance of their own, never on it).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import pickle
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")
torch.set_num_threads(1)

from placement_rl.scale import Workers  # noqa: E402


def _timed(fn, item, *shared):
    t0 = time.perf_counter()
    out = fn(item, *shared)
    return out, time.perf_counter() - t0


class TimedWorkers(Workers):
    """``Workers`` recording each ``map`` call: (job function, wall seconds, every job's own seconds)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, float, list[float]]] = []

    def map(self, fn, items, **kwargs):
        t0 = time.perf_counter()
        if kwargs.get("on_result") is not None:
            inner = kwargs["on_result"]
            kwargs["on_result"] = lambda i, got: inner(i, got[0])
        got = super().map(functools.partial(_timed, fn), items, **kwargs)
        self.calls.append((fn.__name__, time.perf_counter() - t0, [s for _, s in got]))
        return [r for r, _ in got]

    def jobs(self, name: str) -> list[list[float]]:
        return [secs for fn, _, secs in self.calls if fn == name]


def _noop(x):
    return x


# The bench times the pretraining recipe whose labelling spreads over workers: policy iteration and per-decision-
# credit RL at W = 16 (the recipe shipped before). The shipped recipe (W = 256, imitation only) is timed whole in
# docs/scaleout.md ("The full pretraining").
RECIPE = ["agent.pi_rounds=3", "agent.rl_iters=6", "agent.window=16"]


def pretrain_settings():
    """The ``trainer=pretrain`` spec and agent config with ``RECIPE``, composed as ``placement-rl train
    trainer=pretrain <RECIPE>`` does."""
    from hydra import compose, initialize_config_dir

    from placement_rl.cli.common import to_container
    from placement_rl.cli.train import constructive_config
    from placement_rl.studies.pretrain import PretrainSpec
    from placement_rl.topology import conf_dir

    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=pretrain", *RECIPE])
    p = dict(to_container(cfg.trainer.pretrain))
    spec = PretrainSpec(**{**p, "sizes": tuple(p["sizes"]), "devices": tuple(p["devices"])})
    return spec, constructive_config(cfg)


def identical_labels(a, b) -> bool:
    return all(x.completions == y.completions and np.array_equal(x.labels, y.labels)
               and np.array_equal(x.regret, y.regret) and np.array_equal(x.devices, y.devices) for x, y in zip(a, b))


def identical_results(a, b) -> bool:
    return all(np.array_equal(getattr(x, r).devices, getattr(y, r).devices)
               and np.array_equal(getattr(x, r).times, getattr(y, r).times)
               for x, y in zip(a, b) for r in ("greedy", "sampled"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="12 training tasks (default 32)")
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2, help="the parallel side of the comparison")
    a = ap.parse_args()
    from placement_rl.scale_ray import other_instances

    bench_t0 = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    others = other_instances()  # a Ray instance already running on the machine (`ray start --head`): not joined
    n_tasks = a.tasks or (12 if a.quick else 32)
    from placement_rl.agents.constructive import rollout
    from placement_rl.agents.scaleout import CHUNK, LabelJob, evaluate_tasks, label_states, shippable
    from placement_rl.studies.pretrain import build_tasks, pretrain, training_specs

    spec0, cfg = pretrain_settings()
    n_val = max(2, n_tasks // 6)
    spec = dataclasses.replace(spec0, train_tasks=n_tasks, val_tasks=n_val, dev=False)
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; today's pretraining: "
          f"{spec0.train_tasks} training + {spec0.val_tasks} validation tasks, sizes {list(spec0.sizes)}, devices "
          f"{list(spec0.devices)}; agent: {cfg.bc_epochs} BC epochs, {cfg.dagger_rounds} DAgger rounds, "
          f"{cfg.pi_rounds} PI rounds, RL {cfg.rl_algo} x {cfg.rl_iters} (tasks_per_iter {cfg.tasks_per_iter})")
    tmp = Path(tempfile.mkdtemp(prefix="bench_scaleout-"))
    spec = dataclasses.replace(spec, cache=str(tmp / "tasks"))

    # 1. the small pretraining on one worker, every phase and job timed ----------------------------------------
    marks: list[tuple[float, str]] = []
    one = TimedWorkers(1)
    t0 = time.perf_counter()
    metrics = pretrain(spec, cfg, tmp / "run", workers=one, log=lambda s: marks.append((time.perf_counter(), s)))
    total = time.perf_counter() - t0
    build_jobs = [s for secs in one.jobs("build_task") for s in secs]
    label_calls = one.jobs("_label")
    pi_calls, q_calls = label_calls[:cfg.pi_rounds], label_calls[cfg.pi_rounds:]
    label_wall = sum(sum(c) for c in label_calls)
    dagger_calls = one.jobs("_lookahead_labels")  # DAgger's eft_rollout relabelling, one call per round
    dagger_wall = sum(sum(c) for c in dagger_calls)
    build_wall = sum(build_jobs)
    serial = total - build_wall - label_wall - dagger_wall
    n_pi = len(pi_calls[0]) if pi_calls else 0
    print(f"\n1. pretraining of {metrics['train_tasks']} + {metrics['val_tasks']} tasks on 1 worker: {total:.1f} s = "
          f"build {build_wall:.1f} s ({len(build_jobs)} jobs, mean {np.mean(build_jobs):.2f} s, max "
          f"{max(build_jobs):.2f} s) + DAgger relabelling {dagger_wall:.1f} s ({len(dagger_calls)} rounds) + "
          f"labelling {label_wall:.1f} s ({len(pi_calls)} PI rounds x {n_pi} jobs, "
          f"{len(q_calls)} RL iterations x {len(q_calls[0]) if q_calls else 0} jobs; max job "
          f"{max(max(c) for c in label_calls) if label_calls else 0:.2f} s) + the driver's serial work {serial:.1f} s")
    for when, line in marks:
        if not line.startswith("  "):
            print(f"   {when - t0:7.1f} s  {line[:110]}")

    # 2. labelling and evaluation: 1 worker vs N -------------------------------------------------------------
    from placement_rl.agents.constructive_train import load_policy

    policy, _, _ = load_policy(tmp / "run" / "checkpoint.pt")
    policy.window = cfg.window
    tasks = build_tasks(training_specs(n_tasks, seed=spec.seed, size=spec.sizes, zoo_frac=spec.zoo_frac,
                                       devices=spec.devices), cache=spec.cache)
    for t in tasks:
        t.window = cfg.window
    gen, rng = torch.Generator().manual_seed(1), np.random.default_rng(1)
    jobs = []
    for t in tasks:
        if t.topology.num_devices < 2:
            continue
        ro = rollout(policy, t, samples=1, greedy=False, generator=gen)
        every = max(cfg.pi_label_every, -(-t.graph.num_nodes // cfg.pi_max_labels))
        jobs.append(LabelJob(t, ro.devices[0], every, int(rng.integers(every))))
    w1 = Workers(1)
    t1 = time.perf_counter()
    lab1 = label_states(policy, jobs, w1)
    l1 = time.perf_counter() - t1
    t1 = time.perf_counter()
    ev1 = evaluate_tasks(policy, tasks, samples=16, seed=0, workers=w1)
    e1 = time.perf_counter() - t1
    t1 = time.perf_counter()
    wn = Workers(a.workers)
    started = time.perf_counter() - t1
    t1 = time.perf_counter()
    wn.map(_noop, list(range(2 * wn.count)))  # every worker process up (imports: torch, the package)
    small = min(jobs, key=lambda j: j.task.graph.num_nodes)
    label_states(policy, [small], wn)  # and the compiled kernels loaded (a split job reaches every worker)
    evaluate_tasks(policy, [small.task] * wn.count, samples=1, workers=wn)
    warm = time.perf_counter() - t1
    for t in tasks:
        wn.put(t, ship=shippable)  # once per run (pretraining puts each task once)
    t1 = time.perf_counter()
    labn = label_states(policy, jobs, wn)
    ln = time.perf_counter() - t1
    t1 = time.perf_counter()
    evn = evaluate_tasks(policy, tasks, samples=16, seed=0, workers=wn)
    en = time.perf_counter() - t1
    same = identical_labels(lab1, labn) and identical_results(ev1, evn)
    where = wn.describe()
    print(f"\n2. {len(jobs)} labelling jobs and {len(tasks)} evaluations (greedy + best of 16), {where}:")
    print(f"   labelling:  1 worker {l1:6.2f} s, {wn.count} workers {ln:6.2f} s: x{l1 / ln:.2f}; labels "
          f"{'identical' if identical_labels(lab1, labn) else 'DIFFER'}")
    print(f"   evaluation: 1 worker {e1:6.2f} s, {wn.count} workers {en:6.2f} s: x{e1 / en:.2f}; placements "
          f"{'identical' if identical_results(ev1, evn) else 'DIFFER'}")
    print(f"   Ray start {started:.2f} s + workers' imports {warm:.2f} s (once per run, not in the figures above)")

    # 3. Ray's overhead per job ----------------------------------------------------------------------------
    n_noop = 400
    t1 = time.perf_counter()
    wn.map(_noop, list(range(n_noop)))
    over = (time.perf_counter() - t1) / n_noop
    ship = [len(pickle.dumps(shippable(t), protocol=5)) for t in tasks]
    t1 = time.perf_counter()
    refs = [__import__("ray").put(pickle.dumps(shippable(t), protocol=5)) for t in tasks]
    put_s = (time.perf_counter() - t1) / len(tasks)
    del refs
    wn.close()
    print(f"\n3. Ray overhead: {over * 1e3:.2f} ms per no-op job through the driver ({n_noop} jobs on {wn.count} "
          f"workers); a task ships {np.mean(ship) / 1e6:.2f} MB on average (max {max(ship) / 1e6:.2f} MB), put in "
          f"{put_s * 1e3:.1f} ms, once per run")

    # 4. the cost model ---------------------------------------------------------------------------------------
    per_build = float(np.mean(build_jobs))
    per_label = sum(sum(c) for c in pi_calls) / max(1, sum(len(c) for c in pi_calls))  # one trajectory, one round
    q_wall = sum(sum(c) for c in q_calls)
    at = {key: next((w - t0 for w, line in marks if line.startswith(key)), None)
          for key in ("imitation:", "policy iteration:", "RL (")}
    pi_end = at["RL ("] if at["RL ("] is not None else total
    imitation = (at["policy iteration:"] or pi_end) - at["imitation:"] - dagger_wall  # BC, student rollouts
    per_dagger = dagger_wall / metrics["train_tasks"]  # every DAgger round of one task
    longest_dagger = max([max(c) for c in dagger_calls if c], default=0.0)
    pi_serial = (pi_end - (at["policy iteration:"] or pi_end)) - sum(sum(c) for c in pi_calls)
    rl_serial = serial - imitation - pi_serial  # RL updates, student rollouts, validation: fixed tasks per iteration
    serial_per_task = (imitation + pi_serial) / metrics["train_tasks"]
    longest_build = max(build_jobs)
    longest = max([max(c) for c in label_calls]) if label_calls else 0.0  # one trajectory's labelling
    per_eval = e1 / len(tasks)
    start = started + warm
    base = spec0.train_tasks + spec0.val_tasks
    print(f"\n4. cost model (per task, measured above): build {per_build:.2f} s, labelling {per_label:.2f} s per PI "
          f"round, driver's serial work {serial_per_task:.2f} s (imitation {imitation / metrics['train_tasks']:.2f} s "
          f"without its DAgger relabelling ({per_dagger:.2f} s, on the workers), policy iteration's rollouts, "
          f"distillation and validation "
          f"{pi_serial / metrics['train_tasks']:.2f} s); RL: serial {rl_serial:.1f} s and labelling {q_wall:.1f} s "
          f"in all (fixed: {cfg.tasks_per_iter} tasks per iteration); evaluation {per_eval:.2f} s; longest jobs: "
          f"build {longest_build:.2f} s, labelling {longest:.2f} s; Ray {over * 1e3:.2f} ms per job, start {start:.1f} s")

    def project(n: int, cores: int) -> tuple[float, float]:
        """Modelled wall time of pretraining ``n`` tasks on ``cores`` (one worker per core), serial share."""
        if cores == 1:
            return (serial_per_task * n + rl_serial + n * (per_build + per_dagger + cfg.pi_rounds * per_label)
                    + q_wall, 0.0)
        split = 1 + 48 // CHUNK  # labelling jobs per trajectory on Ray (at most pi_max_labels states)
        par = (n * (per_build + per_dagger) / min(cores, n)
               + n * cfg.pi_rounds * per_label / min(cores, split * n))
        par += q_wall / min(cores, split * cfg.tasks_per_iter)
        straggler = (longest_build + cfg.dagger_rounds * longest_dagger
                     + (cfg.pi_rounds + cfg.rl_iters) * longest / split)  # the last job of each call
        jobs_ = n * (1 + cfg.dagger_rounds) + split * (n * cfg.pi_rounds + cfg.rl_iters * cfg.tasks_per_iter)
        t = serial_per_task * n + rl_serial + par + straggler + jobs_ * over + start
        return t, (serial_per_task * n + rl_serial) / t

    print(f"   today: {base} tasks, 1 core {project(base, 1)[0] / 60:.1f} min, 2 cores {project(base, 2)[0] / 60:.1f}"
          f" min (modelled; the real run also evaluates the 32-pair dev split)")
    print(f"   {'tasks':>7s} {'cores':>6s} {'projected':>10s} {'serial share':>13s}")
    for mult in (4, 16):
        for cores in (8, 64, 256):
            t, share = project(mult * base, cores)
            print(f"   {mult:>3d}x{mult * base:<5d} {cores:6d} {t / 3600:8.2f} h {share:12.0%}")
    print("   (serial share: the driver's imitation (behaviour cloning; its DAgger relabelling runs on the workers), "
          "distillation, student rollouts, "
          "validation and RL updates, which do not spread over workers)")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    speed = (l1 + e1) / (ln + en)
    from placement_rl.results import write_result

    name = "bench_scaleout" + ("_quick" if a.quick else "") + ("_ray_running" if others else "")
    write_result(name, {"tasks": n_tasks, "labelling_jobs": len(jobs), "workers": wn.count, "where": where,
                        "ray_already_running": others, "labelling_s": {"1": l1, str(wn.count): ln},
                        "evaluation_s": {"1": e1, str(wn.count): en}, "speed_up": speed, "identical": same,
                        "ray_start_s": started, "workers_warm_up_s": warm, "ms_per_noop_job": over * 1e3,
                        "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()]},
                 seconds=time.perf_counter() - bench_t0)
    print(f"labelling + evaluation on {wn.count} workers vs 1: speed-up {speed:.2f}, "
          f"{'identical' if same else 'NOT identical'}")


if __name__ == "__main__":
    main()
