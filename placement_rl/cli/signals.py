"""SIGTERM answered as Ctrl-C. ``timeout``, Slurm and Kubernetes stop a job with SIGTERM, whose default ends the
process at once (exit code 143): no line, and an earlier run's files set aside from the run folder
(``run_folder.set_aside``) stay in their hidden folder. A command run through ``hydra_app(sigterm=True)`` ends on
its Ctrl-C path instead: exit code 130, its interrupt line, the files it keeps (``common.files_on_interrupt``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


def _raise_interrupt(signum: int, frame) -> None:
    """The SIGTERM handler of ``sigterm_as_interrupt``: what Python's SIGINT handler does."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt(worker: bool = False) -> Iterator[None]:
    """While the block runs, SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does; the handler
    before it comes back after the block. Nothing changes outside the main thread, in a launcher's job worker (its
    driver reports the interrupt) or where the process was started with SIGTERM ignored (it stays ignored, as
    Python leaves a SIGINT ignored at start). ``worker``: this process is a launcher's job worker
    (``common.in_job_worker``)."""
    if threading.current_thread() is not threading.main_thread() or worker \
            or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)  # None: one set outside Python
