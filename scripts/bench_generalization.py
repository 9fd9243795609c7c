"""Benchmarks of the pretrained constructive policy against its speed and quality targets.

    python scripts/bench_generalization.py --part dev        # zero-shot on the 32-pair dev split, every pair printed
    python scripts/bench_generalization.py --part test --runs R0 R1 R2
                                                             # the test split (final figures only): every phase of
                                                             # every pretraining run (imitation / + policy iteration /
                                                             # + RL), mean over the runs' seeds: the ablation table
    python scripts/bench_generalization.py --part test       # the test split, --checkpoint alone (the shipped one)
    python scripts/bench_generalization.py --part scale      # 2,000 and 10,000 nodes: greedy vs sim_eft, seconds
    python scripts/bench_generalization.py --part speed      # decisions/s in training; zero-shot at 2,000 / 20,000 nodes
    python scripts/bench_generalization.py --part finetune   # fine-tuning vs eft_rollout + local search, equal calls
    python scripts/bench_generalization.py --part headroom --split test --budget 100000
                                                             # how far below eft_rollout a long search gets on a
                                                             # split: the room the zero-shot targets need

``--checkpoint`` defaults to the packaged pretrained policy. ``--out docs`` writes the reports there. The dev and test
parts build and evaluate their pairs on ``--workers`` (default ``auto``: every core, on Ray; best of 16 is sampled
with a seed per pair, so any worker count gives the same rows). A zero-shot decode branches each decision's devices
on every core (``PLACEMENT_RL_DECODE_THREADS=auto``, as ``placement-rl`` does; ``=1``: the serial kernel, the same
placements; ``placement_rl.cost.split``). Every row
carries its own simulator calls (complete placements evaluated; ``eft_rollout``: one per tried device and decision)
and seconds.
"""

from __future__ import annotations

import os

os.environ.setdefault("GOMP_SPINCOUNT", "30000")  # before torch / numba load OpenMP (as `placement-rl` does)

import argparse  # noqa: E402
import copy
import time
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

SUMMARY = ("greedy_geomean", "best_of_k_geomean", "sim_eft_geomean", "eft_rollout_geomean",
           "greedy_over_sim_eft_geomean", "greedy_over_eft_rollout_geomean", "best_of_k_over_eft_rollout_geomean",
           "greedy_le_eft_rollout_frac", "mean_greedy_s", "mean_best_of_k_s", "mean_eft_rollout_s",
           "mean_greedy_calls", "mean_best_of_k_calls", "mean_eft_rollout_calls")


def _load(path, full_window: int | None):
    """``load_policy(path)`` with ``--full-window`` (None: the checkpoint's) applied to the policy."""
    from placement_rl.agents.constructive_train import load_policy

    policy, cfg, raw = load_policy(path)
    if full_window is not None:
        policy.full_window = int(full_window)
    return policy, cfg, raw


def _print_rows(rows) -> None:
    print(f"{'pair':40s} {'nodes':>5s} {'dev':>3s} {'best one-pass':>14s} {'greedy':>7s} {'best16':>7s} {'sim_eft':>7s} "
          f"{'rollout':>7s} {'greedy s':>8s} {'rollout s':>9s} {'calls':>6s}")
    for r in rows:
        print(f"{r['pair']:40s} {r['nodes']:5d} {r['devices']:3d} {r['best_one_pass']:>6s} {r['best_one_pass_ms']:7.2f}"
              f" {r['greedy']:7.3f} {r['best_of_k']:7.3f} {r['sim_eft']:7.3f} {r.get('eft_rollout', float('nan')):7.3f}"
              f" {r['greedy_s']:8.3f} {r.get('eft_rollout_s', float('nan')):9.3f} {r.get('eft_rollout_calls', 0):6d}")


def _print_summary(s: dict, label: str = "") -> None:
    print(f"{label}greedy / sim_eft {s['greedy_over_sim_eft_geomean']:.4f} (target <= 0.97), greedy / eft_rollout "
          f"{s.get('greedy_over_eft_rollout_geomean', float('nan')):.4f} (target <= 1.00), best of 16 / eft_rollout "
          f"{s.get('best_of_k_over_eft_rollout_geomean', float('nan')):.4f} (target <= 0.98); greedy <= eft_rollout "
          f"on {s.get('greedy_le_eft_rollout_frac', float('nan')):.0%}; greedy vs best one-pass {s['greedy_geomean']:.4f}"
          f"; mean seconds greedy {s['mean_greedy_s']:.3f} ({s.get('mean_greedy_calls', float('nan')):.0f} calls), "
          f"eft_rollout {s.get('mean_eft_rollout_s', float('nan')):.3f} "
          f"({s.get('mean_eft_rollout_calls', float('nan')):.0f} calls)")


