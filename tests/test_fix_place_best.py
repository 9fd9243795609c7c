"""``place``: ``best/placement.json``, the fastest placement that fits of all the run computed (``placement.json``
stays the policy's own); a line estimating long samples before they start; whether the single device of
``best_single_device_time`` fits memory."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from placement_rl.cli import place
from placement_rl.cli.common import _compose
from placement_rl.cli.place_notes import samples_note
from placement_rl.cli.run_folder import set_aside
from placement_rl.errors import ConfigError

torch.set_num_threads(1)

SMALL = ("graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "progress=false")
NODE = {"op_type": "linear", "module_path": "", "fwd_flops": 1e10, "bwd_flops": 2e10, "out_bytes": 1e6,
        "param_bytes": 4e6, "act_bytes": 1e6}
LINKS = {"intra_host": {"bandwidth": 16e9, "latency": 1e-5, "kind": "pcie"}}


def _cfg(*overrides: str):
    cfg, _ = _compose("place", list(overrides), [])
    return OmegaConf.create(cfg)


def _graph(tmp_path, name: str, nodes: list[str], edges: list[list]) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"schema": "placement_rl.graph", "version": 1, "name": name,
                                "meta": {"batch_size": 1}, "nodes": [{"name": n, **NODE} for n in nodes],
                                "edges": edges}))
    return f"graph.path={path}"


def _topology(tmp_path, name: str, devices: list[dict]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "devices": devices, "links": LINKS}))
    return f"topology.path={path}"


def _two_chains_on_three_gpus(tmp_path) -> tuple[str, str]:
    """Two chains of four on an H100, a T4 and a GPU of its own figures: the policy's greedy 9.635 ms, the
    optimum (brute force over 3^8 placements) 9.215 ms, which a local search from the policy's reaches."""
    chains = [[4 * c + k, 4 * c + k + 1, 1e6] for c in (0, 1) for k in range(3)]
    graph = _graph(tmp_path, "disconnected", [f"{c}{k}" for c in "ab" for k in range(4)], chains)
    own = {"name": "mystery", "model": "Acme Z9000", "peak_flops": 3e13, "mem_bandwidth": 1.2e12,
           "memory_bytes": 51539607552, "sm_count": 96, "l2_bytes": 50331648, "peak_flops_bf16": 2e14,
           "peak_flops_tf32": 1e14}
    topology = _topology(tmp_path, "mixed", [{"name": "h100", "model": "H100-SXM5-80GB"},
                                             {"name": "t4", "model": "Tesla T4"}, own])
    return graph, topology


def test_best_holds_the_search_placement_faster_than_the_policys(tmp_path, monkeypatch, capsys):
    """placement.json kept the policy's 9.635 ms plan while the run's own search found 9.215 ms (only in
    search/placement.json); best/placement.json now holds the fastest that fits, and a line says so."""
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path / "run")
    (tmp_path / "run").mkdir()
    m = place.run(_cfg(*_two_chains_on_three_gpus(tmp_path), "progress=false", "samples=0", "compare=false",
                       "search_budget=300"))
    out = capsys.readouterr().out
    assert m["search"]["feasible"] and m["search"]["step_time"] < m["step_time"] * 0.99
    assert m["best_source"] == "search" and m["best_step_time"] == m["search"]["step_time"]
    run = tmp_path / "run"
    best = json.loads((run / "best" / "placement.json").read_text())
    assert best["device_of_node"] == json.loads((run / "search" / "placement.json").read_text())["device_of_node"]
    assert best["device_of_node"] != json.loads((run / "placement.json").read_text())["device_of_node"]
    assert json.loads((run / "metrics.json").read_text())["best_source"] == "search"
    assert (f"best/placement.json: the placement of search/ ({m['best_step_time'] * 1e3:.3f} ms), the fastest that "
            f"fits of this run's; placement.json stays the policy's own ({m['step_time'] * 1e3:.3f} ms)") in out
    assert "best/placement.json" in out.splitlines()[-1]  # listed with the artifacts


def test_best_is_the_policys_where_nothing_beats_it_and_goes_with_an_earlier_run(tmp_path, monkeypatch, capsys):
    """A run with nothing faster writes the policy's plan to best/ (no line about it); a rerun into the folder
    sets best/ aside with the rest of the earlier run's files, and a file named best is refused before work."""
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    m = place.run(_cfg(*SMALL, "samples=0", "compare=false"))
    assert m["best_source"] == "policy" and m["best_step_time"] == m["step_time"]
    assert (tmp_path / "best" / "placement.json").read_bytes() == (tmp_path / "placement.json").read_bytes()
    assert "the fastest that fits" not in capsys.readouterr().out
    earlier = set_aside(tmp_path, place.REPLACES)
    assert {"best/placement.json", "best/graph.json"} <= set(earlier.names) and not (tmp_path / "best").exists()
    earlier.drop()  # its store beside tmp_path goes (another test checks that no run leaves one)
    (tmp_path / "best").write_text("mine")
    with pytest.raises(ConfigError, match="best is a file; place writes the fastest placement that fits"):
        place.run(_cfg(*SMALL, "samples=0", "compare=false"))


