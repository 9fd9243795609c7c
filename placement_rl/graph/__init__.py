"""Computation graphs: IR, capture from nn.Modules, coarsening, built-in models, synthetic families."""

from placement_rl.errors import GraphError
from placement_rl.graph.ir import CompGraph, make_graph

__all__ = ["CompGraph", "GraphError", "make_graph"]
