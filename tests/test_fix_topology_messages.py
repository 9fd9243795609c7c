"""What a topology or plan file says back: a GPU without ``model:`` priced by the product its device name matches
(said, pricing unchanged), ``count:`` names ending in a digit (``l4`` -> ``l40``), two GPUs of a host on one
``torch_device``, a ``torch_device`` torch refuses, plan-file errors that name the file, and the ``tp`` note on a
coarsened graph without a TP annotation (captured graph or graph file)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

from placement_rl.devices import Device, is_torch_device
from placement_rl.errors import PlanError, TopologyError
from placement_rl.graph import make_graph
from placement_rl.plans import Placement, load_plan
from placement_rl.topology import DeviceTopology, load_topology, preset_names

READER = "placement_rl._topology_reader"
FIGURES = {"kind": "gpu", "peak_flops": 2e13, "mem_bandwidth": 1e12, "memory_bytes": 32 * 2**30}
LINKS = {"intra_host": {"bandwidth": 16e9, "latency": 1e-5}, "inter_host": {"bandwidth": 12e9, "latency": 2e-5}}


def _file(tmp_path: Path, devices: list[dict], name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"name": "t", "devices": devices, "links": LINKS}))
    return path


def _said(caplog, path: Path) -> list[str]:
    """The reader's warning lines about ``path`` (each starts with it)."""
    return [r.getMessage() for r in caplog.records
            if r.name == READER and r.levelno == logging.WARNING and r.getMessage().startswith(f"{path}: ")]


# ------------------------------------------------------------- GPUs without a model
def test_gpu_without_model_says_which_product_its_name_prices_it_as(tmp_path, caplog):
    path = _file(tmp_path, [{"name": "t4", **FIGURES}, {"name": "gpu", **FIGURES},
                            {"name": "v100", "model": "V100-SXM2-32GB", **FIGURES}])
    with caplog.at_level(logging.WARNING, logger=READER):
        topo = load_topology(path)
    said = _said(caplog, path)
    assert f"{path}: device 't4' has no 'model': priced with the architecture of the datasheet product its name " \
           "matches (T4 16GB); set 'model:' (or 'architecture:') to choose" in said
    assert not any("device 'gpu'" in s for s in said)  # no product: the cost model's own warning says it when priced
    assert not any("'v100'" in s for s in said)  # its model prices it
    assert [d.model for d in topo.devices] == ["", "", "V100-SXM2-32GB"]  # nothing filled in: pricing unchanged


def test_the_product_said_is_the_architecture_the_cost_model_prices():
    """The reader may not import the cost model (layers): the datasheet row a name matches must give the same
    architecture facts as ``gpu_spec.datasheet`` reads from the name itself, for every row's model word."""
    from placement_rl import datasheets
    from placement_rl.cost import gpu_spec
    from placement_rl.datasheets import lookup

    names = {"t4", "l4", "l40", "h100", "a100", "k80", "rtx4090", "h0_t4_0", "t4_slot", "gpu_h100"}
    for words, *_ in datasheets._ROWS:
        names |= {" ".join(words).lower(), "_".join(words).lower(), "-".join(words)}
    for name in sorted(names):
        sheet = lookup(name)
        if sheet is not None:
            assert gpu_spec.datasheet(name) == gpu_spec.datasheet(sheet.product), (name, sheet.product)


def test_topologies_built_in_code_and_presets_say_nothing(caplog):
    from placement_rl.envs.topology_sampler import random_topology
    from placement_rl.studies.stage_space import mixed

    with caplog.at_level(logging.WARNING, logger=READER):
        for seed in range(20):  # GPUs named h0_t4_0 without a model, all on cuda:0: the training sampler's own
            random_topology(np.random.default_rng(seed))
        mixed(3)
        for name in preset_names():
            load_topology(name)
    assert [r.getMessage() for r in caplog.records if r.name == READER and r.levelno >= logging.WARNING] == []


