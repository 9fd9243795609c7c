"""Stage planners on the full stage-plan space: measured-style graphs on clusters with a slow device.

Cases (written here, not taken from any benchmark): per-node, per-device-kind times as a profile would give them
(``CostTable`` columns by device kind; the CPU ``cpu_slowdown`` x slower, varying per node), on

* ``layers``: a layer graph (embedding, ``layers`` transformer layers of slightly unequal cost, head), the kind a
  per-layer profile gives;
* ``operators``: an operator graph of the same model (per layer: layer norm, q / k / v projections in parallel,
  attention, output projection, residual add, layer norm, MLP up / activation / down, residual add; residual
  edges skip ahead), where stages need not be cuts of one topological order;

clusters ``mixed(a)``: ``a`` accelerators on one host (NVLink-class links) and one CPU over PCIe, or
``hosts(d)``: ``d - 1`` accelerators in hosts of 8 (InfiniBand between hosts) plus one CPU. ``training`` and
``inference`` modes. ``planner_table`` gives every stage planner's time per sample in steady state (the
throughput objective) and its search seconds, with its gap to ``exact``; ``learned_row`` trains
``PipelineEnv``'s policy (devices fastest first, throughput objective) and reports the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl import baselines
from placement_rl.cost import CostTable, simulate_pipeline
from placement_rl.cost.modes import for_mode
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph, make_graph
from placement_rl.topology import DeviceTopology

GIB = 2.0**30
PLANNERS = ("exact", "pp_time_dp", "pipedream", "hybrid", "pp_params", "pp_uniform", "dp", "fsdp")


def layer_graph(layers: int = 24, *, hidden: int = 1024, seq: int = 128, batch: int = 32) -> CompGraph:
    act = 4.0 * batch * seq * hidden
    params = 4.0 * 12 * hidden * hidden
    nodes = [dict(name="embed", op_type="embedding", param_bytes=4.0 * 30000 * hidden, act_bytes=act, bwd_flops=1.0)]
    nodes += [dict(name=f"layer{i}", op_type="transformer_layer", param_bytes=params, act_bytes=8 * act,
                   bwd_flops=1.0) for i in range(layers)]
    nodes += [dict(name="head", op_type="linear", param_bytes=4.0 * hidden * 2, act_bytes=act, bwd_flops=1.0)]
    edges = [(i, i + 1, act) for i in range(layers + 1)]
    return make_graph(nodes, edges, name=f"layers{layers}", meta={"batch_size": batch})


OPS = (("ln1", 0.02, 0.0), ("q", 0.1, 1.0), ("k", 0.1, 1.0), ("v", 0.1, 1.0), ("attn", 0.25, 0.0),
       ("proj", 0.1, 1.0), ("add1", 0.01, 0.0), ("ln2", 0.02, 0.0), ("up", 0.4, 4.0), ("act", 0.05, 0.0),
       ("down", 0.4, 4.0), ("add2", 0.01, 0.0))  # name, share of a layer's time, parameters in hidden^2 units


def operator_graph(layers: int = 6, *, hidden: int = 1024, seq: int = 128, batch: int = 32) -> CompGraph:
    act = 4.0 * batch * seq * hidden
    nodes: list[dict[str, Any]] = [dict(name="embed", op_type="embedding", param_bytes=4.0 * 30000 * hidden,
                                        act_bytes=act, bwd_flops=1.0)]
    edges: list[tuple[str, str, float]] = []
    prev = "embed"
    for i in range(layers):
        for name, _, p in OPS:
            nodes.append(dict(name=f"l{i}.{name}", op_type=name, param_bytes=4.0 * p * hidden * hidden,
                              act_bytes=act * (4 if name in ("up", "act") else 1), bwd_flops=1.0))
        n = lambda x: f"l{i}.{x}"  # noqa: E731
        edges += [(prev, n("ln1"), act), (n("ln1"), n("q"), act), (n("ln1"), n("k"), act), (n("ln1"), n("v"), act),
                  (n("q"), n("attn"), act), (n("k"), n("attn"), act), (n("v"), n("attn"), act),
                  (n("attn"), n("proj"), act), (n("proj"), n("add1"), act), (prev, n("add1"), act),
                  (n("add1"), n("ln2"), act), (n("ln2"), n("up"), act), (n("up"), n("act"), 4 * act),
                  (n("act"), n("down"), 4 * act), (n("down"), n("add2"), act), (n("add1"), n("add2"), act)]
        prev = n("add2")
    nodes.append(dict(name="head", op_type="linear", param_bytes=4.0 * hidden * 2, act_bytes=act, bwd_flops=1.0))
    edges.append((prev, "head", act))
    return make_graph(nodes, edges, name=f"operators{layers}", meta={"batch_size": batch})


def mixed(accelerators: int, *, gpu_memory: float = 16 * GIB) -> DeviceTopology:
    """``accelerators`` on one host (50 GB/s links) and a CPU over PCIe (12 GB/s)."""
    return DeviceTopology.from_dict({
        "name": f"{accelerators}gpu+cpu", "devices": [
            {"name": "gpu", "count": accelerators, "kind": "gpu", "peak_flops": 1e14, "mem_bandwidth": 1e12,
             "memory_bytes": gpu_memory},
            {"name": "cpu", "count": 1, "kind": "cpu", "peak_flops": 2e12, "mem_bandwidth": 1e11,
             "memory_bytes": 256 * GIB}],
        "links": {"intra_host": {"bandwidth": 50e9, "latency": 5e-6},
                  "pairs": [{"between": [f"gpu{k}", "cpu"], "bandwidth": 12e9, "latency": 10e-6}
                            for k in range(accelerators)]}})


def hosts(devices: int, *, per_host: int = 8, gpu_memory: float = 16 * GIB) -> DeviceTopology:
    """``devices - 1`` accelerators in hosts of ``per_host`` (50 GB/s inside, 12.5 GB/s between) and a CPU."""
    gpus = devices - 1
    names = [f"gpu{k}" for k in range(gpus)] + ["cpu"]
    host = [k // per_host for k in range(gpus)] + [0]
    devs = [{"name": names[k], "kind": "gpu", "peak_flops": 1e14, "mem_bandwidth": 1e12, "memory_bytes": gpu_memory,
             "host": host[k]} for k in range(gpus)]
    devs.append({"name": "cpu", "kind": "cpu", "peak_flops": 2e12, "mem_bandwidth": 1e11, "memory_bytes": 256 * GIB,
                 "host": 0})
    bw = np.where(np.equal.outer(host, host), 50e9, 12.5e9)
    lat = np.where(np.equal.outer(host, host), 5e-6, 20e-6)
    bw[-1, :] = bw[:, -1] = 12e9
    np.fill_diagonal(bw, np.inf)
    np.fill_diagonal(lat, 0.0)
    kinds = tuple(tuple("self" if i == j else ("intra_host" if host[i] == host[j] else "inter_host")
                        for j in range(devices)) for i in range(devices))
    from placement_rl.topology import Device

    return DeviceTopology(name=f"{gpus}gpu+cpu", devices=tuple(
        Device(name=d["name"], kind=d["kind"], torch_device="cpu" if d["kind"] == "cpu" else f"cuda:{k}",
               peak_flops=d["peak_flops"], mem_bandwidth=d["mem_bandwidth"], memory_bytes=d["memory_bytes"],
               host=d["host"]) for k, d in enumerate(devs)),
        link_bandwidth=bw, link_latency=lat, link_kind=kinds)


def measured_costs(graph: CompGraph, topology: DeviceTopology, *, layer_ms: float = 4.0, cpu_slowdown: float = 12.0,
                   seed: int = 0) -> CostTable:
    """Per-node times by device kind as a profile gives them: a layer ``layer_ms`` on an accelerator (+-15%),
    operators their share of it, the CPU ``cpu_slowdown`` x slower (x0.5..2 per node: CPUs are relatively better
    at some ops), backward 2x forward."""
    rng = np.random.default_rng(seed)
    share = {name: s for name, s, _ in OPS}
    base = np.array([share.get(t, 1.0) * (0.25 if t in ("embedding", "linear") else 1.0) for t in graph.op_types])
    gpu = 1e-3 * layer_ms * base * rng.uniform(0.85, 1.15, graph.num_nodes)
    cpu = gpu * cpu_slowdown * rng.uniform(0.5, 2.0, graph.num_nodes)
    fwd = np.stack([cpu if d.kind == "cpu" else gpu for d in topology.devices], axis=1)
    lat = np.array(topology.link_latency)
    return CostTable(fwd_time=fwd, bwd_time=2.0 * fwd, link_latency=lat,
                     link_bandwidth=np.array(topology.link_bandwidth), source=("measured-style",) * topology.num_devices,
                     graph_fingerprint=graph.fingerprint(), topology_name=topology.name)


@dataclass(frozen=True)
class Cell:
    planner: str
    time_per_sample: float  # seconds, steady state
    step_time: float
    feasible: bool
    seconds: float
    sim_calls: int
    plan: str
    note: str = ""


def describe(plan) -> str:
    return (f"{plan.num_stages} stages {'/'.join(str(len(g)) for g in plan.stage_devices)} devices, "
            f"m={plan.num_microbatches}, {plan.sharding}")


def planner_table(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, mode: str, budget: int,
                  planners: tuple[str, ...] = PLANNERS, objective: str = "throughput") -> list[Cell]:
    """Every planner minimising ``objective`` in ``mode``: time per sample (steady state), step time, seconds."""
    costs = for_mode(costs, mode)
    batch = int(graph.meta.get("batch_size") or 1)
    out = []
    for name in planners:
        t0 = time.perf_counter()
        try:
            plan = baselines.get_pipeline(name)(graph, costs, topology, budget=budget, seed=0, objective=objective)
        except ConfigError as exc:
            out.append(Cell(name, float("nan"), float("nan"), False, time.perf_counter() - t0, 0, "", str(exc)))
            continue
        dt = time.perf_counter() - t0
        res = simulate_pipeline(graph, costs, topology, plan)
        note = ""
        if name == "exact":
            skipped = "skipped" in str(plan.meta.get("ideal_note", ""))
            note = (f"ideals {plan.meta.get('ideals')} ({'all' if plan.meta.get('ideals_complete') else 'prefixes'})"
                    f", DP {'skipped (over the work limit: pipe_tp.exact alone), ' if skipped else ''}"
                    f"{plan.meta.get('ideal_search_seconds', float('nan')):.2f} s, bound {plan.meta.get('ideal_bound')}"
                    f" ideals, DP work {plan.meta.get('dp_work', 0):.3g}")
        out.append(Cell(name, res.meta["steady_time"] / batch, res.step_time, bool(res.feasible), dt,
                        int(plan.meta.get("sim_calls", 0)), describe(plan), note))
    return out


def learned_row(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, mode: str, steps: int,
                samples: int = 8, seed: int = 0) -> Cell:
    """``PipelineEnv``'s policy (devices fastest first, throughput objective) trained ``steps`` steps on the case;
    its best of the greedy and ``samples`` sampled plans, and the best plan seen in training."""
    from placement_rl.agents.rollout import rollout
    from placement_rl.studies.suite import DEFAULT_AGENTS, learn_case

    costs = for_mode(costs, mode)
    opts = {"cost_fn": lambda g, t: costs, "device_order": "fastest", "mode": mode, "objective": "throughput"}
    t0 = time.perf_counter()
    tr, best = learn_case(graph, topology, kind="pipeline", steps=steps, seed=seed, env_options=opts,
                          agent=DEFAULT_AGENTS["pipeline"], eval_samples=0)
    env = tr.make_eval_env()
    rng = np.random.default_rng(seed)
    pol = tr.policy
    pol.set_training_mode(False) if hasattr(pol, "set_training_mode") else pol.eval()
    plans = [best["value"]] if best.get("value") is not None else []
    for k in range(samples + 1):
        info = rollout(pol, env, deterministic=(k == 0), rng=rng, seed=seed + k)
        plans.append(info["plan"])
    dt = time.perf_counter() - t0
    batch = int(graph.meta.get("batch_size") or 1)
    scored = []
    for plan in plans:
        res = simulate_pipeline(graph, costs, topology, plan)
        scored.append((not res.feasible, res.meta["steady_time"] / batch, res.step_time, plan))
    infeasible, tps, step, plan = min(scored, key=lambda x: (x[0], x[1]))
    return Cell("learned (PipelineEnv)", tps, step, not infeasible, dt, int(tr.tracker.sim_calls), describe(plan),
                f"{steps} PPO steps")


__all__ = ["PLANNERS", "Cell", "hosts", "layer_graph", "learned_row", "measured_costs", "mixed", "operator_graph",
           "planner_table"]
