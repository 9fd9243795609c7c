"""Rollouts of the constructive placement policy, and its losses.

An episode places a task's nodes one by one in the simulator's order (``placement_rl.cost.schedule``); K
episodes of one task run side by side, so each decision is one policy call over K x D device rows.
``rollout`` returns the placements, their step times (== ``simulate``) and optionally the trace (per decision:
node, device features, mask, action, log-probability) that the losses replay:

* ``imitation_loss``: cross-entropy on a teacher's actions (behaviour cloning on the teacher's own trajectory;
  DAgger: on the student's trajectory, labelled by the reactive earliest-finish teacher).
* ``ppo_loss``: PPO's clipped surrogate with a per-task group baseline (POMO-style: the advantage of a sample
  is its reward minus the mean reward of the K samples of the same task, rewards ``log(T_ref / T)`` with
  ``T_ref`` the best one-pass heuristic's step time, so every graph speaks the same units), an entropy bonus,
  and self-imitation (cross-entropy on the best sample of a task when it beats the reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from placement_rl.agents.device_policy import DevicePolicy
from placement_rl.cost.window import FULL_WINDOW  # noqa: F401 - placing a graph this small, the window is the whole rest
from placement_rl.envs.constructive_task import ConstructiveTask

INFEASIBLE_PENALTY = 1.0  # reward (log-ratio units) taken off a placement that does not fit in memory


def state_window(policy: DevicePolicy, num_nodes: int, *, record: bool = False) -> int:
    """The lookahead window of the states ``policy`` reads on a graph of ``num_nodes``: its trained window W, or,
    placing (``record=False``: no state is kept for training) a graph of at most ``policy.full_window`` nodes,
    the whole rest of the graph (``W >= N``). Then every decision sees the completed step of each device's
    earliest-finish completion (``la_step``), the criterion of the ``eft_rollout`` teacher, which a W-node
    window shows only in the last W + 1 decisions; the cost is the teacher's (N x D completions, O(N^2 D^2)),
    hence the size limit. Recorded (training) states keep W, the states the policy was trained on, unless it is
    trained on whole-graph states as well (``policy.full_window_train``)."""
    w = int(getattr(policy, "window", 0))
    placing = not record or bool(getattr(policy, "full_window_train", False))
    if placing and 0 < num_nodes <= int(getattr(policy, "full_window", 0)):
        return max(w, int(num_nodes))
    return w


def episode_calls(task: ConstructiveTask, window: int | None = None) -> int:
    """Simulator calls of one episode on ``task`` at ``window`` (None: the window it was last placed with): the
    final simulate, plus, with the window over the whole rest of the graph, every device's completion at every
    decision (N x D, counted as ``eft_rollout``'s are; a shorter window's branches are no completions)."""
    n = task.graph.num_nodes
    w = int(task.window) if window is None else int(window)
    return 1 + n * task.topology.num_devices if w >= n else 1


def placement_calls(policy: DevicePolicy, task: ConstructiveTask, *, record: bool = False) -> int:
    """Simulator calls of one episode of ``policy`` on ``task``, before it runs (``episode_calls`` at the
    ``state_window`` the policy will read)."""
    return episode_calls(task, state_window(policy, task.graph.num_nodes, record=record))


@dataclass
class Trace:
    """What an episode batch decided: ``nodes`` [T]; ``feats`` [T, K, D, F]; ``masks`` [T, K, D];
    ``actions`` [T, K]; ``logp`` [T, K] (log-probability under the policy that acted)."""

    nodes: np.ndarray
    feats: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    logp: np.ndarray

    def select(self, k: np.ndarray | list[int]) -> "Trace":
        """The episodes ``k`` only."""
        return Trace(self.nodes, self.feats[:, k], self.masks[:, k], self.actions[:, k], self.logp[:, k])


@dataclass
class Demo:
    """One task's imitation data: a recorded ``trace``, the ``labels`` [T, K] to imitate there, optional
    per-device ``regret`` [T, K, D] (cost-sensitive imitation) and ``weight`` [T, K] (0: not labelled)."""

    task: ConstructiveTask
    trace: Trace
    labels: np.ndarray
    regret: np.ndarray | None = None
    weight: np.ndarray | None = None

    def loss(self, policy: DevicePolicy, regret_coef: float) -> tuple[torch.Tensor, float]:
        return imitation_loss(policy, self.task, self.trace, self.labels, self.regret, regret_coef, weight=self.weight)


@dataclass
class Rollout:
    devices: np.ndarray  # [K, N]
    times: np.ndarray  # [K] step times
    feasible: np.ndarray  # [K] bool
    trace: Trace | None = None


def graph_tensors(task: ConstructiveTask) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [N, F], edge_index [2, E])`` of a task, built once and kept on it."""
    if "tensors" not in task.meta:
        x = torch.from_numpy(task.x)
        ei = torch.from_numpy(np.array(task.graph.edges.T, dtype=np.int64, order="C"))
        task.meta["tensors"] = (x, ei)
    return task.meta["tensors"]


