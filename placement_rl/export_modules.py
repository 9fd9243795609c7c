"""The graph whose module paths ``placement_rl.export`` cuts at, for coarsened graphs too.

A coarsened graph (``placement_rl.graph.coarsen``) names each group after one module path, while a group may hold
several modules: the embedding folded into the first layer's group, the final norm into the head's. So export reads
the modules from the graph the groups were made from (``meta["member_graph"]``, as
``placement_rl.graph.members.member_graph`` reads it), each member in its group's stage, and reads a trainer's
stages back onto the groups. A stage's modules are then the union of its groups' members' modules, in program
order. A coarsened graph that no longer carries that graph (written before it was kept, or changed since) is
exported by its groups' own module paths, as an uncoarsened one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import member_graph
from placement_rl.plans import StagePlan


def module_graph(graph: CompGraph) -> CompGraph:
    """The graph of ``graph``'s modules: the member graph of a coarsened graph that carries it, else ``graph``."""
    found = member_graph(graph)
    return graph if found is None else found[0]


def member_plan(plan: StagePlan, graph: CompGraph) -> tuple[StagePlan, CompGraph]:
    """``(plan, graph)`` on ``module_graph(graph)``: every member in its group's stage. A plan of another length
    than ``graph`` is returned as is (the caller refuses it, naming the graph)."""
    found = member_graph(graph)
    if found is None or len(plan.stage_of_node) != graph.num_nodes:
        return plan, graph
    fine, group_of = found
    return replace(plan, stage_of_node=np.asarray(plan.stage_of_node)[group_of]), fine


def split_note(graph: CompGraph, keys: Sequence[str | None], module: str) -> str:
    """Words on the groups of a coarsened ``graph`` that hold parts of ``module`` (``keys``: the modules of
    ``module_graph(graph)``'s nodes), for the message refusing a module split between stages; "" otherwise."""
    found = member_graph(graph)
    if found is None:
        return ""
    groups = list(dict.fromkeys(graph.names[int(found[1][v])] for v, k in enumerate(keys) if k == module))
    named = ", ".join(f"'{x}'" for x in groups[:3]) + (f" and {len(groups) - 3} more" if len(groups) > 3 else "")
    return f" (graph '{graph.name}' is coarsened: its groups {named} hold parts of it)"


def fill_stages(graph: CompGraph, fixed: Sequence[int | None]) -> np.ndarray:
    """Every node's stage: ``fixed[v]`` where given; else its inputs' latest stage, and a node without inputs
    (targets, positions) its consumers' earliest."""
    son = np.zeros(graph.num_nodes, dtype=np.int64)
    for v in graph.topo_order.tolist():
        preds = graph.predecessors(v)
        son[v] = fixed[v] if fixed[v] is not None else int(son[preds].max()) if len(preds) else 0
    for v in graph.topo_order.tolist()[::-1]:
        succ = graph.successors(v)
        if fixed[v] is None and not len(graph.predecessors(v)) and len(succ):
            son[v] = int(son[succ].min())
    return son


def group_stages(graph: CompGraph, son: np.ndarray, keys: Sequence[str | None]) -> np.ndarray:
    """The stage of every node of ``graph`` from ``son``, the stages of ``module_graph(graph)``'s nodes, whose
    modules are ``keys`` (None: a node of no module). A group takes its modules' stage (``PlanError`` where they
    differ); a group of no module follows the rule of ``fill_stages``. An uncoarsened graph gets ``son`` back."""
    found = member_graph(graph)
    if found is None:
        return son
    group_of = found[1]
    fixed: list[int | None] = [None] * graph.num_nodes
    first: list[str | None] = [None] * graph.num_nodes
    for v, k in enumerate(keys):
        if k is None:
            continue
        g, s = int(group_of[v]), int(son[v])
        if fixed[g] is not None and fixed[g] != s:
            raise PlanError(f"group '{graph.names[g]}' of graph '{graph.name}' holds modules of stages {fixed[g]} "
                            f"and {s} ('{first[g]}', '{k}'): the stages cut inside the group; read them back with "
                            "the graph the groups were made from")
        fixed[g], first[g] = s, first[g] or k
    return fill_stages(graph, fixed)


__all__ = ["fill_stages", "group_stages", "member_plan", "module_graph", "split_note"]
