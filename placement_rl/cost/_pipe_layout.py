"""The device-group layout of a stage plan in the pipeline simulator (``placement_rl.cost.pipeline``): its groups,
schedule order and collective prices, validated once per (stage devices, schedule, micro-batches, batch size) and
then reused; and ``slowest_table``, the price of a collective several device groups run at once."""

from __future__ import annotations

import math

import numpy as np

from placement_rl.cost._pipe_schedule import GPIPE, INTERLEAVED, ONE_F_ONE_B, schedule_order
from placement_rl.cost.collectives import KINDS, coeff_array
from placement_rl.cost.comm_fit import pad_segments, split_segments
from placement_rl.cost.types import CostTable
from placement_rl.errors import PlanError
from placement_rl.plans import StagePlan, check_interleaved
from placement_rl.topology import DeviceTopology

PIPELINE_SCHEDULES = {"gpipe": GPIPE, "1f1b": ONE_F_ONE_B, "interleaved1f1b": INTERLEAVED}


class _Layout:
    """Device-group arrays of one (stage_devices, schedule, m, batch_size): validated once, then reused."""

    def __init__(self, plan: StagePlan, topology: DeviceTopology, costs: CostTable, train: bool = True,
                 coll_groups: tuple[tuple[tuple[int, ...], ...], ...] | None = None) -> None:
        groups = plan.stage_devices
        # collective prices per stage: [S, kind, segment, (upper bytes, alpha, beta)]; a stage whose collective runs
        # on several groups at once (``coll_groups``: a TP stage's DP groups) is priced by the slowest of them
        coll_groups = coll_groups if coll_groups is not None else tuple((grp,) for grp in groups)
        tables = pad_segments([slowest_table([coeff_array(k, grp, topology, costs) for grp in cg])
                               for cg in coll_groups for k in KINDS])
        self.coll = split_segments(tables.reshape(len(groups), len(KINDS), *tables.shape[1:]))
        uniq: dict[tuple[int, ...], int] = {}
        for grp in groups:
            uniq.setdefault(grp, len(uniq))
        self.num_groups = len(uniq)
        self.sgroup = np.array([uniq[g] for g in groups], dtype=np.int64)
        self.gptr = np.zeros(len(groups) + 1, dtype=np.int64)
        self.gptr[1:] = np.cumsum([len(g) for g in groups])
        self.gdev = np.array([d for g in groups for d in g], dtype=np.int64)
        names = topology.device_names
        self.group_devices = list(uniq)
        self.group_names = ["+".join(names[d] for d in grp) for grp in uniq]
        self.device_idx = np.array([d for grp in uniq for d in grp], dtype=np.int64)
        self.device_group = np.array([k for k, grp in enumerate(uniq) for _ in grp], dtype=np.int64)
        s, g, m = len(groups), self.num_groups, plan.num_microbatches
        used = [d for grp in uniq for d in grp]
        if len(used) != len(set(used)):
            raise PlanError("device groups of a stage plan must be identical or disjoint; "
                            f"groups {[list(x) for x in uniq]} partly overlap")
        check_interleaved(plan, self.sgroup.tolist(), g)
        sched = PIPELINE_SCHEDULES[plan.schedule] if train else GPIPE  # inference: forwards stream, none waits
        *self.order, ok = schedule_order(s, m, sched, self.sgroup, g)
        if not ok:
            raise RuntimeError(f"schedule '{plan.schedule}' deadlocks for {s} stages on {g} groups with {m} "
                               "micro-batches: this is a bug in the pipeline simulator")
        # the kernel's work buffers and per-stage / per-group outputs, used by the simulator's creating thread only
        self.fw = np.zeros(0)
        self.iw = np.zeros(0, dtype=np.int64)
        self.out_stage = np.zeros((7, s))
        self.out_group = np.zeros((2, g))


def slowest_table(tables: list[np.ndarray]) -> np.ndarray:
    """The segment table (rows ``(upper bytes, alpha, beta)``, see ``tensor_parallel.segment_times``) of the slowest of
    ``tables`` at every byte count: collectives that run at once on several groups all end when the slowest does.
    Equal tables: the first, unchanged."""
    first = tables[0]
    if all(t.shape == first.shape and np.array_equal(t, first) for t in tables[1:]):
        return first
    bounds = sorted({float(u) for t in tables for u in t[:-1, 0]} | {0.0})  # a last row has no upper bound
    bounds.append(math.inf)
    rows: list[tuple[float, float, float]] = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if not hi > lo:
            continue
        lines = {(float(t[k, 1]), float(t[k, 2]))
                 for t in tables for k in [min(int(np.searchsorted(t[:, 0], lo, side="right")), len(t) - 1)]}
        cuts = {(a2 - a1) / (b1 - b2) for a1, b1 in lines for a2, b2 in lines if b1 != b2}
        points = [lo, *sorted(x for x in cuts if lo < x < hi), hi]
        for a, b in zip(points[:-1], points[1:]):
            probe = (a + b) / 2 if math.isfinite(b) else 2 * a + 1.0
            alpha, beta = max(lines, key=lambda line: (line[0] + line[1] * probe, line[1]))
            if rows and rows[-1][1:] == (alpha, beta):
                rows[-1] = (b, alpha, beta)
            else:
                rows.append((b, alpha, beta))
    return np.array(rows)
