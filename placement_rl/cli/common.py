"""Shared CLI plumbing: Hydra app wrapper (one-line errors, exit code 2), graph/topology from config."""

from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from placement_rl.errors import PlacementRLError
from placement_rl.graph.ir import CompGraph
from placement_rl.topology import CONF_PACKAGE, DeviceTopology, conf_dir, detect_local, load_topology, source_conf_dir

_TASK_STARTED = False


def output_dir() -> Path:
    """The Hydra run directory of the current job."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def config_path() -> str:
    """Hydra's primary config path: the checkout's ``conf/`` (or ``$PLACEMENT_RL_CONF``), else the installed
    package through Hydra's ``pkg://`` search path. A user's ``--config-dir`` is searched as well."""
    import os

    if os.environ.get("PLACEMENT_RL_CONF") or source_conf_dir() is not None:
        return str(conf_dir())
    return f"pkg://{CONF_PACKAGE}"


def fail(message: str) -> None:
    """Print one line on stderr and exit with code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _discard_run_dir() -> None:
    """Remove the run directory if the job wrote nothing of its own (only Hydra's config and log)."""
    try:
        out = output_dir()
    except Exception:  # noqa: BLE001 - no Hydra context: nothing to clean
        return
    own = [p for p in out.iterdir() if p.name not in (".hydra",) and not p.name.endswith(".log")]
    if not own:
        shutil.rmtree(out, ignore_errors=True)


def hydra_app(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], None]]:
    """Turn ``run(cfg)`` into a Hydra ``main``; domain errors become one line on stderr and exit code 2,
    and a config that fails to compose (bad override) also exits 2."""
    import hydra

    def wrap(run: Callable[[DictConfig], Any]) -> Callable[[], None]:
        @functools.wraps(run)
        def task(cfg: DictConfig) -> None:
            global _TASK_STARTED
            _TASK_STARTED = True
            try:
                run(cfg)
            except PlacementRLError as exc:
                _discard_run_dir()
                fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
                sys.exit(130)

        hydra_main = hydra.main(config_path=config_path(), config_name=config_name, version_base="1.3")(task)

        def main() -> None:
            try:
                hydra_main()
            except SystemExit as exc:
                if exc.code == 1 and not _TASK_STARTED:  # Hydra could not compose the config
                    sys.exit(2)
                raise

        return main

    return wrap


def to_container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def build_graph(gcfg: DictConfig) -> CompGraph:
    """A graph from the ``graph`` config group (see ``placement_rl.graph.spec``)."""
    from placement_rl.graph.spec import graph_from_spec

    return graph_from_spec(to_container(gcfg))


def save_plan(value, graph: CompGraph, topology: DeviceTopology, out: Path):
    """Write a learned result (a StagePlan, or a device array) as ``plan.json`` / ``placement.json`` next to
    ``graph.json`` (so ``placement-rl deploy plan=<that file>`` finds its graph); return (plan, file name)."""
    import numpy as np

    from placement_rl.plans import Placement, StagePlan

    graph.to_json(out / "graph.json")
    if isinstance(value, StagePlan):
        value.to_json(out / "plan.json", graph=graph, topology=topology)
        return value, "plan.json"
    plan = Placement(np.asarray(value)[: graph.num_nodes])
    plan.to_json(out / "placement.json", graph=graph, topology=topology)
    return plan, "placement.json"


def build_topology(tcfg: DictConfig | str) -> DeviceTopology:
    """A topology from the ``topology`` config group (a preset's YAML content), ``topology.path``, or local."""
    if isinstance(tcfg, str):
        return load_topology(tcfg)
    if tcfg.get("path"):
        return load_topology(str(tcfg.path))
    if tcfg.get("detect", False):
        return detect_local()
    data = {k: v for k, v in to_container(tcfg).items() if k != "path"}
    return DeviceTopology.from_dict(data, where=f"topology '{data.get('name', '?')}'")
