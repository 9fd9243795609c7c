"""GPU names as people write them: a memory size with a space or as ``32G``, a variant letter after a hyphen, resolve
to their row; a name whose memory size or glued variant letter the matched product has no row for is refused in a
topology (one line naming the product's rows) and unknown to ``lookup``; an unknown name gets the nearest names."""

from __future__ import annotations

import pytest
import yaml

from placement_rl.datasheets import lookup, nearest, products, resolve
from placement_rl.errors import TopologyError
from placement_rl.topology import load_topology


@pytest.mark.parametrize("name,product", [
    ("A100 SXM 80 GB", "A100 SXM4 80GB"), ("A100 80 GB PCIe", "A100 80GB PCIe"), ("V100 32G", "V100 SXM2 32GB"),
    ("A100 80GiB", "A100 SXM4 80GB"), ("L40-S", "L40S 48GB"), ("L40 S", "L40S 48GB"), ("V100-S", "V100S PCIe 32GB"),
    ("H100 NVL 94GB", "H100 NVL 94GB"), ("RTX 3080 10G", "GeForce RTX 3080 10GB"),
])
def test_spellings_of_a_size_or_variant_take_their_row(name, product):
    assert lookup(name).product == product


@pytest.mark.parametrize("name,product", [
    # the spellings that resolved right before and must stay on their row (presets, torch's names, the cost model)
    ("h100-sxm", "H100 SXM5 80GB"), ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"), ("a100_40gb", "A100 40GB"),
    ("A100-SXM4-80GB", "A100 SXM4 80GB"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("l40s", "L40S 48GB"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB"), ("H100SXM5", "H100 SXM5 80GB"), ("RTX 4090", "GeForce RTX 4090 24GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"), ("A100-40GB-PCIe", "A100 40GB"), ("V100-PCIe-32GB", "V100 PCIe 32GB"),
    ("H200-SXM-141GB", "H200 SXM 141GB"), ("NVIDIA GH200 480GB", "GH200 96GB"), ("T4G", "T4 16GB"),
    ("A10G", "A10G 24GB (AWS G5; the A10's figures)"), ("H100/80GB", "H100 SXM5 80GB"), ("H100x8", "H100 SXM5 80GB"),
    ("GeForce RTX 4090 D", "GeForce RTX 4090 24GB"), ("K80", "K80 (one of the board's two GPUs)"),
    ("A100", "A100 40GB"),
])
def test_names_that_resolved_right_still_do(name, product):
    assert lookup(name).product == product


def test_every_row_resolves_from_its_own_label_and_words():
    from placement_rl.datasheets import _ROWS

    for words, product, *_ in _ROWS:
        assert lookup(product).product == product
        assert lookup(" ".join(words)).product == product, words


@pytest.mark.parametrize("name,needle", [
    ("H100 94GB", r"'H100 94GB' says 94 GB, but its row 'H100 SXM5 80GB' is 80 GB.*H100 rows: H100 PCIe 80GB, "
                  r"H100 NVL 94GB, H100 SXM5 80GB"),
    ("A100 20GB", r"says 20 GB.*A100 rows: A100 80GB PCIe, A100 SXM4 80GB, A100 40GB"),
    ("NVIDIA A100X", r"'A100X' is no A100 variant the table knows \(A100 rows: A100 80GB PCIe"),
    ("RTX 3080 12GB", r"3080 rows: GeForce RTX 3080 Ti 12GB, GeForce RTX 3080 10GB"),
])
def test_a_name_the_matched_row_contradicts_is_refused(name, needle):
    with pytest.raises(TopologyError, match=needle):
        resolve(name)
    assert lookup(name) is None


def _topo(tmp_path, device: dict) -> object:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "devices": [device],
                                    "links": {"intra_host": {"bandwidth": 64e9, "latency": 5e-6}}}))
    return load_topology(path)


def test_a_topology_refuses_a_contradicted_name_in_one_line_unless_it_gives_every_figure(tmp_path):
    with pytest.raises(TopologyError, match=r"devices\[0\]: GPU model 'H100 94GB' says 94 GB.*name one of them") as e:
        _topo(tmp_path, {"name": "g", "model": "H100 94GB"})
    assert "\n" not in str(e.value)
    with pytest.raises(TopologyError, match=r"'A100X' is no A100 variant"):
        _topo(tmp_path, {"name": "g", "model": "NVIDIA A100X", "memory_bytes": 80e9})
    every = dict(peak_flops=60e12, mem_bandwidth=3.9e12, memory_bytes=94e9, sm_count=132, l2_bytes=50e6,
                 peak_flops_tf32=4e14, peak_flops_bf16=8e14)
    assert _topo(tmp_path, {"name": "g", "model": "H100 94GB", **every}).devices[0].memory_bytes == 94e9
    d = _topo(tmp_path, {"name": "g", "model": "A100 SXM 80 GB"}).devices[0]
    assert d.memory_bytes == 80 * 2**30
    assert _topo(tmp_path, {"name": "g", "model": "L40-S"}).devices[0].peak_flops_bf16 == 366e12


def test_an_unknown_name_gets_the_nearest_names(tmp_path):
    assert nearest("H-100")[0] == "H100" and nearest("A 100")[0] == "A100" and nearest("MI300X") == []
    for name in nearest("H-100") + nearest("rtx 4909") + nearest("L-40"):
        assert lookup(name) is not None, name
    with pytest.raises(TopologyError, match=r"missing field 'peak_flops' \(model 'H-100' is not a GPU "
                                            r"placement_rl.datasheets knows; nearest: H100\b"):
        _topo(tmp_path, {"name": "g", "model": "H-100"})
    assert len(products()) == len(set(products()))


def test_a_topology_path_that_is_a_folder_is_called_a_folder(tmp_path):
    (tmp_path / "topos").mkdir()
    (tmp_path / "topos" / "a.yaml").write_text("name: a\n")
    (tmp_path / "x.yaml").mkdir()
    for given in (tmp_path / "topos", f"{tmp_path / 'topos'}/", tmp_path / "x.yaml"):
        with pytest.raises(TopologyError, match=r"is a folder, not a YAML file") as e:
            load_topology(given)
        assert "unknown topology preset" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TopologyError, match=r"give one of its files \(.*topos/a\.yaml\)"):
        load_topology(tmp_path / "topos")
