"""A stage plan's deployed step predicted from the measured overheads (``profiling.dist_overhead``).

``with_pipeline_overhead`` puts a plan's per-micro-batch schedule cost on its stages' nodes before
``simulate_pipeline`` runs (so the bubbles see it), and ``predict_deploy_step`` adds the rest to that prediction
of a stage plan deployed by ``placement_rl.executor`` on CPU processes, and scales the result when the plan runs
more processes than the host has cores (each process runs one thread; ``k`` processes on ``c < k`` cores take
``k / c`` as long). ``collective_links`` turns a measured collective curve into link latency / bandwidth for the
simulator's own ring / tree price; ``with_tp_dispatch`` adds DTensor's measured cost per pass.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

import numpy as np
import torch

from placement_rl.errors import ProfileError
from placement_rl.profiling.dist_overhead import DistOverheads


def stage_boundary_bytes(plan, graph) -> np.ndarray:
    """Bytes each stage of ``plan`` receives and sends per micro-batch per replica, by ``simulate_pipeline``'s
    rule: boundary s|s+1 carries every tensor produced at or before s and consumed after it, once per producer
    (its largest crossing edge); stage s moves its two boundaries."""
    s_of = np.asarray(plan.stage_of_node)
    cut = np.zeros(plan.num_stages + 1)
    if plan.num_stages > 1 and len(graph.edges):
        src, dst = graph.edges[:, 0], graph.edges[:, 1]
        fwd = s_of[dst] > s_of[src]
        last = np.full(graph.num_nodes, -1)
        big = np.zeros(graph.num_nodes)
        np.maximum.at(last, src[fwd], s_of[dst[fwd]])
        np.maximum.at(big, src[fwd], np.asarray(graph.edge_bytes, dtype=np.float64)[fwd])
        u = np.flatnonzero(last >= 0)
        np.add.at(cut, s_of[u], big[u])  # from the producer's boundary ...
        np.add.at(cut, last[u], -big[u])  # ... up to the last consumer's
        cut = np.cumsum(cut)
    per_stage = cut[:-1] + np.concatenate([[0.0], cut[:-2]])
    dp = np.array([len(d) // (int(plan.tp[i]) if plan.tp else 1) for i, d in enumerate(plan.stage_devices)])
    return per_stage / (int(plan.num_microbatches) * np.maximum(dp, 1))


def with_pipeline_overhead(costs, plan, graph, overheads: DistOverheads | None):
    """``costs`` with each stage's measured schedule cost per micro-batch (``DistOverheads.pp_stage``) spread over
    the stage's nodes (half on forward, half on backward, as launch overhead: every micro-batch pays it), so the
    simulated pipeline's bubbles see it. Plans of one stage, or without ``overheads``, get ``costs`` back."""
    from placement_rl.cost.pipeline import with_node_overhead

    if overheads is None or plan.num_stages < 2 or not any(overheads.pp_stage[1:]):
        return costs
    s_of = np.asarray(plan.stage_of_node)
    per_mb = np.array([overheads.pp_microbatch_seconds(b) for b in stage_boundary_bytes(plan, graph)])
    count = np.bincount(s_of, minlength=plan.num_stages).astype(np.float64)
    return with_node_overhead(costs, (per_mb / (2.0 * np.maximum(count, 1.0)))[s_of][:, None],
                              pipeline_overhead_per_microbatch=per_mb.tolist())


