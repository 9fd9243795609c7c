"""The built-task cache (``studies.pretrain.build_tasks(cache=...)``) is keyed by what sets the rewards: a preset
whose figures changed is rebuilt, not read back with the old costs."""

from __future__ import annotations

import shutil

import numpy as np

from placement_rl.studies.pretrain import build_tasks
from placement_rl.topology import conf_dir


def test_a_changed_preset_is_not_read_from_the_cache(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    (conf / "topology").mkdir(parents=True)
    shutil.copy(conf_dir() / "topology" / "2x_k80.yaml", conf / "topology" / "2x_k80.yaml")
    monkeypatch.setenv("PLACEMENT_RL_CONF", str(conf))
    specs = [{"graph": {"family": "layered", "num_nodes": 24, "seed": 3}, "topology": "2x_k80", "id": "g@k80"}]
    cache = tmp_path / "cache"
    first = build_tasks(specs, cache=cache)
    again = build_tasks(specs, cache=cache)
    assert len(list(cache.glob("tasks-*.pkl"))) == 1
    assert np.array_equal(first[0].costs.fwd_time, again[0].costs.fwd_time)
    path = conf / "topology" / "2x_k80.yaml"
    path.write_text(path.read_text().replace("peak_flops: 4.37e+12", "peak_flops: 8.74e+12"))
    faster = build_tasks(specs, cache=cache)
    assert len(list(cache.glob("tasks-*.pkl"))) == 2
    assert faster[0].costs.fwd_time.sum() < first[0].costs.fwd_time.sum()
