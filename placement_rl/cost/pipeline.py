"""``simulate_pipeline``: the training-step time of a ``StagePlan`` (pipeline stages x data parallelism).

Model (pure and deterministic), for S stages, m micro-batches, stage s on a device group of DP degree p:

* Stage compute per micro-batch: the stage's ops run one after the other on each replica; a node's time
  shrinks by ``1 / (m * p)`` except its launch overhead (``CostTable.launch_overhead``), which every
  micro-batch pays in full. Unequal devices in one group: the slowest sets the pace.
* Costs measured at another batch size: by default node times are taken to be for the graph's own batch (the
  one capture records, which the cost model prices), else, where the graph records none, for the plan's whole
  batch; a plan of twice the graph's batch takes twice the compute. When they were measured at batch size ``b``
  (``cost_batch_size=b``, else ``costs.meta["batch_size"]``; e.g. a graph captured and profiled at the per-replica
  micro-batch
  ``batch_size / (m * p)``, whose nodes match the full-batch graph one for one), the variable part is
  scaled by ``batch_size / (b * m * p)`` instead: exactly 1 at the micro-batch it was measured at, so
  the small-batch inefficiency a linear model misses (fixed per-op costs, cache effects, interpreter
  overhead) is in the prediction. Sizes (activation memory, boundary bytes) still come from ``graph``.
  ``with_step_overhead`` (``cost.overhead``) adds a measured per-pass overhead that no op owns to every node.
* Boundary s|s+1 carries every tensor produced at or before s and consumed after it (skip connections
  are passed along), once per producer (its largest crossing edge), per micro-batch
  ``bytes / (m * min(p_s, p_s+1))`` on the slowest link between the two groups: ``latency + bytes /
  bandwidth``; gradients go back with the same bytes. Transfers on one directed group link serialise and
  overlap with compute.
* Schedules, simulated event by event so that unequal stages are right: ``gpipe`` (all forwards, then all
  backwards), ``1f1b`` (S-s-1 warm-up forwards, then one forward / one backward, then the rest of the
  backwards), ``interleaved1f1b`` (torch's and Megatron-LM's interleaved order, see ``_pipe_schedule``: virtual
  stage k runs on device group ``k mod G``; needs S and m divisible by the number of groups G).
* Data parallelism, ``plan.sharding == "dp"`` (DDP): during the last micro-batch's backward (gradient
  accumulation skips the sync before it, as ``no_sync`` does) a stage's gradients fill buckets of
  ``BUCKET_BYTES`` (25 MiB, DDP's default) in reverse topological order; a bucket is all-reduced when the
  backward has produced it (bucket ready = start of that backward + its share of the backward time), the
  all-reduces of one device group serialise on one channel and overlap the rest of the backward. So a
  DP step is never shorter than its compute or its all-reduces alone, and never longer than both in
  series. ``step_time`` = max over stages of (end of last backward, end of last bucket all-reduce).
* Sharded data parallelism, ``plan.sharding == "fsdp"`` (FSDP2 / ZeRO-3, per stage over its DP group):
  the stage's nodes form units (contiguous in topological order, cut at ``BUCKET_BYTES`` of parameters);
  every micro-batch all-gathers each unit's parameters before its forward and again before its backward
  (one unit prefetched while the previous computes) and reduce-scatters each unit's gradient after its
  backward (see ``_pipe_kernel._fsdp_pass``); the exposed communication lengthens the stage's forward /
  backward span.
* Collectives are priced by ``collectives.collective_time``: the measured NCCL fit where the topology names a
  measured system (``collective_fit:``, see ``comm_fit``), else ring, tree, hierarchical NVLink-inside /
  IB-between-hosts (the cheapest) over the cost table's links.
* Memory per device of a group (``cost.memory``): training state (``dp``: 4 x params of its stages;
  ``fsdp``: 4 x params / p + 3 x the largest unit) + the peak over the schedule of the activations in
  flight, each micro-batch holding ``act_bytes / (m * p)`` plus its received boundary buffer (so GPipe
  holds m micro-batches, 1F1B at most S-s at stage s), where at each backward the stage's backward working
  memory for one micro-batch is added on top of the micro-batches then held: the largest over its nodes of the
  gradient buffers a node's backward holds (its output's and its inputs', ``cost.backward_memory``: an LM's loss
  two logits-sized tensors; plus, in a recomputed region, the region's activations), ``/ (m * p)``
  (``meta["backward_transient_bytes"]``). Over a device's memory: ``feasible=False`` and
  ``meta["memory_errors"]`` names each such device and its bytes.
* Tied parameters (``graph.meta["tied"]``, written by capture: a parameter several nodes consume, such as GPT's
  embedding and LM head; its bytes are on the first user's ``param_bytes``): as the executor does, every stage that
  holds a user but not that first one keeps its own copy, so the copy's bytes join the parameters of the stage's
  earliest user (training state, DDP buckets and FSDP units as any parameter; under TP sharded as the first user's
  parameters are at the stage's degree). In training, after its stages' schedules end (DP syncs included), each
  such parameter's gradient is summed over the stages holding it: an all-reduce of its bytes per rank (an FSDP
  stage's shard, a TP rank's share) among device k of each stage's group, for every k at once (the slowest sets the
  time), the tied all-reduces
  of a device group one after another, a local sum where every such stage is on one device group
  (``meta["tied_allreduce_time"]``, in ``comm_time`` and the timeline; ``meta["tied_copy_bytes"]`` per stage).
  The parameter counts once in the graph and in op-level ``simulate``.
* ``meta``: per-stage forward/backward time per micro-batch, end, collective time (``allreduce_time``:
  DDP bucket all-reduces, or FSDP all-gathers + reduce-scatters over the step), TP collective time
  (``tp_comm_time``: a TP stage's blocking all-reduces over the step, inside its forward / backward times), the
  bubble fraction ``1 - mean over groups of (busy time + TP collective time) / step_time`` (the share of the step a
  device group is idle: pipeline fill and drain, waits on transfers, exposed DP / FSDP collectives; neither its
  compute nor its TP collectives count, so a one-stage plan without DP has none, TP or not), and
  ``cost_batch_size`` (None: whole batch).
* ``SimResult.device_busy``: a device's forward and backward spans over the step less its TP collectives (an FSDP
  stage's exposed gathers stay in its spans); ``comm_time``: the pipeline transfers, DP / FSDP collectives and tied
  all-reduces, summed (the TP collectives are apart, in ``meta["tp_comm_time"]``).

Not modelled: slowdown of compute by concurrent communication (shared SMs / memory bandwidth), DDP's
first-iteration bucket rebuild and its bucket memory copy, FSDP's CPU-side overhead per unit, the
optimizer step's time, contention between pipeline sends and collectives on a shared link, mixed precision.

Inference (``mode="inference"``, or costs from ``cost.modes.inference_costs``): forward only. Backward ops take no
time and send nothing, there is no DP gradient sync, the micro-batches stream through the stages (GPipe's forward
order whatever the plan's schedule: nothing waits for a backward), each device holds its stages' parameters
(FSDP: a shard plus the gathered units) and, per micro-batch, its received buffer while the forward runs.

Stages need not be cuts of one topological order: any stage numbering where no edge goes backwards (stage s is
the difference of two nested downward-closed sets of the DAG, an ideal difference) is simulated as such.

``zb1p`` (zero-bubble) plans are rejected with a ``PlanError``: its split backward is not modelled.

Tensor parallelism (``plan.tp``; see ``cost.tensor_parallel`` for what is and is not modelled): a stage with TP
degree t on ``dp x t`` devices runs each node at one TP rank's cost (split ops at their smaller shapes through
the same per-op model, plus its blocking TP all-reduces per micro-batch over the stage's TP group), with its
parameters and saved activations per rank. The schedule, DP / FSDP collectives and pipeline transfers are then
simulated on the stage's first DP group (device j = 0 of every TP group, p = dp). Unequal devices in one TP group:
its ranks meet at every TP collective, so each node (forward and backward apart, recomputation included) takes its
slowest rank's time, whatever the order the group lists its devices in. Every device of a TP group reports the first
rank's memory (the same bytes on every rank, each checked against its own device's memory) and busy time (the
group's pace). Collectives that several groups run at once are priced by the slowest of them, whatever the order the
plan lists its devices in: a stage's TP all-reduces by the slowest of its TP groups, its DP / FSDP collectives by the
slowest of its DP groups, a pipeline transfer by the slowest link between the two stages' devices (every TP rank
sends its share). The simulator prices TP in ``cost.pipeline_tp``, each stage's device groups in ``cost._pipe_layout``.

Activation recomputation (``plan.recompute``, per stage ``none`` / ``selective`` / ``full``; see
``cost.recompute``): a checkpointed region's forward runs again in its backward, and it keeps only its inputs plus,
while recomputed, one micro-batch's activations.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from placement_rl.cost._pipe_kernel import OK, simulate_pipe, stage_transient, work_sizes
from placement_rl.cost._pipe_layout import PIPELINE_SCHEDULES, _Layout, slowest_table
from placement_rl.cost.memory import BUCKET_BYTES
from placement_rl.cost.modes import check_mode, mode_of
from placement_rl.cost.overhead import with_node_overhead, with_step_overhead
from placement_rl.cost.pipeline_tied import TiedParameters, tied_parameters
from placement_rl.cost.pipeline_tp import TensorParallel, _pace_tp_groups
from placement_rl.cost.simulate import _inverse_bandwidth, _owned, check_costs
from placement_rl.cost.types import CostTable, Interval, SimResult
from placement_rl.errors import PlanError, ProfileError, fmt_bytes
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan, graph_batch_size
from placement_rl.topology import DeviceTopology

_KINDS = ("fwd", "bwd", "transfer", "grad_transfer", "allreduce")


class PipelineSimulator(TensorParallel, TiedParameters):
    """``simulate_pipeline`` prepared once per (graph, costs, topology) for fast repeated evaluation.

    ``step_time(plan)`` returns only the step time; ``run(plan)`` a full ``SimResult``; ``calls`` counts
    evaluations. Layouts of device groups are validated once and kept per instance. One instance may be called from
    several threads at once: a thread other than its creator works in buffers of its own.
    ``cost_batch_size``: the batch size the node times were measured at (default ``costs.meta["batch_size"]``,
    else the graph's own batch, else the plan's whole batch; see the module docstring).
    """

    def __init__(self, graph: CompGraph, costs: CostTable, topology: DeviceTopology, *,
                 cost_batch_size: float | None = None, mode: str | None = None) -> None:
        check_costs(graph, costs, topology)
        self.mode = check_mode(mode) if mode is not None else mode_of(costs)
        if self.mode == "inference":  # forward only: no backward time whatever the table holds
            from placement_rl.cost.modes import inference_costs

            costs = inference_costs(costs)
        self.graph, self.costs, self.topology = graph, costs, topology
        cbs = cost_batch_size if cost_batch_size is not None else costs.meta.get("batch_size")
        if cbs is not None and (isinstance(cbs, bool) or not isinstance(cbs, (int, float)) or not math.isfinite(cbs)
                                or cbs <= 0):
            raise ProfileError(f"cost batch size must be a positive number (the batch the costs were measured "
                               f"at), got {cbs!r}")
        self.cost_batch_size = None if cbs is None else float(cbs)
        self.calls = 0
        i64 = np.int64
        # the launch overhead part of each time does not shrink with micro-batches or replicas
        fixed_fwd = np.minimum(costs.launch_overhead, costs.fwd_time)
        fixed_bwd = np.minimum(costs.launch_overhead, costs.bwd_time)
        self._graph_arrays = (
            _owned(graph.edges[:, 0], i64), _owned(graph.edges[:, 1], i64),
            _owned(graph.edge_bytes), _owned((costs.fwd_time - fixed_fwd).T), _owned(fixed_fwd.T),
            _owned((costs.bwd_time - fixed_bwd).T), _owned(fixed_bwd.T))  # [D, N]: a stage reads a row
        self._size_arrays = (_owned(graph.param_bytes), _owned(graph.act_bytes),
                             _owned(costs.link_latency), _inverse_bandwidth(costs))
        self._layouts: dict[tuple, _Layout] = {}
        self._graph_batch = graph_batch_size(graph)
        self._owner = threading.get_ident()  # the thread that uses ``_out`` and the layouts' buffers; others: their own
        self._out = np.zeros(3)
        self._no_rec = (np.zeros(1, i64), np.zeros(0, np.int8), np.zeros(0, i64), np.zeros(0), np.zeros(0),
                        np.zeros(0, i64))
        self._capacity = topology.array("memory_bytes")
        self._order = _owned(graph.topo_order, i64)
        self._source = costs.describe_source(topology.device_names)
        self._tp: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
        self._tp_ann = None
        self._tp_n: tuple[np.ndarray, np.ndarray] | None = None  # TP collectives per node (``_tp_counts``)
        self._tp_coll: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._tp_link_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._ties = tied_parameters(graph)
        self._pos = np.empty(graph.num_nodes, dtype=np.int64)  # each node's place in the topological order
        self._pos[self._order] = np.arange(graph.num_nodes)
        self._tie_coll: dict[tuple[int, ...], np.ndarray] = {}
        self._grad_bytes: dict[tuple, np.ndarray] = {}  # per-rank ``backward_memory.grad_bytes`` per TP setting
        self._no_again = np.zeros(graph.num_nodes)  # no recomputed activations

    def __setstate__(self, state: dict) -> None:  # unpickled in another process: this thread owns the buffers
        self.__dict__.update(state)
        self._owner = threading.get_ident()

    def _recompute(self, plan: StagePlan, graph_arrays: tuple, size_arrays: tuple) -> tuple[tuple, tuple, np.ndarray]:
        """Node arrays with each stage's activation recomputation (``cost.recompute``): forward repeated in the
        backward, saved activations of checkpointed regions replaced by their inputs, and per node the region's
        activations recomputed while its backward runs (the kernel adds them to its gradient buffers)."""
        from placement_rl.cost.recompute import apply_recompute
        from placement_rl.graph.tp import shard_graph

        plan.validate(self.graph, self.topology)

        def run(s: int) -> CompGraph:
            t = plan.tp[s]
            return self.graph if t == 1 else shard_graph(self.graph, t, divisible_by=plan.make_vocab_size_divisible_by,
                                                         sequence_parallel=plan.sequence_parallel)

        times, act, again = apply_recompute(plan, self.graph, run, graph_arrays[3:], size_arrays[1])
        return (*graph_arrays[:3], *times), (size_arrays[0], act, *size_arrays[2:]), again

    def grad_bytes(self, plan: StagePlan) -> np.ndarray:
        """float [N]: per node, the gradient buffers its backward holds at once (``cost.backward_memory``) on one
        rank of its stage (a TP stage's nodes from its sharded graph), at the graph's batch; read-only. Zero under
        inference costs."""
        from placement_rl.cost.backward_memory import grad_bytes

        key = (1, 0, False)
        if key not in self._grad_bytes:
            self._grad_bytes[key] = (grad_bytes(self.graph) if self.mode == "train"
                                     else np.zeros(self.graph.num_nodes))
        out = self._grad_bytes[key]
        if self.mode != "train" or not plan.uses_tp:
            return out
        from placement_rl.graph.tp import shard_graph

        out = out.copy()
        for s, t in enumerate(plan.tp):
            if t == 1:
                continue
            key = (t, plan.make_vocab_size_divisible_by, bool(plan.sequence_parallel))
            if key not in self._grad_bytes:
                self._grad_bytes[key] = grad_bytes(shard_graph(self.graph, t, divisible_by=key[1],
                                                               sequence_parallel=key[2]))
            nodes = plan.stage_of_node == s
            out[nodes] = self._grad_bytes[key][nodes]
        return out

    def _layout(self, plan: StagePlan, given: StagePlan) -> _Layout:
        """The layout of the kernel's ``plan``; ``given``: the plan it stands for (with TP: each stage's collectives
        priced on the slowest of its DP groups)."""
        key = (plan.stage_devices, plan.schedule, plan.num_microbatches, plan.batch_size, given.stage_devices,
               given.tp)
        lay = self._layouts.get(key)
        if lay is None:
            if plan.schedule not in PIPELINE_SCHEDULES:
                raise PlanError(f"simulate_pipeline models schedules {', '.join(PIPELINE_SCHEDULES)}; "
                                f"'{plan.schedule}' is not modelled")
            plan.validate(self.graph, self.topology)
            coll = tuple(given.dp_groups(s) for s in range(given.num_stages)) if given.uses_tp else None
            lay = _Layout(plan, self.topology, self.costs, self.mode == "train", coll)
            if len(self._layouts) >= 256:
                self._layouts.clear()
            self._layouts[key] = lay
        return lay

    def batch_ratio(self, plan: StagePlan) -> float:
        """Plan batch size over the batch size the costs were measured at: ``cost_batch_size``, else the graph's
        own batch (1.0 where neither is known or the plan gives no batch: costs for the whole batch)."""
        if self.cost_batch_size is None:
            return self.size_ratio(plan)
        if plan.batch_size is None:
            raise PlanError(f"costs were measured at batch size {self.cost_batch_size:g}: the stage plan needs a "
                            "batch_size to scale them")
        return float(plan.batch_size) / self.cost_batch_size

    def size_ratio(self, plan: StagePlan) -> float:
        """Plan batch size over the graph's own (its activations and tensors are for that batch; 1.0 when either
        is unknown)."""
        if plan.batch_size is None or self._graph_batch is None:
            return 1.0
        return float(plan.batch_size) / float(self._graph_batch)

    def _buffers(self, lay: _Layout, nf: int, ni: int) -> tuple[np.ndarray, ...]:
        """The kernel's work buffers and outputs (per stage, per group, ``out``): the layout's and ``_out`` in the
        creating thread, new ones in any other (the kernel releases the GIL: shared buffers gave wrong step times
        under threads)."""
        if threading.get_ident() != self._owner:
            return (np.zeros(nf), np.zeros(ni, dtype=np.int64), np.zeros_like(lay.out_stage),
                    np.zeros_like(lay.out_group), np.zeros(3))
        if lay.fw.shape[0] < nf:
            lay.fw, lay.iw = np.zeros(nf), np.zeros(ni, dtype=np.int64)
        return lay.fw, lay.iw, lay.out_stage, lay.out_group, self._out

    def _simulate(self, plan: StagePlan, rec: tuple) -> tuple:
        """``(layout, out, out_stage, out_group, tie_sync, tie_copy, tp_parts, gradb)`` of one simulation: ``out`` =
        (step time, status, comm time), the kernel's per-stage and per-group outputs, the tied all-reduces ``(start,
        end, groups)``, the tied copy bytes per stage (None without tied parameters), the TP collectives as priced for
        the kernel (``_tp_comm_parts``; None without TP) and the backward working bytes per node the kernel read
        (whole batch); its own arrays in a thread other than the creator (see ``_buffers``)."""
        ratio = self.batch_ratio(plan)
        graph_arrays, size_arrays = self._graph_arrays, self._size_arrays
        given, tp_parts = plan, None
        gradb, again = self.grad_bytes(given), self._no_again
        if plan.uses_tp:
            plan, (graph_arrays, size_arrays), tp_parts = self._tp_plan(plan)
        if any(r != "none" for r in given.recompute):
            graph_arrays, size_arrays, again = self._recompute(given, graph_arrays, size_arrays)
        if given.uses_tp:  # after recomputation: a TP group waits for its slowest rank on every node
            _pace_tp_groups(given, graph_arrays, ratio)
        sized = self.size_ratio(given)
        if sized != 1.0:  # a plan of another batch than the graph's: its activations and crossing tensors scale
            graph_arrays = (*graph_arrays[:2], graph_arrays[2] * sized, *graph_arrays[3:])
            size_arrays = (size_arrays[0], size_arrays[1] * sized, *size_arrays[2:])
            gradb, again = gradb * sized, again * sized
        syncs: list[tuple[float, tuple[int, ...]]] = []
        tie_copy = None
        if self._ties:  # each stage holding a user of a tied parameter but not its first user: a copy of it
            copies, syncs, tie_copy = self._tied_copies(given)
            size_arrays = (size_arrays[0] + copies, *size_arrays[1:])
        lay = self._layout(plan, given)
        s, m = plan.num_stages, int(plan.num_microbatches)
        fw, iw, out_stage, out_group, out = self._buffers(
            lay, *work_sizes(self.graph.num_nodes, s, m, int(lay.gptr[-1]), lay.num_groups))
        stage = plan.stage_of_node
        if stage.shape[0] != self.graph.num_nodes:
            plan.validate(self.graph, self.topology)
        simulate_pipe(stage, s, m, *lay.order, lay.gptr, lay.gdev, lay.sgroup,
                      lay.num_groups, *graph_arrays, ratio, size_arrays[0], size_arrays[1], gradb, again,
                      *size_arrays[2:],
                      self._order,
                      1 if plan.sharding == "fsdp" else 0, lay.coll, BUCKET_BYTES, 1 if self.mode == "train" else 0,
                      fw, iw, out_stage, out_group, out, len(rec[1]) > 0, *rec)
        self.calls += 1
        if out[1] != OK:
            plan.validate(self.graph, self.topology)  # raises the PlanError that names the problem
            raise PlanError(f"stage plan does not fit graph '{self.graph.name}'")
        tie_sync = self._tied_sync(given, lay, syncs, out_stage, out) if self._ties and self.mode == "train" else []
        return lay, out, out_stage, out_group, tie_sync, tie_copy, tp_parts, (size_arrays[1], gradb, again)

    def step_time(self, plan: StagePlan) -> float:
        """Simulated step time (seconds) of ``plan``."""
        return float(self._simulate(plan, self._no_rec)[1][0])

    def run(self, plan: StagePlan, timeline: bool = False) -> SimResult:
        """Full result: step time, busy time and memory per device, feasibility, per-stage meta, timeline."""
        if timeline:
            r = 5 * plan.num_stages * plan.num_microbatches + plan.num_stages + self.graph.num_nodes
            rec = (np.zeros(1, np.int64), np.zeros(r, np.int8), np.zeros(r, np.int64), np.zeros(r), np.zeros(r),
                   np.zeros(r, np.int64))
        else:
            rec = self._no_rec
        lay, out, out_stage, out_group, tie_sync, tie_copy, tp_parts, transient = self._simulate(plan, rec)
        tp_comm = self.tp_comm_time(plan, self.mode == "train", tp_parts) if plan.uses_tp else np.zeros(plan.num_stages)
        compute = out_group[1] - np.bincount(lay.sgroup, weights=tp_comm, minlength=lay.num_groups)
        busy, mem = np.zeros(self.topology.num_devices), np.zeros(self.topology.num_devices)
        busy[lay.device_idx] = compute[lay.device_group]
        mem[lay.device_idx] = out_group[0, lay.device_group]
        if plan.uses_tp:  # every rank of a TP group reports its first's (the one the kernel timed, at the group's pace)
            for s in range(plan.num_stages):
                for grp in plan.tp_groups(s):
                    busy[list(grp)], mem[list(grp)] = busy[grp[0]], mem[grp[0]]
        step = float(out[0])
        bubble = 1.0 - float(out_group[1].mean()) / step if step > 0 else 0.0  # idle: no compute, no TP collective
        st = out_stage
        meta = {"schedule": plan.schedule, "num_microbatches": int(plan.num_microbatches),
                "stage_fwd_time": st[0].tolist(), "stage_bwd_time": st[1].tolist(),
                "stage_end": st[2].tolist(), "stage_last_backward": st[3].tolist(),
                "allreduce_time": st[4].tolist(), "microbatch_bytes": st[5].tolist(),
                "bubble_fraction": bubble, "cost_batch_size": self.cost_batch_size, "link_time": st[6].tolist(),
                "cost_source": self._source, "sharding": plan.sharding, "tp": list(plan.tp), "mode": self.mode,
                "tp_comm_time": tp_comm.tolist()}
        if self.mode == "train":  # per stage, one micro-batch on one replica, as the kernel adds it
            per, work = np.zeros(plan.num_stages), np.zeros(plan.num_stages)
            stage_transient(plan.stage_of_node, self._order, *transient, per, work)
            meta["backward_transient_bytes"] = (per / (plan.num_microbatches * np.array(plan.dp_degrees))).tolist()
        if self._ties:
            meta["tied_allreduce_time"] = sum(end - start for start, end, _ in tie_sync)
            meta["tied_copy_bytes"] = tie_copy.tolist()
        from placement_rl.cost.throughput import pipeline_steady_time

        meta["steady_time"] = pipeline_steady_time(plan, meta)
        batch = plan.batch_size if plan.batch_size is not None else graph_batch_size(self.graph)
        meta["time_per_sample"] = meta["steady_time"] / batch if batch else None
        over = np.flatnonzero(mem > self._capacity)
        if over.size:
            names = self.topology.device_names
            meta["memory_errors"] = [f"{names[d]} needs {fmt_bytes(mem[d])}, has "
                                     f"{fmt_bytes(self._capacity[d])}" for d in over]
        broken: list[str] = []
        if self.costs.meta.get("allowed") or self.costs.meta.get("colocate"):
            from placement_rl.cost.costs_file import stage_restriction_errors

            broken = stage_restriction_errors(self.costs, plan.stage_of_node, plan.stage_devices, self.graph.names,
                                              self.topology.device_names)
            if broken:
                meta["restriction_errors"] = broken
        return SimResult(step_time=step, feasible=not over.size and not broken,
                         device_busy=busy, peak_memory=mem, comm_time=float(out[2]),
                         timeline=self._timeline(rec, lay, plan, tie_sync) if timeline else None, meta=meta)

    def _timeline(self, rec: tuple, lay: _Layout, plan: StagePlan, tie_sync: list) -> tuple[Interval, ...]:
        g, m = lay.num_groups, plan.num_microbatches
        out = []
        for k in range(int(rec[0][0])):
            kind, res, lab = int(rec[1][k]), int(rec[2][k]), int(rec[5][k])
            if kind in (2, 3):
                resource = f"{lay.group_names[res // g]}->{lay.group_names[res % g]}"
            else:
                resource = lay.group_names[res]
            label = f"stage{lab}" if kind == 4 else f"stage{lab // m} mb{lab % m}"
            out.append(Interval(kind=_KINDS[kind], resource=resource, start=float(rec[3][k]),
                                end=float(rec[4][k]), label=label))
        for start, end, groups in tie_sync:
            if end > start:
                out.extend(Interval(kind="allreduce", resource=lay.group_names[g], start=start, end=end, label="tied")
                           for g in groups)
        return tuple(out)


def simulate_pipeline(graph: CompGraph, costs: CostTable, topology: DeviceTopology, plan: StagePlan, *,
                      timeline: bool = False, cost_batch_size: float | None = None,
                      mode: str | None = None) -> SimResult:
    """Simulated training step (``mode="inference"``: forward pass) of a pipeline ``plan`` (``cost_batch_size``
    and ``mode``: see ``PipelineSimulator``; the mode defaults to the cost table's, ``cost.modes``)."""
    return PipelineSimulator(graph, costs, topology, cost_batch_size=cost_batch_size,
                             mode=mode).run(plan, timeline=timeline)


__all__ = ["PIPELINE_SCHEDULES", "PipelineSimulator", "simulate_pipeline", "slowest_table", "with_node_overhead",
           "with_step_overhead"]
