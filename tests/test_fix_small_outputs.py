"""Small output fixes: a scored split's unknown ``contiguous_optimum``, ``--seconds`` and JSON values shown as given,
``place`` of a PipelineEnv checkpoint on another graph at that graph's own batch, and ``inspect``'s precision line."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from placement_rl.baselines.maxload_instances import random_instance
from placement_rl.errors import GraphError
from placement_rl.graph import make_graph
from placement_rl.graph.maxload_file import read_instance

torch.set_num_threads(1)


def _write(tmp_path, data, name="inst.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_scored_split_leaves_contiguous_optimum_unknown(tmp_path, capsys):
    """Solving writes ``contiguous_optimum`` as found; ``--split`` compares with no contiguous split: null."""
    from placement_rl.cli.maxload import main

    path = _write(tmp_path, random_instance(3, n=6))
    solved, scored = tmp_path / "split.json", tmp_path / "scored.json"
    main([str(path), "--seconds", "0", "--contiguous", "--out", str(solved)])
    assert json.loads(solved.read_text())["contiguous_optimum"] is True
    main([str(path), "--split", str(solved), "--out", str(scored)])
    data = json.loads(scored.read_text())
    assert data["contiguous_optimum"] is None and data["maxLoad"] == json.loads(solved.read_text())["maxLoad"]


@pytest.mark.parametrize("given, shown", [("1000001", "1000001"), ("1e30", "1e+30"), ("-0.5", "-0.5"),
                                          ("inf", "inf")])
def test_seconds_refusal_shows_the_value_given(tmp_path, capsys, given, shown):
    from placement_rl.cli.maxload import main

    with pytest.raises(SystemExit) as exc:
        main([str(_write(tmp_path, random_instance(1, n=3))), "--seconds", given])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.rstrip().endswith(f"to 1000000 (got {shown})"), err


@pytest.mark.parametrize("value, shown", [(True, "true"), (False, "false"), (None, "null"), ([1, True], "[1, true]"),
                                          ({"a": None}, '{"a": null}'), ("5", "'5', a string"), (1.5, "1.5")])
def test_instance_type_errors_show_json_spelling(tmp_path, value, shown):
    data = random_instance(1, n=3)
    data["nodes"][1]["colorClass"] = value
    with pytest.raises(GraphError) as exc:
        read_instance(_write(tmp_path, data))
    assert str(exc.value).endswith(f"nodes[1].colorClass must be an integer (got {shown})"), str(exc.value)


def _graph(**meta):
    nodes = [{"name": "x", "op_type": "placeholder", "out_bytes": 4096.0},
             {"name": "fc", "op_type": "linear", "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 4e6,
              "out_bytes": 2048.0}]
    return make_graph(nodes, [[0, 1, 4096.0]], name="two", meta=meta)


def test_inspect_shows_the_graphs_precision():
    from placement_rl.cli.inspect import summarize

    def lines(graph):
        text = summarize(graph).splitlines()
        k = next(k for k, x in enumerate(text) if x.startswith("  precision "))
        assert all(len(x) <= 120 for x in text)
        return text[k].strip(), text[k + 1].strip()

    assert not any("precision" in x for x in summarize(_graph()).splitlines())  # fp32: nothing recorded
    assert lines(_graph(param_dtype="bf16")) == ("precision fp32 (no meta.dtype), parameters bf16 (meta.param_dtype)",
                                                 "the calibrated GPU model runs it in fp32 (a topology's dtype: "
                                                 "tf32 / bf16 / fp16 decides)")
    head, how = lines(_graph(dtype="bf16"))
    assert head == "precision bf16 (meta.dtype)" and "in bf16 where the GPU has a bf16 peak, else fp32" in how
    assert lines(_graph(dtype="bf16", param_dtype="fp32"))[0] == ("precision bf16 (meta.dtype), parameters fp32 "
                                                                  "(meta.param_dtype)")
    assert lines(_graph(dtype="fp16"))[0] == "precision fp16 (meta.dtype)"


def _cfg(command: str, *overrides: str):
    from placement_rl.cli.common import _compose

    cfg, _ = _compose(command, list(overrides), [])
    return OmegaConf.create(cfg)


def test_place_of_a_pipeline_checkpoint_on_another_graph_keeps_that_graphs_batch(tmp_path, monkeypatch, capsys):
    """Training's ``batch_size`` / ``num_microbatches`` hold on its own graph (the greedy rollout training scored)
    and are left out, with a note, on another: the plan is at that graph's batch, as the baselines are."""
    from placement_rl.cli import place, train

    trained = ("graph=mlp", "+graph.overrides.layers=3", "topology=2x_cpu", "progress=false")
    monkeypatch.setattr(train, "output_dir", lambda: tmp_path)
    m = train.run(_cfg("train", *trained, "env=pipeline", "agent=ppo", "trainer=quick", "trainer.total_steps=64",
                       "agent.n_envs=1", "agent.n_steps=32", "agent.batch_size=32", "trainer.compare=false",
                       "+env.options.batch_size=256", "+env.options.num_microbatches=8"))
    ckpt = tmp_path / "checkpoint.pt"
    as_file = (f"graph.path={tmp_path / 'graph.json'}", "topology=2x_cpu", "progress=false")  # the same graph
    for sub, graph in (("same", trained), ("file", as_file),
                       ("other", ("graph=mlp", "+graph.overrides.layers=4", "topology=2x_cpu", "progress=false"))):
        monkeypatch.setattr(place, "output_dir", lambda sub=sub: tmp_path / sub)
        (tmp_path / sub).mkdir()
        capsys.readouterr()
        pm = place.run(_cfg("place", *graph, f"checkpoint={ckpt}", "samples=0", "compare=true",
                            "decode=sequential"))
        out = capsys.readouterr().out
        plan = json.loads((tmp_path / sub / "plan.json").read_text())
        if sub in ("same", "file"):  # training's graph (its fingerprint): its greedy rollout, at its batch
            assert plan["batch_size"] == 256 and pm["step_time"] == m["policy_greedy_time"]
            assert "left out" not in out
        else:  # the graph's own batch (null in the plan: mlp's 64), as every baseline row
            assert plan["batch_size"] is None, plan
            note = next(x for x in out.splitlines() if x.startswith("note:") and "batch_size=256" in x)
            assert "num_microbatches=8" in note and "at its own batch (64)" in note
