"""A model captured in bf16 / fp16 is priced as that model run in bf16, and a pure dependency carries no gradient."""

import dataclasses
import logging

import numpy as np
import pytest
import torch

from placement_rl.cost.resolve import resolve_costs
from placement_rl.graph.capture import capture
from placement_rl.graph.ir import make_graph
from placement_rl.topology import DeviceTopology, load_topology

torch.set_num_threads(1)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))


def _dtype(topology, dtype):
    return dataclasses.replace(topology, meta={**topology.meta, "dtype": dtype})


def _bf16(topology):
    return _dtype(topology, "bf16")


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_a_half_precision_capture_is_priced_as_the_fp32_capture_run_in_its_dtype(half):
    x = torch.randn(256, 512)
    g32 = capture(_mlp(), (x,))
    g16 = capture(_mlp().to(half), (x.to(half),))
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[half]
    assert "dtype" not in g32.meta
    assert g16.meta["dtype"] == name
    assert np.allclose(g16.out_bytes, np.asarray(g32.out_bytes) / 2)  # the graph keeps the bytes it saw
    h100 = load_topology("1x_h100_sxm")
    want = resolve_costs(g32, _dtype(h100, name))
    for top in (h100, _dtype(h100, name)):  # by default, and with the topology saying it: bytes not halved twice
        got = resolve_costs(g16, top)
        assert got.source == want.source and got.source[0].endswith(f":{name}")
        assert np.allclose(got.fwd_time, want.fwd_time, rtol=1e-9)
        assert np.allclose(got.bwd_time, want.bwd_time, rtol=1e-9)
    fp32 = resolve_costs(g32, h100)  # tensor cores: the fp32 pricing is no stand-in for it
    assert (fp32.fwd_time - fp32.launch_overhead).sum() > 1.5 * (want.fwd_time - want.launch_overhead).sum()


def test_fp16_runs_on_the_fp16_tensor_cores_of_a_t4_and_v100_and_bf16_at_their_fp32_peak():
    """The T4 and V100 have FP16 tensor cores and no BF16 ones: an fp16 capture runs there in fp16 (its GEMMs
    several times faster than fp32, not priced at the FP32 peak), a bf16 one at the FP32 peak with fp32 bytes, and
    an fp16 one on a P4 (FP16 at 1/64 rate: no peak in its datasheet) at the FP32 peak too."""
    x = torch.randn(256, 512)
    g32 = capture(_mlp(), (x,))
    g16 = capture(_mlp().half(), (x.half(),))
    gbf = capture(_mlp().bfloat16(), (x.bfloat16(),))
    lin = [i for i, t in enumerate(g32.op_types) if "linear" in t]
    for preset in ("1x_t4", "1x_v100_pcie_32gb"):
        top = load_topology(preset)
        assert top.devices[0].peak_flops_fp16 > 4 * top.devices[0].peak_flops
        fp32, fp16, bf16 = resolve_costs(g32, top), resolve_costs(g16, top), resolve_costs(gbf, top)
        assert fp16.source[0].endswith(":fp16") and bf16.source == fp32.source
        assert np.allclose(bf16.fwd_time, fp32.fwd_time, rtol=1e-9)
        gemm = lambda c: (c.fwd_time - c.launch_overhead)[lin].sum()  # noqa: E731
        assert gemm(fp16) < gemm(fp32) / 2
        assert np.allclose(fp16.fwd_time, resolve_costs(g32, _dtype(top, "fp16")).fwd_time, rtol=1e-9)
    p4 = load_topology("1x_t4").to_dict()
    p4["devices"][0].update(model="P4", peak_flops=5.5e12, mem_bandwidth=192e9, sm_count=20, peak_flops_fp16=0.0)
    p4 = DeviceTopology.from_dict(p4)
    assert resolve_costs(g16, p4).source == resolve_costs(g32, p4).source


def test_a_zero_byte_edge_into_a_gemm_prices_no_data_gradient():
    nodes = [dict(name="x", op_type="linear", fwd_flops=2 * 64 * 256 * 256, out_bytes=64 * 256 * 4.0,
                  param_bytes=256 * 256 * 4.0),
             dict(name="y", op_type="linear", fwd_flops=2 * 64 * 256 * 256, out_bytes=64 * 256 * 4.0,
                  param_bytes=256 * 256 * 4.0),
             dict(name="z", op_type="linear", fwd_flops=2 * 64 * 256 * 256, out_bytes=64 * 256 * 4.0,
                  param_bytes=256 * 256 * 4.0)]
    data = [("x", "y", 64 * 256 * 4.0), ("y", "z", 64 * 256 * 4.0)]
    plain = make_graph(nodes, data)
    ordered = make_graph(nodes, data + [("x", "z", 0.0)])  # z waits for x; no tensor flows
    top = load_topology("1x_h100_sxm")
    a, b = resolve_costs(plain, top), resolve_costs(ordered, top)
    assert np.allclose(a.bwd_time, b.bwd_time, rtol=1e-12)
    assert np.allclose(a.fwd_time, b.fwd_time, rtol=1e-12)


