"""Command-line entry points (Hydra apps). The only part of the core that may import ``envs``/``agents``."""
