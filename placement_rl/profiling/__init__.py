"""Real measurements: per-op timing on local devices, link benchmarks, the ProfileDB, fidelity checks.

``run_profile(model, output=...)`` is what ``placement-rl profile`` calls; ``ProfileDB.load(path)`` is a
measured cost source for ``placement_rl.cost.resolve_costs`` (``measured_costs`` also swaps in the
measured link fits).
"""

from placement_rl.profiling.db import ProfileDB
from placement_rl.profiling.fidelity import (Prediction, fidelity_stats, measured_costs, physical_topology,
                                             predict_step_time)
from placement_rl.profiling.links import LinkFit, bench_copy, bench_sendrecv, fit_link, local_link_benchmarks
from placement_rl.profiling.ops import measure_optimizer, measure_step, op_signatures, profile_graph
from placement_rl.profiling.run import ProfileRun, run_profile

__all__ = ["LinkFit", "Prediction", "ProfileDB", "ProfileRun", "bench_copy", "bench_sendrecv", "fidelity_stats",
           "fit_link", "local_link_benchmarks", "measure_optimizer", "measure_step", "measured_costs", "op_signatures",
           "physical_topology", "predict_step_time", "profile_graph", "run_profile"]
