"""Hydra's entry to ``placement_rl.cli.sweep`` (``hydra/launcher=ray_workers``).

Installed as ``hydra_plugins.placement_rl_launcher`` (pyproject.toml's ``package-dir``): Hydra only loads launcher
classes from its ``hydra_plugins`` namespace, and finds them by scanning it at start-up."""
