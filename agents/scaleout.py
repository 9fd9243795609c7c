"""The constructive policy's per-task work as independent jobs for ``placement_rl.scale.Workers``.

* ``label_states(policy, jobs, workers)``: the rollout teacher over the student (``agents.policy_rollout``) on
  each job's trajectory: the teacher labelling of policy iteration and of per-decision-credit RL. A
  ``LabelJob`` carries everything that decides its labels (the task, the student's placement, ``label_every``,
  the offset, the window), drawn by the trainer before dispatch, so the labels do not depend on the worker count.
  On Ray a trajectory's labelled states are split over several jobs (each state's label depends only on the
  followed placement, so the merged labels are the same).
* ``lookahead_labels(trajectories, workers)``: the lookahead teacher (``eft_rollout``) on the student's own
  trajectories, one job per trajectory (DAgger's relabelling in imitation).
* ``refine_teachers(starts, budget, workers=)``: simulated annealing from each task's teacher placement (the
  searched teacher of ``agent.teacher_search``), one job per task.
* ``evaluate_tasks(policy, tasks, samples=, seed=, workers=)``: greedy and best-of-k placements of every task
  (``agents.constructive_eval.evaluate`` per task, with a seed derived from ``seed`` and the task's index).
* ``weights_digest(state_dict)``: a hash of a policy's weights (checkpoints of 1 and N workers are compared by it).

The policy's weights go to the object store once per call (per policy-iteration round), each task once per
``Workers``; a finished label is kept in the workers' ``store`` under a key that names all its inputs, weights
included, so a resumed run reuses exactly the labels it would compute again.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.scale import Workers

_CACHES = ("tensors", "best_known")  # per-process meta a worker rebuilds (or does not need)


def shippable(task: ConstructiveTask) -> ConstructiveTask:
    """A shallow copy of ``task`` without its per-process caches (schedule states, tensors, best known)."""
    out = copy.copy(task)
    out.meta = {k: v for k, v in task.meta.items() if isinstance(k, str) and k not in _CACHES}
    return out


def weights_digest(state: Mapping[str, Any]) -> str:
    """sha256 (16 hex digits) of a state dict's names, dtypes, shapes and bytes, in key order."""
    h = hashlib.sha256()
    for k in sorted(state):
        v = state[k]
        a = v.detach().cpu().contiguous().numpy() if hasattr(v, "detach") else np.asarray(v)
        h.update(f"{k}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def task_key(task: ConstructiveTask) -> str:
    return (f"{task.meta.get('id', '')}|{task.graph.name}|{task.graph.num_nodes}|{task.topology.name}|"
            f"{task.topology.num_devices}")


@dataclass(frozen=True)
class LabelJob:
    """One trajectory to label: ``actions`` [N] the student's placement, states ``t % every == offset``."""

    task: ConstructiveTask
    actions: np.ndarray
    every: int
    offset: int

    def key(self, weights: str) -> str:
        h = hashlib.sha256(f"{weights}|{task_key(self.task)}|{self.task.window}|{self.every}|{self.offset}|"
                           .encode())
        h.update(np.ascontiguousarray(self.actions, dtype=np.int64).tobytes())
        return "label-" + h.hexdigest()[:24]


CHUNK = 8  # labelled states per job on Ray workers (a task's states are split into jobs of about this many)


def _label(item: tuple, policy: Any) -> Any:
    from placement_rl.agents.policy_rollout import rollout_over_student

    task, actions, every, offset, window = item
    task.window = window
    return rollout_over_student(policy, task, actions=actions, label_every=every, offset=offset)


def _parts(job: LabelJob, on_ray: bool) -> int:
    """Jobs one trajectory's labelling is split into: 1 in this process; on Ray about ``CHUNK`` labelled states
    each (part ``p`` of ``k`` labels states ``t % (every k) == offset + p every``: together exactly the job's)."""
    if not on_ray:
        return 1
    states = max(1, -(-(job.task.graph.num_nodes - job.offset) // job.every))
    return max(1, -(-states // CHUNK))


def _merge(parts: Sequence[Any]) -> Any:
    """One ``RolloutLabels`` of a trajectory's parts (disjoint labelled states; the same followed placement)."""
    if len(parts) == 1:
        return parts[0]
    out = copy.copy(parts[0])
    out.labels, out.regret, out.labelled = out.labels.copy(), out.regret.copy(), out.labelled.copy()
    for p in parts[1:]:
        out.labels[p.labelled] = p.labels[p.labelled]
        out.regret[p.labelled] = p.regret[p.labelled]
        out.labelled |= p.labelled
    out.completions = sum(p.completions for p in parts)
    return out


def _lookahead_labels(item: tuple[Any, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    from placement_rl.cost.lookahead import eft_rollout

    task, actions = item
    _, labels, regret = eft_rollout(task.graph, task.costs, task.topology, actions=actions)
    return labels, regret


def _refine_teacher(item: tuple[Any, np.ndarray, int, int]) -> tuple[np.ndarray, float, bool]:
    from placement_rl.baselines.search import refine

    task, start, budget, seed = item
    p = refine(task.graph, task.costs, task.topology, start, budget=budget, seed=seed)
    return np.asarray(p.device_of_node), float(p.meta["step_time"]), bool(p.meta["feasible"])


def refine_teachers(starts: Sequence[tuple[ConstructiveTask, np.ndarray]], budget: int, *, seed: int = 0,
                    workers: Workers | None = None) -> list[tuple[np.ndarray, float, bool]]:
    """``(placement, step time, feasible)`` of simulated annealing (``baselines.search.refine``, ``budget``
    simulator calls, seed ``seed + i``) from each ``(task, placement)``, one job per task, in order: a searched
    teacher for imitation. Never worse than its start; the same for any worker count."""
    workers = workers if workers is not None else Workers(1)
    items = [(workers.put(t, ship=shippable), np.asarray(a), int(budget), seed + i) for i, (t, a) in enumerate(starts)]
    return workers.map(_refine_teacher, items, cost=[float(t.graph.num_nodes) * budget for t, _ in starts])


def lookahead_labels(trajectories: Sequence[tuple[ConstructiveTask, np.ndarray]], workers: Workers | None = None,
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(labels [N], regret [N, D])`` of the lookahead teacher (``eft_rollout``) on each ``(task, placement)``
    trajectory, in order, one job per trajectory (DAgger's relabelling of the student's states). The labels are
    a pure function of the task and the placement, so any worker count gives the same."""
    workers = workers if workers is not None else Workers(1)
    items = [(workers.put(t, ship=shippable), np.asarray(a)) for t, a in trajectories]
    cost = [float(t.graph.num_nodes) ** 2 * t.topology.num_devices for t, _ in trajectories]
    return workers.map(_lookahead_labels, items, cost=cost)


def label_states(policy: Any, jobs: Sequence[LabelJob], workers: Workers | None = None, *,
                 progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """``RolloutLabels`` of every job, in order (``agents.policy_rollout.rollout_over_student``). On Ray a
    trajectory's states are labelled by several jobs (``CHUNK``) whose labels are merged: the same labels, with
    work fine enough to spread. With a ``store``, each trajectory's labels are kept as soon as they are complete
    and taken from there when present."""
    workers = workers if workers is not None else Workers(1)
    keys = None
    if workers.store is not None:
        weights = weights_digest(policy.state_dict())
        keys = [j.key(weights) for j in jobs]
    out: list[Any] = [None] * len(jobs)
    todo = []
    for i in range(len(jobs)):
        found, value = workers.lookup(keys[i]) if keys else (False, None)
        if found:
            out[i] = value
        else:
            todo.append(i)
    owner, items, cost = [], [], []
    for i in todo:
        j = jobs[i]
        k = _parts(j, workers.on_ray)
        ref = workers.put(j.task, ship=shippable)
        for p in range(k):
            owner.append(i)
            items.append((ref, j.actions, j.every * k, j.offset + p * j.every, j.task.window))
            cost.append(j.task.graph.num_nodes ** 2 * j.task.topology.num_devices ** 2 / (j.every * k))
    pieces: dict[int, list[Any]] = {i: [] for i in todo}
    need = {i: owner.count(i) for i in todo}
    done = [len(jobs) - len(todo)]
    if progress and done[0]:
        progress(done[0], len(jobs))

    def collect(n: int, value: Any) -> None:
        i = owner[n]
        pieces[i].append(value)
        if len(pieces[i]) == need[i]:
            out[i] = _merge(pieces[i])
            if keys:
                workers.keep(keys[i], out[i])
            done[0] += 1
            if progress:
                progress(done[0], len(jobs))

    workers.map(_label, items, shared=(policy,), cost=cost, on_result=collect)
    return out


def task_seed(seed: int, index: int) -> int:
    """The sampling seed of task ``index`` of an evaluation seeded with ``seed``."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def _evaluate(item: tuple, policy: Any) -> tuple:
    from placement_rl.agents.constructive_eval import evaluate

    task, samples, seed, window = item
    task.window = window
    r = evaluate(policy, [task], samples=samples, seed=seed)[0]
    return r.greedy, r.sampled, r.greedy_seconds, r.sampled_seconds


def evaluate_tasks(policy: Any, tasks: Sequence[ConstructiveTask], *, samples: int = 16, seed: int = 0,
                   workers: Workers | None = None, progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """``TaskResult`` of every task (greedy and best of ``samples``), task ``i`` sampled with
    ``task_seed(seed, i)``: the same results for any worker count."""
    from placement_rl.agents.constructive_eval import TaskResult

    workers = workers if workers is not None else Workers(1)
    items = [(workers.put(t, ship=shippable), int(samples), task_seed(seed, i), t.window) for i, t in enumerate(tasks)]
    cost = [t.graph.num_nodes * (1 + samples) for t in tasks]
    got = workers.map(_evaluate, items, shared=(policy,), progress=progress, cost=cost)
    from placement_rl.agents.constructive import state_window

    for t in tasks:  # the window the placements read (a worker's copy of the task was set, not this one): the
        t.window = state_window(policy, t.graph.num_nodes)  # rows count its completions (``episode_calls``)
    return [TaskResult(t, g, s, gs, ss) for t, (g, s, gs, ss) in zip(tasks, got)]
