"""Expert iteration with search as the teacher: the student learns what search finds, not what a rule does.

Each round (``expert_iteration(trainer, tasks, ...)``):

1. the student places every task greedily (its own decode, the states it will see when placing);
2. a **multi-start search** per task (``search_job``): simulated annealing (``baselines.search.anneal``, the local
   search's moves and schedule) from the student's placement, from the ``la_rule`` placement (the one-pass rule the
   student must beat) and from the best placement known for the task so far, ``ei_search_budget`` simulator calls split
   over the starts, seeds drawn per (round, task); the best of everything is the task's new best known placement
   (never worse than the best teacher it started from);
3. the student is trained to reproduce each task's best known placement **in its own decoding order**: the
   placement is replayed through the schedule state (``FORCED``) and the states along it are labelled with its
   devices (cross-entropy), for ``ei_epochs`` epochs, tasks shuffled;
4. with validation tasks, their greedy geometric mean (over the best one-pass heuristic) is recorded and the best
   round's weights are kept.

Search jobs run on the trainer's ``Workers`` (one job per task, results in task order: the same for any worker
count). Returns per-round figures: how often search beat the student's and the rule's placements and by how much,
the agreement reached, and the validation score.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from placement_rl.agents.constructive import imitation_loss, rollout
from placement_rl.agents.scaleout import shippable
from placement_rl.envs.constructive_task import ConstructiveTask

Progress = Callable[[str, int, int, dict[str, float]], None]


def search_job(item: tuple) -> tuple[np.ndarray, float, bool]:
    """``(devices, step time, feasible)``: the best of annealing runs from each start (module doc)."""
    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.search import anneal

    task, starts, budget, seed = item
    prob = Problem(task.graph, task.costs, task.topology, budget=int(budget), seed=int(seed))
    best, best_s = None, None
    share = max(1, int(budget) // max(1, len(starts)))
    for i, start in enumerate(starts):
        s = prob.score(start)
        if s is None:
            break
        if best_s is None or s.key < best_s.key:
            best, best_s = np.asarray(start, np.int64).copy(), s
        sub = Problem(task.graph, task.costs, task.topology, budget=share, seed=int(seed) * 7919 + i)
        s0 = sub.score(start)
        if s0 is None:
            continue
        dev = anneal(sub, start, s0)
        sd = sub.score(dev)
        if sd is not None and sd.key < best_s.key:
            best, best_s = dev.copy(), sd
    assert best is not None and best_s is not None
    return best, float(best_s.step_time), bool(best_s.feasible)


def _best_known(task: ConstructiveTask) -> tuple[float, bool, np.ndarray]:
    if "ei_best" not in task.meta:
        name, dev = task.teacher()
        t, ok, _ = task.refs[name]
        task.meta["ei_best"] = (float(t), bool(ok), np.asarray(dev, np.int64))
    return task.meta["ei_best"]


def expert_iteration(trainer: Any, tasks: Sequence[ConstructiveTask], *, val: Sequence[ConstructiveTask] = (),
                     rounds: int | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Rounds of search-then-distil on ``tasks`` (module doc); ``trainer`` is a ``ConstructiveTrainer``."""
    cfg = trainer.cfg
    rounds = cfg.ei_rounds if rounds is None else rounds
    trainer._prepare(list(tasks) + list(val))
    pool = [t for t in tasks if t.graph.num_nodes <= cfg.ei_max_nodes and t.topology.num_devices > 1]
    best = trainer._snapshot(val)
    report: dict[str, Any] = {"rounds": [], "tasks": len(pool),
                              "val_greedy_geomean_start": best[0] if best else None}
    for rnd in range(1, rounds + 1):
        trainer.policy.eval()
        greedy = [rollout(trainer.policy, t, samples=1, greedy=True) for t in pool]
        items = []
        for i, (t, ro) in enumerate(zip(pool, greedy)):
            starts = [ro.devices[0]]
            if "la_rule" in t.refs:
                starts.append(t.refs["la_rule"][2])
            starts.append(_best_known(t)[2])
            items.append((trainer.workers.put(t, ship=shippable), starts, int(cfg.ei_search_budget),
                          int(trainer.rng.integers(2**31))))
        show = (lambda i, n, r=rnd: progress(f"expert iteration {r} search", i, n, {})) if progress else None
        found = trainer.workers.map(search_job, items, progress=show,
                                    cost=[float(t.graph.num_nodes) * cfg.ei_search_budget for t in pool])
        over_student, over_rule = [], []
        for t, ro, (dev, time_, ok) in zip(pool, greedy, found):
            bt, bok, _ = _best_known(t)
            if ok and (not bok or time_ < bt * (1 - 1e-12)):
                t.meta["ei_best"] = (time_, ok, dev)
            bt, bok, _ = _best_known(t)
            if bok and bool(ro.feasible[0]):
                over_student.append(bt / float(ro.times[0]))
            if bok and "la_rule" in t.refs and t.refs["la_rule"][1]:
                over_rule.append(bt / t.refs["la_rule"][0])
        data = [(t, rollout(None, t, forced=_best_known(t)[2], record=True).trace) for t in pool]
        agree = trainer._distil(data, cfg.ei_epochs, cfg.ei_lr,
                                lambda it: imitation_loss(trainer.policy, it[0], it[1]), count=True)
        gm = (lambda x: float(np.exp(np.mean(np.log(x)))) if x else float("nan"))
        rec: dict[str, Any] = {"phase": "expert_iteration", "round": rnd, "agreement": agree,
                               "searched_over_student": gm(over_student), "searched_over_la_rule": gm(over_rule),
                               "search_calls": int(cfg.ei_search_budget) * len(pool), "decisions": trainer.decisions}
        best = trainer._end_round(rec, val, best, report, progress, "expert iteration", rnd, rounds)
    return trainer._keep_best(best, report)


__all__ = ["expert_iteration", "search_job"]
