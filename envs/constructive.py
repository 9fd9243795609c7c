"""``ConstructivePlacementEnv``: build a placement node by node on a schedule-aware state (list scheduling).

## Description
Nodes come in the simulator's priority order (the captured program order); for each one the agent picks a
device. The state is the partial forward schedule (``placement_rl.cost.schedule.ScheduleState``): for every
device, where the node would start and finish including its input transfers over the topology's links, the
bytes it would receive, the device's ready time, load and memory. The earliest-finish device is one feature,
so HEFT-like list scheduling is one policy of this env; a learned policy can do better because it is rewarded
by the whole training step (forward, backward, transfers, memory), which the greedy rule never sees.

## Action Space
``Discrete(D_max)``: the device of the current node; an index past the topology's devices is read as
``a mod D``. ``action_masks()`` allows the devices that have memory for it (if none has, the one with the most
room left), never padded ones; a masked device is still accepted (the placement may then not fit, which the
final reward penalises).

## Observation Space
``Dict`` of ``Box``es: ``node_features [N_max, F_node]`` (static, normalised per graph: see
``envs.constructive_task.NODE_FEATURES``), ``edge_index [2, E_max]`` (padding -1), ``num_nodes [1]``,
``num_edges [1]``, ``num_devices [1]``, ``node [1]`` (index of the node to place), ``device_features
[D_max, F_dev]`` (``placement_rl.cost.schedule.DEVICE_FEATURES``: the one-step schedule features, the truncated
lookahead over the next ``window`` nodes, the topology-position features and the step features: the completed
step in the tail and the branch's backward at every decision; zero for padded devices), ``action_mask
[D_max]``.

## Rewards
0 until the last node; then ``log(T_ref / T)`` with ``T`` the simulated step time of the placement (it equals
``simulate()``: the env runs the simulator's own kernels) and ``T_ref`` the best one-pass heuristic's (min of
HEFT, m-ETF, m-SCT, METIS) on that task, so every graph speaks the same units and "as good as the best
heuristic" is 0; ``infeasible_penalty`` (default 1) less when the placement does not fit in memory.

## Starting State
A task drawn from the graph source with the env's RNG, nothing placed, the first node in the simulator's order
current. A task whose placement-independent memory (``placement_rl.cost.schedule.check_fits``) exceeds all the
topology's devices together has no placement that fits and no schedule state: from a source of several tasks (a
synthetic family, lists of graphs or topologies) it is set aside and another drawn, up to ``MAX_DRAWS`` in a row,
then ``reset`` raises ``PlanError`` naming the last graph and topology; from a single graph and topology it raises
at once.

## Episode End
Terminates after ``N`` steps (one per node); never truncated.

## Arguments
``graph`` and ``topology`` as the other envs take them (``envs.base``; defaults ``synthetic:layered`` on
``4x_v100_nvlink``), ``max_nodes`` / ``max_edges`` / ``max_devices`` (observation padding; None: the largest the
source yields), ``infeasible_penalty`` (a non-negative number), ``window`` (the lookahead window of the device
features), ``render_mode``: ``"ansi"`` (``render()`` returns the placement so far as text) or None; any other mode
is accepted and renders nothing, as ``envs.base`` says. Any other keyword is refused with a ``ConfigError``.

``info``: at reset ``reference`` (``T_ref``), ``graph`` and ``topology`` (their names); ``{}`` after every step but
the last; after the last ``step_time``, ``feasible``, ``placement`` (int64 ``[N_max]``, -1 past ``num_nodes``: see
``envs.base``) and ``reference``.

## Version History
* v0: initial version (the device features gained the window and topology-position columns in place; policies
  trained on the older 19-column block are refused at load with a clear error; later the step columns
  ``la_step``, ``la_full`` and ``la_back`` were added the same way: 29 columns, a 28-column policy is refused).
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from placement_rl.envs.base import DEFAULT_GRAPH, DEFAULT_TOPOLOGY, action_index, padded_placement
from placement_rl.envs.constructive_task import NUM_NODE_FEATURES, ConstructiveTask
from placement_rl.envs.graph_source import GraphSource, Task
from placement_rl.cost.schedule import DEFAULT_WINDOW, NUM_DEVICE_FEATURES, ScheduleState, check_fits
from placement_rl.errors import ConfigError, PlanError
from placement_rl.graph.ir import CompGraph

__all__ = ["MAX_DRAWS", "ConstructivePlacementEnv"]

MAX_DRAWS = 16  # tasks drawn in a row at reset before a source whose tasks do not fit in memory is refused


class ConstructivePlacementEnv(gym.Env):
    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, *, graph: Any = None, topology: Any = None, max_nodes: int | None = None,
                 max_edges: int | None = None, max_devices: int | None = None,
                 infeasible_penalty: float = 1.0, window: int = DEFAULT_WINDOW, render_mode: str | None = None,
                 **unknown: Any) -> None:
        """See the module docstring (``## Arguments``); any other keyword is a one-line ``ConfigError``."""
        if unknown:
            params = inspect.signature(ConstructivePlacementEnv.__init__).parameters
            names = sorted(p for p in params if p not in ("self", "unknown"))
            raise ConfigError(f"unknown option '{sorted(unknown)[0]}' for ConstructivePlacementEnv "
                              f"(options: {', '.join(names)})")
        self.render_mode = render_mode  # any mode is kept, as envs.base does; render() draws only 'ansi'
        if not isinstance(graph, GraphSource):
            graph = DEFAULT_GRAPH if graph is None else graph
            topology = DEFAULT_TOPOLOGY if topology is None else topology
        if isinstance(graph, GraphSource):
            self.source = graph
        elif isinstance(graph, CompGraph):
            self.source = GraphSource.fixed(graph, topology)
        else:
            self.source = GraphSource.from_spec(graph, topology)
        self.max_nodes = int(max_nodes or self.source.max_nodes)
        self.max_edges = int(max_edges or self.source.max_edges())
        self.max_devices = int(max_devices or self.source.max_devices)
        if min(self.max_nodes, self.max_edges, self.max_devices) < 1:
            raise ConfigError("max_nodes, max_edges and max_devices must be >= 1")
        if not (isinstance(infeasible_penalty, numbers.Real) and math.isfinite(infeasible_penalty)
                and infeasible_penalty >= 0):
            raise ConfigError(f"infeasible_penalty must be a non-negative number, got {infeasible_penalty!r}")
        self.infeasible_penalty = float(infeasible_penalty)
        self.window = int(window)
        if self.window < 0:
            raise ConfigError(f"window must be >= 0, got {window}")
        n, e, d = self.max_nodes, self.max_edges, self.max_devices
        self.observation_space = spaces.Dict({
            "node_features": spaces.Box(-np.inf, np.inf, (n, NUM_NODE_FEATURES), np.float32),
            "edge_index": spaces.Box(-1, n - 1, (2, e), np.int64),
            "num_nodes": spaces.Box(0, n, (1,), np.int64),
            "num_edges": spaces.Box(0, e, (1,), np.int64),
            "num_devices": spaces.Box(0, d, (1,), np.int64),
            "node": spaces.Box(0, n - 1, (1,), np.int64),
            "device_features": spaces.Box(-np.inf, np.inf, (d, NUM_DEVICE_FEATURES), np.float32),
            "action_mask": spaces.Box(0, 1, (d,), np.int8),
        })
        self.action_space = spaces.Discrete(d)
        self.task: ConstructiveTask | None = None
        self.state: ScheduleState | None = None
        self._static: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------------------------------------ gym
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        t = self._draw()
        if "constructive" not in t.cache:
            t.cache["constructive"] = ConstructiveTask.build(t.graph, t.topology, t.costs)
        self.task = task = t.cache["constructive"]
        task.window = self.window
        g = task.graph
        if g.num_nodes > self.max_nodes or g.num_edges > self.max_edges or task.topology.num_devices > self.max_devices:
            raise ConfigError(f"task {g.name} ({g.num_nodes} nodes, {g.num_edges} edges, "
                              f"{task.topology.num_devices} devices) exceeds the observation size "
                              f"({self.max_nodes}, {self.max_edges}, {self.max_devices}): raise max_*")
        self.state = task.state(1)
        x = np.zeros((self.max_nodes, NUM_NODE_FEATURES), np.float32)
        x[:g.num_nodes] = task.x
        ei = np.full((2, self.max_edges), -1, np.int64)
        ei[:, :g.num_edges] = g.edges.T
        self._static = {"node_features": x, "edge_index": ei, "num_nodes": np.array([g.num_nodes], np.int64),
                        "num_edges": np.array([g.num_edges], np.int64),
                        "num_devices": np.array([task.topology.num_devices], np.int64)}
        return self._obs(), {"reference": task.reference, "graph": g.name, "topology": task.topology.name}

    def step(self, action: Any):
        st = self.state
        if st is None or self.task is None or st.done:
            raise ConfigError("call reset() before step()" if st is None else
                              "the episode has ended (every node is placed): call reset() before step()")
        # padded indices (inside the action space) wrap; a memory-masked device is allowed
        st.place(action_index(action, self.action_space) % st.topology.num_devices)
        if not st.done:
            return self._obs(), 0.0, False, False, {}
        time = float(st.finish()[0])
        feasible = bool(st.feasible()[0])
        reward = float(np.log(self.task.reference / time)) - (0.0 if feasible else self.infeasible_penalty)
        info = {"step_time": time, "feasible": feasible, "placement": padded_placement(st.devices[0], self.max_nodes),
                "reference": self.task.reference}
        return self._final_obs(), reward, True, False, info

    def action_masks(self) -> np.ndarray:
        return self._mask.astype(bool)

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.state is None:
            return None
        st, g = self.state, self.state.graph
        rows = [f"{g.name} on {st.topology.name}: current node {'-' if st.done else st.node}"]
        rows += [f"  {g.names[i]:<32} -> {d if d >= 0 else '-'}" for i, d in enumerate(st.devices[0].tolist())]
        return "\n".join(rows)

    # ----------------------------------------------------------------------------------------- helpers
    def _draw(self) -> Task:
        """A task whose memory fits the topology (see ``## Starting State``)."""
        single = self.source.is_finite and len(self.source.graphs) * len(self.source.topologies) == 1
        for _ in range(1 if single else MAX_DRAWS):
            t = self.source.sample(self.np_random)
            if "constructive" in t.cache:
                return t
            if "constructive_unfit" not in t.cache:
                try:
                    check_fits(t.graph, t.topology, t.costs)
                    t.cache["constructive_unfit"] = None
                except PlanError as exc:
                    t.cache["constructive_unfit"] = str(exc)
            if t.cache["constructive_unfit"] is None:
                return t
        if single:
            raise PlanError(t.cache["constructive_unfit"])
        raise PlanError(f"{MAX_DRAWS} tasks in a row drawn from the graph source do not fit in memory, the last: "
                        f"{t.cache['constructive_unfit']}")

    def _obs(self) -> dict[str, np.ndarray]:
        st = self.state
        feats, mask = st.features()
        nd = st.topology.num_devices
        dev = np.zeros((self.max_devices, NUM_DEVICE_FEATURES), np.float32)
        dev[:nd] = feats[0]
        self._mask = np.zeros(self.max_devices, np.int8)
        self._mask[:nd] = mask[0]
        return {**{k: v.copy() for k, v in self._static.items()}, "node": np.array([st.node], np.int64),
                "device_features": dev,
                "action_mask": self._mask.copy()}

    def _final_obs(self) -> dict[str, np.ndarray]:
        self._mask = np.zeros(self.max_devices, np.int8)
        self._mask[0] = 1
        return {**{k: v.copy() for k, v in self._static.items()}, "node": np.array([0], np.int64),
                "device_features": np.zeros((self.max_devices, NUM_DEVICE_FEATURES), np.float32),
                "action_mask": self._mask.copy()}
