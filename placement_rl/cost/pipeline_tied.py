"""Tied parameters in the pipeline simulator (``graph.meta["tied"]``; see ``placement_rl.cost.pipeline``'s module
doc): each stage holding a user of one but not its first user keeps a copy, and in training the copies' gradients
are all-reduced among the holding stages. ``TiedParameters`` is the simulator's part that prices them; the stage
planners call ``tied_copies`` / ``tied_share`` / ``tied_sync`` on it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping

import numpy as np

from placement_rl.cost.collectives import coeff_array
from placement_rl.errors import GraphError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan

if TYPE_CHECKING:
    from placement_rl.cost.pipeline import _Layout


def tied_parameters(graph: CompGraph) -> tuple[tuple[float, np.ndarray], ...]:
    """``graph.meta["tied"]`` (see ``placement_rl.graph.capture``) as ``(bytes, node indices of its users)`` per tied
    parameter, the first user (the node charged with its bytes) first; ``GraphError`` naming a malformed entry."""
    data = graph.meta.get("tied")
    if data is None:
        return ()
    where = f"graph '{graph.name}' meta['tied']"
    if not isinstance(data, (list, tuple)):
        raise GraphError(f"{where} must be a list of {{'bytes': B, 'nodes': [names]}} objects, "
                         f"got {type(data).__name__}")
    index = graph.index
    out = []
    for k, tie in enumerate(data):
        nbytes = tie.get("bytes") if isinstance(tie, Mapping) else None
        nodes = tie.get("nodes") if isinstance(tie, Mapping) else None
        if (isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0
                or not isinstance(nodes, (list, tuple)) or not nodes):
            raise GraphError(f"{where}[{k}] must be {{'bytes': B >= 0, 'nodes': [node names]}}, got {tie!r}"[:300])
        missing = [nm for nm in nodes if not isinstance(nm, str) or nm not in index]
        if missing:
            raise GraphError(f"{where}[{k}] names node {missing[0]!r}, which graph '{graph.name}' does not have")
        out.append((float(nbytes), np.array([index[nm] for nm in nodes], dtype=np.int64)))
    return tuple(out)


class TiedParameters:
    """``PipelineSimulator``'s tied-parameter pricing (its ``graph``, ``costs``, ``topology`` and tables)."""

    def tied_copies(self, plan: StagePlan) -> tuple[np.ndarray, list[tuple[float, tuple[int, ...]]]]:
        """Per node, the tied-parameter copy bytes (per rank) its stage keeps on it (the stage's earliest user of a
        tied parameter whose first user is in another stage); per tied parameter held by several stages, its
        gradient bytes per rank and those stages. Planners price ties with it."""
        return self._tied_copies(plan)[:2]

    def _tied_copies(self, plan: StagePlan) -> tuple[np.ndarray, list[tuple[float, tuple[int, ...]]], np.ndarray]:
        """``tied_copies`` and the copy bytes (per rank) each stage keeps."""
        n, num = self.graph.num_nodes, plan.num_stages
        copies, syncs, per_stage = np.zeros(n), [], np.zeros(num)
        stage = np.asarray(plan.stage_of_node)
        if stage.shape[0] != n:
            return copies, syncs, per_stage  # the kernel rejects the plan
        for nbytes, users in self._ties:
            st = stage[users]
            if st.min() < 0 or st.max() >= num:
                return copies, [], per_stage  # the kernel rejects the plan
            held = np.unique(st)
            if held.size < 2:
                continue
            per_rank = 0.0
            for s in held.tolist():
                share = nbytes * self.tied_share(plan.tp[s], int(users[0]), plan.make_vocab_size_divisible_by,
                                                 plan.sequence_parallel)
                if s != st[0]:
                    mine = users[st == s]
                    copies[mine[np.argmin(self._pos[mine])]] += share
                    per_stage[s] += share
                p = plan.dp_degrees[s]
                per_rank = max(per_rank, share / p if plan.sharding == "fsdp" and p > 1 else share)
            syncs.append((per_rank, tuple(held.tolist())))
        return copies, syncs, per_stage

    def tied_share(self, t: int, owner: int, divisible_by: int = 128, sequence_parallel: bool = False) -> float:
        """Share of a tied parameter one TP rank of a stage of TP degree ``t`` holds: that of the parameters of its
        first user ``owner`` (1 without TP)."""
        full = float(self._size_arrays[0][owner])
        if t == 1 or full <= 0.0:
            return 1.0
        return float(self._tp_arrays(t, divisible_by, sequence_parallel)[4][owner]) / full

    def tied_sync(self, plan: StagePlan, stage_end: np.ndarray, syncs: list[tuple[float, tuple[int, ...]]],
                  sgroup: np.ndarray | None = None) -> tuple[list[tuple[float, float, tuple[int, ...]]], float, float]:
        """Each tied gradient (``tied_copies``' ``syncs``) all-reduced among its stages' device groups once they
        are done (``stage_end`` per stage; ``sgroup``: each stage's device group, default one per distinct group of
        ``plan.stage_devices``), the all-reduces of a group one after another: ``(start, end, groups)`` of each, their
        total time and when the last group is free (at least the latest stage end)."""
        from placement_rl.cost.tensor_parallel import segment_times

        if sgroup is None:
            uniq: dict[tuple[int, ...], int] = {}
            sgroup = np.array([uniq.setdefault(g, len(uniq)) for g in plan.stage_devices], dtype=np.int64)
        free = np.zeros(int(sgroup.max()) + 1)
        np.maximum.at(free, sgroup, stage_end)
        out, total = [], 0.0
        for nbytes, stages in syncs:
            groups = tuple(sorted({int(sgroup[s]) for s in stages}))
            dur = 0.0
            if len(groups) > 1:  # stages on one device group: a local sum
                # rank k of each stage with rank k of the others, every k at once: the slowest sets the time
                ranks = max(len(plan.stage_devices[s]) for s in stages)
                for k in range(ranks):
                    devs = tuple(dict.fromkeys(plan.stage_devices[s][k % len(plan.stage_devices[s])] for s in stages))
                    if devs not in self._tie_coll:
                        self._tie_coll[devs] = coeff_array("allreduce", devs, self.topology, self.costs)
                    dur = max(dur, float(segment_times(self._tie_coll[devs], np.array([nbytes]))[0]))
            start = float(free[list(groups)].max())
            free[list(groups)] = start + dur
            out.append((start, start + dur, groups))
            total += dur
        return out, total, float(free.max())

    def _tied_sync(self, plan: StagePlan, lay: _Layout, syncs: list[tuple[float, tuple[int, ...]]],
                   out_stage: np.ndarray, out: np.ndarray) -> list[tuple[float, float, tuple[int, ...]]]:
        """After the kernel (its per-stage outputs ``out_stage``): the tied all-reduces (``tied_sync``) extend the
        step time and comm time in that call's ``out``; returned for ``run``."""
        if not syncs:
            return []
        tie_sync, total, end = self.tied_sync(plan, out_stage[2], syncs, lay.sgroup)
        out[2] += total
        out[0] = max(float(out[0]), end)
        return tie_sync
