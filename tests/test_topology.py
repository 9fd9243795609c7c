"""DeviceTopology: presets, YAML validation, round trips, subsets and local detection."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from placement_rl import _local
from placement_rl.errors import PlacementRLError, TopologyError
from placement_rl.topology import DeviceTopology, conf_dir, detect_local, load_topology, preset_names

EXPECTED_DEVICES = {
    "2x_k80": 2, "4x_v100_pcie": 4, "4x_v100_nvlink": 4, "8x_a100_nvswitch": 8, "4x_h100_nvlink": 4,
    "cpu_2gpu": 3, "2x4_v100_ib": 8, "2x_cpu": 2, "2x_small_gpu": 2,
}


def _two_gpu() -> dict:
    """A minimal valid topology dict; tests break one field at a time."""
    return {
        "name": "t",
        "devices": [{"name": "gpu", "count": 2, "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 9e11,
                     "memory_bytes": 2**34}],
        "links": {"intra_host": {"bandwidth": 16e9, "latency": 1e-5, "kind": "pcie"}},
    }


# ------------------------------------------------------------------ presets
def test_every_expected_preset_exists():
    assert set(EXPECTED_DEVICES) <= set(preset_names())


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_preset_loads_with_sensible_magnitudes(name):
    topo = load_topology(name)
    assert topo.name == name
    assert topo.description.strip()
    assert topo.num_devices == EXPECTED_DEVICES[name]
    n = topo.num_devices
    off = ~np.eye(n, dtype=bool)
    for d in topo.devices:
        if d.kind == "gpu":
            assert 1e12 <= d.peak_flops <= 1e16, d
            assert 5e10 <= d.mem_bandwidth <= 1e13, d
            assert 2**30 <= d.memory_bytes <= 2**38, d
            assert d.torch_device.startswith("cuda:")
        else:
            assert 1e10 <= d.peak_flops <= 1e14, d  # a CPU socket or core: 10 GFLOP/s .. 100 TFLOP/s
            assert 1e9 <= d.mem_bandwidth <= 1e12, d
            assert d.torch_device == "cpu"
        assert 0 <= d.launch_overhead < 1e-3
    bw, lat = topo.link_bandwidth, topo.link_latency
    np.testing.assert_array_equal(bw, bw.T)
    np.testing.assert_array_equal(lat, lat.T)
    assert np.all(np.isinf(np.diag(bw))) and np.all(np.diag(lat) == 0)
    assert np.all(bw[off] >= 1e9) and np.all(bw[off] <= 1e12)
    assert np.all(lat[off] > 0) and np.all(lat[off] < 1e-3)
    for i in range(n):
        for j in range(n):
            assert topo.link_kind[i][j] == topo.link_kind[j][i]
            assert (topo.link_kind[i][j] == "local") == (i == j)


def test_preset_files_cite_a_source_for_every_number():
    """Each numeric line of a preset carries a comment naming where the figure comes from."""
    for path in sorted((conf_dir() / "topology").glob("*.yaml")):
        for line in path.read_text().splitlines():
            body = line.split("#", 1)[0]
            key = body.strip().lstrip("-{ ").split(":", 1)[0]
            if key in ("peak_flops", "mem_bandwidth", "memory_bytes", "bandwidth", "latency", "launch_overhead") \
                    or key.startswith("peak_flops_") or "bandwidth:" in body:
                assert "#" in line, f"{path.name}: no source comment on: {line.strip()}"


def test_ib_preset_inter_host_slower_than_intra_host():
    topo = load_topology("2x4_v100_ib")
    hosts = np.array([d.host for d in topo.devices])
    assert topo.num_hosts == 2 and sorted(set(hosts)) == [0, 1]
    same = (hosts[:, None] == hosts[None, :]) & ~np.eye(topo.num_devices, dtype=bool)
    cross = hosts[:, None] != hosts[None, :]
    assert topo.link_bandwidth[cross].max() < topo.link_bandwidth[same].min()
    assert topo.link_latency[cross].min() > topo.link_latency[same].max()
    assert {topo.link_kind[0][4], topo.link_kind[4][0]} == {"ib"}
    # cuda indices restart on each host
    assert [d.torch_device for d in topo.devices] == [f"cuda:{i}" for i in range(4)] * 2


def test_dgx1_quad_nvlink_counts():
    topo = load_topology("4x_v100_nvlink")
    two_links = {(0, 3), (1, 2), (2, 3)}
    for i in range(4):
        for j in range(i + 1, 4):
            assert topo.link_kind[i][j] == "nvlink"
            assert topo.link_bandwidth[i, j] == (50e9 if (i, j) in two_links else 25e9)
    pcie = load_topology("4x_v100_pcie")
    assert topo.link_bandwidth[0, 1] > pcie.link_bandwidth[0, 1]


def test_heterogeneous_and_small_presets():
    het = load_topology("cpu_2gpu")
    assert [d.kind for d in het.devices] == ["cpu", "gpu", "gpu"]
    assert het.devices[0].torch_device == "cpu"
    assert het.devices[0].peak_flops < het.devices[1].peak_flops
    small = load_topology("2x_small_gpu")
    assert small.array("memory_bytes").max() <= 2 * 2**30
    cpus = load_topology("2x_cpu")
    assert cpus.device_names == ("cpu0", "cpu1")
    assert all(d.kind == "cpu" and d.torch_device == "cpu" for d in cpus.devices)


def test_preset_meta_keeps_extra_keys():
    assert load_topology("4x_h100_nvlink").meta["peak_flops_bf16"] == pytest.approx(989.4e12)


# ------------------------------------------------------------------ local detection
def test_local_detection_on_this_machine():
    topo = detect_local()
    assert topo.name == "local"
    cpu = topo.devices[0]
    assert (cpu.name, cpu.kind, cpu.torch_device) == ("cpu", "cpu", "cpu")
    assert 1e9 < cpu.peak_flops < 1e15 and 1e8 < cpu.mem_bandwidth < 1e13
    assert cpu.memory_bytes > 2**28
    src = topo.meta["sources"]["cpu"]
    assert src["peak_flops"] == "measured" and src["mem_bandwidth"] == "measured"
    assert src["memory_bytes"] in ("os", "default")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert topo.num_devices == 1 + gpus
    json.dumps(topo.to_dict())  # meta stays plain JSON


def test_load_topology_local_and_unmeasured_defaults():
    assert load_topology("local").device_names[0] == "cpu"
    quick = detect_local(measure=False)
    assert quick.meta["sources"]["cpu"]["peak_flops"] == "default"
    assert quick.devices[0].peak_flops > 0 and quick.meta["measured"] is False


def test_local_helpers():
    assert _local.gpu_spec("NVIDIA H100 80GB HBM3") == (67e12, 3.35e12)
    assert _local.gpu_spec("NVIDIA H100 PCIe")[0] == 51e12
    assert _local.gpu_spec("Tesla V100-PCIE-32GB")[0] == 14e12
    assert _local.gpu_spec("Tesla V100-SXM2-16GB")[0] == 15.7e12
    assert _local.gpu_spec("Tesla V100S-PCIE-32GB")[0] == 16.4e12
    assert _local.gpu_spec("NVIDIA A100-SXM4-80GB")[1] == 2.039e12
    assert _local.gpu_spec("Some Unknown Accelerator") is None
    assert _local.nvlink_bandwidth_per_link(7) == 25e9 and _local.nvlink_bandwidth_per_link(6) == 20e9
    mem, src = _local.host_memory_bytes()
    assert mem > 0 and src in ("os", "default")


def test_nvml_absent_is_not_an_error():
    nvml = _local._NVML()
    try:
        if nvml.nv is None:  # this CPU-only machine: every query answers None
            assert nvml.handle(0, None) is None and nvml.call("nvmlDeviceGetCount") is None
        assert nvml.call("nvmlNoSuchFunction") is None
    finally:
        nvml.close()


def test_gpu_pair_links_from_nvlink_counts():
    """DGX-1V quad (direct links, NCCL topology dump of NVIDIA/nccl#671), DGX A100 (NVSwitch) and PCIe-only."""
    buses = ["0000:06:00.0", "0000:07:00.0", "0000:0a:00.0", "0000:0b:00.0"]
    infos = [{"bus": b, "cc_major": 7, "pcie": 15.75e9} for b in buses]
    peers = [{buses[1]: 1, buses[2]: 1, buses[3]: 2, "0000:85:00.0": 2},
             {buses[0]: 1, buses[2]: 2, buses[3]: 1, "0000:86:00.0": 2},
             {buses[0]: 1, buses[1]: 2, buses[3]: 2, "0000:89:00.0": 1},
             {buses[0]: 2, buses[1]: 1, buses[2]: 2, "0000:8a:00.0": 1}]
    all_gpus = set(buses) | {"0000:85:00.0", "0000:86:00.0", "0000:89:00.0", "0000:8a:00.0"}
    links = {(i, j): (bw, kind) for i, j, bw, _, kind, _ in _local.gpu_pair_links(infos, peers, all_gpus)}
    assert links[(0, 3)] == (50e9, "nvlink") and links[(0, 1)] == (25e9, "nvlink")
    assert links[(1, 2)] == (50e9, "nvlink") and links[(1, 3)] == (25e9, "nvlink")
    # DGX A100: 12 links per GPU, two to each of six switches -> 12 x 25 GB/s per direction
    switches = [f"0000:c{k}:00.0" for k in range(4, 10)]
    a100 = [{"bus": f"0000:0{k}:00.0", "cc_major": 8, "pcie": 31.5e9} for k in range(3)]
    a100_peers = [{s: 2 for s in switches} for _ in range(3)]
    gpus = {x["bus"] for x in a100}
    for _, _, bw, lat, kind, source in _local.gpu_pair_links(a100, a100_peers, gpus):
        assert (bw, kind, source) == (300e9, "nvswitch", "nvml") and lat == _local.NVLINK_LATENCY
    # no NVLink: PCIe at the slower slot, or the default when NVML gave nothing
    pcie = [{"bus": "a", "cc_major": 8, "pcie": 31.5e9}, {"bus": "b", "cc_major": 8, "pcie": 15.75e9},
            {"bus": None, "cc_major": 8, "pcie": None}]
    got = {(i, j): (bw, kind, src) for i, j, bw, _, kind, src in _local.gpu_pair_links(pcie, [{}, {}, {}], {"a", "b"})}
    assert got[(0, 1)] == (15.75e9, "pcie", "nvml")
    assert got[(0, 2)] == (_local.PCIE_DEFAULT[0], "pcie", "default")


@pytest.mark.gpu
def test_local_detection_sees_gpus():
    import torch

    topo = detect_local()
    assert topo.num_devices == 1 + torch.cuda.device_count()
    for d in topo.devices[1:]:
        assert d.kind == "gpu" and d.torch_device.startswith("cuda:") and d.memory_bytes > 2**30
        assert topo.meta["sources"][d.name]["peak_flops"] in ("table", "measured")
        # what the calibrated cost model reads: the product name (architecture facts), SMs and L2
        assert d.model == torch.cuda.get_device_name(d.torch_device) and d.sm_count > 0 and d.l2_bytes > 0


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["devices"][0].pop("peak_flops"), "peak_flops"),
    (lambda d: d["devices"][0].pop("memory_bytes"), "memory_bytes"),
    (lambda d: d["links"]["intra_host"].pop("bandwidth"), "bandwidth"),
    (lambda d: d["devices"][0].update(mem_bandwidth=-1.0), "mem_bandwidth"),
    (lambda d: d["devices"][0].update(peak_flops=0), "peak_flops"),
    (lambda d: d["devices"][0].update(peak_flops="fast"), "peak_flops"),
    (lambda d: d["devices"][0].update(count=0), "count"),
    (lambda d: d["devices"][0].update(kind="tpu"), "kind"),
    (lambda d: d["devices"][0].update(host=-1), "host"),
    (lambda d: d["links"]["intra_host"].update(bandwidth=0), "gpu0"),
    (lambda d: d["links"]["intra_host"].update(latency=-1e-6), "gpu0"),
    (lambda d: d["links"].update(pairs=[{"between": ["gpu0", "gpu7"], "bandwidth": 1e9, "latency": 0}]), "gpu7"),
    (lambda d: d["links"].update(pairs=[{"between": ["gpu0"], "bandwidth": 1e9, "latency": 0}]), "between"),
    (lambda d: d["links"].update(pairs=[{"between": ["gpu0", "gpu0"], "bandwidth": 1e9, "latency": 0}]), "gpu0"),
    (lambda d: d.pop("links"), "no link between 'gpu0' and 'gpu1'"),
    (lambda d: d.update(devices=[]), "devices"),
    (lambda d: d["devices"].append(dict(d["devices"][0], count=1, name="gpu0")), "duplicate device name 'gpu0'"),
])
def test_bad_dicts_raise_topology_error_naming_the_field(mutate, needle):
    data = _two_gpu()
    mutate(data)
    with pytest.raises(TopologyError, match=needle.replace("[", r"\[")):
        DeviceTopology.from_dict(data)


