"""Learned placer vs the baselines on the evaluate suite, under an equal simulator-call budget.

``learn_case(graph, topology, kind=..., steps=...)`` trains an agent on one (graph, topology) — op-level
placement (``PlacementEnv``, warm-started from the incumbent) or pipeline stage plans (``PipelineEnv``) — and
``run_case(case, ...)`` then gives every baseline of ``placement_rl.evaluate.compare`` the simulator calls the
training used (``Trainer.tracker.sim_calls``, the heuristics of the warm start included) and reports the ratio
of the learned plan's step time to the best baseline's, plus, where an exhaustive search fits
``optimum_budget``, the gap to the true optimum under the simulator.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placement_rl.agents.train import AgentSpec, EncoderSpec, Trainer, final_plan
from placement_rl import baselines
from placement_rl.cost import resolve_costs, simulate, simulate_pipeline
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError
from placement_rl.evaluate import Case, Row, best_row, compare, load_case
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import DeviceTopology

KINDS = {"placement": "placement_rl/PlacementEnv-v0", "pipeline": "placement_rl/PipelineEnv-v0"}
DEFAULT_ENV_OPTIONS = {"placement": {"initial_placement": "incumbent"}, "pipeline": {}}
DEFAULT_AGENTS = {"placement": AgentSpec(), "pipeline": AgentSpec(gamma=1.0, ent_coef=0.01)}


@dataclass(frozen=True)
class CaseResult:
    case: str
    kind: str  # "placement" | "pipeline"
    learned_time: float
    learned_feasible: bool
    plan_source: str  # "training" | "policy_greedy" | "policy_sampled"
    sim_calls: int
    steps: int
    train_seconds: float
    best_baseline: str | None
    best_baseline_time: float
    optimum_time: float | None  # exhaustive search under the simulator, where it fits the optimum budget
    rows: tuple[Row, ...] = field(repr=False)

    @property
    def ratio(self) -> float:
        """Learned / best baseline (NaN when no baseline found a feasible plan)."""
        return self.learned_time / self.best_baseline_time if self.best_baseline is not None else math.nan

    @property
    def optimum_gap(self) -> float | None:
        return None if self.optimum_time is None else self.learned_time / self.optimum_time - 1.0


def learn_case(graph: CompGraph, topology: DeviceTopology, *, kind: str = "placement", steps: int = 20000,
               seed: int = 0, agent: AgentSpec | None = None, encoder: EncoderSpec | None = None,
               env_options: dict[str, Any] | None = None, eval_samples: int = 4) -> tuple[Trainer, dict[str, Any]]:
    """Train on one case; returns the trainer and ``final_plan``'s result (the best plan found)."""
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    opts = dict(DEFAULT_ENV_OPTIONS[kind] if env_options is None else env_options)
    tr = Trainer(env_id=KINDS[kind], env_kwargs={"graph": graph, "topology": topology, **opts},
                 agent=agent or DEFAULT_AGENTS[kind], encoder=encoder or EncoderSpec(), seed=seed)
    tr.learn(steps, progress=False)
    return tr, final_plan(tr, samples=eval_samples, seed=seed)


def optimum(graph: CompGraph, costs: CostTable, topology: DeviceTopology, *, kind: str, budget: int,
            seed: int = 0) -> float | None:
    """Step time of the exhaustive optimum (``exhaustive`` / ``pp_exhaustive``), or None when it needs more
    than ``budget`` simulations."""
    try:
        if kind == "pipeline":
            plan = baselines.get_pipeline("pp_exhaustive")(graph, costs, topology, budget=budget, seed=seed)
            res = simulate_pipeline(graph, costs, topology, plan)
        else:
            p = baselines.get("exhaustive")(graph, costs, topology, budget=budget, seed=seed)
            res = simulate(graph, costs, topology, p)
    except ConfigError:
        return None
    return float(res.step_time) if res.feasible else None


def run_case(case: Case, *, kind: str = "placement", steps: int = 20000, seed: int = 0,
             agent: AgentSpec | None = None, encoder: EncoderSpec | None = None,
             env_options: dict[str, Any] | None = None, optimum_budget: int = 0,
             problem: tuple[CompGraph, DeviceTopology] | None = None) -> CaseResult:
    """Train on ``case`` and compare with the baselines at the training's simulator-call budget."""
    graph, topology = problem if problem is not None else load_case(case)
    start = time.perf_counter()
    tr, best = learn_case(graph, topology, kind=kind, steps=steps, seed=seed, agent=agent, encoder=encoder,
                          env_options=env_options)
    seconds = time.perf_counter() - start
    calls = int(tr.tracker.sim_calls)
    costs = resolve_costs(graph, topology)
    pipeline = kind == "pipeline"
    rows = compare(graph, costs, topology, budget=max(calls, 1), seed=seed, case=case.name,
                   partitioners=baselines.pipeline_names() if pipeline else ())
    base = best_row(rows, kind=kind)
    opt = optimum(graph, costs, topology, kind=kind, budget=optimum_budget, seed=seed) if optimum_budget else None
    return CaseResult(case=case.name, kind=kind, learned_time=float(best["step_time"]),
                      learned_feasible=bool(best["feasible"]), plan_source=str(best["source"]), sim_calls=calls,
                      steps=tr.num_timesteps, train_seconds=seconds, best_baseline=None if base is None else base.placer,
                      best_baseline_time=float("nan") if base is None else float(base.step_time),
                      optimum_time=opt, rows=tuple(rows))


def summarize(results: list[CaseResult]) -> dict[str, Any]:
    """Counts against the issue's targets: ratio <= 1.00 everywhere, <= 0.95 on half, within 3% of optima."""
    ratios = [r.ratio for r in results if np.isfinite(r.ratio)]
    gaps = [r.optimum_gap for r in results if r.optimum_gap is not None]
    return {"cases": len(results), "with_feasible_baseline": len(ratios),
            "at_most_1.00": sum(x <= 1.0 + 1e-9 for x in ratios), "at_most_0.95": sum(x <= 0.95 for x in ratios),
            "with_optimum": len(gaps), "within_3pct_of_optimum": sum(g <= 0.03 for g in gaps)}
