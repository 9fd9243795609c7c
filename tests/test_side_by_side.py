"""Searches side by side (``baselines.side_by_side``): the same placements as run here, in the order asked, each in
a process of its own; bad names refused before any process starts."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl import baselines
from placement_rl.baselines import side_by_side
from placement_rl.cost import resolve_costs
from placement_rl.errors import ConfigError
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology


@pytest.fixture(scope="module")
def problem():
    g, topo = synthetic.sample("dataflow", num_nodes=60, seed=3), load_topology("2x4_v100_ib")
    return g, resolve_costs(g, topo), topo


def test_workers_give_the_placements_run_here_in_order(problem):
    g, c, topo = problem
    # deterministic placers (a seconds budget they never reach), so the two ways must agree exactly
    jobs = [("la_rule", 30.0, 0), ("sim_eft", 30.0, 0), ("heft", 30.0, 0), ("la_rule", 30.0, 1)]
    here = side_by_side.run(g, c, topo, jobs, processes=1)
    aside = side_by_side.run(g, c, topo, jobs, processes=2)
    assert [p.meta["placer"] for p in aside] == ["la_rule", "sim_eft", "heft", "la_rule"]
    for a, b, (name, _, seed) in zip(here, aside, jobs):
        ref = baselines.get(name)(g, c, topo, budget=10**12, seed=seed, seconds=30.0)
        np.testing.assert_array_equal(a.device_of_node, ref.device_of_node)
        np.testing.assert_array_equal(b.device_of_node, ref.device_of_node)
        assert b.meta["sim_calls"] == a.meta["sim_calls"] > 0
    # the placers place differently here: the order is not an accident of equal answers
    assert len({tuple(p.device_of_node.tolist()) for p in aside[:3]}) == 3


def test_a_search_in_a_worker_keeps_to_its_seconds(problem, monkeypatch):
    g, c, topo = problem
    monkeypatch.setattr(side_by_side, "FROM_SECONDS", 0.3)  # the rule at a test's seconds (2 s in use)
    assert side_by_side.processes_for([("local_search", 0.4, 0), ("la_rule_search", 0.4, 0)], 2) == 2
    out = side_by_side.run(g, c, topo, [("local_search", 0.4, 0), ("la_rule_search", 0.4, 0)], processes=2)
    for p in out:
        assert p.meta["step_time"] > 0 and p.meta["feasible"]
        assert 0.0 < p.meta["search_seconds"] < 2 * 0.4 + 1.0  # its own clock, kernels loaded before it started
        assert p.meta["trace"] and p.meta["sim_calls"] > 1


def test_unknown_placer_is_refused_before_any_process(problem):
    g, c, topo = problem
    with pytest.raises(ConfigError, match="no_such_search"):
        side_by_side.run(g, c, topo, [("local_search", 1.0, 0), ("no_such_search", 1.0, 0)], processes=2)


def test_one_job_or_one_core_runs_here(problem, monkeypatch):
    g, c, topo = problem

    def no_pool(*_a, **_k):
        raise AssertionError("a worker process was started")

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", no_pool)
    assert len(side_by_side.run(g, c, topo, [("sim_eft", 1.0, 0)])) == 1
    monkeypatch.setattr(side_by_side, "cores", lambda: 1)
    assert len(side_by_side.run(g, c, topo, [("sim_eft", 30.0, 0), ("heft", 30.0, 0)])) == 2
    monkeypatch.setattr(side_by_side, "cores", lambda: 2)  # below FROM_SECONDS: here too
    assert len(side_by_side.run(g, c, topo, [("sim_eft", 1.0, 0), ("heft", 1.0, 0)])) == 2


def test_short_jobs_run_here_and_long_ones_in_workers_in_input_order(problem, monkeypatch):
    g, c, topo = problem
    sent = []
    real = side_by_side._pool

    def spy(graph, costs, topology, jobs, *rest):
        sent.append([j[0] for j in jobs])
        return real(graph, costs, topology, jobs, *rest)

    monkeypatch.setattr(side_by_side, "_pool", spy)
    jobs = [("heft", 0.5, 0), ("sim_eft", 30.0, 0), ("la_rule", 0.5, 0), ("la_rule", 30.0, 0)]
    out = side_by_side.run(g, c, topo, jobs, processes=2)
    assert sent == [["sim_eft", "la_rule"]]
    assert [p.meta["placer"] for p in out] == ["heft", "sim_eft", "la_rule", "la_rule"]


def test_evaluate_at_equal_seconds_runs_its_searches_side_by_side(problem, monkeypatch):
    """``evaluate.compare(seconds=S)``: from ``FROM_SECONDS`` the anytime searches run side by side (each row its
    own clock's seconds, held to S); below it, and for every other placer, in this process as before."""
    from placement_rl import evaluate

    monkeypatch.setattr(side_by_side, "cores", lambda: 2)  # as on two cores (on one, everything runs here)

    g, c, topo = problem
    calls = []
    real = side_by_side.run

    def spy(*args, **kwargs):
        calls.append([j[0] for j in args[3]])
        return real(*args, **kwargs)

    monkeypatch.setattr(side_by_side, "run", spy)
    monkeypatch.setattr(side_by_side, "FROM_SECONDS", 0.6)  # the rule at a test's seconds (2 s in use)
    names = ["sim_eft", "local_search", "la_rule_search"]
    rows = evaluate.compare(g, c, topo, budget=10**8, placers=names, partitioners=(), seconds=0.3)
    assert calls == [] and {r.placer for r in rows} == {"single_device", *names}
    seconds = 0.6
    rows = {r.placer: r for r in evaluate.compare(g, c, topo, budget=10**8, placers=names, partitioners=(),
                                                  seconds=seconds)}
    assert calls == [["local_search", "la_rule_search"]]
    for name in ("local_search", "la_rule_search"):
        r = rows[name]
        assert r.feasible and 0 < r.sim_calls < 10**8, name
        assert 0.5 * seconds < r.search_seconds < 2 * seconds + 1.0, name  # its own clock, held to S (a loaded CI)
    assert rows["sim_eft"].sim_calls >= 1 and rows["sim_eft"].search_seconds < seconds


def test_workers_that_cannot_start_leave_the_jobs_to_this_process(problem, monkeypatch, capfd):
    g, c, topo = problem
    import subprocess

    def refuse(*_a, **_k):
        raise OSError("no processes here")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    out = side_by_side.run(g, c, topo, [("sim_eft", 30.0, 0), ("heft", 30.0, 0)], processes=2)
    ref = [baselines.get(n)(g, c, topo, budget=10**12, seed=0, seconds=30.0) for n in ("sim_eft", "heft")]
    for a, b in zip(out, ref):
        np.testing.assert_array_equal(a.device_of_node, b.device_of_node)
    assert "no processes here" in capfd.readouterr().err


def test_a_worker_that_does_not_return_is_given_up_and_its_jobs_run_here(problem, monkeypatch, capfd):
    """A worker that has not returned a job long after its seconds (a hang) is ended, and every job not yet
    returned runs in this process: the same placements, one line on stderr, never a wait without end."""
    g, c, topo = problem
    monkeypatch.setattr(side_by_side, "_deadline", lambda seconds, first: 0.0)  # every worker "hangs"
    jobs = [("sim_eft", 30.0, 0), ("heft", 30.0, 0), ("la_rule", 30.0, 0)]
    out = side_by_side.run(g, c, topo, jobs, processes=2)
    for p, (name, seconds, seed) in zip(out, jobs):
        ref = baselines.get(name)(g, c, topo, budget=10**12, seed=seed, seconds=seconds)
        np.testing.assert_array_equal(p.device_of_node, ref.device_of_node)
    assert "ran far past" in capfd.readouterr().err


@pytest.mark.parametrize("processes", [1, 2])
def test_a_search_that_refuses_its_problem_is_raised_or_left_in_its_place(problem, processes):
    """``exhaustive`` refuses a 60-node graph at 100 calls (a ``ConfigError``, as ``eft_rollout_search`` refuses more
    than 4,000 nodes): raised by default, here or from a worker; with ``refusals`` the error stands in its place
    and the other jobs' placements come back (``place search_seconds`` and ``train`` then print a note)."""
    g, c, topo = problem
    jobs = [("sim_eft", 30.0, 0), ("exhaustive", 30.0, 0), ("heft", 30.0, 0)]
    with pytest.raises(ConfigError, match="exhaustive search needs more"):
        side_by_side.run(g, c, topo, jobs, processes=processes, budget=100)
    out = side_by_side.run(g, c, topo, jobs, processes=processes, budget=100, refusals=True)
    assert isinstance(out[1], ConfigError) and "exhaustive search needs more" in str(out[1])
    for p, name in ((out[0], "sim_eft"), (out[2], "heft")):
        ref = baselines.get(name)(g, c, topo, budget=100, seed=0, seconds=30.0)
        np.testing.assert_array_equal(p.device_of_node, ref.device_of_node)


@pytest.mark.slow
def test_a_script_without_a_main_guard_runs_once_and_returns(tmp_path):
    """Workers import this module only: a caller's script without ``if __name__ == "__main__"`` is not run again in
    them (a ``multiprocessing`` spawn did: its top-level code ran once per worker, and where it started the pool
    the caller waited without end)."""
    import subprocess
    import sys

    marks = tmp_path / "runs.txt"
    script = tmp_path / "unguarded.py"
    script.write_text(f"""
from placement_rl.baselines import side_by_side
from placement_rl.cost import resolve_costs
from placement_rl.graph import synthetic
from placement_rl.topology import load_topology

with open({str(marks)!r}, "a") as f:
    f.write("ran\\n")
g, topo = synthetic.sample("dataflow", num_nodes=40, seed=3), load_topology("2x4_v100_ib")
out = side_by_side.run(g, resolve_costs(g, topo), topo, [("sim_eft", 2.0, 0), ("heft", 2.0, 0)], processes=2)
print("placers", [p.meta["placer"] for p in out])
""")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "placers ['sim_eft', 'heft']" in res.stdout
    assert "side by side:" not in res.stderr  # the workers ran the jobs
    assert marks.read_text().splitlines() == ["ran"]


def test_train_notes_a_search_that_refuses_and_keeps_the_other_rows(problem):
    """``train``'s same-seconds rows: a search that refuses the problem (``eft_rollout_search`` above 4,000 nodes) is a
    logged note and no row; the other searches' rows are added (before, its error ended ``train`` after the
    whole fine-tuning)."""
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.studies.finetune import FinetuneResult, equal_seconds_rows

    g, c, topo = problem
    result = FinetuneResult(ConstructiveTask(g, topo, c), [], [], None)
    lines: list[str] = []
    equal_seconds_rows(result, None, [("policy zero-shot (greedy)", 0.2, ("exhaustive", "sim_eft"))], log=lines.append)
    assert [r.search for r in result.rows] == ["sim_eft"]
    assert result.rows[0].same_seconds_as == "policy zero-shot (greedy)" and result.rows[0].feasible
    assert any("exhaustive (0.20 s): refused: exhaustive search needs more" in s for s in lines)


def test_evaluate_notes_a_search_that_refuses_in_its_worker(problem, monkeypatch):
    """``evaluate seconds=S``: a search refusing the case in its worker (``exhaustive`` at 60 nodes here, as
    ``eft_rollout_search`` above 4,000) gets the note row it gets here; the others keep their side-by-side rows (before,
    one refusal sent every search back to run here, one after another)."""
    from placement_rl import evaluate

    monkeypatch.setattr(side_by_side, "cores", lambda: 2)  # as on two cores (on one, everything runs here)

    g, c, topo = problem
    monkeypatch.setattr(side_by_side, "SEARCHES", ("local_search", "exhaustive"))
    monkeypatch.setattr(side_by_side, "FROM_SECONDS", 0.4)
    real, sent = side_by_side._pool, []

    def spy(graph, costs, topology, jobs, *rest):
        sent.append([j[0] for j in jobs])
        return real(graph, costs, topology, jobs, *rest)

    monkeypatch.setattr(side_by_side, "_pool", spy)
    rows = {r.placer: r for r in evaluate.compare(g, c, topo, budget=1000, placers=["local_search", "exhaustive"],
                                                  partitioners=(), seconds=0.4)}
    assert sent == [["local_search", "exhaustive"]]
    assert "exhaustive search needs more" in rows["exhaustive"].note and not rows["exhaustive"].feasible
    assert rows["local_search"].feasible and 0 < rows["local_search"].search_seconds < 2 * 0.4 + 1.0
