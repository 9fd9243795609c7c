"""``placement-rl <command> --help``: Hydra's help with only the config groups the command composes.

Every command shares ``conf/``, so Hydra's own help listed every group there (``deploy --help`` offered ``agent``,
``encoder`` and ``trainer``, which deploy never reads). The groups a command takes are those its primary YAML's
``defaults`` list names; their options are the YAML files of ``conf/<group>/`` (and a user's ``--config-dir``)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from placement_rl.cli.keys import group_options

HELP_GROUP = "hydra/help"


def command_defaults(config_name: str) -> dict[str, str]:
    """``{group: option}`` of the command's primary config's ``defaults`` list (Hydra's own left out)."""
    import yaml

    from placement_rl.topology import conf_dir

    path = conf_dir() / f"{config_name}.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    out: dict[str, str] = {}
    for item in (data or {}).get("defaults") or []:
        if isinstance(item, dict):
            out.update({str(k): str(v) for k, v in item.items()
                        if not str(k).startswith("override ") and not str(k).startswith("hydra")})
    return out


def command_groups(config_name: str) -> list[str]:
    """The config groups the command's primary config composes (``command_defaults``' groups, in order)."""
    return list(command_defaults(config_name))


def help_override(config_name: str, summary: str) -> list[str]:
    """Store this command's help in Hydra's ConfigStore and return the override that selects it."""
    groups = "\n".join(f"{g}: {', '.join(group_options(g))}" for g in command_groups(config_name))
    template = (f"placement-rl {config_name}: {summary}\n\n"
                + ("== Configuration groups ==\nCompose your configuration from those groups (group=option)\n\n"
                   f"{groups}\n\n" if groups else "")
                + "== Config ==\nOverride anything in the config (foo.bar=value)\n\n$CONFIG\n\n"
                "Use --hydra-help to view Hydra specific help")
    name = f"placement_rl_{config_name}"
    ConfigStore.instance().store(group=HELP_GROUP, name=name, node={
        "app_name": f"placement-rl {config_name}", "header": "", "footer": "", "template": template})
    return [f"{HELP_GROUP}={name}"]
