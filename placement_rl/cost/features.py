"""The per-device decision features of the constructive schedule (``placement_rl.cost.schedule``'s docstring
describes each) and the columns where the window, topology and step blocks start."""

from __future__ import annotations

from placement_rl.cost.window import EXTRA_FEATURES

BASE_FEATURES = ("est_gap", "eft_gap", "exec", "slowdown", "bwd", "local_frac", "recv_frac", "extends", "idle",
                 "load", "mem_after", "mem_now", "best_eft", "best_est", "empty", "speed", "progress", "bwd_grow",
                 "bwd_load")
NUM_BASE_FEATURES = len(BASE_FEATURES)
DEVICE_FEATURES = BASE_FEATURES + EXTRA_FEATURES
NUM_DEVICE_FEATURES = len(DEVICE_FEATURES)
# where _batch_extra writes its blocks (compile-time constants of the kernels)
WINDOW_COL, TOPOLOGY_COL, STEP_COL = (DEVICE_FEATURES.index(c) for c in ("la_end", "conn", "la_step"))
