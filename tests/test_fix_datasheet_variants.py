"""A GPU name holding a variant word its datasheet row does not (``RTX 3090 Ti``, ``RTX 4090 Laptop GPU``, ``DRIVE
A100``) is refused, not priced as the base card; a MIG slice's name is refused as a slice (not as a card that "says 1
GB"); and a topology file whose figures are too small for their unit (TFLOP/s or TB/s written without the exponent)
gets one warning line per figure."""

from __future__ import annotations

import logging

import pytest
import yaml

from placement_rl.datasheets import lookup, resolve
from placement_rl.errors import TopologyError
from placement_rl.topology import DeviceTopology, load_topology

LINKS = {"intra_host": {"bandwidth": 64e9, "latency": 5e-6}}
EVERY = dict(peak_flops=40e12, mem_bandwidth=1.0e12, memory_bytes=24 * 2**30, sm_count=84, l2_bytes=6 * 2**20,
             peak_flops_tf32=40e12, peak_flops_bf16=80e12)


def _topo(tmp_path, *devices: dict):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "devices": list(devices), "links": LINKS}))
    return load_topology(path)


@pytest.mark.parametrize("name,word,rows", [
    ("GeForce RTX 3090 Ti", "TI", "3090 rows: GeForce RTX 3090 24GB"),
    ("RTX 3070Ti", "TI", "3070 rows: GeForce RTX 3070 8GB"),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", "LAPTOP", "4090 rows: GeForce RTX 4090 24GB"),
    ("NVIDIA GeForce RTX 3080 Laptop GPU", "LAPTOP", "3080 rows: GeForce RTX 3080 Ti 12GB, GeForce RTX 3080 10GB"),
    ("RTX A5000 Laptop", "LAPTOP", "A5000 rows: RTX A5000 24GB"),
    ("RTX 2080 Max-Q", "MAX Q", "2080 rows: "), ("RTX 2070 Mobile", "MOBILE", "2070 rows: "),
    ("DRIVE A100", "DRIVE", "A100 rows: A100 80GB PCIe"), ("H100 CNX", "CNX", "H100 rows: H100 PCIe 80GB"),
    ("RTX 3080 SUPER", "SUPER", "3080 rows: "),
])
def test_a_variant_word_the_row_does_not_hold_is_refused(name, word, rows):
    """They took the base card's row (the laptop RTX 4090 priced as the desktop one, ~2.5x fast)."""
    with pytest.raises(TopologyError, match=rf"'{word}' names a variant the table has no row for \({rows}") as e:
        resolve(name)
    assert "name one of them in 'model:'" in str(e.value) and "\n" not in str(e.value)
    assert lookup(name) is None


@pytest.mark.parametrize("name,product", [
    ("RTX 3080 Ti", "GeForce RTX 3080 Ti 12GB"), ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti 11GB"),
    ("GTX 1080Ti", "GeForce GTX 1080 Ti 11GB"), ("NVIDIA GeForce RTX 4080 SUPER", "GeForce RTX 4080 SUPER 16GB"),
    ("RTX 2070 Super", "GeForce RTX 2070 SUPER 8GB"), ("TITAN RTX", "TITAN RTX 24GB"), ("TITAN V", "TITAN V 12GB"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090 24GB"), ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
])
def test_a_variant_with_its_own_row_and_torch_names_still_resolve(name, product):
    assert resolve(name).product == product


def test_a_topology_refuses_a_variant_in_one_line_unless_it_gives_every_figure(tmp_path):
    with pytest.raises(TopologyError, match=r"devices\[0\]: GPU model 'RTX 3090 Ti': 'TI' names a variant") as e:
        _topo(tmp_path, {"name": "g", "model": "RTX 3090 Ti"})
    assert "\n" not in str(e.value)
    d = _topo(tmp_path, {"name": "g", "model": "RTX 3090 Ti", **EVERY}).devices[0]
    assert d.peak_flops == 40e12 and d.mem_bandwidth == 1.0e12


@pytest.mark.parametrize("name,profile", [("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
                                          ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", "7g.80gb")])
def test_a_mig_slice_is_refused_as_a_slice_that_needs_its_own_figures(tmp_path, name, profile):
    """It said "'... MIG 1g.5gb' says 1 GB, but its row 'A100 40GB' is 40 GB": ``1g`` read as a memory size."""
    with pytest.raises(TopologyError, match=rf"is a MIG slice \({profile}\).*own figures.*'architecture:'") as e:
        resolve(name)
    assert " GB, but its row" not in str(e.value) and lookup(name) is None
    with pytest.raises(TopologyError, match=r"devices\[0\]: GPU model .* is a MIG slice"):
        _topo(tmp_path, {"name": "g", "model": name})
    fig = dict(peak_flops=2.8e12, mem_bandwidth=0.2e12, memory_bytes=5 * 2**30)
    sliced = _topo(tmp_path, {"name": "g", "architecture": "A100", **fig}).devices[0]  # what the line asks for
    assert sliced.memory_bytes == 5 * 2**30 and sliced.architecture == "A100"
    assert _topo(tmp_path, {"name": "g", "model": name, **EVERY}).devices[0].model == name


def test_a_figure_too_small_for_its_unit_is_said_once_per_field(tmp_path, caplog):
    """``peak_flops: 67, mem_bandwidth: 3.35`` (TFLOP/s and TB/s without the exponent) simulated a step at 30
    years without a word; topologies built in code (tests' made-up devices) stay quiet."""
    slip = {"name": "g", "model": "Acme X1", "peak_flops": 67, "mem_bandwidth": 3.35, "memory_bytes": 80}
    fine = {"name": "c", "kind": "cpu", "peak_flops": 1e12, "mem_bandwidth": 1e11, "memory_bytes": 64e9}
    with caplog.at_level(logging.WARNING):
        _topo(tmp_path, slip, fine)
    said = [r.getMessage() for r in caplog.records if "implausibly small" in r.getMessage()]
    assert said == [f"{tmp_path / 't.yaml'}: devices[0]: peak_flops 67 FLOP/s is implausibly small: did you mean "
                    "67e12 (TFLOP/s)?",
                    f"{tmp_path / 't.yaml'}: devices[0]: mem_bandwidth 3.35 B/s is implausibly small: did you mean "
                    "3.35e12 (TB/s)?",
                    f"{tmp_path / 't.yaml'}: devices[0]: memory_bytes 80 bytes is implausibly small: did you mean "
                    "80 GiB (85899345920)?"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        DeviceTopology.from_dict({"name": "t", "devices": [slip], "links": LINKS})
    assert not [r for r in caplog.records if "implausibly small" in r.getMessage()]
