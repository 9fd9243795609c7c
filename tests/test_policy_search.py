"""Policy-guided search: its start, its repairs (the decode kernel's SAMPLE / FORCED / stop), its accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl.agents.constructive_config import default_checkpoint, load_policy
from placement_rl.agents.fast_decode import Head
from placement_rl.agents.constructive import graph_tensors
from placement_rl.agents.constructive_eval import warm_kernels
from placement_rl.agents.policy_search import policy_search
from placement_rl.baselines.common import Problem
from placement_rl.baselines.eft import la_rule_devices
from placement_rl.baselines.search import anneal
from placement_rl.cost import resolve_costs, simulate
from placement_rl.cost.decode import FORCED, POLICY, SAMPLE, decode
from placement_rl.cost.schedule import ScheduleState
from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.errors import ConfigError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    pol, _, _ = load_policy(default_checkpoint(), log=lambda *_: None)
    g, c, t = _case("layered", 30, "4x_v100_nvlink", 0)
    warm_kernels(pol)  # numba compiles (or loads) the decode kernels here, not inside a search's seconds
    policy_search(pol, g, c, t, seconds=0.05, seed=0)
    return pol


def _case(family: str, n: int, topo: str, seed: int):
    g = synthetic.sample(family, num_nodes=n, seed=seed)
    t = load_topology(topo)
    return g, resolve_costs(g, t), t


@pytest.mark.parametrize("case", [("layered", 60, "4x_v100_nvlink", 1), ("dataflow", 80, "2x4_v100_ib", 2),
                                  ("transformer_like", 70, "cpu_2gpu", 3)])
def test_policy_search_never_worse_than_its_starts_and_reports_what_it_ran(policy, case):
    """The result is never slower than the policy's greedy placements (at the windows that fitted its start's
    seconds) nor ``la_rule``'s (the rule's when the greedy left room for it), its
    ``step_time`` is ``simulate``'s of the placement it returns, the anytime trace only improves, and calls count
    at least the starts' completions."""
    g, c, t = _case(*case)
    p = policy_search(policy, g, c, t, seconds=0.3, seed=0)
    assert "start_cut" not in p.meta  # a greedy decode of 60-80 nodes takes milliseconds
    dev = np.asarray(p.device_of_node)
    res = simulate(g, c, t, dev)
    assert res.feasible and p.meta["feasible"]
    assert res.step_time == pytest.approx(p.meta["step_time"], rel=1e-9)
    rule = simulate(g, c, t, la_rule_devices(g, c, t)[0]).step_time
    task = ConstructiveTask(g, t, c)
    with torch.no_grad():
        h = policy.embed(*graph_tensors(task)).double().numpy()
    # the policy's start: the best of its whole greedy decodes at the windows that fitted (its placing window too)
    windows = p.meta["start_windows"]
    assert [g.num_nodes, g.num_nodes] in windows and all(done == g.num_nodes for _, done in windows)
    greedy = np.inf
    for w, _ in windows:
        st = ScheduleState(g, c, t, episodes=1, window=w)
        decode(st, POLICY, Head(policy, h).arrays())
        greedy = min(greedy, float(st.finish()[0]))
    # then the policy's greedy on slower views of the links, at the largest whole window, while they fitted
    from placement_rl.baselines.eft import LINK_SCALES, link_scaled_devices

    scaled = [x for x in p.meta["starts"] if x.startswith("links x")]
    assert p.meta["starts"] in (["policy", *scaled], ["policy", *scaled, "la_rule"])
    assert scaled == [f"links x{s:g}" for s in LINK_SCALES[:len(scaled)]]
    w = max(w for w, _ in windows)
    for s in LINK_SCALES[:len(scaled)]:
        dev_ = link_scaled_devices(g, c, t, POLICY, Head(policy, h).arrays(), window=w, scale=s)
        greedy = min(greedy, simulate(g, c, t, dev_).step_time)
    taken = min(rule, greedy) if "la_rule" in p.meta["starts"] else greedy
    assert p.meta["start_time"] == pytest.approx(taken, rel=1e-9)
    assert res.step_time <= taken * (1 + 1e-9)
    times = [x[2] for x in p.meta["trace"]]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:]))
    calls = [x[1] for x in p.meta["trace"]]
    assert calls == sorted(calls) and calls[-1] <= p.meta["sim_calls"]
    assert p.meta["sim_calls"] >= len(p.meta["starts"]) * g.num_nodes * t.num_devices


