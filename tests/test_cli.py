"""The command line: artifacts land in the run directory; bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from placement_rl.graph import make_graph
from placement_rl.plans import Placement, StagePlan
from placement_rl.topology import load_topology


def cli(tmp_path: Path, *args: str, timeout: int = 300, run: str = "run") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", *args, f"hydra.run.dir={tmp_path}/{run}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)


def tiny_graph_object():
    return make_graph([{"name": "a", "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
                        "out_bytes": 1e6},
                       {"name": "b", "fwd_flops": 2e9, "bwd_flops": 4e9, "param_bytes": 8e6, "act_bytes": 1e6,
                        "out_bytes": 1e6},
                       {"name": "c", "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
                        "out_bytes": 4}],
                      [[0, 1, 1e6], [0, 2, 1e6], [1, 2, 1e6]], name="tiny")


@pytest.fixture
def tiny_graph(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    tiny_graph_object().to_json(path)
    return path


def test_no_subcommand_lists_them(tmp_path):
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for cmd in ("inspect", "evaluate", "train", "place"):
        assert cmd in r.stdout


def test_a_commands_help_lists_only_the_groups_it_composes():
    from placement_rl.cli.help import command_groups

    assert command_groups("deploy") == ["graph", "topology"] and command_groups("inspect") == ["graph"]
    assert {"agent", "encoder", "env", "trainer"} <= set(command_groups("train"))
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "deploy", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.startswith("placement-rl deploy: run a plan.json")
    assert "\ntopology: " in r.stdout and "2x_cpu" in r.stdout and "plan: ???" in r.stdout
    assert "\nagent:" not in r.stdout and "\ntrainer:" not in r.stdout  # Hydra listed every group of conf/


def test_help_after_overrides_and_a_group_the_command_does_not_take():
    """``train +experiment=zeroshot --help`` failed (the help override came after the flag: argparse refused it);
    ``evaluate agent=ppo`` got Hydra's advice ``+agent=ppo``, which evaluate then took and ignored."""
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "train", "+experiment=zeroshot", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("placement-rl train: ")
    for arg in ("agent=ppo", "+agent=ppo"):
        r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "evaluate", arg], capture_output=True,
                           text=True)
        assert r.returncode == 2 and "placement-rl evaluate takes no agent group (its groups: graph, topology)" \
            in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_subcommand_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "fly"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown subcommand 'fly'" in r.stderr


def test_bad_decode_threads_exits_2_before_any_work(tmp_path):
    import os

    env = {**os.environ, "PLACEMENT_RL_DECODE_THREADS": "lots"}
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "place", f"hydra.run.dir={tmp_path}/run"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "PLACEMENT_RL_DECODE_THREADS='lots'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_inspect_writes_graph_json(tmp_path, tiny_graph):
    r = cli(tmp_path, "inspect", f"graph.path={tiny_graph}")
    assert r.returncode == 0, r.stderr
    assert "graph tiny" in r.stdout
    written = json.loads((tmp_path / "run" / "graph.json").read_text())
    assert [n["name"] for n in written["nodes"]] == ["a", "b", "c"]


def test_inspect_cycle_is_one_line_exit_2_and_writes_nothing(tmp_path, tiny_graph):
    data = json.loads(tiny_graph.read_text())
    data["edges"].append([2, 0, 8])
    bad = tmp_path / "cycle.json"
    bad.write_text(json.dumps(data))
    r = cli(tmp_path, "inspect", f"graph.path={bad}")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cycle" in lines[0] and "'a'" in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_bad_override_exits_2(tmp_path):
    r = cli(tmp_path, "inspect", "graph.no_such_key=1")
    assert r.returncode == 2


def test_evaluate_placement_with_unknown_device_exits_2(tmp_path, tiny_graph):
    bad = tmp_path / "placement.json"
    bad.write_text(json.dumps({"schema": "placement_rl.placement", "version": 1, "devices": ["gpu0", "gpu7"],
                               "device_of_node": [0, 1, 1]}))
    r = cli(tmp_path, "evaluate", "suite=single", f"graph.path={tiny_graph}", "topology=2x_k80", f"plan={bad}")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "gpu7" in lines[0], r.stderr