class _Autocast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _mlp()

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.body(x)


class _BigBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _mlp()
        self.register_buffer("table", torch.zeros(4_000_000, dtype=torch.bfloat16))

    def forward(self, x):
        return self.body(x)


def test_an_autocast_capture_is_priced_as_the_fp32_capture_run_in_bf16():
    x = torch.randn(256, 512)
    g32 = capture(_mlp(), (x,))
    auto = capture(_Autocast(), (x,))
    assert auto.meta["dtype"] == "bf16" and auto.meta["param_dtype"] == "fp32"
    h100 = load_topology("1x_h100_sxm")
    want, got = resolve_costs(g32, _bf16(h100)), resolve_costs(auto, h100)
    lin = [i for i, t in enumerate(auto.op_types) if "linear" in t]
    ref = [i for i, t in enumerate(g32.op_types) if "linear" in t]
    assert len(lin) == len(ref) == 2 and got.source == want.source
    assert np.allclose(got.fwd_time[lin], want.fwd_time[ref], rtol=1e-9)
    assert np.allclose(got.bwd_time[lin], want.bwd_time[ref], rtol=1e-9)


def test_a_large_half_precision_buffer_beside_fp32_weights_is_no_half_precision_model():
    g = capture(_BigBuffer(), (torch.randn(256, 512),))
    assert "dtype" not in g.meta and "param_dtype" not in g.meta


def test_an_fp64_capture_runs_at_the_fp64_peak_or_warns_that_the_fp32_one_is_optimistic(caplog):
    """fp64 was captured as no dtype and priced as fp32 (up to 50x fast on a GeForce card): it is recorded, its
    bytes are 8-byte elements, its GEMMs run at the topology's ``peak_flops_fp64`` (a preset's datasheet note once
    left unread), and without one at the FP32 peak with a warning saying so."""
    x = torch.randn(256, 512)
    g32 = capture(_mlp(), (x,))
    g64 = capture(_mlp().double(), (x.double(),))
    assert g64.meta["dtype"] == "fp64" and "param_dtype" not in g64.meta
    lin = [i for i, t in enumerate(g32.op_types) if "linear" in t]
    v100 = load_topology("4x_v100_nvlink")
    assert v100.devices[0].peak_flops_fp64 == 7.8e12
    gemm = lambda c: (c.fwd_time - c.launch_overhead)[lin, 0].sum()  # noqa: E731
    fp32, fp64 = resolve_costs(g32, v100), resolve_costs(g64, v100)
    assert fp64.source[0].endswith(":fp64")
    assert gemm(fp64) > 1.5 * gemm(fp32)  # 7.8 against 15.7 TFLOP/s
    a100 = load_topology("1x_a100_80gb_pcie")  # the datasheet's FP64 tensor-core peak, 19.5 TFLOP/s
    assert a100.devices[0].peak_flops_fp64 == 19.5e12 and load_topology("1x_t4").devices[0].peak_flops_fp64 < 0.3e12
    data = a100.to_dict()
    data["devices"][0].update(model="", peak_flops_fp64=0.0)  # no figure, no product to take one from
    bare = DeviceTopology.from_dict(data)
    with caplog.at_level(logging.WARNING):
        got = resolve_costs(g64, bare)
        resolve_costs(g64, bare)
    assert got.source[0].endswith(":fp64") and gemm(got) >= gemm(resolve_costs(g32, bare)) * 0.99
    said = [r.getMessage() for r in caplog.records if "peak_flops_fp64" in r.getMessage()]
    assert len(said) == 1 and "optimistic" in said[0] and bare.name in said[0]  # once per topology


def test_precision_refusals_name_the_missing_tensor_cores_and_an_override_is_said(caplog):
    """``dtype: bf16`` on a V100 says it has no BF16 tensor cores and which dtypes it has (it asked for a figure the
    card does not have); a topology dtype overriding the graph's captured one is said once."""
    from placement_rl.errors import ProfileError

    x = torch.randn(64, 512)
    g16 = capture(_mlp().half(), (x.half(),))
    with pytest.raises(ProfileError, match=r"no BF16 tensor cores: use dtype fp16 or fp32"):
        resolve_costs(g16, _dtype(load_topology("1x_v100_pcie_32gb"), "bf16"))
    with caplog.at_level(logging.WARNING):
        resolve_costs(g16, _dtype(load_topology("1x_h100_sxm"), "tf32"))
    assert any("says dtype tf32" in r.getMessage() and "captured in fp16" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bad", ["fp8", "float16", "FP16", 16])
def test_a_graph_file_with_a_precision_no_model_prices_is_refused_in_one_line(bad):
    """``inspect`` passed ``meta.dtype: fp8`` and said it would run in fp32, while pricing refused it later."""
    from placement_rl.errors import GraphError

    g = capture(_mlp(), (torch.randn(8, 512),))
    for key in ("dtype", "param_dtype"):
        with pytest.raises(GraphError, match=rf"field 'meta.{key}' is .*expected one of fp32, bf16, fp16, fp64"):
            g.replace(meta={**g.meta, key: bad}).validate()
