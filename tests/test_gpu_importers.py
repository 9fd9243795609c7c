"""Importers of public GPU measurements (NeuSight, PipeDream, Sailor, Vidur): readers, one-line errors, CLI exit 2,
the collective fits, and the mapping of measured nodes onto a captured graph. Tests that read
``../shared/gpu-measurements`` skip with a reason where it is absent (an installed package)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from placement_rl.errors import ProfileError
from placement_rl.profiling import collective_fits, neusight, pipedream, sailor, vidur

REPO = Path(__file__).resolve().parent.parent
DATA = neusight.default_data_dir()
needs_data = pytest.mark.skipif(DATA is None or not Path(DATA).is_dir(),
                                reason="../shared/gpu-measurements is absent (set PLACEMENT_RL_GPU_DATA)")
LABELS = "neusight/labels"


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


# ------------------------------------------------------------------ NeuSight
@needs_data
def test_neusight_label_file_reads_into_a_graph():
    w = neusight.read_labels(DATA / LABELS / "NVIDIA_A100_80GB_PCIe" / "gpt2_large-train-1024-1.csv")
    assert (w.model, w.mode, w.seq_len, w.batch, w.num_layer) == ("gpt2_large", "train", 1024, 1, 36)
    assert w.e2e == pytest.approx(0.5240467, rel=1e-6)
    g = neusight.label_graph(w)
    fwd, bwd = neusight.measured_times(w, g)
    head = g.names.index("lm_head")
    assert fwd[head] == pytest.approx(7.0244e-3, rel=1e-3)
    assert g.fwd_flops[head] == pytest.approx(2 * 1024 * 1280 * 50257)
    weights = neusight.layer_weights(g, w.num_layer)
    assert set(np.unique(weights)) == {1.0, 36.0}


def test_neusight_malformed_and_missing_files(tmp_path):
    with pytest.raises(ProfileError, match="does not exist") as e:
        neusight.read_labels(tmp_path / "gpt2_large-train-1024-1.csv")
    _one_line(e)
    bad = tmp_path / "gpt2_large-train-1024-1.csv"
    bad.write_text("op,target\nx,y\n")
    with pytest.raises(ProfileError, match="whole-model measurement missing"):
        neusight.read_labels(bad)
    bad.with_suffix(".json").write_text('{"num_layer": 2, "e2e_latency": 1, "fw_latency": 1}')
    with pytest.raises(ProfileError, match="column '_input_nodes' missing") as e:
        neusight.read_labels(bad)
    _one_line(e)
    bad.with_suffix(".json").write_text("{not json")
    with pytest.raises(ProfileError, match="malformed JSON"):
        neusight.read_labels(bad)
    with pytest.raises(ProfileError, match="file name must be"):
        (tmp_path / "weird.csv").write_text("x\n")
        neusight.read_labels(tmp_path / "weird.csv")


# ------------------------------------------------------------- Sailor, Vidur
def test_sailor_readers_and_errors(tmp_path):
    d = tmp_path / "A100-40"
    d.mkdir()
    (d / "p2p_intra_node.csv").write_text("1,2,4\n10,20,40\n")
    (d / "prim_X_all_reduce_2gpus.csv").write_text("data_size(MB),time(ms)\n4,0.3\n1,0.1\n8,1000000000.0\n")
    p2p, ar = sailor.read_system(d)
    assert p2p.kind == "p2p" and p2p.devices_per_node == 2
    np.testing.assert_allclose(p2p.times, np.array([1, 2, 4]) * 2**20 / np.array([10e9, 20e9, 40e9]))
    assert ar.kind == "all_reduce" and ar.n_gpus == 2 and ar.sizes.tolist() == [2**20, 4 * 2**20]  # sentinel gone
    (d / "p2p_inter_node.csv").write_text("1,2\nfast,slow\n")
    with pytest.raises(ProfileError, match="bandwidths must be numbers") as e:
        sailor.read_p2p(d / "p2p_inter_node.csv")
    _one_line(e)
    with pytest.raises(ProfileError, match="name must be prim_"):
        sailor.read_collective(d / "p2p_intra_node.csv")


def test_vidur_reader_and_errors(tmp_path):
    col = "time_stats.all_reduce.median"
    path = tmp_path / "all_reduce.csv"
    path.write_text(f",{col},rank,num_workers,size,devices_per_node\n0,0.5,0,2,2048,2\n1,0.7,0,2,4096,2\n"
                    "2,0.9,0,4,2048,4\n")
    two, four = vidur.read_table(path)
    assert (two.n_gpus, two.kind, two.sizes.tolist()) == (2, "all_reduce", [2048.0, 4096.0])
    assert four.times.tolist() == pytest.approx([0.9e-3])
    path.write_text(f",{col},rank,num_workers,size,devices_per_node\n0,oops,0,2,2048,2\n")
    with pytest.raises(ProfileError, match="row 2") as e:
        vidur.read_table(path)
    _one_line(e)
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ProfileError, match="column"):
        vidur.read_table(path)


# -------------------------------------------------------------------- PipeDream
def test_pipedream_reader_graph_and_errors(tmp_path):
    path = tmp_path / "tiny.graph.txt"
    path.write_text(
        "node1 -- Input0 -- forward_compute_time=9.0, backward_compute_time=0.0, activation_size=100.0, "
        "parameter_size=0.000\n"
        "node2 -- Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1)) -- forward_compute_time=1.5, "
        "backward_compute_time=3.0, activation_size=4096.0, parameter_size=864.0\n"
        "\tnode1 -- node2\n")
    prof = pipedream.read_profile(path)
    assert [x.op_type for x in prof.layers] == ["input", "conv2d"]
    assert prof.layers[0].fwd == 0.0  # data loading is not a compute cost
    g = pipedream.pipedream_graph(prof)
    assert g.fwd_flops[1] == pytest.approx(2 * (4096 / 4) * 3 * 9)
    path.write_text("node1 -- broken line\n")
    with pytest.raises(ProfileError, match="line 1") as e:
        pipedream.read_profile(path)
    _one_line(e)


# ------------------------------------------------------------- collective fits
def test_collective_fit_follows_a_series_and_scales_gpu_counts():
    sizes = 2.0 ** np.arange(11, 27)
    times = 1e-5 + sizes / 100e9
    s = sailor.Series("t", "sys", "all_reduce", 4, 4, sizes, times)
    fit = collective_fits.fit_series(s)
    assert np.max(np.abs(collective_fits.fit_errors(fit, s))) < 0.02
    t4 = collective_fits.fitted_collective_time("all_reduce", 2**24, 4, "sys", fits=[fit])
    t8 = collective_fits.fitted_collective_time("all_reduce", 2**24, 8, "sys", fits=[fit])
    assert t8 == pytest.approx(t4 * (2 * 7 / 8) / (2 * 3 / 4))
    assert collective_fits.fitted_collective_time("all_reduce", 2**24, 1, "sys", fits=[fit]) == 0.0
    assert collective_fits.fitted_collective_time("all_gather", 2**24, 4, "sys", fits=[fit]) is None
    with pytest.raises(ProfileError, match="unknown collective"):
        collective_fits.fitted_collective_time("broadcast", 1, 2, "sys", fits=[fit])


def test_shipped_collective_fit_loads():
    assert {"a100_dgx", "h100_dgx", "A100-40", "V100-16", "GH-96"} <= set(collective_fits.systems())
    t = collective_fits.fitted_collective_time("all_reduce", 64 * 2**20, 8, "h100_dgx")
    assert 1e-4 < t < 1e-2
    lat, bw = collective_fits.link_figures("h100_dgx")
    assert 1e-6 < lat < 1e-4 and 1e11 < bw < 1e12


@needs_data
@pytest.mark.parametrize("system,kind,n,dpn", [("a100_dgx", "all_reduce", 8, 8), ("h100_dgx", "p2p", 2, 2),
                                               ("A100-40", "all_reduce", 4, 4), ("V100-16", "p2p", 2, 2)])
def test_shipped_collective_fit_is_within_10_percent_on_average(system, kind, n, dpn):
    src = DATA / ("vidur" if system.islower() else "sailor") / system
    series = (vidur.read_system(src) if system.islower() else sailor.read_system(src))
    s = next(x for x in series if (x.kind, x.n_gpus, x.devices_per_node) == (kind, n, dpn))
    (fit,) = collective_fits.shipped_fits_for([s])
    err = np.abs(collective_fits.fit_errors(fit, s))
    assert err.size and err.mean() < 0.10 and np.median(err) < 0.10


def test_fit_script_lists_the_public_files_it_needs(tmp_path):
    """scripts/fit_gpu_costs.py --list-files names every file the shipped fit reads (five GPUs' device configs,
    35 kernel tables, 32 label runs with their whole-model JSON) and exits 2 where they are absent."""
    from placement_rl.profiling.calibrate import needed_files

    files = needed_files()
    assert len(files) == 6 + 35 + 64 and len(set(files)) == len(files)
    assert "neusight/kernels/conv/NVIDIA_A100_80GB_PCIe.csv" in files
    assert "neusight/kernels/conv/NVIDIA_A100-PCIE-40GB.csv" not in files
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "fit_gpu_costs.py"), "--list-files", "--data",
                        str(tmp_path)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 2 and r.stdout.count("MISSING") == len(files)
    if DATA is not None and Path(DATA).is_dir():
        assert all((Path(DATA) / f).is_file() for f in files)


# -------------------------------------------------------------------- CLI
def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "profile", *args,
                           f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow
def test_cli_profile_measurements_bad_file_exits_2(tmp_path):
    bad = tmp_path / "bert_large-train-512-2.csv"
    bad.write_text("op,target\n1,2\n")
    bad.with_suffix(".json").write_text('{"num_layer": 24, "e2e_latency": 1.0, "fw_latency": 1.0}')
    r = _cli(tmp_path, f"measurements={bad}")
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "column" in err[0] and "Traceback" not in r.stderr
    r = _cli(tmp_path, f"measurements={tmp_path / 'missing' / 'all_reduce.csv'}")
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.parametrize("name,text", [("prim_GPT-Neo-2.7_all_reduce_2gpus.csv", "data_size(MB),time(ms)\n1,x\n"),
                                       ("all_reduce.csv", "size,mean\n1,2\n"),
                                       ("p2p_intra_node.csv", "1,2,3\n"),
                                       ("resnet18.graph.txt", "node1 -- not a layer\n")])
def test_cli_profile_malformed_collective_and_layer_files_exit_2(tmp_path, name, text):
    bad = tmp_path / name
    bad.write_text(text)
    r = _cli(tmp_path, f"measurements={bad}")
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and name in err[0] and "Traceback" not in r.stderr


@needs_data
def test_cli_profile_imports_a_label_file_as_profile(tmp_path):
    src = DATA / LABELS / "Tesla_V100-PCIE-32GB" / "bert_large-train-512-2.csv"
    r = _cli(tmp_path, f"measurements={src}", f"output={tmp_path / 'p.json'}")
    assert r.returncode == 0, r.stderr
    from placement_rl.cost import resolve_costs
    from placement_rl.profiling import ProfileDB
    from placement_rl.topology import load_topology

    db = ProfileDB.load(tmp_path / "p.json")
    g = neusight.label_graph(neusight.read_labels(src))
    c = resolve_costs(g, load_topology("1x_v100_pcie_32gb"), db)
    assert c.source == ("measured:neusight-Tesla_V100-PCIE-32GB-bert_large-train-512-2.json:gpu0",)


# ------------------------------------------------ measured nodes on captured graphs
def _mapped(workload: str, zoo_name: str, d_model: int, n_heads: int):
    """A100 label ``workload`` read, its zoo graph captured with the workload's config, and the mapping."""
    pytest.importorskip("transformers")
    from placement_rl.graph.capture import capture_zoo
    from placement_rl.profiling import measured_map

    w = neusight.read_labels(DATA / LABELS / "NVIDIA_A100_80GB_PCIe" / f"{workload}.csv")
    zoo, overrides = measured_map.zoo_config(w)
    assert zoo == zoo_name and overrides["d_model"] == d_model and overrides["n_heads"] == n_heads
    g = capture_zoo(zoo, **overrides)
    return w, g, measured_map.map_neusight(w, g)