def test_evaluate_stage_plan_with_gap_exits_2(tmp_path, tiny_graph):
    bad = tmp_path / "plan.json"
    topo = load_topology("2x_k80")
    plan = StagePlan(stage_of_node=[0, 0, 2], stage_devices=((0,), (1,), (1,)), schedule="interleaved1f1b")
    bad.write_text(plan.to_json(topology=topo))
    r = cli(tmp_path, "evaluate", "suite=single", f"graph.path={tiny_graph}", "topology=2x_k80", f"plan={bad}")
    assert r.returncode == 2
    assert "stage 1 has no nodes" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_evaluate_single_case_scores_given_plan(tmp_path, tiny_graph):
    topo = load_topology("2x_k80")
    good = tmp_path / "placement.json"
    Placement(np.array([0, 1, 0])).to_json(good, topology=topo)
    r = cli(tmp_path, "evaluate", "suite=single", f"graph.path={tiny_graph}", "topology=2x_k80", f"plan={good}",
            "budget=64")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    md = (out / "comparison.md").read_text()
    for name in ("single_device", "heft", "m_sct", "local_search", "exhaustive", "pp_time_dp", "given:placement.json"):
        assert name in md
    rows = json.loads((out / "metrics.json").read_text())["rows"]
    exhaustive = next(r for r in rows if r["placer"] == "exhaustive")
    assert all(r["step_time"] >= exhaustive["step_time"] - 1e-12 for r in rows
               if r["kind"] == "placement" and r["feasible"])
    assert (out / "speedup.png").stat().st_size > 0 and list(out.glob("timeline_*.png"))
    # one case: its best placement and best stage plan as files deploy takes, each beside its graph.json
    m = json.loads((out / "metrics.json").read_text())
    from placement_rl.cost import resolve_costs, simulate, simulate_pipeline
    from placement_rl.graph.ir import CompGraph
    from placement_rl.plans import load_plan

    graph = CompGraph.from_json(out / "best_plan" / "graph.json")
    for kind, file in (("placement", "best_placement/placement.json"), ("pipeline", "best_plan/plan.json")):
        best = min((r for r in rows if r["kind"] == kind and r["feasible"]), key=lambda r: r["step_time"])
        assert m["best"][kind] == {"placer": best["placer"], "step_time": best["step_time"], "file": file}
        plan = load_plan(str(out / file), topology=topo, graph=graph)
        assert isinstance(plan, StagePlan) == (kind == "pipeline")
        sim = simulate_pipeline if kind == "pipeline" else simulate
        assert sim(graph, resolve_costs(graph, topo), topo, plan).step_time == pytest.approx(best["step_time"],
                                                                                           rel=1e-9)


@pytest.mark.slow
def test_train_quick_then_place_zero_shot(tmp_path):
    r = cli(tmp_path, "train", "graph=synthetic", "graph.num_nodes=24", "topology=4x_v100_nvlink", "trainer=quick",
            "env=placement", "agent=maskable_ppo", "trainer.total_steps=512", "progress=false")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    for name in ("checkpoint.pt", "placement.json", "metrics.json", "training.png", "comparison.md"):
        assert (out / name).is_file(), name
    m = json.loads((out / "metrics.json").read_text())
    assert m["step_time"] > 0 and m["sim_calls"] > 0 and m["total_steps"] >= 512
    assert str(out) in r.stdout
    ck = out / "checkpoint.pt"
    r2 = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "place", f"checkpoint={ck}", "graph=synthetic",
                         "graph.num_nodes=120", "topology=4x_v100_nvlink", f"hydra.run.dir={tmp_path}/place"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr
    placed = json.loads((tmp_path / "place" / "placement.json").read_text())
    assert len(placed["device_of_node"]) == 120
    # the constructive policy's options on this older kind of checkpoint: one line naming the key, exit 2
    r3 = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "place", f"checkpoint={ck}", "graph=synthetic",
                         "graph.num_nodes=12", "topology=4x_v100_nvlink", "bound_seconds=1",
                         f"hydra.run.dir={tmp_path}/place2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r3.returncode == 2 and "bound_seconds" in r3.stderr and "Traceback" not in r3.stderr, r3.stderr


