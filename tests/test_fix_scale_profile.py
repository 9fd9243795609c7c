"""Measured profiles read as costs and written again: a rerun with other threads or repeats is refused and a resume
says how many nodes it kept, the cost source says what was profiled and which links price transfers, the
profile's link fits between two torch devices are used, implausible times warn and unknown nodes are refused, a
profile of another host says so, and a copy onto its own device prints no bandwidth."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch

from placement_rl.cli.profile import link_line
from placement_rl.cost import resolve_costs
from placement_rl.cost.costs_file import _profile_label, _profile_links, load_costs
from placement_rl.devices import Device
from placement_rl.errors import ProfileError
from placement_rl.graph import synthetic
from placement_rl.profiling import ProfileDB
from placement_rl.profiling.run import check_resume
from placement_rl.topology import load_topology

torch.set_num_threads(1)


def local_cpu() -> Device:
    return Device(name="cpu", kind="cpu", torch_device="cpu", peak_flops=1e11, mem_bandwidth=2.6e10, memory_bytes=8e9)


def profile_of(graph, topology, *, host: str | None = None, repeats: int = 3) -> ProfileDB:
    """A profile whose times are the topology's own estimates (plausible by construction)."""
    est = resolve_costs(graph, topology)
    db = ProfileDB()
    db.add_device("cpu", local_cpu())
    db.data["devices"]["cpu"]["threads"] = 1  # as timed with one thread (add_device records the process's setting)
    if host is not None:
        db.data["devices"]["cpu"]["host"] = host
    for i, name in enumerate(graph.names):
        db.put_node(graph, "cpu", name, [est.fwd_time[i, 0]] * repeats, [est.bwd_time[i, 0]] * repeats)
    db.put_link("cpu", "cpu", "copy", [1024.0, 65536.0], [8e-7, 9e-7], 8e-7, 8e13)
    return db


@pytest.fixture(scope="module")
def graph():
    return synthetic.sample("layered", num_nodes=12, seed=0)


# ------------------------------------------------------------------------ 6: resume with other settings
def test_a_resume_keeps_nodes_of_the_same_settings_and_refuses_others(graph):
    db = profile_of(graph, load_topology("2x_cpu"))
    assert db.data["devices"]["cpu"]["threads"] == 1
    assert check_resume(db, graph, "cpu", threads=1, repeats=3) == graph.num_nodes
    with pytest.raises(ProfileError, match=r"timed device 'cpu' with 1 thread, repeats 3, not 2 threads and "
                                           r"repeats 3: resume it with those settings, or write another output"):
        check_resume(db, graph, "cpu", threads=2, repeats=3)
    with pytest.raises(ProfileError, match=r"repeats 3, not 1 thread and repeats 10"):
        check_resume(db, graph, "cpu", threads=1, repeats=10)
    assert check_resume(ProfileDB(), graph, "cpu", threads=4, repeats=10) == 0  # a new file: nothing kept


@pytest.mark.slow
def test_profile_rerun_says_what_it_kept_and_refuses_other_threads(tmp_path):
    from tests.test_fix_scale_sweep import cli

    tiny = ["graph=mlp", "+graph.overrides.batch_size=8", "+graph.overrides.in_features=16",
            "+graph.overrides.hidden=16", "+graph.overrides.layers=1", f"output={tmp_path / 'p.json'}", "warmup=1",
            "repeats=3", "processes=false", "progress=false"]
    first = cli(tmp_path, "profile", *tiny, "hydra.run.dir=a")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "kept from the earlier run" not in first.stdout
    assert "link cpu -> cpu [copy]: latency" in first.stdout and "nothing is copied" in first.stdout
    again = cli(tmp_path, "profile", *tiny, "hydra.run.dir=b")
    assert again.returncode == 0 and "cpu: 4 of 4 nodes kept from the earlier run in" in again.stdout, again.stdout
    other = cli(tmp_path, "profile", *tiny, "threads=2", "hydra.run.dir=c")
    assert other.returncode == 2 and other.stderr.strip().startswith("error: profile p.json timed device 'cpu' "
                                                                     "with 1 thread"), other.stderr


# ------------------------------------------------------------------------ 10: a copy onto its own device
def test_a_copy_onto_the_same_device_prints_no_bandwidth():
    same = {"src": "cpu", "dst": "cpu", "backend": "copy", "latency": 8e-7, "bandwidth": 7.9e13}
    assert link_line(same) == "link cpu -> cpu [copy]: latency 0.8 us, no time per byte (the same torch device: " \
                              "nothing is copied)"
    gloo = dict(same, backend="gloo", bandwidth=2e9)  # two processes: a real transfer
    assert link_line(gloo).endswith("bandwidth 2.00 GB/s")


