"""Hydra multiruns on the scale-out engine: ``hydra/launcher=ray_workers`` runs each job of a sweep (seeds,
ablation cells, ...) as one job of ``placement_rl.scale.Workers``, a Ray task in its own process.

    placement-rl train -m seed=0,1,2,3 hydra/launcher=ray_workers workers=2 [ray.address=<head>:6379]

* **Where**: ``hydra.launcher.workers`` (default: the command's ``workers``, else ``auto``) and
  ``hydra.launcher.address`` (default: the command's ``ray.address``) are ``Workers``' own: a private local Ray
  instance even when another one runs on the machine, a cluster joined only through ``ray.address``, the driver's
  code checked on every node (shipped to a joined cluster) before any job runs; ``workers=1`` runs the jobs here,
  one after another, without Ray. The run's first line says which.
* **The same jobs**: every job's config is composed here, as Hydra's basic launcher composes it (same overrides,
  same ``hydra.job.num`` / ``id``, the sweep's timestamps), and runs through Hydra's ``run_job`` in the driver's
  working directory: its output folder (``hydra.sweep.dir``/``hydra.sweep.subdir``) holds what the basic launcher
  would write there, and its results are those of running the jobs one by one in this process.
* **Progress**: one line per job as it finishes, on any worker (``[done/total] #num overrides: ... s``), and while
  none finishes a line every ``scale.HEARTBEAT`` seconds (``sweep: 1 of 4 jobs finished, 2 running, 95 s so far``):
  a worker's own output is printed as one block when its job ends. A job that
  fails is one line (the domain error's message, or the exception's type, message and innermost line); the other
  jobs still run, and the sweep then ends with one line on stderr and exit code 2 (1 when a job hit a bug rather
  than bad input). A worker that dies is retried (``scale.RETRIES``).
* **Other launchers** (Hydra's basic one, ``hydra/launcher=joblib``, the default of ``train``) end the same way
  (``failures_reported``): a failed job raises instead of exiting, the batch's other jobs run, and the sweep ends
  with one line per failed job (``#num overrides: failed: ...``), one on stderr and exit code 2. Ctrl-C on any
  sweep is one line (``interrupted: <done> of <total> sweep jobs finished``) and exit code 130; so is SIGTERM (what
  Slurm, Kubernetes and ``timeout`` send) while this module's jobs run on Ray (``scale.sigterm_as_interrupt``).
* On a joined cluster each job writes its folder on the node that runs it, at the driver's path: use a shared
  file system (or ``workers=1``) when the results must land on the driver's disk.

The class Hydra instantiates (``hydra_plugins.placement_rl_launcher``) is a thin shim: Hydra only loads launchers
from its ``hydra_plugins`` namespace. Its source is ``placement_rl/hydra_plugins/``, installed there through
pyproject.toml's ``package-dir``; the logic and the config schema live here (a worker that only has the shipped
``placement_rl`` package runs a job without the shim).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

NAME = "ray_workers"  # hydra/launcher=<NAME>
TARGET = "hydra_plugins.placement_rl_launcher.ray_workers.RayWorkersLauncher"


@dataclass
class RayWorkersConf:
    """``hydra/launcher=ray_workers``: the jobs of a multirun on ``placement_rl.scale.Workers``."""

    _target_: str = TARGET
    workers: Any = "${oc.select:workers,auto}"  # an integer >= 1 or auto (every core; of the cluster at address)
    address: Optional[str] = "${oc.select:ray.address,null}"  # null: a private local Ray instance; auto/host:port


@dataclass(frozen=True)
class SweepJob:
    """One job of a sweep, composed by the driver."""

    num: int
    overrides: tuple[str, ...]  # the job's own overrides that differ between the sweep's jobs: its progress line
    config: Any  # the job's full config (DictConfig, hydra node included)
    cwd: str  # the driver's working directory: relative output folders resolve there
    driver_pid: int


@dataclass(frozen=True)
class JobOutcome:
    """What a job sends back: Hydra's ``JobReturn`` (a failure's exception replaced by a ``JobFailed``), its
    seconds, and on a worker what it printed (stdout and stderr, in order), which the driver prints as one block."""

    ret: Any
    seconds: float
    output: str = ""


def check_launcher(workers: Any, address: Any) -> tuple[int | str, str | None]:
    """The launcher's ``workers`` and ``address`` as ``Workers`` takes them; ``ConfigError`` in one line."""
    from placement_rl.errors import ConfigError
    from placement_rl.scale import check_workers

    try:
        n = check_workers(workers)
    except ConfigError as exc:
        raise ConfigError(f"hydra.launcher.{exc}") from None
    address = None if address is None or not str(address).strip() else str(address).strip()
    if n == 1 and address is not None:
        raise ConfigError(f"hydra.launcher.address={address} is set but hydra.launcher.workers=1 runs the jobs in "
                          f"this process: set workers=auto (or a count) to use the cluster, or drop the address")
    return n, address