def test_from_dict_says_it_when_asked(caplog):
    data = {"name": "d", "devices": [{"name": "t4_slot", **FIGURES}], "links": {}}
    with caplog.at_level(logging.WARNING, logger=READER):
        DeviceTopology.from_dict(data, where="quiet")
        DeviceTopology.from_dict(data, where="asked", notes=True)
    said = [r.getMessage() for r in caplog.records if r.name == READER]
    assert said == ["asked: device 't4_slot' has no 'model': priced with the architecture of the datasheet product "
                    "its name matches (T4 16GB); set 'model:' (or 'architecture:') to choose"]


# ------------------------------------------------------------- count: names and torch devices
def test_count_name_ending_in_a_digit_is_said_and_names_kept(tmp_path, caplog):
    path = _file(tmp_path, [{"name": "l4", "count": 2, "model": "L4", **FIGURES},
                            {"name": "l4_", "count": 2, "model": "L4", **FIGURES, "host": 1}])
    with caplog.at_level(logging.WARNING, logger=READER):
        topo = load_topology(path)
    assert topo.device_names == ("l40", "l41", "l4_0", "l4_1")  # plan files name devices so: unchanged
    said = [s for s in _said(caplog, path) if "ends in a digit" in s]
    assert said == [f"{path}: devices[0]: name 'l4' ends in a digit, so its devices are named 'l40', 'l41'; 'l40' "
                    "reads as L40 48GB; a separator keeps name and number apart (name: l4_ gives l4_0, l4_1)"]


def test_two_gpus_of_a_host_on_one_torch_device_are_said(tmp_path, caplog):
    path = _file(tmp_path, [{"name": "fast", "count": 3, "model": "V100-SXM2-32GB", "torch_device": "cuda", **FIGURES},
                            {"name": "slow", "model": "T4", "torch_device": "cuda", **FIGURES},
                            {"name": "other", "model": "T4", "torch_device": "cuda", **FIGURES, "host": 1}])
    with caplog.at_level(logging.WARNING, logger=READER):
        topo = load_topology(path)
    assert [d.torch_device for d in topo.devices] == ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:0"]
    said = [s for s in _said(caplog, path) if "torch_device" in s]
    assert len(said) == 1
    assert said[0].startswith(f"{path}: devices 'fast0' and 'slow' on host 0 both have torch_device 'cuda:0': "
                              "deploy then gives ranks GPUs in LOCAL_RANK order")


# ------------------------------------------------------------- torch_device values
@pytest.mark.parametrize("td", ["banana", "cuda:", "cuda:-1", "CUDA", "cuda:0:1", " cuda", "cuda:01", 3])
def test_a_torch_device_torch_refuses_is_refused_naming_the_device(td):
    with pytest.raises(TopologyError, match=rf"^device 'g': field 'torch_device' is {td!r}, not a torch device"):
        Device(name="g", kind="gpu", torch_device=td, peak_flops=1.0, mem_bandwidth=1.0, memory_bytes=1.0)


def test_torch_device_check_agrees_with_torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    for td in ["cpu", "cuda", "cuda:0", "cuda:12", "mps", "xpu:1", "meta", "hpu", "cpu:0", "banana", "cuda:",
               "cuda:-1", "CUDA", "cuda:0:1", " cuda", "cuda: 1", "cuda:01", "cuda:+1", "cuda:1 ", "ort"]:
        try:
            torch.device(td)
            accepted = True
        except (RuntimeError, ValueError):
            accepted = False
        assert is_torch_device(td) == accepted, td


def test_a_topology_file_with_a_bad_torch_device_says_where(tmp_path):
    path = _file(tmp_path, [{"name": "g", "torch_device": "banana", **FIGURES}])
    with pytest.raises(TopologyError, match=rf"^{path}: devices\[0\]: field 'torch_device' is 'banana', not a torch "
                                            "device: give cpu, cuda"):
        load_topology(path)


# ------------------------------------------------------------- plan files
def _case():
    graph = make_graph([{"name": "a", "fwd_flops": 1e6}, {"name": "b", "fwd_flops": 1e6}], [["a", "b", 8.0]],
                       name="g")
    topo = DeviceTopology.from_dict({"name": "t", "devices": [{"name": "cpu", "count": 2, "kind": "cpu",
                                                               "peak_flops": 1e11, "mem_bandwidth": 1e10,
                                                               "memory_bytes": 1e10}], "links": LINKS})
    return graph, topo


