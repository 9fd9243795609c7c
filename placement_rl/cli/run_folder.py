"""A run folder given again (``hydra.run.dir=`` twice): the files an earlier run of the command left there are set
aside before it writes its own (``hydra_app(replaces=...)``), so one folder never holds two runs' results, and put
back where the new run fails (a bad input must not cost the earlier results)."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf


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


MARKER = "metrics.json"  # what every finished run of a command that replaces files writes last
_HELD: dict[Path, Earlier] = {}  # earlier runs' files set aside and not yet put back or deleted, by folder


def held() -> list[Path]:
    """The hidden folders still holding an earlier run's files: what a command that keeps its own files when
    interrupted (or ends at once by a signal, which skips ``restore`` / ``drop``) names in its last line."""
    return sorted(_HELD)


def held_note() -> str:
    """``; the earlier run's files it replaced are in <folder>`` for an interrupt line, or "" where none are held."""
    kept = held()
    return f"; the earlier run's files it replaced are in {', '.join(map(str, kept))}" if kept else ""


def restore_held() -> None:
    """Put back every earlier run's files still set aside (``Earlier.restore``): a command ended at once by a
    signal before it wrote any file of its own."""
    for earlier in list(_HELD.values()):
        earlier.restore()


@dataclass
class Earlier:
    """The files of an earlier run moved out of the way (``set_aside``): ``restore`` puts back those the new run
    did not write again, ``drop`` deletes them."""

    folder: Path
    store: Path | None = None
    names: list[str] = field(default_factory=list)

    def restore(self) -> None:
        if self.store is None:
            return
        for name in self.names:
            src, dst = self.store / name, self.folder / name
            if src.exists() and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
        self.drop()

    def drop(self) -> None:
        if self.store is not None:
            shutil.rmtree(self.store, ignore_errors=True)
            _HELD.pop(self.store, None)
            self.store = None


def set_aside(folder: Path, names: Iterable[str], *, keep: Iterable[Path] = ()) -> Earlier:
    """Move the files matching ``names`` (shell patterns relative to ``folder``, ``sub/name`` in a sub-folder,
    which goes too when that leaves it empty; only files, and never those in ``keep``: the inputs the config names) out of ``folder`` into a hidden folder
    beside it, where an earlier finished run (its ``MARKER``) left them; nothing where none did (a folder of the
    user's own files, or of a run that did not finish: the new run writes the same names)."""
    folder = Path(folder)
    if not (folder / MARKER).is_file():
        return Earlier(folder)
    kept = {Path(p).resolve() for p in keep}
    found = sorted({path.relative_to(folder).as_posix() for pattern in names for path in folder.glob(pattern)
                    if (path.is_file() or path.is_symlink()) and path.resolve() not in kept})
    if not found:
        return Earlier(folder)
    store = Path(tempfile.mkdtemp(prefix=f".{folder.name}-earlier-", dir=folder.parent))
    earlier = _HELD[store] = Earlier(folder, store, found)
    for name in found:
        (store / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(folder / name, store / name)
    for parent in sorted({(folder / n).parent for n in found}, key=lambda p: len(p.parts), reverse=True):
        while parent != folder and folder in parent.parents:
            try:
                parent.rmdir()  # only when empty: a file of the user's keeps it
            except OSError:
                break
            parent = parent.parent
    return earlier
