"""The constructive state's truth (features vs the state update, window features vs a real branch), the compiled
scoring path vs torch, and the rollout over the student (never worse than the student)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from placement_rl.agents.constructive import rollout, state_window
from placement_rl.agents.constructive_train import ConstructiveConfig, build_policy
from placement_rl.agents.policy_rollout import rollout_over_student
from placement_rl.envs.constructive_task import ConstructiveTask
from placement_rl.envs.topology_sampler import random_topology
from placement_rl.cost import resolve_costs, simulate
from placement_rl.cost.schedule import DEVICE_FEATURES, ScheduleState
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

F = {name: i for i, name in enumerate(DEVICE_FEATURES)}


def _case(family: str, n: int, seed: int, topo):
    g = synthetic.sample(family, num_nodes=n, seed=seed)
    t = load_topology(topo) if isinstance(topo, str) else topo
    return g, t, resolve_costs(g, t)


def _replay(g, t, c, order_devs, window=4):
    st = ScheduleState(g, c, t, episodes=1, window=window)
    for d in order_devs:
        st.place(int(d))
    return st


def _place_eft(st, steps: int) -> None:
    """Place up to ``steps`` more nodes of ``st`` by the earliest-finish rule (memory-masked)."""
    for _ in range(steps):
        if st.done:
            break
        f, m = st.features()
        st.place(int(np.argmin(np.where(m[0], f[0, :, F["eft_gap"]], np.inf))))


CASES = [("dataflow", 60, 1, "4x_v100_nvlink"), ("layered", 50, 2, "2x4_v100_ib"), ("series_parallel", 40, 3, "cpu_2gpu")]


@pytest.mark.parametrize("case", CASES)
def test_feature_transfer_times_are_the_state_update(case) -> None:
    """Every device's earliest finish and memory-after features equal what placing the node there really gives:
    the features and the state update cannot drift apart (e.g. a feature that forgets a link's transfer time)."""
    g, t, c = _case(*case)
    rng = np.random.default_rng(0)
    nd = t.num_devices
    checked = 0
    for trial in range(3):
        prefix = rng.integers(0, nd, size=int(rng.integers(5, g.num_nodes - 1)))
        st = _replay(g, t, c, prefix)
        feats, mask = st.features()
        v = st.node
        finish, mem_after = np.zeros(nd), np.zeros(nd)
        for d in range(nd):
            br = _replay(g, t, c, list(prefix) + [d])
            finish[d] = br.node_finish(v)[0]
            mem_after[d] = br.memory[0, d] / st.capacity[d]
        gap = (finish - finish.min()) / st.scale
        assert np.allclose(feats[0, :, F["eft_gap"]], gap, rtol=1e-5, atol=1e-6), (gap, feats[0, :, F["eft_gap"]])
        assert np.allclose(feats[0, :, F["mem_after"]], mem_after, rtol=1e-5, atol=1e-7)
        checked += int((gap > 1e-6).sum())
    assert checked > 0  # the devices differed somewhere (the check is not vacuous)


@pytest.mark.parametrize("window", [0, 3, 12])
def test_window_features_are_a_real_branch_and_leave_the_state_alone(window) -> None:
    g, t, c = _case("dataflow", 50, 5, "4x_v100_nvlink")
    rng = np.random.default_rng(window)
    prefix = list(rng.integers(0, 4, size=20))
    st = _replay(g, t, c, prefix, window=window)
    before = [x.copy() for x in (st.devices, st.busy, st.memory, st.bwd_busy, st.forward_end)]
    feats, mask = st.features()
    after = (st.devices, st.busy, st.memory, st.bwd_busy, st.forward_end)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    ends, loads = np.full(4, np.inf), np.full(4, np.inf)
    for d in np.flatnonzero(mask[0]):
        br = _replay(g, t, c, prefix + [d], window=window)
        _place_eft(br, window)  # the next W nodes by the earliest-finish rule (memory-masked)
        ends[d] = br.forward_end[0]
        loads[d] = (br.busy[0] + br.bwd_busy[0]).max()
    ok = mask[0]
    assert np.allclose(feats[0, ok, F["la_end"]], (ends[ok] - ends[ok].min()) / st.scale, rtol=1e-5, atol=1e-6)
    assert np.allclose(feats[0, ok, F["la_load"]], (loads[ok] - loads[ok].min()) / st.scale, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_step_features_are_the_teachers_completed_step_times(case) -> None:
    """Once the window reaches the last decision, ``la_step`` is each device's full step time (forward + backward
    of the completed placement) over the best one's, the quantity ``eft_rollout`` compares; before, it repeats
    ``la_end`` and ``la_full`` is 0."""
    g, t, c = _case(*case)
    nd, window = t.num_devices, 12
    rng = np.random.default_rng(1)
    prefix = list(rng.integers(0, nd, size=g.num_nodes - window - 1))
    early = _replay(g, t, c, prefix[:5], window=window)
    feats, _ = early.features()
    assert np.array_equal(feats[0, :, F["la_step"]], feats[0, :, F["la_end"]]) and not feats[0, :, F["la_full"]].any()
    st = _replay(g, t, c, prefix, window=window)
    feats, mask = st.features()
    times = np.full(nd, np.inf)
    for d in np.flatnonzero(mask[0]):
        br = _replay(g, t, c, prefix + [d], window=0)
        _place_eft(br, g.num_nodes)
        times[d] = br.finish()[0]
        full = simulate(g, c, t, br.devices[0])  # the reference simulator agrees on the completed placement
        assert full.step_time == pytest.approx(times[d], rel=1e-9)
    ok = mask[0]
    gap = (times[ok] - times[ok].min()) / st.scale
    assert np.allclose(feats[0, ok, F["la_step"]], gap, rtol=1e-5, atol=1e-6)
    assert (feats[0, ok, F["la_full"]] == 1.0).all() and gap.max() > 1e-6  # devices differ: not vacuous


def test_topology_features_tell_apart_devices_the_one_step_features_cannot() -> None:
    """On the DGX-1 quad (``4x_v100_nvlink``: 0-3, 1-2, 2-3 at 50 GB/s, 0-1, 0-2, 1-3 at 25 GB/s), with every
    producer on GPU 3, GPUs 1 and 2 are alike one step ahead of a small transfer but not in their links."""
    g, t, c = _case("layered", 30, 0, "4x_v100_nvlink")
    st = ScheduleState(g, c, t, episodes=1)
    while not st.done and g.pred_ptr[st.node + 1] == g.pred_ptr[st.node]:
        st.place(3)  # sources on GPU 3
    for _ in range(3):
        st.place(3)
    feats, _ = st.features()
    conn, prod = feats[0, :, F["conn"]], feats[0, :, F["prod_link"]]
    assert conn[2] == conn[3] == pytest.approx(1.0) and conn[0] == conn[1] < 0.9  # 100 vs 125 GB/s in all
    assert prod[3] == 0.0 and prod[1] > prod[2] > 0.0 and prod[0] == pytest.approx(prod[2])


@pytest.mark.parametrize("hidden", [16, 64])
def test_compiled_scores_match_the_torch_head(hidden) -> None:
    """``device_scores`` (numba) is ``DevicePolicy.logits`` (torch) up to its constant output bias, at the shipped
    width too."""
    from placement_rl.agents.fast_decode import Head

    torch.manual_seed(hidden)
    policy = build_policy(ConstructiveConfig(hidden=hidden, layers=3 if hidden == 64 else 1))
    rng = np.random.default_rng(0)
    node_h = rng.normal(size=(5, hidden))
    head = Head(policy, node_h)
    for d in (2, 5, 16):
        feats = rng.normal(size=(d, len(DEVICE_FEATURES))).astype(np.float32)
        mask = rng.random(d) < 0.8
        mask[0] = True
        z = head.scores(feats, 3, mask)
        with torch.no_grad():
            ref = policy.logits(torch.from_numpy(node_h[3]).float()[None], torch.from_numpy(feats)[None],
                                torch.from_numpy(mask)[None])[0].double().numpy()
        bias = float(policy.rho[2].bias.detach())
        assert np.array_equal(np.isfinite(z), mask)
        assert np.allclose(z[mask] + bias, ref[mask], rtol=1e-4, atol=1e-4)


def test_placing_reads_the_whole_graph_and_training_keeps_the_trained_window() -> None:
    """A policy trained at W places a graph of at most ``full_window`` nodes with the window over the whole rest of
    the graph (the completed step from the first decision on); recorded (training) states keep W, as does a
    larger graph or ``full_window = 0``."""
    policy = build_policy(ConstructiveConfig(hidden=16, layers=1, window=4, full_window=100))
    g, t, c = _case("layered", 30, 0, "4x_v100_nvlink")
    assert state_window(policy, 30) == 30 and state_window(policy, 30, record=True) == 4
    assert state_window(policy, 101) == 4
    task = ConstructiveTask(g, t, c)
    rollout(policy, task, samples=1, greedy=True)
    assert task.window == 30
    rollout(policy, task, samples=2, greedy=False, record=True)
    assert task.window == 4
    for w, full in ((30, 1.0), (4, 0.0)):
        feats, mask = ScheduleState(g, c, t, episodes=1, window=w).features()
        assert (feats[0, mask[0], F["la_full"]] == full).all()
    policy.full_window_train = True  # a policy trained on whole-graph states records them too
    assert state_window(policy, 30, record=True) == 30 and state_window(policy, 101, record=True) == 4
    policy.full_window = 0
    assert state_window(policy, 30) == 4 and state_window(policy, 30, record=True) == 4


def test_rollout_over_the_student_is_never_worse_than_the_student() -> None:
    torch.manual_seed(0)
    policy = build_policy(ConstructiveConfig(hidden=16, layers=1, window=4))
    rng = np.random.default_rng(3)
    for i, (fam, n) in enumerate([("dataflow", 40), ("layered", 35), ("transformer_like", 30)]):
        g = synthetic.sample(fam, num_nodes=n, seed=i)
        topo = random_topology(rng, (3, 6))
        task = ConstructiveTask(g, topo, resolve_costs(g, topo))
        greedy = rollout(policy, task, samples=1, greedy=True)
        lab = rollout_over_student(policy, task)
        t_roll = simulate(g, task.costs, topo, lab.devices).step_time
        assert t_roll <= greedy.times[0] * (1 + 1e-9)
        assert lab.labelled.sum() > 0 and lab.completions >= lab.labelled.sum()
        # labelling the student's own trajectory every 2nd state: labels only where asked, regrets >= 0
        part = rollout_over_student(policy, task, actions=greedy.devices[0], label_every=2)
        assert np.all(np.flatnonzero(part.labelled) % 2 == 0) and part.regret.min() >= 0.0
        assert np.array_equal(part.devices, greedy.devices[0])


def test_policy_iteration_improves_an_untrained_student() -> None:
    """Two rounds of approximate policy iteration from random weights (no teacher, no imitation): distilling the
    rollout over the student makes the student's own greedy placements faster, over three seeds."""
    from placement_rl.agents.constructive_eval import evaluate, geomean
    from placement_rl.agents.constructive_train import ConstructiveTrainer

    rng = np.random.default_rng(7)
    tasks = []
    for i, (fam, n) in enumerate([("dataflow", 40), ("layered", 40), ("transformer_like", 36), ("cnn_like", 40)]):
        g = synthetic.sample(fam, num_nodes=n, seed=10 + i)
        topo = random_topology(rng, (3, 6))
        tasks.append(ConstructiveTask(g, topo, resolve_costs(g, topo)))
    gains = []
    for seed in range(3):
        cfg = ConstructiveConfig(hidden=32, layers=1, window=4, pi_rounds=2, pi_epochs=8, pi_label_every=1, seed=seed)
        trainer = ConstructiveTrainer(cfg)
        before = [r.greedy_time for r in evaluate(trainer.policy, tasks, samples=0)]
        report = trainer.policy_iteration(tasks)
        after = [r.greedy_time for r in evaluate(trainer.policy, tasks, samples=0)]
        gains.append(geomean(np.array(after) / np.array(before)))
        assert len(report["rounds"]) == 2 and report["rounds"][0]["teacher_completions"] > 0
    assert max(gains) < 0.9 and geomean(gains) < 0.8, gains  # measured 0.34-0.66 over seeds 0-5


def test_the_shipped_checkpoint_loads_with_its_provenance_and_decodes_the_same_compiled_and_in_torch() -> None:
    """The packaged policy matches this release (features, window), says where it comes from, and its compiled
    greedy decode takes the torch head's choice at every state of a torch greedy episode (states where the top two
    scores are within float noise are not counted)."""
    from placement_rl.agents.constructive import graph_tensors
    from placement_rl.agents.constructive_train import default_checkpoint, load_policy
    from placement_rl.agents.fast_decode import Head

    torch.set_num_threads(1)
    policy, cfg, data = load_policy(default_checkpoint())
    assert cfg.window == policy.window >= 0
    prov = data["config"]["provenance"]
    assert prov["commit"] and prov["cost_model_sha"] and prov["fits_sha"] and prov["dataset"]["train_tasks"] > 0
    for family, n, seed, topo in CASES:
        g, t, c = _case(family, n, seed, topo)
        task = ConstructiveTask(g, t, c)
        tr = rollout(policy, task, samples=1, greedy=True, record=True).trace
        with torch.no_grad():
            node_h = policy.embed(*graph_tensors(task)).double().numpy()
        head = Head(policy, node_h)
        counted = 0
        for i, v in enumerate(tr.nodes):
            z = head.scores(tr.feats[i, 0].astype(np.float32), int(v), tr.masks[i, 0])
            top = np.sort(z[np.isfinite(z)])[::-1]
            if len(top) > 1 and top[0] - top[1] < 1e-4:
                continue
            counted += 1
            assert int(np.argmax(z)) == int(tr.actions[i, 0]), (family, i)
        assert counted >= 0.9 * len(tr.nodes)
        fast = rollout(policy, task, samples=1, greedy=True)
        assert fast.feasible[0] and fast.times[0] == pytest.approx(simulate(g, c, t, fast.devices[0]).step_time,
                                                                   rel=1e-9)


def test_the_shipped_checkpoint_was_trained_with_this_code() -> None:
    """The shipped checkpoint's recorded state / cost-model / fit hashes are this code's: a change to a file the
    policy's state or its rewards depend on comes with the checkpoint re-shipped from the recipe at a clean commit
    (docs/constructive.md, Checkpoints), else every ``place`` run would say it was trained with other code."""
    from placement_rl.agents.checkpoint import load_checkpoint
    from placement_rl.agents.constructive_config import checkpoint_drift, default_checkpoint

    data = load_checkpoint(default_checkpoint())
    assert checkpoint_drift(data) == [], (
        "re-ship placement_rl/data/policy/pretrained.pt: placement-rl train trainer=pretrain seed=0 workers=1 at a "
        "clean commit, then copy its checkpoint.pt")
    assert data["config"]["provenance"]["dirty"] is False


@pytest.mark.parametrize("case", CASES)
def test_back_feature_is_the_step_time_of_the_branch_placed_so_far(case) -> None:
    """Before the tail, ``la_back`` is each device's backward of the branch's placed nodes (the node's window placed
    by earliest finish) as a gap to the best device: while the range still starts at the first node, exactly the
    step time ``simulate()`` gives the subgraph of the placed nodes under the branch's placement. In the tail it is
    ``la_step``."""
    from placement_rl.cost.types import CostTable
    from placement_rl.cost.window import BACK
    from placement_rl.graph.ir import CompGraph

    g, t, c = _case(*case)
    nd, window = t.num_devices, 3
    rng = np.random.default_rng(2)
    prefix = list(rng.integers(0, nd, size=BACK * window - 1))
    st = _replay(g, t, c, prefix, window=window)
    feats, mask = st.features()
    end = st.step + 1 + window
    keep = st.order[:end]
    new = np.full(g.num_nodes, -1)
    new[keep] = np.arange(end)
    e = g.edges
    inside = (new[e[:, 0]] >= 0) & (new[e[:, 1]] >= 0)
    sub = CompGraph(names=tuple(g.names[i] for i in keep), op_types=tuple(g.op_types[i] for i in keep),
                    module_paths=tuple(g.module_paths[i] for i in keep), fwd_flops=g.fwd_flops[keep],
                    bwd_flops=g.bwd_flops[keep], out_bytes=g.out_bytes[keep], param_bytes=g.param_bytes[keep],
                    act_bytes=g.act_bytes[keep], edges=new[e[inside]], edge_bytes=g.edge_bytes[inside], name="prefix")
    assert np.array_equal(sub.topo_order, np.arange(end))  # the same decision order
    sc = CostTable(fwd_time=c.fwd_time[keep], bwd_time=c.bwd_time[keep], link_latency=c.link_latency,
                   link_bandwidth=c.link_bandwidth, source=c.source, launch_overhead=c.launch_overhead[keep])
    steps = np.full(nd, np.inf)
    for d in np.flatnonzero(mask[0]):
        br = _replay(g, t, c, prefix + [d], window=window)
        _place_eft(br, window)
        steps[d] = simulate(sub, sc, t, br.devices[0][keep]).step_time
    ok = mask[0]
    gap = (steps[ok] - steps[ok].min()) / st.scale
    assert np.allclose(feats[0, ok, F["la_back"]], gap, rtol=1e-5, atol=1e-6), (gap, feats[0, ok, F["la_back"]])
    assert gap.max() > 1e-6 and not feats[0, :, F["la_full"]].any()  # devices differ; not yet the tail
    late = _replay(g, t, c, list(rng.integers(0, nd, size=g.num_nodes - window - 1)), window=window)
    feats, _ = late.features()
    assert np.array_equal(feats[0, :, F["la_back"]], feats[0, :, F["la_step"]]) and feats[0, :, F["la_full"]].all()


def _finetune_cases():
    rng = np.random.default_rng(11)
    out = []
    for i, (fam, n) in enumerate([("dataflow", 36), ("layered", 32), ("transformer_like", 30)]):
        g = synthetic.sample(fam, num_nodes=n, seed=20 + i)
        topo = random_topology(rng, (3, 5))
        out.append((g, topo, resolve_costs(g, topo)))
    return out


def test_finetuning_policy_iteration_clones_its_rollout_and_reports_only_what_the_policy_placed() -> None:
    """Fine-tuning's policy iteration on one task: the rollout over the student (a search row) is never slower
    than the student's zero-shot greedy placement; cloning it makes the policy's own placements faster than
    zero-shot on every task; and with no cloning and no sampling, the learned rows are exactly what the policy
    placed zero-shot (the rollout's better placement is not reported as learned)."""
    import dataclasses

    from placement_rl.studies.finetune import finetune

    torch.set_num_threads(1)
    for g, topo, costs in _finetune_cases():
        for clone_epochs, rl_iters in ((100, 2), (0, 0)):
            torch.manual_seed(0)
            policy = build_policy(ConstructiveConfig(hidden=16, layers=1, window=4))
            cfg = ConstructiveConfig(hidden=16, layers=1, window=4, pi_rounds=2, clone_epochs=clone_epochs,
                                     ft_search_rounds=0,
                                     rl_iters=rl_iters, samples=4, pi_max_nodes=100)
            res = finetune(g, topo, costs, policy, cfg, samples=4, log=lambda _: None)
            rows = {r.label: r for r in res.rows}
            zs = rows["policy zero-shot (greedy)"].step_time
            teacher = rows["rollout over the policy (policy iteration's teacher)"]
            assert teacher.kind == "search" and teacher.step_time < zs * (1 - 1e-9)
            assert simulate(g, costs, topo, teacher.devices).step_time == pytest.approx(teacher.step_time, rel=1e-9)
            learned = [r for r in res.rows if r.kind == "learned"]
            for r in learned:  # every learned row is a real placement of its reported time
                assert simulate(g, costs, topo, r.devices).step_time == pytest.approx(r.step_time, rel=1e-9)
            for stage in ("zero-shot", "fine-tuned"):  # a greedy row is charged its own placement, not the samples
                greedy, best = rows[f"policy {stage} (greedy)"], rows[f"policy {stage} (best of 4)"]
                assert best.sim_calls - greedy.sim_calls == 4 * (greedy.sim_calls if stage == "zero-shot" else 1)
                assert 0 < greedy.seconds < best.seconds
            tuning = next(r for r in learned if r.label.startswith("policy fine-tuning"))
            if clone_epochs:
                assert tuning.step_time < zs * (1 - 1e-9)
            else:
                zero = min(r.step_time for r in learned if "zero-shot" in r.label)
                assert tuning.step_time >= zero * (1 - 1e-9)


def test_finetuning_skips_policy_iteration_above_its_size_limit() -> None:
    """A round of the rollout over the student is O(N^2 W D^2): above ``pi_max_completions`` (N x D) fine-tuning
    says so and goes straight to expert iteration (no rollout row, no round)."""
    from placement_rl.studies.finetune import finetune

    torch.set_num_threads(1)
    g, topo, costs = _finetune_cases()[0]
    policy = build_policy(ConstructiveConfig(hidden=16, layers=1, window=4))
    cfg = ConstructiveConfig(hidden=16, layers=1, window=4, pi_rounds=2, rl_iters=1, samples=4, ft_search_rounds=0,
                             pi_max_completions=g.num_nodes * topo.num_devices - 1)
    said: list[str] = []
    res = finetune(g, topo, costs, policy, cfg, samples=2, log=said.append)
    assert not any(r.kind == "search" for r in res.rows)
    assert any("no policy iteration" in line and "pi_max_completions" in line for line in said)


def test_search_fine_tuning_never_leaves_a_slower_greedy_and_reports_its_teacher() -> None:
    """Fine-tuning by search (``ft_search_rounds``): the search's placement is a search row never slower than the
    policy's own best, the fine-tuned greedy is never slower than the zero-shot greedy (the fastest greedy's weights
    are kept), and the table carries the pair's lower bound, below every row."""
    from placement_rl.studies.finetune import finetune

    torch.set_num_threads(1)
    for g, topo, costs in _finetune_cases()[:2]:
        # full_window=0: the zero-shot greedy reads the trained window too, the basis the kept weights compare on
        policy = build_policy(ConstructiveConfig(hidden=16, layers=1, window=4, full_window=0))
        cfg = ConstructiveConfig(hidden=16, layers=1, window=4, full_window=0, ft_search_rounds=2,
                                 ft_search_seconds=0.3, clone_epochs=10)
        res = finetune(g, topo, costs, policy, cfg, samples=2, log=lambda _: None)
        rows = {r.label: r for r in res.rows}
        zs = rows["policy zero-shot (greedy)"].step_time
        assert rows["policy fine-tuned (greedy)"].step_time <= zs * (1 + 1e-12)
        bound = next(r for r in res.rows if r.kind == "bound").step_time
        assert all(r.step_time >= bound * (1 - 1e-9) for r in res.rows if r.kind != "bound" and r.feasible)
        teacher = [r for r in res.rows if r.label.startswith("search from the policy")]
        if teacher:  # a round that found nothing better stops without a teacher row
            assert teacher[0].step_time < zs and teacher[0].kind == "search"


def test_search_fine_tuning_reproduces_its_teacher(monkeypatch) -> None:
    """The fine-tuned greedy decode is the search's placement it was cloned from (the clone runs until the greedy
    decode reproduces it), on three graphs and two seeds: the learned row is what the student learned. The clone's
    wall-clock cap is lifted (its epochs still bound it), so a loaded machine cannot cut it short."""
    from placement_rl.studies import finetune as ft
    from placement_rl.studies.finetune import finetune

    monkeypatch.setattr(ft, "CLONE_SECONDS", 1e6)
    torch.set_num_threads(1)
    taught = 0
    for seed in (0, 1):
        for g, topo, costs in _finetune_cases():
            torch.manual_seed(seed)
            policy = build_policy(ConstructiveConfig(hidden=16, layers=1, window=4, full_window=0))
            cfg = ConstructiveConfig(hidden=16, layers=1, window=4, full_window=0, ft_search_rounds=1,
                                     ft_search_seconds=0.3, seed=seed)
            res = finetune(g, topo, costs, policy, cfg, samples=2, seed=seed, log=lambda _: None)
            rows = {r.label: r for r in res.rows}
            teacher = rows.get("search from the policy's placements (fine-tuning's teacher)")
            if teacher is None:  # the search found nothing better than the policy's own placements
                continue
            taught += 1
            assert rows["policy fine-tuned (greedy)"].step_time == pytest.approx(teacher.step_time, rel=1e-9)
    assert taught >= 4


def test_rollout_over_the_student_on_threads_is_the_serial_rollout(monkeypatch) -> None:
    """The rollout's device completions split over threads (``PLACEMENT_RL_DECODE_THREADS``) give the serial
    rollout's placement, labels and regrets exactly: each branch episode's arithmetic is unchanged."""
    import numba

    from placement_rl.agents import policy_rollout

    torch.manual_seed(0)
    policy = build_policy(ConstructiveConfig(hidden=16, layers=1, window=8))
    g, t, c = _case("dataflow", 50, 4, "2x4_v100_ib")
    task = ConstructiveTask(g, t, c)
    task.window = 8
    monkeypatch.setattr(policy_rollout, "MIN_WORK", 0)  # a graph this small would not use threads
    monkeypatch.setenv("PLACEMENT_RL_DECODE_THREADS", "1")
    serial = rollout_over_student(policy, task)
    monkeypatch.setenv("PLACEMENT_RL_DECODE_THREADS", "2")
    assert len(policy_rollout._branches(task, 8)) == min(2, numba.get_num_threads())
    threaded = rollout_over_student(policy, task)
    assert np.array_equal(serial.devices, threaded.devices) and np.array_equal(serial.labels, threaded.labels)
    assert np.array_equal(serial.regret, threaded.regret) and serial.completions == threaded.completions
