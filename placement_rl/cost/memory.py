"""The placement-independent part of the memory model, shared by the simulator, the placers and the envs."""

from __future__ import annotations

import numpy as np

from placement_rl.graph.ir import CompGraph

# Adam keeps two moments: parameters + gradients + optimizer state = 4x the parameter bytes.
STATE_FACTOR = 4.0


def static_memory(graph: CompGraph) -> np.ndarray:
    """Bytes each node pins on its device whatever the placement: 4 x params + activations kept for backward.
    (Received buffers depend on the placement; the simulator adds them.)"""
    return STATE_FACTOR * graph.param_bytes + graph.act_bytes