def test_train_finetunes_the_pretrained_policy_and_place_uses_it(tmp_path):
    """The default train (the main job, in the default run: its fine-tuning search cut to 0.5 s): the packaged policy
    zero-shot, fine-tuned and searched, each its own row; then place."""
    r = cli(tmp_path, "train", "graph=synthetic", "graph.family=dataflow", "graph.num_nodes=40",
            "topology=4x_v100_nvlink", "agent.rl_iters=2", "agent.samples=4", "agent.eval_samples=4",
            "agent.search_budget=30", "agent.ft_search_seconds=0.5", "trainer.compare=false", "progress=false")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    for name in ("checkpoint.pt", "placement.json", "metrics.json", "learned.md", "training.png",
                 "search/placement.json"):
        assert (out / name).is_file(), name
    m = json.loads((out / "metrics.json").read_text())
    kinds = {row["row"]: row["kind"] for row in m["rows"]}
    assert kinds["policy zero-shot (greedy)"] == "learned" and kinds["heft"] == "heuristic"
    assert kinds["sim_eft"] == "heuristic" and kinds["learned + local search"] == "search"
    learned = min(row["step_time_ms"] for row in m["rows"] if row["kind"] == "learned")
    assert m["learned_step_time"] * 1e3 == pytest.approx(learned)
    # every zero-shot row and the fine-tuned greedy have the searches a user would run instead at their seconds
    by_label = {row["row"]: row for row in m["rows"]}
    same = {}
    for row in m["rows"]:
        if row.get("same_seconds_as"):
            assert row["kind"] == "search" and by_label[row["same_seconds_as"]]["kind"] == "learned"
            assert row["row"].startswith(row["search"] + " ")
            same.setdefault(row["same_seconds_as"], set()).add(row["search"])
    assert same == {"policy zero-shot (greedy)": {"local_search", "la_rule_search"},
                    "policy zero-shot (best of 4)": {"local_search", "la_rule_search"},
                    "policy fine-tuned (greedy)": {"policy_search", "local_search", "la_rule_search"}}
    r2 = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=50", "topology=2x4_v100_ib", "samples=2",
             "compare=false", run="place")
    assert r2.returncode == 0, r2.stderr
    pm = json.loads((tmp_path / "place" / "metrics.json").read_text())
    assert pm["policy"] == "constructive" and pm["best_of_k_step_time"] <= pm["greedy_step_time"]
    assert len(json.loads((tmp_path / "place" / "placement.json").read_text())["device_of_node"]) == 50
    assert pm["finetuned_on"] is None and "fine-tuned on" not in r2.stdout
    # the fine-tuned checkpoint on another graph: placed, with a note that it was fitted to the one it trained on
    r3 = cli(tmp_path, "place", f"checkpoint={out / 'checkpoint.pt'}", "graph=synthetic", "graph.num_nodes=50",
             "topology=2x4_v100_ib", "samples=0", "compare=false", run="place_tuned")
    assert r3.returncode == 0, r3.stderr
    tuned = json.loads((tmp_path / "place_tuned" / "metrics.json").read_text())["finetuned_on"]
    assert tuned.endswith("@4x_v100_nvlink") and f"was fine-tuned on {tuned}, not " in r3.stdout


@pytest.mark.slow
def test_place_window_overrides_and_honest_calls(tmp_path):
    """The shipped policy places a 50-node graph with the whole-graph window by default (every placement: N x D
    completions + 1 simulate); ``full_window=0 window=8`` reads an 8-node window (1 call per placement)."""
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=50", "topology=2x4_v100_ib", "samples=1",
            "compare=false", run="full")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "full" / "metrics.json").read_text())
    assert m["window"] >= 50 and m["sim_calls"] == 2 * (50 * 8 + 1)
    assert m["warm_up_seconds"] > 0.0  # numba's compile / cache load, kept out of the placement's own seconds
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=50", "topology=2x4_v100_ib", "samples=1",
            "compare=false", "full_window=0", "window=8", run="short")
    assert r.returncode == 0, r.stderr
    m2 = json.loads((tmp_path / "short" / "metrics.json").read_text())
    assert m2["window"] == 8 and m2["sim_calls"] == 2 and m2["step_time"] > 0
    r = cli(tmp_path, "place", "window=-1", run="bad")
    assert r.returncode == 2 and "window" in r.stderr and not (tmp_path / "bad").exists()


