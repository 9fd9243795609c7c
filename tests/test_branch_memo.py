"""The branch memo of the window features (``placement_rl.cost.window.window_stats``): with a window that reaches
the end of the order, one branch of every step is the previous step's branch of the device the episode took, and
is copied instead of recomputed. The features must be the ones computed without the memo, bit for bit: on
several episodes that take different devices (the earliest finish, random ones, devices the memory mask rules
out), with a window that reaches the end only in its tail, after a reset, and in a state branched from another."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.cost import resolve_costs
from placement_rl.cost.schedule import ScheduleState
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

from conftest import tight_topology


def _without_memo(st: ScheduleState) -> ScheduleState:
    st._memo_i = np.zeros((st.episodes, 0), np.int64)
    st._memo_stats = np.zeros((st.episodes, 0, 6))
    return st


def _actions(rng, feats, mask):
    """Episode 0: the earliest finish; 1: a random allowed device; 2: any device (masked ones too)."""
    k, nd = mask.shape
    out = np.zeros(k, np.int64)
    out[0] = int(np.argmin(np.where(mask[0], feats[0, :, 1], np.inf)))
    out[1] = int(rng.choice(np.flatnonzero(mask[1])))
    out[2:] = rng.integers(0, nd, size=k - 2)
    return out


CASES = [  # family, nodes, seed, topology, window, memory-tight
    ("layered", 60, 0, "8x_a100_nvswitch", 60, False),  # the window reaches the end at every step
    ("dataflow", 70, 1, "4x_v100_nvlink", 70, True),  # memory masks devices out
    ("series_parallel", 80, 2, "cpu_2gpu", 12, False),  # only the last 13 steps reach the end
    ("transformer_like", 64, 3, "2x4_v100_ib", 24, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_memo_gives_the_features_computed_without_it(case) -> None:
    family, n, seed, topo_name, window, tight = case
    g = synthetic.sample(family, num_nodes=n, seed=seed)
    topo = tight_topology(topo_name, 0.6, g) if tight else load_topology(topo_name)
    costs = resolve_costs(g, topo)
    a = ScheduleState(g, costs, topo, episodes=3, window=window)
    b = _without_memo(ScheduleState(g, costs, topo, episodes=3, window=window))
    rng = np.random.default_rng(seed)
    kept = 0
    for restart in range(2):  # the second pass after a reset (the memo of the first must not leak into it)
        a.reset()
        b.reset()
        while not a.done:
            fa, ma = a.features()
            fb, mb = b.features()
            np.testing.assert_array_equal(fa, fb)
            np.testing.assert_array_equal(ma, mb)
            full = a.step + 1 + window >= n
            assert (a._memo_i[:, 0] == (a.step if full else -1)).all()
            kept += int(full)
            act = _actions(rng, fa, ma)
            a.place(act)
            b.place(act)
        np.testing.assert_array_equal(a.finish(), b.finish())
    assert kept > 0


def test_memo_travels_with_a_branched_state() -> None:
    """``branch_from`` copies an episode with its memo (the policy-iteration teacher branches states mid-way);
    a branch then placed on every device continues with the features computed without the memo."""
    g = synthetic.sample("dataflow", num_nodes=50, seed=5)
    topo = load_topology("4x_v100_nvlink")
    costs = resolve_costs(g, topo)
    main = ScheduleState(g, costs, topo, episodes=1, window=50)
    for _ in range(20):
        f, m = main.features()
        main.place(int(np.argmin(np.where(m[0], f[0, :, 1], np.inf))))
    main.features()  # its memo now holds step 20's rows
    branch = ScheduleState(g, costs, topo, episodes=4, window=50)
    plain = _without_memo(ScheduleState(g, costs, topo, episodes=4, window=50))
    branch.branch_from(main, 0)
    plain.branch_from(_without_memo(main), 0)
    assert (branch._memo_i[:, 0] == 20).all()
    trial = np.arange(4)
    branch.place(trial)
    plain.place(trial)
    while not branch.done:
        fa, ma = branch.features()
        fb, mb = plain.features()
        np.testing.assert_array_equal(fa, fb)
        np.testing.assert_array_equal(ma, mb)
        act = np.argmin(np.where(ma, fa[:, :, 1], np.inf), axis=1)
        branch.place(act)
        plain.place(act)
