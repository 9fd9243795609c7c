"""``place_graph``: what ``placement-rl place`` does, from Python -- a graph placed zero-shot by a constructive policy
checkpoint (the shipped pretrained one by default): its greedy placement, or the best of it and ``samples`` more.

    from placement_rl.agents.place_graph import place_graph
    placement = place_graph(graph, load_topology("4x_v100_nvlink"), samples=16)
    placement.meta["step_time"], placement.meta["feasible"], placement.meta["label"]
"""

from __future__ import annotations

import numbers
from pathlib import Path

import torch

from placement_rl.cost.types import CostTable
from placement_rl.errors import CheckpointError, ConfigError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement
from placement_rl.topology import DeviceTopology


def place_graph(graph: CompGraph, topology: DeviceTopology, costs: CostTable | None = None, *,
                checkpoint: str | Path | None = None, samples: int = 0, seed: int = 0,
                strict: bool = False) -> Placement:
    """The policy's placement of ``graph`` on ``topology``: its greedy one, or with ``samples`` > 0 the fastest
    that fits memory of the greedy one and ``samples`` more (the first on slower views of the links, the rest
    drawn with ``seed``), as ``place`` gives them. ``costs`` default to ``resolve_costs(graph, topology)``;
    ``checkpoint`` to the shipped pretrained policy (``strict``: refuse one trained with other features or cost
    model, else say so on stdout; one fine-tuned on another graph or cluster is said there too). ``meta`` holds
    ``step_time`` (seconds), ``feasible``, ``label`` (which placement: greedy, a link view or a sample),
    ``greedy_step_time``, ``seconds`` and ``checkpoint``."""
    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.agents.constructive_eval import greedy_result, with_samples
    from placement_rl.cost import resolve_costs
    from placement_rl.envs.constructive_task import ConstructiveTask

    if isinstance(samples, bool) or not isinstance(samples, numbers.Integral) or samples < 0:
        raise ConfigError(f"samples must be an integer >= 0, got {samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    samples, seed = int(samples), int(seed)
    path = Path(checkpoint) if checkpoint is not None else default_checkpoint()
    try:
        policy, _, data = load_policy(path, strict=strict, log=print)
    except CheckpointError as exc:  # the CLI's wording names its key: here the argument
        raise CheckpointError(str(exc).replace("drop strict_checkpoint", "pass strict=False")) from None
    note = finetuned_note(path, data["config"].get("finetuned_on"), f"{graph.name}@{topology.name}")
    if note:
        print(note)
    costs = resolve_costs(graph, topology) if costs is None else costs
    task = ConstructiveTask.build(graph, topology, costs, teachers=False)
    res = greedy_result(policy, task)
    if samples:
        res = with_samples(policy, res, samples, torch.Generator().manual_seed(seed))
    return Placement(res.best_devices.copy(), meta={
        "step_time": res.best_time, "feasible": res.best_feasible, "label": res.best_label,
        "greedy_step_time": res.greedy_time, "seconds": res.greedy_seconds + res.sampled_seconds,
        "checkpoint": str(path)})


def finetuned_note(path: str | Path, tuned: str | None, here: str, fix: str = "leave checkpoint out") -> str:
    """One line when the checkpoint at ``path`` was fine-tuned (``placement-rl train``) on ``tuned``, another
    ``graph@topology`` than ``here``, ending with how to use the shipped policy instead (``fix``: the argument's
    words; ``place`` names its key); empty otherwise."""
    if not tuned or tuned == here:
        return ""
    return (f"note: {path} was fine-tuned on {tuned}, not {here}: a fine-tuned policy places what it was fitted to "
            f"and other graphs or clusters worse than the shipped one ({fix} for that)")
