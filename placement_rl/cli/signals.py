"""SIGTERM answered as Ctrl-C. ``timeout``, Slurm and Kubernetes stop a job with SIGTERM, whose default ends the
process at once (exit code 143): no line, and an earlier run's files set aside from the run folder
(``run_folder.set_aside``) stay in their hidden folder. A command run through ``hydra_app(sigterm=True)`` ends on
its Ctrl-C path instead: exit code 130, its interrupt line, the files it keeps (``common.files_on_interrupt``).

The rule is ``placement_rl.scale.sigterm_as_interrupt``, the one ``Workers`` on Ray uses too: here with
``worker=common.in_job_worker()`` (a launcher's job worker leaves the signal to its driver); a SIGTERM the process
was started ignoring stays ignored."""

from __future__ import annotations

from placement_rl.scale import _raise_interrupt, sigterm_as_interrupt

__all__ = ["_raise_interrupt", "sigterm_as_interrupt"]
