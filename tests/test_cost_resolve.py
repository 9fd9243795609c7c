"""``resolve_costs``: roofline numbers, launch overhead, measured sources through the CostSource protocol."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import CostSource, needs_grad, resolve_costs
from placement_rl.errors import ProfileError
from placement_rl.graph.ir import make_graph
from placement_rl.topology import DeviceTopology


@pytest.fixture
def topo() -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": "mixed",
        "devices": [{"name": "gpu0", "kind": "gpu", "peak_flops": 1e12, "mem_bandwidth": 1e9,
                     "memory_bytes": 8e9, "launch_overhead": 1e-5},
                    {"name": "cpu", "kind": "cpu", "torch_device": "cpu", "peak_flops": 1e10,
                     "mem_bandwidth": 1e8, "memory_bytes": 64e9, "launch_overhead": 2e-6}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})


@pytest.fixture
def g():
    nodes = [dict(name="x", out_bytes=4e6),  # a data input: no parameters, no backward
             dict(name="mm", fwd_flops=2e9, bwd_flops=4e9, out_bytes=1e6, param_bytes=2e6, act_bytes=1e6),
             dict(name="relu", fwd_flops=1e6, out_bytes=1e6, act_bytes=1e6, members=["relu", "dropout", "add"])]
    return make_graph(nodes, [("x", "mm", 4e6), ("mm", "relu", 1e6)])


def test_roofline_matches_the_formula(g, topo) -> None:
    c = resolve_costs(g, topo, gpu_model="roofline")  # GPUs default to the calibrated model (test_calibrated)
    assert c.source == ("roofline", "roofline")
    assert c.describe_source(topo.device_names) == "gpu0=roofline, cpu=roofline"
    # mm on gpu0: compute 2e9/1e12 = 2 ms; bytes 1e6 out + 4e6 in + 2e6 params = 7e6 / 1e9 = 7 ms -> memory bound
    assert c.fwd_time[1, 0] == pytest.approx(7e-3 + 1e-5)
    assert c.bwd_time[1, 0] == pytest.approx(max(4e9 / 1e12, 2 * 7e6 / 1e9) + 1e-5)
    # mm on cpu: compute 2e9/1e10 = 0.2 s; bytes 7e6/1e8 = 0.07 s -> compute bound
    assert c.fwd_time[1, 1] == pytest.approx(0.2 + 2e-6)
    # relu is a coarsened group of 3 ops: 3 launches
    assert c.launch_overhead[2, 0] == pytest.approx(3e-5)
    assert c.fwd_time[2, 0] == pytest.approx(max(1e6 / 1e12, 2e6 / 1e9) + 3e-5)
    # the data input needs no gradient: no backward
    assert needs_grad(g).tolist() == [False, True, True]
    assert c.bwd_time[0].tolist() == [0.0, 0.0]
    assert c.fwd_time[0, 0] == pytest.approx(4e6 / 1e9 + 1e-5)
    np.testing.assert_array_equal(c.link_bandwidth, topo.link_bandwidth)
    assert c.graph_fingerprint == g.fingerprint() and c.topology_name == "mixed"


class FakeDB:
    """A measured source answering for one device (a ProfileDB implements the same protocol)."""

    def __init__(self, fwd, bwd, device: str = "gpu0") -> None:
        self.fwd, self.bwd, self.device = fwd, bwd, device

    def lookup(self, graph, device):
        if device.name != self.device:
            return None
        return self.fwd, self.bwd, "h100-run1"


def test_measured_source_is_used_and_labelled(g, topo) -> None:
    db = FakeDB([1e-3, 2e-3, 3e-3], [0.0, 4e-3, 5e-3])
    assert isinstance(db, CostSource)
    c = resolve_costs(g, topo, db)
    assert c.source == ("measured:h100-run1", "roofline")
    np.testing.assert_allclose(c.fwd_time[:, 0], [1e-3, 2e-3, 3e-3])
    np.testing.assert_allclose(c.bwd_time[:, 0], [0.0, 4e-3, 5e-3])
    np.testing.assert_allclose(c.fwd_time[:, 1], resolve_costs(g, topo).fwd_time[:, 1])
    # first source that answers wins
    c2 = resolve_costs(g, topo, [FakeDB([9.0] * 3, [9.0] * 3, "cpu"), db])
    assert c2.source == ("measured:h100-run1", "measured:h100-run1")


def test_bad_measured_source_raises_profile_error(g, topo) -> None:
    with pytest.raises(ProfileError, match="3 nodes"):
        resolve_costs(g, topo, FakeDB([1.0, 2.0], [1.0, 2.0]))
    with pytest.raises(ProfileError, match="negative or non-finite"):
        resolve_costs(g, topo, FakeDB([1.0, -2.0, 1.0], [1.0] * 3))
    with pytest.raises(ProfileError, match="lookup"):
        resolve_costs(g, topo, [object()])
