"""GPU datasheets by product name: the table agrees with every preset, a topology may name its GPUs instead of
copying their figures, a given figure wins, an unknown product without figures is one clear line."""

from __future__ import annotations

import pytest
import yaml

from placement_rl.datasheets import lookup, products
from placement_rl.errors import TopologyError
from placement_rl.topology import DeviceTopology, conf_dir, load_topology, preset_names


@pytest.mark.parametrize("name,product", [
    ("H100-SXM5-80GB", "H100 SXM5 80GB"), ("NVIDIA H100 80GB HBM3", "H100 SXM5 80GB"),
    ("NVIDIA H100 PCIe", "H100 PCIe 80GB"), ("NVIDIA H100 NVL", "H100 NVL 94GB"), ("GH200", "GH200 96GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("A100-40GB-PCIe", "A100 40GB"), ("NVIDIA A10G", "A10G 24GB (AWS G5; the A10's figures)"),
    ("NVIDIA A10", "A10 24GB"), ("NVIDIA L40S", "L40S 48GB"), ("L40", "L40 48GB"), ("NVIDIA L4", "L4 24GB"),
    ("rtx4090", "GeForce RTX 4090 24GB"), ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090 24GB"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada 48GB"), ("NVIDIA RTX A6000", "RTX A6000 48GB"),
    ("Tesla T4", "T4 16GB"), ("Tesla V100S-PCIE-32GB", "V100S PCIe 32GB"), ("Tesla V100-PCIE-16GB", "V100 PCIe 16GB"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2 32GB"), ("Tesla P100-PCIE-12GB", "P100 PCIe 12GB"), ("Tesla P4", "P4 8GB"),
    ("Tesla P40", "P40 24GB"), ("Tesla K80", "K80 (one of the board's two GPUs)"),
    ("NVIDIA H800", "H800 SXM5 80GB"), ("NVIDIA H800 PCIe", "H800 PCIe 80GB"), ("NVIDIA A800-SXM4-80GB",
    "A800 SXM4 80GB"), ("NVIDIA A800 80GB PCIe", "A800 80GB PCIe"), ("NVIDIA RTX A4000", "RTX A4000 16GB"),
    ("A5000", "RTX A5000 24GB"), ("NVIDIA GeForce RTX 3080 Ti", "GeForce RTX 3080 Ti 12GB"),
    ("NVIDIA GeForce RTX 3080", "GeForce RTX 3080 10GB"), ("rtx3070", "GeForce RTX 3070 8GB"),
    ("NVIDIA GeForce RTX 4080", "GeForce RTX 4080 16GB"), ("NVIDIA GeForce RTX 4080 SUPER",
    "GeForce RTX 4080 SUPER 16GB"), ("NVIDIA TITAN RTX", "TITAN RTX 24GB"), ("NVIDIA TITAN V", "TITAN V 12GB"),
    ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti 11GB"), ("rtx2080ti", "GeForce RTX 2080 Ti 11GB"),
    ("GeForce RTX 2080", "GeForce RTX 2080 8GB"), ("RTX 2080 Super", "GeForce RTX 2080 SUPER 8GB"),
    ("NVIDIA GeForce RTX 2070", "GeForce RTX 2070 8GB"), ("RTX 2070 SUPER", "GeForce RTX 2070 SUPER 8GB"),
    ("GeForce GTX 1080 Ti", "GeForce GTX 1080 Ti 11GB"), ("GTX1080", "GeForce GTX 1080 8GB"),
    ("Quadro P4000", "Quadro P4000 8GB"), ("NVIDIA B200", "B200 180GB (HGX)"),
    ("NVIDIA GB200", "GB200 186GB (one GPU of an NVL72)"), ("NVIDIA H20", "H20 96GB"), ("NVIDIA L20", "L20 48GB"),
    ("NVIDIA A2", "A2 16GB"), ("NVIDIA A16", "A16 16GB (one of the board's four GPUs)"),
    ("NVIDIA GeForce RTX 5090", "GeForce RTX 5090 32GB"), ("rtx5080", "GeForce RTX 5080 16GB"),
    ("NVIDIA H200", "H200 SXM 141GB"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
])
def test_product_names_as_written_and_as_torch_reports_them(name, product):
    assert lookup(name).product == product


@pytest.mark.parametrize("name", ["A1000", "RTX A2000", "Quadro P2000", "GeForce RTX 4060", "RTX 3060 Ti", "RTX 5070", "MI300X",
                                  "TPU v5e", ""])
def test_a_model_number_matches_whole_or_not_at_all(name):
    """A100 is not in A1000, A40 / A4000 not in A2000, P4 / P4000 not in P2000, T4 / RTX 4080 not in RTX 4060, RTX
    3080 not in 3060; products the table lacks are unknown, not a near miss."""
    assert lookup(name) is None


def test_every_product_in_the_table_has_its_architecture():
    """The figures (``datasheets``) and the architecture facts the cost model reads (``cost.gpu_spec``) come from
    two tables: every product with figures must be known to the second, or the calibrated model would price it as
    an unknown architecture."""
    from placement_rl.cost.gpu_spec import datasheet

    for product in products():
        arch, gddr, lanes, _ = datasheet(product)
        assert arch > 0 and lanes in (64, 128, 192), product
        hbm = product.split()[0] in ("GB200", "B200", "H20", "GH200", "H200", "H100", "H800", "A100", "A800", "A30", "V100", "V100S", "P100",
                                     "TITAN") and product != "TITAN RTX 24GB"
        assert gddr == (not hbm), product


def test_every_preset_gpu_has_its_datasheet_figures():
    """The table and the presets (whose every number cites its source) say the same of every GPU they share."""
    seen = set()
    for name in preset_names():
        data = yaml.safe_load((conf_dir() / "topology" / f"{name}.yaml").read_text())
        for dev in data.get("devices", []):
            if dev.get("kind", "gpu") != "gpu" or "model" not in dev:
                continue
            sheet = lookup(dev["model"])
            assert sheet is not None, (name, dev["model"])
            seen.add(sheet.product)
            assert sheet.peak_flops == pytest.approx(float(dev["peak_flops"]), rel=0.01), (name, dev["model"])
            assert sheet.mem_bandwidth == pytest.approx(float(dev["mem_bandwidth"]), rel=0.01), (name, dev["model"])
            assert sheet.memory_bytes == pytest.approx(float(dev["memory_bytes"]), rel=0.01), (name, dev["model"])
            assert sheet.sm_count == dev["sm_count"] and sheet.l2_bytes == float(dev["l2_bytes"]), (name, dev["model"])
            for key in ("peak_flops_tf32", "peak_flops_bf16"):
                if key in data:
                    assert getattr(sheet, key) == pytest.approx(float(data[key]), rel=0.01), (name, key)
    assert len(seen) >= 8 and set(seen) <= set(products())


def _topo(tmp_path, device: dict, **top) -> DeviceTopology:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"name": "t", **top, "devices": [device],
                                    "links": {"intra_host": {"bandwidth": 64e9, "latency": 5e-6}}}))
    return load_topology(path)