def test_plan_file_errors_start_with_the_file_once(tmp_path):
    graph, topo = _case()
    path = tmp_path / "plan.json"
    text = Placement([0, 1]).to_json(graph=graph, topology=topo)
    bad = {**json.loads(text), "device_of_node": [7, 1]}
    path.write_text(json.dumps(bad))
    for load in (Placement.from_json, load_plan):
        with pytest.raises(PlanError, match=rf"^{path}: 'device_of_node' entries must be integers in \[0, 2\)$"):
            load(path, topology=topo, graph=graph)
    with pytest.raises(PlanError, match=r"^'device_of_node' entries"):  # JSON text: no file to name
        Placement.from_json(json.dumps(bad), topology=topo, graph=graph)
    path.write_text(json.dumps({**json.loads(text), "devices": ["cpu0", "gpu9"]}))
    with pytest.raises(PlanError, match=rf"^{path}: placement uses device 'gpu9' which topology 't' lacks"):
        Placement.from_json(path, topology=topo, graph=graph)
    path.write_text("{not json")
    with pytest.raises(PlanError) as err:  # the reader names the file itself: not twice
        Placement.from_json(path)
    assert str(err.value).count(str(path)) == 1


# ------------------------------------------------------------- the tp note
def test_tp_note_of_a_coarsened_graph_without_annotation_fits_a_graph_file(tmp_path):
    from placement_rl.graph.coarsen import coarsen
    from placement_rl.graph.ir import CompGraph
    from placement_rl.graph.tp import annotation

    nodes = [{"name": f"n{i}", "op_type": "linear", "module_path": f"m{i // 2}", "fwd_flops": 1e6, "param_bytes": 4e3}
             for i in range(6)]
    fine = make_graph(nodes, [[f"n{i}", f"n{i + 1}", 8.0] for i in range(5)], name="file")
    (tmp_path / "g.json").write_text(fine.to_json())
    coarse = coarsen(CompGraph.from_json(tmp_path / "g.json"), target=(2, 3))
    assert coarse.members is not None and "tp" not in coarse.meta
    note = annotation(coarse).note
    assert "capture it again" in note and "a graph file carries it only in the meta.tp" in note
    assert "graph.coarsen.enabled=false" in note and "docs/tensor_parallel.md" in note
    doc = Path(__file__).resolve().parent.parent / "docs" / "tensor_parallel.md"
    assert 'stores `meta["tp"]`' in doc.read_text()  # the page the note points to documents it


def test_a_new_gpu_given_an_architecture_prices_as_that_product_with_its_own_figures():
    """A card the datasheets do not know, given every figure of an H100 and ``architecture: H100``, prices as the
    H100 does (without it, the generic architecture priced its fp32 GEMMs and convs up to 1.7x faster); the
    architecture takes no figure; a name the datasheets do not know, or one on a CPU, is one line."""
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic

    h100 = DeviceTopology.from_dict({"name": "h", "devices": [{"name": "g", "model": "H100 SXM5 80GB"}],
                                     "links": {}}).devices[0]
    figures = {k: getattr(h100, k) for k in ("peak_flops", "mem_bandwidth", "memory_bytes", "sm_count", "l2_bytes",
                                             "peak_flops_tf32", "peak_flops_bf16", "peak_flops_fp16",
                                             "peak_flops_fp64")}
    graph = synthetic.sample("transformer_like", num_nodes=40, seed=1)

    def fwd(**dev):
        topo = DeviceTopology.from_dict({"name": "t", "devices": [{"name": "acc", **figures, **dev}], "links": {}})
        return resolve_costs(graph, topo).fwd_time[:, 0], topo

    by_name, _ = fwd(model="H100 SXM5 80GB")
    built_like, topo = fwd(model="Acme X1", architecture="H100")
    np.testing.assert_array_equal(built_like, by_name)
    assert topo.devices[0].memory_bytes == h100.memory_bytes and topo.devices[0].architecture == "H100"
    assert DeviceTopology.from_dict(topo.to_dict()).devices[0].architecture == "H100"  # kept by a round trip
    with pytest.raises(TopologyError, match="field 'architecture' is 'Acme Z9', not a product"):
        fwd(model="Acme X1", architecture="Acme Z9")
    with pytest.raises(TopologyError, match="field 'architecture' is for GPUs"):
        DeviceTopology.from_dict({"name": "c", "devices": [{"name": "c", "kind": "cpu", "peak_flops": 1e12,
                                                             "mem_bandwidth": 1e11, "memory_bytes": 1e10,
                                                             "architecture": "H100"}], "links": {}})


