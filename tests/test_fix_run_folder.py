"""``place``: a run folder given again holds only this run's files; the sampled placements report their progress
while they run; the bound of a coarsened graph is said to hold for its groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import torch

from placement_rl.cli import place
from placement_rl.cli.common import Phases
from placement_rl.cli.run_folder import config_paths, set_aside


def _touch(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_an_earlier_runs_files_are_set_aside_and_come_back_on_failure(tmp_path):
    """An earlier finished run's files go (patterns, sub-folders left empty with them) and come back if the new run
    fails; the user's files, folders and the inputs the config names stay; a folder no run finished in is left."""
    names = ("comparison.md", "speedup.png", "timeline_mlp_4x.png", "placement.json", "graph.json", "metrics.json",
             "policy_search/placement.json", "policy_search/trace.csv", "search/placement.json",
             "notes.txt", "cp/mine.txt", "place.log", ".hydra/config.yaml")
    for name in names:
        _touch(tmp_path / name)
    (tmp_path / "fit").mkdir()  # an empty folder of that name, not made by this run: left alone
    cfg = {"graph": {"path": str(tmp_path / "graph.json")}, "other": ["x", 3, None]}
    earlier = set_aside(tmp_path, place.REPLACES, keep=config_paths(cfg))
    assert earlier.names == ["comparison.md", "metrics.json", "placement.json", "policy_search/placement.json",
                             "policy_search/trace.csv", "search/placement.json", "speedup.png", "timeline_mlp_4x.png"]
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == [".hydra/config.yaml", "cp/mine.txt", "graph.json", "notes.txt", "place.log"]
    assert not (tmp_path / "policy_search").exists() and not (tmp_path / "search").exists()
    assert (tmp_path / "fit").is_dir() and (tmp_path / "cp").is_dir()
    _touch(tmp_path / "placement.json", "new")  # the failed run wrote this one again: it stays
    earlier.restore()
    back = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert back == sorted(names) and (tmp_path / "placement.json").read_text() == "new"
    assert [p.name for p in tmp_path.parent.iterdir() if "-earlier-" in p.name] == []  # its store is gone
    (tmp_path / "metrics.json").unlink()  # no finished run: nothing is taken
    assert set_aside(tmp_path, place.REPLACES).names == [] and (tmp_path / "comparison.md").is_file()
    assert set_aside(tmp_path / "absent", place.REPLACES).names == []


def test_a_failed_rerun_keeps_the_earlier_results(tmp_path):
    """A rerun refused for a bad input (a graph file with a cycle) deleted the earlier run's files, then the folder."""
    run = tmp_path / "run"
    for name in ("comparison.md", "metrics.json", "placement.json", "notes.txt"):
        _touch(run / name)
    bad = _touch(tmp_path / "cycle.json", json.dumps({
        "schema": "placement_rl.graph", "version": 1, "name": "c", "edges": [[0, 1, 1], [1, 0, 1]],
        "nodes": [{"name": x, "fwd_flops": 1, "bwd_flops": 1, "out_bytes": 1, "param_bytes": 0, "act_bytes": 0}
                  for x in "ab"]}))
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "place", f"graph.path={bad}",
                        "topology=1x_t4", "samples=0", "compare=false", "progress=false", f"hydra.run.dir={run}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stderr
    files = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts)
    assert {"comparison.md", "metrics.json", "placement.json", "notes.txt"} <= set(files), files


def test_place_in_a_folder_given_again_says_what_it_removed(tmp_path):
    """The second run's folder holds its files only (an mlp run's comparison, timeline and policy_search placement
    went), says so in one line, and keeps the user's file and the graph file it reads from that folder."""
    from tests.test_cli import tiny_graph_object

    run = tmp_path / "run"
    for name in ("comparison.md", "comparison.csv", "speedup.png", "timeline_mlp_4x_v100_nvlink.png",
                 "metrics.json", "policy_search/placement.json", "policy_search/anytime.png", "notes.txt"):
        _touch(run / name)
    tiny_graph_object().to_json(run / "graph.json")  # an input read from the run folder itself
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "place", f"graph.path={run / 'graph.json'}",
                        "topology=1x_t4", "samples=0", "compare=false", "progress=false", f"hydra.run.dir={run}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stdout.splitlines() if "held an earlier place run's files" in ln]
    assert len(said) == 1 and said[0].endswith(
        "comparison.csv, comparison.md, metrics.json, policy_search/anytime.png, policy_search/placement.json, "
        "speedup.png, timeline_mlp_4x_v100_nvlink.png"), r.stdout
    files = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts)
    assert files == ["best/graph.json", "best/placement.json", "graph.json", "metrics.json", "notes.txt", "place.log",
                     "placement.json"]