def part_split(policy, split: str, out: Path | None, workers, cache: str | None, *, seed: int = 0,
               title: str = "Zero-shot placement of the dev split by the pretrained policy",
               stem: str = "dev_split") -> None:
    """One policy on the ``split`` pairs (``dev``: every choice; ``test``: one checkpoint's final figures)."""
    from placement_rl.agents.scaleout import evaluate_tasks
    from placement_rl.studies.pretrain import build_tasks, result_rows, split_specs, summarise, write_report

    t0 = time.perf_counter()
    tasks = build_tasks(split_specs(split), workers=workers, cache=cache)
    print(f"built {len(tasks)} {split}-split tasks in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    rows = result_rows(evaluate_tasks(policy, tasks, samples=16, seed=seed, workers=workers))
    print(f"evaluated them in {time.perf_counter() - t0:.1f} s on {workers.describe()}")
    _print_rows(rows)
    _print_summary(summarise(rows), "" if split == "dev" else f"[{split} split, one checkpoint] ")
    if out is not None:
        write_report(rows, out, title=title, stem=stem)
        print(f"wrote {out / (stem + '.md')} and .csv")


def part_test(runs: list[str], out: Path | None, workers, cache: str | None, stem: str = "ablation_learning",
              full_window: int | None = None) -> None:
    """Every phase checkpoint of every run on the test split; the ablation table; the final figures. A run that
    skipped a phase (``pi_rounds=0`` or ``rl_iters=0``) has no row for it: its final checkpoint is the last
    phase it ran."""
    from placement_rl.agents.scaleout import evaluate_tasks
    from placement_rl.studies.pretrain import build_tasks, result_rows, split_specs, summarise, write_report

    t0 = time.perf_counter()
    tasks = build_tasks(split_specs("test"), workers=workers, cache=cache)
    print(f"built {len(tasks)} test-split tasks in {time.perf_counter() - t0:.0f} s (never trained on or used for a "
          f"choice)")
    phases = (("imitation only", "checkpoint_imitation.pt"), ("+ policy iteration", "checkpoint_pi.pt"),
              ("+ RL (per-decision credit)", "checkpoint.pt"))
    table = []
    for label, fname in phases:
        per_seed = []
        for run in runs:
            path = Path(run) / fname
            if not path.is_file():
                continue
            policy, cfg, _ = _load(path, full_window)
            if (fname == "checkpoint_pi.pt" and not cfg.pi_rounds) or (fname == "checkpoint.pt" and not cfg.rl_iters):
                continue  # the phase did not run: this file repeats an earlier phase's policy
            rows = result_rows(evaluate_tasks(policy, tasks, samples=16, seed=cfg.seed, workers=workers))
            s = summarise(rows)
            per_seed.append(s)
            _print_summary(s, f"[{label}, {Path(run).name}] ")
            if out is not None and (fname == "checkpoint.pt" or (fname == "checkpoint_imitation.pt"
                                                                 and not cfg.pi_rounds and not cfg.rl_iters)):
                write_report(rows, out, title=f"Test split, pretraining run {Path(run).name} (final policy)",
                             stem=f"test_split_{Path(run).name}")
        if not per_seed:
            continue
        row = {"phase": label, "seeds": len(per_seed)}
        for k in SUMMARY:
            vals = [s[k] for s in per_seed if k in s]
            row[k] = float(np.mean(vals)) if vals else float("nan")
        row["max_greedy_over_eft_rollout"] = max(s["greedy_over_eft_rollout_geomean"] for s in per_seed)
        table.append(row)
        _print_summary(row, f"[{label}, mean of {len(per_seed)} seeds] ")
        print(f"  worst seed greedy / eft_rollout {row['max_greedy_over_eft_rollout']:.4f} (target: none above 1.01)")
    if out is not None and table:
        from placement_rl.graph.io import atomic_write_text
        from placement_rl.report import markdown_table

        cols = ("phase", "seeds") + SUMMARY + ("max_greedy_over_eft_rollout",)
        atomic_write_text(out / f"{stem}.md",
                          "# What each phase of pretraining earns, on the test split (mean over pretraining seeds)\n\n"
                          "Ratios are geometric means over the 32 test pairs; seconds and calls are per pair.\n\n"
                          + markdown_table(table, cols, cols) + "\n")
        print(f"wrote {out / (stem + '.md')}")


def part_scale(policy) -> None:
    """2,000 and 10,000 nodes, where eft_rollout is too slow to use: greedy vs sim_eft and seconds."""
    from placement_rl.agents.constructive_eval import evaluate, warm_kernels
    from placement_rl.envs.constructive_task import ConstructiveTask, sim_eft
    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.graph import synthetic
    from placement_rl.topology import DeviceTopology, load_topology

    warm_kernels(policy)  # numba's first compile on a fresh checkout is not a decode's time
    ratios = {}
    for n_nodes, target in ((2000, 1.0), (10000, 10.0)):
        for fam, tname in (("layered", "2x4_v100_ib"), ("dataflow", "8x_v100_dgx1"), ("series_parallel", "8x_a100_nvswitch")):
            g = synthetic.sample(fam, num_nodes=n_nodes, seed=1)
            d = load_topology(tname).to_dict()  # the preset with 1 TiB per device (a 10,000-node graph needs ~0.7 TB)
            for dev in d["devices"]:
                dev["memory_bytes"] = 2.0**40
            topo = DeviceTopology.from_dict({**d, "name": f"{tname}_1TiB"})
            costs = resolve_costs(g, topo)
            t0 = time.perf_counter()
            eft = simulate(g, costs, topo, sim_eft(g, costs, topo)).step_time
            t1 = time.perf_counter()
            task = ConstructiveTask(g, topo, costs)
            res = evaluate(policy, [task], samples=0)[0]
            r = res.greedy_time / eft
            ratios.setdefault(n_nodes, []).append(r)
            print(f"{fam}-{n_nodes}@{tname}: greedy / sim_eft {r:.4f} (target <= 0.96); greedy {res.greedy_seconds:.2f} s "
                  f"(target < {target:g} s), sim_eft {t1 - t0:.2f} s", flush=True)
        gm = float(np.exp(np.mean(np.log(ratios[n_nodes]))))
        print(f"{n_nodes} nodes: geometric mean greedy / sim_eft {gm:.4f}")


def part_speed(policy, cfg) -> None:
    from placement_rl.agents.constructive import rollout
    from placement_rl.agents.constructive_eval import evaluate, warm_kernels
    from placement_rl.agents.constructive_train import ConstructiveTrainer
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.topology import load_topology

    topo = load_topology("8x_a100_nvswitch")
    tasks = []
    for i, fam in enumerate(("layered", "dataflow", "transformer_like", "cnn_like")):
        g = synthetic.sample(fam, num_nodes=200, seed=i)
        tasks.append(ConstructiveTask.build(g, topo, resolve_costs(g, topo)))
    from placement_rl.cost.split import THREADS_ENV

    asked = os.environ.get(THREADS_ENV, "1")
    if asked != "1":  # the episodes of a step on threads (placement_rl.cost.split.episodes_extra): same samples
        os.environ[THREADS_ENV] = asked
        rollout(policy, tasks[0], samples=2, greedy=False)  # compile / warm up
        t0 = time.perf_counter()
        n = 0
        for t in tasks:
            rollout(policy, t, samples=32, greedy=False, record=True)
            n += 32 * t.graph.num_nodes
        print(f"rollouts (32 samples x 200-node graphs on 8 devices, recorded) with {THREADS_ENV}={asked}: "
              f"{n / (time.perf_counter() - t0):,.0f} decisions/s wall")
    os.environ[THREADS_ENV] = "1"  # the one-thread figures below (the training target is per core)
    rollout(policy, tasks[0], samples=2, greedy=False)  # compile / warm up
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for t in tasks:
        for _ in range(3):
            rollout(policy, t, samples=32, greedy=False, record=True)
            n += 32 * t.graph.num_nodes
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"rollouts (32 samples x 200-node graphs on 8 devices, recorded), one thread: {n / wall:,.0f} decisions/s "
          f"wall, {n / cpu:,.0f} per CPU-second")
    import dataclasses

    trainer = ConstructiveTrainer(dataclasses.replace(cfg, samples=32, tasks_per_iter=4, ppo_epochs=2, rl_algo="sil"),
                                  policy=copy.deepcopy(policy))
    d0, t0, c0 = trainer.decisions, time.perf_counter(), time.process_time()
    trainer.improve(tasks, iters=6)
    d = trainer.decisions - d0
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"training (expert iteration: rollouts + updates), 200-node graphs, one thread: {d / wall:,.0f} "
          f"decisions/s wall, {d / cpu:,.0f} per CPU-second (target >= 5,000)")
    from placement_rl.agents.policy_rollout import rollout_over_student

    t0, c0 = time.perf_counter(), time.process_time()
    comp = dec = 0
    for t in tasks:
        lab = rollout_over_student(policy, t, actions=rollout(policy, t, samples=1).devices[0], label_every=4)
        comp += lab.completions
        dec += lab.completions * t.graph.num_nodes // 2  # a completion places the remaining nodes: N/2 on average
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"policy-iteration labelling (rollout over the student, every 4th state), 200-node graphs: "
          f"{comp / cpu:,.0f} completed placements and about {dec / cpu:,.0f} decisions per CPU-second")
    from placement_rl.topology import DeviceTopology

    big = DeviceTopology.from_dict({"name": "8x_a100_1TiB", "devices": [  # a 20,000-node graph needs ~2.4 TB
        {"name": "gpu", "count": 8, "kind": "gpu", "model": "A100-SXM4", "peak_flops": 19.5e12, "mem_bandwidth": 1.555e12,
         "memory_bytes": 2.0**40}], "links": {"intra_host": {"bandwidth": 300e9, "latency": 3e-6}}})
    from placement_rl.cost.split import requested_threads

    os.environ[THREADS_ENV] = asked
    warm_kernels(policy)  # numba's first compile on a fresh checkout is not a decode's time
    for n_nodes, target in ((2000, 1.0), (20000, 10.0)):
        g = synthetic.sample("layered", num_nodes=n_nodes, seed=0)
        topo = big
        t1 = time.perf_counter()
        costs = resolve_costs(g, topo)
        t2 = time.perf_counter()
        task = ConstructiveTask(g, topo, costs)
        res = evaluate(policy, [task], samples=0)[0]
        t3 = time.perf_counter()
        asked = os.environ.get(THREADS_ENV, "1")
        os.environ[THREADS_ENV] = "1"  # the serial kernel on the same graph: the reference, the same placement
        try:
            ref = evaluate(policy, [ConstructiveTask(g, topo, costs)], samples=0)[0]
        finally:
            os.environ[THREADS_ENV] = asked
        same = bool(np.array_equal(ref.greedy.devices, res.greedy.devices))
        print(f"zero-shot greedy, {n_nodes} nodes on 8 devices: {t3 - t2:.2f} s with {THREADS_ENV}={asked} "
              f"({requested_threads()} threads; features + encoder + {n_nodes} decisions + simulate; target < "
              f"{target:g} s); serial kernel {ref.greedy_seconds:.2f} s ({ref.greedy_seconds / (t3 - t2):.2f}x; same "
              f"placement: {same}); resolve_costs {t2 - t1:.2f} s; step time {res.greedy_time * 1e3:.2f} ms")


