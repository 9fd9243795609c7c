"""The greedy decode with each decision's device branches on threads (``placement_rl.cost.split``) places exactly
what the serial kernel places: from a fresh state and from the middle of one, with the whole-graph window and a
truncated one, on devices that split unevenly over the threads, and where memory masks devices out."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from placement_rl.agents.constructive import graph_tensors, state_window
from placement_rl.agents.constructive_train import ConstructiveConfig, build_policy
from placement_rl.agents.fast_decode import Head, complete_greedy, greedy_devices
from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.cost import resolve_costs
from placement_rl.cost.schedule import ScheduleState
from placement_rl.cost.split import MIN_WORK, THREADS_ENV, decode_split, split_threads, threads_asked
from placement_rl.errors import ConfigError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

from conftest import tight_topology


def _policy(seed: int, window: int):
    torch.manual_seed(seed)
    return build_policy(ConstructiveConfig(window=window, seed=seed)).eval()


def _task(family, n, seed, topo, window, policy):
    g = synthetic.sample(family, num_nodes=n, seed=seed)
    t = tight_topology(topo, 0.6, g) if seed % 2 else load_topology(topo)
    task = ConstructiveTask(g, t, resolve_costs(g, t))
    task.window = window if window is not None else state_window(policy, n)
    return task


CASES = [  # family, nodes, seed, topology, window (None: the policy's, i.e. the whole graph here), threads
    ("layered", 120, 0, "8x_a100_nvswitch", None, 2),
    ("dataflow", 150, 1, "4x_v100_nvlink", 24, 3),  # memory-tight (odd seed), 4 devices over 3 threads
    ("series_parallel", 100, 3, "cpu_2gpu", None, 2),  # 3 devices over 2 threads, memory-tight
    ("transformer_like", 130, 2, "2x4_v100_ib", 40, 8),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_split_decode_places_what_the_serial_kernel_places(case) -> None:
    fam, n, seed, topo, window, threads = case
    policy = _policy(seed, 256)
    task = _task(fam, n, seed, topo, window, policy)
    with torch.no_grad():
        h = policy.embed(*graph_tensors(task)).double().numpy()
    serial = ScheduleState(task.graph, task.costs, task.topology, episodes=1, window=task.window)
    greedy_devices(policy, serial, h, threads=1)
    split = ScheduleState(task.graph, task.costs, task.topology, episodes=1, window=task.window)
    greedy_devices(policy, split, h, threads=threads)
    assert (serial.devices >= 0).all() and split.done
    np.testing.assert_array_equal(split.devices, serial.devices)
    np.testing.assert_array_equal(split.finish(), serial.finish())  # bit for bit: the same arithmetic
    np.testing.assert_array_equal(split.feasible(), serial.feasible())
    assert len(np.unique(serial.devices)) > 1  # a real placement problem, not one device for everything


def test_split_decode_continues_a_state_from_its_current_step() -> None:
    policy = _policy(5, 256)
    task = _task("dataflow", 140, 4, "2x4_v100_ib", 32, policy)
    with torch.no_grad():
        h = policy.embed(*graph_tensors(task)).double().numpy()
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, task.topology.num_devices, size=45)
    states = []
    for _ in range(2):
        st = ScheduleState(task.graph, task.costs, task.topology, episodes=1, window=task.window)
        for d in prefix:
            st.place(int(d))
        states.append(st)
    complete_greedy(Head(policy, h), states[0])
    decode_split(states[1], Head(policy, h).arrays(), 2)
    np.testing.assert_array_equal(states[1].devices, states[0].devices)
    np.testing.assert_array_equal(states[1].finish(), states[0].finish())
    np.testing.assert_array_equal(states[1].devices[0, task.state(1).order[:45]], prefix)


def test_split_threads_only_where_asked_and_worth_threads(monkeypatch) -> None:
    g = synthetic.sample("layered", num_nodes=400, seed=0)
    t = load_topology("8x_a100_nvswitch")
    c = resolve_costs(g, t)
    big = ScheduleState(g, c, t, episodes=1, window=400)
    assert 400 * 400 * 64 >= MIN_WORK
    import numba

    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert split_threads(big) == 1  # the library default: the serial kernel (fork-safe)
    monkeypatch.setenv(THREADS_ENV, "auto")
    assert split_threads(big) == min(numba.get_num_threads(), 8)
    monkeypatch.setenv(THREADS_ENV, "64")
    assert split_threads(big) == min(numba.get_num_threads(), 8)  # never more than the devices or numba's threads
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ConfigError, match=THREADS_ENV):
            split_threads(big)
        assert split_threads(ScheduleState(g, c, t, episodes=1, window=0)) == 1  # nothing to split: not read
    monkeypatch.setenv(THREADS_ENV, "auto")
    assert split_threads(ScheduleState(g, c, t, episodes=1, window=0)) == 1  # no branches
    assert split_threads(ScheduleState(g, c, t, episodes=4, window=400)) == 1  # batched episodes: serial kernel
    small = synthetic.sample("layered", num_nodes=40, seed=0)
    assert split_threads(ScheduleState(small, resolve_costs(small, t), t, episodes=1, window=40)) == 1
    with pytest.raises(ValueError, match="one episode"):
        decode_split(ScheduleState(g, c, t, episodes=2, window=16), (np.zeros((1, 1)), ()), 2)


def test_threads_asked_follows_the_decode_rule(monkeypatch) -> None:
    """``threads_asked`` (what a large decode would use; ``warm_kernels`` warms the threaded kernels only then)
    reads the same environment rule as ``split_threads``."""
    import numba

    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert threads_asked() == 1
    monkeypatch.setenv(THREADS_ENV, "auto")
    assert threads_asked() == numba.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "1")
    assert threads_asked() == 1
    monkeypatch.setenv(THREADS_ENV, "none")
    with pytest.raises(ConfigError, match=THREADS_ENV):
        threads_asked()


def test_warm_kernels_leaves_the_policy_as_it_was(monkeypatch) -> None:
    """The warm-up before a timed placement runs the decodes on its own small graph: the policy's mode and weights
    are unchanged, and a placement after it is the one without it."""
    from placement_rl.agents.constructive_eval import evaluate, warm_kernels

    monkeypatch.delenv(THREADS_ENV, raising=False)
    policy = _policy(4, 16).train()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    task = _task("layered", 60, 0, "4x_v100_nvlink", None, policy)
    first = evaluate(policy, [task], samples=0)[0].greedy.devices
    policy.train()
    assert warm_kernels(policy) > 0.0 and policy.training
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    np.testing.assert_array_equal(evaluate(policy, [task], samples=0)[0].greedy.devices, first)


def test_the_warm_up_child_writes_the_bound_and_fit_kernels_for_the_parent_to_load() -> None:
    """What ``warm_kernels`` runs in a child on a cold cache (no threads asked): the lower bound's and the memory
    fit's kernels, written to numba's cache, which is how the parent finds them warm."""
    from placement_rl.agents.constructive_eval import _kernels_cold, _warm_side
    from placement_rl.baselines._block_kernel import __dict__ as block
    from placement_rl.baselines._fit_kernel import received

    _warm_side()
    kernels = [received, *(f for f in block.values() if hasattr(f, "_cache") and f.signatures)]
    assert len(kernels) >= 2 and not any(_kernels_cold(k) for k in kernels)


@pytest.mark.parametrize("case", [("layered", 160, 0, "8x_a100_nvswitch", None, 16),
                                  ("dataflow", 150, 1, "4x_v100_nvlink", 48, 16)], ids=["whole-graph", "tight-W48"])
def test_episode_threads_give_the_serial_features_and_samples(case, monkeypatch) -> None:
    """Sampled episodes (``rollout(..., greedy=False)``) with every step's episodes on threads: the same feature
    blocks at every step, hence the same samples, as the serial kernel."""
    from placement_rl.agents.constructive import rollout

    from placement_rl.cost.split import episode_threads

    fam, n, seed, topo, window, k = case
    policy = _policy(seed, 256)
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv(THREADS_ENV, threads)
        task = _task(fam, n, seed, topo, window, policy)
        st = task.state(k) if window is not None else None
        if threads == "2" and st is not None:
            assert episode_threads(st) == min(2, numba.get_num_threads())  # numba: one per usable CPU
        gen = torch.Generator().manual_seed(7)
        runs.append(rollout(policy, task, samples=k, greedy=False, record=True, generator=gen))
    a, b = runs
    np.testing.assert_array_equal(a.devices, b.devices)
    np.testing.assert_array_equal(a.times, b.times)
    np.testing.assert_array_equal(a.trace.feats, b.trace.feats)
    assert len({tuple(r) for r in a.devices}) > 1  # the samples differ: a real batch of episodes


def test_window_unit_above_its_size_reaches_every_decode(monkeypatch) -> None:
    """Above ``WINDOW_UNIT_NODES`` nodes (lowered here so a small graph is above it) the window and step columns
    are the same branch statistics over the smaller unit ``scale x WINDOW_UNIT_NODES / N``, the one-step columns
    are unchanged, and the Python-loop decode (``features`` + the head), the compiled kernel and the split decode
    all read them: the same placement from each."""
    from placement_rl.cost import schedule as sch
    from placement_rl.cost.schedule import DEVICE_FEATURES, STEP_COL, WINDOW_COL

    policy = _policy(3, 256)
    task = _task("layered", 120, 0, "8x_a100_nvswitch", 24, policy)
    with torch.no_grad():
        h = policy.embed(*graph_tensors(task)).double().numpy()
    prefix = np.random.default_rng(1).integers(0, task.topology.num_devices, size=30)

    def state():
        st = ScheduleState(task.graph, task.costs, task.topology, episodes=1, window=task.window)
        for d in prefix:
            st.place(int(d))
        return st

    base = state()
    f0 = base.features()[0].copy()
    monkeypatch.setattr(sch, "WINDOW_UNIT_NODES", 40)
    st = state()
    assert st.window_scale == pytest.approx(st.scale * 40 / 120)
    f1 = st.features()[0].copy()
    scaled = [DEVICE_FEATURES.index(c) for c in ("la_end", "la_load", "la_comm", "la_step", "la_back")]
    assert WINDOW_COL in scaled and STEP_COL in scaled
    rest = [j for j in range(f0.shape[-1]) if j not in scaled]
    np.testing.assert_array_equal(f1[..., rest], f0[..., rest])
    np.testing.assert_allclose(f1[..., scaled], f0[..., scaled] * 3.0, rtol=1e-5, atol=1e-7)
    assert np.abs(f0[..., scaled]).max() > 0  # the branches differ: a real check of the scaling

    head = Head(policy, h)
    loop = state()
    while not loop.done:
        feats, mask = loop.features()
        loop.place(int(np.argmax(np.where(mask[0], head.scores(feats[0], loop.node, mask[0]), -np.inf))))
    kernel, split = state(), state()
    complete_greedy(head, kernel)
    decode_split(split, head.arrays(), 3)
    np.testing.assert_array_equal(kernel.devices, loop.devices)
    np.testing.assert_array_equal(split.devices, kernel.devices)
    monkeypatch.setattr(sch, "WINDOW_UNIT_NODES", 0)  # off: the whole-graph unit at any size
    assert state().window_scale == base.scale


def test_asking_numba_for_threads_keeps_torchs_thread_count(monkeypatch):
    """Starting numba's threading layer (GNU OpenMP, shared with torch) resets torch's intra-op thread count; asking
    how many threads to use must leave the count a training process or the thread clock set (it did not: the
    profiling tests then failed after a rollout over the student ran)."""
    import torch

    from placement_rl.cost.split import requested_threads, threads_asked

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for asked in ("1", "2", "auto"):
            monkeypatch.setenv("PLACEMENT_RL_DECODE_THREADS", asked)
            threads_asked()
            requested_threads()
            assert torch.get_num_threads() == 1, asked
    finally:
        torch.set_num_threads(before)
