"""Command-line config checks: wall-clock keys of any finite size, keys of other options and other commands named
as such, an empty list refused, ``+key=`` that nothing reads noted, ``inspect`` says it is still building a slow
graph, and ``evaluate plan=<file>`` prices the plan in the mode it records."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from placement_rl.cli.common import preflight
from placement_rl.errors import ConfigError, GraphError


# ------------------------------------------------------------------------------------- seconds of any size
def test_side_by_side_takes_seconds_past_what_one_wait_can_hold(monkeypatch, capfd):
    """A job's deadline far beyond what ``select`` takes (1e6 s: 'timeout is too large'; 1e30 s: past the clock)
    is waited for in steps; the call budget ends the searches."""
    from placement_rl.baselines import side_by_side
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.plans import Placement
    from placement_rl.topology import load_topology

    g, topo = synthetic.sample("layered", num_nodes=24, seed=0), load_topology("2x_cpu")
    monkeypatch.setattr(side_by_side, "MAX_WAIT", 0.05)  # many short waits while the workers search
    jobs = [("local_search", 1e6, 0), ("la_rule_search", 1e30, 0)]
    out = side_by_side.run(g, resolve_costs(g, topo), topo, jobs, processes=2, budget=80)
    assert [p.meta["placer"] for p in out] == ["local_search", "la_rule_search"]
    assert all(isinstance(p, Placement) and 0 < p.meta["sim_calls"] <= 80 for p in out)
    assert "side by side:" not in capfd.readouterr().err  # run in the workers, not after a failure here


@pytest.mark.parametrize("command,override", [("evaluate", "seconds=1e30"), ("place", "search_seconds=1e30"),
                                              ("place", "bound_seconds=1e12"), ("deploy", "timeout_s=1e30"),
                                              ("train", "agent.ft_search_seconds=1e30")])
def test_seconds_past_any_run_are_one_line(command, override):
    extra = ["plan=p.json"] if command == "deploy" else []
    with pytest.raises(ConfigError, match=rf"^{re.escape(override.split('=')[0])}=.*<= 1000000000"):
        preflight(command, [*extra, override])


def test_a_million_seconds_is_taken():
    preflight("evaluate", ["suite=single", "graph=mlp", "topology=2x_cpu", "seconds=1e6", "budget=50"])
    preflight("place", ["graph=mlp", "topology=2x_cpu", "search_seconds=1e6"])


# ---------------------------------------------------------------------------- keys of other options / commands
@pytest.mark.parametrize("override,option", [("trainer.pretrain.train_tasks=0", "pretrain"),
                                             ("trainer.family.zoo=abc", "family"),
                                             ("trainer.pretrain.cache=x", "pretrain")])  # set to null in its file
def test_a_key_of_a_global_trainer_option_names_that_option(override, option):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} is a key of trainer={option}, not of "
                                          rf"trainer=default: add trainer={option}"):
        preflight("train", ["graph=synthetic", "graph.num_nodes=20", "topology=2x_cpu", override])


@pytest.mark.parametrize("command,overrides,line", [
    ("deploy", ["plan=p.json", "samples=3"], "samples is not a key of placement-rl deploy (it is a key of "
                                             "placement-rl place)"),
    ("inspect", ["budget=5"], "budget is not a key of placement-rl inspect (it is a key of placement-rl evaluate)"),
    ("place", ["budget=5"], "budget is not a key of placement-rl place (it is a key of placement-rl evaluate): did "
                            "you mean search_budget?"),
    ("inspect", ["costs.path=c.json"], "costs.path is not a key of placement-rl inspect (it is a key of "
                                       "placement-rl evaluate, train, place and deploy)"),
    ("evaluate", ["agent.lr=0.1"], "agent.lr: placement-rl evaluate takes no agent group (its groups: graph, "
                                   "topology); agent.* is read by placement-rl train"),
    # a key the command reads but no preset sets: the append advice is the fix
    ("inspect", ["graph=gpt", "graph.overrides.n_layers=2"], "'graph.overrides.n_layers' is not in the composed "
                                                             "config, which reads it: add it with "
                                                             "+graph.overrides.n_layers=<value>"),
    ("evaluate", ["topology.dtype=bf16"], "'topology.dtype' is not in the composed config, which reads it: add it "
                                          "with +topology.dtype=<value>"),
])
def test_a_key_of_another_command_or_of_no_preset_is_named_so(command, overrides, line):
    with pytest.raises(ConfigError) as info:
        preflight(command, overrides)
    assert str(info.value) == line


@pytest.mark.parametrize("command,overrides,note", [
    ("inspect", ["+budget=5"], "note: +budget=5 adds a key placement-rl inspect does not read (budget is a key of "
                               "placement-rl evaluate)"),
    ("evaluate", ["suite=single", "graph=mlp", "+samples=4"], "note: +samples=4 adds a key placement-rl evaluate "
                                                              "does not read (samples is a key of placement-rl place)"),
    ("inspect", ["+graph.foo=1"], "note: +graph.foo=1 adds a key placement-rl inspect does not read"),
])
def test_an_added_key_nothing_reads_is_noted(command, overrides, note, capsys):
    preflight(command, overrides)  # it runs: a key read before it is declared works
    assert note in capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("command,overrides", [
    ("inspect", ["graph=mlp", "+graph.overrides.layers=3"]),  # the zoo model's options: a mapping
    ("train", ["agent=ppo", "env=placement", "++agent.n_envs=3"]),  # declared
    ("evaluate", ["suite=single", "graph=mlp", "+topology.note=x"]),  # a topology's fields: its reader's
    ("train", ["+experiment=zeroshot"]),  # a group option
])
def test_an_added_key_a_schema_reads_is_not_noted(command, overrides, capsys):
    preflight(command, overrides)
    assert "note:" not in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- empty values
@pytest.mark.parametrize("command,override", [("evaluate", "placers=[]"), ("profile", "devices=[]")])
def test_an_empty_list_is_not_all(command, override):
    with pytest.raises(ConfigError, match=rf"^{re.escape(override)}: give at least one name, or null for all$"):
        preflight(command, [override])


def test_an_empty_plan_is_a_missing_plan():
    with pytest.raises(ConfigError, match=r"^plan is required: add plan=<plan.json \| placement.json>$"):
        preflight("deploy", ["plan="])


def test_a_negative_zoo_seed_is_refused_as_graph_seed_is():
    from placement_rl.graph import zoo

    with pytest.raises(ConfigError, match=r"^graph.overrides: zoo model 'mlp': option seed=-1 must be an integer "
                                          r">= 0$"):
        preflight("inspect", ["graph=mlp", "+graph.overrides.seed=-1"])
    with pytest.raises(GraphError, match="seed=-1"):
        zoo.resolve_options("mlp", {"seed": -1})
    assert zoo.resolve_options("mlp", {"seed": 3})["seed"] == 3


# ------------------------------------------------------------------------------------------ inspect progress
def test_inspect_says_it_is_still_building_a_slow_graph(tmp_path, monkeypatch, capsys):
    from placement_rl.cli import inspect
    from placement_rl.graph import synthetic

    seen: list[str] = []

    def slow_build(_gcfg):  # until the first progress line (or 10 s: none came)
        end = time.monotonic() + 10.0
        while not any("so far" in s for s in seen) and time.monotonic() < end:
            time.sleep(0.01)
            seen.append(capsys.readouterr().out)
        return synthetic.sample("layered", num_nodes=12, seed=0)

    monkeypatch.setattr(inspect, "PROGRESS_EVERY", 0.02)
    monkeypatch.setattr(inspect, "build_graph", slow_build)
    monkeypatch.setattr(inspect, "output_dir", lambda: tmp_path)
    inspect.run(OmegaConf.create({"graph": {"source": "zoo", "name": "mlp", "coarsen": {"enabled": True}}}))
    out = "".join(seen) + capsys.readouterr().out
    assert re.search(r"^zoo model mlp: capture and coarsening running, \d+ s so far$", out, re.M)
    assert (tmp_path / "graph.json").is_file()


# --------------------------------------------------------------------------------- evaluate plan=<file> mode
def _given_chain(tmp_path, monkeypatch, meta: dict):
    """A 4-node chain's placement (``meta`` recorded) written with its graph as ``evaluate`` writes them: ``(graph,
    costs, topology, plan, given_row)``, ``given_row(extra, run)`` the given row's step time of ``evaluate
    plan=<file> *extra`` in a run folder of its own."""
    from placement_rl.cli import evaluate, given
    from placement_rl.cli.common import _compose
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import make_graph
    from placement_rl.plans import Placement
    from placement_rl.topology import load_topology

    g = make_graph([{"name": n, "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
                     "out_bytes": 1e6} for n in "abcd"], [[0, 1, 1e6], [1, 2, 1e6], [2, 3, 1e6]], name="chain")
    topo = load_topology("2x_k80")
    plan = Placement(np.array([0, 0, 1, 1]), meta={"placer": "heft", **meta})
    (tmp_path / "made").mkdir()
    g.to_json(tmp_path / "made" / "graph.json")
    plan.to_json(tmp_path / "made" / "placement.json", graph=g, topology=topo)
    arg = f"plan={tmp_path / 'made' / 'placement.json'}"

    def given_row(extra: list[str], run: str) -> float:
        (tmp_path / run).mkdir()
        monkeypatch.setattr(evaluate, "output_dir", lambda: tmp_path / run)
        monkeypatch.setattr(given, "task_overrides", lambda: [arg, *extra])
        cfg, _ = _compose("evaluate", [arg, "placers=[single_device]", "pipeline=false", "budget=8", "progress=false",
                                       *extra], [])
        rows = evaluate.run(OmegaConf.create(cfg))
        return next(r.step_time for r in rows if r.placer == "given:placement.json")

    return g, resolve_costs(g, topo), topo, plan, given_row


def test_evaluate_compares_a_given_plan_by_the_objective_it_records(tmp_path, monkeypatch, capsys):
    from placement_rl.evaluate import priced

    g, costs, topo, plan, given_row = _given_chain(tmp_path, monkeypatch, {"objective": "throughput"})
    want = {o: priced(g, costs, topo, plan, objective=o).step_time for o in ("step", "throughput")}
    assert want["step"] > 1.2 * want["throughput"]
    assert given_row([], "as_recorded") == pytest.approx(want["throughput"])
    assert ("evaluating by objective throughput, the one the plan was planned for (its meta.objective)"
            in capsys.readouterr().out.splitlines())
    assert given_row(["objective=step"], "told") == pytest.approx(want["step"])
    assert ("note: the plan was planned for objective throughput (its meta.objective); objective=step compares it "
            "by step here") in capsys.readouterr().out.splitlines()


def test_evaluate_prices_a_given_plan_in_the_mode_it_records(tmp_path, monkeypatch, capsys):
    from placement_rl.cost import simulate
    from placement_rl.cost.modes import inference_costs

    g, costs, topo, plan, given_row = _given_chain(tmp_path, monkeypatch, {"mode": "inference"})
    want = {m: simulate(g, c, topo, plan).step_time for m, c in (("train", costs), ("inference",
                                                                                     inference_costs(costs)))}
    assert want["train"] > 1.5 * want["inference"]
    assert given_row([], "as_recorded") == pytest.approx(want["inference"])
    out = capsys.readouterr().out
    assert ("evaluating in mode inference, the one the plan was priced in (its meta.mode; mode=train prices it as "
            "a training step)") in out.splitlines()
    assert "mode inference" in (tmp_path / "as_recorded" / "comparison.md").read_text()
    assert given_row(["mode=train"], "told") == pytest.approx(want["train"])
    assert ("note: the plan was priced in mode inference (its meta.mode), as a forward pass; mode=train prices it "
            "as a training step here") in capsys.readouterr().out.splitlines()


# ------------------------------------------------------------------------------ collective_fit checked up front
def test_an_unknown_collective_fit_is_refused_before_any_work(tmp_path):
    """A topology file naming a measured system that is not shipped was refused only when the cost model first
    priced its links, its error line glued to the placers' progress bar: now when the topology is built."""
    from placement_rl.cli.common import build_topology
    from placement_rl.errors import TopologyError

    path = tmp_path / "x.yaml"
    path.write_text("name: x\ncollective_fit: tpu_pod\ndevices:\n  - {name: g, count: 2, model: A100}\n"
                    "links:\n  intra_host: {bandwidth: 1.0e11, latency: 1.0e-6}\n")
    with pytest.raises(TopologyError, match="collective_fit 'tpu_pod' is not a measured system") as exc:
        build_topology(OmegaConf.create({"path": str(path)}))
    assert "\n" not in str(exc.value)
    path.write_text(path.read_text().replace("tpu_pod", "a100_dgx"))
    assert build_topology(OmegaConf.create({"path": str(path)})).num_devices == 2
