"""Shared fixtures: a small hand-built DAG and a 2-device topology."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)

# Property tests draw the same examples on every machine and run (CI lands only on a green run; a rare draw that
# breaks a test must not decide that). HYPOTHESIS_PROFILE=explore draws fresh examples each run, to hunt for them.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def tight_topology(name: str, frac: float, graph):
    """Preset ``name`` with every device's memory cut so that ``graph`` needs about ``frac`` of all of it (memory
    masks devices out of some decisions)."""
    from placement_rl.cost.memory import static_memory
    from placement_rl.topology import DeviceTopology, load_topology

    d = load_topology(name).to_dict()
    per = float(static_memory(graph).sum()) / frac / sum(int(x.get("count", 1)) for x in d["devices"])
    for dev in d["devices"]:
        dev["memory_bytes"] = per
    return DeviceTopology.from_dict({**d, "name": f"{name}_tight"})