def test_place_with_a_corrupted_checkpoint_exits_2(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00garbage")
    r = cli(tmp_path, "place", f"checkpoint={bad}", "graph=synthetic", "graph.num_nodes=10")
    assert r.returncode == 2 and "is not a PyTorch file, not a checkpoint" in r.stderr \
        and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
    (tmp_path / "placement.json").write_text(json.dumps({"schema": "placement_rl.placement"}))  # a plan, not weights
    r = cli(tmp_path, "place", f"checkpoint={tmp_path / 'placement.json'}", "graph=synthetic", "graph.num_nodes=10")
    assert r.returncode == 2 and "is a JSON file (a plan or placement?), not a checkpoint" in r.stderr \
        and "weights_only" not in r.stderr


def test_place_with_missing_checkpoint_exits_2(tmp_path):
    r = cli(tmp_path, "place", f"checkpoint={tmp_path}/nope.pt", "graph=synthetic", "graph.num_nodes=10")
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_deploy_stage_plan_and_placement_write_deploy_json(tmp_path):
    from placement_rl import baselines
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import zoo
    from placement_rl.graph.capture import capture_zoo
    from placement_rl.graph.coarsen import coarsen

    graph = coarsen(capture_zoo("gpt", **zoo.tiny("gpt")))
    topo = load_topology("2x_cpu")
    costs = resolve_costs(graph, topo)
    plan = baselines.get_pipeline("pp_uniform")(graph, costs, topo, budget=10, seed=0, num_microbatches=2)
    graph.to_json(tmp_path / "graph.json")
    plan.to_json(tmp_path / "plan.json", graph=graph, topology=topo)
    baselines.get("round_robin")(graph, costs, topo, budget=10, seed=0).to_json(
        tmp_path / "placement.json", graph=graph, topology=topo)
    for name in ("plan.json", "placement.json"):
        r = cli(tmp_path, "deploy", f"plan={tmp_path / name}", "steps=2", "timeout_s=120", run=f"{name}.run")
        assert r.returncode == 0, r.stderr
        report = json.loads((tmp_path / f"{name}.run" / "deploy.json").read_text())
        assert report["measured_step_time"] > 0 and report["predicted_step_time"] > 0
        assert report["kind"] == ("stage_plan" if name == "plan.json" else "placement")
    bad = tmp_path / "bad_plan.json"
    data = json.loads((tmp_path / "plan.json").read_text())
    data["stage_devices"] = [["cpu0"], ["cpu0"]]
    bad.write_text(json.dumps(data))
    r = cli(tmp_path, "deploy", f"plan={bad}")
    assert r.returncode == 2 and "used by stages 0 and 1" in r.stderr


@pytest.mark.slow
def test_deploy_refuses_bad_dp_plans_before_any_process(tmp_path):
    """A DP degree that does not divide the batch, an fsdp plan without enough memory, unequal DP degrees:
    one line naming the problem, exit 2, no rank started."""
    from placement_rl.graph import zoo
    from placement_rl.graph.capture import capture_zoo
    from placement_rl.graph.coarsen import coarsen
    from placement_rl.plans import StagePlan

    graph = coarsen(capture_zoo("gpt", **zoo.tiny("gpt")))
    graph.to_json(tmp_path / "graph.json")
    n = graph.num_nodes
    half = [0 if i < n // 2 else 1 for i in range(n)]
    small = tmp_path / "small.yaml"
    small.write_text("name: small\ndevices:\n  - {name: gpu, count: 4, kind: gpu, peak_flops: 1.0e+12, "
                     "mem_bandwidth: 1.0e+11, memory_bytes: 10000}\nlinks:\n  intra_host: {bandwidth: 1.0e+9, "
                     "latency: 1.0e-6}\n")
    names = ["gpu0", "gpu1", "gpu2", "gpu3"]
    cases = {
        "dp_batch": (dict(stage_of_node=[0] * n, stage_devices=[names[:3]], batch_size=4),
                     "batch size 4 is not divisible"),
        "fsdp_memory": (dict(stage_of_node=[0] * n, stage_devices=[names[:2]], sharding="fsdp"),
                        "fsdp plan does not fit topology 'small': gpu0 needs"),
        "unequal_dp": (dict(stage_of_node=half, stage_devices=[names[:2], names[2:3]]), "unequal DP degrees"),
    }
    for name, (fields, message) in cases.items():
        data = StagePlan(stage_of_node=[0], stage_devices=[(0,)]).to_dict()
        data.update(fields, num_microbatches=1)
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
        r = cli(tmp_path, "deploy", f"plan={tmp_path / name}.json", f"topology.path={small}", run=name)
        assert r.returncode == 2, (name, r.stderr)
        lines = [x for x in r.stderr.strip().splitlines() if x.strip() and "implausibly small" not in x]
        assert len(lines) == 1 and message in lines[0], (name, r.stderr)  # the tiny memory said, then the error
        assert not (tmp_path / name / "deploy.json").exists()


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    return lines[0]


def test_place_refuses_a_run_folder_it_cannot_write_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    line = _one_line(cli(tmp_path, "place", "graph=mlp", "topology=4x_v100_nvlink", run="afile/sub"))
    assert f"hydra.run.dir={tmp_path}/afile/sub" in line and "is a file, not a folder" in line
    (tmp_path / "run" / "placement.json").mkdir(parents=True)
    line = _one_line(cli(tmp_path, "place", "graph=mlp", "topology=4x_v100_nvlink", "compare=false"))
    assert "placement.json is a folder" in line
    assert not (tmp_path / "run" / "graph.json").exists()  # refused before anything was written


def test_profile_with_an_unknown_device_leaves_no_run_folder(tmp_path):
    line = _one_line(cli(tmp_path, "profile", "devices=[nope]"))
    assert "no local device 'nope'" in line and not (tmp_path / "run").exists()


def test_errors_write_numbers_plainly(tmp_path, tiny_graph):
    data = json.loads(tiny_graph.read_text())
    data["edges"][0][2] = -5.0
    bad = tmp_path / "neg.json"
    bad.write_text(json.dumps(data))
    line = _one_line(cli(tmp_path, "inspect", f"graph.path={bad}"))
    assert "edge_bytes=-5.0" in line and "np." not in line


def test_evaluate_metrics_are_strict_json_and_every_file_is_listed(tmp_path):
    """A placer that cannot run has no step time: null in metrics.json (bare NaN is not JSON)."""
    r = cli(tmp_path, "evaluate", "graph=synthetic", "graph.num_nodes=30", "topology=2x_k80", "placers=[exhaustive]",
            "pipeline=false", "budget=8", "progress=false")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "run" / "metrics.json").read_text()
    rows = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.json"))["rows"]
    assert next(row for row in rows if row["placer"] == "exhaustive")["step_time"] is None
    listed = r.stdout.strip().splitlines()[-1].split(": ", 1)[1].split(", ")
    assert any(name.startswith("timeline_") for name in listed)
    assert all((tmp_path / "run" / name).is_file() for name in listed), listed


def test_evaluate_seconds_holds_the_searches_to_wall_clock_seconds(tmp_path):
    """seconds=S: every op-level placer gets S seconds as well as the calls; with a call budget no search can spend,
    the seconds end the searches (a comparison at equal seconds); seconds must be > 0."""
    budget = 10**8
    r = cli(tmp_path, "evaluate", "graph=synthetic", "graph.num_nodes=40", "topology=4x_v100_nvlink",
            "placers=[sim_eft,local_search,la_rule_search]", "pipeline=false", f"budget={budget}", "seconds=0.3",
            "progress=false")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["seconds"] == 0.3 and "and 0.3 s" in (tmp_path / "run" / "comparison.md").read_text()
    rows = {row["placer"]: row for row in m["rows"]}
    for name in ("local_search", "la_rule_search"):
        assert 0 < rows[name]["sim_calls"] < budget, name
        assert rows[name]["feasible"] and rows[name]["step_time"] > 0, name
    r = cli(tmp_path, "evaluate", "graph=synthetic", "seconds=0", run="bad")
    assert r.returncode == 2 and "seconds" in r.stderr and "Traceback" not in r.stderr


def test_place_shows_its_phases_and_lists_what_it_writes(tmp_path):
    """Each long phase says when it starts and how long it took; the artifact line names every file written
    (graph.json and the comparison plots too); samples=0 is greedy only; one device is '1 device'."""
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=12", "topology=1x_t4", "samples=0")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "(1 device)" in out and "1 devices" not in out
    assert "best of 0" not in out and "greedy only" in out
    assert "greedy placement (window" in out and "sampled placement" not in out
    assert "baselines" in r.stderr  # the bar over the baselines, as evaluate shows one over its cases
    listed = [ln for ln in out.splitlines() if ln.startswith("artifacts in")][0].split(": ", 1)[1].split(", ")
    assert {"graph.json", "placement.json", "metrics.json", "speedup.png"} <= set(listed)
    assert any(name.startswith("timeline_") for name in listed)
    written = {p.name for p in (tmp_path / "run").iterdir() if p.name != ".hydra" and not p.name.endswith(".log")}
    assert written == {name.split("/")[0] for name in listed}  # best/placement.json: the folder best
    # one device: the plan is the only placement, the bound (one device's serial work, the blocks part) is met
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["lower_bound"] == pytest.approx(metrics["step_time"], rel=1e-6)
    assert "lower bound on any placement's step time" in out and "the plan is at the bound" in out


@pytest.mark.slow
def test_place_bound_seconds_adds_the_cp_part_to_its_lower_bound(tmp_path):
    """bound_seconds=S: CP-SAT (``bounds_cp``) tightens the printed lower bound; it stays at most the plan's step
    time and at least every other part."""
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=20", "topology=4x_v100_nvlink", "samples=2",
            "bound_seconds=5", "compare=false", "progress=true")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    parts = m["lower_bound_parts"]
    assert "cp" in parts and m["lower_bound"] == max(parts.values())
    assert max(v for k, v in parts.items() if k != "cp") <= m["lower_bound"] <= m["step_time"] * (1 + 1e-9)
    assert "(CP-SAT for 5 s)" in r.stdout
    # its own solution: a row of its own (cp/placement.json), never below the bound, never the plan
    cp = m["cp_solution"]
    assert cp["step_time"] >= m["lower_bound"] * (1 - 1e-9) and "CP-SAT's own placement" in r.stdout
    assert (tmp_path / "run" / "cp" / "placement.json").is_file() and "cp/placement.json" in r.stdout
    assert m["step_time"] == m["best_of_k_step_time"]


