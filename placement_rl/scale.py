"""Scale-out: run independent jobs in this process or on Ray, with the same results for any worker count.

``Workers(n, address=None)`` is the one engine for work that outgrows a process (building tasks and their
teachers, teacher labelling of policy iteration, evaluation of (graph, topology) pairs, ablation runs):

* ``n == 1``: every job runs here, one after another; Ray is never imported.
* ``n >= 2`` or ``"auto"``: jobs are Ray tasks (``placement_rl.scale_ray``). Without ``address`` a **private**
  local Ray instance is started with ``n`` CPUs (``auto``: every core of the machine), even when another Ray
  instance runs on the machine (never joined by accident: ``describe()`` says it is there); ``address="auto"`` or
  ``"host:port"`` joins a running cluster deliberately (``ray start --head`` on one machine, ``ray start
  --address=<head>:6379`` on the others), where ``auto`` means every CPU of the cluster. A Ray instance already
  running in this process is reused (and left running). ``auto`` without Ray installed means one worker, here.
* The same code everywhere: a cluster this object joins gets the driver's package shipped to every worker
  (``runtime_env`` ``working_dir``; ``ship=True`` for a private instance too, ``ship=False`` never), and one
  worker per node reports its package version, source / config hashes and library versions: any difference is refused in one
  line (``scale_ray.CodeMismatchError``) before any job runs. ``describe()`` is the run's first line.

While jobs run on Ray, SIGTERM (what Slurm, Kubernetes and ``timeout`` send) raises ``KeyboardInterrupt`` as
Ctrl-C does (``sigterm_as_interrupt``): the jobs in flight are cancelled and Ray is shut down, instead of Ray's
failure handler aborting the driver with a C++ stack dump. ``map(..., still_running=...)`` hears every
``HEARTBEAT`` seconds that pass without a job finishing (a job may run for hours, its output captured).

Results come back in input order. Work is split by job, never raced: a job's result depends only on its
inputs (seeds are drawn by the caller, per job, before dispatch), so 1 and N workers give the same results.
A job whose worker process dies is run again (Ray's ``max_retries``); an exception raised by the job itself is
not retried and is re-raised here. Values every job reads (the policy's weights, the tasks) are put in Ray's
object store once (``put``, or ``shared=`` per ``map``) instead of being shipped with every job.

``store``: a directory where ``map(..., keys=...)`` keeps each finished job's result (a pickle of this machine's
own results, never one from elsewhere): a run started again with the same keys reuses them instead of
redoing the work (resumed pretraining does not relabel). Every stored file is named by its key and
``code_key`` (the source, cost-model and fit hashes of ``placement_rl.results.code_hashes``): after a code
change nothing is reused, and the results made by other code are counted in ``stale`` and recomputed.

    with Workers("auto") as w:
        results = w.map(fn, items, shared=(policy,), progress=lambda done, total: ...)
    map_tasks(fn, items, workers=2)        # the same, one call
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from placement_rl.errors import ConfigError, PlacementRLError

AUTO = "auto"
RETRIES = 3  # times a job whose worker died is run again
HEARTBEAT = 30.0  # seconds without a job finishing before ``map``'s ``still_running`` is called (again)
INSTALL_HINT = "pip install 'placement-rl[ray]'"


class WorkerError(PlacementRLError):
    """A job could not be run: its worker died more often than the retries allow, or the cluster is gone."""


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def check_workers(workers: int | str) -> int | str:
    """``workers`` as 1, an integer >= 2, or ``"auto"``; ``ConfigError`` otherwise."""
    import numbers

    if isinstance(workers, str):
        text = workers.strip().lower()
        if text == AUTO:
            return AUTO
        if text.isdigit():
            workers = int(text)
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or int(workers) < 1:
        raise ConfigError(f"workers must be a positive integer or auto, got {workers!r}")
    return int(workers)


def _raise_interrupt(signum: int, frame: Any) -> None:
    """The SIGTERM handler of ``sigterm_as_interrupt``: what Python's SIGINT handler does."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt(restore: Any = None, *, worker: bool = False) -> Iterator[None]:
    """While it runs: SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does, so a run ends on its
    interrupt path (jobs cancelled, Ray shut down, one line) instead of ending at once (exit code 143, no line) or in
    Ray's failure handler (``ray.init`` installs one that aborts with a C++ stack dump). The one rule for every
    caller: ``Workers`` on Ray (entered after ``ray.init``) and the CLI's ``train`` / ``place``
    (``placement_rl.cli.signals``). On exit the SIGTERM handler is ``restore`` (the one before ``ray.init``), else
    the one found on entry. Nothing changes outside the main thread or in a launcher's job worker (``worker``: its
    driver reports the interrupt); a SIGTERM ignored (``restore``, else the handler found on entry, is ``SIG_IGN``:
    a process started with it ignored) stays ignored, as Python leaves a SIGINT ignored at start."""
    if threading.current_thread() is not threading.main_thread() or worker:
        yield
        return
    previous = signal.getsignal(signal.SIGTERM) if restore is None else restore
    signal.signal(signal.SIGTERM, signal.SIG_IGN if previous is signal.SIG_IGN else _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)  # None: set outside Python


