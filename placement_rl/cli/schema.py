"""Typed configs for every CLI command, checked at the CLI boundary before any work (and before Hydra makes a run
directory): a wrong type, an unknown name, a negative count or an out-of-range value is one line naming the key and
what it accepts (``ConfigError`` -> exit code 2).

* ``Key`` (``placement_rl.cli.keys``) describes one config value: its type, range, choices, whether null is allowed.
* ``GROUPS`` holds the keys of each config group (``graph``, ``topology``, ``env``, ``agent``, ``encoder``,
  ``trainer``), checked whenever that group is in a command's config; ``COMMANDS`` holds each command's own keys.
  Both are derived from the structured configs (``placement_rl.cli.configs``: one dataclass per command and per
  group, the single definition of every field's type, range and default). Keys not listed are left alone (so a
  new key works before it is declared), ``register`` adds one.
* Which options a group offers is read from the YAML files in ``conf/<group>/`` (and a user's ``--config-dir``),
  never from a list in code: ``check_group_choice`` refuses ``graph=foo`` before Hydra tries to compose it.

Register a key (e.g. in the module that adds it, or here)::

    from placement_rl.cli.schema import Key, register
    register("place", "samples", Key(int, low=0))                # a command's own key
    register("env", "options.horizon", Key(int, low=1, null=True))   # a key of a config group
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from placement_rl.cli.configs import COMMAND_SCHEMAS, GROUP_SCHEMAS, _zoo_names, defaults_of, keys_of
from placement_rl.cli.keys import (Key, WorkersKey, group_options, is_group,  # noqa: F401 (re-exported)
                                   set_config_dirs)
from placement_rl.errors import ConfigError


# helpers for ``register`` (a key declared outside the structured configs)
def count(low: int = 0, *, null: bool = False) -> Key:
    return Key(int, low=low, null=null)


def positive(*, null: bool = False) -> Key:
    return Key(float, low=0, open_low=True, null=null)


def fraction(*, open_low: bool = False) -> Key:
    return Key(float, low=0, high=1, open_low=open_low)


FLAG = Key(bool)
SEED = count(0)
OPTIONAL_STR = Key(str, null=True)
WORKERS = WorkersKey(int)

GROUPS: dict[str, dict[str, Key]] = {name: keys_of(cls) for name, cls in GROUP_SCHEMAS.items()}
COMMANDS: dict[str, dict[str, Key]] = {name: keys_of(cls) for name, cls in COMMAND_SCHEMAS.items()}

# how to fix a missing mandatory value (``???`` in the YAML)
REQUIRED_HINT = {"checkpoint": "checkpoint=<checkpoint.pt>", "plan": "plan=<plan.json | placement.json>"}
# each command's mandatory keys (``???`` in its schema): an empty value (``deploy plan=``) is missing as well
REQUIRED: dict[str, list[str]] = {name: [k for k, v in defaults_of(cls).items() if v == "???"]
                                  for name, cls in COMMAND_SCHEMAS.items()}


def register(where: str, key: str, spec: Key) -> None:
    """Check ``key`` (dotted, relative to the group or command) of config group or command ``where``."""
    table = GROUPS.get(where) if where in GROUPS else COMMANDS.setdefault(where, {})
    table[key] = spec


def sweep_values(override: str) -> list[str] | None:
    """The values a Hydra sweep override lists (``k=a,b``, ``k=choice(a,b)``, ``k=range(0,3)``), each as Hydra
    passes it to a job; ``[]`` for ``k=glob(...)`` (Hydra expands it against the options); None for a plain
    override or one Hydra's parser refuses (Hydra reports that itself)."""
    if "=" not in override or override.startswith("~"):
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    try:
        parsed = OverridesParser.create().parse_override(override)
        if not parsed.is_sweep_override():
            return None
        return [] if isinstance(parsed.value(), Glob) else list(parsed.sweep_string_iterator())
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's own message when it parses the command line
        return None


FILE_GROUPS = ("graph", "topology")  # groups whose config also takes a file (``<group>.path=``)


