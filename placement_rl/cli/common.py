"""Shared CLI plumbing: Hydra app wrapper (one-line errors, exit code 2), graph/topology from config."""

from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from placement_rl.errors import ConfigError, PlacementRLError
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
    """Remove the run directory (and its then empty parents under the working directory) if the job wrote
    nothing of its own (only Hydra's config and log)."""
    try:
        out = output_dir()
    except Exception:  # noqa: BLE001 - no Hydra context: nothing to clean
        return
    own = [p for p in out.iterdir() if p.name not in (".hydra",) and not p.name.endswith(".log")]
    if own:
        return
    shutil.rmtree(out, ignore_errors=True)
    cwd = Path.cwd().resolve()
    parent = out.resolve().parent
    while parent != cwd and cwd in parent.parents:
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
        parent = parent.parent


_FLAGS_WITH_VALUE = ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp", "--experimental-rerun")


def _split_args(args: list[str]) -> tuple[list[str], list[str], bool]:
    """(overrides, --config-dir values, whether other Hydra flags such as --help or -m are present)."""
    overrides, dirs, other = [], [], False
    it = iter(args)
    for a in it:
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if name in ("--config-dir", "-cd"):
                dirs.append(value if eq else next(it, ""))
            else:
                other = True
                if name in _FLAGS_WITH_VALUE and not eq:
                    next(it, None)
        else:
            overrides.append(a)
    return overrides, dirs, other


def preflight(config_name: str, args: list[str]) -> list[str]:
    """Check a command line before Hydra runs (no run directory yet): group options exist, the composed config
    fits ``schema``; returns overrides to add (``schema.implied_overrides``). Raises ``ConfigError``."""
    from placement_rl.cli import schema

    overrides, dirs, other = _split_args(args)
    schema.set_config_dirs(dirs)
    for o in overrides:
        schema.check_group_choice(o)
    extra = schema.implied_overrides(config_name, overrides)
    if other or any("," in o.split("=", 1)[-1] and not o.split("=", 1)[-1].startswith("[") for o in overrides):
        return extra  # --help, --cfg, multirun sweeps: Hydra handles them; each job is checked in the task
    cfg = _compose(config_name, overrides + extra, dirs)
    schema.validate(config_name, cfg)
    return extra


def _compose(config_name: str, overrides: list[str], dirs: list[str]) -> dict:
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    path = config_path()
    init = (initialize_config_module(path[len("pkg://"):], version_base="1.3") if path.startswith("pkg://")
            else initialize_config_dir(path, version_base="1.3"))
    search = [f"hydra.searchpath=[{','.join('file://' + str(Path(d).resolve()) for d in dirs)}]"] if dirs else []
    try:
        with init:
            cfg = compose(config_name, overrides=[*search, *overrides])
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_one_line(exc)) from None


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).splitlines()[0] not in text:
        text += f" ({str(cause).splitlines()[0].strip()})"
    if len(lines) > 1 and lines[1].startswith("To append"):
        text += f"; {lines[1]}"
    return text


def hydra_app(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], None]]:
    """Turn ``run(cfg)`` into a Hydra ``main``. The command line is checked first (``preflight``: group options,
    typed values, see ``placement_rl.cli.schema``); domain errors become one line on stderr and exit code 2,
    and a config that fails to compose (bad override) also exits 2."""
    import hydra

    def wrap(run: Callable[[DictConfig], Any]) -> Callable[[], None]:
        @functools.wraps(run)
        def task(cfg: DictConfig) -> None:
            global _TASK_STARTED
            _TASK_STARTED = True
            try:
                from placement_rl.cli import schema

                schema.validate(config_name, OmegaConf.to_container(cfg, resolve=True))
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
                sys.argv += preflight(config_name, sys.argv[1:])
            except PlacementRLError as exc:
                fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
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


def warm_up(policy) -> float:
    """Compile or load the numba kernels before anything is timed (``agents.constructive_eval.warm_kernels``); say
    so when it took long (the first run after an install). Returns its seconds."""
    from agents.constructive_eval import warm_kernels

    seconds = warm_kernels(policy)
    if seconds > 2.0:
        print(f"compiled the simulator and decode kernels in {seconds:.1f} s (first run after an install; numba "
              f"caches them)")
    return seconds