@pytest.mark.slow
def test_place_compares_with_the_policys_own_heuristics_at_their_own_calls(tmp_path):
    """place's comparison holds the bar a learned row must clear: ``sim_eft`` and its lookahead ``eft_rollout`` (the
    policy's teacher; both registered baselines) with their own calls (1; the completions + 1) and seconds, and the
    greedy placement as its own row beside the best of greedy and the samples; the best baseline counts both."""
    import csv

    from placement_rl.envs.constructive_task import reference_times
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic

    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=20", "topology=4x_v100_nvlink", "samples=2",
            "progress=false")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    rows = {row["placer"].split(" (")[0] if not row["placer"].startswith("zero-shot") else row["placer"]: row
            for row in csv.DictReader(open(tmp_path / "run" / "comparison.csv"))}
    graph, topology = synthetic.sample("layered", num_nodes=20, seed=0), load_topology("4x_v100_nvlink")
    extras: dict = {}
    refs = reference_times(graph, topology=topology, costs=resolve_costs(graph, topology), names=(), extras=extras)
    for name in ("sim_eft", "eft_rollout"):
        assert float(rows[name]["step_time_ms"]) * 1e-3 == pytest.approx(refs[name][0], rel=1e-12), name
        assert int(rows[name]["sim_calls"]) == m["heuristics"][name]["sim_calls"]
    assert int(rows["sim_eft"]["sim_calls"]) == 1
    # every completed placement a call, + 1 for the final one's simulation (as the policy's placements count)
    assert int(rows["eft_rollout"]["sim_calls"]) == extras["ref_calls"]["eft_rollout"] > 20
    greedy = rows["zero-shot policy (greedy)"]
    assert float(greedy["step_time_ms"]) * 1e-3 == pytest.approx(m["greedy_step_time"], rel=1e-12)
    assert int(greedy["sim_calls"]) * 3 == m["sim_calls"]  # greedy + 2 samples, each a placement's calls
    best = rows["zero-shot policy (best of greedy + 2 samples)"]
    assert float(best["step_time_ms"]) * 1e-3 == pytest.approx(m["step_time"], rel=1e-12)
    base = 1e-3 * min(float(row["step_time_ms"]) for name, row in rows.items()
               if not name.startswith("zero-shot") and row["feasible"] == "True")
    assert m["best_baseline_time"] == pytest.approx(base, rel=1e-12)
    assert "eft_rollout (the teacher)" in r.stdout