def test_missing_link_between_hosts_names_both_devices():
    data = _two_gpu()
    data["devices"] = [dict(data["devices"][0], name="a", count=1, host=0),
                       dict(data["devices"][0], name="b", count=1, host=1)]
    with pytest.raises(TopologyError, match="no link between 'a' and 'b'"):
        DeviceTopology.from_dict(data)
    data["links"]["inter_host"] = {"bandwidth": 12.5e9, "latency": 2e-5, "kind": "ib"}
    topo = DeviceTopology.from_dict(data)
    assert topo.link_kind[0][1] == "ib" and topo.num_hosts == 2


def test_yaml_file_errors(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndevices: [ {name: gpu\n")
    with pytest.raises(TopologyError, match="malformed YAML"):
        load_topology(bad)
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(TopologyError, match="top level must be a mapping"):
        load_topology(empty)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(TopologyError, match="unknown topology preset 'no_such_cluster'.*2x_cpu"):
        load_topology("no_such_cluster")


def test_topology_error_is_a_domain_error():
    assert issubclass(TopologyError, PlacementRLError)


def test_direct_construction_is_validated():
    topo = load_topology("2x_cpu")
    with pytest.raises(TopologyError, match="symmetric"):
        DeviceTopology(name="x", devices=topo.devices, link_bandwidth=[[np.inf, 1e9], [2e9, np.inf]],
                       link_latency=topo.link_latency, link_kind=topo.link_kind)
    with pytest.raises(TopologyError, match="cpu0 <-> cpu1"):
        DeviceTopology(name="x", devices=topo.devices, link_bandwidth=[[np.inf, 0.0], [0.0, np.inf]],
                       link_latency=topo.link_latency, link_kind=topo.link_kind)
    with pytest.raises(TopologyError, match="no device 'gpu0'"):
        topo.index_of("gpu0")


# ------------------------------------------------------------------ round trips and subsets
@pytest.mark.parametrize("name", ["4x_v100_nvlink", "2x4_v100_ib", "cpu_2gpu"])
def test_to_dict_from_dict_round_trip(name, tmp_path: Path):
    import yaml

    topo = load_topology(name)
    again = DeviceTopology.from_dict(copy.deepcopy(topo.to_dict()))
    assert again.name == topo.name and again.description == topo.description
    assert again.devices == topo.devices
    np.testing.assert_array_equal(again.link_bandwidth, topo.link_bandwidth)
    np.testing.assert_array_equal(again.link_latency, topo.link_latency)
    assert again.link_kind == topo.link_kind
    assert dict(again.meta) == dict(topo.meta)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo.to_dict()))
    from_file = load_topology(path)
    assert from_file.devices == topo.devices
    np.testing.assert_array_equal(from_file.link_bandwidth, topo.link_bandwidth)


def test_local_round_trip():
    topo = detect_local(measure=False)
    again = DeviceTopology.from_dict(json.loads(json.dumps(topo.to_dict())))
    assert again.devices == topo.devices and again.meta["sources"] == topo.meta["sources"]


def test_subset_keeps_links_and_devices():
    topo = load_topology("2x4_v100_ib")
    sub = topo.subset([3, 4])
    assert sub.device_names == ("n0_gpu3", "n1_gpu0")
    assert sub.link_bandwidth[0, 1] == topo.link_bandwidth[3, 4] == 12.5e9
    assert sub.link_kind[0][1] == "ib" and sub.num_hosts == 2
    quad = topo.subset(range(4), name="quad")
    assert quad.name == "quad" and quad.num_hosts == 1
    np.testing.assert_array_equal(quad.link_bandwidth, topo.link_bandwidth[:4, :4])
    assert topo.subset([1]).num_devices == 1
    with pytest.raises(TopologyError, match="out of range"):
        topo.subset([0, 8])
    with pytest.raises(TopologyError, match="at least one"):
        topo.subset([])
    with pytest.raises(TopologyError, match="duplicate"):
        topo.subset([0, 0])


def test_arrays_and_summary():
    topo = load_topology("cpu_2gpu")
    assert topo.array("peak_flops").shape == (3,)
    assert topo.index_of("gpu1") == 2
    assert "cpu_2gpu" in topo.summary() and "gpu1" in topo.summary()
    assert not topo.link_bandwidth.flags.writeable


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["devices"][0].update(modle="H100"), "devices[0]: unknown field 'modle'; did you mean 'model'?"),
    (lambda d: d["devices"][0].update(peak_flop=1e13), "unknown field 'peak_flop'; did you mean 'peak_flops'?"),
    (lambda d: d["devices"][0].update(peak_flops_tf23=1e14), "unknown field 'peak_flops_tf23'"),
    (lambda d: d["links"].update(intra_hots={"bandwidth": 1e9, "latency": 0}), "links: unknown field 'intra_hots'"),
    (lambda d: d["links"]["intra_host"].update(bandwith=1e9), "links.intra_host: unknown field 'bandwith'"),
    (lambda d: d["links"].update(pairs=[{"between": ["gpu0", "gpu1"], "bandwidth": 1e9, "latency": 0,
                                         "knd": "nvlink"}]), "links.pairs[0]: unknown field 'knd'"),
    (lambda d: d["devices"][0].update(numbered="yes"), "field 'numbered' must be true or false"),
])
def test_unknown_fields_are_named_with_the_valid_ones(mutate, needle):
    data = _two_gpu()
    mutate(data)
    with pytest.raises(TopologyError, match=needle.replace("[", r"\[").replace("?", r"\?")) as err:
        DeviceTopology.from_dict(data)
    assert "valid fields:" in str(err.value) or "numbered" in needle
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("extra, needle", [
    ({"link": {}}, "unknown top-level field 'link'; did you mean 'links'?"),
    ({"dtpye": "bf16"}, "unknown top-level field 'dtpye'; did you mean 'dtype'?"),
    ({"hosts": 2}, "top-level field 'hosts' is not read; 'host' belongs in each device entry"),
    ({"memory_bytes": 8e9}, "top-level field 'memory_bytes' is not read; 'memory_bytes' belongs in each device entry"),
    ({"peak_flops": 1e13}, "top-level field 'peak_flops' is not read; 'peak_flops' belongs in each device entry"),
    ({"model": "H100"}, "top-level field 'model' is not read; 'model' belongs in each device entry"),
    ({"inter_host": {"bandwidth": 1e9, "latency": 0}}, "'inter_host' belongs in 'links'"),
])
def test_a_top_level_key_that_looks_like_a_field_is_refused(extra, needle):
    data = {**_two_gpu(), **extra}
    with pytest.raises(TopologyError, match=needle.replace("?", r"\?")) as err:
        DeviceTopology.from_dict(data)
    assert "\n" not in str(err.value)


