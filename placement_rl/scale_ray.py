"""Ray for ``placement_rl.scale.Workers``: one behaviour in any Ray situation, the same code on every worker.

``connect(requested, address)`` returns a ``Connection``:

* ``address`` unset: a **private** local Ray instance with ``requested`` CPUs (``auto``: every core), started even
  when another Ray instance runs on this machine (``ray start --head``, another training, a sweep's job): it is
  never joined by accident, and its presence is said in the note (``ray.address=auto`` joins it deliberately).
  Two trainings started at once each get their own instance.
* ``address`` set (``auto`` or ``host:port``), or Ray's ``RAY_ADDRESS`` variable set (as ``ray job submit``
  does): the running cluster is joined, and the run's first line says so with its CPUs and nodes. The address is
  probed first (``probe``: a TCP connection and a gRPC channel, ``PROBE_TIMEOUT`` seconds each): ``ray.init``
  retries a dead address forever and waits without end on a port that is no Ray head, so either is a one-line
  ``ConfigError`` instead. When ``ray.init`` still fails, the line's hint comes from what answers there
  (``_gcs_status``): no Ray head, or a cluster that wants a token, or either when that cannot be told.
* Ray already initialised in this process (by the caller): reused as it is, and left running.

When joining a cluster (and on request), the driver ships its package to every worker (``runtime_env``
``working_dir``: a folder holding a copy staged by ``scale_code.stage_package``), so a worker never runs another
checkout's or another install's code. A private instance's workers import this machine's install (the driver's
own files, and the numba kernel caches it compiled: a shipped copy recompiles every kernel in every worker).
(Not ``py_modules``: with it Ray also puts the driver's current folder at the front of every worker's path, and a
driver started in a checkout would shadow the shipped copy with whatever that path holds on each node.) Then
``check_code`` asks one worker on every node for its ``code_identity`` and refuses any difference in one line
(``CodeMismatchError``) before any job runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement_rl.errors import ConfigError, PlacementRLError
from placement_rl.scale_code import code_identity, mismatch, stage_package, staged_roots

CHECK_TIMEOUT = 600.0  # seconds for every node to start a worker and report its code (imports, shipped package)
PROBE_TIMEOUT = 5.0  # seconds for a cluster's address to answer before ray.init, which retries a dead one forever


class CodeMismatchError(PlacementRLError):
    """A Ray worker runs other code than the driver (another version, source, configs or library versions)."""


@dataclass(frozen=True)
class Connection:
    """How ``Workers`` reached Ray: ``how`` is ``private`` / ``joined`` / ``reused``; ``owner``: this process
    started (or joined) it and shuts it down; ``staged``: the shipped copy's folder (removed at close)."""

    how: str
    where: str
    cpus: int
    nodes: int
    owner: bool
    note: str
    identity: dict[str, str]
    staged: str | None = None


def other_instances() -> list[str]:
    """GCS addresses of Ray instances running on this machine (any user's), best effort."""
    try:
        from ray._private.services import find_gcs_addresses

        return sorted(set(find_gcs_addresses()))
    except Exception:  # noqa: BLE001 -- a private Ray helper: no answer is no instance found
        return []


def _project_path() -> str:
    """The folder holding this package (and ``agents``/``envs`` in a checkout): workers' path on a private instance."""
    return str(Path(__file__).resolve().parent.parent)


