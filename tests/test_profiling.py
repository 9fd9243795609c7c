"""ProfileDB, op timing, link benchmarks and the measured CostTable (CPU; GPU paths marked ``gpu``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from placement_rl.cost import resolve_costs
from placement_rl.errors import ProfileError
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.graph.coarsen import coarsen
from placement_rl.profiling import (ProfileDB, bench_copy, bench_sendrecv, fit_link, measured_costs, op_signatures,
                                    physical_topology, predict_step_time, profile_graph, run_profile)
from placement_rl.profiling.fidelity import mape, spearman
from placement_rl.topology import load_topology

MLP = dict(batch_size=64, in_features=256, hidden=512, layers=3)


@pytest.fixture(scope="module")
def mlp():
    module, inputs = zoo.build("mlp", **MLP)
    return module, inputs, capture(module, inputs, name="mlp")


@pytest.fixture(scope="module")
def profiled(mlp, tmp_path_factory):
    module, inputs, graph = mlp
    path = tmp_path_factory.mktemp("prof") / "profiles.json"
    # thread CPU time: the per-node vs whole-step comparison must not depend on other processes' load
    db = profile_graph(module, inputs, graph, "cpu", warmup=2, repeats=7, step_repeats=21, progress=False,
                       db=ProfileDB(path), clock="thread")
    f = bench_copy("cpu", "cpu", sizes=(1024, 65536, 1 << 20), repeats=5)
    db.put_link(f.src, f.dst, f.backend, f.sizes, f.times, f.latency, f.bandwidth)
    db.save()
    return path


def test_profile_writes_valid_db_that_sums_to_the_whole_step(mlp, profiled):
    _, _, graph = mlp
    db = ProfileDB.load(profiled)
    times = db.node_times(graph, "cpu")
    assert set(times) == set(graph.names)
    for fwd, fwd_iqr, bwd, bwd_iqr, repeats in times.values():
        assert fwd > 0 and fwd_iqr >= 0 and bwd >= 0 and bwd_iqr >= 0 and repeats == 7
    node_sum = sum(v[0] + v[2] for v in times.values())
    step = db.step_time(graph, "cpu")
    # per-node medians of 7 repeats vs one whole-step median, thread clock. The whole step also pays the framework's
    # work between nodes (autograd engine, Python), so the node sum falls short of it: 0.67-0.89x on this 2-core
    # machine when idle, 0.58x when loaded. Double-counted nodes push the sum above the step; dropped ones far below it.
    assert step is not None and 0.4 * step <= node_sum <= 1.25 * step, (node_sum, step)
    assert db.optimizer_time(graph, "cpu")[1] == pytest.approx(graph.param_bytes.sum())
    env = db.data["env"]
    assert env["torch"] == torch.__version__ and env["host"]
    assert db.data["devices"]["cpu"]["clock"] == "thread" and db.data["devices"]["cpu"]["model"]


def test_costtable_from_profile_states_its_source(mlp, profiled):
    _, _, graph = mlp
    db = ProfileDB.load(profiled)
    costs = resolve_costs(graph, load_topology("2x_cpu"), profiles=db)
    assert costs.source == ("measured:profiles.json:cpu",) * 2
    fwd, bwd, _ = db.lookup(graph, load_topology("2x_cpu").devices[0])
    assert np.allclose(costs.fwd_time[:, 1], fwd) and np.allclose(costs.bwd_time[:, 0], bwd)
    mixed = resolve_costs(graph, load_topology("cpu_2gpu"), profiles=db)  # its CPU runs here; no GPU profiled
    assert mixed.source == ("measured:profiles.json:cpu", "calibrated:neusight-v2", "calibrated:neusight-v2")
    linked = measured_costs(graph, load_topology("2x_cpu"), db)
    assert linked.meta["link_sources"] == {"cpu0<->cpu1": "measured:profiles.json:copy"}
    assert linked.link_latency[0, 1] == pytest.approx(db.link("cpu", "cpu")[0])


def test_coarsened_graph_sums_member_times(mlp, profiled):
    _, _, graph = mlp
    db = ProfileDB.load(profiled)
    small = coarsen(graph, target=(2, 4))
    assert small.members is not None and small.num_nodes < graph.num_nodes
    fwd, bwd, _ = db.lookup(small, load_topology("2x_cpu").devices[0])
    times = db.node_times(graph, "cpu")
    for i, grp in enumerate(small.members):
        assert fwd[i] == pytest.approx(sum(times[m][0] for m in grp))
        assert bwd[i] == pytest.approx(sum(times[m][2] for m in grp))


def test_other_graph_reuses_per_op_times_by_signature(mlp, profiled):
    module, inputs, graph = mlp
    db = ProfileDB.load(profiled)
    sigs = op_signatures(module, inputs, graph)
    assert sigs[0].startswith("aten.linear.default[(64, 256), (512, 256), (512,)]")
    other = graph.replace(fwd_flops=graph.fwd_flops * 2, meta={**graph.meta, "signatures": sigs})
    assert other.fingerprint() != graph.fingerprint()
    fwd, bwd, label = db.lookup(other, load_topology("2x_cpu").devices[0])
    assert label.endswith(":ops") and np.all(fwd > 0)
    assert db.lookup(graph.replace(fwd_flops=graph.fwd_flops * 2), load_topology("2x_cpu").devices[0]) is None


@pytest.mark.parametrize("text, problem", [
    ("{not json", "malformed JSON"),
    (json.dumps({"schema": "placement_rl.graph", "version": 1}), "not a profile file"),
    (json.dumps({"schema": "placement_rl.profile", "version": 99}), "unknown profile schema version 99"),
])
def test_corrupted_profile_fails_with_one_line_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ProfileError) as info:
        ProfileDB.load(path)
    msg = str(info.value)
    assert str(path) in msg and problem in msg and "\n" not in msg


def test_damaged_entry_and_missing_file_are_profile_errors(tmp_path, profiled):
    data = json.loads(profiled.read_text())
    fp = next(iter(data["graphs"]))
    node = next(iter(data["graphs"][fp]["times"]["cpu"]))
    data["graphs"][fp]["times"]["cpu"][node][0] = -1.0
    bad = tmp_path / "neg.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=f"node '{node}'"):
        ProfileDB.load(bad)
    with pytest.raises(ProfileError, match="does not exist"):
        ProfileDB.load(tmp_path / "missing.json")


def test_resume_profiles_only_missing_nodes(mlp, profiled, tmp_path):
    module, inputs, graph = mlp
    data = json.loads(profiled.read_text())
    fp = graph.fingerprint()
    dropped = graph.names[2]
    del data["graphs"][fp]["times"]["cpu"][dropped]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    kept = dict(data["graphs"][fp]["times"]["cpu"])
    db = profile_graph(module, inputs, graph, "cpu", warmup=1, repeats=3, progress=False,
                       db=ProfileDB.load(partial), clock="thread")
    times = ProfileDB.load(partial).node_times(graph, "cpu")
    assert times[dropped][4] == 3  # re-profiled with the new repeats
    assert all(times[k] == v for k, v in kept.items())  # the rest untouched
    with pytest.raises(ProfileError, match="clock"):
        profile_graph(module, inputs, graph, "cpu", warmup=1, repeats=3, progress=False, db=db, clock="wall")


def test_fit_link_recovers_latency_and_bandwidth():
    sizes = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    lat, bw = fit_link(sizes, 5e-6 + sizes / 2e9)
    assert lat == pytest.approx(5e-6, rel=1e-6) and bw == pytest.approx(2e9, rel=1e-6)
    lat, bw = fit_link(sizes, np.full(5, 1e-6))  # no per-byte cost
    assert bw == float("inf") and lat == pytest.approx(1e-6)


def test_same_device_copy_link_is_nearly_free():
    f = bench_copy("cpu", "cpu", sizes=(1024, 1 << 20, 1 << 22), repeats=5)
    assert 0 <= f.latency < 1e-4 and f.bandwidth > 1e10  # .to() on its own device returns the input


def test_shared_cpu_devices_collapse_and_prediction_counts_transfers(mlp, profiled):
    _, _, graph = mlp
    db = ProfileDB.load(profiled)
    topo = load_topology("2x_cpu")
    phys, phys_of = physical_topology(topo)
    assert phys.num_devices == 1 and phys_of.tolist() == [0, 0]
    one = predict_step_time(graph, topo, np.zeros(graph.num_nodes, dtype=np.int64), db)
    split = predict_step_time(graph, topo, np.arange(graph.num_nodes) % 2, db)
    assert one.num_transfers == 0 and split.num_transfers > 0
    assert split.step_time - one.step_time == pytest.approx(split.shared_transfers)
    assert one.step_overhead >= 0 and one.step_time == pytest.approx(one.simulated + one.optimizer + one.step_overhead)
    times = db.node_times(graph, "cpu")
    assert one.simulated == pytest.approx(sum(v[0] + v[2] for v in times.values()), rel=1e-6)
    assert mape(np.array([1.1, 0.9]), np.array([1.0, 1.0])) == pytest.approx(10.0)
    assert spearman(np.array([1, 2, 3]), np.array([2, 4, 9])) == pytest.approx(1.0)


def test_run_profile_end_to_end(tmp_path):
    out = tmp_path / "p.json"
    run = run_profile("mlp", output=out, overrides=dict(batch_size=8, in_features=16, hidden=16, layers=1),
                      warmup=1, repeats=3, link_sizes=(1024, 65536), link_repeats=3, processes=False,
                      progress=False, graph_out=tmp_path / "g.json")
    db = ProfileDB.load(out)
    assert run.devices[0] == "cpu" and db.lookup(run.graph, load_topology("2x_cpu").devices[0]) is not None
    assert {(r["src"], r["dst"], r["backend"]) for r in db.links()} >= {("cpu", "cpu", "copy")}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ProfileError, match="no local device 'gpu7'"):
        run_profile("mlp", output=out, devices=["gpu7"])


@pytest.mark.distributed
def test_gloo_send_recv_between_two_processes():
    f = bench_sendrecv("gloo", sizes=(1024, 1 << 16, 1 << 20), repeats=3)
    assert f.backend == "gloo" and f.latency >= 0 and f.bandwidth > 0 and len(f.times) == 3


@pytest.mark.gpu
def test_gpu_profile_uses_cuda_events_and_pinned_links(mlp, tmp_path):
    from placement_rl.profiling.links import bench_pinned

    module, inputs, graph = mlp
    db = profile_graph(module, inputs, graph, "cuda:0", warmup=2, repeats=5, progress=False)
    times = db.node_times(graph, "gpu0")
    assert set(times) == set(graph.names) and all(v[0] > 0 for v in times.values())
    assert db.data["devices"]["gpu0"]["model"] == torch.cuda.get_device_name(0)
    for to_device in (True, False):
        f = bench_pinned("cuda:0", to_device=to_device, sizes=(1 << 16, 1 << 20, 1 << 24), repeats=5)
        assert f.bandwidth > 1e8
    if torch.cuda.device_count() >= 2:
        assert bench_sendrecv("nccl", sizes=(1 << 16, 1 << 20), repeats=3).bandwidth > 0
