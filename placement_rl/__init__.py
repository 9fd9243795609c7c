"""placement-rl: learn where the parts of a deep-learning training step should run."""

__version__ = "0.1.0"
