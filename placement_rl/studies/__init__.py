"""Experiment drivers: benchmark suites, ablations, generalisation and zero-shot studies, their reports.

These combine the core (graphs, costs, baselines), the environments and the agents; like ``placement_rl.cli``
they may import ``envs`` and ``agents``, and nothing in the core imports them.
"""
