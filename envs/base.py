"""Shared machinery of the environments: options, graph source, observation layout, per-task state.

The op-level, one-shot and pipeline environments take the same construction arguments (all keyword-only;
``ConstructivePlacementEnv`` takes ``graph``, ``topology`` and its own options, see ``envs.constructive``)::

    Env(graph=..., topology=..., cost_fn=None, reward_source=None, config=None, render_mode=None, **options)

* ``graph``: a ``GraphSource``, a ``CompGraph``, a list of CompGraphs, a graph JSON file, a folder of
  them, ``"synthetic:<family>[,...]"`` or ``"zoo:<name>[,...]"`` (default ``"synthetic:layered"``, 16-32 nodes).
* ``topology``: a ``DeviceTopology``, a preset name, a YAML path, or a list of them (one drawn per reset;
  default ``"4x_v100_nvlink"``). Not allowed together with a ``GraphSource`` (it holds its topologies).
* ``cost_fn``: ``(graph, topology) -> CostTable`` (default ``resolve_costs``), e.g. to plug in profiles.
* ``reward_source``: see ``envs.reward`` (an object with ``evaluate`` or a per-task factory).
* ``config`` / ``**options``: the env's frozen config dataclass, or its fields as keywords.
* ``render_mode``: ``"ansi"`` (``render()`` returns the placement as text) or None; any other mode is accepted
  and renders nothing (``gymnasium.make`` warns about it; SB3's ``make_vec_env`` passes ``"rgb_array"`` unless
  told otherwise).

Placements in ``info`` (``placement``, ``best_placement``) are int64 ``[N_max]``: the device of each node, -1 past
the task's ``num_nodes`` (as the observation's ``placement``), so they keep one shape over a graph family and
gymnasium's vector envs (``SyncVectorEnv``, ``AsyncVectorEnv``), which stack array infos, can batch them; take
``[:num_nodes]`` for the task's own nodes. With one graph ``N_max`` is its node count unless ``max_nodes`` is set.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from placement_rl.cost.memory import pinned_memory, static_memory
from placement_rl.errors import ConfigError

from placement_rl.envs.features import ObsBuffer, ObsLayout, static_features
from placement_rl.envs.graph_source import CostFn, GraphSource, Task
from placement_rl.envs.reward import RewardSource

__all__ = ["BaseEnv", "EnvConfig", "action_index", "node_memory", "padded_placement"]

DEFAULT_GRAPH = "synthetic:layered"
DEFAULT_TOPOLOGY = "4x_v100_nvlink"


def action_index(action: Any, space: gym.spaces.Discrete) -> int:
    """An action of a ``Discrete`` space as an int (a Python or NumPy integer, or a one-element array); anything
    outside the space is a one-line ``ConfigError`` (an index past it used to be folded onto a device in silence)."""
    try:
        arr = np.asarray(action)
        a = int(arr.reshape(()))
        exact = arr.dtype.kind in "iub" or float(arr.reshape(())) == a
    except (TypeError, ValueError):
        raise ConfigError(f"an action of {space} is one integer, got {action!r}") from None
    if not exact or not space.start <= a < space.start + space.n:
        raise ConfigError(f"action {action!r} is outside the action space {space} (integers {space.start}.."
                          f"{space.start + space.n - 1})")
    return a


def padded_placement(devices: np.ndarray, max_nodes: int) -> np.ndarray:
    """``devices`` (int64 [num_nodes]) as a new int64 ``[max_nodes]`` array, -1 past ``num_nodes``: the shape of a
    placement in ``info`` (see the module docstring)."""
    out = np.full(max_nodes, -1, dtype=np.int64)
    out[:len(devices)] = devices
    return out


def node_memory(task: Task) -> np.ndarray:
    """Bytes a node pins on its device whatever the placement (``placement_rl.cost.memory.static_memory``).
    The simulator adds received buffers, which depend on the placement, so it may still say infeasible.
    Inference costs (``cost.modes``): the parameters alone (no gradients, optimizer state or kept activations)."""
    costs = getattr(task, "costs", None)
    return static_memory(task.graph) if costs is None else pinned_memory(task.graph, costs)


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """Options shared by every environment.

    max_nodes / max_edges / max_devices: observation padding (None: the largest the graph source yields;
        for synthetic families ``max_edges`` is estimated and larger draws are drawn again).
    op_type_buckets: size of the hashed op-type vocabulary (id 0 is padding).
    infeasible_penalty: subtracted from the final reward when the final plan does not fit in memory.
    copy_obs: return copies of the observation arrays (False: the env's own buffers, valid until the
        next ``step``/``reset``; SB3's vector envs copy them anyway).
    """

    max_nodes: int | None = None
    max_edges: int | None = None
    max_devices: int | None = None
    op_type_buckets: int = 64
    infeasible_penalty: float = 1.0
    copy_obs: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.infeasible_penalty, (int, float)) and np.isfinite(self.infeasible_penalty)
                and self.infeasible_penalty >= 0):
            raise ConfigError(f"infeasible_penalty must be a non-negative number, got {self.infeasible_penalty!r}")


def make_config(cls: type, config: Any, options: dict[str, Any]) -> Any:
    if config is None:
        config = cls()
    elif not isinstance(config, cls):
        raise ConfigError(f"config must be a {cls.__name__}, got {type(config).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(f"unknown option '{unknown[0]}' for {cls.__name__} (options: {', '.join(sorted(names))})")
    try:
        return dataclasses.replace(config, **options) if options else config
    except TypeError as exc:
        raise ConfigError(f"invalid {cls.__name__} option: {exc}") from None


@dataclass(eq=False)
class TaskState:
    """What an env derives once per task: reward source, normaliser, memory arrays, features."""

    task: Task
    source: Any  # a RewardSource (op-level envs) or a PipelineSimulator (PipelineEnv)
    best_single: float  # T1: best single-device step time
    best_device: int
    best_single_feasible: bool
    node_mem: np.ndarray  # float64 [n]
    capacity: np.ndarray  # float64 [D]
    static: Any
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class BaseEnv(gym.Env):
    """Common construction, reset plumbing and best-so-far bookkeeping (see the module docstring)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    config_cls: type = EnvConfig

    def __init__(self, *, graph: Any = None, topology: Any = None, cost_fn: CostFn | None = None,
                 reward_source: Any = None, config: Any = None, render_mode: str | None = None,
                 **options: Any) -> None:
        self.config = make_config(self.config_cls, config, options)
        # any other mode is kept, not refused: gymnasium.make warns about it, and SB3's make_vec_env asks every env
        # for 'rgb_array' unless told otherwise; render() draws only 'ansi'
        self.render_mode = render_mode
        if isinstance(graph, GraphSource):
            if topology is not None or cost_fn is not None:
                raise ConfigError("a GraphSource holds its topologies and cost_fn: do not pass topology or cost_fn "
                                  "with it")
            self.source = graph
        else:
            self.source = GraphSource.from_spec(DEFAULT_GRAPH if graph is None else graph,
                                                DEFAULT_TOPOLOGY if topology is None else topology, cost_fn=cost_fn)
        single = self.source.is_finite and len(self.source.graphs) == 1 and len(self.source.topologies) == 1
        if reward_source is not None and isinstance(reward_source, RewardSource) and not single:
            raise ConfigError("a reward_source object serves one graph on one topology; with several graphs or "
                              "topologies pass a factory (graph, costs, topology) -> source instead")
        self.reward_spec = reward_source
        cfg = self.config
        self.layout = ObsLayout(max_nodes=cfg.max_nodes or self.source.max_nodes,
                                max_edges=cfg.max_edges or self.source.max_edges(),
                                max_devices=cfg.max_devices or self.source.max_devices,
                                op_type_buckets=cfg.op_type_buckets)
        if not self.source.is_finite:
            self.source.set_edge_limit(self.layout.max_edges)
            if self.source.num_nodes[1] > self.layout.max_nodes:
                raise ConfigError(f"synthetic graphs reach {self.source.num_nodes[1]} nodes, more than "
                                  f"max_nodes={self.layout.max_nodes}: raise max_nodes")
        for g in self.source.graphs:  # finite sources are checked up front
            for t in self.source.topologies:
                self.layout.check_fits(g, t)
        if not self.source.is_finite:
            for t in self.source.topologies:
                if t.num_devices > self.layout.max_devices:
                    raise ConfigError(f"topology '{t.name}' has {t.num_devices} devices, more than "
                                      f"max_devices={self.layout.max_devices}: raise max_devices")
        self.buf = ObsBuffer(self.layout)
        self.state: TaskState | None = None
        self._best: dict[Any, tuple[tuple[int, float], Any]] = {}

    # -------------------------------------------------------------- tasks
    @property
    def task(self) -> Task:
        """The current episode's task (graph, topology, costs); set by ``reset``."""
        if self.state is None:
            raise ConfigError("call reset() first: no task has been drawn yet")
        return self.state.task

    def _state_for(self, task: Task) -> TaskState:
        # The reward spec itself (not its id) is part of the key, so a recycled id can never match.
        spec = self.reward_spec if getattr(type(self.reward_spec), "__hash__", None) else id(self.reward_spec)
        key = (type(self).__name__, "state", self.layout, spec, self._state_key())
        st = task.cache.get(key)
        if st is None:
            st = self._prepare(task)  # defined by each environment
            st.static = static_features(task, self.layout)
            task.cache[key] = st
        return st

    def _state_key(self) -> Any:
        """Config values the per-task state depends on (beyond the layout and reward source)."""
        return None

    def _new_task(self) -> TaskState:
        self.state = self._state_for(self.source.sample(self.np_random))
        self.buf.load(self.state.static)
        return self.state

    def _record_best(self, feasible: bool, step_time: float, value: Any) -> tuple[float, Any]:
        """Keep the best (feasible first, then fastest) result per finite task; return the best so far."""
        assert self.state is not None
        task_key = self.state.task.key if self.state.task.key is not None else id(self.state.task)
        if self.state.task.key is None:
            self._best.clear()  # sampled graphs are not seen again: keep only the current one
        rank = (0 if feasible else 1, float(step_time))
        old = self._best.get(task_key)
        if old is None or rank < old[0]:
            self._best[task_key] = (rank, copy.deepcopy(value))
            old = self._best[task_key]
        return old[0][1], copy.deepcopy(old[1])  # the caller's to change: the env's own stays as it was

    def _obs(self) -> dict[str, np.ndarray]:
        return self.buf.observation(copy=self.config.copy_obs)

    def _fold_device(self, action: Any) -> int:
        """An action index as a real device: indices of padded devices (inside the action space) wrap around
        (``a mod D``); one outside the space is refused (``action_index``)."""
        assert self.state is not None
        return action_index(action, self.action_space) % self.state.task.topology.num_devices

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.state is None:
            return None
        g, t = self.state.task.graph, self.state.task.topology
        n = g.num_nodes
        rows = [f"{g.name} on {t.name}: current node {int(self.buf.current_node[0])}"]
        for i in range(n):
            p = int(self.buf.placement[i])
            rows.append(f"  {g.names[i]:<32} -> {p if p >= 0 else '-'}")
        return "\n".join(rows)
