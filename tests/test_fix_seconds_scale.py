"""Placers and bounds at scale and within their seconds: the device classes on hundreds of devices (the same classes
as the swap-by-swap check), ``exhaustive`` refusing a large cluster at once, ``cp_sat`` and the ``cp`` bound held to
their seconds with the model's building counted (and saying where CP-SAT did not run or proved nothing), and
``la_rule_links`` starting no view that does not fit in its seconds."""

from __future__ import annotations

import itertools
import time
import types

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.baselines import eft, search
from placement_rl.baselines.common import Problem
from placement_rl.cost import resolve_costs
from placement_rl.errors import ConfigError
from placement_rl.graph import synthetic
from placement_rl.topology import DeviceTopology, load_topology, preset_names


def _pairwise_classes(prob) -> np.ndarray:
    """The classes by one swap at a time, each checked on whole copies of the link matrices (the reference)."""
    d = prob.d
    c, cap = prob.costs, prob.capacity
    cls = np.arange(d)
    for a in range(d):
        for b in range(a + 1, d):
            if cls[b] != b:
                continue
            perm = np.arange(d)
            perm[a], perm[b] = b, a
            same = (np.array_equal(c.fwd_time[:, a], c.fwd_time[:, b])
                    and np.array_equal(c.bwd_time[:, a], c.bwd_time[:, b]) and cap[a] == cap[b]
                    and np.array_equal(c.link_latency[np.ix_(perm, perm)], c.link_latency)
                    and np.array_equal(c.link_bandwidth[np.ix_(perm, perm)], c.link_bandwidth))
            if same:
                cls[b] = cls[a]
    return cls


def _table(fwd, lat, bw, cap):
    """A stand-in problem with just what ``device_classes`` reads."""
    costs = types.SimpleNamespace(fwd_time=fwd, bwd_time=2 * fwd, link_latency=lat, link_bandwidth=bw)
    return types.SimpleNamespace(d=fwd.shape[1], costs=costs, capacity=np.asarray(cap, dtype=np.float64))


def _hosts_table(rng: np.random.Generator):
    """Hosts of unequal sizes, two device kinds and capacities, faster or one-way links between some pairs, a
    random link matrix, NaN in a time, a link or a capacity, or -0.0 latencies."""
    sizes = rng.integers(1, 6, size=int(rng.integers(1, 6)))
    d = int(sizes.sum())
    host = np.repeat(np.arange(len(sizes)), sizes)
    same = host[:, None] == host[None, :]
    lat, bw = np.where(same, 1e-5, 2e-5), np.where(same, 100.0, 10.0)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, np.inf)
    kinds = rng.integers(0, 2, size=d) if rng.random() < 0.5 else np.zeros(d, dtype=np.int64)
    fwd = rng.choice([1.0, 2.0], size=(int(rng.integers(1, 5)), 2))[:, kinds]
    cap = rng.choice([1.0, 1.0, 1.0, 2.0], size=d)
    r = rng.random()
    if r < 0.3:
        for _ in range(int(rng.integers(1, 4))):
            i, j = rng.integers(0, d, 2)
            if i != j:
                bw[i, j] = v = float(rng.choice([50.0, 200.0]))
                if rng.random() < 0.7:
                    bw[j, i] = v
    elif r < 0.4:
        bw = rng.choice([1.0, 2.0], size=(d, d))
        np.fill_diagonal(bw, np.inf)
    elif r < 0.45:
        lat[rng.integers(d), rng.integers(d)] = np.nan
    elif r < 0.5:
        fwd[0, rng.integers(d)] = np.nan
    elif r < 0.55:
        lat = np.where(lat == 0, -0.0, lat)
        lat[0, 0] = 0.0
    elif r < 0.6:
        cap[rng.integers(d)] = np.nan
    return _table(fwd, lat, bw, cap)


def test_device_classes_equal_the_swap_by_swap_check():
    """On every preset, 30 random clusters and 300 hand-made tables (hosts of unequal sizes, heterogeneous and one-way
    links, NaN, -0.0) the grouped, vectorised classes are exactly the swap-by-swap ones."""
    from envs.topology_sampler import random_topology

    g = synthetic.sample("layered", num_nodes=8, seed=0)
    probs = []
    for name in preset_names():
        try:
            t = load_topology(name)
        except Exception:  # e.g. a preset read from this machine
            continue
        probs.append(Problem(g, resolve_costs(g, t), t, budget=1, seed=0))
    for s in range(30):
        t = random_topology(np.random.default_rng(s), (2, 20))
        probs.append(Problem(g, resolve_costs(g, t), t, budget=1, seed=0))
    probs += [_hosts_table(np.random.default_rng(s)) for s in range(300)]
    for k, prob in enumerate(probs):
        assert search.device_classes(prob).tolist() == _pairwise_classes(prob).tolist(), k


