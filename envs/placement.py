"""``PlacementEnv``: Placeto-style op placement, one node (or coarsened group) per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from placement_rl.errors import ConfigError

from placement_rl.envs.base import BaseEnv, EnvConfig, TaskState, node_memory, padded_placement
from placement_rl.envs.graph_source import Task
from placement_rl.envs.reward import best_single_device, final_reward, make_reward_source, step_gain

__all__ = ["PlacementConfig", "PlacementEnv"]

REWARDS = ("incremental", "final")


@dataclass(frozen=True, kw_only=True)
class PlacementConfig(EnvConfig):
    """``PlacementEnv`` options (plus ``EnvConfig``'s).

    reward: ``incremental`` (step-time gain of each move / T1) or ``final`` (only at the last step).
    initial_placement: ``best_single`` (every node on the fastest single device that fits the model),
        ``random`` (a device per node from the env's RNG) or a device index (an int or a digit string such
        as ``"1"``; kept as a string so the field stays a plain ``str`` for Hydra's ConfigStore).
    passes: how many times the episode walks over all nodes in topological order.
    mask_memory: mask devices whose memory the node would overflow (see ``action_masks``).
    """

    reward: str = "incremental"
    initial_placement: str = "best_single"
    passes: int = 1
    mask_memory: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reward not in REWARDS:
            raise ConfigError(f"reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        ip = self.initial_placement
        if isinstance(ip, (int, np.integer)) and not isinstance(ip, bool):
            object.__setattr__(self, "initial_placement", str(int(ip)))
        if not (self.initial_placement in ("best_single", "random") or str(self.initial_placement).isdigit()):
            raise ConfigError(f"initial_placement must be 'best_single', 'random' or a device index, got {ip!r}")
        if isinstance(self.passes, bool) or not isinstance(self.passes, (int, np.integer)) or self.passes < 1:
            raise ConfigError(f"passes must be a positive integer, got {self.passes!r}")


class PlacementEnv(BaseEnv):
    """Place a computation graph's nodes on devices one at a time (Placeto).

    ## Description
    The episode starts from an initial placement of every node (by default all on the best single device)
    and visits the nodes in topological order (``passes`` times); at each step the agent picks the device
    of the current node. The step time of the placement comes from the reward source (the cost model's
    simulator by default). Graphs and topologies come from the env's ``GraphSource``.

    ## Action Space
    ``Discrete(D_max)``: the device index for the current node. Indices of padded devices (``>= D``, the
    topology's device count) are read as ``a mod D``; ``action_masks()`` keeps a policy off them.

    ## Observation Space
    ``Dict`` of fixed-size ``Box``es (see ``envs.features``): ``node_features [N_max, F]``, ``op_type [N_max]``,
    ``edge_index [2, E_max]`` (padding -1), ``num_nodes [1]``, ``num_edges [1]``, ``placement [N_max]``
    (current device of each node, -1 for padding), ``current_node [1]`` and ``device_mask [D_max]`` (the
    current node's action mask).

    ## Rewards
    Normalised by the best single-device step time T1. ``incremental`` (default): ``(T_prev - T_new) / T1``
    per step, so an episode sums to ``(T_initial - T_final) / T1``; ``final``: 0 until the last step, then
    ``(T1 - T_final) / T1``. Either way ``infeasible_penalty`` (default 1) is subtracted at the last step
    when the final placement does not fit in memory (per the reward source).

    ## Memory masks
    ``action_masks()`` (bool ``[D_max]``) allows a real device ``d`` when the node fits there given the
    current usage: ``sum(4 x params + acts of the other nodes now on d) + own <= memory_bytes[d]`` (every
    node counts where it currently sits, so a not-yet-visited node still counts on its initial device).
    If the node fits nowhere, the device(s) with the smallest overflow stay allowed. Padded devices are
    never allowed. With ``mask_memory=False`` only padded devices are masked.

    ## Starting State
    A task drawn from the graph source with the env's RNG; every node on ``initial_placement``; the
    current node is the first in topological order; no node is marked placed.

    ## Episode End
    Terminates after ``passes x num_nodes`` steps (never truncated by the env itself).

    ## Arguments
    ``graph``, ``topology``, ``cost_fn``, ``reward_source``, ``config`` / options of ``PlacementConfig``
    (see ``envs.base``). ``info`` has ``step_time``, ``feasible``, ``best_single_time``, ``placement`` (int64
    ``[N_max]``, -1 past ``num_nodes``: see ``envs.base``); at the end also ``best_step_time`` and ``best_placement``
    (best seen on this task, the same shape).

    ## Version History
    * v0: initial version.
    """

    config_cls = PlacementConfig

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action_space = spaces.Discrete(self.layout.max_devices)
        self.observation_space = self.layout.space()
        self.devices = np.zeros(0, dtype=np.int64)
        self._order = np.zeros(0, dtype=np.int64)
        self._k = 0
        self._time = 0.0
        self._feasible = True
        self._free = np.zeros(0)  # memory left per device (capacity - usage of the nodes on it)
        self._fits = np.zeros(0, dtype=bool)

    # ------------------------------------------------------------- tasks
    def _prepare(self, task: Task) -> TaskState:
        g, t = task.graph, task.topology
        src = make_reward_source(self.reward_spec, g, task.costs, t)
        t1, dev, ok = best_single_device(src, g.num_nodes, t.num_devices)
        return TaskState(task=task, source=src, best_single=t1, best_device=dev, best_single_feasible=ok,
                         node_mem=node_memory(task), capacity=t.array("memory_bytes"), static=None)

    def _initial_devices(self, st: TaskState) -> np.ndarray:
        n, d = st.task.graph.num_nodes, st.task.topology.num_devices
        ip = self.config.initial_placement
        if ip == "best_single":
            return np.full(n, st.best_device, dtype=np.int64)
        if ip == "random":
            return self.np_random.integers(d, size=n).astype(np.int64)
        if int(ip) >= d:
            raise ConfigError(f"initial_placement={ip} but topology '{st.task.topology.name}' has devices "
                              f"0..{d - 1}")
        return np.full(n, int(ip), dtype=np.int64)

    # --------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        st = self._new_task()
        self.devices = self._initial_devices(st)
        if self.config.initial_placement == "best_single":
            self._time, self._feasible = st.best_single, st.best_single_feasible
        else:
            self._time, self._feasible = st.source.evaluate(self.devices)
        d = st.task.topology.num_devices
        self._free = st.capacity - np.bincount(self.devices, weights=st.node_mem, minlength=d)
        self._fits = np.zeros(d, dtype=bool)
        self._order = np.tile(st.task.graph.topo_order, self.config.passes)
        self._k = 0
        self.buf.set_all_devices(self.devices)
        self._focus(int(self._order[0]))
        return self._obs(), self._info(False)

    def step(self, action: Any):
        st = self.state
        if st is None or self._k >= self._order.shape[0]:
            raise ConfigError("call reset() before step()" if st is None else
                              "the episode has ended (every node is placed): call reset() before step()")
        i = int(self._order[self._k])
        a = self._fold_device(action)
        old = int(self.devices[i])
        before = self._time
        if a != old:
            self.devices[i] = a
            m = st.node_mem[i]
            self._free[old] += m
            self._free[a] -= m
            self.buf.set_device(i, a)
            self._time, self._feasible = st.source.evaluate(self.devices)
        self.buf.set_placed(i)
        self._k += 1
        done = self._k == self._order.shape[0]
        if self.config.reward == "incremental":
            reward = step_gain(st.best_single, before, self._time)
            if done and not self._feasible:
                reward -= self.config.infeasible_penalty
        else:
            reward = (final_reward(st.best_single, self._time, self._feasible, self.config.infeasible_penalty)
                      if done else 0.0)
        if done:
            self.buf.set_current(-1)
            self.buf.device_mask.fill(0)
        else:
            self._focus(int(self._order[self._k]))
        return self._obs(), float(reward), done, False, self._info(done)

    def action_masks(self) -> np.ndarray:
        """Bool ``[D_max]``: devices the current node may go to (see the class docstring)."""
        return self.buf.device_mask.astype(bool)

    # ----------------------------------------------------------- helpers
    def _focus(self, i: int) -> None:
        """Make node ``i`` current and compute its device mask."""
        st = self.state
        assert st is not None
        self.buf.set_current(i)
        mask = self.buf.device_mask
        d = st.capacity.shape[0]
        if not self.config.mask_memory:
            mask[:d] = 1
            return
        m = st.node_mem[i]
        free, fits = self._free, self._fits
        np.greater_equal(free, m, out=fits)  # room for node i on each other device
        own = self.devices[i]
        fits[own] = free[own] >= 0  # it already counts on its own device
        if not fits.any():
            over = m - free  # overflow if node i went to each device
            over[own] = -free[own]
            fits = over <= over.min()
        mask[:d] = fits

    def _info(self, done: bool) -> dict[str, Any]:
        st = self.state
        assert st is not None
        info: dict[str, Any] = {"step_time": self._time, "feasible": self._feasible, "best_single_time": st.best_single,
                                "placement": padded_placement(self.devices, self.layout.max_nodes)}
        if done:
            best_time, best = self._record_best(self._feasible, self._time, info["placement"])
            info.update(best_step_time=best_time, best_placement=best)
        return info
