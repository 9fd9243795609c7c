"""A profile's times price only graphs of the precision it measured: fingerprints and per-op signatures name the
precision where it is not fp32 (fp32 ones are as before), and a lookup of another precision says so."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from placement_rl.cost.costs_file import load_costs
from placement_rl.errors import ProfileError
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.graph.coarsen import coarsen
from placement_rl.profiling import ProfileDB, op_signatures, profile_graph
from placement_rl.topology import DeviceTopology

torch.set_num_threads(1)

# zoo mlp at zoo.tiny("mlp"), captured in fp32: its fingerprint and first signatures before precision counted
MLP_FP32_FINGERPRINT = "628854bf3addd10a"
MLP_FP32_SIGNATURES = ["aten.linear.default[(8, 32), (64, 32), (64,)]", "aten.relu.default[(8, 64)]"]


class _MLP(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))).float().sum()


def _cpu_topology() -> DeviceTopology:
    return DeviceTopology.from_dict({"name": "c", "devices": [
        {"name": "cpu", "kind": "cpu", "torch_device": "cpu", "peak_flops": 1e11, "mem_bandwidth": 2e10,
         "memory_bytes": 8e9}], "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})


@pytest.fixture(scope="module")
def captures():
    """One module in fp16, bf16 and fp32: ``{name: (module, inputs, graph with its signatures)}``."""
    out = {}
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        torch.manual_seed(0)
        module, inputs = _MLP().to(dtype), (torch.randn(4, 16, dtype=dtype),)
        graph = capture(module, inputs, name=f"mlp_{name}")
        graph = graph.replace(meta={**graph.meta, "signatures": op_signatures(module, inputs, graph)})
        out[name] = (module, inputs, graph)
    return out


@pytest.fixture(scope="module")
def fp16_profile(captures, tmp_path_factory):
    module, inputs, graph = captures["fp16"]
    path = tmp_path_factory.mktemp("prec") / "p.json"
    db = profile_graph(module, inputs, graph, "cpu", warmup=0, repeats=1, step_repeats=1, progress=False,
                       db=ProfileDB(path))
    db.save()
    return path


def test_fp32_fingerprint_and_signatures_are_unchanged():
    module, inputs = zoo.build("mlp", **zoo.tiny("mlp"))
    graph = capture(module, inputs, name="mlp")
    assert graph.fingerprint() == MLP_FP32_FINGERPRINT
    assert op_signatures(module, inputs, graph)[:2] == MLP_FP32_SIGNATURES
    assert graph.replace(meta={**graph.meta, "dtype": "fp32"}).fingerprint() == MLP_FP32_FINGERPRINT


def test_fingerprint_and_signatures_name_the_precision(captures):
    fps = {name: g.fingerprint() for name, (_, _, g) in captures.items()}
    assert len(set(fps.values())) == 3, fps  # fp16 and bf16 have equal bytes, yet are two graphs
    g32 = captures["fp32"][2]
    autocast = g32.replace(meta={**g32.meta, "dtype": "bf16", "param_dtype": "fp32"})
    assert autocast.fingerprint() not in (g32.fingerprint(), g32.replace(meta={**g32.meta, "dtype": "bf16"})
                                          .fingerprint())
    for name, (_, _, graph) in captures.items():
        linear = next(s for s in graph.meta["signatures"] if s.startswith("aten.linear"))
        assert linear.endswith("]" if name == "fp32" else f"]:{name}"), linear


def test_profile_prices_only_its_own_precision(captures, fp16_profile):
    db, dev = ProfileDB.load(fp16_profile), _cpu_topology().devices[0]
    assert db.lookup(captures["fp16"][2], dev) is not None
    assert db.lookup(captures["bf16"][2], dev) is None  # was found under the fp16 fingerprint
    assert db.lookup(captures["fp32"][2], dev) is None  # was found through the per-op signature table
    g16 = captures["fp16"][2]
    other_batch = g16.replace(edge_bytes=g16.edge_bytes * 2)  # another fp16 graph reuses fp16 ops by signature
    assert db.lookup(other_batch, dev)[2].endswith(":ops")
    assert db.data["graphs"][g16.fingerprint()]["precision"] == "fp16"


def test_signatures_without_a_precision_do_not_price_a_bf16_graph(captures):
    """Signatures taken before they named a precision read as fp32 ops: a bf16 graph carrying them is not priced
    by an fp32 profile's op table."""
    db, dev = ProfileDB(), _cpu_topology().devices[0]
    db.add_device("cpu", dev)
    _, _, g32 = captures["fp32"]
    for name, sig in zip(g32.names, g32.meta["signatures"]):
        db.put_node(g32, "cpu", name, [1e-5], [2e-5], signature=sig)
    _, _, g16 = captures["bf16"]
    stale = g16.replace(meta={**g16.meta, "signatures": [s.split("]:")[0] + "]" if "]:" in s else s
                                                         for s in g16.meta["signatures"]]})
    assert all(s in db.data["ops"]["cpu"] for s in stale.meta["signatures"])
    assert db.lookup(stale, dev) is None


def test_why_no_times_names_both_precisions(captures, fp16_profile):
    db, topo = ProfileDB.load(fp16_profile), _cpu_topology()
    for name in ("bf16", "fp32"):
        graph = captures[name][2]
        why = db.why_no_times(graph, topo)
        assert "\n" not in why and "measured in fp16" in why and f"is {name}" in why, why
        with pytest.raises(ProfileError, match=f"measured in fp16, graph 'mlp_{name}' .* is {name}"):
            load_costs(fp16_profile, graph, topo)
    coarse = coarsen(captures["bf16"][2], depth=1)  # a coarsened graph's members, too
    assert "measured in fp16" in db.why_no_times(coarse, topo)


def test_cost_source_label_names_the_precision(captures, fp16_profile):
    _, costs = load_costs(fp16_profile, captures["fp16"][2], _cpu_topology())
    assert costs.source[0].startswith("measured:p.json:cpu (fp16, "), costs.source