def test_a_topology_may_name_its_gpus_instead_of_copying_their_figures(tmp_path):
    t = _topo(tmp_path, {"name": "g", "count": 4, "kind": "gpu", "model": "L40S"})
    d = t.devices[0]
    assert t.num_devices == 4 and d.model == "L40S"
    assert (d.peak_flops, d.mem_bandwidth, d.memory_bytes, d.sm_count) == (91.6e12, 864e9, 48 * 2**30, 142)
    assert (d.peak_flops_tf32, d.peak_flops_bf16, d.l2_bytes) == (183e12, 366e12, 96 * 2**20)
    # a figure the user gives wins, device by device; a topology-level tensor peak wins over the datasheet's
    t = _topo(tmp_path, {"name": "g", "count": 2, "kind": "gpu", "model": "A100", "memory_bytes": 80 * 2**30,
                         "peak_flops": 19.0e12}, peak_flops_bf16=300e12)
    d = t.devices[1]
    assert (d.memory_bytes, d.peak_flops, d.mem_bandwidth, d.peak_flops_bf16, d.peak_flops_tf32) == (
        80 * 2**30, 19.0e12, 1.555e12, 300e12, 156e12)
    # the round trip writes every figure out
    again = DeviceTopology.from_dict(t.to_dict())
    assert again.devices[1] == d