def _finetune_config(cfg):
    """What ``placement-rl train`` fine-tunes with: the agent group's values over the checkpoint's config."""
    import dataclasses

    from omegaconf import OmegaConf

    agent = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parent.parent / "conf" / "agent"
                                                  / "constructive.yaml"))
    known = {f.name for f in dataclasses.fields(cfg)}
    return dataclasses.replace(cfg, **{k: v for k, v in agent.items() if k in known and v is not None})


FINETUNE_CASES = {  # (graph spec, topology); ``dev`` has the same families and clusters with other graph seeds
    "test": [({"family": "dataflow", "num_nodes": 300, "seed": 11}, "4x_v100_nvlink"),
             ({"family": "dataflow", "num_nodes": 300, "seed": 12}, "2x4_v100_ib"),
             ({"family": "layered", "num_nodes": 300, "seed": 13}, "8x_a100_nvswitch"),
             ({"family": "series_parallel", "num_nodes": 300, "seed": 14}, "4x_v100_nvlink"),
             ({"family": "series_parallel", "num_nodes": 300, "seed": 15}, "cpu_2gpu"),
             ({"family": "layered", "num_nodes": 300, "seed": 16}, "cpu_2gpu"),
             ({"zoo": "moe"}, "8x_a100_nvswitch"), ({"zoo": "nmt"}, "2x_k80"), ({"zoo": "inception"}, "2x_k80")],
    "dev": [({"family": "dataflow", "num_nodes": 300, "seed": 21}, "4x_v100_nvlink"),
            ({"family": "dataflow", "num_nodes": 300, "seed": 22}, "2x4_v100_ib"),
            ({"family": "layered", "num_nodes": 300, "seed": 23}, "8x_a100_nvswitch"),
            ({"family": "series_parallel", "num_nodes": 300, "seed": 24}, "4x_v100_nvlink"),
            ({"family": "series_parallel", "num_nodes": 300, "seed": 25}, "cpu_2gpu"),
            ({"family": "layered", "num_nodes": 300, "seed": 26}, "cpu_2gpu")],
}


