"""One source for each configuration: the structured configs (``placement_rl.cli.configs``) declare every field,
its type, range and default; the command YAML files set the same defaults, the group YAML files are presets that
fit the group's dataclass, the schema checks are derived from the dataclasses, and the shipped training recipe is
what the Python defaults run."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from omegaconf import OmegaConf

from placement_rl.cli import configs, schema
from placement_rl.cli.common import _compose
from placement_rl.topology import conf_dir

GROUPS_IN_COMMANDS = ("graph", "topology", "env", "agent", "encoder", "trainer", "experiment")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and not (prefix + k).endswith("overrides"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("command", sorted(configs.COMMAND_SCHEMAS))
def test_the_cli_composes_each_commands_python_defaults(command):
    """Every key a command's YAML sets (outside the config groups) is a field of its dataclass, with the
    dataclass's default as its value: the CLI's composed config equals the Python defaults."""
    cfg, _ = _compose(command, [], [])
    composed = {k: v for k, v in _flat(cfg).items() if k.split(".")[0] not in GROUPS_IN_COMMANDS}
    defaults = configs.defaults_of(configs.COMMAND_SCHEMAS[command])
    undeclared = sorted(set(composed) - set(defaults))
    assert not undeclared, f"conf/{command}.yaml sets {undeclared}: declare them in placement_rl/cli/configs.py"
    differ = {k: (composed[k], defaults[k]) for k in composed if composed[k] != defaults[k]}
    assert not differ, f"conf/{command}.yaml and {configs.COMMAND_SCHEMAS[command].__name__} disagree: {differ}"


def _presets(group: str) -> list[tuple[str, dict]]:
    """``(preset, {group-relative dotted key: value})`` of every YAML of a group; ``@package _global_`` presets
    (trainer=pretrain sets agent.* and encoder.* too) give each key under its own group."""
    out = []
    for path in sorted((conf_dir() / group).glob("*.yaml")):
        text = path.read_text()
        data = {k: v for k, v in (yaml.safe_load(text) or {}).items() if k != "defaults"}
        if "@package _global_" in text:
            out += [(f"{path.stem}:{g}", _flat(v)) for g, v in data.items() if isinstance(v, dict)]
        else:
            out.append((f"{path.stem}:{group}", _flat(data)))
    return out


@pytest.mark.parametrize("group", ["graph", "env", "agent", "encoder", "trainer"])
def test_every_group_preset_fits_its_dataclass(group):
    for preset, values in _presets(group):
        target = preset.split(":")[1]
        table = schema.GROUPS[target]
        unknown = sorted(k for k in values if k not in table and not k.startswith("overrides"))
        assert not unknown, f"conf/{group}/{preset.split(':')[0]}.yaml sets {unknown}, not declared in " \
                            f"{configs.GROUP_SCHEMAS[target].__name__}"
        bad = {k: v for k, v in values.items() if k in table and table[k].problem(v)}
        assert not bad, f"conf/{group}/{preset}: {bad} outside the declared type / range"


def test_the_schema_checks_are_derived_from_the_dataclasses():
    assert schema.COMMANDS["evaluate"]["budget"].allowed() == "an integer >= 1"
    assert schema.GROUPS["agent"]["clip"].allowed() == "a number > 0 and <= 1"
    assert schema.GROUPS["graph"]["coarsen.max_nodes"].allowed() == "an integer >= 1 (or null)"
    assert schema.COMMANDS["train"]["workers"].allowed() == "an integer >= 1 or auto"
    for name, cls in {**configs.COMMAND_SCHEMAS, **configs.GROUP_SCHEMAS}.items():
        table = schema.COMMANDS.get(name) if name in configs.COMMAND_SCHEMAS else schema.GROUPS[name]
        assert set(configs.keys_of(cls)) <= set(table)


def test_the_dataclasses_are_hydra_structured_configs():
    configs.register_configs()
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, cls in {**configs.COMMAND_SCHEMAS, **configs.GROUP_SCHEMAS}.items():
        node = store.load(f"schema/{name}.yaml").node
        assert OmegaConf.get_type(node) is cls
        typed = OmegaConf.structured(cls)
        for f in dataclasses.fields(cls):
            assert f.name in typed or OmegaConf.is_missing(typed, f.name)
    with pytest.raises(Exception, match="budget"):
        OmegaConf.merge(OmegaConf.structured(configs.EvaluateConfig), {"budget": "many"})


def test_the_python_defaults_run_the_shipped_recipe():
    """``pretrain(PretrainSpec(), ConstructiveConfig())`` from Python is the recipe ``placement-rl train
    trainer=pretrain`` runs: every field the recipe sets has the same value as the Python default."""
    differ = configs.recipe_differences()
    assert not differ, "recipe vs Python default: " + ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in
                                                                  differ.items())


def test_recipe_differences_sees_a_difference():
    """The comparison itself: a recipe override that moves a field away from its Python default is reported."""
    from placement_rl.agents.constructive_config import ConstructiveConfig

    hidden = ConstructiveConfig().hidden
    differ = configs.recipe_differences(["trainer=pretrain", f"encoder.hidden={hidden + 1}"])
    assert differ["ConstructiveConfig.hidden"] == (hidden + 1, hidden)


def _python_agent_defaults() -> dict:
    """``ConstructiveConfig``'s defaults (the Python API's, which are the pretraining recipe)."""
    from placement_rl.agents.constructive_config import ConstructiveConfig

    return {f.name: f.default for f in dataclasses.fields(ConstructiveConfig)}


def test_the_agent_groups_constructive_defaults_are_the_python_ones():
    """Every field ``AgentConfig`` shares with ``ConstructiveConfig`` has its default (null: decided elsewhere, by
    the checkpoint), so each constructive default is defined once, for the CLI and the Python API alike."""
    cli, python = configs.defaults_of(configs.AgentConfig), _python_agent_defaults()
    differ = {k: (cli[k], python[k]) for k in sorted(cli.keys() & python.keys())
              if cli[k] is not None and cli[k] != python[k]}
    assert not differ, f"AgentConfig vs ConstructiveConfig defaults: {differ}"


def test_the_fine_tuning_preset_departs_from_the_python_defaults_only_where_the_recipe_differs():
    """``agent=constructive`` (what ``placement-rl train`` fine-tunes with) sets a value other than the Python
    default only for a field ``trainer=pretrain`` sets back to it: the fine-tuning values (rl_algo, rl_lr, ...)
    and the recipe's are the two sides of one split, and no other field has a second default."""
    preset = yaml.safe_load((conf_dir() / "agent" / "constructive.yaml").read_text())
    recipe = yaml.safe_load((conf_dir() / "trainer" / "pretrain.yaml").read_text())["agent"]
    python = _python_agent_defaults()
    stray = {k: (v, python[k]) for k, v in sorted(preset.items())
             if k in python and v is not None and v != python[k] and k not in recipe}
    assert not stray, f"conf/agent/constructive.yaml vs ConstructiveConfig defaults: {stray}"
