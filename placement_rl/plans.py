"""``Placement`` (op-level: a device per node) and ``StagePlan`` (pipeline stages x data parallelism).

Both validate against a graph and a topology (``PlanError`` naming the problem) and round-trip through JSON.
JSON stores device *names*, so a plan loaded against a topology that lacks a device fails clearly. Written with
its graph, a plan also stores the graph's name and ``fingerprint()``; loaded with a graph, it is refused for any
other graph, even one with as many nodes (files without a fingerprint, written before plans carried one, are
checked by ``validate`` alone). The file checks are ``placement_rl.plan_files``'.

``Placement`` is defined in ``placement_rl._placement``, the helpers both kinds share in
``placement_rl._plan_values``; import both from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl._placement import PLACEMENT_KEYS, PLACEMENT_SCHEMA, Placement
from placement_rl._plan_values import _FILE_KEYS, _dumps, _index_list, _same_meta, check_keys
from placement_rl.errors import PlanError
from placement_rl.plan_files import VERSION, check_graph, check_schema, device_map, naming_file, read_json
from placement_rl.graph.io import atomic_write_text
from placement_rl.graph.ir import CompGraph, restore_read_only
from placement_rl.topology import DeviceTopology

STAGE_PLAN_SCHEMA = "placement_rl.stage_plan"
SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b", "zb1p")
SHARDINGS = ("dp", "fsdp")  # replicate each stage (DDP) or shard it over its DP group (FSDP2 / ZeRO-3)
RECOMPUTE = ("none", "selective", "full")  # activation recomputation per stage (``placement_rl.cost.recompute``)
_PLAN_FIELDS = ("stage_devices", "num_microbatches", "schedule", "batch_size", "sharding", "tp",
                "make_vocab_size_divisible_by", "recompute", "sequence_parallel")  # compared beside the stages
STAGE_PLAN_KEYS = (*_FILE_KEYS, "stage_of_node", *_PLAN_FIELDS)


@dataclass(frozen=True, eq=False)
class StagePlan:
    """A pipeline plan: stage of each node, device group (its size is the DP degree) per stage.

    ``stage_of_node[i]`` in ``0..S-1``; every edge goes from a stage to the same or a later one, so each
    stage is a contiguous set of the DAG: the difference of two nested downward-closed sets (ideals), not
    necessarily a block of ``graph.topo_order`` (``graph.ideals``; the simulator and the executor's stage split
    take any such numbering). ``stage_devices[s]`` are device indices; for
    ``interleaved1f1b`` several (virtual) stages may share a device group, otherwise groups are disjoint.
    ``sharding``: ``dp`` (every replica holds the stage's parameters, gradients all-reduced, DDP) or
    ``fsdp`` (parameters, gradients and optimizer state sharded over the stage's DP group, parameters
    all-gathered per unit for forward and backward, gradients reduce-scattered: FSDP2 ``fully_shard``).
    JSON without the field reads as ``dp`` (plans written before it existed).

    ``tp``: tensor-parallel degree per stage (default all 1; JSON without the field reads as all 1). Stage s
    runs on ``len(stage_devices[s]) = dp_s x tp_s`` devices, TP innermost: consecutive runs of ``tp_s`` devices
    are the TP groups, device ``j`` of every run forms a DP group. A TP group must sit on one host unless
    ``meta["tp_across_hosts"]`` is true (priced, never deployed). ``tp_s`` must divide the split sizes of the
    graph's TP annotation (``placement_rl.graph.tp``: heads, hidden, vocabulary).
    ``batch_size`` (else the graph's own, ``graph_batch_size``) must be divisible by ``num_microbatches x dp_s``.
    ``make_vocab_size_divisible_by`` (Megatron-LM's knob, default 128; JSON without it reads 128): the vocabulary
    is padded to a multiple of it x the TP degree (``graph.tp.padded_vocab``; the simulator prices it in TP stages);
    0 switches padding off, and then a TP degree must divide the vocabulary.
    ``recompute``: activation recomputation per stage, ``none`` / ``selective`` (the attention's core) / ``full``
    (every layer), as ``placement_rl.cost.recompute`` prices it (default all ``none``; JSON without it reads so).
    ``sequence_parallel``: Megatron's sequence parallelism in the TP stages (``placement_rl.cost.tensor_parallel``);
    every TP degree must divide the graph's sequence length where its metadata names it (``check_sequence``).
    """

    stage_of_node: np.ndarray
    stage_devices: tuple[tuple[int, ...], ...]
    num_microbatches: int = 1
    schedule: str = "1f1b"
    batch_size: int | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    sharding: str = "dp"
    tp: tuple[int, ...] = ()
    make_vocab_size_divisible_by: int = 128
    recompute: tuple[str, ...] = ()
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage_of_node", _index_list(self.stage_of_node, "stage_of_node", "stage id"))
        try:
            groups = tuple(tuple(_index_list(list(grp), f"stage_devices[{k}]", "device index").tolist())
                           for k, grp in enumerate(self.stage_devices))
        except TypeError:
            raise PlanError("stage_devices must be a list of lists of device indices") from None
        object.__setattr__(self, "stage_devices", groups)
        object.__setattr__(self, "meta", dict(self.meta))
        if self.schedule not in SCHEDULES:
            raise PlanError(f"unknown schedule '{self.schedule}' (choose one of {', '.join(SCHEDULES)})")
        if not isinstance(self.num_microbatches, (int, np.integer)) or self.num_microbatches < 1:
            raise PlanError(f"num_microbatches must be a positive integer, got {self.num_microbatches!r}")
        if self.sharding not in SHARDINGS:
            raise PlanError(f"unknown sharding '{self.sharding}' (choose one of {', '.join(SHARDINGS)})")
        b = self.batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1):
            raise PlanError(f"batch_size must be a positive integer or null, got {b!r}")
        tp = tuple(self.tp) if self.tp is not None else ()
        if not tp or all(isinstance(t, (int, np.integer)) and t == 1 for t in tp):  # no TP: any length reads as such
            tp = (1,) * len(groups)
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1 for t in tp):
            raise PlanError(f"tp must list a positive integer TP degree per stage, got {list(tp)}")
        tp = tuple(int(t) for t in tp)
        if len(tp) != len(groups):
            raise PlanError(f"tp lists {len(tp)} TP degrees for {len(groups)} stages: give one per stage")
        for k, (t, grp) in enumerate(zip(tp, groups)):
            if len(grp) % t:
                raise PlanError(f"stage {k} has {len(grp)} devices, not a multiple of its TP degree {t} "
                                "(a stage runs on dp x tp devices)")
        object.__setattr__(self, "tp", tp)
        vd = self.make_vocab_size_divisible_by
        if isinstance(vd, bool) or not isinstance(vd, (int, np.integer)) or vd < 0:
            raise PlanError(f"make_vocab_size_divisible_by must be an integer >= 0 (0: no vocabulary padding), "
                            f"got {vd!r}")
        object.__setattr__(self, "make_vocab_size_divisible_by", int(vd))
        rc = tuple(self.recompute) if self.recompute is not None else ()
        if not rc or all(r == "none" for r in rc):
            rc = ("none",) * len(groups)
        bad_rc = [r for r in rc if r not in RECOMPUTE]
        if bad_rc:
            raise PlanError(f"unknown recompute '{bad_rc[0]}' (choose one of {', '.join(RECOMPUTE)} per stage)")
        if len(rc) != len(groups):
            raise PlanError(f"recompute lists {len(rc)} entries for {len(groups)} stages: give one per stage")
        object.__setattr__(self, "recompute", rc)
        if not isinstance(self.sequence_parallel, (bool, np.bool_)):
            raise PlanError(f"sequence_parallel must be true or false, got {self.sequence_parallel!r}")
        object.__setattr__(self, "sequence_parallel", bool(self.sequence_parallel))
        if self.sequence_parallel and not self.uses_tp:
            raise PlanError("sequence_parallel is true but no stage has a TP degree > 1 (sequence parallelism splits "
                            "the TP regions' token-wise ops): set it false or give a stage tp > 1")

    def __setstate__(self, state: dict) -> None:  # unpickled (another process): its array read-only again
        restore_read_only(self, state)

    def __eq__(self, other: object) -> bool:  # by value, as Placement
        if not isinstance(other, StagePlan):
            return NotImplemented
        return (np.array_equal(self.stage_of_node, other.stage_of_node)
                and all(getattr(self, f) == getattr(other, f) for f in _PLAN_FIELDS)
                and _same_meta(self.meta, other.meta))

    def __hash__(self) -> int:
        return hash((self.stage_of_node.tobytes(), *(getattr(self, f) for f in _PLAN_FIELDS)))

    @property
    def num_stages(self) -> int:
        return len(self.stage_devices)

    @property
    def dp_degrees(self) -> tuple[int, ...]:
        """DP degree per stage: its devices over its TP degree."""
        return tuple(len(g) // t for g, t in zip(self.stage_devices, self.tp))

    @property
    def uses_tp(self) -> bool:
        return any(t > 1 for t in self.tp)

    def tp_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The TP groups (device indices) of a stage: consecutive runs of ``tp[stage]`` devices."""
        grp, t = self.stage_devices[stage], self.tp[stage]
        return tuple(grp[i:i + t] for i in range(0, len(grp), t))

    def dp_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The DP groups of a stage: device ``j`` of every TP group, for each ``j``."""
        grp, t = self.stage_devices[stage], self.tp[stage]
        return tuple(grp[j::t] for j in range(t))

    @property
    def world_size(self) -> int:
        return len({d for g in self.stage_devices for d in g})

    def validate(self, graph: CompGraph, topology: DeviceTopology) -> "StagePlan":
        n, s = graph.num_nodes, self.num_stages
        if len(self.stage_of_node) != n:
            raise PlanError(f"stage plan has {len(self.stage_of_node)} entries but graph '{graph.name}' has "
                            f"{n} nodes")
        if s == 0:
            raise PlanError("stage plan has no stages: 'stage_devices' is empty")
        if s > n:
            raise PlanError(f"stage plan has {s} stages for {n} nodes of graph '{graph.name}': every stage needs a "
                            f"node, so use at most {n} stages")
        if self.stage_of_node.min() < 0 or self.stage_of_node.max() >= s:
            i = int(np.flatnonzero((self.stage_of_node < 0) | (self.stage_of_node >= s))[0])
            raise PlanError(f"node '{graph.names[i]}' is in stage {self.stage_of_node[i]}, but the plan has "
                            f"stages 0..{s - 1}")
        used = np.bincount(self.stage_of_node, minlength=s)
        if (used == 0).any():
            gap = int(np.flatnonzero(used == 0)[0])
            raise PlanError(f"stage {gap} has no nodes (a gap in the stage numbering): stages must be 0..{s - 1}, "
                            "each non-empty")
        if graph.num_edges:
            src, dst = graph.edges[:, 0], graph.edges[:, 1]
            back = np.flatnonzero(self.stage_of_node[src] > self.stage_of_node[dst])
            if back.size:
                e = int(back[0])
                a, b = int(src[e]), int(dst[e])
                raise PlanError(f"stages are not contiguous: edge '{graph.names[a]}' (stage "
                                f"{self.stage_of_node[a]}) -> '{graph.names[b]}' (stage {self.stage_of_node[b]}) "
                                "goes backwards")
        seen: dict[int, int] = {}
        for k, grp in enumerate(self.stage_devices):
            if not grp:
                raise PlanError(f"stage {k} has no devices")
            if len(set(grp)) != len(grp):
                raise PlanError(f"stage {k} lists a device twice: {list(grp)}")
            for d in grp:
                if not 0 <= d < topology.num_devices:
                    raise PlanError(f"stage {k} uses device index {d}, but topology '{topology.name}' has "
                                    f"devices 0..{topology.num_devices - 1}")
                if d in seen and self.schedule != "interleaved1f1b":
                    raise PlanError(f"device '{topology.devices[d].name}' is used by stages {seen[d]} and {k}; "
                                    "only the interleaved1f1b schedule shares devices between stages")
                seen.setdefault(d, k)
        batch = self.batch_size if self.batch_size is not None else graph_batch_size(graph)
        if batch is not None:
            for k, p in enumerate(self.dp_degrees):
                if batch % (self.num_microbatches * p):
                    whose = "" if self.batch_size is not None else f" (graph '{graph.name}' records it)"
                    raise PlanError(f"batch size {batch}{whose} is not divisible by num_microbatches "
                                    f"({self.num_microbatches}) x DP degree of stage {k} ({p})")
        if self.uses_tp:
            self._validate_tp(graph, topology)
        return self

    def _validate_tp(self, graph: CompGraph, topology: DeviceTopology) -> None:
        from placement_rl.graph import tp as tpmod

        ann = tpmod.annotation(graph)
        for k, t in enumerate(self.tp):
            tpmod.check_degree(graph, t, ann, divisible_by=self.make_vocab_size_divisible_by)
            if t > 1 and not self.meta.get("tp_across_hosts"):
                for grp in self.tp_groups(k):
                    hosts = sorted({topology.devices[d].host for d in grp})
                    if len(hosts) > 1:
                        raise PlanError(f"stage {k}'s TP group {[topology.devices[d].name for d in grp]} spans hosts "
                                        f"{hosts}: keep each TP group of {t} devices on one host (TP innermost)")

    def check_sequence(self, graph: CompGraph) -> None:
        """``PlanError`` where sequence parallelism cannot split ``graph``'s sequence at a stage's TP degree
        (``graph.tp.check_sequence``), as deploy refuses it: checked on a plan file read with its graph (``evaluate``,
        ``export``) and by ``export`` (``exact`` weighs SP only where it holds)."""
        from placement_rl.graph import tp as tpmod

        if self.sequence_parallel:
            for t in sorted(set(self.tp)):
                tpmod.check_sequence(graph, t)

    def to_dict(self, graph: CompGraph | None = None, topology: DeviceTopology | None = None) -> dict[str, Any]:
        def dname(d: int) -> str:
            return topology.devices[d].name if topology is not None else f"dev{d}"

        out: dict[str, Any] = {"schema": STAGE_PLAN_SCHEMA, "version": VERSION,
                               "stage_of_node": self.stage_of_node.tolist(),
                               "stage_devices": [[dname(d) for d in g] for g in self.stage_devices],
                               "num_microbatches": int(self.num_microbatches), "schedule": self.schedule,
                               "batch_size": self.batch_size, "sharding": self.sharding, "tp": list(self.tp),
                               "make_vocab_size_divisible_by": self.make_vocab_size_divisible_by,
                               "recompute": list(self.recompute), "sequence_parallel": self.sequence_parallel,
                               "meta": dict(self.meta)}
        if graph is not None:
            out.update(graph=graph.name, graph_fingerprint=graph.fingerprint())
        if topology is not None:
            out["topology"] = topology.name
        return out

    def to_json(self, path: str | os.PathLike | None = None, *, graph: CompGraph | None = None,
                topology: DeviceTopology | None = None) -> str:
        text = _dumps(self.to_dict(graph, topology), "stage plan")
        if path is not None:
            atomic_write_text(path, text)
        return text

    @staticmethod
    def from_json(path_or_str: str | os.PathLike, *, topology: DeviceTopology | None = None,
                  graph: CompGraph | None = None) -> "StagePlan":
        """The stage plan a file (or its JSON text) holds, checked against ``topology`` and ``graph`` where given;
        an error on a file starts with its path (``naming_file``)."""
        with naming_file(path_or_str):
            return StagePlan._from_data(read_json(path_or_str, "stage plan"), topology, graph)

    @staticmethod
    def _from_data(data: Mapping[str, Any], topology: DeviceTopology | None,
                   graph: CompGraph | None) -> "StagePlan":
        check_schema(data, STAGE_PLAN_SCHEMA)
        check_keys(data, STAGE_PLAN_KEYS, "stage plan")
        for key in ("num_microbatches", "batch_size", "make_vocab_size_divisible_by"):
            v = data.get(key)
            if v is not None and (isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float)
                                                                                      and v.is_integer()))):
                raise PlanError(f"stage plan JSON field '{key}' must be an integer, got {v!r}")
        groups = data.get("stage_devices")
        if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
            raise PlanError("stage plan JSON needs 'stage_devices': a list of lists of device names")
        stages = data.get("stage_of_node")
        if not isinstance(stages, list) or any(not isinstance(x, int) or isinstance(x, bool) for x in stages):
            raise PlanError("stage plan JSON needs 'stage_of_node': a list of integer stage ids")
        if topology is not None:
            idx_groups = [tuple(device_map([str(x) for x in g], topology, "stage plan").tolist()) for g in groups]
        else:
            names = [str(x) for g in groups for x in g]
            bad = next((x for x in names if not x.removeprefix("dev").isdigit()), None)
            if bad is not None:
                raise PlanError(f"stage plan names device '{bad}': load it with the topology it was made for")
            idx_groups = [tuple(int(str(x).removeprefix("dev")) for x in g) for g in groups]
        tp = data.get("tp") or []
        if not isinstance(tp, list) or any(not isinstance(t, int) or isinstance(t, bool) for t in tp):
            raise PlanError(f"stage plan JSON field 'tp' must be a list of integer TP degrees, got {tp!r}")
        try:
            plan = StagePlan(stage_of_node=stages, stage_devices=tuple(idx_groups), tp=tuple(tp),
                             num_microbatches=int(data.get("num_microbatches", 1)),
                             schedule=str(data.get("schedule", "1f1b")), batch_size=data.get("batch_size"),
                             meta=data.get("meta") or {}, sharding=str(data.get("sharding", "dp")),
                             make_vocab_size_divisible_by=data.get("make_vocab_size_divisible_by", 128),
                             recompute=_recompute_field(data.get("recompute")),
                             sequence_parallel=data.get("sequence_parallel", False))
        except (TypeError, ValueError, OverflowError) as exc:
            raise PlanError(f"stage plan JSON has an invalid field ({exc})") from None
        if graph is not None:
            check_graph(data, graph, "stage plan", len(stages))
            plan.check_sequence(graph)
            if topology is not None:
                plan.validate(graph, topology)
        return plan


def _recompute_field(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise PlanError(f"stage plan JSON field 'recompute' must be a list of strings per stage, got {value!r}")
    return tuple(value)


def check_interleaved(plan: "StagePlan", stage_group: Sequence[int], groups: int) -> None:
    """``PlanError`` where an interleaved1f1b plan with more stages than device groups breaks its rules: virtual
    stage ``k`` on group ``k mod groups`` (``stage_group``: each stage's group) and micro-batches divisible by the
    groups. The pipeline simulator, deploy and export refuse the same plans."""
    s, m = plan.num_stages, plan.num_microbatches
    if plan.schedule != "interleaved1f1b" or s <= groups:
        return
    if s % groups or any(stage_group[k] != k % groups for k in range(s)):
        raise PlanError(f"interleaved1f1b needs virtual stage k on device group k mod {groups} (round-robin, "
                        f"{groups} groups); got groups {list(stage_group)} for stages 0..{s - 1}")
    if m % groups:
        raise PlanError(f"interleaved1f1b needs num_microbatches ({m}) divisible by the number of device groups "
                        f"({groups})")


def graph_batch_size(graph: CompGraph) -> int | None:
    """The batch size a graph was captured at: ``meta["batch_size"]`` (capture records it), else its zoo
    options' ``batch_size``; None when unknown (hand-written and synthetic graphs)."""
    for b in (graph.meta.get("batch_size"), (graph.meta.get("zoo_options") or {}).get("batch_size")):
        if isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1:
            return int(b)
    return None


def load_plan(path: str | os.PathLike, *, topology: DeviceTopology | None = None,
              graph: CompGraph | None = None) -> Placement | StagePlan:
    """Load a ``placement.json`` or a ``plan.json`` (dispatch on its schema)."""
    data = read_json(path, "plan")
    if data.get("schema") == STAGE_PLAN_SCHEMA:
        return StagePlan.from_json(path, topology=topology, graph=graph)
    if data.get("schema") == PLACEMENT_SCHEMA:
        return Placement.from_json(path, topology=topology, graph=graph)
    raise PlanError(f"{path}: field 'schema' is {data.get('schema')!r}, expected '{PLACEMENT_SCHEMA}' or "
                    f"'{STAGE_PLAN_SCHEMA}'")


__all__ = ["PLACEMENT_KEYS", "PLACEMENT_SCHEMA", "RECOMPUTE", "SCHEDULES", "SHARDINGS", "STAGE_PLAN_KEYS",
           "STAGE_PLAN_SCHEMA", "Placement", "StagePlan", "check_interleaved", "check_keys", "graph_batch_size",
           "load_plan"]