def test_free_form_top_level_notes_stay_in_meta():
    data = {**_two_gpu(), "notes": "rack 3", "peak_flops_fp64": 7.8e12, "sources": {"gpu0": "nvml"}}
    topo = DeviceTopology.from_dict(data)
    assert topo.meta["notes"] == "rack 3" and topo.meta["sources"] == {"gpu0": "nvml"}
    assert DeviceTopology.from_dict(topo.to_dict()).meta["notes"] == "rack 3"


def test_unknown_device_field_in_a_yaml_file(tmp_path: Path):
    text = (conf_dir() / "topology" / "4x_h100_nvlink.yaml").read_text().replace("model: H100", "modle: H100")
    (tmp_path / "typo.yaml").write_text(text)
    with pytest.raises(TopologyError, match=r"typo.yaml: devices\[0\]: unknown field 'modle'.*valid fields: name"):
        load_topology(tmp_path / "typo.yaml")


def test_contradictory_duplicate_pairs_are_refused():
    data = _two_gpu()
    data["links"]["pairs"] = [{"between": ["gpu0", "gpu1"], "bandwidth": 1e10, "latency": 1e-5},
                              {"between": ["gpu1", "gpu0"], "bandwidth": 2e10, "latency": 1e-5}]
    with pytest.raises(TopologyError, match=r"links.pairs\[1\]: link gpu1 <-> gpu0 \(bandwidth 2e\+10.*contradicts "
                                            r"links.pairs\[0\] \(bandwidth 1e\+10"):
        DeviceTopology.from_dict(data)
    data["links"]["pairs"][1]["bandwidth"] = 1e10  # the same link twice says nothing contradictory
    assert DeviceTopology.from_dict(data).link_bandwidth[0, 1] == 1e10
    data["links"]["pairs"][1]["kind"] = "nvlink"
    with pytest.raises(TopologyError, match="contradicts"):
        DeviceTopology.from_dict(data)


