"""The constructive policy's per-task work as independent jobs for ``placement_rl.scale.Workers``.

* ``label_states(policy, jobs, workers)``: the rollout teacher over the student (``agents.policy_rollout``) on
  each job's trajectory: the teacher labelling of policy iteration and of per-decision-credit RL. A
  ``LabelJob`` carries everything that decides its labels (the task, the student's placement, ``label_every``,
  the offset, the window), drawn by the trainer before dispatch, so the labels do not depend on the worker count.
* ``evaluate_tasks(policy, tasks, samples=, seed=, workers=)``: greedy and best-of-k placements of every task
  (``agents.constructive_train.evaluate`` per task, with a seed derived from ``seed`` and the task's index).
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

from envs.constructive_task import ConstructiveTask
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


def _label(item: tuple, policy: Any) -> Any:
    from agents.policy_rollout import rollout_over_student

    task, actions, every, offset, window = item
    task.window = window
    return rollout_over_student(policy, task, actions=actions, label_every=every, offset=offset)


def label_states(policy: Any, jobs: Sequence[LabelJob], workers: Workers | None = None, *,
                 progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """``RolloutLabels`` of every job, in order (``agents.policy_rollout.rollout_over_student``)."""
    workers = workers if workers is not None else Workers(1)
    weights = weights_digest(policy.state_dict()) if workers.store is not None else ""
    items = [(workers.put(j.task, ship=shippable), j.actions, j.every, j.offset, j.task.window) for j in jobs]
    keys = [j.key(weights) for j in jobs] if workers.store is not None else None
    cost = [j.task.graph.num_nodes ** 2 * j.task.topology.num_devices / j.every for j in jobs]
    return workers.map(_label, items, shared=(policy,), progress=progress, keys=keys, cost=cost)


def task_seed(seed: int, index: int) -> int:
    """The sampling seed of task ``index`` of an evaluation seeded with ``seed``."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def _evaluate(item: tuple, policy: Any) -> tuple:
    from agents.constructive_train import evaluate

    task, samples, seed, window = item
    task.window = window
    r = evaluate(policy, [task], samples=samples, seed=seed)[0]
    return r.greedy, r.sampled, r.greedy_seconds, r.sampled_seconds


def evaluate_tasks(policy: Any, tasks: Sequence[ConstructiveTask], *, samples: int = 16, seed: int = 0,
                   workers: Workers | None = None, progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """``TaskResult`` of every task (greedy and best of ``samples``), task ``i`` sampled with
    ``task_seed(seed, i)``: the same results for any worker count."""
    from agents.constructive_train import TaskResult

    workers = workers if workers is not None else Workers(1)
    items = [(workers.put(t, ship=shippable), int(samples), task_seed(seed, i), t.window) for i, t in enumerate(tasks)]
    cost = [t.graph.num_nodes * (1 + samples) for t in tasks]
    got = workers.map(_evaluate, items, shared=(policy,), progress=progress, cost=cost)
    return [TaskResult(t, g, s, gs, ss) for t, (g, s, gs, ss) in zip(tasks, got)]
