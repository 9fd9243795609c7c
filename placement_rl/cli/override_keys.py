"""What a command line's overrides mean when Hydra cannot take them: a key of another command, of a config group the
command does not compose, of another option of a group, or of another graph source; and keys added with ``+`` that
no schema of the command reads. Each becomes one line naming what to fix (``cli.common`` raises or prints it)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from omegaconf import OmegaConf

from placement_rl.errors import ConfigError


def own_groups_only(config_name: str, overrides: list[str]) -> None:
    """``ConfigError`` for an override choosing a config group the command does not compose (``evaluate agent=ppo``:
    Hydra advises ``+agent=ppo``, which then adds a group nothing reads)."""
    from placement_rl.cli.help import command_groups
    from placement_rl.cli.keys import is_group

    own = command_groups(config_name) + (["experiment"] if config_name == "train" else [])  # +experiment=<name>
    for o in overrides:
        name, eq, _ = o.partition("=")
        group = name.lstrip("+~")
        if eq and "." not in group and "/" not in group and group not in own and is_group(group) \
                and group not in ("hydra", "base", "schema"):
            raise ConfigError(f"{name}=: placement-rl {config_name} takes no {group} group (its groups: "
                              f"{', '.join(own) or 'none'}); {group}= is read by placement-rl train")


def added_keys(config_name: str, overrides: Iterable[str]) -> list[str]:
    """A note for each ``+key=`` / ``++key=`` override adding a key no schema of the command declares
    (``schema.declared``): the run goes on (a key read before it is declared works), but nothing may read it
    (``inspect +budget=5``: a key of evaluate)."""
    from placement_rl.cli import schema
    from placement_rl.cli.keys import is_group

    notes = []
    for o in overrides:
        name, eq, _ = o.partition("=")
        key = name.lstrip("+")
        if not eq or not name.startswith("+") or "@" in key or "/" in key or key.split(".")[0] == "hydra" \
                or ("." not in key and is_group(key)) or schema.declared(config_name, key):
            continue
        others = commands_with(key, but=config_name)
        notes.append(f"note: {o} adds a key placement-rl {config_name} does not read"
                     + (f" ({key} is a key of placement-rl {_and(others)})" if others else ""))
    return notes


# graph keys of one source only: the override that sets one on a graph of another source means that source
GRAPH_SOURCE_KEYS = {"family": "synthetic", "num_nodes": "synthetic", "model_type": "hf", "config": "hf",
                     "task": "hf", "seq_len": "hf", "attention": "hf"}


def other_source(exc: BaseException) -> str | None:
    """For ``graph.<key>=`` where the graph is of a source without that key (``graph.model_type=llama`` on the
    default zoo graph), the preset to add: Hydra's own advice (``+graph.model_type=``) would add a key the graph
    then ignores or refuses."""
    import re

    m = re.match(r"Could not override 'graph\.(\w+)'", str(exc))
    source = GRAPH_SOURCE_KEYS.get(m.group(1)) if m else None
    if source is None:
        return None
    return (f"graph.{m.group(1)} is a key of graph={source}, which this graph is not: add graph={source} (e.g. "
            + ("graph=synthetic graph.family=layered graph.num_nodes=500)" if source == "synthetic" else
               "graph=hf graph.model_type=llama +graph.overrides.num_hidden_layers=4)"))


def unknown_key(exc: BaseException, command: str, overrides: Iterable[str] = ()) -> str | None:
    """For an override of a key the config lacks that is close to one it has (``trainer.total_stepz``), that key:
    Hydra's own advice (``+trainer.total_stepz=``) adds a key nothing reads, and the run goes on without it. For a
    key of other options of its group (``agent.n_envs`` with ``agent=constructive``), those options. For a key of
    other commands (``deploy samples=3``) or of a group this command does not compose (``evaluate agent.lr=``),
    those commands."""
    import difflib
    import re

    from placement_rl.cli import schema
    from placement_rl.cli.help import command_groups
    from placement_rl.cli.schema import COMMANDS, GROUPS

    m = re.match(r"Could not override '([\w.]+)'", str(exc))
    if m is None:
        return None
    key = m.group(1)
    head, _, rest = key.partition(".")
    if rest and head in GROUPS and head not in command_groups(command):
        return _group_elsewhere(command, key)
    known = [f"{head}.{k}" for k in GROUPS[head]] if head in GROUPS and rest else list(COMMANDS.get(command, {}))
    close = difflib.get_close_matches(key, known, n=1)
    if close and close[0] == key:  # a key of the group, not of the option chosen
        having = _options_with(head, rest)
        chosen = _chosen_option(command, head, overrides)
        if having:
            fix = f"add {head}={having[0]}" if len(having) == 1 else "choose one of those"
            return (f"{key} is a key of {head}={'|'.join(having)}, not of {head}={chosen or '?'}: {fix}"
                    f" (in a sweep over {head}, ++{key}=... sets it in every job, added where the option lacks it)")
        close = []  # declared for the group, set by none of its options: Hydra's advice (+key=) adds it
    if schema.declared(command, key):  # in a mapping or open subtree this command reads (graph.overrides.n_layers,
        return (f"'{key}' is not in the composed config, which reads it: add it with +{key}=<value>")  # topology.dtype)
    others = [] if head in GROUPS and rest else commands_with(key, but=command)  # a group's: the same everywhere
    if others:
        return (f"{key} is not a key of placement-rl {command} (it is a key of placement-rl {_and(others)})"
                + (f": did you mean {close[0]}?" if close else ""))
    if not close:
        return None
    return f"'{key}' is not a key of this config: did you mean {close[0]}? (+{key}= would add a key nothing reads)"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def commands_with(key: str, but: str = "") -> list[str]:
    """The commands other than ``but`` whose schema declares ``key`` (dotted, as the command line names it), their
    own or of a config group they compose."""
    from placement_rl.cli.help import command_groups
    from placement_rl.cli.schema import COMMANDS, GROUPS

    head, _, rest = key.partition(".")
    return [c for c, table in COMMANDS.items() if c != but and (
        key in table or (rest in GROUPS.get(head, {}) and head in command_groups(c)))]


def _group_elsewhere(command: str, key: str) -> str:
    """The line for ``key`` of a config group that ``command`` does not compose (as ``own_groups_only``)."""
    from placement_rl.cli.help import command_groups
    from placement_rl.cli.schema import COMMANDS

    head = key.split(".", 1)[0]
    users = [c for c in COMMANDS if c != command and head in command_groups(c)]
    return (f"{key}: placement-rl {command} takes no {head} group (its groups: "
            f"{', '.join(command_groups(command)) or 'none'})" + (f"; {head}.* is read by placement-rl "
                                                                     f"{_and(users)}" if users else ""))


_ABSENT = object()  # a key a YAML file does not set (one it sets to null is set)


def _options_with(group: str, key: str) -> list[str]:
    """The options of config group ``group`` whose YAML file sets ``key`` (dotted; in a file of ``# @package
    _global_``, such as ``trainer/pretrain.yaml``, at ``<group>.<key>``)."""
    from placement_rl.cli.keys import group_options, option_file

    out = []
    for option in group_options(group):
        path = option_file(group, option)
        try:
            where = f"{group}.{key}" if path is not None and _global_package(path) else key
            if path is not None and OmegaConf.select(OmegaConf.load(path), where, default=_ABSENT) is not _ABSENT:
                out.append(option)
        except Exception:  # noqa: BLE001 - a file Hydra reports itself when it is chosen
            continue
    return out


def _global_package(path: Path) -> bool:
    """Whether a config group's YAML file places its keys at the top of the config (a ``# @package _global_``
    header line before its first key)."""
    for line in path.read_text().splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            return False
        if text.replace(" ", "") == "#@package_global_":
            return True
    return False


def _chosen_option(command: str, group: str, overrides: Iterable[str]) -> str | None:
    """The option of ``group`` a command line chooses: its override (``agent=ppo``), else the command's default."""
    chosen = None
    for o in overrides:
        name, eq, value = o.partition("=")
        if eq and name.lstrip("+") == group:
            chosen = value
    if chosen is not None:
        return chosen
    from placement_rl.cli.help import command_defaults

    return command_defaults(command).get(group)
