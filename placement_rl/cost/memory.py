"""The memory model, shared by the simulators, the placers, the partitioners and the envs.

Training state per parameter byte (fp32 parameters, fp32 gradients, Adam's two fp32 moments):
``STATE_FACTOR = 4`` (parameters + gradients + 2 x optimizer state). Per device:

* op-level placement: ``static_memory`` per node (state + activations kept for backward) plus received
  buffers (added by the simulator);
* pipeline stage on a DP group of p devices (``stage_state_bytes``): ``dp`` (DDP) keeps the whole state
  on every replica; ``fsdp`` keeps a 1/p shard of it plus the *gathered group*: the largest unit's
  parameters twice (the one computing and the one prefetched) and its unsharded gradient before the
  reduce-scatter (``FSDP_GATHER_FACTOR = 3`` x the largest unit);
* in-flight activations per schedule: each micro-batch in flight holds ``act_bytes / (m p)`` of its stage
  plus its received boundary buffer; GPipe keeps all m in flight, 1F1B at most ``S - s`` at stage s (the
  pipeline kernel tracks the peak event by event).

Precision: the bytes are the graph's (a bf16 capture's parameters count 2 bytes each, so pure bf16 training
holds 8 bytes per parameter; under autocast the parameters stay fp32). Activation recomputation: stage plans only
(``cost.recompute``). The optimizer is Adam (what ``deploy`` runs); SGD's smaller state is not a setting.

Not modelled: DDP's gradient bucket copy, allocator fragmentation, CUDA context and workspace memory, fp32 master
copies of low-precision parameters.
"""

from __future__ import annotations

import numpy as np

from placement_rl.graph.ir import CompGraph

# Adam keeps two moments: parameters + gradients + optimizer state = 4x the parameter bytes.
STATE_FACTOR = 4.0
# FSDP: the largest unit gathered twice (computing + prefetched) plus its unsharded gradient
FSDP_GATHER_FACTOR = 3.0
# DDP's default gradient bucket (``bucket_cap_mb=25``); FSDP units are cut at the same size
BUCKET_BYTES = 25.0 * 2**20


def static_memory(graph: CompGraph) -> np.ndarray:
    """Bytes each node pins on its device whatever the placement: 4 x params + activations kept for backward.
    (Received buffers depend on the placement; the simulator adds them.)"""
    return STATE_FACTOR * graph.param_bytes + graph.act_bytes


def pinned_memory(graph: CompGraph, costs) -> np.ndarray:
    """Bytes each node pins on its device as the simulator counts them: ``static_memory`` under training costs, the
    parameters alone under inference costs (``cost.modes``: no gradients, optimizer state or kept activations)."""
    from placement_rl.cost.modes import mode_of

    if mode_of(costs) == "inference":
        return np.array(graph.param_bytes, dtype=np.float64)
    return static_memory(graph)


def stage_state_bytes(param_bytes: float, dp: int, sharding: str = "dp", largest_unit: float = 0.0) -> float:
    """Per-device training state of a stage with ``param_bytes`` of parameters on a DP group of ``dp``:
    ``dp``: ``4 P``; ``fsdp``: ``4 P / dp + 3 x largest_unit`` (one device: no sharding, ``4 P``)."""
    if sharding == "fsdp" and dp > 1:
        return STATE_FACTOR * param_bytes / dp + FSDP_GATHER_FACTOR * largest_unit
    return STATE_FACTOR * param_bytes
