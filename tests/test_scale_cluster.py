"""Scale-out across nodes on a two-node Ray cluster inside this machine (``ray.cluster_utils.Cluster``:
a head with 1 CPU and a second node with 2), joined through ``ray.address`` as a real cluster is:

* labels, placements and step times identical on 1, 2 and 3 workers, with trajectories whose labelled states
  fall just under, on and over the label chunk boundary (``agents.scaleout.CHUNK``);
* a whole node removed in the middle of a labelling round, and in the middle of a pretraining: the round
  completes with identical labels, the pretraining with the 1-worker checkpoint;
* the driver killed mid-round and resumed on the cluster: the same checkpoint, no label made twice.

Each test starts Ray processes: marked ``distributed`` (deselect with ``-m 'not distributed'``)."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from placement_rl.scale import Workers
from tests.test_scale_ray import TINY, drive, metrics_of, reference, snapshot  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
MB = 1024 * 1024


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 150 * MB,
                                                      "include_dashboard": False})
    c.add_node(num_cpus=2, object_store_memory=150 * MB)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _second_node(c):
    """The cluster's non-head node, added back first if an earlier test removed it."""
    nodes = list(c.worker_nodes)
    if not nodes:
        nodes = [c.add_node(num_cpus=2, object_store_memory=150 * MB)]
        c.wait_for_nodes()
    return nodes[0]


def _tasks_and_jobs():
    """Tiny tasks and a labelling job per (task, every, offset) whose labelled-state count is CHUNK - 1, CHUNK,
    CHUNK + 1 or 2 CHUNK + 1: one, one, two and three jobs per trajectory on Ray."""
    import torch

    from placement_rl.agents.constructive import rollout
    from placement_rl.agents.constructive_train import ConstructiveConfig, build_policy
    from placement_rl.agents.scaleout import CHUNK, LabelJob, _parts
    from placement_rl.studies.pretrain import build_tasks, training_specs

    tasks = build_tasks(training_specs(3, seed=12, size=(16, 40), devices=(2, 4), zoo_frac=0.0), workers=1)
    torch.manual_seed(0)
    policy = build_policy(ConstructiveConfig())
    wanted = {CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 1}
    jobs, seen = [], set()
    for t in tasks:
        actions = rollout(policy, t, samples=1).devices[0]
        n = t.graph.num_nodes
        for every in range(1, 5):
            for offset in range(every):
                states = -(-(n - offset) // every)
                if states in wanted and states not in seen:
                    seen.add(states)
                    jobs.append(LabelJob(t, actions, every, offset))
    assert seen == wanted, seen
    assert sorted(_parts(j, on_ray=True) for j in jobs) == [1, 1, 2, 3]
    return tasks, policy, jobs


def _same_labels(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.completions == y.completions > 0
        np.testing.assert_array_equal(x.labels, y.labels)
        np.testing.assert_array_equal(x.regret, y.regret)
        np.testing.assert_array_equal(x.labelled, y.labelled)


def test_identical_on_1_2_and_3_workers_across_the_chunk_boundary(cluster):
    from placement_rl.agents.scaleout import evaluate_tasks, label_states

    tasks, policy, jobs = _tasks_and_jobs()
    _second_node(cluster)
    one = label_states(policy, jobs, Workers(1))
    ev1 = evaluate_tasks(policy, tasks, samples=4, seed=3, workers=Workers(1))
    for n in (2, 3):
        with Workers(n, address=cluster.address) as w:
            first = w.describe()
            assert f"{n} workers on the Ray cluster at" in first and "(3 CPUs on 2 nodes)" in first, first
            assert "checked on 2 nodes" in first, first
            _same_labels(one, label_states(policy, jobs, w))
            evn = evaluate_tasks(policy, tasks, samples=4, seed=3, workers=w)
        for a, b in zip(ev1, evn):
            np.testing.assert_array_equal(a.greedy.devices, b.greedy.devices)
            np.testing.assert_array_equal(a.sampled.devices, b.sampled.devices)
            assert a.greedy_time == b.greedy_time and a.best_time == b.best_time


def test_a_node_removed_mid_round_and_the_round_completes_identically(cluster):
    from placement_rl.agents.scaleout import label_states

    _, policy, jobs = _tasks_and_jobs()
    jobs = jobs * 3  # enough jobs that some are still running on the node when it goes
    one = label_states(policy, jobs, Workers(1))
    node = _second_node(cluster)
    removed = []

    def remove_after_first(done: int, total: int) -> None:
        if done >= 1 and not removed:
            cluster.remove_node(node)  # the whole node: its raylet, object store and workers
            removed.append(done)

    with Workers(3, address=cluster.address) as w:
        got = label_states(policy, jobs, w, progress=remove_after_first)
        from placement_rl.scale_ray import cluster_size

        assert cluster_size() == (1, 1)  # the round finished on the head alone
    assert removed and removed[0] < len(jobs)
    _same_labels(one, got)


def test_pretraining_on_3_workers_with_a_node_removed_equals_1_worker(cluster, snapshot, reference, tmp_path):
    """A driver (on the snapshot) joins with 3 workers; the second node is removed as soon as the first label of
    policy iteration's first round is in: the run ends on the head alone, with the 1-worker checkpoint."""
    node = _second_node(cluster)
    proc = drive(snapshot, tmp_path / "run", workers=3, address=cluster.address, background=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "policy iteration 1 labelling 1/" in line and node in cluster.worker_nodes:
            cluster.remove_node(node)  # mid-round: the rest of the round and of the run on the head
    proc.wait(timeout=600)
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    assert node not in cluster.worker_nodes and lines[0].startswith("running on 3 workers on the Ray cluster"), out
    m = metrics_of(out)
    assert m["workers"] == 3 and m["weights_sha"] == reference["weights_sha"]
    assert m["checkpoint_sha"] == reference["checkpoint_sha"]


def test_driver_killed_and_resumed_on_the_cluster(cluster, snapshot, reference, tmp_path):
    _second_node(cluster)
    out = tmp_path / "run"
    r = drive(snapshot, out, workers=3, address=cluster.address, kill_at="policy iteration 2 labelling 2/")
    assert r.returncode == -signal.SIGKILL, r.stdout[-3000:] + r.stderr[-3000:]
    made = len(list((out / "resume" / "labels").glob("*.pkl")))
    assert made >= TINY["train_tasks"] + 1  # round 1 and part of round 2
    r = drive(snapshot, out, workers=2, address=cluster.address, resume=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = metrics_of(r.stdout)
    assert m["resumed_after"] == "imitation" and m["labels_reused"] == made, r.stdout[-3000:]
    assert m["checkpoint_sha"] == reference["checkpoint_sha"] and m["weights_sha"] == reference["weights_sha"]
