"""Per-graph fine-tuning of a (pretrained) constructive policy, reported row by row.

``finetune(graph, topology, costs, policy, config)`` places one (graph, topology) with the policy as it is
(zero-shot), fine-tunes it on that task (``config.pi_rounds`` rounds of approximate policy iteration: the rollout
over the student relabels the student's states and the labels are distilled; then expert iteration started from
**its own** greedy placement, never from a heuristic's), places again, and optionally runs a local search seeded by the policy's best placement. Every
result is its own named row (``LearnedRow``): the policy's greedy and best-of-k before and after fine-tuning and
the best placement it sampled while fine-tuning are learned; ``learned + local search`` is a search row; the
one-pass heuristics (HEFT, m-ETF, m-SCT, METIS), ``sim_eft`` and ``eft_rollout`` are heuristic rows. Simulator
calls are counted as complete placements evaluated (a one-pass rule: 1; ``eft_rollout``: one per tried device and
decision, about N x D; a learned row: its episodes), and every row carries its own seconds (the learned rows'
exclude building the heuristics' rows) and its computed feasibility.
"""

from __future__ import annotations

import dataclasses

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from agents.constructive import episode_calls, placement_calls, rollout
from agents.constructive_eval import evaluate
from agents.constructive_train import ConstructiveConfig, ConstructiveTrainer
from agents.device_policy import DevicePolicy
from envs.constructive_task import ONE_PASS, ConstructiveTask
from placement_rl.cost import simulate
from placement_rl.cost.types import CostTable
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology


@dataclass
class LearnedRow:
    label: str
    kind: str  # learned | search | heuristic
    step_time: float
    feasible: bool
    devices: np.ndarray = field(repr=False)
    sim_calls: int = 0
    seconds: float = 0.0


@dataclass
class FinetuneResult:
    task: ConstructiveTask
    rows: list[LearnedRow]
    curve: list[tuple[int, float]]  # (simulator calls, best learned step time so far)
    trainer: ConstructiveTrainer

    def best(self, kind: str = "learned") -> LearnedRow:
        return min((r for r in self.rows if r.kind == kind), key=lambda r: (not r.feasible, r.step_time))