def check_group_choice(override: str) -> None:
    """Refuse ``group=<option>`` (also ``+group=``, ``group@pkg=``, and each value of a sweep ``group=a,b``,
    ``group=choice(a,b)``) when no such YAML file exists."""
    if "=" not in override or override.startswith("~"):
        return
    key, value = override.split("=", 1)
    key = key.lstrip("+").split("@", 1)[0]
    if "." in key or "/" in key or not key or not is_group(key) or value in ("", "null"):
        return
    options = group_options(key)
    values = sweep_values(override)
    for v in values if values is not None else [value]:  # glob(): []
        if v not in options:
            within = f" (in {key}={value})" if values is not None else ""
            hint = (f" (a file is given as {key}.path={v})" if key in FILE_GROUPS and ("/" in v or v.endswith(
                (".yaml", ".yml", ".json"))) else "")
            raise ConfigError(f"{key}={v}{within}: no such {key}{hint}; choose one of {', '.join(options)}")


# overrides a command refuses before Hydra composes (a key its config does not have, with what to do instead)
REFUSED: dict[str, dict[str, str]] = {
    "profile": {"graph.path": "profile needs a zoo model (graph=<name>): profiling runs the model's real ops"},
}


def check_override(command: str, override: str) -> None:
    """``check_group_choice``, and refuse an override ``REFUSED`` lists for ``command``."""
    if "=" in override and not override.startswith("~"):
        key = override.split("=", 1)[0].lstrip("+")
        why = REFUSED.get(command, {}).get(key)
        if why is not None:
            raise ConfigError(f"{override}: {why}")
    check_group_choice(override)


# config subtrees whose keys are declared nowhere here: their reader takes them (a topology preset's fields, which
# the topology reader checks; the env's keyword options)
OPEN = ("topology", "env.options")


def declared(command: str, key: str) -> bool:
    """Whether a schema of ``command`` declares ``key`` (dotted): one of its own keys or of a config group it
    composes, a mapping above such keys (``trainer.pretrain``), or a key inside a mapping-valued key
    (``graph.overrides.n_layers``) or an ``OPEN`` subtree of a group it composes."""
    from placement_rl.cli.help import command_groups

    groups = command_groups(command)
    table = {**COMMANDS.get(command, {}),
             **{f"{g}.{k}": spec for g in groups if g in GROUPS for k, spec in GROUPS[g].items()}}
    free = [k for k, spec in table.items() if spec.kind is dict] + [o for o in OPEN if o.split(".")[0] in groups]
    return (key in table or key in free or any(k.startswith(f"{key}.") for k in table)
            or any(key.startswith(f"{k}.") for k in free))


# ------------------------------------------------------------------------------------------- paths
def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:  # exists() is False under a file as well
        path = path.parent
    return path


def check_output_dir(path: str | Path, what: str, *, shown: str | Path | None = None) -> None:
    """Refuse a folder that cannot be made or written in (``what``: the key naming it, e.g. ``hydra.run.dir``,
    ``shown``: its value when that is not ``path``): a file on its way, a read-only or virtual file system
    (/proc, /sys). Probes with a temporary folder, removed at once."""
    import os
    import tempfile

    shown = path if shown is None else shown
    base = _nearest_existing(Path(path).absolute())
    if not base.is_dir():
        raise ConfigError(f"{what}={shown}: {base} is a file, not a folder; choose another {what}")
    try:
        os.rmdir(tempfile.mkdtemp(dir=base, prefix=".placement-rl-probe-"))
    except OSError as exc:
        raise ConfigError(f"{what}={shown}: cannot create files in {base} ({exc.strerror or exc}); choose another "
                          f"{what}") from None


