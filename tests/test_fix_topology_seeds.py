"""Hand-built topologies refused with one-line errors, placer seeds checked, every placer's answer to a graph no
placement fits, ``cp_sat`` on a graph whose times are all 0, and unpickled topologies kept read-only."""

from __future__ import annotations

import copy
import importlib.util
import pickle
import warnings

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.cost import resolve_costs
from placement_rl.errors import ConfigError, TopologyError
from placement_rl.graph import make_graph
from placement_rl.topology import Device, DeviceTopology, load_topology


def _device(name="d0", **kw):
    base = dict(name=name, kind="cpu", torch_device="cpu", peak_flops=1e12, mem_bandwidth=1e11, memory_bytes=1e10)
    return Device(**{**base, **kw})


def _topology(n=2, devices=None, bw=None, lat=None, mem=1e10, launch=None):
    devices = devices or [_device(f"d{i}", memory_bytes=mem, peak_flops=1e12 * (1 + i),
                                  **({} if launch is None else {"launch_overhead": launch})) for i in range(n)]
    n = len(devices)
    if bw is None:
        bw = np.full((n, n), 1e9)
        np.fill_diagonal(bw, np.inf)
    if lat is None:
        lat = np.full((n, n), 1e-5)
        np.fill_diagonal(lat, 0.0)
    return DeviceTopology(name=f"t{n}", devices=devices, link_bandwidth=bw, link_latency=lat,
                          link_kind=tuple(tuple("pcie" for _ in range(n)) for _ in range(n)))


def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --------------------------------------------------------------------------- topologies
@pytest.mark.parametrize("key,what", [("bw", "bandwidth"), ("lat", "latency")])
def test_a_nan_link_is_named_not_finite_rather_than_asymmetric(key, what):
    arr = np.array([[np.inf, np.nan], [np.nan, np.inf]]) if key == "bw" else np.array([[0, np.nan], [np.nan, 0]])
    with pytest.raises(TopologyError) as exc:
        _topology(**{key: arr})
    assert f"link d0 <-> d1: '{what}' must be a finite" in _one_line(exc) and "got nan" in str(exc.value)


def test_link_values_that_are_not_numbers_are_a_topology_error():
    with pytest.raises(TopologyError, match="'link_bandwidth' must be a 2x2 array of numbers") as exc:
        _topology(bw=[["inf", "x"], ["x", "inf"]])
    _one_line(exc)


@pytest.mark.parametrize("field,value", [("peak_flops", 2**80), ("memory_bytes", 10**30), ("mem_bandwidth", 2**70)])
def test_python_ints_past_int64_are_accepted_as_peaks_and_memory(field, value):
    t = _topology(devices=[_device("a", **{field: value}), _device("b")])
    assert t.array(field)[0] == float(value)


def test_a_python_int_past_float_range_is_a_topology_error():
    with pytest.raises(TopologyError, match="field 'memory_bytes' must be a finite positive number") as exc:
        _topology(devices=[_device("a", memory_bytes=10**400), _device("b")])
    assert len(_one_line(exc)) < 200