def _cluster(hosts: int, per_host: int = 8) -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": f"h{hosts}x{per_host}",
        "devices": [dict(name=f"h{h}_gpu", count=per_host, kind="gpu", host=h, peak_flops=100e12,
                         mem_bandwidth=3e12, memory_bytes=80e9) for h in range(hosts)],
        "links": {"intra_host": {"bandwidth": 300e9, "latency": 5e-6},
                  "inter_host": {"bandwidth": 50e9, "latency": 2e-5}}})


def test_device_classes_of_512_devices_are_their_hosts():
    """512 devices in hosts of 8: one class per host (devices on two hosts do not swap), in well under the 20 s
    allowed here (the swap-by-swap check took minutes)."""
    g, t = synthetic.sample("layered", num_nodes=6, seed=0), _cluster(64)
    prob = Problem(g, resolve_costs(g, t), t, budget=1, seed=0)
    t0 = time.perf_counter()
    cls = search.device_classes(prob)
    assert time.perf_counter() - t0 < 20.0
    assert cls.tolist() == [8 * (k // 8) for k in range(512)]


def test_exhaustive_refuses_a_large_cluster_before_working_out_its_classes(monkeypatch):
    """Over the budget even were all 128 devices alike: the refusal names the size without the classes."""
    def no_classes(prob):
        raise AssertionError("device classes worked out for a refusal")

    monkeypatch.setattr(search, "device_classes", no_classes)
    g, t = synthetic.sample("layered", num_nodes=12, seed=0), _cluster(16)
    with pytest.raises(ConfigError, match=r"needs more than 5000 simulations .* on 128 devices \(128\^12"):
        baselines.get("exhaustive")(g, resolve_costs(g, t), t, budget=5000, seed=0)


def test_exhaustive_still_enumerates_within_the_budget():
    """Where the classes bring the count within the budget, the enumeration runs as before: the optimum."""
    g, t = synthetic.sample("layered", num_nodes=5, seed=1), _cluster(1, per_host=3)
    c = resolve_costs(g, t)
    p = baselines.get("exhaustive")(g, c, t, budget=3**5, seed=0)
    assert p.meta["exhaustive"] and p.meta["sim_calls"] == search.count_placements(5, [3])


def _old_link_keys(key, pair):
    """``bounds_cp._link_keys`` one relabelling at a time (the reference)."""
    from placement_rl.baselines.bounds_cp import ORBIT_MAX_DEVICES

    nd = len(key)
    _, sig = np.unique(pair.reshape(pair.shape[0], nd * nd).T, axis=0, return_inverse=True)
    sig = np.asarray(sig).reshape(nd, nd)
    assert nd <= ORBIT_MAX_DEVICES
    kept = [np.asarray(q) for q in itertools.permutations(range(nd))
            if np.array_equal(key[list(q)], key) and np.array_equal(sig[np.ix_(q, q)], sig)]
    first = np.array([min({int(q[d]) for q in kept} | {d}) for d in range(nd)], dtype=np.int64)
    return first, np.stack([next(q for q in kept if q[d] == first[d]) for d in range(nd)])


def test_link_keys_equal_the_enumeration_one_relabelling_at_a_time():
    """The orbits and relabellings of ``_link_keys`` (all relabellings at once) are the one-at-a-time ones."""
    pytest.importorskip("ortools")
    from placement_rl.baselines.bounds_cp import _link_keys

    for s in range(60):
        rng = np.random.default_rng(s)
        nd = int(rng.integers(2, 8)) if s else 8
        key = rng.integers(0, int(rng.integers(1, 3)), size=nd).astype(np.int64)
        host = np.sort(rng.integers(0, int(rng.integers(1, 4)), size=nd))
        base = np.where(host[:, None] == host[None, :], 1.0, 3.0)
        for _ in range(int(rng.integers(0, 3))):
            i, j = rng.integers(0, nd, 2)
            base[i, j] = 2.0
        np.fill_diagonal(base, 0.0)
        pair = base[None] * rng.choice([1.0, 2.0], size=(3, 1, 1))
        got, want = _link_keys(key, pair), _old_link_keys(key, pair)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist(), s


def _slow_fifo(monkeypatch, pause: float):
    """Building the model's device order takes ``pause`` seconds longer (a model that builds slowly)."""
    from placement_rl.baselines import bounds_cp

    real = bounds_cp._fifo

    def slow(*args, **kwargs):
        time.sleep(pause)
        return real(*args, **kwargs)

    monkeypatch.setattr(bounds_cp, "_fifo", slow)


def test_cp_sat_does_not_solve_a_model_built_past_its_seconds(monkeypatch):
    """A model whose building runs past the seconds is not solved (CP-SAT would run past them): the hint comes
    back, and the note says CP-SAT did not run."""
    pytest.importorskip("ortools")
    g, t = synthetic.sample("dataflow", num_nodes=20, seed=3), load_topology("4x_v100_nvlink")
    c = resolve_costs(g, t)
    _slow_fifo(monkeypatch, 1.2)
    p = baselines.get("cp_sat")(g, c, t, budget=10**6, seed=0, seconds=1.0)
    assert p.meta["note"].startswith("CP-SAT not run: its starts and model of 20 nodes on 4 devices took the 1 s")
    assert p.meta["cp_bound"] is None and not p.meta["cp_improved"]


def test_the_cp_bound_says_when_cp_sat_did_not_run(monkeypatch):
    """The ``cp`` part whose models are built past its seconds proves nothing and says why."""
    pytest.importorskip("ortools")
    from placement_rl.baselines.bounds_cp import cp_bound
    from placement_rl.baselines.eft import sim_eft_devices

    g, t = synthetic.sample("dataflow", num_nodes=12, seed=3), load_topology("4x_v100_nvlink")
    c = resolve_costs(g, t)
    start = sim_eft_devices(g, c, t)
    upper = Problem(g, c, t, budget=2, seed=0).score(start).step_time
    _slow_fifo(monkeypatch, 1.2)
    got = cp_bound(g, c, t, upper=upper, seconds=1.0, hint=start, workers=1)
    assert got.bound == 0.0 and got.placement is None
    assert got.note == "CP-SAT did not run: building its model of 12 nodes on 4 devices took its 1 s"


def test_lower_bound_carries_the_cp_parts_note(monkeypatch):
    """``place`` prints the cp part's note from the ``Bound`` (it said nothing when CP-SAT proved nothing)."""
    pytest.importorskip("ortools")
    from placement_rl.baselines.bounds import lower_bound

    g, t = synthetic.sample("dataflow", num_nodes=12, seed=3), load_topology("4x_v100_nvlink")
    _slow_fifo(monkeypatch, 1.2)
    got = lower_bound(g, resolve_costs(g, t), t, cp_seconds=1.0)
    assert got.cp_note.startswith("CP-SAT did not run") and got.cp_placement is None


def test_the_cp_bound_notes_nothing_when_it_proves_a_bound_and_places():
    """A small model CP-SAT solves: a bound, a placement, no note."""
    pytest.importorskip("ortools")
    from placement_rl.baselines.bounds_cp import _note, cp_bound
    from placement_rl.baselines.eft import sim_eft_devices

    g, t = synthetic.sample("layered", num_nodes=6, seed=0), load_topology("2x_k80")
    c = resolve_costs(g, t)
    start = sim_eft_devices(g, c, t)
    upper = Problem(g, c, t, budget=2, seed=0).score(start).step_time
    got = cp_bound(g, c, t, upper=upper, seconds=10.0, hint=start, workers=1)
    assert got.bound > 0 and got.placement is not None and got.note == ""
    assert _note(5.0, 300, 8, ran=True, proved=False, placed=False, linked=False) == (
        "CP-SAT proved no lower bound above the known one and found no placement in 5 s (300 nodes on 8 devices)")


def test_la_rule_links_starts_no_view_past_its_seconds(monkeypatch):
    """Where the plain rule took over half the seconds, another decode (a view) would run past them: none starts.
    Without seconds every view runs, as before."""
    g, t = synthetic.sample("layered", num_nodes=30, seed=0), load_topology("2x4_v100_ib")
    c = resolve_costs(g, t)
    real = eft.la_rule

    def slow_rule(prob, share=1.0):
        out = real(prob, share)
        time.sleep(max(0.0, 0.55 * prob.seconds - prob.elapsed))
        return out

    monkeypatch.setattr(eft, "la_rule", slow_rule)
    p = baselines.get("la_rule_links")(g, c, t, budget=10**6, seed=0, seconds=2.0)
    assert p.meta["link_scales"] == [1.0]
    monkeypatch.setattr(eft, "la_rule", real)
    p = baselines.get("la_rule_links")(g, c, t, budget=10**6, seed=0)
    assert p.meta["link_scales"] == [1.0, *eft.LINK_SCALES]
