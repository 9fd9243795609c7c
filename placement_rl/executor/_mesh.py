"""``ParallelDims`` (validated DP x PP x TP degrees of a ``StagePlan``), rank layout and schedule choice.

Ranks form a mesh ``(dp, pp, tp)`` in row-major order, TP innermost: ``rank = (dp_rank * pp + pp_rank) * tp +
tp_rank`` (with ``tp = 1`` the 2-D ``(dp, pp)`` mesh of plans without tensor parallelism). Rank
``(d, c, t)`` stands for device ``d * tp + t`` of its stage's device group (the plan's TP-innermost order). Stage ``s`` of
the plan runs on mesh column ``pp_rank_of_stage[s]``; every rank of that column holds a replica of the
stage (its DP degree is the column height ``dp``). A 2-D mesh needs the same DP degree for every
stage: a PipeDream-style plan with unequal degrees is a simulator-only plan and is rejected here.

Columns come from the plan's device groups: stages with the same group share a column (the
interleaved schedules put several stages on one rank). torch's multi-stage schedules need the
*loop* layout (stage ``s`` on column ``s % pp``) or, for ZBV, the *V* layout (two stages per
rank, stage ``s`` and ``2 pp - 1 - s`` together).
"""

from __future__ import annotations

from dataclasses import dataclass

from placement_rl.errors import PlanError
from placement_rl.plans import StagePlan

#: plan schedule name -> torch.distributed.pipelining class name (see :func:`schedule_class_name`)
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                    "interleaved1f1b": "ScheduleInterleaved1F1B", "zb1p": "ScheduleInterleavedZeroBubble"}