def test_the_rules_start_is_taken_only_when_the_greedy_leaves_room(policy, monkeypatch):
    """``RULE_START_SHARE``: la_rule's start too when the policy's greedy took at most that share of the seconds."""
    import placement_rl.agents.policy_search as ps

    g, c, t = _case("dataflow", 80, "2x4_v100_ib", 2)
    monkeypatch.setattr(ps, "RULE_START_SHARE", 0.0)
    starts = policy_search(policy, g, c, t, seconds=0.2, seed=0).meta["starts"]
    assert starts[0] == "policy" and "la_rule" not in starts  # (the link-scaled greedy ones between)
    monkeypatch.setattr(ps, "RULE_START_SHARE", 1e9)
    assert policy_search(policy, g, c, t, seconds=0.2, seed=0).meta["starts"][-1] == "la_rule"


def test_when_nothing_fits_memory_policy_search_returns_the_placement_that_overflows_least(policy):
    """One node pins half of what the graph pins and more than any device holds (the devices together hold twice
    the graph): no placement fits. Like every other search, ``policy_search`` then returns the least overflow it
    simulated (the annealing tries ``m_topo``'s memory-balanced split when its start overflows), not its start, and
    says the result does not fit."""
    from placement_rl.baselines import baechi
    from placement_rl.baselines.common import Problem
    from placement_rl.cost.simulate import static_memory
    from placement_rl.topology import DeviceTopology

    g = synthetic.sample("layered", num_nodes=60, seed=3)
    pins = static_memory(g)
    params = np.array(g.param_bytes, dtype=np.float64)
    params[int(np.argmax(pins))] += pins.sum() / 6  # 4 x params: that node now pins about half of the graph
    g = g.replace(param_bytes=list(params))
    pins = static_memory(g)
    base = load_topology("4x_v100_nvlink").to_dict()
    base["devices"] = [{**d, "memory_bytes": 0.99 * float(pins.max())} for d in base["devices"]]
    t = DeviceTopology.from_dict(base)
    c = resolve_costs(g, t)
    assert 4 * 0.99 * pins.max() > pins.sum()  # the devices hold the graph; its largest node fits on none
    p = policy_search(policy, g, c, t, seconds=1.0, seed=0)
    prob = Problem(g, c, t, budget=10, seed=0)
    got = prob.score(np.asarray(p.device_of_node))
    assert not got.feasible and not p.meta["feasible"]
    assert p.meta["step_time"] == pytest.approx(got.step_time, rel=1e-9)
    assert got.overflow <= prob.score(baechi.m_topo(prob)).overflow * (1 + 1e-9)
    assert got.overflow < prob.score(np.asarray(la_rule_devices(g, c, t)[0])).overflow  # a one-pass rule's spread


def test_policy_search_refuses_bad_budgets_in_one_line(policy):
    g, c, t = _case("layered", 20, "4x_v100_nvlink", 0)
    for kw in ({"seconds": 0}, {"seconds": 1, "samples": 0}, {"seconds": 1, "temperature": 0},
               {"seconds": 1, "completion": "random"}):
        with pytest.raises(ConfigError):
            policy_search(policy, g, c, t, **kw)


def test_rule_completed_repairs_are_the_ablation_of_the_learned_completion(policy):
    """``completion="la_rule"``: the same search whose repairs the rule completes; it still never returns worse than
    its start and says which completion ran."""
    g, c, t = _case("dataflow", 60, "4x_v100_nvlink", 1)
    for completion in ("policy", "la_rule"):
        p = policy_search(policy, g, c, t, seconds=0.3, seed=0, completion=completion, anneal_share=0.5)
        assert p.meta["completion"] == completion and p.meta["batches"] > 0
        assert p.meta["step_time"] <= p.meta["start_time"] * (1 + 1e-12)
        assert simulate(g, c, t, np.asarray(p.device_of_node)).step_time == pytest.approx(p.meta["step_time"])