def _describe_exception(exc: BaseException) -> str:
    """``ValueError: bad thing (module.py:12)``: the type, the message's first line and the innermost frame."""
    import traceback

    text = (str(exc).strip().splitlines() or [""])[0]
    where = ""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})"
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


def run_one(job: SweepJob, task_function: Any, callbacks: Any, state: Any) -> JobOutcome:
    """Run one job with Hydra's ``run_job`` (what each worker runs; here too with ``workers=1``). On a worker,
    Hydra's process-wide state (config store, job runtime, resolvers) is the driver's, as Hydra's joblib launcher
    sets it, and the working directory is the driver's while the job runs."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn, JobStatus, run_job
    from hydra.types import HydraContext

    from placement_rl.cli.jobs import JobFailed
    from placement_rl.errors import PlacementRLError

    t0 = time.perf_counter()
    remote = os.getpid() != job.driver_pid
    old_cwd = os.getcwd()
    printed = io.StringIO()
    with contextlib.ExitStack() as stack:
        if remote:  # printed by the driver as one block when the job ends: jobs do not interleave, nothing is lost
            Singleton.set_state(state)
            os.chdir(job.cwd)
            stack.callback(os.chdir, old_cwd)
            stack.enter_context(contextlib.redirect_stdout(printed))
            stack.enter_context(contextlib.redirect_stderr(printed))
        try:
            ret = run_job(hydra_context=HydraContext(config_loader=None, callbacks=callbacks),
                          task_function=task_function, config=job.config, job_dir_key="hydra.sweep.dir",
                          job_subdir_key="hydra.sweep.subdir")
        except SystemExit as exc:  # a task that exits by itself (not through hydra_app): a failure with its code
            ret = JobReturn(overrides=list(job.overrides), status=JobStatus.FAILED)
            ret.return_value = JobFailed(f"the job exited with code {exc.code}", domain=exc.code == 2)
    if ret.status == JobStatus.FAILED and not isinstance(ret._return_value, JobFailed):
        exc = ret._return_value
        domain = isinstance(exc, PlacementRLError)
        line = (str(exc).splitlines() or [type(exc).__name__])[0] if domain else _describe_exception(exc)
        ret.return_value = JobFailed(line, domain=domain)  # picklable, one line
    if remote and ret.status == JobStatus.COMPLETED:
        try:
            import pickle

            pickle.dumps(ret._return_value)
        except Exception:  # noqa: BLE001 -- a value that cannot travel back: the job's files are its result
            ret.return_value = None
    return JobOutcome(ret, time.perf_counter() - t0, printed.getvalue())


def _job_line(job: SweepJob) -> str:
    return f"#{job.num} {' '.join(job.overrides)}".rstrip()


def _own_overrides(job_overrides: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Each job's overrides that differ between the sweep's jobs (what names it in a progress line)."""
    from hydra.core.utils import filter_overrides

    common = set.intersection(*(set(o) for o in job_overrides)) if len(job_overrides) > 1 else set()
    return [tuple(o for o in filter_overrides(overrides) if o not in common) for overrides in job_overrides]


def _end(failed: list[tuple[str, Any]], total: int, seconds: float) -> None:
    """The sweep's last line on stderr for its failed jobs (``(job line, JobFailed)``), and its exit code: 2, or 1
    when a job hit a bug rather than bad input."""
    from placement_rl.cli.jobs import SweepExit, plural

    first_job, first = failed[0]
    more = f" (and {plural(len(failed) - 1, 'other')})" if len(failed) > 1 else ""
    print(f"error: {len(failed)} of {plural(total, 'sweep job')} failed in {seconds:.0f} s; {first_job}: {first}{more}",
          file=sys.stderr, flush=True)
    raise SweepExit(2 if all(getattr(e, "domain", False) for _, e in failed) else 1)


