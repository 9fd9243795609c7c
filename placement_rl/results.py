"""Results as data: every benchmark writes ``results/<name>.json``, its figures with their provenance.

``provenance()`` says where a figure comes from: the code's git commit and whether tracked files differed from it
(``dirty``), hashes of the cost model (the modules that turn a graph and topology into costs and step times), of
the state a learned policy reads (``state_sha``: the feature modules) and of the shipped fits
(``placement_rl/data/*.json``), package versions, the CPU model, its core count and the load when it ran, and the
date. ``write_result(name, figures, ...)`` writes one JSON file atomically (a temp file, then a rename) under
``results/`` of the checkout (or ``$PLACEMENT_RL_RESULTS``); ``read_result(name)`` reads it back. Renderers
(``scripts/render.py``) and the tests that compare documents with their data read these files: a figure printed
in a document is a value of one of them, never a literal in a generator.

Shapes: ``{"name", "figures": {...}, "seconds", "sim_calls", "command", "provenance": {...}}``; ``figures`` is
any JSON value (nested dicts / lists of numbers and strings).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COST_MODEL_FILES = ("resolve.py", "calibrated.py", "gpu_fit.py", "gpu_spec.py", "gemm_time.py", "comm_fit.py",
                    "collectives.py", "simulate.py", "_op_kernel.py")
STATE_FILES = ("schedule.py", "features.py", "episodes.py", "window.py", "decode.py")  # the policy's state:
# its features, their order


def _digest(folder: Path, names) -> str:
    blob = b"".join((folder / f).read_bytes() for f in names if (folder / f).is_file())
    return hashlib.sha256(blob).hexdigest()[:16]


def source_digest(*folders: str) -> str:
    """sha256 (16 hex digits) of every ``.py`` file under the given folders of the checkout (``"placement_rl/cost"``,
    ``"envs"``, ...), names and bytes, in path order."""
    h = hashlib.sha256()
    for name in folders:
        top = ROOT / name
        for f in sorted(top.rglob("*.py")) if top.is_dir() else ([top] if top.is_file() else []):
            h.update(f.relative_to(ROOT).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def code_hashes() -> dict[str, Any]:
    """``cost_model_sha``, ``state_sha``, ``fits_sha`` (per shipped fit file) and ``source_sha`` (every ``.py`` file
    of the package, ``envs/`` and ``agents/``): what a checkpoint, a cached label or a figure depends on."""
    pkg = Path(__file__).resolve().parent
    cost, data = pkg / "cost", pkg / "data"
    src = hashlib.sha256()
    for top in (pkg, ROOT / "envs", ROOT / "agents"):
        if not top.is_dir():
            continue
        for f in sorted(top.rglob("*.py")):
            src.update(f.relative_to(top.parent).as_posix().encode())
            src.update(f.read_bytes())
    return {"cost_model_sha": _digest(cost, COST_MODEL_FILES), "state_sha": _digest(cost, STATE_FILES),
            "fits_sha": {f.name: _digest(data, [f.name]) for f in sorted(data.glob("*.json"))},
            "source_sha": src.hexdigest()[:16]}


# what benchmarks write and people edit beside the code: a change there (a bench's own plot written before its JSON,
# a README edit while a bench runs) is not a change of the code that measured
REPORT_PATHSPECS = (":(exclude)results", ":(exclude)docs", ":(exclude)README.md", ":(exclude)CHANGELOG.md")


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()


def code_changed(root: Path = ROOT) -> bool:
    """Whether tracked files of the checkout at ``root`` other than the reports differ from its commit."""
    return bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", *REPORT_PATHSPECS, cwd=root))


def git_state() -> tuple[str, bool | None]:
    """``(commit, dirty)``: ``dirty`` when tracked files other than the reports (``REPORT_PATHSPECS``) differ from the
    commit; ``("unknown", None)`` outside a checkout."""
    try:
        commit = _git("rev-parse", "HEAD") or "unknown"
        dirty = code_changed() if commit != "unknown" else None
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return commit, dirty


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("placement-rl", "torch", "numpy", "scipy", "numba"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def provenance() -> dict[str, Any]:
    """Where a figure measured now comes from (see the module doc). Plain JSON values."""
    commit, dirty = git_state()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"commit": commit, "dirty": dirty, **code_hashes(), "versions": versions(), "cpu": cpu_model(),
            "cores": os.cpu_count(), "load": load, "host": platform.node(),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def results_dir() -> Path:
    return Path(os.environ.get("PLACEMENT_RL_RESULTS", ROOT / "results"))


def write_result(name: str, figures: Any, *, seconds: float | None = None, sim_calls: int | None = None,
                 command: str | None = None, folder: Path | None = None) -> Path:
    """Write ``<folder or results/>/<name>.json`` atomically with the provenance of this run; returns the path."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"result name must be a plain file stem, got {name!r}")
    out = Path(folder) if folder is not None else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    doc = {"name": name, "figures": figures, "seconds": seconds, "sim_calls": sim_calls,
           "command": command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
           "provenance": provenance()}
    path = out / f"{name}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    tmp.replace(path)
    return path


def read_result(name: str, folder: Path | None = None) -> dict[str, Any]:
    path = (Path(folder) if folder is not None else results_dir()) / f"{name}.json"
    return json.loads(path.read_text())


__all__ = ["code_hashes", "provenance", "read_result", "results_dir", "source_digest", "write_result"]
