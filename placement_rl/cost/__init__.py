"""Cost model: resolve per-node costs, simulate op placements and pipeline stage plans.

``resolve_costs(graph, topology, profiles=None) -> CostTable``;
``simulate(graph, costs, topology, placement)`` / ``Simulator`` for op placements;
``simulate_pipeline(graph, costs, topology, plan)`` / ``PipelineSimulator`` for stage plans.
"""

from placement_rl.cost.pipeline import PIPELINE_SCHEDULES, PipelineSimulator, simulate_pipeline
from placement_rl.cost.resolve import CostSource, needs_grad, resolve_costs, roofline_times
from placement_rl.cost.simulate import ORDERS, Simulator, priority_order, simulate
from placement_rl.cost.types import CostTable, Interval, SimResult

__all__ = ["ORDERS", "PIPELINE_SCHEDULES", "CostSource", "CostTable", "Interval", "PipelineSimulator", "SimResult",
           "Simulator", "needs_grad", "priority_order", "resolve_costs", "roofline_times", "simulate",
           "simulate_pipeline"]
