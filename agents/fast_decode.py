"""The policy's device head for the compiled decode kernel (``placement_rl.cost.decode``).

The node embeddings come from the policy's encoder (torch, once per task); the per-decision work (the schedule
features, window and topology features included, the device head, the argmax and the state update) runs in the
core's one numba decode kernel with the head's weights as float64 arrays, so a decision costs microseconds instead
of a torch call. ``device_scores`` (numba) computes ``DevicePolicy.logits`` up to the constant output bias; the two
are parity-tested at the shipped width.

* ``greedy_devices(policy, state, node_h)``: place every node of a fresh state greedily (zero-shot); each
  decision's device branches run on threads where that pays (``placement_rl.cost.split``: the same placement).
* ``complete_greedy(head, state)``: place ``state``'s remaining nodes greedily in every episode from its current
  step (the base policy of the rollout teacher, ``agents.policy_rollout``).
"""

from __future__ import annotations

import numpy as np

from placement_rl.cost.decode import POLICY, decode, device_scores
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.split import decode_split, split_threads


class Head:
    """A policy's device head as float64 arrays (``device_scores``' weights) and its node embeddings."""

    def __init__(self, policy, node_h: np.ndarray) -> None:
        w = {k: np.ascontiguousarray(v.detach().double().numpy()) for k, v in policy.state_dict().items()
             if not k.startswith("encoder.")}
        hdim = w["phi.1.weight"].shape[0]
        w4 = np.ascontiguousarray(w["rho.0.weight"].T)
        t = np.ascontiguousarray
        self.node_h = t(np.asarray(node_h, np.float64))
        self.weights = (t(w["dev_in.0.weight"].T), w["dev_in.0.bias"], t(w["dev_in.2.weight"].T), w["dev_in.2.bias"],
                        t(w["phi.1.weight"].T), w["phi.1.bias"], t(w4[:hdim]), t(w4[hdim:]), w["rho.0.bias"],
                        t(w["rho.2.weight"].T))

    def arrays(self) -> tuple:
        return self.node_h, self.weights

    def scores(self, feats: np.ndarray, v: int, mask: np.ndarray) -> np.ndarray:
        """[D] scores of one decision (``device_scores``)."""
        out = np.zeros(feats.shape[0])
        device_scores(np.ascontiguousarray(feats), self.node_h[v], np.ascontiguousarray(mask), *self.weights, out)
        return out


def complete_greedy(head: Head, st: ScheduleState) -> None:
    """Place ``st``'s remaining nodes (from ``st.step``) greedily in every episode."""
    decode(st, POLICY, head.arrays())


def greedy_devices(policy, st: ScheduleState, node_h: np.ndarray, *, threads: int | None = None) -> None:
    """Place every node of ``st`` greedily from a fresh state; ``node_h`` [N, H]. ``threads``: how many threads
    branch each decision's devices (None: ``split_threads``; 1: the serial kernel). The placement is the same."""
    st.reset()
    head = Head(policy, node_h)
    threads = split_threads(st) if threads is None else int(threads)
    if threads > 1 and st.episodes == 1:
        decode_split(st, head.arrays(), threads)
    else:
        complete_greedy(head, st)
