"""Shared CLI plumbing: Hydra app wrapper (one-line errors, exit code 2), graph/topology from config."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from omegaconf import DictConfig, OmegaConf

from placement_rl.cli.jobs import OWN_LAUNCHERS, JobFailed, SweepExit, fail, plain_numbers, plural  # noqa: F401
from placement_rl.cli.override_keys import other_source, own_groups_only, unknown_key, added_keys
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


def _launcher_reports_failures() -> bool:
    """Whether this job runs in a multirun, whose launcher reports a failure with the job's number and overrides
    while the other jobs go on: ``placement_rl.cli.sweep``'s own, or any other (Hydra's basic one, joblib) through
    ``sweep.failures_reported``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        hc = HydraConfig.get() if HydraConfig.initialized() else None
        return hc is not None and hc.mode == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001 - no Hydra context: a plain run
        return False


def _job_fail(line: str) -> None:
    """``fail(line)``, or ``JobFailed`` for the sweep launcher to report in its own line."""
    if _launcher_reports_failures():
        raise JobFailed(plain_numbers(line))
    fail(line)


def _strict(x: Any) -> Any:
    import numpy as np

    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_strict(v) for v in (x.tolist() if isinstance(x, np.ndarray) else x)]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as strict JSON (NaN and infinities as null, numpy scalars as numbers), atomically."""
    from placement_rl.graph.io import atomic_write_text

    return atomic_write_text(path, json.dumps(_strict(data), indent=1, allow_nan=False, default=float))


class Phases:
    """Progress of a command's long phases on stdout: a line when one starts (with ``detail``), a line with its
    seconds when it ends (``with phases("greedy placement") as note: ...; note.append("12.3 ms")``). A phase given
    ``status`` (a function returning e.g. ``"5 of 16 done"``) also prints ``<label>: <status>, <s> s so far`` every
    ``every`` seconds while it runs (one whose work reports nothing itself for minutes)."""

    def __init__(self, enabled: bool = True, every: float = 10.0):
        self.enabled, self.every = enabled, every

    @contextlib.contextmanager
    def __call__(self, label: str, detail: str = "", status: Callable[[], str] | None = None) -> Iterator[list[str]]:
        note: list[str] = []
        if self.enabled:
            print(f"{label} ..." + (f" ({detail})" if detail else ""), flush=True)
        t0 = time.perf_counter()
        with self._beat(label, status, t0):
            yield note
        if self.enabled:
            print(f"{label}: {time.perf_counter() - t0:.1f} s" + (f", {'; '.join(note)}" if note else ""), flush=True)

    @contextlib.contextmanager
    def _beat(self, label: str, status: Callable[[], str] | None, t0: float) -> Iterator[None]:
        if not self.enabled or status is None:
            yield
            return
        with heartbeat(label, status, self.every, start=t0):
            yield


@contextlib.contextmanager
def heartbeat(label: str, status: Callable[[], str], every: float = 10.0, *, start: float | None = None
              ) -> Iterator[None]:
    """``<label>: <status()>, <s> s so far`` on stdout every ``every`` seconds while the block runs (nothing where
    it ends sooner), ``s`` counted from ``start`` (a ``time.perf_counter()`` value; default: now): work that reports
    nothing itself for minutes (a phase of ``Phases``, ``inspect``'s capture of a large model)."""
    import threading

    t0 = time.perf_counter() if start is None else start
    stop = threading.Event()

    def beat() -> None:  # a daemon thread: it prints between the work's own steps (it needs the GIL)
        while not stop.wait(every):
            print(f"{label}: {status()}, {time.perf_counter() - t0:.0f} s so far", flush=True)

    thread = threading.Thread(target=beat, name="placement-rl-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


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


def _split_args(args: list[str]) -> tuple[list[str], list[str], set[str]]:
    """(overrides, --config-dir values, the other Hydra flags such as --help or -m)."""
    overrides, dirs, flags = [], [], set()
    it = iter(args)
    for a in it:
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if name in ("--config-dir", "-cd"):
                dirs.append(value if eq else next(it, ""))
            else:
                flags.add(name)
                if name in _FLAGS_WITH_VALUE and not eq:
                    next(it, None)
        else:
            overrides.append(a)
    return overrides, dirs, flags


_MULTIRUN = {"-m", "--multirun"}
_HYDRA_MODES = {"-m": "-m", "--multirun": "-m", "-r": "--run", "--run": "--run", "-c": "--cfg", "--cfg": "--cfg",
                "-i": "--info", "--info": "--info", "-sc": "--shell-completion",
                "--shell-completion": "--shell-completion"}
_SWEEP_CHECKS = 64  # composes a multirun's check may take (each ~0.1 s); the jobs check the rest themselves


def multirun_first(args: list[str]) -> list[str]:
    """``-m`` / ``--multirun`` moved before the overrides: Hydra's parser refuses overrides that follow it
    (``+experiment=x --multirun seed=0,1``, the form the experiment files' headers show)."""
    return [a for a in args if a in _MULTIRUN] + [a for a in args if a not in _MULTIRUN]


def preflight(config_name: str, args: list[str]) -> list[str]:
    """Check a command line before Hydra runs (no run directory yet): group options exist (each value of a
    multirun sweep), the composed config fits ``schema`` (once per sweep value), the run folder can be written;
    returns overrides to add (``schema.implied_overrides``). Raises ``ConfigError``."""
    from placement_rl.cli import schema

    overrides, dirs, flags = _split_args(args)
    modes = sorted({_HYDRA_MODES[f] for f in flags if f in _HYDRA_MODES})
    if len(modes) > 1:  # Hydra's own refusal is a traceback
        raise ConfigError(f"{' and '.join(modes)} cannot be given together (Hydra takes one of -m, --run, --cfg, "
                          f"--info, --shell-completion)" + ("; --cfg shows the config of one job: drop -m and give "
                                                            "each swept key one value" if "--cfg" in modes else ""))
    schema.set_config_dirs(dirs)
    own_groups_only(config_name, overrides)
    for o in overrides:
        schema.check_override(config_name, o)
    for line in added_keys(config_name, overrides):
        print(line, file=sys.stderr, flush=True)
    extra = schema.implied_overrides(config_name, overrides)
    if flags - _MULTIRUN:
        return extra  # --help, --cfg, ...: Hydra handles them
    multirun = bool(flags & _MULTIRUN)
    sweeps = {i: v for i, o in enumerate(overrides) if (v := schema.sweep_values(o)) is not None}
    if sweeps and not multirun:
        o = overrides[min(sweeps)]
        raise ConfigError(f"{o} lists several values: add -m to sweep over them, write {o.split('=', 1)[0]}=[...] "
                          "for a list, or quote the value for a string")
    if not all(sweeps.values()):
        return extra  # glob(): Hydra expands it against the options; each job is checked in the task
    base = [f"{o.split('=', 1)[0]}={sweeps[i][0]}" if i in sweeps else o for i, o in enumerate(overrides)]
    jobs = [base] + [base[:i] + [f"{overrides[i].split('=', 1)[0]}={v}"] + base[i + 1:]
                     for i, values in sweeps.items() for v in values[1:]]
    for k, job in enumerate(jobs[:_SWEEP_CHECKS]):
        cfg, hydra_dirs = _compose(config_name, job + extra, dirs)
        if k == 0:
            key = "sweep" if multirun else "run"
            schema.check_output_dir(_static_dir(str(hydra_dirs[key]["dir"])), f"hydra.{key}.dir")
        schema.validate(config_name, cfg)
    return extra


def _static_dir(raw: str) -> Path:
    """The folder of a Hydra run-dir pattern that exists before any interpolation (``outputs/place/${now:...}``
    -> ``outputs/place``)."""
    if "${" not in raw:
        return Path(raw)
    prefix = raw.split("${", 1)[0]
    return Path(prefix) if prefix.endswith("/") else Path(prefix or ".").parent


def _compose(config_name: str, overrides: list[str], dirs: list[str]) -> tuple[dict, dict]:
    """The composed config (resolved) and Hydra's ``run`` / ``sweep`` settings (unresolved)."""
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from placement_rl.cli.configs import register_configs

    register_configs(config_name)
    path = config_path()
    init = (initialize_config_module(path[len("pkg://"):], version_base="1.3") if path.startswith("pkg://")
            else initialize_config_dir(path, version_base="1.3"))
    search = [f"hydra.searchpath=[{','.join('file://' + str(Path(d).resolve()) for d in dirs)}]"] if dirs else []
    try:
        with init:
            cfg = compose(config_name, overrides=[*search, *overrides], return_hydra_config=True)
        OmegaConf.set_readonly(cfg, False)
        with open_dict(cfg):
            hydra_cfg = cfg.pop("hydra")
        dirs_cfg = {key: OmegaConf.to_container(hydra_cfg[key], resolve=False) for key in ("run", "sweep")}
        return OmegaConf.to_container(cfg, resolve=True), dirs_cfg
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(other_source(exc) or unknown_key(exc, config_name, overrides) or _one_line(exc)) from None


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).splitlines()[0] not in text:
        text += f" ({str(cause).splitlines()[0].strip()})"
    if len(lines) > 1 and lines[1].startswith("To append"):
        text += f"; {lines[1]}"
    return text


def _os_error_line(exc: OSError) -> str:
    path = exc.filename2 if getattr(exc, "filename2", None) else exc.filename
    return f"{path}: {exc.strerror}" if path and exc.strerror else (str(exc).splitlines() or [type(exc).__name__])[0]


DRIVER_PID = "PLACEMENT_RL_DRIVER_PID"


def in_job_worker() -> bool:
    """Whether this process runs a job for a command started in another (a joblib launcher's worker), whose
    Ctrl-C the driver reports as ``interrupted: <done> of <total> sweep jobs finished``."""
    pid = os.environ.get(DRIVER_PID)
    return pid is not None and pid != str(os.getpid())


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C a command accounts for: ``hydra_app`` prints its line (``str(exc)``) in place of ``interrupted``.
    ``kept``: the command keeps the files it wrote, so an earlier run's files it replaced stay set aside (put back
    beside them they would pass for this run's results), where the line says."""

    def __init__(self, line: str, kept: bool = False):
        super().__init__(line)
        self.kept = kept


@contextlib.contextmanager
def files_on_interrupt(written: list[str], planned: Iterable[str]) -> Iterator[None]:
    """A Ctrl-C (or SIGTERM: ``hydra_app(sigterm=True)``) in the block becomes ``Interrupted`` naming the files
    written so far (``written``: the caller appends each as it writes it), kept, and those of ``planned`` (names or
    shell patterns) not: ``interrupted: wrote checkpoint.pt, placement.json; metrics.json, comparison.* not
    written``, and where an earlier run's files set aside are (``run_folder.held_note``)."""
    from fnmatch import fnmatch

    from placement_rl.cli.run_folder import held_note

    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        if not written:
            raise Interrupted("interrupted: no file written") from None
        left = [f for f in planned if not any(fnmatch(w, f) for w in written)]
        raise Interrupted(f"interrupted: wrote {', '.join(written)}"
                          + (f"; {', '.join(left)} not written" if left else "") + held_note(), kept=True) from None


def hydra_app(config_name: str, *, writes: Iterable[str] = (), replaces: Iterable[str] = (), sigterm: bool = False
              ) -> Callable[[Callable[[DictConfig], Any]], Callable[[], None]]:
    """Turn ``run(cfg)`` into a Hydra ``main``. The command line is checked first (``preflight``: group options,
    typed values, see ``placement_rl.cli.schema``; the run folder); domain errors become one line on stderr and
    exit code 2, and a config that fails to compose (bad override) also exits 2. ``writes``: file names the
    command writes in its run folder, refused before any work where a folder of that name is in the way; a file
    it still cannot write is one line as well. ``replaces``: every file the command may write there (shell
    patterns such as ``timeline_*.png``, ``sub/name`` in a sub-folder): those an earlier run left in a run folder
    given again are set aside before it runs, with a line naming them (``run_folder.set_aside``; put back where it
    fails), so that one folder never holds two runs' results; that run's ``.hydra/`` and log too (given ``sigterm``
    as well), before Hydra writes this run's (``run_folder.set_aside_hydra``). A Ctrl-C exits 130 with
    ``interrupted`` on stderr (an ``Interrupted``: its own line; one that ``kept`` its files leaves the earlier
    run's set aside); so does SIGTERM given ``sigterm`` (``signals.sigterm_as_interrupt``)."""
    import hydra

    writes, replaces = tuple(writes), tuple(replaces)
    before: list = []  # an earlier run's Hydra files, set aside by ``main`` before Hydra writes this run's

    def wrap(run: Callable[[DictConfig], Any]) -> Callable[[], None]:
        @functools.wraps(run)
        def task(cfg: DictConfig) -> None:
            global _TASK_STARTED
            _TASK_STARTED = True
            from placement_rl.cli.signals import sigterm_as_interrupt

            with sigterm_as_interrupt(worker=in_job_worker()) if sigterm else contextlib.nullcontext():
                job(cfg)

        def job(cfg: DictConfig) -> None:
            try:
                from placement_rl.cli import schema

                schema.validate(config_name, OmegaConf.to_container(cfg, resolve=True))
                schema.check_not_folders(output_dir(), writes)
                from placement_rl.cli.run_folder import config_paths, listed, set_aside

                earlier = set_aside(output_dir(), replaces, keep=config_paths(cfg),
                                    into=before.pop() if before else None)  # with its Hydra files
                if own := [n for n in earlier.names if n not in earlier.hydra]:
                    print(f"{output_dir()} held an earlier {config_name} run's files, replaced (this run writes its "
                          "own; they come back if it fails, or if it is interrupted before it wrote any: else its "
                          f"interrupt line says where they are): {listed(own)}", flush=True)
                try:
                    run(cfg)
                except BaseException as exc:
                    if not getattr(exc, "kept", False):
                        earlier.restore()  # a failed run keeps the earlier results
                    raise
                earlier.drop()
            except PlacementRLError as exc:
                _discard_run_dir()
                _job_fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            except OSError as exc:  # a file it cannot write after all (disk full, a folder in the way)
                _discard_run_dir()
                _job_fail(_os_error_line(exc))
            except KeyboardInterrupt as exc:
                if not in_job_worker():  # a launcher's worker process: the sweep's driver says it, once
                    print(str(exc) if isinstance(exc, Interrupted) else "interrupted", file=sys.stderr)
                sys.exit(130)

        hydra_main = hydra.main(config_path=config_path(), config_name=config_name, version_base="1.3")(task)

        def main() -> None:
            from placement_rl.cli.configs import register_configs

            register_configs(config_name)  # its structured config in Hydra's ConfigStore (schema/, base/)
            os.environ[DRIVER_PID] = str(os.getpid())  # inherited by a launcher's worker processes (joblib)
            sys.argv[1:] = multirun_first(sys.argv[1:])
            try:
                sys.argv += preflight(config_name, sys.argv[1:])
                if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
                    from placement_rl.cli.help import help_override
                    from placement_rl.cli.main import COMMANDS

                    sys.argv[1:1] = help_override(config_name, COMMANDS[config_name][1])  # before any flag
            except PlacementRLError as exc:
                fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            from placement_rl.cli.run_folder import set_aside_hydra
            from placement_rl.cli.sweep import failures_reported

            overrides, _, flags = _split_args(sys.argv[1:])
            before[:] = set_aside_hydra(task, overrides) if (replaces or sigterm) and not flags else []
            try:
                with failures_reported():
                    hydra_main()
            except SystemExit as exc:
                if exc.code == 1 and not _TASK_STARTED and not isinstance(exc, SweepExit):  # no config composed
                    sys.exit(2)
                raise
            except KeyboardInterrupt:  # a multirun's launcher waiting for its jobs
                print("interrupted", file=sys.stderr)
                sys.exit(130)
            finally:
                while before:  # its run never took them (refused before it began): back
                    before.pop().restore()

        return main

    return wrap


def to_container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def build_graph(gcfg: DictConfig) -> CompGraph:
    """A graph from the ``graph`` config group (see ``placement_rl.graph.spec``)."""
    from placement_rl.graph.spec import graph_from_spec

    return graph_from_spec(to_container(gcfg))


def save_plan(value, graph: CompGraph, topology: DeviceTopology, out: Path, costs: Any = None):
    """Write a result (a StagePlan, or a device array) as ``plan.json`` / ``placement.json`` next to ``graph.json``
    (so ``placement-rl deploy plan=<that file>`` finds its graph); with ``costs``, the file's ``meta`` names the
    cost source that priced it (``cost_source``: device by device, as metrics.json's: which cost model, profile and
    precision, ``calibrated:<fit>:bf16``, its step time is for); return (plan, file name)."""
    from dataclasses import replace

    import numpy as np

    from placement_rl.plans import Placement, StagePlan

    source = {} if costs is None else {"cost_source": costs.describe_source(topology.device_names)}
    plan = (replace(value, meta={**value.meta, **source}) if isinstance(value, StagePlan)
            else Placement(np.asarray(value)[: graph.num_nodes], meta=source))
    name = "plan.json" if isinstance(plan, StagePlan) else "placement.json"
    graph.to_json(out / "graph.json")
    plan.to_json(out / name, graph=graph, topology=topology)
    return plan, name


def build_topology(tcfg: DictConfig | str, *, threads: int = 1) -> DeviceTopology:
    """A topology from the ``topology`` config group (a preset's YAML content), ``topology.path``, or local: the
    CPU's speed measured with ``threads`` torch threads, those a plan's processes run with (``deploy threads=``,
    default 1), whatever this process uses (one command predicted 2x another's time for the same plan)."""
    if isinstance(tcfg, str):
        return _checked(load_topology(tcfg))
    if tcfg.get("path"):
        return _checked(load_topology(str(tcfg.path)))
    if tcfg.get("detect", False):
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(int(threads))
        try:
            return detect_local()
        finally:
            torch.set_num_threads(before)
    data = {k: v for k, v in to_container(tcfg).items() if k != "path"}
    return _checked(DeviceTopology.from_dict(data, where=f"topology '{data.get('name', '?')}'"))


def _checked(topology: DeviceTopology) -> DeviceTopology:
    """``topology`` once its ``collective_fit`` names a shipped measured system (the cost model checks it when it
    first prices the links, after work has begun): a ``TopologyError`` before any work otherwise."""
    from placement_rl.cost.comm_fit import measured_system

    measured_system(topology)
    return topology


def warm_up(policy) -> float:
    """Compile or load the numba kernels before anything is timed (``agents.constructive_eval.warm_kernels``); say
    so when it took long (the first run after an install). Returns its seconds."""
    from placement_rl.agents.constructive_eval import warm_kernels

    seconds = warm_kernels(policy)
    if seconds > 8.0:
        print(f"compiled the simulator and decode kernels in {seconds:.1f} s (first run after an install; numba "
              f"caches them)")
    return seconds
