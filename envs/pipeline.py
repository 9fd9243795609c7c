"""``PipelineEnv``: decide a whole stage plan -- stage cuts in topological order (one stage allowed), a DP degree
per stage, the micro-batch count, DP vs sharded DP, the tensor-parallel degree, and activation recomputation per
stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from placement_rl.baselines.pipe_common import MAX_MICROBATCHES
from placement_rl.cost.pipeline import PIPELINE_SCHEDULES, PipelineSimulator
from placement_rl.errors import ConfigError
from placement_rl.plans import RECOMPUTE, SHARDINGS, StagePlan, graph_batch_size

from placement_rl.envs.base import BaseEnv, EnvConfig, TaskState, action_index, node_memory
from placement_rl.envs.graph_source import Task
from placement_rl.envs.pipeline_options import CUT, DP, MB, RC, RC_ACTIONS, SHARD, TP, PlanOptionPhases
from placement_rl.envs.reward import final_reward

__all__ = ["PipelineConfig", "PipelineEnv"]


@dataclass(frozen=True, kw_only=True)
class PipelineConfig(EnvConfig):
    """``PipelineEnv`` options (plus ``EnvConfig``'s).

    schedule: pipeline schedule of the plan (``gpipe``, ``1f1b``; ``interleaved1f1b`` is not offered because
        its stages share device groups).
    num_microbatches: micro-batches per step; None (default): the agent chooses it (powers of two up to
        ``MAX_MICROBATCHES``, at least the stage count for a pipeline).
    batch_size: global batch (default: the graph's own, ``plans.graph_batch_size``, when it records one); a plan
        is allowed only if ``batch_size % (m * p) == 0`` for every stage's DP degree p.
    max_stages: at most this many stages (default: the topology's device count).
    sharding: ``dp`` (DDP), ``fsdp`` (sharded DP inside each stage) or ``choose`` (default: the agent picks).
    tp: tensor-parallel degree of every stage; None (default): the agent chooses it when the graph has TP splits
        (``placement_rl.graph.tp``) and the topology has room (else 1, and the phase is skipped).
    device_order: ``index`` (default: stages take devices in topology order) or ``fastest`` (fastest first by
        total node time, so a slow device is the last handed out and a plan that uses fewer devices leaves it out).
    mode: ``train`` (default) or ``inference`` (forward only, ``cost.modes``).
    objective: ``step`` (default: reward from the step time) or ``throughput`` (from the steady-state time per
        batch, ``cost.throughput``; the best single-device plan is measured the same way).
    recompute: activation recomputation of every stage (``none``, ``selective``, ``full``: ``cost.recompute``);
        None (default): the agent chooses it per stage where the stage has layers (full) or attention cores
        (selective) to checkpoint, in training mode (else ``none``, and the phase is skipped). A fixed mode
        applies to the stages that have such regions.
    """

    schedule: str = "1f1b"
    num_microbatches: int | None = None
    batch_size: int | None = None
    max_stages: int | None = None
    sharding: str = "choose"
    tp: int | None = None
    device_order: str = "index"
    mode: str = "train"
    objective: str = "step"
    recompute: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        from placement_rl.cost.modes import check_mode, check_objective

        if self.device_order not in ("index", "fastest"):
            raise ConfigError(f"device_order must be 'index' or 'fastest', got {self.device_order!r}")
        check_mode(self.mode)
        check_objective(self.objective)
        if self.schedule not in PIPELINE_SCHEDULES or self.schedule == "interleaved1f1b":
            raise ConfigError(f"schedule must be 'gpipe' or '1f1b' for PipelineEnv, got {self.schedule!r}")
        m = self.num_microbatches
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1):
            raise ConfigError(f"num_microbatches must be a positive integer or None (the agent chooses), got {m!r}")
        b = self.batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1
                              or (m is not None and b % m)):
            raise ConfigError(f"batch_size must be a positive integer divisible by num_microbatches ({m}), got {b!r}")
        s = self.max_stages
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1):
            raise ConfigError(f"max_stages must be a positive integer or None, got {s!r}")
        if self.sharding not in (*SHARDINGS, "choose"):
            raise ConfigError(f"sharding must be one of {', '.join(SHARDINGS)} or 'choose', got {self.sharding!r}")
        t = self.tp
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1):
            raise ConfigError(f"tp must be a positive integer or None (the agent chooses), got {t!r}")
        if self.recompute is not None and self.recompute not in RECOMPUTE:
            raise ConfigError(f"recompute must be one of {', '.join(RECOMPUTE)} or None (the agent chooses), got "
                              f"{self.recompute!r}")


class PipelineEnv(PlanOptionPhases, BaseEnv):
    """Build a pipeline ``StagePlan`` step by step: stage cuts, then data-parallel degrees.

    ## Description
    Phase 0 (cuts) walks the nodes in topological order from the second one; for each the agent picks
    0 = same stage as the previous node or 1 = start a new stage (the first node starts stage 0; never
    cutting gives one stage, e.g. plain data parallelism over all devices). Stages are contiguous blocks of
    one topological order, so every cut is valid. Phase 1 (DP) then visits the stages in order; action ``k``
    gives stage ``s`` a data-parallel degree ``k + 1``. Stage ``s`` gets the next ``k + 1`` devices of the
    topology in index order (devices of one host stay together). Phase 2 (micro-batches; only when
    ``num_microbatches`` is None) starts from the smallest allowed count (1 for one stage, else the smallest
    power of two >= the stage count) and each step 1 = double it, 0 = keep it (the phase ends there or when
    no larger count is allowed). Phase 3 (sharding; only when ``sharding="choose"``): 0 = DDP, 1 = FSDP.
    Phase 4 (tensor parallelism; only when ``tp`` is None and a degree > 1 is allowed): action ``k`` gives every
    stage TP degree ``k + 1``, so stage ``s`` takes ``dp_s x (k + 1)`` devices (TP innermost). A degree is allowed
    when it divides the graph's split sizes (``graph.tp.check_degree``), divides every host's device count (TP
    groups stay inside a host) and the stages' devices times it fit the topology; a fixed ``tp`` shrinks the
    devices the DP phase may hand out accordingly. Phase 5 (activation recomputation; only when ``recompute`` is
    None, in training mode, with at least two actions): visits, in order, each stage that has something to
    checkpoint; action 0 = ``none``, 1 = ``full`` (each layer), 2 = ``selective`` (each attention core; needs
    three actions, i.e. ``D_max >= 3``), a mode allowed when the stage holds nodes of its regions
    (``cost.recompute.regions``). The finished plan is scored with ``simulate_pipeline``, whose memory check (and
    so the reward's infeasibility penalty) sees what each stage's recomputation frees and what it costs in time.

    ## Action Space
    ``Discrete(D_max)`` in every phase. Cuts, micro-batches and sharding: only 0/1 are meaningful (others read
    as ``a mod 2``); a new stage is masked once ``max_stages`` stages exist, doubling once no larger count is
    allowed. DP: degree ``k + 1`` is allowed when the devices used so far plus ``k + 1`` plus one per
    remaining stage fit the topology and, with ``batch_size`` set, ``batch_size % (k + 1) == 0`` (and
    ``% (num_microbatches * (k + 1))`` when it is fixed); a masked degree is replaced by the largest allowed
    degree below it (degree 1 is always allowed).
    Recomputation: a masked mode is replaced by the largest allowed action below it (``none`` always allowed).

    ## Observation Space
    ``envs.features`` keys, where ``placement`` holds the stage of each decided node (-1 undecided) and the
    one-hot "device" columns of ``node_features`` hold that stage; plus ``phase [1]`` (0 cuts, 1 DP,
    2 micro-batches, 3 sharding, 4 TP, 5 recomputation), ``stage_dp [D_max]`` (DP degree chosen per stage, 0 = none
    yet), ``microbatches [1]`` (log2 of the current count), ``sharding [1]`` (0 DDP, 1 FSDP), ``tp [1]`` (the TP
    degree, 1 until decided) and ``recompute [D_max]`` (per stage, the index into ``plans.RECOMPUTE``: 0 none,
    1 selective, 2 full). In the DP and recomputation phases every node of the current stage has the current flag
    and ``current_node`` is its first node.

    ## Rewards
    0 until the last step, then ``(T1 - T) / T1`` where T1 is the best single-device plan (one stage on one
    device, same schedule, the fixed micro-batch count or 1) and T the plan's simulated step time; minus
    ``infeasible_penalty`` (default 1) when the plan does not fit in memory.

    ## Starting State
    A task drawn with the env's RNG; the first node in stage 0, the second node current.

    ## Episode End
    Terminates after ``num_nodes - 1 + num_stages`` steps, plus the micro-batch steps (at most
    ``log2 MAX_MICROBATCHES + 1``), one sharding step, one TP step and one step per stage with something to
    recompute when those are chosen.

    ## Arguments
    ``graph``, ``topology``, ``cost_fn``, ``config`` / options of ``PipelineConfig`` (see ``envs.base``;
    ``reward_source`` is for op-level envs and is rejected here). ``info`` has ``phase``, ``num_stages``,
    ``best_single_time``; at the end also ``step_time``, ``feasible``, ``plan`` (StagePlan), ``objective_value``
    (what the reward scores: the step time, or with ``objective="throughput"`` the steady-state time per batch),
    ``best_plan`` and ``best_step_time`` (the best plan seen on this task and its ``objective_value``).

    ## Version History
    * v0: initial version (cuts and DP degrees; fixed micro-batches).
    * v0, micro-batches and sharding: the micro-batch count and DP vs FSDP are decisions too (defaults
      ``num_microbatches=None``, ``sharding="choose"``; pass ``num_microbatches=4, sharding="dp"`` for the old
      episodes).
    * v0, tensor parallelism: the TP degree is a decision (phase 4, ``tp=None``) on graphs with TP splits;
      observation key ``tp``. Graphs without splits (synthetic families) have the same episodes as before; pass
      ``tp=1`` for the old episodes on captured transformers.
    * v0, device order, inference and throughput: options ``device_order`` (``fastest``: a slow device is handed
      out last or not at all), ``mode`` (``inference``) and ``objective`` (``throughput``); the defaults keep the
      old episodes.
    * v0, activation recomputation: a per-stage decision (phase 5, ``recompute=None``) on graphs with layers or
      attention cores; observation key ``recompute``. Graphs without them (synthetic families) and inference
      have the same episodes as before; pass ``recompute="none"`` for the old episodes on captured transformers.
    """

    config_cls = PipelineConfig

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("reward_source") is not None:
            raise ConfigError("PipelineEnv scores plans with simulate_pipeline: reward_source is not supported")
        super().__init__(**kwargs)
        d = self.layout.max_devices
        self.action_space = spaces.Discrete(d)
        space = self.layout.space()
        space.spaces["phase"] = spaces.Box(0, RC, (1,), np.int64)
        space.spaces["stage_dp"] = spaces.Box(0, d, (d,), np.int64)
        space.spaces["microbatches"] = spaces.Box(0, int(np.log2(MAX_MICROBATCHES)), (1,), np.int64)
        space.spaces["sharding"] = spaces.Box(0, 1, (1,), np.int64)
        space.spaces["tp"] = spaces.Box(1, d, (1,), np.int64)
        space.spaces["recompute"] = spaces.Box(0, len(RECOMPUTE) - 1, (d,), np.int64)
        self.observation_space = space
        self._phase = np.zeros(1, np.int64)
        self._stage_dp = np.zeros(d, np.int64)
        self._log_m = np.zeros(1, np.int64)
        self._shard = np.zeros(1, np.int64)
        self._tp = np.ones(1, np.int64)
        self._rc = np.zeros(d, np.int64)
        self.buf.arrays.update(phase=self._phase, stage_dp=self._stage_dp, microbatches=self._log_m,
                               sharding=self._shard, tp=self._tp, recompute=self._rc)
        self._regions: dict[str, np.ndarray] = {}  # recomputation mode -> region id per node (the task's graph)
        self._rc_todo: list[int] = []  # stages the recomputation phase still visits
        self._tp_ok = np.ones(1, dtype=bool)  # TP degrees 1.. the task's graph and topology allow
        self.stage = np.zeros(0, dtype=np.int64)
        self._pos = 0
        self._num_stages = 0
        self._dp_stage = 0
        self._used = 0
        self._bounds: list[int] = []
        self._batch: int | None = None
        self._devs = np.arange(d)

    def _state_key(self) -> Any:
        c = self.config
        return (c.schedule, c.num_microbatches or 1, c.batch_size, c.mode, c.objective)

    def _plan(self, stage: np.ndarray, dp: list[int]) -> StagePlan:
        groups, start = [], 0
        t = int(self._tp[0])
        devs = self._devs
        for p in dp:
            groups.append(tuple(int(x) for x in devs[start:start + p * t]))
            start += p * t
        c = self.config
        return StagePlan(stage_of_node=stage, stage_devices=tuple(groups), num_microbatches=self._m,
                         schedule=c.schedule, batch_size=c.batch_size, sharding=SHARDINGS[int(self._shard[0])],
                         tp=(t,) * len(dp), recompute=tuple(RECOMPUTE[int(k)] for k in self._rc[:len(dp)]))

    def _prepare(self, task: Task) -> TaskState:
        g, t = task.graph, task.topology
        sim = PipelineSimulator(g, task.costs, t, mode=self.config.mode)
        best: tuple[int, float, int] | None = None
        for d in range(t.num_devices):
            plan = StagePlan(stage_of_node=np.zeros(g.num_nodes, np.int64), stage_devices=((d,),),
                             num_microbatches=self.config.num_microbatches or 1, schedule=self.config.schedule,
                             batch_size=self.config.batch_size)
            res = sim.run(plan)
            cand = (0 if res.feasible else 1, self._value(res), d)
            best = cand if best is None or cand < best else best
        assert best is not None
        return TaskState(task=task, source=sim, best_single=best[1], best_device=best[2],
                         best_single_feasible=best[0] == 0, node_mem=node_memory(task),
                         capacity=t.array("memory_bytes"), static=None)

    # --------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        st = self._new_task()
        self._done = False
        n = st.task.graph.num_nodes
        self.stage = np.full(n, -1, dtype=np.int64)
        self._order = st.task.graph.topo_order
        nd = st.task.topology.num_devices
        if self.config.device_order == "fastest":
            total = (st.task.costs.fwd_time + st.task.costs.bwd_time).sum(axis=0)
            self._devs = np.lexsort((np.arange(nd), total))
        else:
            self._devs = np.arange(nd)
        d = st.task.topology.num_devices // (self.config.tp or 1)
        self._max_stages = min(d, self.config.max_stages or d)
        if self.config.num_microbatches and self.config.schedule == "1f1b":  # Schedule1F1B: micro-batches >= stages
            self._max_stages = min(self._max_stages, self.config.num_microbatches)
        self._batch = self.config.batch_size if self.config.batch_size is not None else graph_batch_size(st.task.graph)
        first = int(self._order[0])
        self.stage[first] = 0
        self.buf.set_device(first, 0)
        self.buf.set_placed(first)
        self._num_stages, self._bounds = 1, [0]  # topo position where each stage starts
        self._stage_dp.fill(0)
        self._m = self.config.num_microbatches or 1
        self._log_m[0] = int(np.log2(self._m)) if self._m <= MAX_MICROBATCHES else 0
        self._shard[0] = 1 if self.config.sharding == "fsdp" else 0
        self._tp_ok = self._tp_degrees(st.task) if self.config.tp is None else np.ones(1, dtype=bool)
        self._tp[0] = self.config.tp or 1
        self._rc.fill(0)
        self._regions = self._task_regions(st.task)
        self._rc_todo = []
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
        if st is None or self._done:
            raise ConfigError("call reset() before step()" if st is None else
                              "the episode has ended (the plan is simulated): call reset() before step()")
        action = action_index(action, self.action_space)
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
        if self._phase[0] == MB:
            if int(action) % 2 == 1 and self._m_allowed(2 * self._m):
                self._set_m(2 * self._m)
                if self._m_allowed(2 * self._m):
                    self._focus_flag()
                    return self._obs(), 0.0, False, False, self._info()
            return self._after_mb()
        if self._phase[0] == SHARD:
            self._shard[0] = int(action) % 2
            return self._after_shard()
        if self._phase[0] == TP:
            allowed = self._tp_allowed()
            t = int(action) + 1
            if t > allowed.shape[0] or not allowed[t - 1]:
                t = int(np.flatnonzero(allowed[:min(t, allowed.shape[0])])[-1]) + 1
            self._tp[0] = t
            return self._after_tp()
        if self._phase[0] == RC:
            s = self._rc_todo.pop(0)
            allowed = self._rc_allowed(s)
            k = min(int(action), allowed.shape[0] - 1)
            if not allowed[k]:
                k = int(np.flatnonzero(allowed[:k + 1])[-1])
            self._rc[s] = RECOMPUTE.index(RC_ACTIONS[k])
            if self._rc_todo:
                self._focus_rc()
                return self._obs(), 0.0, False, False, self._info()
            return self._finish()
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
        return self._start_mb()

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
        d = self.state.task.topology.num_devices // int(self._tp[0])  # type: ignore[union-attr]
        left = d - self._used - (self._num_stages - self._dp_stage - 1)
        deg = np.arange(1, self.layout.max_devices + 1)
        ok = deg <= left
        b, m = self._batch, self.config.num_microbatches or 1
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
        value = self._value(res)
        reward = final_reward(st.best_single, value, res.feasible, self.config.infeasible_penalty)
        self.buf.set_current_rows(None, -1)
        self.buf.device_mask.fill(0)
        info = self._info()
        best_time, best_plan = self._record_best(res.feasible, value, plan)
        self._done = True
        info.update(step_time=res.step_time, feasible=res.feasible, plan=plan, best_plan=best_plan,
                    best_step_time=best_time, objective_value=value)
        return self._obs(), float(reward), True, False, info

    def _value(self, res) -> float:
        """What the episode minimises: the step time, or the steady-state time per batch."""
        return float(res.step_time) if self.config.objective == "step" else float(res.meta["steady_time"])

    def _info(self) -> dict[str, Any]:
        st = self.state
        assert st is not None
        return {"phase": int(self._phase[0]), "num_stages": self._num_stages, "best_single_time": st.best_single}