@dataclass(frozen=True)
class ParallelDims:
    """DP x PP degrees of a plan; ``validate()`` raises ``PlanError`` naming what to fix.

    ``pp_rank_of_stage[s]``: mesh column of stage ``s``; ``world_size = dp * pp``.
    """

    dp: int
    pp: int
    num_stages: int
    pp_rank_of_stage: tuple[int, ...]
    schedule: str
    num_microbatches: int
    sharding: str = "dp"  # ``dp``: DDP over the dp mesh dimension; ``fsdp``: FSDP2 ``fully_shard`` over it
    tp: int = 1  # tensor-parallel degree of every stage (``parallelize_module`` over the tp mesh dimension)

    @property
    def plain(self) -> bool:
        """One stage on every rank: no pipeline schedule, a data-parallel loop (DDP or FSDP2)."""
        return self.num_stages == 1

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.pp

    def rank(self, dp_rank: int, pp_rank: int, tp_rank: int = 0) -> int:
        return (dp_rank * self.pp + pp_rank) * self.tp + tp_rank

    def coords(self, rank: int) -> tuple[int, int]:
        """``(dp_rank, pp_rank)`` of a global rank."""
        return divmod(rank // self.tp, self.pp)

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def stages_of(self, pp_rank: int) -> tuple[int, ...]:
        return tuple(s for s, c in enumerate(self.pp_rank_of_stage) if c == pp_rank)

    @property
    def layout(self) -> str:
        """``single`` (one stage per rank), ``loop`` or ``v`` (see the module docstring)."""
        if self.num_stages == self.pp:
            return "single"
        if all(c == s % self.pp for s, c in enumerate(self.pp_rank_of_stage)):
            return "loop"
        return "v"

    def schedule_class_name(self) -> str:
        if self.schedule == "zb1p" and self.layout == "v" and self.stages_per_rank == 2:
            return "ScheduleZBVZeroBubble"
        return SCHEDULE_CLASSES[self.schedule]

    def validate(self) -> "ParallelDims":
        s, pp, m = self.num_stages, self.pp, self.num_microbatches
        if len(self.pp_rank_of_stage) != s or sorted(set(self.pp_rank_of_stage)) != list(range(pp)):
            raise PlanError(f"stage -> mesh column map {list(self.pp_rank_of_stage)} must use columns 0..{pp - 1}")
        per = [len(self.stages_of(c)) for c in range(pp)]
        if len(set(per)) != 1:
            raise PlanError(f"device groups hold unequal numbers of stages ({per}); give every group the same "
                            "number of stages")
        if self.schedule in ("gpipe", "1f1b") and per[0] != 1:
            raise PlanError(f"schedule '{self.schedule}' runs one stage per device group, but groups hold {per[0]} "
                            "stages; use interleaved1f1b or zb1p, or give each stage its own devices")
        if per[0] > 1:
            v_ok = per[0] == 2 and all(self.pp_rank_of_stage[q] == self.pp_rank_of_stage[2 * pp - 1 - q]
                                       for q in range(s)) and list(self.pp_rank_of_stage[:pp]) == list(range(pp))
            if self.layout != "loop" and not (self.schedule == "zb1p" and v_ok):
                raise PlanError(f"stages {list(range(s))} sit on device groups {list(self.pp_rank_of_stage)}; "
                                f"schedule '{self.schedule}' needs stage s on group s % {pp} (loop layout)")
        if self.sharding == "fsdp" and self.schedule == "zb1p":
            raise PlanError("an fsdp plan cannot use the zb1p schedule (its split weight-gradient pass bypasses "
                            "FSDP's reduce-scatter); use gpipe, 1f1b or interleaved1f1b, or sharding dp")
        if self.tp > 1 and self.schedule == "zb1p":
            raise PlanError("a TP plan cannot use the zb1p schedule; use gpipe, 1f1b or interleaved1f1b")
        if self.schedule == "1f1b" and m < s:
            raise PlanError(f"schedule 1f1b needs num_microbatches >= number of stages ({m} < {s}); "
                            "raise num_microbatches or use gpipe")
        if self.schedule in ("interleaved1f1b", "zb1p") and self.layout != "v":
            rounds = max(1, m // pp)
            if m % rounds:
                raise PlanError(f"schedule {self.schedule} needs num_microbatches to be a multiple of "
                                f"max(1, m // pp) = {rounds} (m={m}, pp={pp})")
        return self


def parallel_dims(plan: StagePlan) -> ParallelDims:
    """The validated DP x PP layout of ``plan`` (``PlanError`` for unequal DP degrees and the like)."""
    degrees = plan.dp_degrees
    if not degrees:
        raise PlanError("stage plan has no stages: 'stage_devices' is empty")
    if len(set(plan.tp)) != 1:
        raise PlanError(f"stages have unequal TP degrees {list(plan.tp)}: the distributed executor runs a 3-D "
                        "(dp, pp, tp) mesh and needs one TP degree for every stage")
    if len(set(degrees)) != 1:
        raise PlanError(f"stages have unequal DP degrees {list(degrees)}: the distributed executor runs a 2-D "
                        "(dp, pp) mesh and needs one DP degree for every stage (unequal degrees are a "
                        "simulator-only, PipeDream-style plan)")
    columns: dict[tuple[int, ...], int] = {}
    col_of_stage = []
    for grp in plan.stage_devices:
        key = tuple(grp)
        if key not in columns:
            for other in columns:
                if set(other) & set(key):
                    raise PlanError(f"device groups {list(other)} and {list(key)} overlap without being equal; "
                                    "stages sharing devices must use the very same group (in the same order)")
            columns[key] = len(columns)
        col_of_stage.append(columns[key])
    return ParallelDims(dp=degrees[0], pp=len(columns), num_stages=plan.num_stages,
                        pp_rank_of_stage=tuple(col_of_stage), schedule=plan.schedule,
                        num_microbatches=int(plan.num_microbatches), sharding=plan.sharding,
                        tp=int(plan.tp[0])).validate()


def device_of_rank(plan: StagePlan, dims: ParallelDims, rank: int) -> int:
    """The plan's device index (into its topology) that global ``rank`` stands for."""
    dp_rank, pp_rank = dims.coords(rank)
    return plan.stage_devices[dims.stages_of(pp_rank)[0]][dp_rank * dims.tp + dims.tp_rank(rank)]


def rank_devices(plan: StagePlan, dims: ParallelDims) -> tuple[int, ...]:
    """The plan's device index of every global rank (``device_of_rank`` for ranks ``0..world_size-1``)."""
    return tuple(device_of_rank(plan, dims, r) for r in range(dims.world_size))


def _cuda_index(torch_device: str) -> int | None:
    kind, _, index = str(torch_device).partition(":")
    return int(index) if kind == "cuda" and index.isdigit() else None


def cuda_binding(devices: list | None, *, rank: int, local_rank: int, local_world: int,
                 device_count: int) -> tuple[int, str]:
    """The CUDA index global ``rank`` binds to, and a note (empty when it follows the plan).

    ``devices``: per global rank ``{"name", "torch_device", "host"}``, the plan's device of each rank (``job.json``'s
    ``rank_devices``), or None. The rank takes its plan device's index (``cuda:2`` -> 2) when the plan's devices of
    every rank on this node (ranks ``rank - local_rank ..`` + ``local_world``) sit on one host with distinct
    ``cuda:<i>`` indices below ``device_count``; else ``local_rank % device_count`` (torchrun's rank order), with
    a note saying why.
    """
    fallback = local_rank % device_count
    if not devices:
        return fallback, "the job names no plan device per rank"
    first = rank - local_rank
    mine = devices[first:first + local_world]
    if len(mine) != local_world:
        return fallback, f"the job names plan devices for {len(devices)} ranks, not rank {rank}'s node"
    index = [_cuda_index(d.get("torch_device", "")) for d in mine]
    bad = next((d for d, i in zip(mine, index) if i is None or i >= device_count), None)
    if bad is not None:
        return fallback, (f"plan device '{bad.get('name')}' is {bad.get('torch_device')}, not a CUDA index below "
                          f"{device_count} on this machine")
    if len({d.get("host") for d in mine}) != 1 or len(set(index)) != len(index):
        return fallback, "the plan's devices of this node's ranks are not distinct GPUs of one host"
    return index[local_rank], ""
