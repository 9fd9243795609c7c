"""Measured NCCL fits inside the simulators: link transfers of simulate(), collectives of simulate_pipeline()."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import resolve_costs, simulate, simulate_pipeline
from placement_rl.cost.collectives import collective_time, measured_segments
from placement_rl.cost.comm_fit import envelope, link_segments, segment_time
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.types import CostTable
from placement_rl.errors import ConfigError, TopologyError
from placement_rl.graph import synthetic
from placement_rl.profiling import collective_fits
from placement_rl.topology import DeviceTopology, load_topology
from tests.test_cost_pipeline import chain, plan

MIB = 2.0 ** 20


def test_envelope_is_the_min_of_the_lines() -> None:
    lines = [(1e-5, 1e-9), (4e-5, 2e-10), (np.inf, np.inf), (2e-4, 1e-10)]
    seg = envelope(lines)
    for n in np.geomspace(1.0, 1e10, 60):
        assert segment_time(seg, n) == pytest.approx(min(a + b * n for a, b in lines[:2] + lines[3:]), rel=1e-12)


@pytest.mark.parametrize("name,system", [("8x_a100_dgx", "a100_dgx"), ("8x_h100_dgx", "h100_dgx"),
                                         ("2x_a100_nvlink_pair", "a100_pairwise_nvlink")])
def test_presets_price_collectives_and_links_from_the_fit(name: str, system: str) -> None:
    topo = load_topology(name)
    for p in (2, 4, 8):
        if p > topo.num_devices:
            continue
        for n in (MIB, 3 * MIB, 64 * MIB, 700 * MIB):
            fit = collective_fits.fitted_collective_time("all_reduce", n, p, system)
            # the simulators interpolate between knots linearly in bytes, the fit in log-log: < 1% apart
            assert collective_time("allreduce", n, range(p), topo) == pytest.approx(fit, rel=1e-2)
    assert collective_time("allreduce", 64 * MIB, range(2), topo, algorithm="measured") > 0
    links = link_segments(topo)
    for n in (MIB, 10 * MIB, 300 * MIB):
        fit = collective_fits.fitted_collective_time("p2p", n, 2, system, devices_per_node=2)
        assert segment_time(links[0, 1], n) == pytest.approx(fit, rel=1e-2)


def test_unmeasured_kinds_and_topologies_keep_the_analytic_model() -> None:
    topo = load_topology("8x_a100_dgx")  # Vidur measured all-reduce and send/recv only
    assert measured_segments("allgather", range(4), topo) is None
    assert collective_time("allgather", 64 * MIB, range(4), topo) == pytest.approx(
        collective_time("allgather", 64 * MIB, range(4), topo, algorithm="ring"))
    plain = load_topology("8x_a100_nvswitch")
    assert measured_segments("allreduce", range(8), plain) is None
    with pytest.raises(ConfigError, match="no measured allreduce fit"):
        collective_time("allreduce", 1.0, range(2), plain, algorithm="measured")
    links = link_segments(plain)
    assert links.shape[2] == 1 and links[0, 1, 0, 1] == plain.link_latency[0, 1]


def test_simulate_transfer_and_schedule_state_use_the_fit() -> None:
    topo = load_topology("2x_a100_nvlink_pair")
    g = synthetic.sample("layered", num_nodes=30, seed=1)
    costs = resolve_costs(g, topo)
    dev = np.arange(g.num_nodes) % 2
    res = simulate(g, costs, topo, dev, timeline=True)
    seg = link_segments(topo)[0, 1]
    transfers = [iv for iv in res.timeline if iv.kind == "transfer"]
    assert transfers
    for iv in transfers:  # every forward transfer lasts what the fitted curve says for its bytes
        assert iv.end - iv.start in [pytest.approx(segment_time(seg, float(b)), rel=1e-9) for b in g.edge_bytes] + \
            [pytest.approx(segment_time(seg, float(b1 - b0)), rel=1e-9) for b0 in g.edge_bytes for b1 in g.edge_bytes]
    st = ScheduleState(g, costs, topo, episodes=2)
    while not st.done:
        st.place(dev[st.node])
    assert st.finish()[0] == res.step_time  # the incremental state runs the same link tables
    own = CostTable(fwd_time=costs.fwd_time, bwd_time=costs.bwd_time, link_latency=costs.link_latency * 2,
                    link_bandwidth=costs.link_bandwidth, source=costs.source)
    assert link_segments(topo, own).shape[2] == 1  # links profiled here keep their own figures


def test_pipeline_allreduce_is_the_fitted_time() -> None:
    topo = load_topology("8x_h100_dgx")
    g = chain(4, params=30 * MIB)
    costs = resolve_costs(g, topo)
    res = simulate_pipeline(g, costs, topo, plan([0] * 4, [tuple(range(8))], 1))
    per_bucket = collective_fits.fitted_collective_time("all_reduce", 30 * MIB, 8, "h100_dgx")
    assert sum(res.meta["allreduce_time"]) == pytest.approx(4 * per_bucket, rel=5e-3)


def test_unknown_measured_system_is_a_topology_error() -> None:
    topo = DeviceTopology.from_dict({"name": "x", "collective_fit": "b200_dgx", "devices": [
        {"name": "g", "count": 2, "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 1e12, "memory_bytes": 1e10}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-6}}})
    with pytest.raises(TopologyError, match="not a measured system"):
        link_segments(topo)


@pytest.mark.parametrize("name", ["8x_a100_dgx", "8x_h100_dgx", "2x_a100_nvlink_pair", "2x4_v100_ib", "cpu_2gpu"])
def test_link_segments_equal_the_table_of_each_pair(name: str) -> None:
    """The links' segment tables, built with array operations, against each pair's table built on its own (the
    measured p2p fit of its kind of link between two GPUs, else latency + bytes / bandwidth, each padded with its
    last row)."""
    from placement_rl.cost.comm_fit import fit_applies, fit_segments, inverse_bandwidth, select_fit

    topo = load_topology(name)
    got = link_segments(topo)
    d, inv = topo.num_devices, inverse_bandwidth(topo.link_bandwidth)
    system = fit_applies(topo)
    segs = {}
    if system is not None:
        fits = {dpn: select_fit("p2p", 2, system, dpn, exact_p2p=True) for dpn in (1, 2)}
        segs = {dpn: fit_segments(*f) for dpn, f in fits.items() if f is not None}
    assert got.shape[:2] == (d, d) and got.shape[2] == max([1, *(t.shape[0] for t in segs.values())])
    for i in range(d):
        for j in range(d):
            a, b = topo.devices[i], topo.devices[j]
            dpn = 2 if a.host == b.host else 1
            tab = segs[dpn] if i != j and dpn in segs and a.kind == b.kind == "gpu" else np.array(
                [[np.inf, topo.link_latency[i, j], inv[i, j]]])
            want = np.vstack([tab] + [tab[-1:]] * (got.shape[2] - tab.shape[0]))
            np.testing.assert_array_equal(got[i, j], want)