def check_output_file(path: str | Path, what: str) -> None:
    """Refuse a file path that cannot be written: a folder of that name, or a folder that cannot be made."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{what}={path} is a folder; give a file path")
    check_output_dir(target.absolute().parent, what, shown=path)


def check_not_folders(folder: Path, names: Iterable[str]) -> None:
    """Refuse a run folder that holds a folder where a command will write file ``name`` (before any work)."""
    for name in names:
        if (folder / name).is_dir():
            raise ConfigError(f"{folder / name} is a folder but this command writes a file there: remove it or "
                              "choose another hydra.run.dir")


def check_not_files(folder: Path, names: Iterable[str], why: str) -> None:
    """Refuse a run folder that holds a file where a command will make folder ``name`` (before any work)."""
    for name in names:
        if (folder / name).exists() and not (folder / name).is_dir():
            raise ConfigError(f"{folder / name} is a file; {why} in a folder of that name (remove the file or choose "
                              "another hydra.run.dir)")


# files a command's config names that it writes (checked before any work)
OUTPUT_FILES: dict[str, tuple[str, ...]] = {"profile": ("output",)}


# ------------------------------------------------------------------------------------------ checking
def _get(cfg: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _check(prefix: str, table: Mapping[str, Key], cfg: Mapping[str, Any]) -> None:
    for key, spec in table.items():
        present, value = _get(cfg, key)
        if not present:
            continue
        name = f"{prefix}{key}"
        if value == "???":
            hint = REQUIRED_HINT.get(name, f"{name}=<value>")
            raise ConfigError(f"{name} is required: add {hint}")
        if spec.kind is list and isinstance(value, (list, tuple)) and spec.low and len(value) < spec.low:
            some = "one name" if spec.low == 1 else f"{_show(spec.low)} names"
            raise ConfigError(f"{name}={_show(value)}: give at least {some}"
                              + (", or null for all" if spec.null else ""))
        if spec.kind is list and spec.choices is not None and isinstance(value, (list, tuple)):
            bad = [v for v in value if v not in spec._choices()]
            if bad:
                raise ConfigError(f"{name}: no such name {_show(bad[0])}; choose from {', '.join(spec._choices())}")
        if spec.problem(value):
            raise ConfigError(f"{name}={_show(value)}: must be {spec.allowed()}")


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value if not isinstance(value, (list, tuple)) else list(value))


def validate(command: str, cfg: Mapping[str, Any]) -> None:
    """Check a composed config (plain containers, unresolved ``???`` kept) of ``command``; ``ConfigError`` on the
    first bad value."""
    for key in REQUIRED.get(command, ()):
        present, value = _get(cfg, key)
        if present and isinstance(value, str) and not value.strip():
            raise ConfigError(f"{key} is required: add {REQUIRED_HINT.get(key, f'{key}=<value>')}")
    _check("", COMMANDS.get(command, {}), cfg)
    for group, table in GROUPS.items():
        sub = cfg.get(group)
        if isinstance(sub, Mapping):
            _check(f"{group}.", table, sub)
    for key in OUTPUT_FILES.get(command, ()):
        if cfg.get(key):
            check_output_file(str(cfg[key]), key)
    topology = cfg.get("topology")
    if isinstance(topology, Mapping) and topology.get("path"):
        import logging

        from placement_rl.topology import load_topology

        reader = logging.getLogger("placement_rl._topology_reader")
        level = reader.level
        reader.setLevel(logging.WARNING)  # its datasheet lines come once, from the load that builds the topology
        try:
            load_topology(str(topology["path"]))  # a bad file: its reader's one-line TopologyError, before any work
        finally:
            reader.setLevel(level)
    graph = cfg.get("graph")
    if isinstance(graph, Mapping) and graph.get("path") and Path(str(graph["path"])).is_dir():
        raise ConfigError(f"graph.path={graph['path']} is a folder; give a graph JSON file (e.g. the graph.json "
                          "that inspect, train or place write)")
    if command == "profile" and isinstance(graph, Mapping) and not cfg.get("measurements") \
            and (graph.get("path") or graph.get("source", "zoo") != "zoo"):
        raise ConfigError(REFUSED["profile"]["graph.path"])
    if isinstance(graph, Mapping) and not graph.get("path") and graph.get("source", "zoo") == "zoo" \
            and "name" in graph:
        names = _zoo_names()
        if graph["name"] not in names:
            raise ConfigError(f"graph.name={_show(graph['name'])}: no such zoo model; choose one of "
                              f"{', '.join(names)} (or graph.path=<graph.json>)")
        overrides = graph.get("overrides") or {}
        if overrides:
            from placement_rl.graph import zoo

            try:
                zoo.resolve_options(str(graph["name"]), dict(overrides))
            except Exception as exc:  # GraphError: unknown option or wrong type
                raise ConfigError(f"graph.overrides: {str(exc).splitlines()[0]}") from None


def implied_overrides(command: str, overrides: Sequence[str]) -> list[str]:
    """Overrides a command's explicit ones imply: ``evaluate graph=... / topology=...`` means that one case
    (``suite=single``); with an explicit ``suite=default`` it is refused, so nothing is silently ignored."""
    if command != "evaluate":
        return []
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    case = [k for k in keys if k.split(".")[0].split("@")[0] in ("graph", "topology")]
    suite = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "suite"]
    if not case:
        return []
    if not suite:
        return ["suite=single"]
    if suite[-1] == "default" and not any(k == "plan" for k in keys):
        raise ConfigError(f"{case[0]}= picks one case but suite=default runs the built-in suite: "
                          "use suite=single (or drop the graph/topology overrides)")
    return []