@needs_data
def test_neusight_maps_onto_captured_bert_and_resolves_as_measured():
    from placement_rl.cost import resolve_costs
    from placement_rl.profiling import measured_map
    from placement_rl.topology import load_topology

    w, g, res = _mapped("bert_large-train-512-2", "bert_hf", 1024, 16)
    assert res.mapped >= 30 and len(res.unmapped) <= 5  # the loss and a few mask ops are not in NeuSight's trace
    topo = load_topology("1x_a100_80gb_pcie")
    db = measured_map.mapped_profile(g, res, label=f"neusight-{w.gpu}-{w.key}", gpu_model=w.gpu, fill_topology=topo)
    c = resolve_costs(g, topo, db)
    assert c.source == ("measured:neusight-NVIDIA_A100_80GB_PCIe-bert_large-train-512-2.json:gpu0",)
    whole = float(measured_map.layer_weights(g, w.num_layer) @ (c.fwd_time[:, 0] + c.bwd_time[:, 0]))
    assert whole == pytest.approx(w.e2e, rel=0.2)


@needs_data
def test_neusight_opt_maps_onto_captured_opt_hf():
    """OPT's own module paths start with ``model.`` (``model.decoder.layers.0``), its attention scores are a 3-D
    bmm: both map, only the loss (not in NeuSight's trace) is left."""
    _, g, res = _mapped("opt_13-train-2048-1", "opt_hf", 2048, 32)
    assert res.mapped >= 40 and [g.op_types[i] for i in res.unmapped] == ["cross_entropy_loss"]


