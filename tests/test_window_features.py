"""The lookahead and topology features pinned by values computed by hand on small branches, and the topology
sampler's link patterns: each of ``la_comm``, ``la_over``, ``cons_link`` set to a constant fails here, and so does
a sampler that never draws links differing pair by pair."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import resolve_costs
from placement_rl.cost.memory import static_memory
from placement_rl.cost.schedule import DEVICE_FEATURES, ScheduleState, time_scale, window_time_scale
from placement_rl.envs.topology_sampler import PATTERNS, random_topology
from placement_rl.graph.ir import make_graph
from placement_rl.topology import DeviceTopology

COL = {name: i for i, name in enumerate(DEVICE_FEATURES)}


def _topology(pairs: list[tuple[str, str, float, float]], memory: list[float]) -> DeviceTopology:
    devices = [{"name": f"gpu{i}", "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 5e11, "memory_bytes": m,
                "host": 0, "model": "V100"} for i, m in enumerate(memory)]
    return DeviceTopology.from_dict({"name": "hand", "devices": devices, "links": {
        "intra_host": {"bandwidth": 1e10, "latency": 1e-5},
        "pairs": [{"between": [a, b], "bandwidth": bw, "latency": lat} for a, b, bw, lat in pairs]}})


def _features(graph, topo, placed: list[int], window: int) -> np.ndarray:
    costs = resolve_costs(graph, topo)
    st = ScheduleState(graph, costs, topo, episodes=1, window=window)
    for d in placed:
        st.place(d)
    f, _ = st.features()
    return f[0], costs, st


def test_la_comm_is_the_branch_transfer_time_over_the_window_unit():
    """a -> b, a on gpu0; deciding b (the last node, window reaching the end): on gpu0 nothing moves, on gpu1 the
    edge crosses the link: la_comm[1] = (latency + bytes / bandwidth) / window unit, la_comm[0] = 0."""
    g = make_graph([{"name": "a", "fwd_flops": 1e9, "out_bytes": 4e6}, {"name": "b", "fwd_flops": 1e9}],
                   [("a", "b", 4e6)])
    topo = _topology([("gpu0", "gpu1", 2e9, 3e-5)], [1e10, 1e10])
    f, costs, _ = _features(g, topo, [0], window=4)
    unit = window_time_scale(time_scale(g, costs), g.num_nodes)
    want = (costs.link_latency[0, 1] + 4e6 / costs.link_bandwidth[0, 1]) / unit
    assert costs.link_bandwidth[0, 1] == pytest.approx(2e9) and costs.link_latency[0, 1] == pytest.approx(3e-5)
    assert f[0, COL["la_comm"]] == 0.0
    assert f[1, COL["la_comm"]] == pytest.approx(want, rel=1e-6)  # float32 features
    assert want > 0.1  # a real transfer, not a rounding


def test_la_over_flags_a_window_that_overflows_a_device():
    """a -> b -> c, a on gpu0. b fits on either device; the window then places c by the earliest-finish rule.
    With b on gpu0, c fits on gpu1; with b on gpu1 (little memory), c fits nowhere: la_over = 1 there only."""
    nodes = [{"name": n, "fwd_flops": 1e9, "out_bytes": 16.0, "param_bytes": p} for n, p in
             (("a", 1e8), ("b", 1e8), ("c", 1.5e8))]
    g = make_graph(nodes, [("a", "b", 16.0), ("b", "c", 16.0)])
    sm = static_memory(g)
    cap0 = sm[0] + sm[1] + 0.1 * sm[2]  # a + b fit on gpu0, a + c do not
    cap1 = sm[2] + 0.5 * sm[1]  # c alone fits on gpu1, b + c do not; b alone fits
    assert sm[1] < cap1 < sm[1] + sm[2] and sm[0] + sm[2] > cap0
    topo = _topology([], [cap0, cap1])
    f, _, st = _features(g, topo, [0], window=1)
    _, mask = st.features()
    assert mask[0].tolist() == [True, True]
    assert f[0, COL["la_over"]] == 0.0 and f[1, COL["la_over"]] == 1.0


def test_cons_link_is_the_log_time_per_byte_to_the_consumers_other_inputs():
    """u, v -> w; u on gpu2. Deciding v: its consumer w's other input lives on gpu2, so cons_link[d] =
    log1p(tpb[d, 2]) with tpb the link's time per MiB (latency / MiB + 1 / bandwidth) over the fastest link's:
    0 on gpu2 itself, log1p(1) over the fastest link, more over a slower one. prod_link is 0 (no producer)."""
    g = make_graph([{"name": "u", "fwd_flops": 1e9, "out_bytes": 1e6}, {"name": "v", "fwd_flops": 1e9, "out_bytes": 1e6},
                    {"name": "w", "fwd_flops": 1e9}], [("u", "w", 1e6), ("v", "w", 3e6)])
    links = [("gpu0", "gpu2", 5e10, 2e-6), ("gpu1", "gpu2", 5e9, 2e-5), ("gpu0", "gpu1", 2.5e10, 5e-6)]
    topo = _topology(links, [1e10] * 3)
    f, _, _ = _features(g, topo, [2], window=0)
    per = {frozenset((a, b)): lat / 2**20 + 1 / bw for a, b, bw, lat in links}
    fastest = min(per.values())
    want = [np.log1p(per[frozenset(("gpu0", "gpu2"))] / fastest), np.log1p(per[frozenset(("gpu1", "gpu2"))] / fastest),
            0.0]
    np.testing.assert_allclose(f[:, COL["cons_link"]], want, rtol=1e-6)  # float32 features
    assert want[1] > want[0] > 0.0
    np.testing.assert_array_equal(f[:, COL["prod_link"]], 0.0)


def test_the_sampler_draws_every_link_pattern_and_links_that_differ_pair_by_pair():
    """Over 300 draws every pattern of ``PATTERNS`` appears (each at least 5%), and a drawn hybrid mesh has links
    of different bandwidths inside one host: a policy trained on these sees devices that differ only in links."""
    seen = {p: 0 for p in PATTERNS}
    mesh = None
    for s in range(300):
        topo = random_topology(np.random.default_rng(s), (4, 12))
        name = next((p for p in PATTERNS[1:] if p in topo.name), "uniform")
        seen[name] += 1
        if name == "hybrid_mesh" and mesh is None:
            mesh = topo
    assert all(v >= 15 for v in seen.values()), seen
    assert mesh is not None
    costs_bw = mesh.link_bandwidth_matrix() if hasattr(mesh, "link_bandwidth_matrix") else None
    if costs_bw is None:
        g = make_graph([{"name": "x", "fwd_flops": 1.0}], [])
        costs_bw = resolve_costs(g, mesh).link_bandwidth
    hosts = np.array([d.host for d in mesh.devices])
    gpus = np.array([d.kind == "gpu" for d in mesh.devices])
    same = (hosts[:, None] == hosts[None, :]) & gpus[:, None] & gpus[None, :] & ~np.eye(len(hosts), dtype=bool)
    assert len(np.unique(np.round(costs_bw[same], -6))) >= 2