def test_numpy_integers_are_accepted_wherever_python_ints_are():
    t = _topology(devices=[_device("a", sm_count=np.int32(80), peak_flops=np.int64(10**12)), _device("b")])
    assert t.devices[0].sm_count == 80 and type(t.devices[0].sm_count) is int
    assert type(t.devices[0].peak_flops) is int  # plain numbers: to_dict writes plain YAML
    entry = {"name": "c", "count": np.int64(2), "host": np.int32(0), "sm_count": np.int16(4),
             "index_start": np.uint8(1), "kind": "gpu", "torch_device": "cuda", "peak_flops": 1e12,
             "mem_bandwidth": 1e11, "memory_bytes": 1e10}
    t = DeviceTopology.from_dict({"name": "x", "devices": [entry],
                                  "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})
    assert [d.torch_device for d in t.devices] == ["cuda:1", "cuda:2"] and t.devices[0].sm_count == 4


@pytest.mark.parametrize("host", [0.5, "a", True, None, -1])
def test_a_device_host_must_be_an_integer_in_one_line(host):
    with pytest.raises(TopologyError, match="field 'host' must be an integer >= 0") as exc:
        _topology(devices=[_device("a", host=host), _device("b")])
    _one_line(exc)
    assert _topology(devices=[_device("a", host=np.int64(1)), _device("b")]).num_hosts == 2


def test_an_integer_field_still_refuses_a_float_or_bool():
    with pytest.raises(TopologyError, match="field 'sm_count' must be an integer >= 0, got 80.0"):
        _topology(devices=[_device("a", sm_count=np.float64(80)), _device("b")])
    entry = {"name": "c", "count": True, "kind": "cpu", "peak_flops": 1, "mem_bandwidth": 1, "memory_bytes": 1}
    with pytest.raises(TopologyError, match="field 'count' must be an integer"):
        DeviceTopology.from_dict({"name": "x", "devices": [entry]})
    entry = {"name": "c", "kind": "cpu", "peak_flops": 1, "mem_bandwidth": 1, "memory_bytes": 10**400}
    with pytest.raises(TopologyError, match="field 'memory_bytes' must be a finite number") as exc:
        DeviceTopology.from_dict({"name": "x", "devices": [entry]})
    assert len(_one_line(exc)) < 200


def test_mappings_given_as_devices_are_a_topology_error():
    entry = dict(name="a", kind="cpu", torch_device="cpu", peak_flops=1, mem_bandwidth=1, memory_bytes=1)
    with pytest.raises(TopologyError, match=r"devices\[0\] is a dict, not a Device .*from_dict") as exc:
        DeviceTopology(name="t", devices=[entry], link_bandwidth=[[np.inf]], link_latency=[[0.0]],
                       link_kind=(("local",),))
    _one_line(exc)
    with pytest.raises(TopologyError, match="field 'devices' must be a list of Device, got None"):
        DeviceTopology(name="t", devices=None, link_bandwidth=[[np.inf]], link_latency=[[0.0]],
                       link_kind=(("local",),))


@pytest.mark.parametrize("copier", [lambda t: pickle.loads(pickle.dumps(t)), copy.deepcopy])
def test_an_unpickled_topology_keeps_its_link_arrays_read_only(copier):
    t = load_topology("2x4_v100_ib")
    t2 = copier(t)
    assert not t2.link_bandwidth.flags.writeable and not t2.link_latency.flags.writeable
    assert t2.to_dict() == t.to_dict()
    with pytest.raises(ValueError):
        t2.link_bandwidth[0, 1] = 1.0


# --------------------------------------------------------------------------- placers
def _graph():
    return make_graph([{"name": k, "fwd_flops": f, "bwd_flops": 2 * f, "param_bytes": 1e6, "act_bytes": 1e5,
                        "out_bytes": 1e6} for k, f in zip("abcd", [1e9, 3e9, 3e9, 1e9])],
                      [["a", "b", 1e6], ["a", "c", 1e6], ["b", "d", 1e6], ["c", "d", 1e6]])


def _names():
    return [n for n in baselines.names() if n != "cp_sat" or importlib.util.find_spec("ortools") is not None]


@pytest.mark.parametrize("seed", [None, -1, 1.5, True, "3"])
def test_every_placer_refuses_a_bad_seed_in_one_line(seed):
    g, t = _graph(), _topology(3)
    c = resolve_costs(g, t)
    for name in _names():
        with pytest.raises(ConfigError, match="seed must be an integer >= 0") as exc:
            baselines.get(name)(g, c, t, budget=100, seed=seed)
        _one_line(exc)


@pytest.mark.parametrize("seed", [None, -1, 1.5, True, "3"])
def test_every_stage_planner_refuses_a_bad_seed_in_one_line(seed):
    from placement_rl.baselines import pipeline

    g, t = _graph(), _topology(2)
    c = resolve_costs(g, t)
    for name in pipeline.PARTITIONERS:
        with pytest.raises(ConfigError, match="seed must be an integer >= 0") as exc:
            pipeline.get(name)(g, c, t, budget=50, seed=seed, num_microbatches=1)
        _one_line(exc)


def test_every_placer_takes_numpy_and_large_integer_seeds():
    g, t = _graph(), _topology(3)
    c = resolve_costs(g, t)
    for seed in (np.int64(3), 2**70):
        for name in _names():
            p = baselines.get(name)(g, c, t, budget=100, seed=seed, seconds=5)
            assert p.meta["seed"] == int(seed) and p.meta["feasible"], name


def test_cp_sat_runs_with_a_seed_above_32_bits():
    pytest.importorskip("ortools")
    g, t = _graph(), _topology(3)
    c = resolve_costs(g, t)
    p = baselines.get("cp_sat")(g, c, t, budget=100, seed=2**31 + 5, seconds=5)
    assert "cp_optimal" in p.meta  # CP-SAT ran (it did not stop at its seed)


def test_every_placer_returns_an_infeasible_placement_when_no_placement_fits():
    """The graph needs 15.6 MiB, the three devices hold 3 KB in all: no placer raises, each says it does not fit."""
    g, t = _graph(), _topology(3, mem=1e3)
    c = resolve_costs(g, t)
    for name in _names():
        p = baselines.get(name)(g, c, t, budget=100, seed=0)
        assert p.meta["feasible"] is False, name
        assert len(p.device_of_node) == g.num_nodes
    p = baselines.get("sim_eft")(g, c, t, budget=100, seed=0)
    assert p.meta["note"].startswith("no placement fits memory") and "memory ignored" in p.meta["note"]


def test_cp_sat_on_a_graph_whose_times_are_all_zero_warns_of_nothing():
    pytest.importorskip("ortools")
    t = _topology(3, launch=0.0)
    z = make_graph([{"name": f"n{i}"} for i in range(4)], [[0, 1], [1, 2], [2, 3]])
    c = resolve_costs(z, t)
    assert not c.fwd_time.any() and not c.bwd_time.any()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = baselines.get("cp_sat")(z, c, t, budget=30, seed=0)
    assert p.meta["step_time"] == 0.0 and p.meta["feasible"]


def test_the_cp_model_of_a_zero_horizon_has_zero_ticks_without_warnings():
    """``upper`` 0 (every time 0): the model's ticks are all 0, with no division by a zero tick."""
    pytest.importorskip("ortools")
    from placement_rl.baselines.bounds_cp import _whole

    t = _topology(3, launch=0.0)
    z = make_graph([{"name": f"n{i}"} for i in range(4)], [[0, 1], [1, 2], [2, 3]])
    c = resolve_costs(z, t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p, tick = _whole(z, c, t, 0.0, False, True, "program")
    assert tick > 0 and not p.fwd.any() and not p.bwd.any() and not p.cut.any() and not p.pair.any()


def test_a_binary_graph_or_topology_file_is_one_line(tmp_path):
    from placement_rl.errors import GraphError
    from placement_rl.graph.codec import read_graph_json

    bad = tmp_path / "binary.json"
    bad.write_bytes(b"\xff\xfe\x00\x01garbage")
    with pytest.raises(GraphError, match="is not a UTF-8 text file") as exc:
        read_graph_json(str(bad))
    _one_line(exc)
    bad_yaml = tmp_path / "binary.yaml"
    bad_yaml.write_bytes(b"\xff\xfe\x00\x01garbage")
    with pytest.raises(TopologyError, match="is not a UTF-8 text file") as exc:
        load_topology(str(bad_yaml))
    _one_line(exc)
