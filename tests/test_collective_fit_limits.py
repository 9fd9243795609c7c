"""Where the measured NCCL fits stop: layouts and GPU counts the tables lack, sizes between and above their rows."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost.collectives import collective_coeffs, collective_time, measured_segments
from placement_rl.cost.comm_fit import evaluate_fit, fit_segments, ring_factor, segment_time, select_fit, shipped
from placement_rl.profiling import collective_fits
from placement_rl.profiling.sailor import Series
from placement_rl.topology import DeviceTopology

MIB = 2.0 ** 20


def two_dgx_nodes(system: str) -> DeviceTopology:
    """Two hosts of 8 GPUs naming a measured system, IB between the hosts."""
    gpus = [{"name": f"n{h}_gpu", "count": 8, "kind": "gpu", "host": h, "peak_flops": 6.7e13,
             "mem_bandwidth": 3.35e12, "memory_bytes": 8.0e10} for h in (0, 1)]
    return DeviceTopology.from_dict({"name": "2x8", "collective_fit": system, "devices": gpus, "links": {
        "intra_host": {"bandwidth": 359.6e9, "latency": 5e-6}, "inter_host": {"bandwidth": 50e9, "latency": 2e-5}}})


def ring_series(system: str, n: int, dpn: int, slow: float = 1.0) -> dict:
    """The fit of an ideal ring all-reduce (``slow`` times slower than the ring factor says)."""
    sizes = 2.0 ** np.arange(20, 31)
    times = slow * (2e-5 + ring_factor("all_reduce", n) * sizes / 100e9)
    return collective_fits.fit_series(Series("t", system, "all_reduce", n, dpn, sizes, times))


def test_cross_node_collective_on_a_one_node_system_gets_the_analytic_model():
    """h100_dgx measured 2, 4 and 8 GPUs on one node only: over two nodes its NVSwitch curve does not apply."""
    topo = two_dgx_nodes("h100_dgx")
    assert select_fit("all_reduce", 16, "h100_dgx", 8) is None
    assert select_fit("all_reduce", 8, "h100_dgx", 4) is None
    for devs in (list(range(16)), [0, 1, 2, 3, 8, 9, 10, 11]):
        assert measured_segments("allreduce", devs, topo) is None
        analytic = min(a + b * 64 * MIB for a, b in collective_coeffs("allreduce", devs, topo).values())
        assert collective_time("allreduce", 64 * MIB, devs, topo) == pytest.approx(analytic)
    one_node = collective_time("allreduce", 64 * MIB, range(8), topo)
    assert collective_time("allreduce", 64 * MIB, range(16), topo) > 3 * one_node  # the IB link is in the price
    only_across = [ring_series("x", 4, 2), ring_series("x", 8, 4)]
    assert select_fit("all_reduce", 4, "x", 4, fits=only_across) is None  # nor the other way round


def test_unmeasured_gpu_count_only_where_the_measured_counts_follow_the_ring_factor():
    fits = [ring_series("switch", 4, 4), ring_series("switch", 8, 8),
            ring_series("pairs", 2, 2), ring_series("pairs", 4, 4, slow=3.0)]
    entry, factor = select_fit("all_reduce", 6, "switch", fits=fits)
    assert entry["n_gpus"] == 8 and factor == pytest.approx(ring_factor("all_reduce", 6) / ring_factor("all_reduce", 8))
    assert select_fit("all_reduce", 16, "switch", fits=fits) is not None  # 4 and 8 agree, 16 within a factor 2
    assert select_fit("all_reduce", 32, "switch", fits=fits) is None  # beyond a factor 2 of any measured count
    assert select_fit("all_reduce", 3, "pairs", fits=fits) is None  # 2 and 4 disagree: the rule does not hold
    assert select_fit("all_reduce", 8, "pairs", fits=fits) is None
    # the shipped files: NVSwitch DGX counts 4 <-> 8 follow the rule; pairwise NVLink and Sailor 2 <-> 4 do not
    assert select_fit("all_reduce", 6, "h100_dgx") is not None
    assert select_fit("all_reduce", 3, "a100_pairwise_nvlink") is None
    assert select_fit("all_gather", 8, "A100-40") is None


def test_fitted_curve_rises_and_stays_between_the_neighbouring_rows():
    """A sparse table with a slow band (rows off the trend) and two close rows that disagree, in a gap of the
    table: the curve neither swings between them nor falls, and follows the majority of the rows."""
    sizes = np.array([5, 10, 20, 40, 80, 160, 320, 640, 1344, 2004, 2048]) * MIB
    times = 1e-4 + sizes / 100e9
    times[[3, 9]] *= 1.5  # 40 MiB and 2004 MiB in the slow band
    s = Series("t", "sys", "all_gather", 2, 2, sizes, times)
    fit = collective_fits.fit_series(s)
    grid = np.geomspace(MIB, 2048 * MIB, 2000)
    t = evaluate_fit(fit, grid)
    assert np.all(np.diff(t) >= 0)
    gap = (grid > 1344 * MIB) & (grid < 2004 * MIB)
    assert t[gap].max() <= times[9] and t[gap].min() >= times[8] / 1.1
    assert np.mean(np.abs(collective_fits.fit_errors(fit, s)) <= 0.1) >= 9 / 11


@pytest.mark.parametrize("system,neighbours", [("A100-40", (12.96e-3, 28.97e-3)), ("GH-96", (16.10e-3, 37.15e-3)),
                                               ("V100-16", (30.73e-3, 62.18e-3))])
def test_shipped_all_gather_has_no_spike_between_its_rows(system, neighbours):
    """Between the measured 1344 MiB and 2004 MiB rows the shipped fit was 15-40x above both."""
    (fit,) = [f for f in shipped() if (f["system"], f["kind"], f["n_gpus"]) == (system, "all_gather", 2)]
    t = evaluate_fit(fit, np.linspace(1344, 2004, 200) * MIB)
    assert t.max() <= neighbours[1] and t.min() >= neighbours[0] / 1.1


def test_time_keeps_growing_above_the_largest_measured_size():
    knots = np.array([20.0, 25.0, 29.0, 30.0])
    linear = {"log2_bytes": list(knots), "log_seconds": list(np.log(1e-5 + 2.0 ** knots / 1e11))}
    for m in (2.0, 16.0):  # the last octave's bandwidth continues: exact on a latency + bytes / bandwidth series
        n = m * 2.0 ** 30
        assert float(evaluate_fit(linear, n)) == pytest.approx(1e-5 + n / 1e11, rel=1e-3)
    falling = {"log2_bytes": [20.0, 30.0, 31.0], "log_seconds": [np.log(1e-4), np.log(2e-2), np.log(1e-2)]}
    top = 2.0 ** 31  # a last knot below the one before: the largest size's time per byte continues
    assert float(evaluate_fit(falling, 4 * top)) == pytest.approx(4e-2)
    for f in shipped():  # the simulators' segment tables, not only evaluate_fit, keep growing
        seg, mx = fit_segments(f), f["max_bytes"]
        assert seg[-1, 2] > 0 and segment_time(seg, 2 * mx) > 1.2 * segment_time(seg, mx)
        assert segment_time(seg, 8 * mx) == pytest.approx(float(evaluate_fit(f, 8 * mx)), rel=1e-6)


def test_gpus_on_one_larger_node_take_the_measured_one_node_series():
    """4 GPUs of an 8-GPU node are on one node: the measured 4-GPU one-node series prices them, whatever the node's
    size (it returned None on the DGX systems, whose 2 <-> 8 counts disagree)."""
    from placement_rl.cost.comm_fit import select_fit

    for system in ("a100_dgx", "h100_dgx"):
        four = select_fit("all_reduce", 4, system, devices_per_node=4)
        assert four is not None and four[1] == 1.0
        assert select_fit("all_reduce", 4, system, devices_per_node=8) == four