@pytest.mark.slow
def test_place_search_budget_refines_the_learned_placement_as_its_own_row(tmp_path):
    """search_budget=N: local search from the best learned placement, N more calls, its own search row and
    search/placement.json (the policy's placement stays placement.json); the baselines get the same calls."""
    import csv

    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=20", "topology=4x_v100_nvlink", "samples=2",
            "search_budget=300", "progress=false")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    m = json.loads((out / "metrics.json").read_text())
    assert m["search"]["step_time"] <= m["step_time"] + 1e-15  # annealing never returns worse than its start
    assert m["search"]["sim_calls"] == m["sim_calls"] + 300
    rows = list(csv.DictReader(open(out / "comparison.csv")))
    srow = [row for row in rows if row["placer"].startswith("search:")][0]
    assert int(srow["sim_calls"]) == m["search"]["sim_calls"]
    assert int([row for row in rows if row["placer"] == "random"][0]["sim_calls"]) == m["search"]["sim_calls"]
    placed = json.loads((out / "search" / "placement.json").read_text())["device_of_node"]
    assert len(placed) == 20 and "search/placement.json" in r.stdout
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "search").write_text("x")
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=20", "topology=4x_v100_nvlink", "samples=0",
            "search_budget=10", "compare=false", run="f")
    assert r.returncode == 2 and "search_budget" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_place_search_seconds_runs_policy_search_beside_the_searches_at_the_same_seconds(tmp_path):
    """search_seconds=S: policy_search for S seconds of wall clock (its own row and policy_search/placement.json;
    the policy's placement stays placement.json), with compare the non-learned searches at the same seconds; every
    search's anytime trace (trace.csv, anytime.png) and figures in metrics.json; without compare only its own."""
    import csv

    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.graph.io import graph_from_json

    # 2 s: la_rule_search and local_search side by side in worker processes (baselines.side_by_side.FROM_SECONDS)
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=30", "topology=4x_v100_nvlink", "samples=2",
            "search_seconds=2", "progress=false")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    m = json.loads((out / "metrics.json").read_text())
    found = m["policy_search"]
    assert set(found) == {"policy_search", "la_rule_search", "local_search"}
    graph, topology = graph_from_json(out / "graph.json"), load_topology("4x_v100_nvlink")
    placed = json.loads((out / "policy_search" / "placement.json").read_text())["device_of_node"]
    res = simulate(graph, resolve_costs(graph, topology), topology, Placement(np.asarray(placed)))
    assert res.step_time == pytest.approx(found["policy_search"]["step_time"], rel=1e-9)
    for name, f in found.items():
        best = [t for _, _, t in f["trace"]]
        assert best == sorted(best, reverse=True) and best[-1] == pytest.approx(f["step_time"], rel=1e-12), name
        assert f["sim_calls"] >= len(best) and f["seconds"] > 0
    with open(out / "policy_search" / "trace.csv") as fh:
        traced = {row["method"] for row in csv.DictReader(fh)}
    assert traced == set(found) and (out / "policy_search" / "anytime.png").stat().st_size > 0
    rows = [row["placer"] for row in csv.DictReader(open(out / "comparison.csv"))]
    assert {f"search: {n} for 2 s" for n in found} <= set(rows)
    assert all(1.0 < f["seconds"] < 5.0 for f in found.values())  # each kept to its 2 s on its own clock
    assert "policy_search (its own row, not the plan)" in r.stdout and "at the same seconds" in r.stdout
    assert "policy_search/placement.json" in r.stdout
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=30", "topology=4x_v100_nvlink", "samples=0",
            "search_seconds=0.2", "compare=false", "progress=false", run="own")
    assert r.returncode == 0, r.stderr
    assert set(json.loads((tmp_path / "own" / "metrics.json").read_text())["policy_search"]) == {"policy_search"}
    r = cli(tmp_path, "place", "graph=synthetic", "search_seconds=-1", run="bad")
    assert r.returncode == 2 and "search_seconds" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_place_says_when_no_placement_of_the_policy_fits_memory(tmp_path):
    """On devices too small for the policy's placement (its greedy one overflows; samples=0), place still writes
    it, but its summary marks it, one warning line says by how much on which devices and what to do, and
    metrics.json says it does not fit and gives no ratio to a baseline that does; the plan with nodes moved off the
    full devices (``memory.fit``) is written beside it as a row of its own. With samples, the policy's greedy
    placements on slower views of the links (the first samples) fit here, and the plan is one of them."""
    import yaml

    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.graph import synthetic
    from conftest import tight_topology

    graph = synthetic.sample("layered", num_nodes=30, seed=0)
    topo = tight_topology("4x_v100_nvlink", 0.5, graph)  # a baseline's search fits, the policy's placements do not
    (tmp_path / "tight.yaml").write_text(yaml.safe_dump(topo.to_dict()))
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=30", f"topology.path={tmp_path / 'tight.yaml'}",
            "samples=0", "progress=false")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["feasible"] is False and m["chosen"] == "greedy"
    assert m["best_baseline"] and m["ratio_to_best_baseline"] is None
    assert m["step_time"] == m["greedy_step_time"]
    warn = [ln for ln in r.stdout.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "the greedy placement overflows memory" in warn[0], r.stdout
    assert "search_budget=" in warn[0] and "(overflows memory)" in r.stdout
    placed = Placement.from_json((tmp_path / "run" / "placement.json").read_text()).device_of_node
    res = simulate(graph, resolve_costs(graph, topo), topo, np.asarray(placed))
    assert not res.feasible and res.step_time == pytest.approx(m["greedy_step_time"], rel=1e-9)
    over = int(np.sum(res.peak_memory > topo.array("memory_bytes")))
    assert warn[0].count(" of ") == over >= 1
    # the plan moved to fit (memory.fit): a row of its own, its own file, and the warning says so
    fitted = Placement.from_json((tmp_path / "run" / "fit" / "placement.json").read_text()).device_of_node
    res = simulate(graph, resolve_costs(graph, topo), topo, np.asarray(fitted))
    assert res.feasible and res.step_time == pytest.approx(m["fitted"]["step_time"], rel=1e-9)
    assert m["fitted"]["moved"] == int(np.sum(np.asarray(fitted) != np.asarray(placed))) >= 1
    assert f"fits at {m['fitted']['step_time'] * 1e3:.3f} ms (fit/placement.json)" in warn[0]
    assert "fit/placement.json" in r.stdout.splitlines()[-1]
    # policy_search for a few seconds repairs memory first: the warning names its placement when that fits
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=30", f"topology.path={tmp_path / 'tight.yaml'}",
            "samples=0", "search_seconds=0.5", "progress=false", "compare=false", run="timed")
    m = json.loads((tmp_path / "timed" / "metrics.json").read_text())
    warn = [ln for ln in r.stdout.splitlines() if ln.startswith("warning:")]
    assert m["policy_search"]["policy_search"]["feasible"] and "(policy_search/placement.json)" in warn[0]
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=30", f"topology.path={tmp_path / 'tight.yaml'}",
            "samples=2", "progress=false", "compare=false", run="run2")
    m = json.loads((tmp_path / "run2" / "metrics.json").read_text())
    assert m["feasible"] is True and m["chosen"].startswith("greedy on links"), r.stdout
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("warning:")]


