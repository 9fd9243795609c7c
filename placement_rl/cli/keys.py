"""One config value's type and range (``Key``), checked at the CLI boundary with a one-line error; and which
options a config group offers (the YAML files in ``conf/<group>/`` and a user's ``--config-dir``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

Choices = Sequence[str] | Callable[[], Iterable[str]]


@dataclass(frozen=True)
class Key:
    """One config value: ``kind`` is int, float, bool, str, list or dict; ``low``/``high`` bound numbers (for a
    list, ``low`` is the fewest items; ``open_low``: strictly above ``low``); ``choices`` (a list, or a function
    giving one) bound strings and the items of a list; ``null``: None is allowed."""

    kind: type
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    choices: Choices | None = None
    null: bool = False

    def allowed(self) -> str:
        if self.choices is not None:
            text = "one of " + ", ".join(self._choices())
        elif self.kind in (int, float):
            word = "an integer" if self.kind is int else "a number"
            bounds = []
            if self.low is not None:
                bounds.append(f"{'>' if self.open_low else '>='} {_num(self.low)}")
            if self.high is not None:
                bounds.append(f"<= {_num(self.high)}")
            text = word + (" " + " and ".join(bounds) if bounds else "")
        else:
            text = {bool: "true or false", str: "a string", list: "a list", dict: "a mapping"}.get(self.kind, "?")
        if self.kind is list:
            one = self.low == 1
            some = ("at least one " if one else f"at least {_num(self.low)} ") if self.low else ""
            text = (f"a list of {some}{'name' if one else 'names'} from " + ", ".join(self._choices())
                    if self.choices is not None else f"a list of {some}{'item' if one else 'items'}" if some
                    else "a list")
        return text + (" (or null)" if self.null else "")

    def _choices(self) -> list[str]:
        return list(self.choices() if callable(self.choices) else self.choices)

    def problem(self, value: Any) -> bool:
        """True if ``value`` does not fit."""
        if value is None:
            return not self.null
        if self.kind is bool:
            return not isinstance(value, bool)
        if self.kind in (int, float):
            ok_type = (int,) if self.kind is int else (int, float)
            if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value):
                return True
            if self.low is not None and (value <= self.low if self.open_low else value < self.low):
                return True
            return self.high is not None and value > self.high
        if self.kind is list:
            if not isinstance(value, (list, tuple)) or (self.low is not None and len(value) < self.low):
                return True
            return self.choices is not None and any(v not in self._choices() for v in value)
        if self.kind is dict:
            return not isinstance(value, Mapping)
        if not isinstance(value, str):
            return True
        return self.choices is not None and value not in self._choices()


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class WorkersKey(Key):
    """``workers``: an integer >= 1 or ``auto`` (``placement_rl.scale``)."""

    def allowed(self) -> str:
        return "an integer >= 1 or auto"

    def problem(self, value: Any) -> bool:
        if isinstance(value, str):
            return value != "auto"
        return isinstance(value, bool) or not isinstance(value, int) or value < 1


# ------------------------------------------------------------------------------------- group options
_extra_dirs: list[Path] = []


def set_config_dirs(dirs: Iterable[str | Path]) -> None:
    """User config directories (``--config-dir``) whose ``<group>/*.yaml`` also count as options."""
    _extra_dirs[:] = [Path(d) for d in dirs]


def group_options(group: str) -> list[str]:
    """The options of config group ``group``: the YAML file names in ``conf/<group>/`` and user config dirs."""
    from placement_rl.topology import conf_dir

    names: set[str] = set()
    for base in (conf_dir(), *_extra_dirs):
        folder = base / group
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_"))
            names.update(p.stem for p in folder.glob("*.yml") if not p.stem.startswith("_"))
    return sorted(names)


def option_file(group: str, option: str) -> Path | None:
    """The YAML file of option ``option`` of config group ``group`` (a user's ``--config-dir`` first)."""
    from placement_rl.topology import conf_dir

    for base in (*_extra_dirs, conf_dir()):
        for suffix in (".yaml", ".yml"):
            if (base / group / f"{option}{suffix}").is_file():
                return base / group / f"{option}{suffix}"
    return None


def is_group(name: str) -> bool:
    from placement_rl.topology import conf_dir

    return any((base / name).is_dir() for base in (conf_dir(), *_extra_dirs))
