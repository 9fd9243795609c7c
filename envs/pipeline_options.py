"""The plan-option phases of ``envs.pipeline.PipelineEnv`` after its stage cuts and DP degrees: the micro-batch
count, DP vs sharded DP, the tensor-parallel degree and activation recomputation per stage (a mixin over the env's
state: ``state``, ``config``, ``layout``, ``buf`` and the phase arrays ``PipelineEnv.__init__`` makes). The class
docstring of ``PipelineEnv`` describes the phases and their masks."""

from __future__ import annotations

import numpy as np

from placement_rl.baselines.pipe_common import MAX_MICROBATCHES
from placement_rl.plans import RECOMPUTE

from placement_rl.envs.graph_source import Task

CUT, DP, MB, SHARD, TP, RC = 0, 1, 2, 3, 4, 5  # phases
RC_ACTIONS = ("none", "full", "selective")  # action k of the recomputation phase (two devices: none / full)


class PlanOptionPhases:
    """Micro-batches, sharding, TP and recomputation: the masks and the transitions between those phases."""

    def _task_regions(self, task: Task) -> dict[str, np.ndarray]:
        """Region id per node of each recomputation mode the task's graph has (``cost.recompute.regions``)."""
        from placement_rl.cost.recompute import regions
        from placement_rl.errors import PlanError

        if self.config.mode != "train":
            return {}
        out = {}
        for mode in RECOMPUTE[1:]:
            try:
                out[mode] = regions(task.graph, mode)
            except PlanError:
                continue
        return out

    def _tp_degrees(self, task: Task) -> np.ndarray:
        """Bool over TP degrees 1..D_max that the task's graph splits into and its hosts hold."""
        from placement_rl.errors import PlanError
        from placement_rl.graph import tp as tpmod

        t = task.topology
        hosts = [dev.host for dev in t.devices]
        runs = [sum(1 for h in hosts if h == x) for x in dict.fromkeys(hosts)]
        contiguous = all(hosts[i] <= hosts[i + 1] for i in range(len(hosts) - 1))
        ok = np.zeros(self.layout.max_devices, dtype=bool)
        ok[0] = True
        ann = tpmod.annotation(task.graph)
        for k in range(2, min(min(runs), ok.shape[0]) + 1):
            if not contiguous or any(r % k for r in runs):
                continue
            try:
                tpmod.check_degree(task.graph, k, ann)
            except PlanError:
                continue
            ok[k - 1] = True
        return ok

    def _m_allowed(self, m: int) -> bool:
        """May the plan use ``m`` micro-batches (batch divisibility for every stage's DP degree, the cap)?"""
        if m > MAX_MICROBATCHES and m != self.config.num_microbatches:
            return False
        b = self._batch
        return b is None or all(b % (m * int(p)) == 0 for p in self._stage_dp[:self._num_stages])

    def _set_m(self, m: int) -> None:
        self._m = m
        self._log_m[0] = int(np.log2(m))

    def _focus_flag(self) -> None:
        """A binary decision about the whole plan: no current node, actions 0 and (if allowed) 1."""
        self.buf.set_current_rows(None, -1)
        mask = self.buf.device_mask
        mask.fill(0)
        mask[0] = 1
        if mask.shape[0] > 1:
            mask[1] = 1 if self._phase[0] == SHARD else int(self._m_allowed(2 * self._m))

    def _start_mb(self):
        if self.config.num_microbatches is not None:
            return self._after_mb()
        m = 1
        if self._num_stages > 1:
            while m < self._num_stages:
                m *= 2
        if not self._m_allowed(m):  # the batch does not split that far: the largest count it allows
            while m > 1 and not self._m_allowed(m):
                m //= 2
        self._set_m(m)
        if not self._m_allowed(2 * m) or self.layout.max_devices < 2:
            return self._after_mb()
        self._phase[0] = MB
        self._focus_flag()
        return self._obs(), 0.0, False, False, self._info()

    def _after_mb(self):
        if self.config.sharding != "choose" or self.layout.max_devices < 2:
            return self._after_shard()
        self._phase[0] = SHARD
        self._focus_flag()
        return self._obs(), 0.0, False, False, self._info()

    def _tp_allowed(self) -> np.ndarray:
        """Bool over TP degrees 1..D_max: allowed for the task and the stages' devices times it fit."""
        d = self.state.task.topology.num_devices  # type: ignore[union-attr]
        used = int(self._stage_dp[:self._num_stages].sum())
        ok = np.zeros(self.layout.max_devices, dtype=bool)
        k = np.arange(1, self._tp_ok.shape[0] + 1)
        ok[:k.shape[0]] = self._tp_ok & (k * used <= d)
        ok[0] = True
        return ok

    def _after_shard(self):
        if self.config.tp is not None or not self._tp_allowed()[1:].any():
            return self._after_tp()
        self._phase[0] = TP
        self.buf.set_current_rows(None, -1)
        self.buf.device_mask[:] = self._tp_allowed()
        return self._obs(), 0.0, False, False, self._info()

    def _rc_allowed(self, s: int) -> np.ndarray:
        """Bool over recomputation actions (``RC_ACTIONS``, at most ``D_max``) for stage ``s``."""
        ok = np.zeros(min(len(RC_ACTIONS), self.layout.max_devices), dtype=bool)
        ok[0] = True
        mine = self.stage == s
        for k in range(1, ok.shape[0]):
            rid = self._regions.get(RC_ACTIONS[k])
            ok[k] = rid is not None and bool((rid[mine] >= 0).any())
        return ok

    def _after_tp(self):
        """Recomputation: fixed by the config, or a decision per stage that has something to checkpoint."""
        fixed = self.config.recompute
        for s in range(self._num_stages):
            if fixed is not None:
                rid = self._regions.get(fixed)
                has = rid is not None and bool((rid[self.stage == s] >= 0).any())
                self._rc[s] = RECOMPUTE.index(fixed) if has else 0
        if fixed is not None or self.layout.max_devices < 2:
            return self._finish()
        self._rc_todo = [s for s in range(self._num_stages) if self._rc_allowed(s)[1:].any()]
        if not self._rc_todo:
            return self._finish()
        self._phase[0] = RC
        self._focus_rc()
        return self._obs(), 0.0, False, False, self._info()

    def _focus_rc(self) -> None:
        s = self._rc_todo[0]
        lo = self._bounds[s]
        hi = self._bounds[s + 1] if s + 1 < len(self._bounds) else self._order.shape[0]
        self.buf.set_current_rows(self._order[lo:hi], int(self._order[lo]))
        mask = self.buf.device_mask
        mask.fill(0)
        allowed = self._rc_allowed(s)
        mask[:allowed.shape[0]] = allowed