def test_every_preset_and_test_yaml_still_loads():
    here = Path(__file__).parent
    files = [*sorted((conf_dir() / "topology").glob("*.yaml")), *sorted(here.rglob("*.yaml")),
             *sorted(here.rglob("*.yml"))]
    loaded = [load_topology(p) for p in files if p.stem != "local" and "devices" in p.read_text()]
    assert len(loaded) >= len(preset_names())


def test_the_cli_detects_the_local_cpu_with_the_threads_plans_run_with(monkeypatch):
    """``topology=local`` measures the CPU with the torch threads a plan's processes use (``deploy threads=``,
    default 1), not this process's count: ``place`` and ``deploy`` predicted 61.0 and 31.4 ms for one plan."""
    import torch
    from omegaconf import OmegaConf

    from placement_rl.cli import common

    seen = []
    monkeypatch.setattr(common, "detect_local", lambda: seen.append(torch.get_num_threads()) or "topo")
    before = torch.get_num_threads()
    cfg = OmegaConf.create({"name": "local", "detect": True})
    assert common.build_topology(cfg) == "topo" and common.build_topology(cfg, threads=3) == "topo"
    assert seen == [1, 3] and torch.get_num_threads() == before


def test_a_decode_over_more_devices_than_it_decides_over_is_one_line():
    """Above ``MAX_DEVICES`` (the decode's time and memory grow as D^2: 4,096 devices ran out of time and memory)
    op-level placement (every placer's problem, the policy's task) is refused at once, naming what to do instead."""
    from placement_rl.baselines.common import Problem
    from placement_rl.cost import resolve_costs
    from placement_rl.cost.limits import MAX_DEVICES, check_devices
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.errors import ConfigError
    from placement_rl.graph import synthetic

    def cluster(n):
        return DeviceTopology.from_dict({"name": f"c{n}", "devices": [{"name": "g", "count": n, "kind": "gpu",
                                                                        "model": "H100"}],
                                         "links": {"intra_host": {"bandwidth": 5e10, "latency": 1e-5}}})

    check_devices(cluster(MAX_DEVICES))
    big = cluster(MAX_DEVICES + 1)
    with pytest.raises(ConfigError, match=rf"has {MAX_DEVICES + 1} devices: .* decides over at most {MAX_DEVICES}"):
        check_devices(big)
    g = synthetic.sample("layered", num_nodes=5, seed=0)
    c = resolve_costs(g, big)
    with pytest.raises(ConfigError, match="decides over at most"):
        Problem(g, c, big, budget=10, seed=0)
    with pytest.raises(ConfigError, match="decides over at most"):
        ConstructiveTask.build(g, big, c)