def part_finetune(policy, cfg, out: Path | None, budget: int, cases: str = "test",
                  overrides: dict | None = None) -> None:
    """Fine-tuning at ``budget`` simulator calls vs ``eft_rollout`` + local search at the same calls (eft_rollout's
    N x D completions counted), on the cases where local search beats the best one-pass heuristic by >= 3%.
    ``cases="dev"``: other graph seeds of the same families and clusters, for choosing the recipe (``overrides``:
    fine-tuning config values over conf/agent/constructive.yaml's)."""
    import dataclasses

    from placement_rl import baselines
    from placement_rl.baselines.search import refine
    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.studies.finetune import finetune
    from placement_rl.studies.pretrain import _graph, _topology

    ft_cfg = dataclasses.replace(_finetune_config(cfg), **(overrides or {}))
    print(f"fine-tuning recipe (conf/agent/constructive.yaml over the checkpoint's): {ft_cfg.pi_rounds} policy-"
          f"iteration rounds, then {ft_cfg.rl_algo} with {ft_cfg.samples} samples per iteration, lr {ft_cfg.rl_lr}, "
          f"{ft_cfg.ppo_epochs} passes; at most {budget} simulator calls in all")
    rows, curves = [], []
    for gspec, tname in FINETUNE_CASES[cases]:
        graph, topo = _graph(gspec), _topology(tname)
        costs = resolve_costs(graph, topo)
        t0 = time.perf_counter()
        ls = baselines.get("local_search")(graph, costs, topo, budget=budget, seed=0)
        ls_t, ls_s = simulate(graph, costs, topo, ls).step_time, time.perf_counter() - t0
        res = finetune(graph, topo, costs, copy.deepcopy(policy), dataclasses.replace(ft_cfg, rl_iters=budget),
                       samples=16, budget=budget, log=lambda _: None)
        ref = min(res.task.refs[n][0] for n in ("heft", "m_etf", "m_sct", "metis"))
        best = res.best("learned")
        calls = max(r.sim_calls for r in res.rows if r.kind == "learned")
        roll = next(r for r in res.rows if r.label == "eft_rollout")
        t1 = time.perf_counter()
        left = budget - roll.sim_calls
        if left > 0:
            p = refine(graph, costs, topo, roll.devices, budget=left, seed=0)
            rl_t = simulate(graph, costs, topo, p).step_time
        else:
            rl_t = roll.step_time
        rl_s = roll.seconds + time.perf_counter() - t1
        curves.append((f"{graph.name}@{topo.name}", res.curve, ref))
        gain = 1 - ls_t / ref
        rows.append({"case": f"{graph.name}@{topo.name}", "best_one_pass_ms": ref * 1e3, "local_search_ms": ls_t * 1e3,
                     "ls_gain": gain, "eft_rollout_ms": roll.step_time * 1e3, "eft_rollout_calls": roll.sim_calls,
                     "eft_rollout_ls_ms": rl_t * 1e3, "eft_rollout_ls_s": rl_s, "learned_ms": best.step_time * 1e3,
                     "learned_calls": calls, "learned_s": best.seconds, "learned_row": best.label,
                     "learned_over_eft_rollout_ls": best.step_time / rl_t})
        print(f"{rows[-1]['case']:34s} best one-pass {ref * 1e3:8.3f} ms | local_search({budget}) {ls_t * 1e3:8.3f} "
              f"(gain {gain:+.1%}, {ls_s:.1f} s) | eft_rollout ({roll.sim_calls} calls) + LS {rl_t * 1e3:8.3f} "
              f"({rl_s:.1f} s) | learned ({calls} calls, {best.seconds:.1f} s) {best.step_time * 1e3:8.3f} = "
              f"{best.step_time / rl_t:.3f}x  [{best.label}]", flush=True)
    eligible = [r for r in rows if r["ls_gain"] >= 0.03]
    wins = sum(r["learned_over_eft_rollout_ls"] <= 1.0 + 1e-9 for r in eligible)
    print(f"cases where local search beats the best one-pass heuristic by >= 3%: {len(eligible)}; learned <= "
          f"eft_rollout + local search (same {budget} calls) on {wins} of them (target: at least two thirds)")
    if out is not None:
        from placement_rl.graph.io import atomic_write_text
        from placement_rl.report import _plt, markdown_table

        cols = ("case", "best_one_pass_ms", "local_search_ms", "ls_gain", "eft_rollout_ms", "eft_rollout_calls",
                "eft_rollout_ls_ms", "eft_rollout_ls_s", "learned_ms", "learned_calls", "learned_s",
                "learned_over_eft_rollout_ls", "learned_row")
        atomic_write_text(out / "finetune.md", f"# Fine-tuning the pretrained policy vs eft_rollout + local search "
                          f"({budget} simulator calls each, eft_rollout's N x D completions counted)\n\n"
                          + markdown_table(rows, cols, cols) +
                          f"\n\nEligible cases (local search >= 3% better than the best one-pass heuristic): "
                          f"{len(eligible)}; learned <= eft_rollout + local search on {wins}.\n")
        plt = _plt()
        k = len(curves)
        fig, axes = plt.subplots((k + 2) // 3, 3, figsize=(12, 3.2 * ((k + 2) // 3)))
        for ax, (name, lc, ref) in zip(np.ravel(axes), curves):
            ax.plot([c for c, _ in lc], [t / ref for _, t in lc], label="learned (best so far)")
            ax.axhline(1.0, ls="--", lw=1, color="grey", label="best one-pass")
            ax.set_title(name, fontsize=8)
            ax.set_xscale("log")
            ax.set_xlabel("simulator calls", fontsize=8)
        np.ravel(axes)[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "finetune_curves.png", dpi=110)
        print(f"wrote {out / 'finetune.md'} and finetune_curves.png")


def part_headroom(split: str, out: Path | None, workers, cache: str | None, budget: int) -> None:
    """Simulated annealing (``baselines.search.refine``, ``budget`` simulator calls, seed per pair) from each pair's
    ``eft_rollout`` placement: the best placement one long search finds near the teacher's, against the teacher and
    ``sim_eft``. It is what one search (one start, one seed) found, not a bound: a lower bound per pair is
    ``baselines.bounds.lower_bound`` (``scripts/bench_learned.py`` prints it beside every row)."""
    from placement_rl.agents.constructive_eval import geomean
    from placement_rl.agents.scaleout import refine_teachers
    from placement_rl.studies.pretrain import build_tasks, split_specs

    tasks = build_tasks(split_specs(split), workers=workers, cache=cache)
    t0 = time.perf_counter()
    found = refine_teachers([(t, t.refs["eft_rollout"][2]) for t in tasks], budget, workers=workers)
    wall = time.perf_counter() - t0
    rows = []
    for t, (_, v, ok) in zip(tasks, found):
        er, se = t.refs["eft_rollout"][0], t.refs["sim_eft"][0]
        rows.append((str(t.meta.get("id", t.graph.name)), t.graph.num_nodes, t.topology.num_devices, er / se, v / er,
                     v / se, bool(ok)))
    lines = [f"# Room below `eft_rollout` on the {split} split: {budget:,} calls of annealing from its placement", "",
             f"`python scripts/bench_generalization.py --part headroom --split {split} --budget {budget}` "
             f"({wall:.0f} s on {workers.describe()}). Simulated annealing (`baselines.search.refine`, the "
             "local-search placer's moves and temperature) started from each pair's `eft_rollout` placement: the "
             "best placement it simulates is never worse than the start. This is what one search found (one start, "
             "one seed), not a bound on the room: `scripts/bench_learned.py` reports each pair's lower bound.", "",
             "| pair | nodes | devices | eft_rollout / sim_eft | search / eft_rollout | search / sim_eft |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.4f} | {r[4]:.4f} | {r[5]:.4f} |" for r in rows]
    g_er, g_rs, g_ss = geomean([r[4] for r in rows]), geomean([r[3] for r in rows]), geomean([r[5] for r in rows])
    better = sum(r[4] < 1.0 - 1e-4 for r in rows)
    lines += ["", f"Geometric mean over {len(rows)} pairs: search / `eft_rollout` **{g_er:.4f}** (better than the "
              f"start on {better} of {len(rows)} pairs; best {min(r[4] for r in rows):.4f}), `eft_rollout` / "
              f"`sim_eft` {g_rs:.4f}, search / `sim_eft` **{g_ss:.4f}**; all feasible: "
              f"{all(r[6] for r in rows)}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"headroom_{split}.md").write_text(text)
        print(f"wrote {out / f'headroom_{split}.md'}")


def main() -> None:
    os.environ.setdefault("PLACEMENT_RL_DECODE_THREADS", "auto")  # as `placement-rl` does (placement_rl.cost.split)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "dev", "test", "scale", "speed", "finetune", "headroom"),
                    default="all")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--runs", nargs="*", default=[], help="pretraining run folders (test part; none: "
                    "--checkpoint alone)")
    ap.add_argument("--out", default=None, help="folder for the reports (e.g. docs)")
    ap.add_argument("--budget", type=int, default=None, help="simulator calls for fine-tuning and its comparison "
                    "(default 5000) or for the headroom search (default 100000)")
    ap.add_argument("--split", choices=("dev", "test"), default="dev", help="the headroom part's split")
    ap.add_argument("--workers", default="auto", help="building and evaluating the dev / test pairs: 1 (this "
                    "process), N or auto (Ray workers; placement_rl.scale)")
    ap.add_argument("--address", default=None, help="a Ray cluster to join (auto or host:port)")
    ap.add_argument("--stem", default="ablation_learning", help="file name of the test part's ablation table "
                    "(dev part: of its table, default dev_split)")
    ap.add_argument("--finetune-cases", choices=("test", "dev"), default="test", help="fine-tuning cases: the "
                    "reported ones (test) or other graph seeds for choosing the recipe (dev)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="fine-tuning config values over "
                    "conf/agent/constructive.yaml's (e.g. temperature=0.5)")
    ap.add_argument("--cache", default=None, help="folder keeping built tasks between runs")
    ap.add_argument("--full-window", type=int, default=None, help="placing graphs of at most this many nodes with "
                    "the window over the whole graph (default: the checkpoint's, 2048; 0: the trained window W only)")
    a = ap.parse_args()
    from placement_rl.agents.constructive_train import default_checkpoint

    ckpt = a.checkpoint or str(default_checkpoint())
    policy, cfg, _ = _load(ckpt, a.full_window)
    print(f"checkpoint {ckpt} (whole-graph window up to {policy.full_window} nodes)")
    out = Path(a.out) if a.out else None
    from placement_rl.scale import Workers

    if a.part in ("all", "dev", "test"):
        with Workers(a.workers, address=a.address) as workers:
            if a.part in ("all", "dev"):
                part_split(policy, "dev", out, workers, a.cache,
                           stem="dev_split" if a.stem == "ablation_learning" else a.stem)
            if a.part == "test" and a.runs:
                part_test(a.runs, out, workers, a.cache, stem=a.stem, full_window=a.full_window)
            elif a.part == "test":  # no pretraining runs given: the checkpoint alone
                part_split(policy, "test", out, workers, a.cache, seed=cfg.seed, stem="test_split_checkpoint",
                           title="Test split, one checkpoint (the shipped one unless --checkpoint)")
    if a.part == "headroom":
        with Workers(a.workers, address=a.address) as workers:
            part_headroom(a.split, out, workers, a.cache, a.budget or 100_000)
    if a.part in ("all", "scale"):
        part_scale(policy)
    if a.part in ("all", "speed"):
        part_speed(policy, cfg)
    if a.part in ("all", "finetune"):
        import dataclasses

        import yaml

        overrides = {}
        for kv in a.set:
            key, sep, val = kv.partition("=")
            if not sep or not key:
                ap.error(f"--set expects KEY=VALUE, got {kv!r}")
            overrides[key] = yaml.safe_load(val)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cfg)}
        if unknown:
            ap.error(f"--set: unknown fine-tuning config keys {sorted(unknown)} (see agents/constructive_config.py)")
        part_finetune(policy, cfg, out, a.budget or 5000, cases=a.finetune_cases, overrides=overrides)


if __name__ == "__main__":
    main()