def test_sampled_repairs_replay_the_prefix_and_repeat_with_the_seed(policy):
    """A repair replays the incumbent's first ``s`` decisions exactly (FORCED up to ``stop``), and SAMPLE with one
    seed gives the same devices twice; its state's step times equal ``simulate``'s."""
    g, c, t = _case("dataflow", 50, "4x_v100_nvlink", 4)
    task = ConstructiveTask(g, t, c)
    with torch.no_grad():
        h = policy.embed(*graph_tensors(task)).double().numpy()
    head = Head(policy, h).arrays()
    inc = la_rule_devices(g, c, t)[0]
    runs = []
    for _ in range(2):
        st = ScheduleState(g, c, t, episodes=6, window=16)
        decode(st, FORCED, stop=20, forced=inc)
        decode(st, SAMPLE, head, stop=28, temperature=2.0, seed=7)
        decode(st, POLICY, head)
        runs.append(st.devices.copy())
        order = st.order[:20]
        assert np.all(st.devices[:, order] == inc[order])
        for k in range(6):
            assert st.finish()[k] == pytest.approx(simulate(g, c, t, st.devices[k]).step_time, rel=1e-9)
    assert np.array_equal(runs[0], runs[1])


def test_anneal_takes_large_moves_through_its_acceptance_and_charges_them():
    """``anneal(large=...)`` calls the proposal within its time share, charges what it charges, and keeps a
    better proposal (here: the better of two fixed placements, offered from a worse start)."""
    g, c, t = _case("layered", 40, "4x_v100_nvlink", 5)
    good = la_rule_devices(g, c, t)[0]
    bad = np.zeros(g.num_nodes, dtype=np.int64)
    seen = []

    def large(cur, rng):
        seen.append(1)
        prob.charge(3)
        return good.copy()

    prob = Problem(g, c, t, budget=200, seed=0)
    s0 = prob.score(bad)
    out = anneal(prob, bad, s0, large=large, large_share=0.5)
    assert seen and prob.calls >= 3 * len(seen)
    assert simulate(g, c, t, out).step_time <= simulate(g, c, t, good).step_time * (1 + 1e-9)


def test_adapted_share_follows_the_gains_and_falls_back_to_the_prior():
    """``anneal(adapt=True)``'s share of the large moves: the floor when only the single-node moves gain, the
    ceiling when only the large ones do, the prior when neither does, in between when both do at equal rates; and
    an annealing with large moves that never gain records a share within the bounds."""
    from placement_rl.baselines import search

    lo, hi = search.ADAPT_MIN, search.ADAPT_MAX
    assert search.adapted_share({True: [0.0, 0.2], False: [0.05, 0.8]}, 0.2) == pytest.approx(lo)
    assert search.adapted_share({True: [0.05, 0.2], False: [0.0, 0.8]}, 0.2) == pytest.approx(hi)
    assert search.adapted_share({True: [0.0, 0.2], False: [0.0, 0.8]}, 0.2) == pytest.approx(0.2)
    both = search.adapted_share({True: [0.01, 0.2], False: [0.04, 0.8]}, 0.2)
    assert both == pytest.approx(0.5, abs=0.01)
    weak = search.adapted_share({True: [0.0, 0.2], False: [search.ADAPT_GAIN, 0.8]}, 0.3)
    assert weak == pytest.approx(0.15)  # as much gain seen as the prior weighs: halfway from the prior to 0

    g, c, t = _case("layered", 60, "4x_v100_nvlink", 5)
    start = la_rule_devices(g, c, t)[0]
    prob = Problem(g, c, t, budget=10**9, seed=0, seconds=0.3)
    rng0 = np.random.default_rng(1)

    def useless(cur, rng):  # a random placement: never a new best
        prob.charge(1)
        return rng0.integers(t.num_devices, size=g.num_nodes)

    anneal(prob, start, prob.score(start), large=useless, large_share=0.3, adapt=True)
    assert lo <= prob.meta["large_share_end"] <= hi


def test_starts_over_memory_are_weighed_as_fitted(policy, monkeypatch):
    """On a memory-tight cluster where the policy's starts overflow, ``policy_search`` weighs every start it took as
    ``memory.fit`` makes it fit (``memory.best_start``, as ``la_rule_search`` does), and its result fits."""
    from conftest import tight_topology

    from placement_rl.baselines import memory

    g = synthetic.sample("dataflow", num_nodes=150, seed=4)
    t = tight_topology("4x_v100_nvlink", 0.7, g)
    c = resolve_costs(g, t)
    seen = []

    def spy(prob, scored):
        seen.append(len(scored))
        return best_start(prob, scored)

    best_start = memory.best_start
    monkeypatch.setattr(memory, "best_start", spy)
    p = policy_search(policy, g, c, t, seconds=1.0, seed=0)
    assert seen and 2 <= seen[0] <= len(p.meta["starts"]) and p.meta["feasible"]
    assert simulate(g, c, t, p.device_of_node).feasible