@torch.no_grad()
def rollout(policy: DevicePolicy | None, task: ConstructiveTask, *, samples: int = 1, greedy: bool = True,
            record: bool = False, forced: np.ndarray | None = None, generator: torch.Generator | None = None,
            temperature: float = 1.0) -> Rollout:
    """Run ``samples`` episodes of ``task``. Actions: the policy's (argmax if ``greedy``, else sampled), or
    ``forced`` [N] device per node (a teacher's placement). Samples are
    drawn at ``temperature`` (> 1 explores more); the recorded log-probabilities are at temperature 1."""
    if policy is not None:  # the states the policy reads are built with its lookahead window
        task.window = state_window(policy, task.graph.num_nodes, record=record)
    st = task.state(samples)
    n, k = task.graph.num_nodes, samples
    if record:
        d, f = st.feats.shape[1], st.feats.shape[2]
        feats, masks = np.zeros((n, k, d, f), np.float32), np.zeros((n, k, d), bool)
        actions, logps = np.zeros((n, k), np.int64), np.zeros((n, k), np.float32)
    h = policy.embed(*graph_tensors(task)) if policy is not None and forced is None else None
    if h is not None and greedy and not record and k == 1:  # one compiled loop (agents.fast_decode)
        from placement_rl.agents.fast_decode import greedy_devices

        greedy_devices(policy, st, h.double().numpy())
        return Rollout(st.devices.copy(), st.finish(), st.feasible())
    for t in range(n):
        v = st.node
        fe, ma = st.features()
        if forced is not None:
            act = np.full(k, forced[v], dtype=np.int64)
            lp = np.zeros(k, np.float32)
        else:
            logits = policy.logits(h[v].expand(k, -1), torch.from_numpy(fe), torch.from_numpy(ma))
            logp_all = torch.log_softmax(logits, dim=-1)
            if greedy:
                a = logits.argmax(-1)
            elif temperature == 1.0:
                a = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
            else:
                a = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator).squeeze(1)
            lp = logp_all.gather(1, a.unsqueeze(1)).squeeze(1).numpy()
            act = a.numpy()
        if record:
            feats[t], masks[t], actions[t], logps[t] = fe, ma, act, lp
        st.place(act)
    times = st.finish()
    trace = Trace(st.order.copy(), feats, masks, actions, logps) if record else None
    return Rollout(st.devices.copy(), times, st.feasible(), trace)


def rewards(task: ConstructiveTask, ro: Rollout) -> np.ndarray:
    """[K] ``log(T_ref / T)``, minus ``INFEASIBLE_PENALTY`` where the placement does not fit."""
    return np.log(task.reference / ro.times) - INFEASIBLE_PENALTY * (~ro.feasible)


def _replay(policy: DevicePolicy, task: ConstructiveTask, trace: Trace) -> torch.Tensor:
    """Log-probabilities [T, K, D] of every device at every recorded decision, with gradients."""
    h = policy.embed(*graph_tensors(task))
    t, k, d, f = trace.feats.shape
    node_h = h[torch.from_numpy(trace.nodes)].unsqueeze(1).expand(t, k, -1).reshape(t * k, -1)
    logits = policy.logits(node_h, torch.from_numpy(trace.feats).reshape(t * k, d, f),
                           torch.from_numpy(trace.masks).reshape(t * k, d))
    return torch.log_softmax(logits, dim=-1).reshape(t, k, d)


