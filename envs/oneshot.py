"""``OneShotPlacementEnv``: ColocRL/GDP-style op placement, a device for every node in one step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from placement_rl.errors import ConfigError

from placement_rl.envs.base import BaseEnv, EnvConfig, TaskState, node_memory, padded_placement
from placement_rl.envs.graph_source import Task
from placement_rl.envs.reward import best_single_device, final_reward, make_reward_source

__all__ = ["OneShotConfig", "OneShotPlacementEnv"]


@dataclass(frozen=True, kw_only=True)
class OneShotConfig(EnvConfig):
    """``OneShotPlacementEnv`` options (plus ``EnvConfig``'s).

    mask_memory: also mask, per node, devices whose memory the node alone overflows (its 4 x params +
        activations; unless it fits on no device).
    """

    mask_memory: bool = True


class OneShotPlacementEnv(BaseEnv):
    """Place every node of a computation graph at once (ColocRL, GDP).

    ## Description
    Each episode draws a task (graph, topology) from the graph source; the single action gives a device to
    every node; the reward is the speed-up of that placement over the best single device, from the reward
    source (the cost model's simulator by default).

    ## Action Space
    ``MultiDiscrete([D_max] * N_max)``: entry ``i`` is the device of node ``i``; entries of padded nodes are
    ignored; indices of padded devices are read as ``a mod D``; an action outside the space (an entry out of
    ``0..D_max-1`` or not an integer, or not ``N_max`` entries) is refused with a ``ConfigError``.
    ``action_masks()`` returns the concatenated per-node masks (bool ``[N_max * D_max]``, sb3-contrib
    MaskablePPO's MultiDiscrete convention): a real node allows the topology's devices (with ``mask_memory``,
    those its own memory fits); a padded node allows only device 0.

    ## Observation Space
    As ``PlacementEnv`` (``envs.features``): at reset ``placement`` is -1 everywhere (nothing placed yet),
    no node is current (``current_node`` 0), ``device_mask`` marks the topology's devices. The terminal
    observation shows the chosen placement with every node marked placed.

    ## Rewards
    ``(T1 - T) / T1`` with T1 the best single-device step time, minus ``infeasible_penalty`` (default 1)
    when the placement does not fit in memory.

    ## Starting State
    A task drawn with the env's RNG; nothing placed.

    ## Episode End
    Terminates after the one step (``terminated``; no time limit: a ``TimeLimit`` of one step marked every
    episode truncated as well).

    ## Arguments
    ``graph``, ``topology``, ``cost_fn``, ``reward_source``, ``config`` / options of ``OneShotConfig`` (see
    ``envs.base``). ``info`` has ``step_time``, ``feasible``, ``best_single_time``, ``placement`` (int64
    ``[N_max]``, -1 past ``num_nodes``: see ``envs.base``); at reset they describe the reference (every node on the
    best single device); after the step the chosen placement, plus ``best_step_time`` and ``best_placement`` (best
    seen on this task, the same shape).

    ## Version History
    * v0: initial version.
    """

    config_cls = OneShotConfig

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        n, d = self.layout.max_nodes, self.layout.max_devices
        self.action_space = spaces.MultiDiscrete(np.full(n, d, dtype=np.int64))
        self.observation_space = self.layout.space()
        self.devices = np.zeros(0, dtype=np.int64)
        self._done = False

    def _state_key(self) -> Any:
        return self.config.mask_memory

    def _prepare(self, task: Task) -> TaskState:
        g, t = task.graph, task.topology
        src = make_reward_source(self.reward_spec, g, task.costs, t)
        t1, dev, ok = best_single_device(src, g.num_nodes, t.num_devices)
        st = TaskState(task=task, source=src, best_single=t1, best_device=dev, best_single_feasible=ok,
                       node_mem=node_memory(task), capacity=t.array("memory_bytes"), static=None)
        n, d = g.num_nodes, t.num_devices
        nm, dm = self.layout.max_nodes, self.layout.max_devices
        masks = np.zeros((nm, dm), dtype=bool)
        masks[n:, 0] = True
        masks[:n, :d] = True
        if self.config.mask_memory:
            fits = st.node_mem[:, None] <= st.capacity[None, :]
            fits[~fits.any(axis=1)] = True
            masks[:n, :d] = fits
        st.extra["masks"] = masks.reshape(-1)
        return st

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        st = self._new_task()
        self.devices = np.zeros(0, dtype=np.int64)
        self.buf.device_mask[:st.task.topology.num_devices] = 1
        self._done = False
        return self._obs(), self._info(None)

    def step(self, action: Any):
        st = self.state
        if st is None or self._done:
            raise ConfigError("call reset() before step(): a one-shot episode has a single step")
        n, d = st.task.graph.num_nodes, st.task.topology.num_devices
        self.devices = np.ascontiguousarray(self._action_devices(action)[:n] % d)
        step_time, feasible = st.source.evaluate(self.devices)
        reward = final_reward(st.best_single, step_time, feasible, self.config.infeasible_penalty)
        self.buf.set_all_devices(self.devices)
        self.buf.node_features[:n, self.layout.placed] = 1.0
        self.buf.device_mask.fill(0)
        self._done = True
        return self._obs(), float(reward), True, False, self._info((step_time, feasible))

    def _action_devices(self, action: Any) -> np.ndarray:
        """``action`` as int64 ``[N_max]`` (integers, or floats with integer values, in any shape of that size); an
        entry outside the action space or not an integer, or a wrong size, is a one-line ``ConfigError`` (such
        entries used to be truncated and folded onto a device in silence)."""
        n, d = self.layout.max_nodes, self.layout.max_devices
        space = f"MultiDiscrete([{d}] * {n})"
        try:
            flat = np.asarray(action).reshape(-1)
        except (TypeError, ValueError):
            flat = np.zeros(0, dtype=object)
        if flat.dtype.kind not in "iubf":
            raise ConfigError(f"an action of {space} is {n} device indices, got {type(action).__name__} "
                              f"of {flat.dtype}")
        if flat.shape[0] != n:
            raise ConfigError(f"action must hold {n} device indices (one per padded node) for the action space "
                              f"{space}, got {flat.shape[0]}")
        ok = (flat >= 0) & (flat < d)
        if flat.dtype.kind == "f":
            ok &= flat == np.floor(flat)
        bad = np.flatnonzero(~ok)
        if bad.size:
            i = int(bad[0])
            raise ConfigError(f"action entry #{i}: {flat[i].item()!r} is outside the action space {space} "
                              f"(integers 0..{d - 1})")
        return flat.astype(np.int64)

    def action_masks(self) -> np.ndarray:
        """Bool ``[N_max * D_max]``: per-node device masks, concatenated (see the class docstring)."""
        if self.state is None:
            raise ConfigError("call reset() before action_masks()")
        return self.state.extra["masks"].copy()

    def _info(self, result: tuple[float, bool] | None) -> dict[str, Any]:
        st = self.state
        assert st is not None
        if result is None:
            return {"step_time": st.best_single, "feasible": st.best_single_feasible,
                    "best_single_time": st.best_single,
                    "placement": padded_placement(np.full(st.task.graph.num_nodes, st.best_device),
                                                  self.layout.max_nodes)}
        placement = padded_placement(self.devices, self.layout.max_nodes)
        best_time, best = self._record_best(result[1], result[0], placement)
        return {"step_time": result[0], "feasible": result[1], "best_single_time": st.best_single,
                "placement": placement, "best_step_time": best_time, "best_placement": best}
