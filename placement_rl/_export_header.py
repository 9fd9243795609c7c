"""The comment lines an exported config starts with (see ``placement_rl.export``'s module doc): the plan and graph, the
predicted step (priced from the topology's estimates where the plan's own does not describe what is exported, and for
a plan ``--snap`` changed), the uniform-recomputation note and, where the plan's devices are not ranks ``0..world-1``
in order, the ``# rank_devices`` line, a note naming each rank's device and the node order to launch the hosts in."""

from __future__ import annotations

from dataclasses import replace

from placement_rl._export_layout import Layout, _stage_of_node
from placement_rl.errors import PlacementRLError
from placement_rl.export_modules import member_plan
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology


def _price(plan: StagePlan, graph: CompGraph, topology: DeviceTopology | None) -> float | str:
    """One training step of ``plan`` from the topology's estimates (``cost.resolve_costs``), or why not."""
    from placement_rl.cost import resolve_costs, simulate_pipeline

    if topology is None:
        return "no topology: pass --topology"
    try:
        return float(simulate_pipeline(graph, resolve_costs(graph, topology), topology,
                                       plan.validate(graph, topology)).step_time)
    except PlacementRLError as exc:
        return str(exc)


def _snapped_step(plan: StagePlan, graph: CompGraph, lay: Layout, topology: DeviceTopology | None) -> str:
    """The header's words on a plan ``--snap`` changed: which modules moved, and both plans' predicted step times
    from the topology's estimates (the plan's own prediction was for the plan as cut)."""
    from placement_rl.cost import resolve_costs, simulate_pipeline

    names = ", ".join(f"{k} to stage {s}" for k, s in lay.moved[:3]) + (f" and {len(lay.moved) - 3} more"
                                                                        if len(lay.moved) > 3 else "")
    said = f"--snap moved {names}"
    if topology is None:
        return f"{said}; predicted step not priced (no topology: pass --topology)"
    plan, graph = member_plan(plan, graph)  # the modules moved are the member graph's
    stage_of = {k: s for s, ms in enumerate(lay.stage_modules) for k in ms}
    snapped = replace(plan, stage_of_node=_stage_of_node(graph, lay.mods, stage_of), meta={})
    try:
        costs = resolve_costs(graph, topology)
        before = simulate_pipeline(graph, costs, topology, plan).step_time
        after = simulate_pipeline(graph, costs, topology, snapped.validate(graph, topology)).step_time
    except PlacementRLError as exc:
        return f"{said}; predicted step not priced ({exc})"
    return f"predicted step {after:.6g} s after {said} (as cut: {before:.6g} s; topology estimates)"


def _step_words(plan: StagePlan, graph: CompGraph, topology: DeviceTopology | None) -> str:
    """The header's predicted step: the plan's own (``meta["step_time"]``) unless it was planned for inference
    (``meta["mode"]``; plans without it read as training) or its recomputation was made uniform: then one
    training step priced from the topology's estimates, since the settings written train the model."""
    own = plan.meta.get("step_time")
    own = float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) else None
    inference = str(plan.meta.get("mode", "train")) == "inference"
    if not inference and "recompute_as_planned" not in plan.meta:
        return "" if own is None else f", predicted step {own:.6g} s"
    step = _price(plan, graph, topology)
    words = (f", predicted training step {step:.6g} s (topology estimates)" if isinstance(step, float)
             else f", predicted training step not priced ({step})")
    if inference and own is not None:
        words += (f"; the plan's own {own:.6g} s is one forward pass (planned with mode=inference), not a "
                  "training step")
    return words


def _rank_lines(lay: Layout, topology: DeviceTopology | None) -> list[str]:
    """Where the plan's devices are not ranks 0..world-1 in order (the trainers' ranks: pipeline rank outermost,
    then DP, TP innermost, which the readers assume): a ``# rank_devices`` line the readers take back, a note
    naming each rank's device, and, with a topology, the node order to launch the hosts in and each node's
    ``CUDA_VISIBLE_DEVICES`` (torchrun numbers a node's ranks consecutively, local rank i on visible GPU i)."""
    ranks = lay.rank_devices
    if ranks == tuple(range(len(ranks))):
        return []
    devs = topology.devices if topology is not None and max(ranks) < topology.num_devices else None
    name = (lambda d: devs[d].name) if devs is not None else (lambda d: f"device {d}")
    said = ", ".join(f"rank {r} {name(d)}" for r, d in enumerate(ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    lines = [f"# rank_devices = [{', '.join(map(str, ranks))}]",
             f"# note: pipeline ranks must run on the plan's devices, not on devices 0..{len(ranks) - 1} in order: "
             f"{said} (ranks as torchtitan and Megatron-LM number them: pipeline rank outermost, TP innermost)"
             + ("; launch the hosts as the nodes below" if devs is not None else
                "; the device indices are the plan's topology's")]
    if devs is None:
        return lines
    nodes: list[list[int]] = []  # runs of consecutive ranks on one host
    for r, d in enumerate(ranks):
        if nodes and devs[ranks[nodes[-1][0]]].host == devs[d].host:
            nodes[-1].append(r)
        else:
            nodes.append([r])
    for k, rs in enumerate(nodes):
        host = devs[ranks[rs[0]]].host
        index = [str(devs[ranks[r]].torch_device).partition(":") for r in rs]
        visible = (", CUDA_VISIBLE_DEVICES=" + ",".join(i for _, _, i in index)
                   if all(kind == "cuda" and i.isdigit() for kind, _, i in index) else "")
        which = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs[0]}-{rs[-1]}"
        lines.append(f"# node {k}: host {host}, {which} ({', '.join(devs[ranks[r]].name for r in rs)}){visible}")
    hosts = [devs[ranks[rs[0]]].host for rs in nodes]
    split = next((h for h in hosts if hosts.count(h) > 1), None)
    if split is not None:
        held = ", ".join(str(r) for r, d in enumerate(ranks) if devs[d].host == split)
        lines.append(f"# note: host {split} holds ranks {held}, which are not consecutive: torchrun numbers a "
                     "node's ranks consecutively, so start that host's processes by hand with these ranks")
    return lines


def _header(plan: StagePlan, graph: CompGraph, what: str, lay: Layout, topology: DeviceTopology | None) -> list[str]:
    head = f"# {what}: placement-rl stage plan for graph '{graph.name}' (fingerprint {graph.fingerprint()[:16]})"
    if lay.moved:
        lines = [head, f"# {plan.num_stages} stage(s), {_snapped_step(plan, graph, lay, topology)}"]
    else:
        lines = [head, f"# {plan.num_stages} stage(s){_step_words(plan, graph, topology)}"]
    if "recompute_as_planned" in plan.meta:
        lines.append(f"# note: the plan recomputes {plan.meta['recompute_as_planned']} per stage; exported with "
                     f"'{lay.recompute}' in every stage (--uniform-recompute): less memory and a slower step than "
                     "planned")
    return lines + _rank_lines(lay, topology)
