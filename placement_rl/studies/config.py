"""Study specs from ``conf/experiment/<name>.yaml``: the same files drive ``placement-rl train +experiment=<name>
--multirun`` (Hydra sweeps ``hydra.sweeper.params``) and the in-process study drivers (``scripts/ablate.py``).

An experiment file is a ``# @package _global_`` train config: its ``defaults`` pick the case (graph, topology,
env, agent, encoder), ``hydra.sweeper.params`` lists the swept keys (every key but ``seed`` makes the cells),
and a ``study`` block holds what only the driver reads::

    study:
      name: encoder                 # page / file stem: docs/ablation_<name>.md
      title: ...                    # page title
      question: ...                 # the question the study answers
      factor: encoder               # table column title
      judge: cell                   # or original (coarsening: judge on the uncoarsened graph)
      modes:
        quick: {budget: 600, seeds: [0, 1, 2], overrides: [graph=nmt, topology=2x_k80]}
        full:  {budget: 6000, seeds: [0, 1, 2], overrides: []}

``load_study(name, mode=...)`` composes the train config once per cell with Hydra's compose API and turns it
into typed ``Cell``s right away; no ``DictConfig`` leaves this module.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Mapping, Sequence

from placement_rl.agents.reinforce import ReinforceConfig
from placement_rl.studies.ablation import Cell, StudySpec
from placement_rl.agents.train import AgentSpec, EncoderSpec
from placement_rl.errors import ConfigError
from placement_rl.topology import conf_dir

__all__ = ["cell_from_config", "compose_train", "experiment_names", "load_study", "mode_settings", "study_block"]

MODES = ("quick", "full")


def experiment_names() -> list[str]:
    return sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))


def compose_train(overrides: Sequence[str], *, with_sweeper: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
    """The composed ``train`` config as plain containers, plus ``hydra.sweeper.params`` (key -> "a,b,c")."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = compose("train", overrides=list(overrides), return_hydra_config=with_sweeper)
            sweep = {}
            if with_sweeper:
                params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True) or {}
                sweep = {str(k): str(v) for k, v in params.items()}
                cfg = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
            return OmegaConf.to_container(cfg, resolve=True), sweep
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"cannot compose train config with {list(overrides)}: "
                          f"{str(exc).splitlines()[0]}") from None


def study_block(cfg: Mapping[str, Any], name: str) -> dict[str, Any]:
    block = cfg.get("study")
    if not isinstance(block, Mapping):
        raise ConfigError(f"experiment '{name}' has no 'study' block: add one (see placement_rl.studies.config)")
    return dict(block)


def mode_settings(block: Mapping[str, Any], name: str, mode: str) -> dict[str, Any]:
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    modes = block.get("modes") or {}
    if mode not in modes:
        raise ConfigError(f"experiment '{name}' defines no '{mode}' mode under study.modes")
    return dict(modes[mode] or {})


def cell_from_config(cfg: Mapping[str, Any], name: str) -> Cell:
    """A ``Cell`` from a composed train config (plain containers)."""
    topo = cfg["topology"]
    topology = str(topo.get("path") or topo.get("name") or "")
    if not topology:
        raise ConfigError("topology config has neither a path nor a name")
    agent = dict(cfg["agent"])
    try:
        if "reinforce" in agent:
            agent["reinforce"] = ReinforceConfig(**agent["reinforce"])
        agent_spec, encoder_spec = AgentSpec(**agent), EncoderSpec(**dict(cfg["encoder"]))
    except TypeError as exc:
        raise ConfigError(f"bad agent/encoder config: {exc}") from None
    options = {k: v for k, v in (cfg["env"].get("options") or {}).items() if v is not None}
    graph = {k: v for k, v in dict(cfg["graph"]).items() if not (k == "path" and v is None)}
    return Cell(name=name, graph=graph, topology=topology, env_id=str(cfg["env"]["id"]), env_options=options,
                agent=agent_spec, encoder=encoder_spec)


def _values(text: str) -> list[str]:
    return [v.strip() for v in str(text).split(",") if v.strip()]


def load_study(name: str, *, mode: str = "quick", budget: int | None = None, seeds: Sequence[int] | None = None,
               overrides: Sequence[str] = (), workers: int = 1, command: str = "") -> StudySpec:
    """The ``StudySpec`` of experiment ``name`` in ``mode``; ``budget``/``seeds`` replace the mode's,
    ``overrides`` (Hydra syntax) apply to every cell after the mode's own."""
    if name not in experiment_names():
        raise ConfigError(f"unknown experiment '{name}' (choose one of {', '.join(experiment_names())})")
    base = [f"+experiment={name}"]
    cfg, sweep = compose_train(base, with_sweeper=True)
    block = study_block(cfg, name)
    settings = mode_settings(block, name, mode)
    swept = {k: _values(v) for k, v in sweep.items() if k != "seed"}
    if not swept:
        raise ConfigError(f"experiment '{name}' sweeps nothing but seeds: list a key under hydra.sweeper.params")
    common = base + [str(o) for o in settings.get("overrides") or ()] + [str(o) for o in overrides]
    cells = []
    for combo in itertools.product(*swept.values()):
        pairs = list(zip(swept, combo))
        label = ",".join(v if len(pairs) == 1 else f"{k}={v}" for k, v in pairs)
        cell_cfg, _ = compose_train(common + [f"{k}={v}" for k, v in pairs])
        cells.append(cell_from_config(cell_cfg, label))
    chosen_seeds = tuple(int(s) for s in (seeds if seeds is not None else settings.get("seeds", (0, 1, 2))))
    return StudySpec(name=str(block.get("name", name)), factor=str(block.get("factor", ",".join(swept))),
                     cells=tuple(cells), seeds=chosen_seeds,
                     budget=int(budget if budget is not None else settings.get("budget", 1000)),
                     title=str(block.get("title", name)), question=str(block.get("question", "")),
                     judge=str(block.get("judge", "cell")), mode=mode, command=command, workers=workers)


def experiment_file(name: str) -> Path:
    return conf_dir() / "experiment" / f"{name}.yaml"