def test_a_start_cut_by_the_seconds_is_never_worse_than_the_earliest_finish(policy):
    """Seconds too short for the greedy decode: the greedy stops at once (``start_cut``), ``sim_eft``'s placement is
    a start too, and the result is no slower than it."""
    from placement_rl.baselines.eft import sim_eft_devices

    g, c, t = _case("dataflow", 80, "2x4_v100_ib", 2)
    p = policy_search(policy, g, c, t, seconds=1e-5, seed=0)
    assert p.meta["start_cut"]["rule"] == "policy" and p.meta["start_cut"]["lookahead_steps"] < g.num_nodes
    assert p.meta["starts"] == ["policy", "sim_eft"]
    eft = simulate(g, c, t, sim_eft_devices(g, c, t)).step_time
    assert simulate(g, c, t, p.device_of_node).step_time == p.meta["step_time"] <= eft * (1 + 1e-9)


def test_a_repair_is_shortened_to_the_suffix_its_seconds_allow():
    """``suffix_start``: the drawn start when its suffix fits ``pace`` of the seconds left, else the earliest start
    whose suffix does, and none when not one decision does."""
    from placement_rl.agents.policy_search import suffix_start

    assert suffix_start(700, 1000, 1e-3, 2.0, 0.5) == 700  # 300 decisions: 0.3 s, within 1 s
    assert suffix_start(100, 1000, 1e-3, 0.2, 0.5) == 900  # 0.1 s: 100 decisions at most
    assert suffix_start(950, 1000, 1e-3, 0.2, 0.5) == 950
    assert suffix_start(0, 1000, 1e-3, 1e-3, 0.5) is None  # not one decision in 0.5 ms
    assert suffix_start(0, 1000, 1e-3, -1.0, 0.5) is None  # the seconds are gone


def test_anneal_makes_a_single_move_when_the_large_move_has_none():
    """A proposal that returns ``None`` (no repair fits the seconds) costs the walk nothing: it goes on with
    single-node moves and still improves a poor start."""
    g, c, t = _case("layered", 40, "4x_v100_nvlink", 5)
    bad = np.zeros(g.num_nodes, dtype=np.int64)
    asked = []

    def large(cur, rng):
        asked.append(1)
        return None

    prob = Problem(g, c, t, budget=300, seed=0)
    s0 = prob.score(bad)
    out = anneal(prob, bad, s0, large=large, large_share=0.5)
    assert asked and prob.calls >= 300
    assert simulate(g, c, t, out).step_time < s0.step_time


@pytest.mark.parametrize("seconds", [0.3, 2.0])  # below side_by_side.FROM_SECONDS here, from it side by side
def test_place_search_seconds_notes_a_search_that_refuses_and_runs_the_rest(policy, monkeypatch, tmp_path, seconds,
                                                                            capfd):
    """``place search_seconds=S``: a comparison search that refuses the problem (``exhaustive`` on 40 nodes here;
    ``la_rule_search`` did above 4,000 nodes until the rule ran at any size) is a note, not the end of the command:
    the other searches' rows, files and summary come out (before, its ``ConfigError`` ended ``place`` after the
    zero-shot placement). Side by side, the refusing search does not end its worker while it loads its kernels (it
    did: the searches left then ran one after another, ``local_search`` past its seconds on a loaded machine)."""
    from placement_rl.cli import place_search
    from placement_rl.cli.common import Phases

    g, c, t = _case("dataflow", 40, "2x4_v100_ib", 5)
    monkeypatch.setattr(place_search, "SAME_SECONDS", ("exhaustive", "local_search"))
    found = place_search.run_searches(policy, g, c, t, ConstructiveTask(g, t, c), seconds, seed=0, compare=True,
                                      phases=Phases(False))
    assert set(found) == {"policy_search", "exhaustive", "local_search"}
    assert "exhaustive search needs more" in found["exhaustive"]["refused"]
    assert set(place_search.done(found)) == {"policy_search", "local_search"}
    assert "side by side:" not in capfd.readouterr().err  # no worker was lost
    assert found["local_search"]["feasible"] and found["local_search"]["seconds"] < 2 * seconds + 1.0
    files = place_search.write(found, g, t, tmp_path, seconds, learned=found["policy_search"]["step_time"])
    assert all((tmp_path / f).exists() for f in files)
    line = place_search.summary(found)
    assert "at the same seconds local_search" in line and "exhaustive refused: exhaustive search needs more" in line
    assert place_search.metrics(found)["exhaustive"] == {"refused": found["exhaustive"]["refused"]}