def _choice(trace: Trace) -> torch.Tensor:
    """[T, K] 1 where the decision had more than one allowed device (others carry no signal)."""
    return torch.from_numpy((trace.masks.sum(-1) > 1).astype(np.float32))


REGRET_UNIT = 0.01  # a regret of 1% of the step time weighs as much as one nat of cross-entropy


def imitation_loss(policy: DevicePolicy, task: ConstructiveTask, trace: Trace, labels: np.ndarray | None = None,
                   regret: np.ndarray | None = None, regret_coef: float = 1.0, *, weight: np.ndarray | None = None,
                   ce_coef: float = 1.0) -> tuple[torch.Tensor, float]:
    """``ce_coef`` times the cross-entropy on ``labels`` [T, K] (default: the trace's own actions), plus, with
    ``regret`` [T, K, D] (each device's relative step-time loss against the best, from a rollout teacher: a
    per-decision Q-value), ``regret_coef`` times the policy's expected regret in units of ``REGRET_UNIT``
    (cost-sensitive imitation, as in AggreVaTe; with ``ce_coef=0`` an all-action policy gradient on the
    rollout's Q-values). ``weight`` [T, K] (0/1) keeps only the labelled decisions. Returns (loss, agreement)."""
    logp = _replay(policy, task, trace)
    lab = torch.from_numpy(np.maximum(trace.actions if labels is None else labels, 0))
    w = _choice(trace)
    if weight is not None:
        w = w * torch.from_numpy(np.asarray(weight, np.float32))
    nll = -logp.gather(2, lab.unsqueeze(-1)).squeeze(-1).clamp(min=-30.0)  # (a label on a masked device: -inf)
    loss = ce_coef * (nll * w).sum() / w.sum().clamp(min=1.0)
    if regret is not None and regret_coef > 0.0:
        exp_regret = (logp.exp() * torch.from_numpy(regret)).sum(-1)
        loss = loss + regret_coef / REGRET_UNIT * (exp_regret * w).sum() / w.sum().clamp(min=1.0)
    agree = ((logp.argmax(-1) == lab).float() * w).sum() / w.sum().clamp(min=1.0)
    return loss, float(agree)


def eft_labels(trace: Trace) -> np.ndarray:
    """The reactive earliest-finish teacher's choice at every recorded state [T, K] (DAgger labels)."""
    return np.argmin(np.where(trace.masks, trace.feats[..., 1], np.inf), axis=-1)


def ppo_loss(policy: DevicePolicy, task: ConstructiveTask, trace: Trace, adv: np.ndarray, *, clip: float,
             ent_coef: float, sil: np.ndarray | None, sil_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate over all decisions of K episodes (advantage ``adv`` [K] per episode), minus the
    entropy bonus, plus self-imitation on the episodes ``sil`` (indices; may be empty)."""
    logp_all = _replay(policy, task, trace)
    act = torch.from_numpy(trace.actions)
    logp = logp_all.gather(2, act.unsqueeze(-1)).squeeze(-1)
    w = _choice(trace)
    denom = w.sum().clamp(min=1.0)
    ratio = torch.exp(logp - torch.from_numpy(trace.logp))
    a = torch.from_numpy(adv.astype(np.float32)).unsqueeze(0)
    surr = torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    pg = -(surr * w).sum() / denom
    allowed = torch.from_numpy(trace.masks)
    ent = -(logp_all.exp() * logp_all.masked_fill(~allowed, 0.0)).sum(-1)  # masked: 0, and no 0 * inf gradient
    entropy = (ent * w).sum() / denom
    loss = pg - ent_coef * entropy
    sil_v = 0.0
    if sil is not None and len(sil) and sil_coef > 0:
        ws = w[:, sil]
        nll = -(logp[:, sil].clamp(min=-30.0) * ws).sum() / ws.sum().clamp(min=1.0)
        loss = loss + sil_coef * nll
        sil_v = float(nll.detach())
    return loss, {"pg": float(pg.detach()), "entropy": float(entropy.detach()), "sil": sil_v}