def cluster_size() -> tuple[int, int]:
    """``(CPUs, alive nodes)`` of the Ray cluster this process is connected to."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return int(ray.cluster_resources().get("CPU", 0)), len(nodes)


def _host_port(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` that ``ray.init(address=...)`` connects to (``auto``: the running cluster Ray finds on
    this machine); ``None`` where the form is not one of these (left to Ray). ``ConfigError`` when ``auto`` finds
    no cluster."""
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address("auto") or ""
        except ConnectionError:
            raise ConfigError("no running Ray cluster found on this machine") from None
        except Exception:  # noqa: BLE001 -- a private Ray helper: Ray itself says what is wrong
            return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def probe(address: str, *, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why nothing answers at the cluster ``address`` as a Ray head would (a TCP connection to its host and port,
    then a gRPC channel, each at most ``timeout`` seconds), or ``None`` when one does (or the form is left to
    Ray)."""
    target = _host_port(address)
    if target is None:
        return None
    host, port = target
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except socket.timeout:
        return f"nothing answers at {host}:{port} within {timeout:.0f} s"
    except OSError as exc:
        return f"nothing answers at {host}:{port}: {exc.strerror or exc}"
    return _not_grpc(host, port, timeout)


def _grpc_target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tls() -> bool:
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")


def _channel(host: str, port: int) -> tuple[Any, Any]:
    """``(grpc, an insecure channel to host:port)``, or ``(None, None)`` where none can be opened here: no ``grpc``
    installed, or TLS (``RAY_USE_TLS``), whose certificates this probe does not hold."""
    try:
        import grpc
    except ImportError:
        return None, None
    if _tls():
        return None, None
    return grpc, grpc.insecure_channel(_grpc_target(host, port))


def _not_grpc(host: str, port: int, timeout: float) -> str | None:
    """Why what listens at ``host:port`` is no Ray head (its GCS and client server speak gRPC; ``ray.init`` waits
    without end on anything else), or ``None`` when a gRPC channel opens within ``timeout`` seconds (or the check
    cannot run: no ``grpc``, or TLS, ``RAY_USE_TLS``)."""
    grpc, channel = _channel(host, port)
    if channel is None:
        return None
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return None
    except grpc.FutureTimeoutError:
        return (f"{host}:{port} answers but not as a Ray head (no gRPC within {timeout:.0f} s; the head's port is "
                "6379 unless `ray start --port` says otherwise, a client's ray:// 10001)")
    finally:
        channel.close()


GCS_CALL = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # the first call a joining driver makes to a Ray head


def _gcs_status(host: str, port: int, timeout: float) -> str | None:
    """The gRPC status a Ray head's first call (``GCS_CALL``, without a token) gets at ``host:port``: ``OK`` from a
    Ray head, ``UNAUTHENTICATED`` from one with token authentication, ``UNIMPLEMENTED`` from a server that is no
    Ray head; ``None`` where it cannot be asked (no ``grpc``, TLS)."""
    grpc, channel = _channel(host, port)
    if channel is None:
        return None
    try:
        channel.unary_unary(GCS_CALL)(b"", timeout=timeout)  # an empty request: bytes in, bytes out
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name
    finally:
        channel.close()


def _join_hint(address: str, key: str) -> str:
    """What to do after ``ray.init`` failed to join the cluster at ``address`` (set by ``key``), from what answers
    there (``_gcs_status``); both causes where they cannot be told apart."""
    head = "start it with `ray start --head`"
    token = (f"a cluster with token authentication (Ray's default) is joined at an explicit address only with "
             f"RAY_AUTH_MODE=token and its token (`ray get-auth-token`), or on its head with {key}=auto")
    target = None if address == "auto" or address.startswith("ray://") else _host_port(address)
    status = _gcs_status(*target, PROBE_TIMEOUT) if target is not None else None
    if status == "UNIMPLEMENTED":
        return (f"{target[0]}:{target[1]} answers but is no Ray head (the head's port is 6379 unless "
                f"`ray start --port` says otherwise, a client's ray:// 10001): fix the address")
    if address == "auto":
        return head
    if os.environ.get("RAY_AUTH_MODE"):
        return ("the cluster wants a token: check that this one is its head's (`ray get-auth-token`)"
                if status == "UNAUTHENTICATED" else head)
    if status == "UNAUTHENTICATED":
        return token
    return f"either no Ray head answers there ({head}, or fix the address), or {token}"


def connect(requested: int | str, address: str | None, *, ship: bool | None = None,
            key: str = "ray.address") -> Connection:
    """Reach Ray as the module doc says; ``ConfigError`` in one line when the cluster cannot be joined, naming the
    config ``key`` that set ``address``. ``ship``: send the driver's package to the workers; ``None``: when joining
    a cluster (a private instance's workers import this machine's install, whose numba kernel caches the driver has
    already compiled)."""
    import ray

    identity = code_identity()  # the files this driver reads now; with shipping, those of the shipped copy
    if ray.is_initialized():
        cpus, nodes = cluster_size()
        return Connection("reused", "the Ray instance already running in this process", cpus, nodes, False, "",
                          identity)
    via = key
    if address is None and os.environ.get("RAY_ADDRESS", "").strip():  # Ray's own way to name a cluster: a join
        address, via = os.environ["RAY_ADDRESS"].strip(), "RAY_ADDRESS"
    ship = address is not None if ship is None else ship
    if address is not None:
        try:
            why = probe(address)
        except ConfigError as exc:
            why = str(exc)
        if why is not None:
            raise ConfigError(f"cannot join the Ray cluster at {via}={address} ({why}): start it with "
                              f"`ray start --head`, or fix the address")
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": True}
    staged = tempfile.mkdtemp(prefix="placement-rl-ship-") if ship else None
    try:
        env: dict[str, Any] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
            p for p in (_project_path(), os.environ.get("PYTHONPATH", "")) if p)}}
        if staged is not None:
            shipped_code = stage_package(Path(staged))
            identity = code_identity(staged_roots(shipped_code))  # what the workers get, byte for byte
            env = {"working_dir": staged}  # not py_modules: Ray would put the driver's cwd (a checkout) first
        if address is None:
            others = other_instances()
            ray.init(address="local", num_cpus=None if requested == "auto" else int(requested), runtime_env=env,
                     **kwargs)
            how, where = "private", "a private local Ray instance"
            note = (f"; another Ray instance runs on this machine ({', '.join(others)}): not joined "
                    f"({key}=auto joins it deliberately)" if others else "")
        else:
            try:
                ray.init(address=address, runtime_env=env, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"cannot join the Ray cluster at {via}={address} "
                                  f"({str(exc).splitlines()[0]}): {_join_hint(address, via)}") from None
            gcs = ray.get_runtime_context().gcs_address
            how, where, note = "joined", f"the Ray cluster at {gcs} ({via}={address}), joined", ""
    except BaseException:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        raise
    cpus, nodes = cluster_size()
    shipped = "; the driver's package shipped to every worker" if staged is not None else ""
    return Connection(how, where, cpus, nodes, True, f"{note}{shipped}", identity, staged)


def _report() -> dict[str, str]:
    """What a worker says about its code (a Ray task)."""
    return code_identity()


def check_code(conn: Connection, *, timeout: float = CHECK_TIMEOUT) -> int:
    """One worker per alive node with CPUs reports its ``code_identity``; ``CodeMismatchError`` naming the node
    and what differs when any is not the driver's. Returns the nodes checked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    report = ray.remote(num_cpus=0, max_retries=2)(_report)
    refs = [report.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            for n in nodes]
    try:
        got = ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise PlacementRLError(f"the Ray workers did not report their code within {timeout:.0f} s: check the "
                               f"cluster (`ray status`)") from None
    except ray.exceptions.RayTaskError as exc:
        raise CodeMismatchError(f"a Ray worker cannot import this placement-rl ({str(exc).splitlines()[-1]}): "
                                f"install it on every node, or join with ray.address so the driver ships it") from None
    for node, there in zip(nodes, got):
        diff = mismatch(conn.identity, there)
        if diff:
            raise CodeMismatchError(f"Ray node {node.get('NodeManagerAddress', '?')} runs other code than this "
                                    f"driver ({diff}): refused before any job ran; run the same placement-rl "
                                    f"everywhere (the driver ships its package when it starts or joins Ray)")
    return len(nodes)


def disconnect(conn: Connection) -> None:
    import ray

    if conn.owner:
        ray.shutdown()
    if conn.staged is not None:
        shutil.rmtree(conn.staged, ignore_errors=True)


__all__ = ["CodeMismatchError", "Connection", "check_code", "cluster_size", "connect", "disconnect",
           "other_instances", "probe"]
