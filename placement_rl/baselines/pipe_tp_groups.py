"""Which devices a TP group of a stage plan takes: TP degrees the graph and the hosts allow (TP groups never span
hosts), and the device orders the TP planners plan on (``pp.devs``, and where links split equal devices, groups
picked by links). Used by ``pipe_tp``'s planners; see its docstring for the rules."""

from __future__ import annotations

import numpy as np

from placement_rl.baselines.pipe_common import PipeProblem
from placement_rl.errors import PlanError
from placement_rl.graph import tp as tpmod


def accelerators(pp: PipeProblem) -> int:
    """How many of the fastest devices (``pp.devs``' first) are of the fastest one's kind: the GPUs of a cluster
    that also has CPUs (``tp`` and ``megatron`` plan on these; a CPU in a DP group with GPUs paced it, 0.67 x one
    GPU on ``cpu_2gpu``)."""
    kinds = [pp.topology.devices[int(d)].kind for d in pp.devs]
    return next((i for i, k in enumerate(kinds) if k != kinds[0]), len(kinds))


def _host_runs(pp: PipeProblem, count: int | None = None) -> list[int]:
    """Devices per host run in ``pp.devs`` order, over the first ``count`` devices (default all)."""
    hosts = [pp.topology.devices[int(d)].host for d in pp.devs[:count]]
    runs: list[int] = []
    for k, h in enumerate(hosts):
        if k and h == hosts[k - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def host_size(pp: PipeProblem, count: int | None = None) -> int:
    """The smallest host run of devices in ``pp.devs`` order, over the first ``count`` devices (default all)."""
    return min(_host_runs(pp, count))


def usable(pp: PipeProblem, t: int, count: int | None = None) -> int:
    """How many devices (a prefix of ``pp.devs``'s first ``count``) take TP groups of ``t`` that never span hosts:
    whole host runs while ``t`` divides them, then ``t``'s largest multiple in the first run it does not divide (on
    hosts of 8 + 1 GPUs, TP 8 on the 8; the smallest host no longer decides for all)."""
    total = 0
    for r in _host_runs(pp, count):
        total += r - r % t
        if r % t:
            break
    return total


def tp_choices(pp: PipeProblem, limit: int | None = None, count: int | None = None) -> list[int]:
    """TP degrees the graph allows that have at least one TP group on the first ``count`` devices (``usable``;
    1 always)."""
    h = max(_host_runs(pp, count))
    ann = tpmod.annotation(pp.graph)
    out = [1]
    for t in range(2, min(h, limit or h) + 1):
        if usable(pp, t, count) < t:
            continue
        try:
            tpmod.check_degree(pp.graph, t, ann)
        except PlanError:
            continue
        out.append(t)
    return out


def link_order(pp: PipeProblem, t: int, count: int) -> np.ndarray | None:
    """``pp.devs`` with its first ``count`` devices (whole TP groups of ``t``) regrouped by links where links split
    equal devices (``pipe_ideals.split_classes``): TP group by TP group, each of the same devices per class as the
    group of ``pp.devs`` it replaces, its slowest link least, then its slowest link from the group before
    (``pipe_ideals.connected_groups``; on ``4x_v100_nvlink`` TP 2 on (0, 3) and (1, 2), two NVLinks each, where
    index order gives (0, 1) and (2, 3), one each); the other devices follow in ``pp.devs`` order. None where TP is
    1, links split no class, a group would span hosts, or the groups are ``pp.devs``' own."""
    from placement_rl.baselines.pipe_ideals import connected_groups, split_classes

    count -= count % t
    if t < 2 or count < t:
        return None
    classes = split_classes(pp)
    if classes is None:
        return None
    class_of = {d: k for k, devs in enumerate(classes) for d in devs}
    own = [[int(x) for x in pp.devs[i:i + t]] for i in range(0, count, t)]
    if any(x not in class_of for g in own for x in g):
        return None
    seq = tuple(tuple(sum(class_of[x] == k for x in g) for k in range(len(classes))) for g in own)
    groups = connected_groups(pp, classes, seq)
    host = [d.host for d in pp.topology.devices]
    if any(len({host[x] for x in g}) > 1 for g in groups) or [set(g) for g in groups] == [set(g) for g in own]:
        return None
    head = [x for g in groups for x in g]
    return np.array(head + [int(x) for x in pp.devs if int(x) not in set(head)], dtype=np.int64)


def tp_orders(pp: PipeProblem, t: int, count: int) -> list[np.ndarray | None]:
    """The device orders a TP planner plans on for TP degree ``t`` over ``count`` devices: ``pp.devs`` (None) and,
    where it differs, ``link_order`` (the faster of their plans wins the simulation)."""
    linked = link_order(pp, t, count)
    return [None] if linked is None else [None, linked]
