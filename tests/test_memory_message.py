"""A graph over its topology's memory says by how much, where two rounded sizes would read alike."""

import dataclasses

import numpy as np
import pytest

from placement_rl.cost.schedule import check_fits, static_memory
from placement_rl.errors import PlanError
from placement_rl.graph.synthetic import sample
from placement_rl.topology import load_topology


def test_the_memory_error_says_the_shortfall():
    g = sample("layered", num_nodes=20, seed=1)
    need = float(static_memory(g).sum())
    top = load_topology("2x_cpu")
    devices = tuple(dataclasses.replace(d, memory_bytes=(need - 1000.0) / 2) for d in top.devices)
    with pytest.raises(PlanError, match=r"\(1000 B short\)"):
        check_fits(g, dataclasses.replace(top, devices=devices))
    check_fits(g, dataclasses.replace(top, devices=tuple(dataclasses.replace(d, memory_bytes=need) for d in
                                                         top.devices)))
    assert np.isfinite(need)
