"""Tensor parallelism in the pipeline simulator (``plan.tp``; see ``placement_rl.cost.pipeline``'s module doc and
``cost.tensor_parallel``): a TP stage's nodes at one rank's cost plus their blocking TP all-reduces (with sequence
parallelism a reduce-scatter and an all-gather each), its pipeline links at the slowest pair of TP groups, and each TP
group paced by its slowest rank. ``TensorParallel`` is the simulator's part that prices them; planners read its
``node_arrays``."""

from __future__ import annotations

import dataclasses

import numpy as np

from placement_rl.cost._pipe_layout import slowest_table
from placement_rl.cost.collectives import coeff_array
from placement_rl.plans import StagePlan


class TensorParallel:
    """``PipelineSimulator``'s tensor-parallel pricing (its ``graph``, ``costs``, ``topology``, node arrays and TP
    caches)."""

    def _tp_arrays(self, t: int, divisible_by: int = 128, sequence_parallel: bool = False) -> tuple[np.ndarray, ...]:
        """Node arrays of one rank of a TP group of ``t``: (fvar, ffix, bvar, bfix [D, N], param, act [N]); the
        vocabulary padded to a multiple of ``divisible_by x t`` (``graph.tp.padded_vocab``)."""
        key = (t, divisible_by, bool(sequence_parallel))
        if key not in self._tp:
            from placement_rl.cost.tensor_parallel import tp_cost_table

            c, shard = tp_cost_table(self.graph, self.costs, self.topology, t, self._annotation(),
                                     divisible_by=divisible_by, sequence_parallel=sequence_parallel)
            ff, fb = np.minimum(c.launch_overhead, c.fwd_time), np.minimum(c.launch_overhead, c.bwd_time)
            self._tp[key] = ((c.fwd_time - ff).T.copy(), ff.T.copy(), (c.bwd_time - fb).T.copy(), fb.T.copy(),
                             np.array(shard.param_bytes), np.array(shard.act_bytes))
        return self._tp[key]

    def node_arrays(self, tp: int = 1, divisible_by: int = 128,
                    sequence_parallel: bool = False) -> tuple[np.ndarray, ...]:
        """``(fvar, ffix, bvar, bfix [D, N], param, act [N], ar_fwd, ar_bwd, n_fwd, n_bwd [N])`` of one rank at TP
        degree ``tp``: variable (shrinks with micro-batches and replicas) and fixed node times, per-rank sizes, the TP
        all-reduce bytes per node at the whole batch (zero at ``tp = 1``; with ``sequence_parallel`` each is a
        reduce-scatter plus an all-gather of those bytes) and how many collectives share them
        (``tensor_parallel.collective_counts``). For planners; read-only."""
        ann = self._annotation()
        if tp == 1:
            z, one = np.zeros(self.graph.num_nodes), np.ones(self.graph.num_nodes)
            return (*self._graph_arrays[3:], *self._size_arrays[:2], z, z, one, one)
        return (*self._tp_arrays(tp, divisible_by, sequence_parallel), ann.ar_fwd, ann.ar_bwd, *self._tp_counts())

    def _annotation(self):
        """The graph's TP annotation (``graph.tp.annotation``), looked up once."""
        if self._tp_ann is None:
            from placement_rl.graph.tp import annotation

            self._tp_ann = annotation(self.graph)
        return self._tp_ann

    def _tp_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The TP collectives each node's bytes are, forward and backward (``tensor_parallel.collective_counts``)."""
        if self._tp_n is None:
            from placement_rl.cost.tensor_parallel import collective_counts

            self._tp_n = collective_counts(self.graph, self._annotation())
        return self._tp_n

    def _tp_collective(self, groups: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Segment tables of an all-reduce over a stage's TP groups (or over one group of devices), forward and
        backward (the same groups): the groups run it at once, so the slowest of them sets the time."""
        groups = _as_groups(groups)
        if groups not in self._tp_coll:
            tab = slowest_table([coeff_array("allreduce", grp, self.topology, self.costs) for grp in groups])
            self._tp_coll[groups] = (tab, tab)
        return self._tp_coll[groups]

    def _sp_collective(self, groups: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Segment tables of a reduce-scatter and an all-gather over a stage's TP groups or one group of devices
        (sequence parallelism; the slowest group sets each)."""
        key = ("sp", *_as_groups(groups))
        if key not in self._tp_coll:
            self._tp_coll[key] = tuple(slowest_table([coeff_array(kind, grp, self.topology, self.costs)
                                                      for grp in key[1:]]) for kind in ("reducescatter", "allgather"))
        return self._tp_coll[key]

    def _tp_links(self, plan: StagePlan) -> tuple[np.ndarray, np.ndarray]:
        """Link latency and inverse bandwidth for the kernel of a TP plan, which sees each stage's first DP group
        only: between a device of it and one of the next stage's, the slowest link between their TP groups (each
        TP rank sends its share, so the transfer waits on the slowest pair, as for a plan without TP)."""
        key = (plan.stage_devices, plan.tp)
        links = self._tp_link_cache.get(key)
        if links is None:
            lat, inv = (x.copy() for x in self._size_arrays[2:4])
            for s in range(plan.num_stages - 1):
                here, there = plan.tp_groups(s), plan.tp_groups(s + 1)
                if set(plan.stage_devices[s]) == set(plan.stage_devices[s + 1]):
                    continue  # the kernel sends nothing within one device group
                for g in here:
                    for h in there:
                        cross = np.ix_(g, h)
                        lat[g[0], h[0]] = max(lat[g[0], h[0]], self._size_arrays[2][cross].max())
                        inv[g[0], h[0]] = max(inv[g[0], h[0]], self._size_arrays[3][cross].max())
            links = (lat, inv)
            if len(self._tp_link_cache) >= 256:
                self._tp_link_cache.clear()
            self._tp_link_cache[key] = links
        return links

    def _tp_plan(self, plan: StagePlan) -> tuple[StagePlan, tuple, dict]:
        """The plan the kernel times (each stage on its first DP group), the node arrays with TP applied (a TP
        stage's nodes at one rank's cost, their TP collectives added to their fixed times) and those collectives'
        prices (``_tp_comm_parts``, which ``tp_comm_time`` reuses)."""
        plan.validate(self.graph, self.topology)
        fvar, ffix, bvar, bfix = (self._graph_arrays[k].copy() for k in (3, 4, 5, 6))
        param, act = self._size_arrays[0].copy(), self._size_arrays[1].copy()
        parts = self._tp_comm_parts(plan)
        for s, (nodes, comm) in parts.items():
            a = self._tp_arrays(plan.tp[s], plan.make_vocab_size_divisible_by, plan.sequence_parallel)
            fvar[:, nodes], ffix[:, nodes], bvar[:, nodes], bfix[:, nodes] = (x[:, nodes] for x in a[:4])
            param[nodes], act[nodes] = a[4][nodes], a[5][nodes]
            for f, b in comm:
                ffix[:, nodes] += f[None, :]
                bfix[:, nodes] += b[None, :]
        groups = tuple(plan.dp_groups(s)[0] for s in range(plan.num_stages))
        kernel_plan = dataclasses.replace(plan, stage_devices=groups, tp=(), sequence_parallel=False)  # priced above
        arrays = (*self._graph_arrays[:3], fvar, ffix, bvar, bfix)
        return kernel_plan, (arrays, (param, act, *self._tp_links(plan))), parts

    def _tp_comm_parts(self, plan: StagePlan) -> dict[int, tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]]:
        """``{s: (nodes, _tp_node_comm(plan, s, nodes))}`` for each stage ``s`` with TP: its nodes and their TP
        collectives' seconds per micro-batch, priced once per simulation (``_tp_plan``, ``tp_comm_time``)."""
        stages = {s: np.flatnonzero(plan.stage_of_node == s) for s, t in enumerate(plan.tp) if t > 1}
        return {s: (nodes, self._tp_node_comm(plan, s, nodes)) for s, nodes in stages.items()}

    def _tp_node_comm(self, plan: StagePlan, s: int, nodes: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per collective kind of TP stage ``s`` (an all-reduce; with sequence parallelism, Megatron-SP, a
        reduce-scatter and an all-gather of the same bytes), the seconds it takes on each of ``nodes`` per
        micro-batch, forward and backward: at the micro-batch's bytes ``bytes / (m x dp)``, over the stage's TP
        groups (the slowest sets it), each of a node's collectives (``_tp_counts``) at its share of them."""
        from placement_rl.cost.tensor_parallel import collective_times

        ann, groups, (n_f, n_b) = self._annotation(), plan.tp_groups(s), self._tp_counts()
        tabs = self._sp_collective(groups) if plan.sequence_parallel else self._tp_collective(groups)[:1]
        per = int(plan.num_microbatches) * plan.dp_degrees[s]
        return [(collective_times(tab, ann.ar_fwd[nodes] / per, n_f[nodes]),
                 collective_times(tab, ann.ar_bwd[nodes] / per, n_b[nodes])) for tab in tabs]

    def tp_comm_time(self, plan: StagePlan, train: bool = True, parts: dict | None = None) -> np.ndarray:
        """float [S]: the seconds each stage spends in its blocking TP collectives over the step -- every
        micro-batch's forward ones and, in training, its backward ones plus, for the nodes activation recomputation
        runs again, their forward ones once more (0 for a stage without TP). The kernel times them inside the
        nodes' forward / backward (``_tp_plan``); ``run`` reports them as ``meta["tp_comm_time"]``, not as busy
        compute. ``parts``: the collectives as ``_tp_comm_parts`` priced them for the kernel (default: priced
        here)."""
        n = self.graph.num_nodes
        fwd, bwd = np.zeros(n), np.zeros(n)
        for nodes, comm in (parts if parts is not None else self._tp_comm_parts(plan)).values():
            for f, b in comm:
                fwd[nodes] += f
                bwd[nodes] += b
        if not train:
            bwd[:] = 0.0
        elif any(r != "none" for r in plan.recompute):  # the repeated forward's collectives, as the kernel has them
            z = np.zeros((1, n))
            bwd = self._recompute(plan, (*self._graph_arrays[:3], z, fwd[None, :], z, bwd[None, :]),
                                  self._size_arrays)[0][6][0]
        per_node = int(plan.num_microbatches) * (fwd + bwd)
        return np.bincount(plan.stage_of_node, weights=per_node, minlength=plan.num_stages)


def _pace_tp_groups(plan: StagePlan, graph_arrays: tuple, ratio: float) -> None:
    """Each TP group's first rank's node times (the row the kernel reads) set, node by node, to those of the group's
    slowest rank for that node, forward and backward apart (the ranks meet at every TP collective, so the slowest
    sets the pace whatever the device order). ``graph_arrays``: ``_tp_plan``'s copies, changed in place; a node's
    time is ``var * ratio / (m * dp) + fix`` as in the kernel. Equal rows (equal devices) are left as they were."""
    m = int(plan.num_microbatches)
    for s, (t, p) in enumerate(zip(plan.tp, plan.dp_degrees)):
        if t == 1:
            continue
        nodes = np.flatnonzero(plan.stage_of_node == s)
        scale = ratio / (m * p)
        for ranks in plan.tp_groups(s):
            ranks_arr = np.asarray(ranks)
            for var, fix in (graph_arrays[3:5], graph_arrays[5:7]):
                rows = var[np.ix_(ranks_arr, nodes)] * scale + fix[np.ix_(ranks_arr, nodes)]
                slow = ranks_arr[np.argmax(rows, axis=0)]
                var[ranks[0], nodes], fix[ranks[0], nodes] = var[slow, nodes], fix[slow, nodes]


def _as_groups(groups: tuple) -> tuple[tuple[int, ...], ...]:
    """``groups`` as a tuple of device groups (one group of device indices: a tuple of that one)."""
    if groups and isinstance(groups[0], (int, np.integer)):
        return (tuple(int(d) for d in groups),)
    return tuple(tuple(int(d) for d in grp) for grp in groups)
