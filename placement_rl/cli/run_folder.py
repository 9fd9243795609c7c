"""A run folder given again (``hydra.run.dir=`` twice): the files an earlier run of the command left there are set
aside before it writes its own (``hydra_app(replaces=...)``), so one folder never holds two runs' results, and put
back where the new run fails (a bad input must not cost the earlier results). Hydra's own files of the earlier run
(``.hydra/``, the job's log) go with them, set aside before Hydra writes this run's (``set_aside_hydra``): a run
that fails or is interrupted before it wrote a file of its own leaves the folder exactly as the earlier run left
it, one that finishes leaves only its own, and one interrupted after writing keeps its own beside its Hydra files,
the earlier run's all in the hidden folder its line names."""
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
    hydra: list[str] = field(default_factory=list)  # of ``names``, Hydra's (``set_aside_hydra``): put back over

    def restore(self) -> None:
        if self.store is None:
            return
        for name in self.names:
            src, dst = self.store / name, self.folder / name
            if src.exists() and (name in self.hydra or not dst.exists()):
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
        self.drop()

    def drop(self) -> None:
        if self.store is not None:
            shutil.rmtree(self.store, ignore_errors=True)
            _HELD.pop(self.store, None)
            self.store = None


def set_aside(folder: Path, names: Iterable[str], *, keep: Iterable[Path] = (), into: Earlier | None = None
              ) -> Earlier:
    """Move the files matching ``names`` (shell patterns relative to ``folder``, ``sub/name`` in a sub-folder,
    which goes too when that leaves it empty; only files, and never those in ``keep``: the inputs the config names)
    out of ``folder`` into a hidden folder beside it, where an earlier finished run (its ``MARKER``) left them;
    nothing where none did (a folder of the user's own files, or of a run that did not finish: the new run writes
    the same names). ``into``: the earlier run's files of ``folder`` already set aside (``set_aside_hydra``), which
    these join (one hidden folder per earlier run)."""
    folder = Path(folder)
    if into is not None and Path(into.folder).resolve() != folder.resolve():
        into = None
    none = into if into is not None else Earlier(folder)
    if not (folder / MARKER).is_file():
        return none
    kept = {Path(p).resolve() for p in keep}
    found = sorted({path.relative_to(folder).as_posix() for pattern in names for path in folder.glob(pattern)
                    if (path.is_file() or path.is_symlink()) and path.resolve() not in kept})
    if not found:
        return none
    if into is not None and into.store is not None:
        earlier, store = into, into.store
        earlier.names += found
    else:
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


def _given(overrides: list[str], key: str) -> str | None:
    """The value the last ``key=`` of ``overrides`` gives, as Hydra parses it; None where none does."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [o for o in overrides if o.lstrip("+").split("=", 1)[0] == key]
    if not given:
        return None
    try:
        value = OverridesParser.create().parse_override(given[-1]).value()
    except Exception:  # noqa: BLE001 - Hydra refuses it itself, in its own line
        return None
    return value if isinstance(value, str) and value and "${" not in value else None


def set_aside_hydra(task: Any, overrides: list[str]) -> list[Earlier]:
    """Before Hydra writes a single run's config (``.hydra/``) and opens its log (``<hydra.job.name>.log``) in the
    folder ``hydra.run.dir=`` names (a plain path: one with ``${...}``, such as the default time-stamped one, is new
    to each run), set aside those an earlier finished run left there (``set_aside``), to join the command's own
    (``set_aside(into=...)``). Put back over this run's where the run fails or is interrupted before writing a
    file of its own (the folder is the earlier run's again), deleted with the rest where it finishes (this run's
    log holds its own lines only), kept with the rest where it is interrupted after writing. ``task``: the
    function Hydra runs, which names the job. The earlier run's files set aside, or [] where none are."""
    folder = _given(overrides, "hydra.run.dir")
    if folder is None:
        return []
    job = _given(overrides, "hydra.job.name")
    if job is None:
        try:  # Hydra's own rule for the job's name (a private helper: where a release moves it, nothing is set aside)
            from hydra._internal.utils import detect_calling_file_or_module_from_task_function, detect_task_name

            job = detect_task_name(*detect_calling_file_or_module_from_task_function(task))
        except Exception:  # noqa: BLE001
            return []
    config = _given(overrides, "hydra.output_subdir") or ".hydra"
    earlier = set_aside(Path(folder), (f"{config}/*", f"{job}.log"))
    earlier.hydra = list(earlier.names)
    return [earlier] if earlier.store is not None else []
