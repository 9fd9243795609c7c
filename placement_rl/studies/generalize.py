"""Generalisation: train one policy on a family of graphs and topologies, place held-out ones zero-shot.

``FamilySpec`` names the training graphs (synthetic draws plus zoo models), the training topologies, and the
held-out graphs and topologies. ``train_family`` trains on every (graph, topology) pair of the family (one drawn
per episode), ``evaluate_held_out`` places each held-out pair with one forward pass plus best-of-``samples``
(``agents.rollout.zero_shot_place``) and compares it with the baselines at the same simulator-call budget, and
``run_family`` does both and writes ``checkpoint.pt``, ``generalization.csv`` / ``.md`` and ``metrics.json``.

Graph names: a zoo model (``"nmt"``, coarsened as ``placement-rl evaluate`` does) or
``"synthetic:<family>:<num_nodes>:<seed>"``. Observation padding covers every topology (``max_devices``), so
the policy meets held-out topologies with up to that many devices; graphs of any size are placed zero-shot.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from placement_rl.agents.rollout import load_policy_for, zero_shot_place
from placement_rl.agents.train import AgentSpec, EncoderSpec, Trainer
from placement_rl.envs.warm_start import make_env
from placement_rl.envs.graph_source import GraphSource
from placement_rl.errors import ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.io import atomic_write_text
from placement_rl.topology import DeviceTopology, load_topology

PLACE = "placement_rl/PlacementEnv-v0"


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """What to train on and what to hold out (see the module docstring for graph names)."""

    synthetic: tuple[str, ...] = ("layered", "series_parallel", "transformer_like", "cnn_like")
    synthetic_per_family: int = 8  # fixed draws per family, sizes spread over num_nodes
    num_nodes: tuple[int, int] = (16, 48)
    zoo: tuple[str, ...] = ("gpt", "resnet18", "inception")
    topologies: tuple[str, ...] = ("4x_v100_nvlink", "2x_k80")
    held_out: tuple[str, ...] = ("nmt", "moe", "resnet50", "synthetic:layered:120:7")
    held_out_topologies: tuple[str, ...] = ("4x_v100_pcie", "8x_a100_nvswitch")
    initial_placement: str = "best_single"
    samples: int = 16  # zero-shot: greedy + this many sampled decodings, scored by the simulator

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, samples: int | None = None) -> "FamilySpec":
        """From a plain mapping (the ``trainer.family`` config); lists become tuples."""
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(data).items()}
        if samples is not None:
            fields["samples"] = int(samples)
        try:
            return cls(**fields)
        except TypeError as exc:
            raise ConfigError(f"bad trainer.family config: {exc}") from None

    def __post_init__(self) -> None:
        if not self.synthetic and not self.zoo:
            raise ConfigError("a training family needs synthetic families or zoo models (both are empty)")
        if not self.topologies:
            raise ConfigError("a training family needs at least one topology")
        lo, hi = self.num_nodes
        if not 3 <= lo <= hi:
            raise ConfigError(f"num_nodes must be a range (lo, hi) with 3 <= lo <= hi, got {self.num_nodes}")


def build_graph(name: str) -> CompGraph:
    """A zoo model (coarsened with the default options) or ``synthetic:<family>:<num_nodes>[:<seed>]``."""
    from placement_rl.graph.spec import graph_from_spec

    if name.startswith("synthetic:"):
        parts = name.split(":")
        if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts[2:]):
            raise ConfigError(f"synthetic graph name '{name}' must read synthetic:<family>:<num_nodes>[:<seed>]")
        return graph_from_spec({"source": "synthetic", "family": parts[1], "num_nodes": int(parts[2]),
                                "seed": int(parts[3]) if len(parts) == 4 else 0})
    return graph_from_spec({"source": "zoo", "name": name, "overrides": {},
                            "coarsen": {"enabled": True, "depth": None, "max_nodes": None}})


def training_graphs(spec: FamilySpec, *, seed: int) -> list[CompGraph]:
    from placement_rl.graph import synthetic

    lo, hi = spec.num_nodes
    graphs = []
    for f_idx, fam in enumerate(spec.synthetic):
        for k in range(spec.synthetic_per_family):
            n = lo + (hi - lo) * k // max(spec.synthetic_per_family - 1, 1)
            graphs.append(synthetic.sample(fam, num_nodes=n, seed=seed * 1000 + f_idx * 100 + k))
    return graphs + [build_graph(z) for z in spec.zoo]


def train_family(spec: FamilySpec, *, steps: int, agent: AgentSpec = AgentSpec(),
                 encoder: EncoderSpec = EncoderSpec(), seed: int = 0, progress: bool = True,
                 tensorboard_dir: str | None = None, config: dict[str, Any] | None = None) -> Trainer:
    """Train one policy on every (graph, topology) pair of the family."""
    topologies = [load_topology(t) for t in spec.topologies]
    max_devices = max(t.num_devices for t in topologies + [load_topology(t) for t in spec.held_out_topologies])
    source = GraphSource.from_graphs(training_graphs(spec, seed=seed), topologies, name="family")
    tr = Trainer(env_id=PLACE, env_kwargs={"graph": source, "max_devices": max_devices,
                                           "initial_placement": spec.initial_placement},
                 agent=agent, encoder=encoder, seed=seed, tensorboard_dir=tensorboard_dir,
                 config={**(config or {}), "family": asdict(spec)})
    tr.learn(steps, progress=progress)
    return tr


@dataclass(frozen=True)
class HeldOutResult:
    graph: str
    nodes: int
    topology: str
    held_out: str  # "graph", "topology" or "both"
    zero_shot_time: float
    feasible: bool
    sim_calls: int
    seconds: float
    single_device_time: float
    best_baseline: str | None
    best_baseline_time: float

    @property
    def ratio(self) -> float:
        return self.zero_shot_time / self.best_baseline_time if self.best_baseline else math.nan


def evaluate_held_out(trainer: Trainer, spec: FamilySpec, *, seed: int = 0) -> list[HeldOutResult]:
    """Zero-shot placement of held-out graphs on every topology and of training graphs on held-out topologies,
    each compared with the baselines given the same number of simulator calls."""
    from placement_rl.cost import resolve_costs
    from placement_rl.evaluate import best_row, compare

    max_devices = trainer.obs_info()["max_devices"]
    state = trainer.policy.state_dict()
    pairs = [(g, t, "both" if t in spec.held_out_topologies else "graph") for g in spec.held_out
             for t in (*spec.topologies, *spec.held_out_topologies)]
    pairs += [(g, t, "topology") for g in spec.zoo for t in spec.held_out_topologies]
    graphs: dict[str, CompGraph] = {}
    out = []
    for name, topo_name, kind in pairs:
        graph = graphs.setdefault(name, build_graph(name))
        topology: DeviceTopology = load_topology(topo_name)
        env = make_env(PLACE, {"graph": graph, "topology": topology, "max_devices": max_devices})
        policy = load_policy_for(env, state, trainer.encoder.kwargs())
        res = zero_shot_place(policy, env, samples=spec.samples, seed=seed)
        rows = compare(graph, resolve_costs(graph, topology), topology, budget=max(res.sim_calls, 1), seed=seed,
                       case=f"{name}/{topo_name}")
        base = best_row(rows)
        single = next(r.step_time for r in rows if r.placer == "single_device")
        out.append(HeldOutResult(graph=name, nodes=graph.num_nodes, topology=topo_name, held_out=kind,
                                 zero_shot_time=res.step_time, feasible=res.feasible, sim_calls=res.sim_calls,
                                 seconds=res.seconds, single_device_time=float(single),
                                 best_baseline=None if base is None else base.placer,
                                 best_baseline_time=float("nan") if base is None else float(base.step_time)))
    return out


def write_results(results: list[HeldOutResult], out: Path) -> dict[str, Any]:
    """``generalization.csv`` and ``generalization.md`` in ``out``; returns summary metrics."""
    head = ["graph", "nodes", "topology", "held_out", "zero_shot_ms", "feasible", "speedup_vs_single",
            "best_baseline", "best_baseline_ms", "ratio_to_best_baseline", "sim_calls", "seconds"]
    lines = [",".join(head)]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        vals = [r.graph, r.nodes, r.topology, r.held_out, f"{r.zero_shot_time * 1e3:.3f}", r.feasible,
                f"{r.single_device_time / r.zero_shot_time:.3f}", r.best_baseline or "-",
                f"{r.best_baseline_time * 1e3:.3f}", f"{r.ratio:.4f}", r.sim_calls, f"{r.seconds:.3f}"]
        lines.append(",".join(str(v) for v in vals))
        md.append("| " + " | ".join(str(v) for v in vals) + " |")
    atomic_write_text(out / "generalization.csv", "\n".join(lines) + "\n")
    atomic_write_text(out / "generalization.md", "# Zero-shot placement of held-out graphs / topologies\n\n"
                      + "\n".join(md) + "\n")
    ratios = [r.ratio for r in results if np.isfinite(r.ratio)]
    return {"held_out_pairs": len(results), "feasible": sum(r.feasible for r in results),
            "mean_ratio_to_best_baseline": float(np.mean(ratios)) if ratios else None,
            "mean_speedup_vs_single": float(np.mean([r.single_device_time / r.zero_shot_time for r in results])),
            "max_zero_shot_seconds": max((r.seconds for r in results), default=0.0)}


def run_family(spec: FamilySpec, *, steps: int, out: Path, agent: AgentSpec = AgentSpec(),
               encoder: EncoderSpec = EncoderSpec(), seed: int = 0, progress: bool = True,
               tensorboard: bool = False, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train on the family, evaluate held-out pairs, write the artifacts into ``out``; returns the metrics."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tr = train_family(spec, steps=steps, agent=agent, encoder=encoder, seed=seed, progress=progress,
                      tensorboard_dir=str(out / "tb") if tensorboard else None, config=config)
    tr.save(out / "checkpoint.pt")
    results = evaluate_held_out(tr, spec, seed=seed)
    metrics = {"mode": "family", "agent": agent.algo, "encoder": encoder.name, "seed": seed,
               "total_steps": tr.num_timesteps, "episodes": tr.tracker.episodes, "sim_calls": tr.tracker.sim_calls,
               "train_seconds": tr.train_seconds, "family": asdict(spec), **write_results(results, out)}
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1, default=float))
    return metrics
