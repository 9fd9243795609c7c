"""A run folder given again (``hydra.run.dir=`` twice): the files an earlier run of the command left there go before
it writes its own (``hydra_app(replaces=...)``), so one folder never holds two runs' results."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf


def remove_earlier(folder: Path, names: Iterable[str], *, keep: Iterable[Path] = ()) -> list[str]:
    """Remove the files matching ``names`` (shell patterns relative to ``folder``, ``sub/name`` in a sub-folder,
    which goes too when that leaves it empty) that an earlier run left in ``folder``, but not those in ``keep``
    (the files the config names: an input read from there); only files, never a folder of the user's. Returns
    the names removed, relative to ``folder``, sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    kept = {Path(p).resolve() for p in keep}
    removed, parents = [], set()
    for pattern in names:
        for path in folder.glob(pattern):
            if (path.is_file() or path.is_symlink()) and path.resolve() not in kept:
                path.unlink()
                removed.append(path.relative_to(folder).as_posix())
                parents.add(path.parent)
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        while parent != folder and folder in parent.parents:
            try:
                parent.rmdir()  # only when empty: a file of the user's keeps it
            except OSError:
                break
            parent = parent.parent
    return sorted(set(removed))


def config_paths(cfg: DictConfig | dict) -> list[Path]:
    """Every string of the config that names an existing file (the inputs a run reads)."""
    found: list[Path] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)
        elif isinstance(node, str) and node and "\n" not in node:
            try:
                if Path(node).is_file():
                    found.append(Path(node))
            except (OSError, ValueError):  # a string that is no path (too long, a NUL)
                pass

    walk(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg)
    return found


def listed(names: list[str], most: int = 12) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
