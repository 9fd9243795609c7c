"""What the user gave on the command line, and the graph and topology a plan file brings with it.

``deploy`` and ``evaluate plan=<file>`` take a plan's own graph (the ``graph.json`` beside it, which ``place``,
``train`` and ``evaluate`` write) and the topology preset it names, unless the command line names another;
``evaluate plan=<file>`` also the mode the plan was priced in (``meta.mode``, which ``evaluate`` records) and the
objective it was planned for (``meta.objective``, which a stage planner records when it is not ``step``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from omegaconf import DictConfig

from placement_rl.cli.common import build_graph, build_topology
from placement_rl.graph import CompGraph


def task_overrides() -> list[str] | None:
    """The user's command-line overrides (Hydra's ``overrides.task``); None outside a Hydra run (``run(cfg)``)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None


def overridden(overrides: list[str] | None, group: str) -> bool:
    """Whether ``overrides`` set ``group`` (``group=``, ``group.<key>=``, ``group@...``); None (outside Hydra,
    where nothing says what was given) counts as set."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides or ()]
    return overrides is None or any(k == group or k.startswith((f"{group}.", f"{group}@")) for k in keys)


def plan_graph(cfg: DictConfig, plan_path: str, overrides: list[str] | None = None, *,
               always_beside: bool = False) -> CompGraph:
    """The ``graph.json`` beside ``plan_path`` when there is one and the command line names no graph (with
    ``always_beside`` unless it gives ``graph.path``); else the composed ``graph`` group."""
    beside = Path(plan_path).parent / "graph.json"
    use = not cfg.graph.get("path") if always_beside else not overridden(overrides, "graph")
    if use and beside.is_file():
        return CompGraph.from_json(beside)
    return build_graph(cfg.graph)


def plan_topology(cfg: DictConfig, plan_data: Mapping[str, Any], overrides: list[str] | None, *,
                  verb: tuple[str, str] = ("deploying", "deploys"), build: Callable[[Any], Any] = build_topology):
    """``(topology, line)``: the topology the plan file names when it is a preset and the user gave no ``topology``
    override, as ``export`` does; else the composed one (``build(cfg.topology)``). ``line`` says which was taken and
    why (None when nothing needs saying), ``verb`` its words. ``overrides`` None: the composed one."""
    from placement_rl.topology import load_topology, preset_names

    named = plan_data.get("topology")
    default = str(cfg.topology.get("name") or "")
    if overridden(overrides, "topology") or not isinstance(named, str) or named == default:
        return build(cfg.topology), None
    if named not in preset_names():
        return (build(cfg.topology), f"note: the plan names topology '{named}', which is not a preset: {verb[0]} on "
                                     f"the default '{default}' (give topology=<preset> or topology.path=<its YAML>)")
    return load_topology(named), (f"{verb[0]} on topology '{named}', the one the plan names (topology=<preset> "
                                  f"{verb[1]} on another)")


def fallback_hint(plan_data: Mapping[str, Any], topology, line: str | None, verb: str = "deploy") -> str | None:
    """Why ``topology`` is not the one the plan names, for an error the plan meets on it: ``plan_topology`` fell
    back to the composed one (its ``line`` a note) because the plan's topology is not a preset. None otherwise."""
    named = plan_data.get("topology")
    if not line or not line.startswith("note:") or not isinstance(named, str) or named == topology.name:
        return None
    return (f"the plan names topology '{named}', which is not a preset, so {verb} fell back to the default "
            f"'{topology.name}': give topology.path=<its YAML> (or topology=<preset>)")


def load_given(path: str, plan_data: Mapping[str, Any], graph, topology, line: str | None, verb: str = "deploy"):
    """The plan file at ``path`` loaded and checked against ``graph`` and ``topology``; an error it meets there on
    the default topology ``plan_topology`` fell back to (``line``) says so (``fallback_hint``)."""
    from placement_rl.errors import ConfigError, PlanError
    from placement_rl.plans import load_plan

    try:
        plan = load_plan(path, topology=topology, graph=graph)
        plan.validate(graph, topology)
    except (PlanError, ConfigError) as e:  # a plan made on a topology file rarely fits the default: say why it ran
        hint = fallback_hint(plan_data, topology, line, verb)
        if hint is None:
            raise
        raise type(e)(f"{e}; {hint}") from None
    return plan


# what one step of each mode is, as the lines below say it
STEP = {"train": "a training step", "inference": "a forward pass"}


def _recorded(cfg: DictConfig, plan_data: Mapping[str, Any], key: str, default: str,
              valid: Any) -> tuple[str, str | None]:
    """``(the composed cfg.<key>, the plan's meta.<key>)``, the latter None unless one of ``valid`` and different."""
    meta = plan_data.get("meta")
    recorded = meta.get(key) if isinstance(meta, Mapping) else None
    given = str(cfg.get(key) or default)
    return given, (recorded if recorded in valid and recorded != given else None)


def plan_mode(cfg: DictConfig, plan_data: Mapping[str, Any], overrides: list[str] | None) -> tuple[str, str | None]:
    """``(mode, line)``: the mode the plan file records (``meta.mode``) when the user gave no ``mode``, else the
    composed ``cfg.mode`` (default train). ``line`` says which was taken where the two differ (None otherwise).
    ``overrides`` None: the composed one."""
    mode, recorded = _recorded(cfg, plan_data, "mode", "train", STEP)
    if recorded is None:
        return mode, None
    if overridden(overrides, "mode"):
        return mode, (f"note: the plan was priced in mode {recorded} (its meta.mode), as {STEP[recorded]}; "
                      f"mode={mode} prices it as {STEP[mode]} here")
    return recorded, (f"evaluating in mode {recorded}, the one the plan was priced in (its meta.mode; mode={mode} "
                      f"prices it as {STEP[mode]})")


def plan_objective(cfg: DictConfig, plan_data: Mapping[str, Any],
                   overrides: list[str] | None) -> tuple[str, str | None]:
    """``(objective, line)`` as ``plan_mode`` for the objective: the plan's ``meta.objective`` (``throughput``
    where it was planned for steady-state time per batch) when the user gave no ``objective``."""
    from placement_rl.cost.modes import OBJECTIVES

    objective, recorded = _recorded(cfg, plan_data, "objective", "step", OBJECTIVES)
    if recorded is None:
        return objective, None
    if overridden(overrides, "objective"):
        return objective, (f"note: the plan was planned for objective {recorded} (its meta.objective); "
                           f"objective={objective} compares it by {objective} here")
    return recorded, (f"evaluating by objective {recorded}, the one the plan was planned for (its meta.objective)")
