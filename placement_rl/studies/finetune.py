"""Per-graph fine-tuning of a (pretrained) constructive policy, reported row by row.

``finetune(graph, topology, costs, policy, config)`` places one (graph, topology) with the policy as it is
(zero-shot), fine-tunes it on that task (up to ``config.pi_rounds`` rounds of policy iteration: the rollout over
the student on its own trajectory, whose placement the student then clones until its greedy decode reproduces it;
then expert iteration from the best placement known, never from a heuristic's), places again, and optionally runs a
local search seeded by the policy's best placement. Every result is its own named row (``LearnedRow``): the
policy's greedy and best-of-k before and after fine-tuning and the best placement **it produced** while
fine-tuning (a sample or a greedy decode) are learned; the rollout's own placement (policy iteration's teacher) and
``learned + local search`` are search rows; the
one-pass heuristics (HEFT, m-ETF, m-SCT, METIS), ``sim_eft`` and ``eft_rollout`` are heuristic rows. Simulator
calls are counted as complete placements evaluated (a one-pass rule: 1; ``eft_rollout``: one per tried device and
decision, about N x D; a learned row: its episodes), and every row carries its seconds (the learned rows' exclude
building the heuristics' rows) and its computed feasibility. Calls and seconds are on one basis in each row: the
zero-shot rows' are their own; those of the rows after them (fine-tuning, fine-tuned, the searches seeded by the
policy, ``learned + local search`` too) count all the learned work from the zero-shot evaluation on. The fine-tuned
best-of-k samples with the zero-shot one's seed, so equal weights give equal rows; ``FinetuneResult.note`` says
when fine-tuning left the weights as they were.
"""

from __future__ import annotations

import dataclasses

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from placement_rl.agents.constructive import placement_calls, rollout, state_window
from placement_rl.agents.policy_rollout import rollout_over_student
from placement_rl.agents.constructive_eval import evaluate
from placement_rl.agents.constructive_train import ConstructiveConfig, ConstructiveTrainer
from placement_rl.agents.device_policy import DevicePolicy
from placement_rl.envs.constructive_task import ONE_PASS, ConstructiveTask
from placement_rl.cost import simulate
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology


CLONE_CHECK_EVERY = 5  # epochs between the greedy checks while a round's rollout placement is cloned
# a search round's clone stops after this many times the round's search seconds: where the greedy decode does not
# follow the teacher (a 2,000-node layered graph: agreement 0.965 after 400 epochs, 21 s) it spends no more; the
# default 300-node case reproduces in ~2 s (a 3 s search), a 1,000-node dataflow graph needs ~260-340 epochs
# (~20 ms each; at 2 x its 290 epochs in 6 s missed)
CLONE_SECONDS = 3.0


@dataclass
class LearnedRow:
    label: str
    kind: str  # learned | search | heuristic | bound
    step_time: float
    feasible: bool
    devices: np.ndarray = field(repr=False)
    sim_calls: int = 0
    seconds: float = 0.0
    same_seconds_as: str = ""  # a search row run for the seconds of this learned row
    search: str = ""  # that search's placer name (``policy_search``, ``local_search``, ...)


