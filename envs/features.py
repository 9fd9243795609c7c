"""Fixed-size observations of a (graph, topology, partial placement), shared by every environment.

SB3 does not accept ``spaces.Graph``, so a graph is padded into a ``spaces.Dict`` of ``Box``es sized by an
``ObsLayout`` (``N = max_nodes``, ``E = max_edges``, ``D = max_devices``, ``F = layout.num_features``):

==================  ==========  =======  ====================================================================
key                 shape       dtype    content
==================  ==========  =======  ====================================================================
``node_features``   [N, F]      float32  per node, columns below; padded rows are 0
``op_type``         [N]         int64    hashed op-type id in ``1..op_type_buckets-1``; padded nodes 0
``edge_index``      [2, E]      int64    ``edge_index[:, :num_edges]`` = (src, dst); padding is **-1** in both
                                         rows, so ``valid = edge_index[0] >= 0`` masks a batch without a loop
``num_nodes``       [1]         int64    real nodes ``n``; rows ``n..N-1`` are padding
``num_edges``       [1]         int64    real edges
``placement``       [N]         int64    device (or stage, ``PipelineEnv``) of each node, -1 = none/padding
``current_node``    [1]         int64    node the next action is about (0 once the episode is over)
``device_mask``     [D]         int8     1 where the next action may pick that index (``action_masks()``)
==================  ==========  =======  ====================================================================

``node_features`` columns (``ObsLayout`` exposes them as slices / indices):

* 0-4 ``fwd_flops, bwd_flops, out_bytes, param_bytes, act_bytes``: ``log1p(x) / log1p(max over graph)``
* 5-6 in/out degree divided by the graph's largest in/out degree
* 7 topological depth (longest path from a source) divided by the graph's depth
* 8 op-type id scaled to [0, 1] (``op_type / (op_type_buckets - 1)``)
* ``speed`` (D columns) fastest fwd+bwd time of the node over devices / its time on device d, in (0, 1];
  0 on padded devices
* ``device`` (D columns) one-hot of the node's current device (stage in ``PipelineEnv``)
* ``current`` 1 on the node the next action is about (all nodes of the current stage in the DP phase)
* ``placed`` 1 on nodes already decided this episode
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

from placement_rl.envs.graph_source import Task

__all__ = ["NUM_STATIC", "ObsBuffer", "ObsLayout", "StaticFeatures", "op_type_id", "static_features"]

NUM_STATIC = 9  # columns 0..8 above
_SIZE_KEYS = ("fwd_flops", "bwd_flops", "out_bytes", "param_bytes", "act_bytes")


@dataclass(frozen=True)
class ObsLayout:
    max_nodes: int
    max_edges: int
    max_devices: int
    op_type_buckets: int = 64

    def __post_init__(self) -> None:
        for key in ("max_nodes", "max_edges", "max_devices"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"{key} must be a positive integer, got {v!r}")
        if not isinstance(self.op_type_buckets, (int, np.integer)) or self.op_type_buckets < 2:
            raise ConfigError(f"op_type_buckets must be an integer >= 2, got {self.op_type_buckets!r}")

    @property
    def speed(self) -> slice:
        return slice(NUM_STATIC, NUM_STATIC + self.max_devices)

    @property
    def device(self) -> slice:
        return slice(NUM_STATIC + self.max_devices, NUM_STATIC + 2 * self.max_devices)

    @property
    def current(self) -> int:
        return NUM_STATIC + 2 * self.max_devices

    @property
    def placed(self) -> int:
        return NUM_STATIC + 2 * self.max_devices + 1

    @property
    def num_features(self) -> int:
        return NUM_STATIC + 2 * self.max_devices + 2

    def space(self) -> spaces.Dict:
        n, e, d = self.max_nodes, self.max_edges, self.max_devices
        i64 = np.int64
        return spaces.Dict({
            "node_features": spaces.Box(0.0, 1.0, (n, self.num_features), np.float32),
            "op_type": spaces.Box(0, self.op_type_buckets - 1, (n,), i64),
            "edge_index": spaces.Box(-1, n - 1, (2, e), i64),
            "num_nodes": spaces.Box(1, n, (1,), i64),
            "num_edges": spaces.Box(0, e, (1,), i64),
            "placement": spaces.Box(-1, d - 1, (n,), i64),
            "current_node": spaces.Box(0, n - 1, (1,), i64),
            "device_mask": spaces.Box(0, 1, (d,), np.int8),
        })

    def check_fits(self, g: CompGraph, t: DeviceTopology) -> None:
        for what, have, limit, opt in (("nodes", g.num_nodes, self.max_nodes, "max_nodes"),
                                       ("edges", g.num_edges, self.max_edges, "max_edges"),
                                       ("devices", t.num_devices, self.max_devices, "max_devices")):
            if have > limit:
                owner = f"topology '{t.name}'" if what == "devices" else f"graph '{g.name}'"
                raise ConfigError(f"{owner} has {have} {what}, more than the observation's {opt}={limit}: "
                                  f"raise {opt}")


def op_type_id(op_type: str, buckets: int) -> int:
    """Stable hashed id of an op type in ``1..buckets-1`` (0 is padding)."""
    return 1 + zlib.crc32(op_type.encode()) % (buckets - 1)


@dataclass(frozen=True, eq=False)
class StaticFeatures:
    """The placement-independent part of an observation of one task (padded to a layout)."""

    node_features: np.ndarray  # float32 [N, F], dynamic columns 0
    op_type: np.ndarray  # int64 [N]
    edge_index: np.ndarray  # int64 [2, E]
    num_nodes: int
    num_edges: int


def _log_scaled(x: np.ndarray) -> np.ndarray:
    top = np.log1p(x.max()) if x.size else 0.0
    return np.log1p(x) / top if top > 0 else np.zeros_like(x)


def static_features(task: Task, layout: ObsLayout) -> StaticFeatures:
    """Features of ``task`` that do not depend on the placement, cached in ``task.cache`` per layout."""
    key = ("static_features", layout)
    hit = task.cache.get(key)
    if hit is not None:
        return hit
    layout.check_fits(task.graph, task.topology)
    g, costs = task.graph, task.costs
    n, e, d = g.num_nodes, g.num_edges, task.topology.num_devices
    nf = np.zeros((layout.max_nodes, layout.num_features), np.float32)
    for k, name in enumerate(_SIZE_KEYS):
        nf[:n, k] = _log_scaled(getattr(g, name))
    indeg, outdeg = np.diff(g.pred_ptr), np.diff(g.succ_ptr)
    nf[:n, 5] = indeg / max(int(indeg.max()), 1)
    nf[:n, 6] = outdeg / max(int(outdeg.max()), 1)
    depth = np.zeros(n)
    pp, pi = g.pred_ptr, g.pred_idx
    for v in g.topo_order.tolist():
        if pp[v + 1] > pp[v]:
            depth[v] = depth[pi[pp[v]:pp[v + 1]]].max() + 1
    nf[:n, 7] = depth / max(depth.max(), 1.0)
    ops = np.array([op_type_id(t, layout.op_type_buckets) for t in g.op_types], dtype=np.int64)
    nf[:n, 8] = ops / (layout.op_type_buckets - 1)
    t = costs.fwd_time + costs.bwd_time
    eps = 1e-12
    nf[:n, NUM_STATIC:NUM_STATIC + d] = (t.min(axis=1, keepdims=True) + eps) / (t + eps)
    op_type = np.zeros(layout.max_nodes, np.int64)
    op_type[:n] = ops
    edge_index = np.full((2, layout.max_edges), -1, np.int64)
    edge_index[:, :e] = g.edges.T
    out = StaticFeatures(nf, op_type, edge_index, n, e)
    for arr in (nf, op_type, edge_index):
        arr.setflags(write=False)
    task.cache[key] = out
    return out


class ObsBuffer:
    """Preallocated observation arrays, updated in place by the environment's step.

    ``observation()`` returns the arrays themselves (``copy=False``, fastest: valid until the next step) or
    copies of them (default).
    """

    def __init__(self, layout: ObsLayout) -> None:
        self.layout = layout
        n, d = layout.max_nodes, layout.max_devices
        self.node_features = np.zeros((n, layout.num_features), np.float32)
        self.op_type = np.zeros(n, np.int64)
        self.edge_index = np.full((2, layout.max_edges), -1, np.int64)
        self.num_nodes = np.ones(1, np.int64)
        self.num_edges = np.zeros(1, np.int64)
        self.placement = np.full(n, -1, np.int64)
        self.current_node = np.zeros(1, np.int64)
        self.device_mask = np.zeros(d, np.int8)
        self.arrays = {"node_features": self.node_features, "op_type": self.op_type,
                       "edge_index": self.edge_index, "num_nodes": self.num_nodes, "num_edges": self.num_edges,
                       "placement": self.placement, "current_node": self.current_node,
                       "device_mask": self.device_mask}
        self._dev0 = layout.device.start
        self._current = -1

    def load(self, static: StaticFeatures) -> None:
        """Start an episode on a task: static features in, dynamic columns and placement cleared."""
        self.node_features[:] = static.node_features
        self.op_type[:] = static.op_type
        self.edge_index[:] = static.edge_index
        self.num_nodes[0], self.num_edges[0] = static.num_nodes, static.num_edges
        self.placement.fill(-1)
        self.current_node[0] = 0
        self.device_mask.fill(0)
        self._current = -1

    def set_device(self, i: int, new: int) -> None:
        """Node ``i`` now sits on device (or stage) ``new`` (-1: none)."""
        old = self.placement[i]
        if old >= 0:
            self.node_features[i, self._dev0 + old] = 0.0
        if new >= 0:
            self.node_features[i, self._dev0 + new] = 1.0
        self.placement[i] = new

    def set_all_devices(self, devices: np.ndarray) -> None:
        n = devices.shape[0]
        self.node_features[:, self.layout.device] = 0.0
        self.node_features[np.arange(n), self._dev0 + devices] = 1.0
        self.placement[:n] = devices

    def set_current(self, i: int) -> None:
        """The next action is about node ``i`` (-1: none, the episode is over)."""
        col = self.layout.current
        if self._current >= 0:
            self.node_features[self._current, col] = 0.0
        if i >= 0:
            self.node_features[i, col] = 1.0
        self._current = i
        self.current_node[0] = max(i, 0)

    def set_current_rows(self, rows: np.ndarray | slice | None, node: int) -> None:
        """Several current nodes at once (a stage); ``node`` goes to ``current_node``."""
        col = self.layout.current
        self.node_features[:, col] = 0.0
        if rows is not None:
            self.node_features[rows, col] = 1.0
        self._current = -1
        self.current_node[0] = max(node, 0)

    def set_placed(self, i: int, value: float = 1.0) -> None:
        self.node_features[i, self.layout.placed] = value

    def observation(self, copy: bool = True) -> dict[str, np.ndarray]:
        if copy:
            return {k: v.copy() for k, v in self.arrays.items()}
        return dict(self.arrays)
