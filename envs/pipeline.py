"""``PipelineEnv``: cut a graph into pipeline stages in topological order, then pick a DP degree per stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from placement_rl.cost.pipeline import PIPELINE_SCHEDULES, PipelineSimulator
from placement_rl.errors import ConfigError
from placement_rl.plans import StagePlan

from envs.base import BaseEnv, EnvConfig, TaskState, node_memory
from envs.graph_source import Task
from envs.reward import final_reward

__all__ = ["PipelineConfig", "PipelineEnv"]

CUT, DP = 0, 1  # phases


@dataclass(frozen=True, kw_only=True)
class PipelineConfig(EnvConfig):
    """``PipelineEnv`` options (plus ``EnvConfig``'s).

    schedule: pipeline schedule of the plan (``gpipe``, ``1f1b``; ``interleaved1f1b`` is not offered because
        its stages share device groups).
    num_microbatches: micro-batches per step.
    batch_size: global batch; when set, a DP degree p is allowed only if ``batch_size % (m * p) == 0``.
    max_stages: at most this many stages (default: the topology's device count).
    """

    schedule: str = "1f1b"
    num_microbatches: int = 4
    batch_size: int | None = None
    max_stages: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.schedule not in PIPELINE_SCHEDULES or self.schedule == "interleaved1f1b":
            raise ConfigError(f"schedule must be 'gpipe' or '1f1b' for PipelineEnv, got {self.schedule!r}")
        m = self.num_microbatches
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ConfigError(f"num_microbatches must be a positive integer, got {m!r}")
        b = self.batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 or b % m):
            raise ConfigError(f"batch_size must be a positive integer divisible by num_microbatches ({m}), got {b!r}")
        s = self.max_stages
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1):
            raise ConfigError(f"max_stages must be a positive integer or None, got {s!r}")


class PipelineEnv(BaseEnv):
    """Build a pipeline ``StagePlan`` step by step: stage cuts, then data-parallel degrees.

    ## Description
    Phase 0 (cuts) walks the nodes in topological order from the second one; for each the agent picks
    0 = same stage as the previous node or 1 = start a new stage (the first node starts stage 0). Stages are
    contiguous blocks of one topological order, so every cut is valid. Phase 1 (DP) then visits the stages
    in order; action ``k`` gives stage ``s`` a data-parallel degree ``k + 1``. Stage ``s`` gets the next
    ``k + 1`` devices of the topology in index order (devices of one host stay together). The finished plan
    (``schedule``, ``num_microbatches``, ``batch_size`` from the config) is scored with the cost model's
    ``simulate_pipeline``.

    ## Action Space
    ``Discrete(D_max)`` in both phases. Cuts: only 0/1 are meaningful (others read as ``a mod 2``); a new
    stage is masked once ``max_stages`` stages exist. DP: degree ``k + 1`` is allowed when the devices used
    so far plus ``k + 1`` plus one per remaining stage fit the topology and, with ``batch_size`` set,
    ``batch_size % (num_microbatches * (k + 1)) == 0``; a masked degree is replaced by the largest allowed
    degree below it (degree 1 is always allowed).

    ## Observation Space
    ``envs.features`` keys, where ``placement`` holds the stage of each decided node (-1 undecided) and the
    one-hot "device" columns of ``node_features`` hold that stage; plus ``phase [1]`` (0 cuts, 1 DP) and
    ``stage_dp [D_max]`` (DP degree chosen per stage, 0 = none yet). In the DP phase every node of the
    current stage has the current flag and ``current_node`` is its first node.

    ## Rewards
    0 until the last step, then ``(T1 - T) / T1`` where T1 is the best single-device plan (one stage on one
    device, same schedule and micro-batches) and T the plan's simulated step time; minus
    ``infeasible_penalty`` (default 1) when the plan does not fit in memory.

    ## Starting State
    A task drawn with the env's RNG; the first node in stage 0, the second node current.

    ## Episode End
    Terminates after ``num_nodes - 1 + num_stages`` steps.

    ## Arguments
    ``graph``, ``topology``, ``cost_fn``, ``config`` / options of ``PipelineConfig`` (see ``envs.base``;
    ``reward_source`` is for op-level envs and is rejected here). ``info`` has ``phase``, ``num_stages``,
    ``best_single_time``; at the end also ``step_time``, ``feasible``, ``plan`` (StagePlan), ``best_plan`` and
    ``best_step_time`` (best seen on this task).

    ## Version History
    * v0: initial version.
    """

    config_cls = PipelineConfig

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("reward_source") is not None:
            raise ConfigError("PipelineEnv scores plans with simulate_pipeline: reward_source is not supported")
        super().__init__(**kwargs)
        d = self.layout.max_devices
        self.action_space = spaces.Discrete(d)
        space = self.layout.space()
        space.spaces["phase"] = spaces.Box(0, 1, (1,), np.int64)
        space.spaces["stage_dp"] = spaces.Box(0, d, (d,), np.int64)
        self.observation_space = space
        self._phase = np.zeros(1, np.int64)
        self._stage_dp = np.zeros(d, np.int64)
        self.buf.arrays.update(phase=self._phase, stage_dp=self._stage_dp)
        self.stage = np.zeros(0, dtype=np.int64)
        self._pos = 0
        self._num_stages = 0
        self._dp_stage = 0
        self._used = 0
        self._bounds: list[int] = []

    def _state_key(self) -> Any:
        c = self.config
        return (c.schedule, c.num_microbatches, c.batch_size)

    def _plan(self, stage: np.ndarray, dp: list[int]) -> StagePlan:
        groups, start = [], 0
        for p in dp:
            groups.append(tuple(range(start, start + p)))
            start += p
        c = self.config
        return StagePlan(stage_of_node=stage, stage_devices=tuple(groups), num_microbatches=c.num_microbatches,
                         schedule=c.schedule, batch_size=c.batch_size)

    def _prepare(self, task: Task) -> TaskState:
        g, t = task.graph, task.topology
        sim = PipelineSimulator(g, task.costs, t)
        best: tuple[int, float, int] | None = None
        for d in range(t.num_devices):
            plan = StagePlan(stage_of_node=np.zeros(g.num_nodes, np.int64), stage_devices=((d,),),
                             num_microbatches=self.config.num_microbatches, schedule=self.config.schedule,
                             batch_size=self.config.batch_size)
            res = sim.run(plan)
            cand = (0 if res.feasible else 1, float(res.step_time), d)
            best = cand if best is None or cand < best else best
        assert best is not None
        return TaskState(task=task, source=sim, best_single=best[1], best_device=best[2],
                         best_single_feasible=best[0] == 0, node_mem=node_memory(task),
                         capacity=t.array("memory_bytes"), static=None)

    # --------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        st = self._new_task()
        n = st.task.graph.num_nodes
        self.stage = np.full(n, -1, dtype=np.int64)
        self._order = st.task.graph.topo_order
        self._max_stages = min(st.task.topology.num_devices, self.config.max_stages or st.task.topology.num_devices)
        first = int(self._order[0])
        self.stage[first] = 0
        self.buf.set_device(first, 0)
        self.buf.set_placed(first)
        self._num_stages, self._bounds = 1, [0]  # topo position where each stage starts
        self._stage_dp.fill(0)
        self._used = 0
        self._dp_stage = 0
        self._pos = 1
        if n > 1:
            self._phase[0] = CUT
            self._focus_cut()
        else:
            self._start_dp()
        return self._obs(), self._info()

    def step(self, action: Any):
        st = self.state
        if st is None:
            raise ConfigError("call reset() before step()")
        if self._phase[0] == CUT:
            node = int(self._order[self._pos])
            cut = int(action) % 2 == 1 and self._num_stages < self._max_stages
            if cut:
                self._bounds.append(self._pos)
                self._num_stages += 1
            s = self._num_stages - 1
            self.stage[node] = s
            self.buf.set_device(node, s)
            self.buf.set_placed(node)
            self._pos += 1
            if self._pos < self._order.shape[0]:
                self._focus_cut()
            else:
                self._start_dp()
            return self._obs(), 0.0, False, False, self._info()
        k = self._dp_stage
        allowed = self._dp_allowed()
        p = int(action) + 1
        if p > allowed.shape[0] or not allowed[p - 1]:
            p = int(np.flatnonzero(allowed[:min(p, allowed.shape[0])])[-1]) + 1
        self._stage_dp[k] = p
        self._used += p
        self._dp_stage += 1
        if self._dp_stage < self._num_stages:
            self._focus_dp()
            return self._obs(), 0.0, False, False, self._info()
        return self._finish()

    def action_masks(self) -> np.ndarray:
        """Bool ``[D_max]``: allowed actions of the current phase (see the class docstring)."""
        return self.buf.device_mask.astype(bool)

    # ----------------------------------------------------------- helpers
    def _focus_cut(self) -> None:
        self.buf.set_current(int(self._order[self._pos]))
        mask = self.buf.device_mask
        mask.fill(0)
        mask[0] = 1
        if self._num_stages < self._max_stages and mask.shape[0] > 1:
            mask[1] = 1

    def _start_dp(self) -> None:
        self._phase[0] = DP
        self._dp_stage = 0
        self._focus_dp()

    def _dp_allowed(self) -> np.ndarray:
        """Bool over degrees 1..D_max for the current stage."""
        d = self.state.task.topology.num_devices  # type: ignore[union-attr]
        left = d - self._used - (self._num_stages - self._dp_stage - 1)
        deg = np.arange(1, self.layout.max_devices + 1)
        ok = deg <= left
        b, m = self.config.batch_size, self.config.num_microbatches
        if b is not None:
            ok &= b % (m * deg) == 0
        ok[0] = True
        return ok

    def _focus_dp(self) -> None:
        k = self._dp_stage
        lo = self._bounds[k]
        hi = self._bounds[k + 1] if k + 1 < len(self._bounds) else self._order.shape[0]
        self.buf.set_current_rows(self._order[lo:hi], int(self._order[lo]))
        self.buf.device_mask[:] = self._dp_allowed()

    def _finish(self):
        st = self.state
        assert st is not None
        plan = self._plan(self.stage.copy(), [int(x) for x in self._stage_dp[:self._num_stages]])
        res = st.source.run(plan)
        reward = final_reward(st.best_single, res.step_time, res.feasible, self.config.infeasible_penalty)
        self.buf.set_current_rows(None, -1)
        self.buf.device_mask.fill(0)
        info = self._info()
        best_time, best_plan = self._record_best(res.feasible, res.step_time, plan)
        info.update(step_time=res.step_time, feasible=res.feasible, plan=plan, best_plan=best_plan,
                    best_step_time=best_time)
        return self._obs(), float(reward), True, False, info

    def _info(self) -> dict[str, Any]:
        st = self.state
        assert st is not None
        return {"phase": int(self._phase[0]), "num_stages": self._num_stages, "best_single_time": st.best_single}
