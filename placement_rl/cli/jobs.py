"""The one-line outcomes of a command or of a sweep's job: ``fail`` (one line on stderr, exit code 2), a job's
failure for its launcher to report (``JobFailed``), a multirun's end (``SweepExit``). Imported by ``cli.common``
and by ``cli.sweep`` (which ``cli.common`` imports: this module keeps the two without a cycle)."""

from __future__ import annotations

import re
import sys

from placement_rl.errors import PlacementRLError

_NUMPY_SCALAR = re.compile(r"\bnp\.(?:float|int|uint|bool|str|complex)\w*\(([^()]*)\)")


def plain_numbers(text: str) -> str:
    """``np.float64(-5.0)`` -> ``-5.0``: numpy 2 writes its scalars' type into ``repr``, not a reader's business."""
    return _NUMPY_SCALAR.sub(r"\1", text)


def fail(message: str) -> None:
    """Print one line on stderr and exit with code 2."""
    print(f"error: {plain_numbers(message)}", file=sys.stderr)
    sys.exit(2)


OWN_LAUNCHERS = "hydra_plugins.placement_rl_launcher."  # placement_rl.cli.sweep's launcher (not imported here)


class JobFailed(PlacementRLError):
    """A job of a multirun failed: its one line, which the launcher reports (with the job's number and overrides,
    ``placement_rl.cli.sweep``) instead of the job printing it and exiting. ``domain``: bad input, not a bug."""

    def __init__(self, line: str, domain: bool = True) -> None:
        super().__init__(line)
        self.domain = domain

    def __reduce__(self) -> tuple:
        return JobFailed, (str(self), self.domain)


class SweepExit(SystemExit):
    """The end of a multirun whose jobs were launched (some failed, or it was interrupted): its exit code stands
    (a plain exit code 1 before any job is Hydra failing to compose the config, which ``hydra_app`` makes 2)."""


def plural(n: int, word: str) -> str:
    """``1 device``, ``4 devices``."""
    return f"{n} {word}" + ("" if n == 1 else "s")