def test_long_samples_are_announced_with_how_to_skip_them(tmp_path, monkeypatch, capsys):
    """500 groups on 64 GPUs: a greedy pass of 21 s, then 16 samples for minutes with no word of how long."""
    assert samples_note(16, 21.0) == ("16 samples next, about 16 x the greedy pass's 21.0 s (6 min): each places "
                                      "every node again (5 on slower links, 11 drawn); samples=0 skips them, fewer "
                                      "take less")
    assert samples_note(3, 12.0) == ("3 samples next, about 3 x the greedy pass's 12.0 s (36 s): each places every "
                                     "node again (3 on slower links); samples=0 skips them, fewer take less")
    assert samples_note(16, 1.5) is None  # 24 s: quiet
    import placement_rl.agents.constructive_eval as ce

    real = ce.greedy_result
    monkeypatch.setattr(ce, "greedy_result", lambda policy, task: dataclasses.replace(real(policy, task),
                                                                                       greedy_seconds=20.0))
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    place.run(_cfg(*SMALL, "samples=2", "compare=false"))
    assert "2 samples next, about 2 x the greedy pass's 20.0 s (40 s)" in capsys.readouterr().out


def test_metrics_say_whether_the_best_single_device_fits(tmp_path, monkeypatch):
    """Six 17 MB nodes on two 60 MB GPUs: metrics.json gave best_single_device_time (13.61 ms) with nothing to
    say that comparison.md's single_device row does not fit."""
    graph = _graph(tmp_path, "isolated", [f"i{k}" for k in range(6)], [])
    gpu = {"name": "gpu", "count": 2, "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 5e11, "memory_bytes": 6e7,
           "sm_count": 40, "l2_bytes": 4e6}
    topology = _topology(tmp_path, "tiny_mem60", [gpu])
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    m = place.run(_cfg(graph, topology, "progress=false", "samples=0"))
    assert m["best_single_device_time"] > 0 and m["best_single_device_feasible"] is False
    assert json.loads((tmp_path / "metrics.json").read_text())["best_single_device_feasible"] is False
    row = next(ln for ln in (tmp_path / "comparison.md").read_text().splitlines() if "| single_device |" in ln)
    assert row.split("|")[6].strip() == "no"
    assert m["feasible"] and m["best_source"] == "policy"  # split 3 / 3 it fits


def test_best_takes_a_baseline_faster_than_the_policy(tmp_path, monkeypatch, capsys):
    """With compare=true the baselines' placements count too: best/ is the fastest that fits of every row of
    comparison.csv (the policy's 9.635 ms plan against searches at the 9.215 ms optimum), said in one line."""
    import csv

    monkeypatch.setattr(place, "output_dir", lambda: tmp_path / "run")
    (tmp_path / "run").mkdir()
    m = place.run(_cfg(*_two_chains_on_three_gpus(tmp_path), "progress=false", "samples=0"))
    out = capsys.readouterr().out
    with (tmp_path / "run" / "comparison.csv").open(newline="") as f:
        fastest = min(float(r["step_time_ms"]) for r in csv.DictReader(f) if r["feasible"] == "True")
    assert m["best_step_time"] * 1e3 == pytest.approx(fastest, rel=1e-9) and m["best_step_time"] < m["step_time"]
    assert m["best_source"].endswith(" (baseline)") and f"the placement of {m['best_source']} (" in out
    best = json.loads((tmp_path / "run" / "best" / "placement.json").read_text())["device_of_node"]
    assert best != json.loads((tmp_path / "run" / "placement.json").read_text())["device_of_node"]


def test_a_stage_plan_policy_gets_the_baselines_stage_plans_too(tmp_path):
    """A stage-plan checkpoint's run copied its own 17.6 ms plan to best/ while exact fitted at 14.55 ms in the same
    comparison: the comparison hands back every baseline's plan, stage plans included."""
    from placement_rl import baselines
    from placement_rl.cli.evaluate import compare_learned
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.plans import StagePlan
    from placement_rl.topology import load_topology

    graph, topo = synthetic.sample("layered", num_nodes=12, seed=0), load_topology("2x_k80")
    costs = resolve_costs(graph, topo)
    own = baselines.get_pipeline("pp_uniform")(graph, costs, topo, budget=50, seed=0)
    found: dict = {}
    compare_learned(graph, costs, topo, tmp_path, label="policy", plan=own, step_time=own.meta["step_time"],
                    feasible=own.meta["feasible"], seconds=0.0, sim_calls=1, seed=0, what="t", found=found)
    plans = {k: v for k, v in found.items() if isinstance(v["devices"], StagePlan)}
    assert "exact (baseline)" in plans and all(k.endswith(" (baseline)") for k in found)
    fastest = min(v["step_time"] for v in found.values() if v["feasible"])
    assert fastest <= own.meta["step_time"] and plans["exact (baseline)"]["step_time"] >= fastest
