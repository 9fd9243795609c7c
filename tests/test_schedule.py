"""The constructive schedule state: exact against simulate(), features, memory masks, fits check."""

from __future__ import annotations

import numpy as np
import pytest
from test_cost_reference import random_graph, random_topology

from placement_rl.envs.topology_sampler import random_topology as sampled_topology
from placement_rl.cost import resolve_costs, simulate
from placement_rl.cost.schedule import DEVICE_FEATURES, NUM_DEVICE_FEATURES, ScheduleState, check_fits
from placement_rl.errors import PlanError
from placement_rl.graph import synthetic


@pytest.mark.parametrize("seed", range(8))
def test_incremental_step_time_equals_simulate(seed: int) -> None:
    """Random graphs (per-edge bytes differ, so tensors are topped up) on random topologies: the state built one
    decision at a time ends exactly where simulate() does, for K episodes side by side."""
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, int(rng.integers(5, 30)))
    topo = random_topology(rng, int(rng.integers(2, 7))) if seed % 2 else sampled_topology(rng, (2, 12))
    costs = resolve_costs(graph, topo)
    st = ScheduleState(graph, costs, topo, episodes=3)
    while not st.done:
        feats, mask = st.features()
        assert feats.shape == (3, topo.num_devices, NUM_DEVICE_FEATURES) and mask.any(axis=1).all()
        st.place(rng.integers(0, topo.num_devices, size=3))
    times = st.finish()
    for k in range(3):
        res = simulate(graph, costs, topo, st.devices[k])
        assert times[k] == res.step_time
        assert st.feasible()[k] == res.feasible
        np.testing.assert_array_equal(st.memory[k], res.peak_memory)


def test_features_match_a_placement() -> None:
    """Placing on the earliest-finish device (feature eft_gap == 0, flag best_eft) gives that finish time."""
    g = synthetic.sample("layered", num_nodes=40, seed=3)
    from placement_rl.topology import load_topology

    topo = load_topology("4x_v100_nvlink")
    costs = resolve_costs(g, topo)
    st = ScheduleState(g, costs, topo)
    i_eft, i_best = DEVICE_FEATURES.index("eft_gap"), DEVICE_FEATURES.index("best_eft")
    while not st.done:
        feats, _ = st.features()
        d = int(np.argmin(feats[0, :, i_eft]))
        assert feats[0, d, i_best] == 1.0 and feats[0, :, i_best].sum() == 1.0
        st.place(d)
    assert np.isfinite(st.finish()).all()


def test_memory_mask_and_fits_nowhere() -> None:
    g = synthetic.sample("transformer_like", num_nodes=60, seed=0)
    from placement_rl.topology import DeviceTopology

    def topo(mem: float) -> DeviceTopology:
        return DeviceTopology.from_dict({"name": "tiny", "devices": [
            {"name": "g", "count": 2, "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 1e12, "memory_bytes": mem}],
            "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})

    from placement_rl.cost.memory import static_memory

    total = float(static_memory(g).sum())
    with pytest.raises(PlanError, match="needs .* GiB"):
        check_fits(g, topo(total / 4))
    t = topo(total * 0.6)  # fits only split across both devices
    st = ScheduleState(g, resolve_costs(g, t), t)
    masked = 0
    while not st.done:
        _, mask = st.features()
        masked += int((~mask[0]).sum())
        st.place(int(np.flatnonzero(mask[0])[0]))
    assert masked > 0 and st.feasible()[0]


def test_window_time_unit_only_above_the_unit_size() -> None:
    """The window columns' time unit is the task's up to ``WINDOW_UNIT_NODES`` nodes and ``scale x
    WINDOW_UNIT_NODES / N`` above (what each column reads: ``tests/test_split.py``)."""
    from placement_rl.cost import schedule as sch

    ref = sch.WINDOW_UNIT_NODES
    assert sch.window_time_scale(3.0, ref) == 3.0 and sch.window_time_scale(3.0, 10) == 3.0
    assert sch.window_time_scale(3.0, 4 * ref) == pytest.approx(0.75)
    g = synthetic.sample("layered", num_nodes=60, seed=0)
    topo = random_topology(np.random.default_rng(0), 4)
    st = ScheduleState(g, resolve_costs(g, topo), topo, window=8)
    assert st.window_scale == st.scale


def test_inference_costs_the_state_ends_where_simulate_does() -> None:
    """With inference costs (``cost.modes.inference_costs``: forward only, no gradients, parameters-only memory)
    the constructive state's step times and peak memories equal ``simulate()``'s, as in training."""
    from placement_rl.cost.modes import inference_costs
    from placement_rl.topology import load_topology

    g = synthetic.sample("layered", num_nodes=60, seed=2)
    topo = load_topology("cpu_2gpu")
    costs = inference_costs(resolve_costs(g, topo))
    rng = np.random.default_rng(0)
    st = ScheduleState(g, costs, topo, episodes=3)
    while not st.done:
        st.place(rng.integers(0, topo.num_devices, size=3))
    times = st.finish()
    for k in range(3):
        res = simulate(g, costs, topo, st.devices[k])
        assert times[k] == res.step_time
        np.testing.assert_array_equal(st.memory[k], res.peak_memory)