def collective_links(overheads: DistOverheads | tuple[Sequence[float], Sequence[float]],
                     kind: str = "tp_all_reduce", *, ranks: int = 2) -> tuple[float, float]:
    """``(latency s, bandwidth B/s)`` of the host's links that make the ring model's 2-rank all-reduce,
    ``2 latency + bytes / bandwidth``, match a measured 2-rank curve: ``kind`` of ``overheads`` (default: the
    all-reduce as a TP step issues it, between compute), or a ``(sizes, seconds)`` pair
    (``measure_tp_collectives``), fitted by least squares in relative error over the measured sizes. With these
    links ``simulate_pipeline`` prices every collective and transfer of the host from the measurement (p > 2 ranks
    by the ring / tree rules of ``cost.collectives``). ``ranks``: the curve's group size p (the all-reduce of p ranks
    is priced ``min(ring 2 (p-1) latency + 2 (p-1)/p bytes / bandwidth, tree 2 ceil(log2 p) latency + 2 bytes /
    bandwidth)`` by the simulator; the links are fitted to that price)."""
    if isinstance(overheads, DistOverheads):
        if kind not in overheads.collectives:
            raise ProfileError(f"no measured '{kind}' curve in the distributed-overhead record; re-run the "
                               "measurement")
        curve = overheads.collectives[kind]
    else:
        curve = overheads
    sizes, times = (np.asarray(v, dtype=np.float64) for v in curve)
    ok = times > 0
    if ok.sum() < 2:
        raise ProfileError(f"the measured '{kind}' curve has fewer than two positive times; re-run the measurement")
    from scipy.optimize import least_squares, nnls

    n, t = sizes[ok], times[ok]
    w = 1.0 / t
    coef, _ = nnls(np.stack([w, n * w * 1e-6], axis=1), np.ones(int(ok.sum())))  # the ring of 2: 2 L + n / B
    lat, inv = float(coef[0]) / 2.0, float(coef[1]) * 1e-6
    if ranks > 2:
        steps, tree = 2.0 * (ranks - 1), 2.0 * math.ceil(math.log2(ranks))

        def rel(x: np.ndarray) -> np.ndarray:
            a, b = np.exp(x)
            return np.minimum(steps * a + steps / ranks * n * b, tree * a + 2.0 * n * b) / t - 1.0

        x0 = np.log([max(lat, 1e-9) / (ranks - 1), max(inv, 1e-15)])
        lat, inv = (float(v) for v in np.exp(least_squares(rel, x0).x))
    return lat, (1.0 / inv if inv > 0 else float("inf"))


def with_links(costs, latency: float, bandwidth: float):
    """``costs`` with every link between two devices at ``latency`` seconds and ``bandwidth`` bytes/s (e.g.
    ``collective_links``: the process group's measured figures in place of the topology's)."""
    d = costs.num_devices
    lat = np.full((d, d), float(latency))
    bw = np.full((d, d), float(bandwidth))
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, np.inf)
    return dataclasses.replace(costs, link_latency=lat, link_bandwidth=bw,
                               meta={**dict(costs.meta), "links": {"latency": float(latency),
                                                                   "bandwidth": float(bandwidth)}})


def with_tp_dispatch(costs, plan, graph, pass_seconds: Sequence[float]):
    """``costs`` with each TP stage's measured DTensor cost per micro-batch pass (``pass_seconds[s]``, e.g.
    ``executor.tp_probe.measure_tp_dispatch``) as fixed time on that stage's nodes, half on forward, half on
    backward, so every micro-batch pays it and the simulated pipeline's bubbles see it. It goes on the nodes a TP
    rank runs whole (``cost.tensor_parallel.split_nodes`` false), whose times TP does not scale: the cost is per
    call, not per element, and does not shrink with the shard."""
    from placement_rl.cost.pipeline import with_node_overhead
    from placement_rl.cost.tensor_parallel import split_nodes
    from placement_rl.graph.tp import annotation

    tps = tuple(plan.tp) if plan.tp else (1,) * plan.num_stages
    if len(pass_seconds) != plan.num_stages:
        raise ProfileError(f"{len(pass_seconds)} measured TP pass costs for a plan of {plan.num_stages} stages")
    whole = ~split_nodes(annotation(graph), sequence_parallel=bool(plan.sequence_parallel))
    s_of = np.asarray(plan.stage_of_node)
    add = np.zeros(graph.num_nodes)
    for s, (t, sec) in enumerate(zip(tps, pass_seconds)):
        nodes = np.flatnonzero((s_of == s) & whole)
        if t > 1 and nodes.size and sec > 0:
            add[nodes] = float(sec) / (2.0 * nodes.size)
    return with_node_overhead(costs, add[:, None], tp_dispatch_per_pass=[float(x) for x in pass_seconds])


def tensors_per_param_node(module: torch.nn.Module, graph: Any) -> float:
    """Trainable parameter tensors of ``module`` per node of its captured ``graph`` that owns parameters (the
    graph records bytes, not tensors; ``predict_deploy_step`` counts tensors)."""
    tensors = sum(1 for p in module.parameters() if p.requires_grad)
    return tensors / max(int(np.count_nonzero(graph.param_bytes)), 1)


