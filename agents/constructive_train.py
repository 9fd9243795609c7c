"""Training the constructive placement policy: imitation, then RL, with held-out early stopping.

``ConstructiveTrainer(config)`` holds a ``DevicePolicy`` and its optimiser:

1. ``imitate(tasks)``: behaviour cloning on each task's best teacher (the best of HEFT, m-ETF, m-SCT, METIS, the
   simulator-order earliest-finish rule ``sim_eft`` and its one-step lookahead ``eft_rollout``,
   ``placement_rl.cost.lookahead``) replayed through the schedule state, then DAgger rounds: where the best
   teacher is reactive (``sim_eft`` / ``eft_rollout``), the student's own greedy trajectories labelled by the
   lookahead teacher in the student's states; elsewhere the best teacher is a fixed placement, whose device
   indices mean nothing in the student's states, so those tasks keep their teacher's own trajectory.
2. ``improve(tasks)``: PPO with a per-task group baseline (``agents.constructive.ppo_loss``): each iteration
   draws ``tasks_per_iter`` tasks, samples K placements of each, rewards ``log(T_ref / T)``, takes
   ``ppo_epochs`` clipped steps, plus self-imitation of samples that beat the reference.
With ``val`` tasks given, ``improve`` keeps the weights of the best validation geometric mean (early
stopping; ``agents.constructive_eval.evaluate`` scores greedy and best-of-k placements).

Checkpoints (``save``; ``load_policy`` in ``agents.constructive_config``, re-exported here) are ``agents.checkpoint``
files with ``algo="constructive"``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from placement_rl.agents.checkpoint import save_checkpoint
from placement_rl.agents.constructive import REGRET_UNIT, Demo, eft_labels, imitation_loss, ppo_loss, rewards, rollout
from placement_rl.agents.constructive_config import (ALGO, PRETRAINED, RL_ALGOS, ConstructiveConfig,  # noqa: F401 - re-exported
                                        _obs_dims, build_policy, default_checkpoint, load_policy, set_windows)
from placement_rl.agents.constructive_eval import evaluate, geomean
from placement_rl.agents.device_policy import DevicePolicy
from placement_rl.agents.scaleout import LabelJob, label_states, lookahead_labels
from placement_rl.envs.constructive_task import REACTIVE, ConstructiveTask
from placement_rl.cost.lookahead import eft_rollout
from placement_rl.scale import Workers

Progress = Callable[[str, int, int, dict[str, float]], None]
# cloning one trajectory: the greedy decode is checked once the decisions agree with it on this share of its states
# (below it the decode leaves the trajectory early: measured on the default train case, agreement 0.94-0.99 gave
# 18-20 ms placements against the trajectory's 12.7 ms, 0.997 gave 12.8 ms)
CLONE_CHECK_FROM = 0.95


class ConstructiveTrainer:
    def __init__(self, config: ConstructiveConfig, policy: DevicePolicy | None = None, *,
                 workers: Workers | None = None) -> None:
        self.cfg = config
        self.workers = workers if workers is not None else Workers(1)  # where teacher labelling runs
        torch.manual_seed(config.seed)
        self.policy = policy if policy is not None else build_policy(config)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.decisions = 0
        self.history: list[dict[str, Any]] = []
        self.gen = torch.Generator().manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)

    def _prepare(self, tasks: Sequence[ConstructiveTask]) -> None:
        window = int(getattr(self.policy, "window", self.cfg.window))  # the states the policy was built to read
        for t in tasks:
            t.window = window

    def _set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def _step(self, loss: torch.Tensor) -> None:
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
        self.opt.step()

    # ------------------------------------------------------------------------------------------- imitation
    def imitate(self, tasks: Sequence[ConstructiveTask], *, progress: Progress | None = None) -> float:
        """Behaviour cloning then DAgger; returns the last epoch's agreement with the labels."""
        cfg = self.cfg
        self._prepare(tasks)
        self._set_lr(cfg.lr)
        self.policy.train()
        demos: list[Demo] = []  # each task's best teacher on its own trajectory
        reactive: list[bool] = []  # whether that teacher can label any state (DAgger)
        best = [t.teacher() for t in tasks]
        searched = [False] * len(tasks)
        if cfg.teacher_search > 0:  # a searched teacher: annealing from the best teacher's placement
            from placement_rl.agents.scaleout import refine_teachers

            got = refine_teachers([(t, dev) for t, (_, dev) in zip(tasks, best)], cfg.teacher_search,
                                  seed=cfg.seed, workers=self.workers)
            for i, (t, (dev, step, feasible)) in enumerate(zip(tasks, got)):
                name = best[i][0]
                ref = t.refs.get(name)
                if feasible and ref is not None and step < ref[0] * (1 - 1e-9):
                    best[i], searched[i] = (name, dev), True
            self.history.append({"phase": "teacher_search", "budget": cfg.teacher_search,
                                 "improved": int(sum(searched)), "tasks": len(tasks)})
        for t, (name, dev), srch in zip(tasks, best, searched):
            tr = rollout(None, t, forced=dev, record=True).trace
            reg = None
            if name == "eft_rollout" and cfg.regret_coef > 0 and not srch:  # kept from building the teachers
                reg = t.meta.get("eft_rollout_regret")
                reg = (eft_rollout(t.graph, t.costs, t.topology, actions=dev)[2] if reg is None else reg)[:, None]
            demos.append(Demo(t, tr, tr.actions, reg))
            reactive.append(name in REACTIVE)
        agree = 0.0
        total = cfg.bc_epochs + cfg.dagger_rounds * max(1, cfg.bc_epochs // 2)
        epoch = 0
        current = demos
        for rnd in range(cfg.dagger_rounds + 1):
            if rnd > 0:  # DAgger: the student's states, the teacher's labels
                ros = [rollout(self.policy, d.task, samples=1, greedy=True, record=True) if react else None
                       for d, react in zip(demos, reactive)]
                look = [i for i, (d, ro) in enumerate(zip(demos, ros))
                        if ro is not None and "eft_rollout" in d.task.refs]
                labelled = dict(zip(look, lookahead_labels([(demos[i].task, ros[i].devices[0]) for i in look],
                                                           self.workers)))  # O(N^2 D) each: on the workers
                current = []
                for i, (demo, ro) in enumerate(zip(demos, ros)):
                    if ro is None:  # a fixed placement's device indices mean nothing in other states
                        current.append(demo)
                    elif i in labelled:  # a reactive teacher labels the student's own states (lookahead where it ran)
                        lab, reg = labelled[i]
                        current.append(Demo(demo.task, ro.trace, lab[:, None],
                                            reg[:, None] if cfg.regret_coef > 0 else None))
                    else:
                        current.append(Demo(demo.task, ro.trace, eft_labels(ro.trace)))
                self.policy.train()
            for _ in range(cfg.bc_epochs if rnd == 0 else max(1, cfg.bc_epochs // 2)):
                order = self.rng.permutation(len(demos))
                agrees = []
                for i in order.tolist():
                    loss, a = current[i].loss(self.policy, cfg.regret_coef)
                    if rnd > 0 and self.rng.random() < 0.5:  # keep the teacher's own states in the mix
                        l2, _ = demos[i].loss(self.policy, cfg.regret_coef)
                        loss = 0.5 * (loss + l2)
                    self._step(loss)
                    agrees.append(a)
                    self.decisions += demos[i].task.graph.num_nodes
                agree = float(np.mean(agrees))
                epoch += 1
                self.history.append({"phase": "imitation", "epoch": epoch, "round": rnd, "agreement": agree})
                if progress:
                    progress("imitation", epoch, total, {"agreement": agree})
        return agree

    # -------------------------------------------------------------------------------------------------- RL
    # ------------------------------------------------------------------------------ policy iteration
    def policy_iteration(self, tasks: Sequence[ConstructiveTask], *, val: Sequence[ConstructiveTask] = (),
                         rounds: int | None = None, progress: Progress | None = None) -> dict[str, Any]:
        """Approximate policy iteration: each round rolls the student out greedily on every task (up to
        ``pi_max_nodes`` nodes), labels every ``pi_label_every``-th of its states with the rollout over the
        student (``agents.policy_rollout``: try each device, complete with the student's greedy, keep the best),
        and distils the labels (cross-entropy + expected regret) for ``pi_epochs`` epochs. With ``val`` given,
        the weights of the best validation greedy geometric mean are kept. Returns per-round figures."""
        cfg = self.cfg
        rounds = cfg.pi_rounds if rounds is None else rounds
        self._prepare(list(tasks) + list(val))
        pool = [t for t in tasks if t.graph.num_nodes <= cfg.pi_max_nodes and t.topology.num_devices > 1]
        best = self._snapshot(val)
        report: dict[str, Any] = {"rounds": [], "val_greedy_geomean_start": best[0] if best else None}
        for rnd in range(1, rounds + 1):
            self.policy.eval()
            data, gain, completions = [], [], 0
            ros, jobs = [], []
            for t in pool:  # the student's trajectories and label offsets, drawn here in task order
                ro = rollout(self.policy, t, samples=1, greedy=False, record=True, generator=self.gen)
                every = self._label_every(t)
                ros.append(ro)
                jobs.append(LabelJob(t, ro.devices[0], every, int(self.rng.integers(every))))
            show = (lambda i, n, r=rnd: progress(f"policy iteration {r} labelling", i, n, {})) if progress else None
            labs = label_states(self.policy, jobs, self.workers, progress=show)  # on the workers
            for t, ro, lab in zip(pool, ros, labs):
                completions += lab.completions
                self.decisions += t.graph.num_nodes * (1 + lab.completions)
                keep = lab.labelled & (ro.trace.masks[:, 0].sum(-1) > 1)
                if keep.any():
                    data.append((t, ro.trace, lab.labels[:, None], lab.regret[:, None], keep[:, None].astype(np.float32)))
                    own = ro.trace.actions[:, 0]
                    gain.append(float((lab.labels[keep] != own[keep]).mean()))
            agree = self._distil(data, cfg.pi_epochs, cfg.pi_lr, lambda it: imitation_loss(
                self.policy, it[0], it[1], it[2], it[3], cfg.regret_coef, weight=it[4]))
            rec: dict[str, Any] = {"phase": "policy_iteration", "round": rnd, "agreement": agree,
                                   "label_departs_from_student": float(np.mean(gain)) if gain else 0.0,
                                   "teacher_completions": completions, "decisions": self.decisions}
            best = self._end_round(rec, val, best, report, progress, "policy iteration", rnd, rounds)
        return self._keep_best(best, report)

    def _distil(self, data: Sequence[Any], epochs: int, lr: float,
                loss_of: Callable[[Any], tuple[torch.Tensor, float]], *, count: bool = False) -> float:
        """``epochs`` passes over ``data`` in a shuffled order at ``lr`` (0: the imitation rate), one step per item
        (``loss_of(item) -> (loss, agreement)``; ``count``: each item's nodes are decisions). Returns the last
        epoch's mean agreement."""
        self.policy.train()
        self._set_lr(lr if lr > 0 else self.cfg.lr)
        agree = 0.0
        for _ in range(epochs):
            agrees = []
            for j in self.rng.permutation(len(data)).tolist():
                loss, a = loss_of(data[j])
                self._step(loss)
                agrees.append(a)
                if count:
                    self.decisions += data[j][0].graph.num_nodes
            agree = float(np.mean(agrees)) if agrees else 0.0
        return agree

    def _end_round(self, rec: dict[str, Any], val: Sequence[ConstructiveTask], best, report: dict[str, Any],
                   progress: Progress | None, phase: str, rnd: int, rounds: int):
        """Score a finished round on ``val`` (keeping the best weights), record it, show it; returns ``best``."""
        if val:
            score = self._val_score(val)
            rec["val_greedy_geomean"] = score
            if score < best[0]:
                best = (score, self._weights())
        self.history.append(rec)
        report["rounds"].append(rec)
        if progress:
            progress(phase, rnd, rounds, {k: v for k, v in rec.items() if isinstance(v, float)})
        return best

    def _keep_best(self, best, report: dict[str, Any]) -> dict[str, Any]:
        """Load the best validation weights (if any were scored) and say so in ``report``."""
        if best is not None:
            self.policy.load_state_dict(best[1])
            report["val_greedy_geomean"] = best[0]
        return report

    def _label_every(self, t: ConstructiveTask) -> int:
        """Every how many states the rollout teacher labels on task ``t`` (``pi_label_every``, or sparser so that
        at most ``pi_max_labels`` states are labelled)."""
        return max(int(self.cfg.pi_label_every), -(-t.graph.num_nodes // int(self.cfg.pi_max_labels)))

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.policy.state_dict().items()}

    def _snapshot(self, val: Sequence[ConstructiveTask]) -> tuple[float, dict[str, torch.Tensor]] | None:
        return (self._val_score(val), self._weights()) if val else None

    def improve(self, tasks: Sequence[ConstructiveTask], *, val: Sequence[ConstructiveTask] = (),
                iters: int | None = None, progress: Progress | None = None) -> dict[str, float]:
        """RL on ``tasks``; keeps the best validation weights if ``val`` is given.

        ``rl_algo="sil"`` (expert iteration): per task the best placement known so far (the best teacher's at
        first) is kept; each iteration samples K placements of a few tasks at ``temperature``, replaces the best
        where a sample beats it, and clones the best placements of those tasks (cross-entropy on their own
        trajectories). ``"ppo"``: the clipped surrogate with a group baseline and self-imitation (one terminal
        advantage for every decision). ``"q"``: credit per decision: the student's sampled trajectories are
        labelled every ``pi_label_every``-th state with the rollout over the student (every device's completed step
        time under the student's greedy completion, a per-decision Q-value), and the policy's expected regret over
        those states is minimised (an all-action policy gradient), minus the entropy bonus."""
        cfg = self.cfg
        iters = cfg.rl_iters if iters is None else iters
        self._prepare(list(tasks) + list(val))
        self._set_lr(cfg.rl_lr)
        best = self._snapshot(val)
        for it in range(1, iters + 1):
            rec = self._q_iteration(tasks, it) if cfg.rl_algo == "q" else self._sample_iteration(tasks, it)
            if val and (it % cfg.eval_every == 0 or it == iters):
                score = self._val_score(val)
                rec["val_greedy_geomean"] = score
                if best is not None and score < best[0]:
                    best = (score, self._weights())
            self.history.append(rec)
            if progress:
                progress("rl", it, iters, {k: v for k, v in rec.items() if isinstance(v, float)})
        if best is not None:
            self.policy.load_state_dict(best[1])
            return {"val_greedy_geomean": best[0]}
        return {}

    def _sample_iteration(self, tasks: Sequence[ConstructiveTask], it: int) -> dict[str, Any]:
        """One iteration of ``rl_algo="sil"`` or ``"ppo"`` (see ``improve``)."""
        cfg = self.cfg
        self.policy.eval()
        batch = [tasks[i] for i in self.rng.choice(len(tasks), size=min(cfg.tasks_per_iter, len(tasks)),
                                                   replace=False)]
        data, stats, improved = [], [], 0
        for t in batch:
            ro = rollout(self.policy, t, samples=cfg.samples, greedy=False, record=True, generator=self.gen,
                         temperature=cfg.temperature if cfg.rl_algo == "sil" else 1.0)
            self.decisions += cfg.samples * t.graph.num_nodes
            r = rewards(t, ro)
            stats.append(float(r.max()))
            if cfg.rl_algo == "ppo":
                k = int(np.argmax(r))
                data.append((t, ro.trace, r - r.mean(), np.array([k]) if r[k] > 0 else np.zeros(0, np.int64)))
                continue
            known = self._best_known(t)
            k = int(np.argmax(r))
            if ro.feasible[k] and ro.times[k] < known[0] * (1 - 1e-9):
                t.meta["best_known"] = (float(ro.times[k]), ro.trace.select([k]))
                improved += 1
            own = t.meta.get("best_sampled")  # the best placement the policy itself produced (a learned result)
            if ro.feasible[k] and (own is None or ro.times[k] < own[0]):
                t.meta["best_sampled"] = (float(ro.times[k]), ro.devices[k].copy())
            data.append((t, t.meta["best_known"][1]))
        self.policy.train()
        info: dict[str, float] = {}
        for _ in range(cfg.ppo_epochs):
            for item in data:
                if cfg.rl_algo == "ppo":
                    t, tr, adv, sil = item
                    loss, info = ppo_loss(self.policy, t, tr, adv, clip=cfg.clip, ent_coef=cfg.ent_coef,
                                          sil=sil, sil_coef=cfg.sil_coef)
                else:
                    loss, agree = imitation_loss(self.policy, *item)
                    info = {"loss": float(loss.detach()), "agreement": agree}
                self._step(loss)
        rec: dict[str, Any] = {"phase": "rl", "iter": it, "best_sample_reward": float(np.mean(stats)),
                               "improved": float(improved), **info, "decisions": self.decisions}
        return rec

    def clone(self, task: ConstructiveTask, trace, target: float, *, max_epochs: int, check_every: int = 5,
              on_check: Callable[[float, np.ndarray], None] | None = None,
              check_from: float = CLONE_CHECK_FROM, seconds: float | None = None) -> tuple[int, float]:
        """Behaviour-clone one trajectory (``trace``, step time ``target``) at ``clone_lr`` until the policy's
        greedy placement is as fast (checked every ``check_every`` epochs once the decisions on the trajectory
        agree with it on at least ``check_from`` of its states, and after the last epoch; ``on_check(time,
        devices)`` sees each greedy placement), ``max_epochs`` have passed, or (given) ``seconds`` of wall clock
        have (then after one last check). Returns (epochs, last agreement). Below that agreement the greedy
        decode leaves the trajectory early and its placement is another one."""
        end = None if seconds is None else time.perf_counter() + float(seconds)
        self._set_lr(self.cfg.clone_lr)
        epochs, agree = 0, 0.0
        while epochs < max_epochs:
            self.policy.train()
            for _ in range(min(check_every, max_epochs - epochs)):
                loss, agree = imitation_loss(self.policy, task, trace)
                self._step(loss)
                epochs += 1
            late = end is not None and time.perf_counter() >= end
            if agree < check_from and epochs < max_epochs and not late:
                continue
            self.policy.eval()
            ro = rollout(self.policy, task, samples=1, greedy=True)
            if on_check is not None:
                on_check(float(ro.times[0]) if ro.feasible[0] else float("inf"), ro.devices[0])
            if late or (ro.feasible[0] and ro.times[0] <= target * (1 + 1e-9)):
                break
        return epochs, agree

    def _q_iteration(self, tasks: Sequence[ConstructiveTask], it: int) -> dict[str, Any]:
        """One iteration of ``rl_algo="q"`` (see ``improve``)."""
        from placement_rl.agents.constructive import _replay

        cfg = self.cfg
        pool = [i for i, t in enumerate(tasks) if t.graph.num_nodes <= cfg.pi_max_nodes and t.topology.num_devices > 1]
        pick = self.rng.choice(len(pool), size=min(cfg.tasks_per_iter, len(pool)), replace=False)
        self.policy.eval()
        data, regrets = [], []
        ros, jobs = [], []
        for i in pick.tolist():  # the student's trajectories and label offsets, drawn here in task order
            t = tasks[pool[i]]
            ro = rollout(self.policy, t, samples=1, greedy=False, record=True, generator=self.gen,
                         temperature=cfg.temperature)
            every = self._label_every(t)
            ros.append(ro)
            jobs.append(LabelJob(t, ro.devices[0], every, int(self.rng.integers(every))))
        for job, ro, lab in zip(jobs, ros, label_states(self.policy, jobs, self.workers)):  # on the workers
            t = job.task
            self.decisions += t.graph.num_nodes * (1 + lab.completions)
            keep = lab.labelled & (ro.trace.masks[:, 0].sum(-1) > 1)
            if keep.any():
                data.append((t, ro.trace, lab.regret[:, None], keep[:, None].astype(np.float32)))
                taken = lab.regret[np.arange(len(keep)), ro.trace.actions[:, 0]]
                regrets.append(float(taken[keep].mean()))
        self.policy.train()
        info: dict[str, float] = {}
        for _ in range(cfg.ppo_epochs):
            for t, tr, reg, w in data:
                logp = _replay(self.policy, t, tr)
                wt = torch.from_numpy(w) * (torch.from_numpy(tr.masks.sum(-1) > 1).float())
                denom = wt.sum().clamp(min=1.0)
                exp_regret = ((logp.exp() * torch.from_numpy(reg)).sum(-1) * wt).sum() / denom
                allowed = torch.from_numpy(tr.masks)
                ent = ((-(logp.exp() * logp.masked_fill(~allowed, 0.0)).sum(-1)) * wt).sum() / denom
                loss = exp_regret / REGRET_UNIT - cfg.ent_coef * ent
                self._step(loss)
                info = {"expected_regret": float(exp_regret.detach()), "entropy": float(ent.detach())}
        return {"phase": "rl", "iter": it, "sampled_regret": float(np.mean(regrets)) if regrets else 0.0, **info,
                "decisions": self.decisions}

    @staticmethod
    def _best_known(t: ConstructiveTask) -> tuple[float, Any]:
        """The best placement known for a task (time, trace): the best teacher's until a sample beats it."""
        if "best_known" not in t.meta:
            _, dev = t.teacher()
            ro = rollout(None, t, forced=dev, record=True)
            t.meta["best_known"] = (float(ro.times[0]), ro.trace)
        return t.meta["best_known"]

    def _val_score(self, tasks: Sequence[ConstructiveTask]) -> float:
        res = evaluate(self.policy, tasks, samples=0)
        return geomean([r.greedy_time / r.task.reference for r in res])

    # ------------------------------------------------------------------------------------------ checkpoint
    def save(self, path: str | Path, *, extra: dict[str, Any] | None = None, with_optimizer: bool = True) -> Path:
        from placement_rl.agents.checkpoint import provenance

        config = {**dataclasses.asdict(self.cfg), **(extra or {}),
                  "provenance": provenance(**(extra or {}).get("pretrain", {}))}
        return save_checkpoint(path, algo=ALGO, config=config, obs=_obs_dims(), num_timesteps=self.decisions,
                               policy=self.policy.state_dict(),
                               optimizer=self.opt.state_dict() if with_optimizer else None)