def finetune(graph: CompGraph, topology: DeviceTopology, costs: CostTable, policy: DevicePolicy,
             config: ConstructiveConfig, *, samples: int = 16, search_budget: int = 0, seed: int = 0,
             budget: int | None = None, log: Callable[[str], None] = print) -> FinetuneResult:
    """Zero-shot rows, then policy iteration and expert iteration on this task, then the fine-tuned rows (and
    local search from the best learned placement with ``search_budget`` more calls: a search row). With
    ``budget``, the learned rows together spend at most that many simulator calls (policy iteration's rollout
    completions counted): the two evaluations (zero-shot, fine-tuned) take at most ``samples`` placements each,
    fewer where a placement reads the whole graph (N x D + 1 calls each), policy iteration keeps the rounds that
    surely fit, and expert iteration gets what is left, each sampled episode charged as a placement is."""
    task = ConstructiveTask.build(graph, topology, costs, id=f"{graph.name}@{topology.name}")
    secs, calls = task.meta.get("ref_seconds", {}), task.meta.get("ref_calls", {})
    rows = [LearnedRow(name, "heuristic", t, ok, dev, int(calls.get(name, 1)), float(secs.get(name, 0.0)))
            for name, (t, ok, dev) in task.refs.items()]
    if budget is not None:  # the whole-graph window costs N x D calls per placement: at a budget, read W only
        policy.full_window = 0  # (a graph within W still reads all of it)
    per = placement_calls(policy, task)  # calls per evaluated placement (N x D completions with the whole-graph window)
    if budget is not None:
        samples = max(1, min(samples, budget // (2 * per) - 1))  # both evaluations (zero-shot, fine-tuned) fit
    t0 = time.perf_counter()  # the learned rows' own seconds: not the heuristics' (teachers are not needed here)
    zs = evaluate(policy, [task], samples=samples, seed=seed)[0]
    n_calls = per * (1 + samples)
    t_zs = time.perf_counter() - t0
    rows.append(LearnedRow("policy zero-shot (greedy)", "learned", zs.greedy_time, bool(zs.greedy.feasible[0]),
                           zs.greedy.devices[0], per, t_zs))
    rows.append(LearnedRow(f"policy zero-shot (best of {samples})", "learned", zs.best_time,
                           _feasible(graph, costs, topology, zs.best_devices), zs.best_devices, n_calls, t_zs))
    if budget is not None and config.pi_rounds > 0:  # a round labels at most N x D completions (+ its check):
        per_round = episode_calls(task, graph.num_nodes)  # keep only the rounds that surely fit the budget
        fit = max(0, (budget - n_calls - per * (1 + samples)) // per_round)
        config = dataclasses.replace(config, pi_rounds=int(min(config.pi_rounds, fit)))
    trainer = ConstructiveTrainer(config, policy=policy)
    curve = [(n_calls, min(zs.greedy_time, zs.best_time))]
    if config.pi_rounds > 0:  # approximate policy iteration on this task: the rollout over the student relabels it
        rep = trainer.policy_iteration([task], val=[task], rounds=config.pi_rounds)
        n_calls += sum(int(r["teacher_completions"]) + 1 for r in rep["rounds"])  # + one greedy check per round
        curve.append((n_calls, min(curve[-1][1], rep.get("val_greedy_geomean", np.inf) * task.reference)))
        log(f"  policy iteration: {config.pi_rounds} rounds, greedy {rep['val_greedy_geomean'] * task.reference * 1e3:.3f}"
            f" ms ({time.perf_counter() - t0:.1f} s)")
    # expert iteration on this task, from the policy's own greedy placement; a sampled training episode reads
    # the trained window, so it is charged N x D + 1 calls where that window covers the graph
    per_sample = placement_calls(trainer.policy, task, record=True)
    own = rollout(trainer.policy, task, samples=1, greedy=True, record=True)
    n_calls += per_sample
    task.meta["best_known"] = (float(own.times[0]), own.trace)

    def prog(phase: str, i: int, n: int, info: dict[str, float]) -> None:
        calls = n_calls + i * config.samples * per_sample
        curve.append((calls, min(curve[-1][1], task.meta["best_known"][0])))
        if i == n or i % max(1, n // 10) == 0:
            log(f"  fine-tune {i}/{n}: best sampled {task.meta['best_known'][0] * 1e3:.3f} ms "
                f"({time.perf_counter() - t0:.1f} s)")

    if budget is not None:  # what is left after the final greedy + best-of-``samples`` evaluation
        left = budget - n_calls - per * (1 + samples)
        its = left // (config.samples * per_sample)
        config = dataclasses.replace(config, rl_iters=max(0, min(config.rl_iters, its)))
        trainer.cfg = config
    if config.rl_iters > 0:
        trainer.improve([task], iters=config.rl_iters, progress=prog)
    n_calls += config.rl_iters * config.samples * per_sample
    best_t, best_trace = task.meta["best_known"]
    sampled = best_trace.actions[:, 0]
    dev = np.empty(graph.num_nodes, np.int64)
    dev[best_trace.nodes] = sampled
    rows.append(LearnedRow(f"policy fine-tuning (best of its {config.rl_iters * config.samples} samples)", "learned",
                           best_t, _feasible(graph, costs, topology, dev), dev, n_calls, time.perf_counter() - t0))
    ft = evaluate(trainer.policy, [task], samples=samples, seed=seed + 1)[0]
    n_calls += per * (1 + samples)
    secs_ft = time.perf_counter() - t0
    rows.append(LearnedRow("policy fine-tuned (greedy)", "learned", ft.greedy_time, bool(ft.greedy.feasible[0]),
                           ft.greedy.devices[0], n_calls, secs_ft))
    rows.append(LearnedRow(f"policy fine-tuned (best of {samples})", "learned", ft.best_time,
                           _feasible(graph, costs, topology, ft.best_devices), ft.best_devices, n_calls, secs_ft))
    if search_budget > 0:
        from placement_rl.baselines.search import refine

        best = min((r for r in rows if r.kind == "learned"), key=lambda r: (not r.feasible, r.step_time))
        t1 = time.perf_counter()
        p = refine(graph, costs, topology, best.devices, budget=search_budget, seed=seed)
        res = simulate(graph, costs, topology, p)
        rows.append(LearnedRow("learned + local search", "search", res.step_time, res.feasible,
                               np.asarray(p.device_of_node), n_calls + int(p.meta.get("sim_calls", search_budget)),
                               time.perf_counter() - t1))
    return FinetuneResult(task, rows, curve, trainer)


def _feasible(graph: CompGraph, costs: CostTable, topology: DeviceTopology, devices: np.ndarray) -> bool:
    """Whether a placement fits in memory (computed, never assumed)."""
    return bool(simulate(graph, costs, topology, np.asarray(devices, dtype=np.int64)).feasible)


def describe(result: FinetuneResult) -> list[dict[str, Any]]:
    """Rows as dicts with the ratio to the best one-pass heuristic (``ONE_PASS``) of the task."""
    ref = min(result.task.refs[n][0] for n in ONE_PASS if n in result.task.refs and result.task.refs[n][1])
    return [{"row": r.label, "kind": r.kind, "step_time_ms": r.step_time * 1e3, "vs_best_one_pass": r.step_time / ref,
             "feasible": r.feasible, "sim_calls": r.sim_calls, "seconds": r.seconds} for r in result.rows]