def predict_deploy_step(simulated: float, *, plan, graph, adam_seconds: float, overheads: DistOverheads | None,
                        tensors_per_node: float = 2.0, tp_split: np.ndarray | None = None,
                        cores: int | None = None, tp_adam_seconds: Sequence[float] | None = None,
                        scale_simulated: bool = True) -> dict[str, float]:
    """Step time of ``plan`` as ``placement_rl.executor`` runs it on CPU processes: the simulated schedule
    (``simulated``: ``simulate_pipeline`` with measured per-op costs) + the wrappers' per-pass costs of the
    slowest stage over its micro-batches + Adam (``adam_seconds``: plain Adam over the whole model, measured;
    the largest stage's share, over DTensor shards for FSDP), a pipeline's per-step schedule cost (its per-micro-batch
cost belongs in the simulated costs: ``with_pipeline_overhead``) and the oversubscription of ``cores``.
    ``tensors_per_node``: parameter tensors per node that owns parameters (the graph records bytes, not
    tensors; a Linear has 2). ``tp_split``: bool [N], the nodes whose parameters TP splits (the ``graph.tp``
    annotation's ``frac_params > 0``): a stage of TP degree t > 1 pays the TP per-pass and DTensor Adam terms for
    those, and its plain Adam share is one rank's (split parameters over t).
    ``tp_adam_seconds``: per stage, DTensor's measured extra seconds of Adam (``executor.tp_probe``); when given,
    the TP per-pass cost is taken to be in the simulated costs already (``with_tp_dispatch``) and these replace the
    fitted ``tp_pass`` / ``tp_adam`` terms.
    ``scale_simulated=False``: ``simulated`` already runs its compute at ``cores / processes`` of a core
    (``with_core_sharing``) and its collectives at prices measured under the same sharing; only the terms added
    here are scaled.
    Without ``overheads``: the simulated schedule and plain Adam only (what the bench reported before)."""
    m = int(plan.num_microbatches)
    total = float(graph.param_bytes.sum()) or 1.0
    worst_wrap = worst_opt = 0.0
    tps = tuple(plan.tp) if plan.tp else (1,) * plan.num_stages
    split = np.zeros(graph.num_nodes, dtype=bool) if tp_split is None else np.asarray(tp_split, dtype=bool)
    for s in range(plan.num_stages):
        sel = plan.stage_of_node == s
        t = int(tps[s])
        share = float((graph.param_bytes[sel] / np.where(split[sel] & (t > 1), t, 1)).sum()) / total
        tensors = float(np.count_nonzero(graph.param_bytes[sel])) * tensors_per_node
        p = len(plan.stage_devices[s]) // t
        opt = adam_seconds * share / (p if plan.sharding == "fsdp" else 1)
        wrap = 0.0
        if t > 1 and tp_adam_seconds is not None:
            opt += float(tp_adam_seconds[s])
        elif overheads is not None and t > 1:
            tp_tensors = float(np.count_nonzero(graph.param_bytes[sel] * split[sel])) * tensors_per_node
            a, b = overheads.tp_pass
            c, d = overheads.tp_adam
            wrap, opt = wrap + m * (a + b * tp_tensors), opt + c + d * tp_tensors
        if overheads is not None and p > 1 and tensors > 0:
            a, b = overheads.ddp_pass if plan.sharding != "fsdp" else overheads.fsdp_pass
            wrap += m * (a + b * tensors)
            if plan.sharding == "fsdp":
                c, d = overheads.fsdp_adam
                opt += c + d * tensors
        worst_wrap, worst_opt = max(worst_wrap, wrap), max(worst_opt, opt)
    if overheads is not None and plan.num_stages > 1:  # the schedule's per-step cost (per micro-batch: in costs)
        worst_wrap += overheads.pp_stage[0]
    factor = core_sharing(plan, cores) if overheads is not None else 1.0
    step = (simulated * (factor if scale_simulated else 1.0)) + (worst_wrap + worst_opt) * factor
    return {"predicted_s": step, "wrapper_s": worst_wrap, "optimizer_s": worst_opt, "oversubscription": factor}


def core_sharing(plan, cores: int | None = None) -> float:
    """How much slower each process of ``plan`` computes when its processes (one thread each) share the host's
    ``cores`` (default ``os.cpu_count()``): ``max(1, processes / cores)``."""
    cores = cores or os.cpu_count() or 1
    return max(1.0, int(plan.world_size) / cores)


def with_core_sharing(costs, factor: float):
    """``costs`` with every node's forward and backward time (launch overhead included) ``factor`` times longer:
    a CPU device whose core is shared by ``factor`` processes (``core_sharing``). Links are left alone."""
    if factor == 1.0:
        return costs
    return dataclasses.replace(costs, fwd_time=costs.fwd_time * factor, bwd_time=costs.bwd_time * factor,
                               launch_overhead=costs.launch_overhead * factor,
                               meta={**dict(costs.meta), "core_sharing": float(factor)})


__all__ = ["collective_links", "core_sharing", "predict_deploy_step", "stage_boundary_bytes", "tensors_per_param_node",
           "with_core_sharing", "with_links", "with_pipeline_overhead", "with_tp_dispatch"]