@dataclass
class FinetuneResult:
    task: ConstructiveTask
    rows: list[LearnedRow]
    curve: list[tuple[int, float]]  # (simulator calls, best learned step time so far)
    trainer: ConstructiveTrainer
    note: str = ""  # one line when fine-tuning left the policy's weights as they were (``unchanged_note``)

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
    from placement_rl.baselines.bounds import lower_bound

    task = ConstructiveTask.build(graph, topology, costs, id=f"{graph.name}@{topology.name}")
    secs, calls = task.meta.get("ref_seconds", {}), task.meta.get("ref_calls", {})
    tb = time.perf_counter()
    bound = lower_bound(graph, costs, topology)
    rows = [LearnedRow("lower bound (no placement is faster: " + ", ".join(bound.parts) + ")", "bound", bound.value,
                       True, np.zeros(graph.num_nodes, np.int64), 0, time.perf_counter() - tb)]
    rows += [LearnedRow(name, "heuristic", t, ok, dev, int(calls.get(name, 1)), float(secs.get(name, 0.0)))
             for name, (t, ok, dev) in task.refs.items()]
    if "la_rule" in task.refs:  # the rule on slower views of the links too: the bar of the best-of-k row
        from placement_rl import baselines

        p = baselines.get("la_rule_links")(graph, costs, topology, budget=10**12, seed=seed)
        rows.append(LearnedRow("la_rule_links", "heuristic", float(p.meta["step_time"]), bool(p.meta["feasible"]),
                               np.asarray(p.device_of_node, np.int64), int(p.meta["sim_calls"]),
                               float(p.meta["search_seconds"])))
    if budget is not None:  # the whole-graph window costs N x D calls per placement: at a budget, read W only
        policy.full_window = 0  # (a graph within W still reads all of it)
    per = placement_calls(policy, task)  # calls per evaluated placement (N x D completions with the whole-graph window)
    if budget is not None:
        samples = max(1, min(samples, budget // (2 * per) - 1))  # both evaluations (zero-shot, fine-tuned) fit
    t0 = time.perf_counter()  # the learned rows' own seconds: not the heuristics' (teachers are not needed here)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}  # whether fine-tuning changes them
    zs_window = state_window(policy, graph.num_nodes)
    zs = evaluate(policy, [task], samples=samples, seed=seed)[0]
    n_calls = per * (1 + samples)
    t_zs = time.perf_counter() - t0
    rows.append(LearnedRow("policy zero-shot (greedy)", "learned", zs.greedy_time, bool(zs.greedy.feasible[0]),
                           zs.greedy.devices[0], per, zs.greedy_seconds))  # its own seconds (the samples' are not)
    rows.append(LearnedRow(f"policy zero-shot (best of {samples})", "learned", zs.best_time,
                           _feasible(graph, costs, topology, zs.best_devices), zs.best_devices, n_calls, t_zs))
    trainer = ConstructiveTrainer(config, policy=policy)
    curve = [(n_calls, min(zs.greedy_time, zs.best_time))]
    # fine-tuning trains and decodes at the trained window W, and the fine-tuned policy keeps placing at W (the
    # states it was fitted on; its checkpoint says so): the whole-graph window is the zero-shot placement's
    policy.full_window = 0
    trainer.cfg = config = dataclasses.replace(config, full_window=0)
    per_ft = placement_calls(policy, task)  # calls per placement of the fine-tuned policy
    # the best placement the policy itself produced so far (greedy, sampled, or a greedy check while cloning)
    own = rollout(trainer.policy, task, samples=1, greedy=True, record=True)
    n_calls += placement_calls(trainer.policy, task, record=True)
    cands = [(zs.greedy_time, zs.greedy.devices[0], bool(zs.greedy.feasible[0])),
             (zs.best_time, zs.best_devices, rows[-1].feasible),
             (float(own.times[0]), own.devices[0], bool(own.feasible[0]))]
    task.meta["best_sampled"] = min(((t, d) for t, d, ok in cands if ok), key=lambda x: x[0],
                                    default=(np.inf, own.devices[0]))
    task.meta["best_known"] = (float(own.times[0]), own.trace)  # what expert iteration clones
    reserve = per_ft * (1 + samples)  # the final greedy + best-of-``samples`` evaluation
    pi_size = graph.num_nodes <= config.pi_max_nodes and graph.num_nodes * topology.num_devices <= \
        config.pi_max_completions
    if config.pi_rounds > 0 and topology.num_devices > 1 and not pi_size:
        log(f"  no policy iteration: {graph.num_nodes} nodes x {topology.num_devices} devices is above "
            f"agent.pi_max_nodes={config.pi_max_nodes} / agent.pi_max_completions={config.pi_max_completions} "
            f"(a round is O(N^2 W D^2)); expert iteration only")
    elif config.pi_rounds > 0 and topology.num_devices > 1:
        n_calls, teacher = _own_policy_iteration(trainer, task, config, n_calls, budget, reserve, curve, log, t0)
        if teacher is not None:  # the rollout's own placement: a search row (the policy was trained towards it)
            rows.append(LearnedRow("rollout over the policy (policy iteration's teacher)", "search", teacher[0],
                                   _feasible(graph, costs, topology, teacher[1]), teacher[1], teacher[2],
                                   time.perf_counter() - t0))
    if config.ft_search_rounds > 0 and topology.num_devices > 1:
        limit = None if budget is None else budget - reserve  # the searches' calls count in the budget too
        n_calls, teacher = _search_rounds(trainer, task, config, n_calls, curve, log, t0, seed, limit)
        if teacher is not None:  # the search's own placement: a search row (the policy was trained towards it)
            rows.append(LearnedRow("search from the policy's placements (fine-tuning's teacher)", "search",
                                   teacher[0], _feasible(graph, costs, topology, teacher[1]), teacher[1], teacher[2],
                                   teacher[3]))
    # expert iteration on this task: clone the best placement known (the policy's own, or its rollout's), sample;
    # a sampled training episode reads the trained window, so it is charged N x D + 1 calls where that window
    # covers the graph
    per_sample = placement_calls(trainer.policy, task, record=True)

    def prog(phase: str, i: int, n: int, info: dict[str, float]) -> None:
        calls = n_calls + i * config.samples * per_sample
        curve.append((calls, min(curve[-1][1], task.meta["best_sampled"][0])))
        if i == n or i % max(1, n // 10) == 0:
            log(f"  fine-tune {i}/{n}: best sampled {task.meta['best_sampled'][0] * 1e3:.3f} ms "
                f"({time.perf_counter() - t0:.1f} s)")

    if budget is not None:  # what is left after the final greedy + best-of-``samples`` evaluation
        left = budget - n_calls - reserve
        its = left // (config.samples * per_sample)
        config = dataclasses.replace(config, rl_iters=max(0, min(config.rl_iters, its)))
        trainer.cfg = config
    if config.rl_iters > 0:
        trainer.improve([task], iters=config.rl_iters, progress=prog)
    n_calls += config.rl_iters * config.samples * per_sample
    best_t, dev = task.meta["best_sampled"]
    label = (f"policy fine-tuning (best of its {config.rl_iters * config.samples} samples and greedy placements)"
             if config.rl_iters > 0 else "policy fine-tuning (best of its greedy placements)")
    rows.append(LearnedRow(label, "learned", best_t, _feasible(graph, costs, topology, dev), dev,
                           n_calls, time.perf_counter() - t0))
    # the zero-shot evaluation's draws: equal weights give equal rows
    ft = evaluate(trainer.policy, [task], samples=samples, seed=seed)[0]
    greedy_calls = n_calls + per_ft  # the greedy row: fine-tuning and its own placement, not the samples
    n_calls += per_ft * (1 + samples)
    secs_ft = time.perf_counter() - t0
    rows.append(LearnedRow("policy fine-tuned (greedy)", "learned", ft.greedy_time, bool(ft.greedy.feasible[0]),
                           ft.greedy.devices[0], greedy_calls, secs_ft - ft.sampled_seconds))
    rows.append(LearnedRow(f"policy fine-tuned (best of {samples})", "learned", ft.best_time,
                           _feasible(graph, costs, topology, ft.best_devices), ft.best_devices, n_calls, secs_ft))
    if search_budget > 0:
        from placement_rl.baselines.search import refine

        best = min((r for r in rows if r.kind == "learned"), key=lambda r: (not r.feasible, r.step_time))
        p = refine(graph, costs, topology, best.devices, budget=search_budget, seed=seed)
        res = simulate(graph, costs, topology, p)
        # calls and seconds alike: the learned work it starts from plus the refine's
        rows.append(LearnedRow("learned + local search", "search", res.step_time, res.feasible,
                               np.asarray(p.device_of_node), n_calls + int(p.meta.get("sim_calls", search_budget)),
                               time.perf_counter() - t0))
    note = unchanged_note(before, trainer.policy, zs_window, state_window(trainer.policy, graph.num_nodes))
    return FinetuneResult(task, rows, curve, trainer, note)


def unchanged_note(before: dict[str, Any], policy: DevicePolicy, zs_window: int, ft_window: int) -> str:
    """One line when ``policy``'s weights are still ``before``: its fine-tuned rows are then the zero-shot policy's
    placements, drawn with the same seed (at its trained window where that is narrower than the zero-shot
    ``zs_window``); empty when fine-tuning changed them."""
    now = policy.state_dict()
    if before.keys() != now.keys() or not all(torch.equal(before[k], now[k]) for k in now):
        return ""
    where = "" if ft_window == zs_window else (f" placing at its trained window of {ft_window} nodes (the zero-shot "
                                              "rows read the whole graph)")
    return ("fine-tuning left the policy's weights unchanged: the fine-tuned rows are the zero-shot policy's "
            f"placements{where}, sampled with the same seed")


def _own_policy_iteration(trainer: ConstructiveTrainer, task: ConstructiveTask, config: ConstructiveConfig,
                          n_calls: int, budget: int | None, reserve: int, curve: list, log: Callable[[str], None],
                          t0: float) -> tuple[int, tuple[float, np.ndarray, int] | None]:
    """Policy iteration on one task: each round runs the rollout over the student on **its own** trajectory
    (``agents.policy_rollout``: at every decision each device is tried and the rest completed by the student's
    greedy decode; fortified, so never slower than the student's greedy placement), then clones that placement
    until the student's greedy decode reproduces it (at most ``clone_epochs``; each check is a greedy placement
    of the policy's own, charged one placement). Rounds stop when the rollout no longer improves on the best
    placement known, at ``pi_rounds``, or when the next round would not fit ``budget`` (the rollout charged N x
    D completions, each as a placement at the trained window, plus the checks). Returns the calls spent so far
    and the best rollout placement ``(time, devices, calls)`` (None without a round)."""
    graph, topo = task.graph, task.topology
    n, nd = graph.num_nodes, topo.num_devices
    per_check = placement_calls(trainer.policy, task, record=False)
    checks = per_check * (config.clone_epochs // CLONE_CHECK_EVERY + 1)
    # each completion of the rollout is a decode of the student at its trained window: charged as one placement
    # there (an upper bound: it starts at the decision, not at the first node), in the budget and the count alike
    per_completion = placement_calls(trainer.policy, task, record=True)
    round_calls = n * nd * per_completion + 1
    teacher = None

    def seen(t: float, dev: np.ndarray) -> None:
        nonlocal n_calls
        n_calls += per_check
        if t < task.meta["best_sampled"][0]:  # an infeasible check reports t = inf
            task.meta["best_sampled"] = (t, dev.copy())
        curve.append((n_calls, min(curve[-1][1], task.meta["best_sampled"][0])))

    for rnd in range(1, config.pi_rounds + 1):
        if budget is not None and n_calls + round_calls + checks + reserve > budget:
            break
        trainer.policy.eval()
        task.window = state_window(trainer.policy, n, record=True)
        lab = rollout_over_student(trainer.policy, task)
        fr = rollout(None, task, samples=1, forced=lab.devices, record=True)
        n_calls += lab.completions * per_completion + 1
        t_r = float(fr.times[0]) if fr.feasible[0] else float("inf")
        if not t_r < task.meta["best_known"][0] * (1 - 1e-9):
            log(f"  policy iteration {rnd}: the rollout over the policy gains nothing ({t_r * 1e3:.3f} ms); stop")
            break
        task.meta["best_known"] = (t_r, fr.trace)
        teacher = (t_r, lab.devices.copy(), n_calls)
        epochs, agree = trainer.clone(task, fr.trace, t_r, max_epochs=config.clone_epochs,
                                      check_every=CLONE_CHECK_EVERY, on_check=seen)
        log(f"  policy iteration {rnd}: rollout {t_r * 1e3:.3f} ms, cloned in {epochs} epochs (agreement "
            f"{agree:.3f}); the policy's best {task.meta['best_sampled'][0] * 1e3:.3f} ms "
            f"({time.perf_counter() - t0:.1f} s)")
    return n_calls, teacher


def _search_rounds(trainer: ConstructiveTrainer, task: ConstructiveTask, config: ConstructiveConfig, n_calls: int,
                   curve: list, log: Callable[[str], None], t0: float, seed: int,
                   limit: int | None = None) -> tuple[int, tuple[float, np.ndarray, int, float] | None]:
    """Expert iteration on one task with search as the teacher: each round anneals (``baselines.search.anneal``,
    ``ft_search_seconds`` of wall clock) from the best placement the policy produced so far and from ``la_rule``'s,
    then clones the best placement found until the student's greedy decode reproduces it (at most
    ``clone_epochs``; each greedy check charged one placement), keeping the weights of the fastest greedy decode
    seen (a clone that does not take leaves the policy as it was). Rounds stop at ``ft_search_rounds`` or as soon as a
    round's search gains nothing over the best known (the stall). Returns the calls spent so far and the search's
    best ``(time, devices, calls, seconds)`` (None when no round improved)."""
    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.search import anneal

    graph, topo = task.graph, task.topology
    per_check = placement_calls(trainer.policy, task, record=False)
    teacher = None
    rng = np.random.default_rng(seed)

    def seen(t: float, dev: np.ndarray) -> None:
        nonlocal n_calls
        n_calls += per_check
        if t < task.meta["best_sampled"][0]:
            task.meta["best_sampled"] = (t, dev.copy())
        curve.append((n_calls, min(curve[-1][1], task.meta["best_sampled"][0])))

    best_t = task.meta["best_sampled"][0]
    checks = per_check * (config.clone_epochs // CLONE_CHECK_EVERY + 1)
    if limit is not None and n_calls + per_check + checks + 2 > limit:
        log("  no search rounds: the call budget leaves no room for a search and its clone's greedy checks")
        return n_calls, None
    trainer.policy.eval()
    g0 = rollout(trainer.policy, task, samples=1, greedy=True)
    n_calls += per_check
    greedy_t = float(g0.times[0]) if g0.feasible[0] else float("inf")
    for rnd in range(1, config.ft_search_rounds + 1):
        left = None if limit is None else limit - n_calls - checks  # calls this round's search may spend
        if left is not None and left < 2:
            log(f"  search round {rnd}: no calls left in the budget; stop")
            break
        starts = [task.meta["best_sampled"][1]]
        if "la_rule" in task.refs and task.refs["la_rule"][1]:
            starts.append(task.refs["la_rule"][2])
        found_t, found_dev = np.inf, None
        for i, start in enumerate(starts):
            prob = Problem(graph, task.costs, topo, seed=int(rng.integers(2**31)),
                           budget=10**12 if left is None else max(1, left // len(starts)),
                           seconds=float(config.ft_search_seconds) / len(starts))
            s0 = prob.score(start)
            if s0 is None:
                continue
            dev = anneal(prob, np.asarray(start, np.int64), s0)
            sd = prob.score(dev)
            n_calls += prob.calls
            if sd is not None and sd.feasible and sd.step_time < found_t:
                found_t, found_dev = sd.step_time, dev
        if found_dev is None or not found_t < min(best_t, task.meta["best_sampled"][0]) * (1 - 1e-9):
            log(f"  search round {rnd}: nothing better than {min(best_t, task.meta['best_sampled'][0]) * 1e3:.3f} ms; "
                f"stop ({time.perf_counter() - t0:.1f} s)")
            break
        best_t = found_t
        teacher = (found_t, found_dev.copy(), n_calls, time.perf_counter() - t0)
        fr = rollout(None, task, samples=1, forced=found_dev, record=True)
        task.meta["best_known"] = (found_t, fr.trace)
        kept = {"t": greedy_t, "w": trainer._weights()}  # the weights whose greedy decode is fastest so far

        def check(t: float, dev: np.ndarray) -> None:
            seen(t, dev)
            if t < kept["t"]:
                kept["t"], kept["w"] = t, trainer._weights()

        epochs, agree = trainer.clone(task, fr.trace, found_t, max_epochs=config.clone_epochs,
                                      check_every=CLONE_CHECK_EVERY, on_check=check,
                                      seconds=CLONE_SECONDS * float(config.ft_search_seconds))
        trainer.policy.load_state_dict(kept["w"])  # never leave the policy with a slower greedy decode
        greedy_t = kept["t"]
        missed = ("" if greedy_t <= found_t * (1 + 1e-6) else "; the clone's greedy decode does not reproduce the "
                  "search's placement: the weights whose greedy was fastest are kept")
        log(f"  search round {rnd}: {found_t * 1e3:.3f} ms, cloned for {epochs} epochs (agreement {agree:.3f}); the "
            f"policy's greedy {greedy_t * 1e3:.3f} ms, its best {task.meta['best_sampled'][0] * 1e3:.3f} ms "
            f"({time.perf_counter() - t0:.1f} s){missed}")
    return n_calls, teacher


def _feasible(graph: CompGraph, costs: CostTable, topology: DeviceTopology, devices: np.ndarray) -> bool:
    """Whether a placement fits in memory (computed, never assumed)."""
    return bool(simulate(graph, costs, topology, np.asarray(devices, dtype=np.int64)).feasible)


def search_at_seconds(name: str, policy: DevicePolicy, graph: CompGraph, costs: CostTable, topology: DeviceTopology,
                      seconds: float, *, seed: int = 0, task: ConstructiveTask | None = None):
    """The search ``name`` for ``seconds`` of wall clock: ``policy_search`` with ``policy`` as its proposal, or a
    registered placer (``local_search``, ``la_rule_search``, ...) with no call limit; its ``Placement``."""
    from placement_rl import baselines
    from placement_rl.agents.policy_search import policy_search

    if name == "policy_search":
        return policy_search(policy, graph, costs, topology, seconds=seconds, seed=seed, task=task)
    return baselines.get(name)(graph, costs, topology, budget=10**12, seed=seed, seconds=seconds)


SearchAsk = tuple[str, float, Sequence[str]]  # (learned row, its seconds, the searches to run for them)


def equal_seconds_rows(result: FinetuneResult, policy: DevicePolicy, asks: Sequence[SearchAsk], *, seed: int = 0,
                       processes: int | None = None, log: Callable[[str], None] = print) -> None:
    """Add the searches a user would run instead of each learned row of ``asks``, each given that row's seconds of
    wall clock: ``policy_search`` with ``policy`` (the policy before fine-tuning) as its proposal, and registered
    searches (``local_search``, ``la_rule_search``: annealing from ``la_rule``), as search rows of ``result`` naming
    the row (``LearnedRow.same_seconds_as``), in the order asked. The registered searches of
    ``baselines.side_by_side.FROM_SECONDS`` seconds or more run side by side, one process each on its own core (at
    most ``processes`` at once: default the cores this process may use), the shorter ones here first; ``policy_search``
    (threaded decodes, as the learned rows had) runs here after them, alone."""
    from placement_rl.baselines import side_by_side

    t = result.task
    g, c, topo = t.graph, t.costs, t.topology

    jobs = [(name, float(sec), seed) for _, sec, names in asks for name in names if name != "policy_search"]
    n = side_by_side.processes_for(jobs, processes)
    if n > 1:
        log(f"running the searches of {side_by_side.FROM_SECONDS:g} s or more side by side, {n} at once (one process "
            f"and core each)")
    found = iter(side_by_side.run(g, c, topo, jobs, processes=n, refusals=True))
    for row, sec, names in asks:
        log(f"the searches a user would run instead, at the {sec:.2f} s of {row}:")
        for name in names:
            p = search_at_seconds(name, policy, g, c, topo, sec, seed=seed) if name == "policy_search" else next(found)
            if isinstance(p, ConfigError):  # a search that refuses this problem (too large for it)
                log(f"  {name} ({sec:.2f} s): refused: {p}")
                continue
            dev = np.asarray(p.device_of_node)
            res = simulate(g, c, topo, dev)
            result.rows.append(LearnedRow(f"{name} at the seconds of {row}", "search", res.step_time, res.feasible,
                                          dev, int(p.meta["sim_calls"]), float(p.meta["search_seconds"]),
                                          same_seconds_as=row, search=name))
            used = float(p.meta["search_seconds"])
            ended = f", ended at {used:.2f} s" if used < 0.95 * sec else ""  # a search that stops of itself
            log(f"  {name} ({sec:.2f} s{ended}): {res.step_time * 1e3:.3f} ms")


def describe(result: FinetuneResult) -> list[dict[str, Any]]:
    """Rows as dicts with the ratio to the best one-pass heuristic (``ONE_PASS``) of the task."""
    ref = min(result.task.refs[n][0] for n in ONE_PASS if n in result.task.refs and result.task.refs[n][1])
    return [{"row": r.label, "kind": r.kind, "step_time_ms": r.step_time * 1e3, "vs_best_one_pass": r.step_time / ref,
             "feasible": r.feasible, "sim_calls": r.sim_calls, "seconds": r.seconds,
             **({"same_seconds_as": r.same_seconds_as, "search": r.search} if r.same_seconds_as else {})}
            for r in result.rows]