@pytest.mark.parametrize("device,needle", [
    ({"name": "g", "kind": "gpu", "model": "MI300X"}, r"missing field 'peak_flops' \(model 'MI300X' is not a GPU"),
    ({"name": "g", "kind": "gpu"}, r"missing field 'peak_flops' \(or name the product in 'model:'"),
    ({"name": "g", "kind": "gpu", "model": "MI300X", "peak_flops": 1e14}, r"missing field 'mem_bandwidth'"),
    ({"name": "c", "kind": "cpu", "model": "H100"}, r"missing field 'peak_flops'"),  # a CPU takes no GPU datasheet
])
def test_a_figure_neither_given_nor_known_is_one_line(tmp_path, device, needle):
    with pytest.raises(TopologyError, match=needle) as err:
        _topo(tmp_path, device)
    assert "\n" not in str(err.value)


def test_the_datasheet_line_comes_once_per_command(tmp_path, caplog):
    """The CLI reads a ``topology.path`` file twice (its check before any work, then the load that builds it): the
    line saying which figures came from a datasheet is written by the second only."""
    import logging

    from placement_rl.cli import schema
    from placement_rl.cli.common import build_topology

    _topo(tmp_path, {"name": "g", "count": 2, "kind": "gpu", "model": "L40S"})
    with caplog.at_level(logging.INFO, logger="placement_rl._topology_reader"):
        schema.validate("place", {"topology": {"path": str(tmp_path / "t.yaml")}})
        assert not caplog.records
        build_topology(str(tmp_path / "t.yaml"))
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().endswith("from the datasheet of L40S 48GB")
    assert logging.getLogger("placement_rl._topology_reader").level == logging.NOTSET


def test_entries_alike_share_one_datasheet_line(tmp_path, caplog):
    """A topology of one entry per host said which figures came from a datasheet once per entry (64 lines at 512
    GPUs); now once per run of consecutive entries that took the same figures from the same row."""
    import logging

    devices = [{"name": f"h{k}g", "count": 8, "kind": "gpu", "model": "H100", "host": k} for k in range(6)]
    devices[4] = {**devices[4], "model": "L40S"}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"name": "hosts", "devices": devices, "links": {
        "intra_host": {"bandwidth": 400e9, "latency": 2e-6}, "inter_host": {"bandwidth": 50e9, "latency": 5e-6}}}))
    with caplog.at_level(logging.INFO, logger="placement_rl._topology_reader"):
        assert load_topology(path).num_devices == 48
    said = [r.getMessage().split(": ", 1)[1] for r in caplog.records]
    assert [s.split(":")[0] for s in said] == ["devices[0-3]", "devices[4]", "devices[5]"], said
    assert said[1].endswith("L40S 48GB") and said[0].endswith(said[2].split(" from ")[1])


def test_a_gb200_is_never_priced_slower_than_a_b200_it_outruns_on_every_datasheet_figure():
    """The GB200's GPU is the B200 chip (148 SMs, 126 MiB L2) at a higher peak: with no SM count its SMs were
    estimated from the FP32 peak (223) and it came out up to 14% slower than the B200 on GEMMs and convs."""
    import numpy as np

    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.topology import DeviceTopology

    def one(model: str) -> DeviceTopology:
        return DeviceTopology.from_dict({"name": model, "devices": [{"name": "g", "model": model}],
                                         "links": {"intra_host": {"bandwidth": 1e11, "latency": 1e-6}}})

    graph = synthetic.sample("layered", num_nodes=60, seed=3)
    b, gb = (resolve_costs(graph, one(m)) for m in ("B200", "GB200"))
    assert np.all(gb.fwd_time <= b.fwd_time * (1 + 1e-9)) and np.all(gb.bwd_time <= b.bwd_time * (1 + 1e-9))