@pytest.mark.slow
def test_place_samples_in_their_own_phase_give_what_evaluate_gives(tmp_path):
    """place reports the greedy decode and the samples as two phases; the samples draw what
    agents.constructive_eval.evaluate(samples=k) draws."""
    import torch

    from placement_rl.agents.constructive_eval import evaluate
    from placement_rl.agents.constructive_train import default_checkpoint, load_policy
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic

    torch.set_num_threads(1)
    r = cli(tmp_path, "place", "graph=synthetic", "graph.num_nodes=20", "topology=2x4_v100_ib", "samples=3",
            "seed=4", "compare=false")
    assert r.returncode == 0, r.stderr
    assert "3 sampled placements ..." in r.stdout and "3 sampled placements:" in r.stdout
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    policy, _, _ = load_policy(str(default_checkpoint()))
    graph, topology = synthetic.sample("layered", num_nodes=20, seed=0), load_topology("2x4_v100_ib")
    task = ConstructiveTask.build(graph, topology, resolve_costs(graph, topology), teachers=False)
    res = evaluate(policy, [task], samples=3, seed=4)[0]
    assert m["greedy_step_time"] == pytest.approx(res.greedy_time, rel=1e-12)
    assert m["best_of_k_step_time"] == pytest.approx(res.best_time, rel=1e-12)


