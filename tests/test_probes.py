"""The probes' own pieces that their figures rest on (``scripts/probe_learning_comm.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from placement_rl.cost import resolve_costs, simulate
from placement_rl.graph import synthetic
from placement_rl.topology import DeviceTopology

ROOT = Path(__file__).resolve().parent.parent


def _probe():
    spec = importlib.util.spec_from_file_location("probe_learning_comm", ROOT / "scripts" / "probe_learning_comm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _slow_links(d: int) -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": "slow", "devices": [dict(name=f"gpu{k}", kind="gpu", peak_flops=10e12 * (1 + k % 2),
                                         mem_bandwidth=500e9, memory_bytes=16e9) for k in range(d)],
        "links": {"intra_host": {"bandwidth": 2e9, "latency": 2e-5}}})


def test_the_rollout_over_la_rule_is_never_slower_than_la_rule_and_reports_its_placements_time():
    """``rollout_over_la_rule`` follows the best completed placement it has seen, so its placement is never slower
    than ``la_rule``'s (its first decision's completions include ``la_rule``'s own), it fits, and the time it
    returns is the simulator's for that placement (also when it rolls out on part of the decisions only); on slow links it finds a faster one on at least one of three
    graphs (each decision is a full rollout step over the rule)."""
    probe = _probe()
    topo = _slow_links(4)
    ratios = []
    for family, seed in (("dataflow", 0), ("dataflow", 1), ("series_parallel", 2)):
        g = synthetic.sample(family, num_nodes=30, seed=seed)
        c = resolve_costs(g, topo)
        ref, ok, _ = probe._la_rule(g, c, topo)
        t, fits, dev = probe.rollout_over_la_rule(g, c, topo)
        res = simulate(g, c, topo, np.asarray(dev, np.int64))
        assert ok and fits and res.feasible
        assert t <= ref * (1 + 1e-12)
        assert res.step_time == pytest.approx(t, rel=1e-9)
        ratios.append(t / ref)
        for span in probe.SPANS:  # on part of the decisions only (la_rule the rest): never slower than the rule
            ts, fits_s, dev_s = probe.rollout_over_la_rule(g, c, topo, span)
            assert fits_s and ts <= ref * (1 + 1e-12)
            assert simulate(g, c, topo, np.asarray(dev_s, np.int64)).step_time == pytest.approx(ts, rel=1e-9)
    assert min(ratios) < 0.999, ratios