def test_neighbour_consistency_flags_a_noisy_row():
    from placement_rl.profiling.sailor import Series

    sizes = np.linspace(2.0 ** 20, 2.0 ** 26, 10)  # rows close in size, as in the Vidur tables
    times = 2e-6 + sizes / 1e10
    smooth = Series("t", "sys", "p2p", 2, 1, sizes, times)
    assert np.abs(collective_fits.neighbour_consistency(smooth)).max() < 0.06
    spiky = Series("t", "sys", "p2p", 2, 1, sizes, times * np.where(np.arange(10) == 5, 1.3, 1.0))
    off = np.abs(collective_fits.neighbour_consistency(spiky))
    assert off[5] > 0.2 and np.all(np.delete(off, 5) < 0.1)


def test_collective_fit_breaks_at_a_protocol_switch_not_at_noise():
    from placement_rl.profiling.sailor import Series

    sizes = np.linspace(2.0 ** 20, 2.0 ** 26, 400)
    times = 5e-6 + sizes / np.where(sizes < 8 * 2.0 ** 20, 5e9, 8e9)  # the algorithm switches at 8 MiB
    fit = collective_fits.fit_series(Series("t", "sys", "all_reduce", 8, 8, sizes, times))
    assert np.abs(collective_fits.fit_errors(fit, Series("t", "sys", "all_reduce", 8, 8, sizes, times))).max() < 0.02
    noisy = times * np.random.default_rng(0).uniform(0.75, 1.3, sizes.size)
    x, y = np.log2(sizes), np.log(noisy)
    assert collective_fits._steps(x, y) == []
    assert len(collective_fits.fit_series(Series("t", "s", "p2p", 2, 1, sizes, noisy))["log2_bytes"]) < 30