# ------------------------------------------------------------- unit slips beyond the three device figures
def test_tensor_core_l2_and_link_figures_implausible_for_their_unit_are_said_once_per_field(tmp_path, caplog):
    """``peak_flops_bf16: 312`` (TFLOP/s without e12) priced a bf16 step at 319 days, a link's ``bandwidth: 25``
    and ``latency: 10`` a DP step at 30 days, without a word; 0 (no tensor cores) is no slip, a run of link pairs
    with the same slip is one line, and topologies built in code stay quiet."""
    gpu = {"name": "g", "count": 3, **FIGURES, "peak_flops_bf16": 312, "peak_flops_tf32": 156,
           "peak_flops_fp64": 9.7, "peak_flops_fp16": 0, "l2_bytes": 40}
    data = {"name": "t", "peak_flops_fp16": 100, "devices": [gpu], "links": {
        "intra_host": {"bandwidth": 25, "latency": 10},
        "pairs": [{"between": ["g0", "g1"], "bandwidth": 50, "latency": 1e-5},
                  {"between": ["g1", "g2"], "bandwidth": 50, "latency": 1e-5}]}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    with caplog.at_level(logging.WARNING, logger=READER):
        topo = load_topology(path)
    assert topo.devices[0].peak_flops_bf16 == 312 and topo.link_latency[0, 2] == 10  # taken as written
    assert _said(caplog, path) == [
        f"{path}: devices[0]: l2_bytes 40 bytes is implausibly small: did you mean 40 MiB (41943040)?",
        f"{path}: devices[0]: peak_flops_tf32 156 FLOP/s is implausibly small: did you mean 156e12 (TFLOP/s)?",
        f"{path}: devices[0]: peak_flops_bf16 312 FLOP/s is implausibly small: did you mean 312e12 (TFLOP/s)?",
        f"{path}: devices[0]: peak_flops_fp64 9.7 FLOP/s is implausibly small: did you mean 9.7e12 (TFLOP/s)?",
        f"{path}: peak_flops_fp16 100 FLOP/s is implausibly small: did you mean 100e12 (TFLOP/s)?",
        f"{path}: links.intra_host: bandwidth 25 B/s is implausibly small: did you mean 25e9 (GB/s)?",
        f"{path}: links.intra_host: latency 10 s is implausibly large: did you mean 10e-6 (us)?",
        f"{path}: links.pairs[0] (and 1 more links.pairs entries): bandwidth 50 B/s is implausibly small: did you "
        "mean 50e9 (GB/s)?"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=READER):
        DeviceTopology.from_dict(data)
        load_topology(_file(tmp_path, [{"name": "g", **FIGURES, "peak_flops_bf16": 312e12, "l2_bytes": 40 * 2**20,
                                        "peak_flops_fp16": 0}], name="fine.yaml"))
    assert [r.getMessage() for r in caplog.records if r.name == READER] == []


# ------------------------------------------------------------- architecture on a known model
def test_an_architecture_replacing_a_known_models_is_said(tmp_path, caplog):
    """An A100 with ``architecture: H100`` was priced 7% slower than without it, without a word: said once; an
    architecture of the model's own family (A100 80GB built like an A100), a model the datasheets do not know and a
    MIG slice named in ``model`` (the line for it asks for ``architecture``) are quiet."""
    path = _file(tmp_path, [{"name": "mine", "count": 2, "model": "A100-SXM4-40GB", "architecture": "H100"},
                            {"name": "big", "model": "A100-SXM4-80GB", "architecture": "A100", "host": 1},
                            {"name": "new", "model": "Acme X1", "architecture": "H100", **FIGURES, "host": 2},
                            {"name": "mig", "model": "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "architecture": "A100",
                             **FIGURES, "sm_count": 14, "l2_bytes": 5e6, "peak_flops_tf32": 1e13,
                             "peak_flops_bf16": 2e13, "host": 3}])
    with caplog.at_level(logging.WARNING, logger=READER):
        topo = load_topology(path)
    assert [d.architecture for d in topo.devices] == ["H100", "H100", "A100", "H100", "A100"]  # kept: it still wins
    assert [s for s in _said(caplog, path) if "architecture" in s] == [
        f"{path}: devices[0]: architecture 'H100' replaces the architecture of model 'A100-SXM4-40GB' (A100 40GB): "
        "the cost model prices it as built like H100 SXM5 80GB; 'architecture' is for a GPU the datasheets do not "
        "know: drop it, or name such a GPU in 'model:'"]


def test_products_of_one_family_have_the_architecture_the_cost_model_prices():
    """The note keeps quiet where model and architecture are of one family (``_family``): that must never hide a
    price change, so every family's products must have the same architecture facts in the cost model."""
    from placement_rl import datasheets
    from placement_rl._topology_notes import _family
    from placement_rl.cost import gpu_spec

    facts: dict[str, set] = {}
    for product in datasheets.products():
        facts.setdefault(_family(product), set()).add(gpu_spec.datasheet(product))
    assert {family: len(f) for family, f in facts.items() if len(f) > 1} == {}
    assert _family("TITAN RTX 24GB") != _family("TITAN V 12GB")  # no model number: the words tell them apart
    assert _family("GeForce RTX 3080 Ti 12GB") == _family("GeForce RTX 3080 10GB")


# ------------------------------------------------------------- CUDA indices of entries without torch_device
def test_gpu_entries_without_torch_device_take_the_next_indices_of_their_host(tmp_path, caplog):
    """Two entries on one host without ``torch_device`` both started at cuda:0 (the loader's own default), and the
    file was then told to fix a value it never wrote: the host's numbering now goes on from entry to entry, after the
    highest index an entry gave; a ``torch_device`` given twice is still said."""
    path = _file(tmp_path, [{"name": "fast", "count": 3, **FIGURES}, {"name": "slow", **FIGURES},
                            {"name": "cpu", "kind": "cpu", "peak_flops": 1e12, "mem_bandwidth": 1e11,
                             "memory_bytes": 64e9},
                            {"name": "far", "count": 2, **FIGURES, "host": 1},
                            {"name": "set", "count": 2, **FIGURES, "host": 1, "index_start": 4},
                            {"name": "after", **FIGURES, "host": 1}])
    with caplog.at_level(logging.WARNING, logger=READER):
        topo = load_topology(path)
    assert [d.torch_device for d in topo.devices] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cpu", "cuda:0",
                                                      "cuda:1", "cuda:4", "cuda:5", "cuda:6"]
    assert not [s for s in _said(caplog, path) if "torch_device" in s]
    again = DeviceTopology.from_dict({"name": "t", "devices": [{"name": "a", "count": 2, **FIGURES},
                                                               {"name": "b", "count": 2, **FIGURES}], "links": LINKS})
    assert [d.torch_device for d in again.devices] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    twice = _file(tmp_path, [{"name": "a", **FIGURES}, {"name": "b", "torch_device": "cuda:0", **FIGURES}], "2.yaml")
    with caplog.at_level(logging.WARNING, logger=READER):
        load_topology(twice)
    assert [s for s in _said(caplog, twice) if "torch_device" in s][0].startswith(
        f"{twice}: devices 'a' and 'b' on host 0 both have torch_device 'cuda:0'")