def _still_running(total: int, t0: float) -> Any:
    """``Workers.map``'s ``still_running``: the sweep's line while no job finishes (a worker's output comes as one
    block when its job ends)."""

    def say(done: int, running: int) -> None:
        print(f"sweep: {done} of {total} jobs finished, {running} running, {time.perf_counter() - t0:.0f} s so far",
              flush=True)

    return say


def _address_key(config: Any) -> str:
    """The key the user set the launcher's address with: ``hydra.launcher.address``, or the command's
    ``ray.address`` (the launcher's default is an interpolation of it)."""
    from omegaconf import OmegaConf

    node = OmegaConf.select(config, "hydra.launcher")
    default = node is not None and "address" in node and OmegaConf.is_interpolation(node, "address")
    return "ray.address" if default else "hydra.launcher.address"


def _interrupted(done: int, total: int) -> None:
    from placement_rl.cli.jobs import SweepExit

    print(f"interrupted: {done} of {total} sweep jobs finished", file=sys.stderr, flush=True)
    raise SweepExit(130)


def _report_failures(launch: Any) -> Any:
    """``launch`` of another launcher (Hydra's basic one, joblib) made to end as this module's ``launch`` does: one
    line per failed job (``#num overrides: failed: ...``), then one line on stderr and exit code 2 (1 for a bug,
    after its traceback where it survived), once the batch's other jobs have run. (Hydra itself would raise the
    first failure, and a job that exited took the whole sweep down with it.)"""
    import traceback

    from hydra.core.utils import JobStatus

    from placement_rl.cli.jobs import JobFailed

    def reported(job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        t0 = time.perf_counter()
        try:
            rets = launch(job_overrides, initial_job_idx)
        except KeyboardInterrupt:
            _interrupted(0, len(job_overrides))
        names = _own_overrides(job_overrides)
        failed, bug = [], None
        for k, ret in enumerate(rets):
            if ret.status != JobStatus.FAILED:
                continue
            exc = ret._return_value
            line = f"#{initial_job_idx + k} {' '.join(names[k])}".rstrip()
            if not isinstance(exc, JobFailed):
                bug = bug or exc
                exc = JobFailed(_describe_exception(exc), domain=False)
            failed.append((line, exc))
            print(f"{line}: failed: {exc}", flush=True)
        if failed:
            if bug is not None and bug.__traceback__ is not None:
                traceback.print_exception(type(bug), bug, bug.__traceback__)
            _end(failed, len(rets), time.perf_counter() - t0)
        return rets

    return reported


@contextlib.contextmanager
def failures_reported() -> Any:
    """While a command's Hydra app runs: the launcher of a multirun, if it is not this module's, reports its failed
    jobs as ``launch`` does (``_report_failures``). Its instance's ``launch`` is wrapped as Hydra makes it."""
    from hydra.core.plugins import Plugins

    from placement_rl.cli.jobs import OWN_LAUNCHERS

    plugins = Plugins.instance()
    instantiate = plugins.instantiate_launcher

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        plugins.__dict__.pop("instantiate_launcher", None)  # once: nothing of this travels to a job's process
        launcher = instantiate(*args, **kwargs)
        if not type(launcher).__module__.startswith(OWN_LAUNCHERS):
            launcher.launch = _report_failures(launcher.launch)
        return launcher

    plugins.instantiate_launcher = wrapped
    try:
        yield
    finally:
        plugins.__dict__.pop("instantiate_launcher", None)


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """Hydra's ``Launcher.launch`` for ``RayWorkersLauncher``: the jobs' ``JobReturn`` in input order."""
    from pathlib import Path

    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, configure_log, setup_globals
    from omegaconf import open_dict

    from placement_rl.cli.jobs import fail, plural
    from placement_rl.errors import PlacementRLError
    from placement_rl.scale import Workers

    setup_globals()
    config, context = launcher.config, launcher.hydra_context
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    jobs = []
    for k, (overrides, own) in enumerate(zip(job_overrides, _own_overrides(job_overrides))):
        num = initial_job_idx + k
        cfg = context.config_loader.load_sweep_config(config, list(overrides))  # as the basic launcher does
        with open_dict(cfg):
            cfg.hydra.job.id = num
            cfg.hydra.job.num = num
        jobs.append(SweepJob(num, own, cfg, os.getcwd(), os.getpid()))
    total = len(jobs)
    outcomes: list[JobOutcome | None] = [None] * total
    failed: list[tuple[SweepJob, Any]] = []
    t0 = time.perf_counter()

    def report(i: int, outcome: JobOutcome) -> None:
        outcomes[i] = outcome
        done = sum(o is not None for o in outcomes)
        ret = outcome.ret
        if outcome.output:
            print(outcome.output, end="" if outcome.output.endswith("\n") else "\n", flush=True)
        if ret.status == JobStatus.COMPLETED:
            print(f"[{done}/{total}] {_job_line(jobs[i])}: done in {outcome.seconds:.1f} s", flush=True)
        else:
            failed.append((jobs[i], ret._return_value))
            print(f"[{done}/{total}] {_job_line(jobs[i])}: failed in {outcome.seconds:.1f} s: "
                  f"{ret._return_value}", flush=True)

    try:
        try:
            workers = Workers(launcher.workers, address=launcher.address, address_key=_address_key(config))
        except PlacementRLError as exc:
            fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        with workers:
            print(f"sweep of {plural(total, 'job')} in {config.hydra.sweep.dir} on {workers.describe()}", flush=True)
            state = Singleton.get_state() if workers.on_ray else None
            try:
                workers.map(run_one, jobs, shared=(launcher.task_function, context.callbacks, state),
                            on_result=report, still_running=_still_running(total, t0))
            except PlacementRLError as exc:  # a worker that died more often than the retries allow, a lost cluster
                fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while the jobs run: the jobs in flight cancelled, Ray shut down
        _interrupted(sum(o is not None for o in outcomes), total)
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    if failed:
        _end([(_job_line(job), e) for job, e in failed], total, time.perf_counter() - t0)
    return [o.ret for o in outcomes]


# ------------------------------------------------------------------------------------- comparing sweeps
_NOT_RESULTS = ("multirun.yaml", "hydra.yaml")  # Hydra's record of the sweep and of the launcher that ran it


def _measured_time(key: str) -> bool:
    """A key or table column that holds wall-clock seconds (they differ between any two runs): ``s``, ``seconds``,
    one naming seconds (``search_seconds``), or a header in seconds (``search s``, ``wall (s)``)."""
    k = key.strip().lower()
    return k in ("s", "seconds") or "seconds" in k or k.endswith((" s", "(s)"))  # not "_s": simulated_s


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if not _measured_time(str(k))}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def _markdown_without_times(text: str) -> str:
    """A markdown document with the columns of measured seconds cut out of its tables."""
    out, drop = [], None
    for line in text.splitlines():
        cells = line.strip().strip("|").split("|") if line.lstrip().startswith("|") else None
        if cells is None:
            drop = None
        elif drop is None:
            drop = {i for i, c in enumerate(cells) if _measured_time(c)}
        if cells is not None and drop:
            line = "|".join(c for i, c in enumerate(cells) if i not in drop)
        out.append(line)
    return "\n".join(out)