# ------------------------------------------------------------------- 7, 9: the cost source and the links
def test_the_cost_source_says_what_was_profiled_and_which_links_price(graph, tmp_path):
    topo = load_topology("2x_cpu")
    path = profile_of(graph, topo).save(tmp_path / "p.json")
    g, costs = load_costs(path, graph, topo)
    model = ProfileDB.load(path).data["devices"]["cpu"]["model"]
    assert costs.source == (f"measured:p.json:cpu ({model}, 1 thread; links: topology)",) * 2
    # a same-device copy moves nothing: the two logical CPUs keep the topology's link (no figure changes)
    np.testing.assert_array_equal(costs.link_bandwidth, topo.link_bandwidth)
    np.testing.assert_array_equal(costs.link_latency, topo.link_latency)


def test_measured_links_between_two_torch_devices_replace_the_topology_s():
    topo = load_topology("cpu_2gpu")
    db = ProfileDB()
    db.put_link("cpu", "cuda:0", "copy", [1024.0], [1e-5], 1e-5, 1.2e10)
    linked, links = _profile_links(db, topo)
    cpu, gpu0, gpu1 = (topo.device_names.index(n) for n in ("cpu", "gpu0", "gpu1"))
    assert links == "measured"
    assert linked.link_bandwidth[cpu, gpu0] == linked.link_bandwidth[gpu0, cpu] == 1.2e10
    assert linked.link_latency[cpu, gpu0] == 1e-5
    assert linked.link_bandwidth[gpu0, gpu1] == topo.link_bandwidth[gpu0, gpu1]  # not measured: the topology's
    assert _profile_links(ProfileDB(), topo) == (topo, "topology")


def test_a_profiled_gpu_of_another_model_is_named_in_the_source():
    here = socket.gethostname()
    db = ProfileDB(data={"schema": "placement_rl.profile", "version": 1, "env": {}, "graphs": {}, "ops": {},
                         "links": [], "devices": {"gpu0": {"torch_device": "cuda:0", "kind": "gpu", "host": here,
                                                           "model": "NVIDIA H200", "threads": 1}}})
    v100 = Device(name="gpu0", kind="gpu", torch_device="cuda:0", peak_flops=1.4e13, mem_bandwidth=9e11,
                  memory_bytes=3.4e10, model="V100-PCIe-32GB")
    assert _profile_label("measured:p.json:gpu0", db, v100, "topology") == \
        "measured:p.json:gpu0 (NVIDIA H200, pricing gpu0, a V100-PCIe-32GB; links: topology)"
    h200 = Device(name="gpu0", kind="gpu", torch_device="cuda:0", peak_flops=6.7e13, mem_bandwidth=4.8e12,
                  memory_bytes=1.4e11, model="H200-141GB")
    assert _profile_label("measured:p.json:gpu0", db, h200, "measured") == \
        "measured:p.json:gpu0 (NVIDIA H200; links: measured)"


# --------------------------------------------------------------------- 8: implausible and unknown times
def test_implausible_times_warn_and_unknown_nodes_are_refused(graph, tmp_path, capsys):
    topo = load_topology("2x_cpu")
    db = profile_of(graph, topo)
    fp = graph.fingerprint()
    heavy = [n for i, n in enumerate(graph.names) if graph.fwd_flops[i] > 0]
    db.data["graphs"][fp]["times"]["cpu"][heavy[0]][0] = 0.0
    db.data["graphs"][fp]["times"]["cpu"][heavy[1]][2] = 1e6
    load_costs(db.save(tmp_path / "edited.json"), graph, topo)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: {tmp_path / 'edited.json'}: a forward time of 0 for a node with FLOPs: {heavy[0]}; "
                   "check the file or re-profile",
                   f"warning: {tmp_path / 'edited.json'}: times over 10000 x the topology's estimate: {heavy[1]} "
                   "1e+06 s; check the file or re-profile"]
    load_costs(profile_of(graph, topo).save(tmp_path / "good.json"), graph, topo)
    assert capsys.readouterr().err == ""  # the estimates themselves: nothing to say
    db.data["graphs"][fp]["times"]["cpu"]["bogus_node"] = [0.1, 0.0, 0.1, 0.0, 3]
    with pytest.raises(ProfileError, match=r"extra\.json: node 'bogus_node' \(times on 'cpu'\) is not in graph"):
        load_costs(db.save(tmp_path / "extra.json"), graph, topo)


# ------------------------------------------------------------------------------ 11: another host
def test_a_profile_of_another_host_names_the_host_and_the_devices(graph, tmp_path):
    topo = load_topology("2x_cpu")
    path = profile_of(graph, topo, host="otherhost").save(tmp_path / "far.json")
    with pytest.raises(ProfileError, match=r"its device cpu \(host otherhost\) was profiled on another host than "
                                           r"this one \(.+\) and prices only a topology device named cpu \(topology "
                                           r"'2x_cpu' has cpu0, cpu1\)"):
        load_costs(path, graph, topo)