def wait_beating(wait: Callable[[list[Any], float], list[Any]], refs: list[Any], *, every: float,
                 beat: Callable[[], None]) -> list[Any]:
    """The refs that ``wait(refs, timeout)`` finds ready, calling ``beat()`` each time ``every`` seconds pass
    without any (``ray.wait`` with a timeout: a long job still shows the run is alive)."""
    while True:
        ready = wait(refs, every)
        if ready:
            return ready
        beat()


def _single_thread() -> None:
    import numba
    import torch

    torch.set_num_threads(1)
    numba.set_num_threads(1)  # a worker per core: the greedy decode does not split its branches over threads


class _Packed:
    """A value pickled by this module (protocol 5), unpickled where it is used: numpy arrays keep their own
    write flags (Ray's zero-copy reads would hand out every array read-only, pinned in shared memory)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __getstate__(self) -> bytes:
        return self.data

    def __setstate__(self, data: bytes) -> None:
        self.data = data


def _pack(value: Any) -> _Packed:
    from ray import cloudpickle

    return _Packed(cloudpickle.dumps(value, protocol=5))


def _unpack(value: Any) -> Any:
    return pickle.loads(value.data) if isinstance(value, _Packed) else value


def _resolve(item: Any) -> Any:
    """An item with ObjectRefs one level down (in a tuple or list) fetched; Ray resolves top-level ones."""
    if isinstance(item, (tuple, list)):
        import ray

        refs = [i for i, x in enumerate(item) if isinstance(x, ray.ObjectRef)]
        if refs:
            got = ray.get([item[i] for i in refs])
            out = list(item)
            for i, v in zip(refs, got):
                out[i] = _unpack(v)
            return type(item)(out) if isinstance(item, list) else tuple(out)
    return item


def _call(fn: Any, item: Any, *shared: Any) -> _Packed:
    """What a Ray task runs: one job, single-threaded (a worker per core); its result packed."""
    _single_thread()
    return _pack(_unpack(fn)(_resolve(item), *(_unpack(x) for x in shared)))


class Workers:
    """Run ``fn(item, *shared)`` over items here (``n=1``) or as Ray tasks (see the module docstring)."""

    def __init__(self, n: int | str = 1, *, address: str | None = None, retries: int = RETRIES,
                 store: str | Path | None = None, ship: bool | None = None,
                 address_key: str = "ray.address") -> None:
        n = check_workers(n)
        if address is not None and not str(address).strip():
            address = None
        if n == 1 and address is not None:
            raise ConfigError(f"{address_key}={address} is set but workers=1 runs in this process: set workers=auto "
                              f"(or a count) to use the cluster, or drop {address_key}")
        if retries < 0:
            raise ConfigError(f"retries must be >= 0, got {retries}")
        self.requested = n
        self.address = address
        self.address_key = address_key  # the config key that set ``address``: what an error names
        self.retries = int(retries)
        self.store = Path(store) if store is not None else None
        self.reused = 0  # results taken from ``store`` instead of being computed
        self.stale = 0  # results in ``store`` made by other code: recomputed, never reused
        self._ray = False
        self._owner = False  # this object started Ray (and shuts it down)
        self._puts: dict[int, tuple[Any, Any]] = {}
        self._remote: Any = None
        self._conn: Any = None  # scale_ray.Connection on Ray
        self._code_key: str | None = None
        self._signals = contextlib.ExitStack()  # SIGTERM as Ctrl-C while this object holds Ray
        self.ship = ship  # the driver's package to the workers (runtime_env working_dir); None: on a joined cluster
        self.nodes_checked = 0
        self.note = ""
        if n == 1:
            self.count = 1
        elif not ray_available():
            if n != AUTO:
                raise ConfigError(f"workers={n} runs on Ray, which is not installed: {INSTALL_HINT} (or workers=1)")
            if address is not None:
                raise ConfigError(f"{address_key}={address} needs Ray, which is not installed: {INSTALL_HINT}")
            self.count = 1
            self.note = f"Ray is not installed: one worker in this process ({INSTALL_HINT} for every core)"
        else:
            self._start_ray()

    # ------------------------------------------------------------------------------------------- Ray
    def _start_ray(self) -> None:
        from placement_rl.scale_ray import check_code, connect

        import ray

        before = signal.getsignal(signal.SIGTERM)  # what it is again at close: ray.init replaces it
        self._conn = connect(self.requested, self.address, ship=self.ship, key=self.address_key)
        if self._conn.owner:
            self._signals.enter_context(sigterm_as_interrupt(restore=before))
        try:
            self.nodes_checked = check_code(self._conn)  # before any job: every node runs the driver's code
        except BaseException:
            self.close()
            raise
        self._owner = self._conn.owner
        self.count = max(1, self._conn.cpus if self.requested == AUTO else int(self.requested))
        self._ray = True
        self._remote = ray.remote(num_cpus=1, max_retries=self.retries)(_call)

    @property
    def on_ray(self) -> bool:
        return self._ray

    def describe(self) -> str:
        """One line: where the jobs run (a private instance, a joined cluster with its CPUs and nodes, or this
        process), whether the code was shipped and checked. The first line a run logs."""
        if not self._ray:
            return "1 worker (in this process)" + (f"; {self.note}" if self.note else "")
        from placement_rl.scale_ray import cluster_size

        cpus, nodes = cluster_size()
        c = self._conn
        count = (f"{self.count} workers requested, {cpus} CPU{'s' if cpus != 1 else ''}: {cpus} at a time,"
                 if 0 < cpus < self.count else f"{self.count} workers")  # a job takes one CPU
        return (f"{count} on {c.where} ({cpus} CPU{'s' if cpus != 1 else ''} on {nodes} "
                f"node{'s' if nodes != 1 else ''}){c.note}; "
                f"placement-rl {c.identity['placement-rl']} source {c.identity['source_sha']} checked on "
                f"{self.nodes_checked} node{'s' if self.nodes_checked != 1 else ''}")

    @property
    def code_key(self) -> str:
        """A digest of what a stored result depends on besides its inputs: the code (``source_sha``), the cost
        model and the shipped fits (``placement_rl.results.code_hashes``); part of every ``store`` key."""
        if self._code_key is None:
            import hashlib
            import json

            from placement_rl.results import code_hashes

            h = code_hashes()
            blob = json.dumps([h["source_sha"], h["cost_model_sha"], h["fits_sha"]], sort_keys=True)
            self._code_key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return self._code_key

    def put(self, value: Any, *, ship: Callable[[Any], Any] | None = None) -> Any:
        """``value`` in Ray's object store, once per object (the same ref is returned again: for values that
        do not change, such as tasks), or ``value`` itself in-process. ``ship(value)`` is what is stored (e.g. a
        copy without per-process caches). Pass the result inside items (one level down) or in ``shared``."""
        if not self._ray:
            return value
        import ray

        key = id(value)
        if key not in self._puts:
            self._puts[key] = (value, ray.put(_pack(ship(value) if ship else value)))  # the object kept: id unique
        return self._puts[key][1]

    def forget(self) -> None:
        """Drop the object-store copies made by ``put``."""
        self._puts.clear()

    # ------------------------------------------------------------------------------------------- map
    def map(self, fn: Callable[..., Any], items: Sequence[Any], *, shared: Iterable[Any] = (),
            progress: Callable[[int, int], None] | None = None, keys: Sequence[str] | None = None,
            cost: Sequence[float] | None = None,
            on_result: Callable[[int, Any], None] | None = None,
            still_running: Callable[[int, int], None] | None = None, every: float = HEARTBEAT) -> list[Any]:
        """``[fn(item, *shared) for item in items]``, in input order. ``progress(done, total)`` and
        ``on_result(index, result)`` are called here as jobs finish on any worker. ``keys`` (with ``store``): each
        result is saved under its key and reused when found. ``cost``: an estimate per job; larger jobs are
        dispatched first (balance, not results). ``still_running(done, running)``: on Ray, called here each time
        ``every`` seconds pass without a job finishing."""
        items = list(items)
        total = len(items)
        out: list[Any] = [None] * total
        todo = list(range(total))
        if keys is not None and len(keys) != total:
            raise ValueError(f"{len(keys)} keys for {total} items")
        if self.store is not None and keys is not None:
            todo = []
            for i, k in enumerate(keys):
                found, value = self.lookup(k)
                if found:
                    out[i] = value
                    if on_result:
                        on_result(i, value)
                else:
                    todo.append(i)
        done = total - len(todo)
        if progress and done:
            progress(done, total)
        shared = tuple(shared)
        if not self._ray:
            for i in todo:
                out[i] = fn(items[i], *shared)
                self._save(keys, i, out[i])
                if on_result:
                    on_result(i, out[i])
                done += 1
                if progress:
                    progress(done, total)
            return out
        import ray

        if cost is not None:
            todo.sort(key=lambda i: -float(cost[i]))
        fn_ref = ray.put(_pack(fn))
        shared_refs = [x if isinstance(x, ray.ObjectRef) else ray.put(_pack(x)) for x in shared]  # once per call
        pending: dict[Any, int] = {}
        window = 2 * self.count  # jobs in flight: every worker busy, the next one queued
        slots = min(self.count, self._conn.cpus) if self._conn.cpus > 0 else self.count  # a job takes one CPU
        queue = iter(todo)

        def wait(refs: list[Any], timeout: float) -> list[Any]:
            return ray.wait(refs, num_returns=1, timeout=timeout)[0]

        def beat() -> None:
            if still_running is not None:
                still_running(done, min(len(pending), slots))
        try:
            while True:
                while len(pending) < window:
                    i = next(queue, None)
                    if i is None:
                        break
                    pending[self._remote.remote(fn_ref, items[i], *shared_refs)] = i
                if not pending:
                    break
                ready = wait_beating(wait, list(pending), every=every, beat=beat)
                for ref in ready:
                    i = pending.pop(ref)
                    out[i] = self._get(ref)
                    self._save(keys, i, out[i])
                    if on_result:
                        on_result(i, out[i])
                    done += 1
                    if progress:
                        progress(done, total)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
        return out

    def _get(self, ref: Any) -> Any:
        import ray

        try:
            return _unpack(ray.get(ref))  # a private copy: arrays as the job made them, not pinned in the store
        except ray.exceptions.RayTaskError as exc:  # the job raised: its own exception, as if run here
            raise exc.as_instanceof_cause() from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.RaySystemError) as exc:
            raise WorkerError(f"a job's worker died more than {self.retries} times ({str(exc).splitlines()[0]}): "
                              f"check the workers' memory (`ray status`)") from None

    # ----------------------------------------------------------------------------------------- store
    def _path(self, key: str) -> Path:
        assert self.store is not None
        return self.store / f"{key}.{self.code_key}.pkl"  # the code in every key: other code's results never match

    def lookup(self, key: str) -> tuple[bool, Any]:
        """``(True, result)`` if ``store`` holds a finished result under ``key`` made by this code (counted in
        ``reused``); one made by other code (source, cost model or fits) is not used: counted in ``stale``."""
        if self.store is None:
            return False, None
        p = self._path(key)
        if not p.is_file():
            if any(self.store.glob(f"{key}.*.pkl")):
                self.stale += 1
            return False, None
        try:
            with open(p, "rb") as fh:
                value = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError):
            return False, None  # a file cut by a kill: the job runs again
        self.reused += 1
        return True, value

    def keep(self, key: str, value: Any) -> None:
        """Save a finished result under ``key`` in ``store`` (atomically; nothing without a store)."""
        if self.store is None:
            return
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(p)

    def _save(self, keys: Sequence[str] | None, i: int, value: Any) -> None:
        if keys is not None:
            self.keep(keys[i], value)

    # ------------------------------------------------------------------------------------- lifetime
    def close(self) -> None:
        self._puts.clear()
        if self._conn is not None:
            from placement_rl.scale_ray import disconnect

            disconnect(self._conn)  # shuts Ray down only where this object started or joined it
        self._conn = None
        self._signals.close()  # SIGTERM's handler as it was before Ray
        self._ray = self._owner = False

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def map_tasks(fn: Callable[..., Any], items: Sequence[Any], *, workers: int | str | Workers = 1,
              address: str | None = None, progress: Callable[[int, int], None] | None = None,
              shared: Iterable[Any] = ()) -> list[Any]:
    """``[fn(item, *shared) for item in items]`` on ``workers`` (a count, ``"auto"``, or a running ``Workers``,
    which is left open); see ``Workers.map``."""
    if isinstance(workers, Workers):
        return workers.map(fn, items, shared=shared, progress=progress)
    with Workers(workers, address=address) as w:
        return w.map(fn, items, shared=shared, progress=progress)