def _csv_without_times(text: str) -> str:
    """A CSV table with its columns of measured seconds (by header) cut out."""
    import csv

    rows = list(csv.reader(io.StringIO(text)))
    keep = [i for i, h in enumerate(rows[0]) if not _measured_time(h)] if rows else []
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([[r[i] for i in keep if i < len(r)] for r in rows])
    return out.getvalue()


def sweep_results(folder: Any) -> dict[str, str]:
    """What the jobs of a sweep computed, to compare two runs of it: ``{"<job>/<path>": sha256}`` over every file
    of its job folders but Hydra's logs and its records of the sweep and the launcher (``multirun.yaml``,
    ``.hydra/hydra.yaml``); measured seconds are left out of JSON files (keys naming seconds), markdown tables and
    CSV files (columns headed ``s``, ``... s`` or naming seconds: ``_measured_time``)."""
    import hashlib
    import json
    from pathlib import Path

    root = Path(folder)
    out: dict[str, str] = {}
    for f in sorted(root.rglob("*")):
        if not f.is_file() or f.suffix == ".log" or f.name in _NOT_RESULTS:
            continue
        data = f.read_bytes()
        if f.suffix == ".json":
            data = json.dumps(_without_times(json.loads(data)), sort_keys=True).encode()
        elif f.suffix == ".md":
            data = _markdown_without_times(data.decode()).encode()
        elif f.suffix == ".csv":
            data = _csv_without_times(data.decode()).encode()
        out[f.relative_to(root).as_posix()] = hashlib.sha256(data).hexdigest()[:16]
    return out