@pytest.mark.slow
def test_place_multirun_sweeps_a_config_group(tmp_path):
    r = cli(tmp_path, "place", "-m", "graph=synthetic", "graph.num_nodes=10", "topology=2x_k80,2x_cpu", "samples=0",
            "compare=false", f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr
    placed = [json.loads((tmp_path / "sweep" / str(k) / "placement.json").read_text()) for k in (0, 1)]
    assert [p["devices"] for p in placed] == [["gpu0", "gpu1"], ["cpu0", "cpu1"]]
    line = _one_line(cli(tmp_path, "place", "-m", "topology=2x_k80,2x_cuh", f"hydra.sweep.dir={tmp_path}/bad"))
    assert "topology=2x_cuh" in line and not (tmp_path / "bad").exists()


def test_a_node_no_device_can_hold_is_named_and_no_search_is_advised():
    """When one node alone pins more memory than any device holds, no op-level placement fits: the warning names
    the node and points to sharded stage plans (a search cannot repair it), and the bound line says the plan does
    not fit (the bound sets memory aside)."""
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.baselines.common import Problem
    from placement_rl.cli.place_notes import bound_note, overflow_note, too_big_node
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.topology import DeviceTopology, load_topology

    graph = synthetic.sample("layered", num_nodes=20, seed=0)
    d = load_topology("4x_v100_nvlink").to_dict()
    costs = resolve_costs(graph, DeviceTopology.from_dict(d))
    mem = Problem(graph, costs, DeviceTopology.from_dict(d), budget=1, seed=0).node_mem
    assert too_big_node(graph, costs, DeviceTopology.from_dict(d)) is None
    for dev in d["devices"]:
        dev["memory_bytes"] = 0.9 * float(mem.max())
    topo = DeviceTopology.from_dict({**d, "name": "small"})
    name, need, most = too_big_node(graph, costs, topo)
    assert name == graph.names[int(np.argmax(mem))] and need == float(mem.max()) and most < need
    note = overflow_note(graph, costs, topo, np.zeros(graph.num_nodes, dtype=np.int64), 0, searched=None)
    assert f"no op-level placement fits: node '{name}' alone pins" in note and "search_seconds" not in note
    assert "\n" not in note
    bound = lower_bound(graph, costs, topo)
    assert bound_note(bound, bound.value).endswith("the plan is at the bound")
    assert bound_note(bound, bound.value, fits=False).endswith("(memory aside: the bound does not count it, and the "
                                                               "plan does not fit)")
    # a gap above a bound that counts no memory is room at most, which the line says
    assert bound_note(bound, 2 * bound.value).endswith("at most 50.0% to gain (the bound sets memory aside: where "
                                                       "memory is tight no placement may come near it)")


def test_evaluate_placers_may_name_stage_planners_too(tmp_path, tiny_graph):
    """``placers=`` takes op-level placers and stage planners alike (the schema lists both): each runs in its own
    table, and where it names planners only those (a planner's name had been an 'unknown placer' row while every
    planner ran); naming none runs every planner, as before."""
    r = cli(tmp_path, "evaluate", "suite=single", f"graph.path={tiny_graph}", "topology=2x_k80",
            "placers=[heft,pp_uniform,dp]", "budget=64", "progress=false")
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "run" / "metrics.json").read_text())["rows"]
    assert [(x["kind"], x["placer"]) for x in rows] == [("placement", "single_device"), ("placement", "heft"),
                                                        ("pipeline", "dp"), ("pipeline", "pp_uniform")]
    assert not any(x["note"] for x in rows)
    r = cli(tmp_path, "evaluate", "suite=single", f"graph.path={tiny_graph}", "topology=2x_k80", "placers=[heft]",
            "budget=64", "progress=false", run="ops")
    from placement_rl import baselines

    rows = json.loads((tmp_path / "ops" / "metrics.json").read_text())["rows"]
    assert {x["placer"] for x in rows if x["kind"] == "pipeline"} == set(baselines.pipeline_names())