def test_phases_report_a_long_phase_while_it_runs(capsys):
    """A phase given ``status`` prints ``<label>: <status>, <s> s so far`` while it runs; progress=false none."""
    asked = threading.Event()

    def status() -> str:
        asked.set()
        return "5 of 16 done"

    with Phases(True, every=0.01)("16 sampled placements", status=status):
        assert asked.wait(30)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "16 sampled placements ..." and out[-1].startswith("16 sampled placements: ")
    assert any(ln.startswith("16 sampled placements: 5 of 16 done, ") and ln.endswith(" s so far") for ln in out)
    quiet = threading.Event()
    with Phases(False, every=0.01)("x", status=lambda: quiet.set() or "y"):
        assert not quiet.wait(0.2)
    assert capsys.readouterr().out == ""


def test_sampled_placements_are_counted_as_each_part_ends():
    """``with_samples`` says how many placements are done after each batched part, for ``place``'s line every
    10 s (a 10,000-node graph sampled for 214 s in silence); the placements are those it draws without it."""
    from placement_rl.agents.constructive_eval import greedy_result, with_samples
    from placement_rl.agents.constructive_train import default_checkpoint, load_policy
    from placement_rl.baselines.eft import LINK_SCALES
    from placement_rl.cost import resolve_costs
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.graph import synthetic
    from placement_rl.topology import load_topology

    torch.set_num_threads(1)
    policy, _, _ = load_policy(str(default_checkpoint()))
    g, t = synthetic.sample("layered", num_nodes=24, seed=1), load_topology("4x_v100_nvlink")
    task = ConstructiveTask(g, t, resolve_costs(g, t))
    res = greedy_result(policy, task)
    for k in (3, 16):
        want = with_samples(policy, res, k, torch.Generator().manual_seed(7))
        seen: list[int] = []
        got = with_samples(policy, res, k, torch.Generator().manual_seed(7), done=seen.append)
        assert seen == [min(k, len(LINK_SCALES))] + ([k] if k > len(LINK_SCALES) else [])
        for f in ("devices", "times", "feasible"):
            assert np.array_equal(getattr(got.sampled, f), getattr(want.sampled, f)), (k, f)
    assert place.samples_status(0, 16) == "0 of 16 done (the 5 on slower links decoded together)"
    assert place.samples_status(5, 16) == "5 of 16 done (the 11 drawn ones decoded together)"
    assert place.samples_status(3, 3) == "3 of 3 done"


def test_bound_of_a_coarsened_graph_holds_for_its_groups():
    """A coarsened graph's bound is one on placing its groups, and the line says so; an uncoarsened graph's on
    any placement."""
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.graph.spec import graph_from_spec
    from placement_rl.topology import load_topology

    gpt = graph_from_spec({"source": "zoo", "name": "gpt", "overrides": {}, "coarsen": {"enabled": True}})
    assert gpt.meta["coarsen"]["source_nodes"] > gpt.num_nodes and place.coarse_groups(gpt) == gpt.num_nodes
    flat = graph_from_spec({"source": "zoo", "name": "gpt", "overrides": {}, "coarsen": {"enabled": False}})
    graph = synthetic.sample("layered", num_nodes=20, seed=0)
    assert place.coarse_groups(flat) is None and place.coarse_groups(graph) is None
    topo = load_topology("4x_v100_nvlink")
    bound = lower_bound(graph, resolve_costs(graph, topo), topo)
    note = place.bound_note(bound, bound.value, groups=500)
    assert note.startswith(f"lower bound {bound.value * 1e3:.3f} ms (no placement of these 500 groups is faster; ")
    assert "(no placement is faster; " in place.bound_note(bound, bound.value)
