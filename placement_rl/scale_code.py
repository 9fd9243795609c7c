"""The code a worker runs, as data: its identity, and a copy of the package to ship to a Ray cluster.

``code_identity()`` names what decides a job's result on a worker: the package version, Python's minor version,
torch / numpy / numba versions, ``source_sha`` (every ``.py`` file of ``placement_rl``, ``envs`` and ``agents``:
equal to ``placement_rl.results.code_hashes()["source_sha"]`` in a checkout, and the same value for the same files
installed as a wheel or shipped as one folder) and ``conf_sha`` (the Hydra configs and topology presets).
``mismatch(a, b)`` is the one-line difference of two identities ("" when equal).

``stage_package(folder)`` copies the package as it is installed here (the core, and ``envs`` / ``agents`` /
``conf`` wherever the install maps them from) into ``folder/placement_rl``: one self-contained folder for Ray's
``runtime_env={"working_dir": folder}``, so every worker of a cluster imports the driver's code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import platform
import shutil
from pathlib import Path
from typing import Any

SUBPACKAGES = ("envs", "agents", "conf")  # installed as placement_rl.<name>, mapped from the checkout's top level
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.tmp", ".*")


def package_roots() -> dict[str, Path]:
    """``{"placement_rl": folder, "envs": folder, "agents": folder, "conf": folder}`` as imported here."""
    out: dict[str, Path] = {}
    for label in ("placement_rl", *SUBPACKAGES):
        name = label if label == "placement_rl" else f"placement_rl.{label}"
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            out[label] = Path(next(iter(spec.submodule_search_locations))).resolve()
    return out


def _files(roots: dict[str, Path], label: str, pattern: str) -> list[tuple[str, Path]]:
    """``(name, path)`` of the files matching ``pattern`` of one part, named as in a checkout (``agents/x.py``);
    the core's own listing leaves out the subpackages nested in it (a wheel or a shipped copy)."""
    top = roots[label]
    nested = [roots[s] for s in SUBPACKAGES if s in roots and s != label and roots[s] != top]
    out = []
    for f in sorted(top.rglob(pattern)):
        if "__pycache__" in f.parts or any(n in f.parents for n in nested if n.is_relative_to(top)):
            continue
        out.append((f"{label}/{f.relative_to(top).as_posix()}", f))
    return out


def _sha(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for name, path in files:
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def staged_roots(dest: Path) -> dict[str, Path]:
    """``package_roots`` of a copy made by ``stage_package`` (every part nested in ``dest``)."""
    return {"placement_rl": dest, **{s: dest / s for s in SUBPACKAGES if (dest / s).is_dir()}}


def code_identity(roots: dict[str, Path] | None = None) -> dict[str, str]:
    """What a job's result depends on besides its inputs (see the module doc), of the package imported here or
    of the folders ``roots``. Plain strings."""
    from importlib import metadata

    import placement_rl

    roots = package_roots() if roots is None else roots
    src = [x for label in ("placement_rl", "envs", "agents") if label in roots for x in _files(roots, label, "*.py")]
    conf = _files(roots, "conf", "*.yaml") if "conf" in roots else []
    out = {"placement-rl": placement_rl.__version__, "python": ".".join(platform.python_version_tuple()[:2]),
           "source_sha": _sha(src), "conf_sha": _sha(conf)}
    for pkg in ("torch", "numpy", "numba"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def mismatch(here: dict[str, Any], there: dict[str, Any]) -> str:
    """``"source_sha 1a2b.. here, 3c4d.. there; torch ..."`` for every key that differs; "" when equal."""
    keys = sorted(set(here) | set(there))
    return "; ".join(f"{k} {here.get(k, 'absent')} here, {there.get(k, 'absent')} there"
                     for k in keys if here.get(k) != there.get(k))


def stage_package(folder: Path) -> Path:
    """A self-contained copy of the installed package at ``folder/placement_rl`` (sources, configs, package
    data; no caches); returns it."""
    roots = package_roots()
    dest = Path(folder) / "placement_rl"
    core = roots["placement_rl"]
    nested = {roots[s].name for s in SUBPACKAGES if s in roots and roots[s].parent == core}

    def skip(where: str, names: list[str]) -> set[str]:
        out = set(_SKIP(where, names))
        if Path(where) == core:
            out |= nested  # copied from their own roots below
        return out

    shutil.copytree(core, dest, ignore=skip)
    for label in SUBPACKAGES:
        if label in roots and roots[label] != dest / label:
            shutil.copytree(roots[label], dest / label, ignore=_SKIP, dirs_exist_ok=True)
    return dest


__all__ = ["code_identity", "mismatch", "package_roots", "stage_package", "staged_roots"]
