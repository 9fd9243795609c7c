"""Which stream each dropout of a TP stage draws from (Megatron's model-parallel RNG tracker,
``megatron.core.tensor_parallel.random``).

The ranks of a TP group share one stream (``distributed_worker.dropout_seed``: one per DP replica and pipeline
rank). Megatron's rule: a random op on elements every TP rank holds alike draws from that shared stream, so the
ranks drop the same elements and stay replicas (the residual stream outside sequence parallelism); a random op on
elements each rank holds alone draws from the rank's own stream (Megatron forks the tracker whose seed is offset
by the TP rank):

* a region on local shards (heads, hidden features between a column and its row): :func:`local_random_ops`, run
  through :func:`rank_stream`;
* a region left to DTensor (sharded on its last dim) and, under sequence parallelism, the sequence-sharded
  residual stream (Megatron-SP runs its layers under the tracker's fork, each rank dropping its slice of the
  sequence): an ``aten.dropout`` whose input is a sharded DTensor, told apart when it runs by
  :func:`placed_stream`.

DTensor's own random ops are never reached: on CPU they draw the shared stream's mask for every shard (one mask
for the TP group), on CUDA their offset-based tracker starts by broadcasting rank 0's generator over the default
group (one stream for every replica and pipeline rank)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import fx

from placement_rl.executor._tp_region import _SDPA, _region, column_groups


def drop_probability(n: fx.Node) -> float:
    """The probability with which op ``n`` drops elements at random (``aten.dropout`` in training, fused attention's
    ``dropout_p``), else 0."""
    t = str(n.target)
    if t.startswith("aten.dropout."):
        p = n.args[1] if len(n.args) > 1 else n.kwargs["p"]
        return float(p) if (n.args[2] if len(n.args) > 2 else n.kwargs["train"]) else 0.0
    if t.startswith(_SDPA):
        return float(n.args[4] if len(n.args) > 4 else n.kwargs.get("dropout_p", 0.0))
    return 0.0


def _draws(n: fx.Node) -> bool:
    """Whether op ``n`` draws a mask (a probability of 0 or 1 draws nothing)."""
    return 0 < drop_probability(n) < 1


def local_random_ops(gm: fx.GraphModule, kinds: Mapping[str, str], local: Mapping[str, Any]) -> list[fx.Node]:
    """The ops of the regions that run on local shards (``local``: ``_tp_region.local_regions``) that drop elements
    at random (dropout, fused attention with ``dropout_p``): each TP rank holds other elements (its heads, its hidden
    features) there and draws its own mask (:func:`rank_stream`)."""
    out: list[fx.Node] = []
    for cols in column_groups(gm, kinds):
        if cols[0].name in local:
            out += [n for n in _region(cols, kinds) if _draws(n) and n not in out]
    return out


def rank_stream(op: Any, rank: int, size: int, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)`` (a random op on this rank's own elements) drawn from TP rank ``rank``'s own stream
    (Megatron's model-parallel RNG tracker): the ``size`` ranks of the TP group draw ``size`` seeds from their shared
    stream (the CPU default generator, which stays in step across the group and which activation recomputation
    restores, so a recomputed region draws the same masks) and each runs ``op`` with its device's default generator
    seeded by its own seed, restored afterwards."""
    seed = int(torch.randint(2 ** 62, (size,))[rank])
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    gen = torch.default_generator
    if device.type == "cuda":
        gen = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    state = gen.get_state()
    gen.manual_seed(seed)
    try:
        return op(*args, **kwargs)
    finally:
        gen.set_state(state)


def placed_stream(op: Any, rank: int, size: int, x: Any, *args: Any, **kwargs: Any) -> Any:
    """``op(x, *args, **kwargs)`` (an ``aten.dropout`` outside the regions on local shards) drawn by where ``x`` lives.

    A plain ``x`` is whole on every TP rank (the residual stream outside sequence parallelism): the shared stream,
    one mask for the group. A DTensor runs ``op`` on its local tensor, from TP rank ``rank``'s own stream
    (:func:`rank_stream`) when it is sharded (a region left to DTensor, the sequence-sharded stream), from the
    shared stream when replicated (a partial one is made replicated first, as DTensor would); the result keeps
    ``x``'s placements."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(x, DTensor):
        return op(x, *args, **kwargs)
    if any(p.is_partial() for p in x.placements):
        x = x.redistribute(x.device_mesh, [Replicate() if p.is_partial() else p for p in x.placements])
    local = x.to_local()
    if any(p.is_shard() for p in x.placements):
        out = rank_stream(op, rank, size, local, *args, **kwargs)
    else:
        out = op(local, *args, **kwargs)
    return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())


def own_streams(gm: fx.GraphModule, local_ops: Sequence[fx.Node], rank: int, size: int) -> None:
    """Route each random op of stage ``gm`` to its stream, as TP rank ``rank`` of ``size``: ``local_ops`` (random ops
    on local shards, :func:`local_random_ops`) through :func:`rank_stream`, every other ``aten.dropout`` that draws
    through :func:`placed_stream` (node names kept: recomputation regions name them)."""
    for n in list(gm.graph.nodes):
        if n in local_ops:
            wrap = rank_stream
        elif n.op == "call_function" and str(n.target).startswith("aten.dropout.") and _draws(n):
            wrap = placed_stream
        else:
            continue
        n.args = (n.target, rank, size, *n.args)
        n.target = wrap
