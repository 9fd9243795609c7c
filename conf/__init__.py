"""Hydra configs and topology presets of placement-rl (YAML only). A wheel installs this folder as the
``placement_rl.conf`` package (see pyproject.toml), found through Hydra's ``pkg://placement_rl.conf`` search path."""
