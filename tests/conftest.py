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


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """Logging as it was before each test: a test that runs a command's Hydra app in this process gets Hydra's
    logging set up (handlers on the test's captured stderr, which pytest closes after it, and levels), and a later
    test's log line would go to a closed stream or pass a level it should not."""
    import logging

    root = logging.getLogger()
    kept = {name: (lg.level, lg.disabled, lg.propagate, lg.handlers[:])
            for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root_kept = (root.level, root.handlers[:])
    yield
    root.setLevel(root_kept[0])
    root.handlers[:] = root_kept[1]
    for name, (level, disabled, propagate, handlers) in kept.items():  # loggers made during the test: left as made
        lg = logging.getLogger(name)
        lg.setLevel(level)
        lg.disabled, lg.propagate, lg.handlers[:] = disabled, propagate, handlers


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
