"""Warm starts for the Placeto-style env: begin every episode from the best cheap heuristic's placement.

Placeto starts its episodes from a fixed placement and lets the policy improve it node by node; starting from
the best of the cheap non-learned placers (single device, HEFT, the Baechi family, METIS, round robin) instead
of "everything on one device" spends the agent's simulator budget on improving a good placement.

``heuristic_start(graph, costs, topology, seed=...)`` returns that placement and the simulator calls it took;
``HeuristicStartPlacementEnv`` is ``PlacementEnv`` with it as the initial placement (computed once per task).
The calls count towards the training budget (``SimCallCounter`` adds ``TaskState.extra["start_calls"]``).

``make_env(env_id, env_kwargs)`` builds an env from its registered id, and reads the extra values
``initial_placement="heuristic"`` / ``"incumbent"`` of ``PlacementEnv`` as this env (with them ``start_devices``
too).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from placement_rl import envs  # noqa: F401 - registers the environments
from placement_rl.envs.base import TaskState
from placement_rl.envs.placement import PlacementEnv
from placement_rl import baselines
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

START_HEURISTICS = ("single_device", "heft", "m_etf", "m_sct", "m_topo", "metis", "round_robin")
STARTS = ("heuristic", "incumbent")
PLACEMENT_ENV_ID = "placement_rl/PlacementEnv-v0"


def heuristic_start(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, seed: int = 0,
                    heuristics: tuple[str, ...] = START_HEURISTICS, budget: int = 64) -> tuple[np.ndarray, int, str]:
    """``(device_of_node, sim_calls, placer)``: the best (feasible first, then fastest) placement of the cheap
    heuristics, each given ``budget`` simulator calls (they use a few to check and repair memory)."""
    best: tuple[tuple[int, float], np.ndarray, str] | None = None
    calls = 0
    for name in heuristics:
        p = baselines.get(name)(graph, costs, topology, budget=budget, seed=seed)
        calls += int(p.meta.get("sim_calls", 0))
        if "step_time" not in p.meta:
            from placement_rl.cost import simulate

            res = simulate(graph, costs, topology, p)
            calls += 1
            p.meta.update(step_time=res.step_time, feasible=res.feasible)
        key = (0 if p.meta["feasible"] else 1, float(p.meta["step_time"]))
        if best is None or key < best[0]:
            best = (key, np.asarray(p.device_of_node, dtype=np.int64).copy(), name)
    assert best is not None
    return best[1], calls, best[2]


class HeuristicStartPlacementEnv(PlacementEnv):
    """``PlacementEnv`` whose episodes start from a good placement instead of one device.

    ``start="heuristic"``: every episode starts from ``heuristic_start``'s placement. ``start="incumbent"``:
    from the best placement evaluated so far on the task (by any env sharing the task, e.g. the trainer's
    vector envs), the heuristic one at first — each episode then walks the nodes trying to improve the
    incumbent, as an improvement policy. ``start_devices`` (a device per node) replaces the heuristic placement
    (no heuristic runs), e.g. the incumbent a checkpoint recorded (``placement-rl place``); it must place the
    task's nodes on its devices. Envs that share a task share its start: the first to draw the task sets it.

    Everything else (observation, action, rewards, masks, episode end) is ``PlacementEnv``'s; the reward stays
    normalised by the best single-device time. The env is built with ``initial_placement="random"`` so that
    ``PlacementEnv.reset`` simulates the initial devices, which this class supplies instead of random ones.
    """

    def __init__(self, *, start: str = "heuristic", start_seed: int = 0, start_devices: Any = None,
                 **kwargs: Any) -> None:
        if start not in STARTS:
            raise ConfigError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
        kwargs["initial_placement"] = "random"
        super().__init__(**kwargs)
        self.start, self.start_seed = start, int(start_seed)
        self.start_devices = None if start_devices is None else np.array(start_devices, dtype=np.int64)

    def _initial_devices(self, st: TaskState) -> np.ndarray:
        ex = st.extra
        if "start" not in ex:
            t = st.task
            if self.start_devices is None:
                devices, calls, name = heuristic_start(t.graph, t.costs, t.topology, seed=self.start_seed)
            else:
                devices, calls, name = self._given(t.graph, t.topology), 0, "given"
            ex.update(start=devices, start_calls=calls, start_placer=name, incumbent=devices.copy(),
                      incumbent_key=(1, float("inf")))
        return (ex["incumbent"] if self.start == "incumbent" else ex["start"]).copy()

    def _given(self, graph: CompGraph, topology: DeviceTopology) -> np.ndarray:
        dev = self.start_devices
        assert dev is not None
        if dev.shape != (graph.num_nodes,):
            raise ConfigError(f"start_devices has shape {dev.shape}; graph '{graph.name}' has {graph.num_nodes} nodes")
        d = topology.num_devices
        if dev.size and not (dev.min() >= 0 and dev.max() < d):
            raise ConfigError(f"start_devices holds devices outside 0..{d - 1} (topology '{topology.name}')")
        return dev.copy()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)
        self._offer(info)
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = super().step(action)
        self._offer(info)
        return obs, reward, terminated, truncated, info

    def _offer(self, info: dict[str, Any]) -> None:
        ex = self.state.extra  # type: ignore[union-attr]
        key = (0 if info["feasible"] else 1, float(info["step_time"]))
        if key < ex["incumbent_key"]:
            ex["incumbent_key"] = key
            ex["incumbent"] = info["placement"][:self.devices.shape[0]].copy()


def make_env(env_id: str, env_kwargs: dict[str, Any]) -> gym.Env:
    """``gym.make(env_id, **env_kwargs)`` (without the passive checker), or ``HeuristicStartPlacementEnv`` for
    ``PlacementEnv`` with ``initial_placement="heuristic"`` or ``"incumbent"``."""
    kwargs = dict(env_kwargs)
    if env_id == PLACEMENT_ENV_ID and kwargs.get("initial_placement") in STARTS:
        return HeuristicStartPlacementEnv(start=kwargs.pop("initial_placement"), **kwargs)
    return gym.make(env_id, disable_env_checker=True, **kwargs)
