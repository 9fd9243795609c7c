"""Export of stage plans to torchtitan's job config and Megatron-LM's arguments, the round trip back to a StagePlan,
and the CLI (one line, exit 2 on bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest
import torch

from placement_rl import export as ex
from placement_rl.errors import PlanError
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan
from placement_rl.topology import load_topology

torch.set_num_threads(1)
GPT = dict(batch_size=8, seq_len=8, vocab_size=50257, d_model=16, n_layers=4, n_heads=2, dropout=0.0)


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **GPT)


@pytest.fixture(scope="module")
def llama():
    return capture_zoo("llama_hf", **dict(zoo.tiny("llama_hf"), vocab_size=96, batch_size=4))


def cut_after(g, blocks):
    """Stage of every node when stages end after the given blocks' residual adds (node order = program order)."""
    ends = [max(i for i, p in enumerate(g.module_paths) if p == f"blocks.{b}") + 1 for b in blocks]
    return np.searchsorted(np.array(ends), np.arange(g.num_nodes), side="right")


def same(a: StagePlan, b: StagePlan) -> None:
    assert np.array_equal(a.stage_of_node, b.stage_of_node)
    assert (a.stage_devices, a.tp, a.num_microbatches, a.schedule, a.sharding, a.make_vocab_size_divisible_by) == \
        (b.stage_devices, b.tp, b.num_microbatches, b.schedule, b.sharding, b.make_vocab_size_divisible_by)
    assert (a.batch_size or GPT["batch_size"]) == (b.batch_size or GPT["batch_size"])
    assert a.sequence_parallel == b.sequence_parallel


def plans(g):
    two = cut_after(g, [0])
    four = cut_after(g, [0, 1, 2])
    return {
        "tp2 x pp2 1f1b m2": StagePlan(two, ((0, 1), (2, 3)), tp=(2, 2), num_microbatches=2, schedule="1f1b"),
        "fsdp dp4": StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1, 2, 3),), sharding="fsdp"),
        "tp2 x dp2": StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1, 2, 3),), tp=(2,)),
        "interleaved pp2 x 2 virtual, vocab 64": StagePlan(four, ((0,), (1,), (0,), (1,)), num_microbatches=2,
                                                          schedule="interleaved1f1b", make_vocab_size_divisible_by=64),
        "pp2 full recompute": StagePlan(two, ((0,), (1,)), num_microbatches=2, recompute=("full", "full")),
        "tp2 selective recompute, sp": StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,),
                                                 recompute=("selective",), sequence_parallel=True),
    }


@pytest.mark.parametrize("name", ["tp2 x pp2 1f1b m2", "fsdp dp4", "tp2 x dp2", "interleaved pp2 x 2 virtual, vocab 64",
                                  "pp2 full recompute", "tp2 selective recompute, sp"])
def test_round_trip_through_both_formats(gpt, name):
    plan = plans(gpt)[name]
    topo = load_topology("8x_a100_nvswitch")
    plan.validate(gpt, topo)
    titan = ex.to_torchtitan(plan, gpt)
    cfg = tomllib.loads(titan)["parallelism"]
    assert cfg["tensor_parallel_degree"] == plan.tp[0]
    same(ex.from_torchtitan(titan, gpt), plan)
    megatron = ex.to_megatron(plan, gpt)
    assert f"--tensor-model-parallel-size {plan.tp[0]}" in megatron
    same(ex.from_megatron(megatron, gpt), plan)


def test_what_each_trainer_is_told(gpt):
    p = plans(gpt)
    titan = tomllib.loads(ex.to_torchtitan(p["tp2 x pp2 1f1b m2"], gpt))
    par = titan["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"], par["tensor_parallel_degree"],
            par["pipeline_parallel_degree"], par["pipeline_parallel_schedule"],
            par["pipeline_parallel_microbatch_size"]) == (1, 1, 2, 2, "1F1B", 4)
    assert par["module_fqns_per_model_part"] == [["wte", "wpe", "drop", "blocks.0"],
                                                 ["blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"]]
    assert titan["training"] == {"local_batch_size": 8, "global_batch_size": 8}
    fsdp = tomllib.loads(ex.to_torchtitan(p["fsdp dp4"], gpt))["parallelism"]
    assert (fsdp["data_parallel_replicate_degree"], fsdp["data_parallel_shard_degree"]) == (1, 4)
    inter = ex.to_megatron(p["interleaved pp2 x 2 virtual, vocab 64"], gpt)
    assert '--pipeline-model-parallel-layout "Et|t|t|tL"' in inter and "--pipeline-model-parallel-size 2" in inter
    assert "--make-vocab-size-divisible-by 64" in inter and "2 virtual stage(s) per pipeline rank" in inter
    assert "--micro-batch-size 4" in inter and "--global-batch-size 8" in inter
    uneven = StagePlan(cut_after(gpt, [2]), ((0,), (1,)), num_microbatches=2)
    assert '"Et*3|tL"' in ex.to_megatron(uneven, gpt)
    assert "--use-torch-fsdp2" in ex.to_megatron(p["fsdp dp4"], gpt)
    assert "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" in " ".join(
        ex.to_megatron(p["pp2 full recompute"], gpt).replace("\\\n", " ").split())
    assert tomllib.loads(ex.to_torchtitan(p["tp2 selective recompute, sp"], gpt))["activation_checkpoint"]["mode"] == \
        "selective"
    assert "--sequence-parallel" in ex.to_megatron(p["tp2 selective recompute, sp"], gpt)
    mixed = StagePlan(cut_after(gpt, [1]), ((0,), (1,)), num_microbatches=2, recompute=("full", "none"))
    with pytest.raises(PlanError, match="recompute differently"):
        ex.to_megatron(mixed, gpt)
    accumulate = StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0, 1),), num_microbatches=2, schedule="gpipe")
    assert tomllib.loads(ex.to_torchtitan(accumulate, gpt))["training"] == {"local_batch_size": 2,
                                                                          "global_batch_size": 8}
    back = ex.from_megatron(ex.to_megatron(accumulate, gpt), gpt)  # no pipeline: gradient accumulation, 1f1b
    assert (back.num_microbatches, back.dp_degrees, back.schedule) == (2, (2,), "1f1b")
    assert ex.from_torchtitan(ex.to_torchtitan(accumulate, gpt), gpt).num_microbatches == 2


def test_plans_megatron_cannot_run_are_refused_and_a_split_layer_needs_snap(gpt):
    gpipe = StagePlan(cut_after(gpt, [1]), ((0,), (1,)), num_microbatches=2, schedule="gpipe")
    with pytest.raises(PlanError, match="Megatron-LM runs 1F1B"):
        ex.to_megatron(gpipe, gpt)
    assert 'pipeline_parallel_schedule = "GPipe"' in ex.to_torchtitan(gpipe, gpt)
    inside = np.zeros(gpt.num_nodes, dtype=np.int64)
    inside[gpt.index["gelu_1"]:] = 1  # between block 1's MLP GEMMs
    plan = StagePlan(inside, ((0,), (1,)), num_microbatches=2)
    with pytest.raises(PlanError, match=r"module 'blocks.1' is split between stages \[0, 1\]"):
        ex.to_torchtitan(plan, gpt)
    snapped = ex.from_torchtitan(ex.to_torchtitan(plan, gpt, snap=True), gpt)
    layer1 = [i for i, p in enumerate(gpt.module_paths) if p.startswith("blocks.1")]
    assert set(snapped.stage_of_node[layer1].tolist()) == {0}  # most of block 1's FLOPs (attention) are in stage 0
    unequal = StagePlan(cut_after(gpt, [1]), ((0, 1), (2,)), num_microbatches=2)
    with pytest.raises(PlanError, match="unequal DP degrees"):
        ex.to_megatron(unequal, gpt)


def test_llama_modules_round_trip(llama):
    g = llama
    mods = ex.modules(g)
    assert mods.container == "model.model.layers" and mods.order[0] == "model.model.embed_tokens"
    son = np.array([0 if (k is None or k in mods.order[:mods.order.index("model.model.layers.0") + 1]) else 1
                    for k in mods.key])
    plan = ex.from_torchtitan(ex.to_torchtitan(StagePlan(son, ((0,), (1,)), num_microbatches=2), g, snap=True), g)
    again = ex.from_megatron(ex.to_megatron(plan, g), g)
    same(again, plan)


@pytest.mark.slow
def test_cli_export_and_bad_input_one_line_exit_2(gpt, tmp_path):
    topo = load_topology("8x_a100_nvswitch")
    gpt.to_json(tmp_path / "graph.json")
    plan = plans(gpt)["tp2 x pp2 1f1b m2"]
    plan.to_json(tmp_path / "plan.json", graph=gpt, topology=topo)
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "export", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)

    r = cli("plan.json", "--to", "megatron")
    assert r.returncode == 0, r.stderr
    same(ex.from_megatron(r.stdout, gpt), plan)
    r = cli("plan.json", "--to", "torchtitan", "--out", "titan.toml")
    assert r.returncode == 0 and (tmp_path / "titan.toml").is_file() and r.stdout == "wrote titan.toml (torchtitan)\n"
    same(ex.from_torchtitan((tmp_path / "titan.toml").read_text(), gpt), plan)
    (tmp_path / "place.json").write_text(json.dumps({"schema": "placement_rl.placement", "devices": []}))
    inside = np.zeros(gpt.num_nodes, dtype=np.int64)
    inside[gpt.index["gelu_1"]:] = 1
    StagePlan(inside, ((0,), (1,)), num_microbatches=2).to_json(tmp_path / "split.json", graph=gpt, topology=topo)
    gpipe = StagePlan(cut_after(gpt, [1]), ((0,), (1,)), num_microbatches=2, schedule="gpipe")
    gpipe.to_json(tmp_path / "gpipe.json", graph=gpt, topology=topo)
    for args, msg in ((("plan.json",), "--to"), (("plan.json", "--to", "deepspeed"), "invalid choice"),
                      (("missing.json", "--to", "megatron"), "does not exist"),
                      (("place.json", "--to", "megatron"), "not a stage plan"),
                      (("plan.json", "--to", "megatron", "--graph", "nope.json"), "graph file"),
                      (("split.json", "--to", "megatron", "--out", "bad.txt"), "split between stages"),
                      (("gpipe.json", "--to", "megatron"), "runs 1F1B")):
        r = cli(*args)
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], (args, r.stderr)
    assert not (tmp_path / "bad.txt").exists()
    # a plan made on one's own topology file: the file, not a preset, is what export needs, and it says so
    import yaml

    from placement_rl.topology import DeviceTopology

    mine = DeviceTopology.from_dict({**topo.to_dict(), "name": "my_cluster"})
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(mine.to_dict()))
    plan.to_json(tmp_path / "mine.json", graph=gpt, topology=mine)
    r = cli("mine.json", "--to", "megatron")
    assert r.returncode == 2 and "topology 'my_cluster', which is not a preset: pass its YAML with --topology" \
        in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("mine.json", "--to", "megatron", "--topology", "mine.yaml")
    assert r.returncode == 0, r.stderr


def test_megatron_keeps_the_whole_embedding_in_the_first_stage_and_rotary_is_not_the_embedding(gpt, llama):
    wte_only = np.ones(gpt.num_nodes, dtype=np.int64)
    wte_only[[gpt.index["arange"], gpt.index["embedding"]]] = 0  # stage 0: wte; stage 1: wpe onwards
    plan = StagePlan(wte_only, ((0,), (1,)), num_microbatches=2)
    with pytest.raises(PlanError, match=r"stage 1 holds wpe \(part of the embedding.*first stage"):
        ex.to_megatron(plan, gpt)
    mods = ex.modules(llama)
    son = np.array([0 if k == "model.model.embed_tokens" else 1 for k in mods.key])
    son[[v for v in range(llama.num_nodes) if mods.key[v] is None and not len(llama.predecessors(v))]] = 0
    text = ex.to_megatron(StagePlan(son, ((0,), (1,)), num_microbatches=2), llama)
    assert '--pipeline-model-parallel-layout "E|t*2L"' in text  # rotary_emb, in stage 1, is no embedding


def test_interleaved_plans_deploy_refuses_are_refused(gpt):
    four = cut_after(gpt, [0, 1, 2])
    for m in (1, 3):
        plan = StagePlan(four, ((0,), (1,), (0,), (1,)), num_microbatches=m, schedule="interleaved1f1b")
        for fmt in ex.FORMATS:
            with pytest.raises(PlanError, match=rf"interleaved1f1b needs num_microbatches \({m}\) divisible by the "
                                                r"number of device groups \(2\)"):
                ex.export_plan(plan, gpt, fmt)


def test_snap_header_prices_the_snapped_plan(gpt):
    from placement_rl.cost import resolve_costs, simulate_pipeline

    topo = load_topology("8x_a100_nvswitch")
    inside = np.zeros(gpt.num_nodes, dtype=np.int64)
    inside[gpt.index["gelu_1"]:] = 1
    plan = StagePlan(inside, ((0,), (1,)), num_microbatches=2, meta={"step_time": 123.0})
    text = ex.to_megatron(plan, gpt, snap=True, topology=topo)
    snapped = ex.from_megatron(text, gpt)
    costs = resolve_costs(gpt, topo)
    want = simulate_pipeline(gpt, costs, topo, snapped).step_time
    header = text.splitlines()[1]
    assert f"predicted step {want:.6g} s after --snap moved blocks.1 to stage 0" in header and "123" not in header
    assert f"as cut: {simulate_pipeline(gpt, costs, topo, plan).step_time:.6g} s" in header
    assert "not priced (no topology" in ex.to_torchtitan(plan, gpt, snap=True).splitlines()[1]
    whole = StagePlan(cut_after(gpt, [1]), ((0,), (1,)), num_microbatches=2, meta={"step_time": 123.0})
    assert "predicted step 123 s" in ex.to_megatron(whole, gpt, snap=True, topology=topo)


def test_untied_embeddings_and_a_note_for_models_that_are_no_gpt_decoder(gpt, llama):
    from dataclasses import replace

    one = np.zeros(gpt.num_nodes, dtype=np.int64)
    assert "--untie-embeddings-and-output-weights" not in ex.to_megatron(StagePlan(one, ((0,),)), gpt)  # tied
    son = np.zeros(llama.num_nodes, dtype=np.int64)
    assert "--untie-embeddings-and-output-weights" in ex.to_megatron(StagePlan(son, ((0,),)), llama)
    hf = {"class": "BertForMaskedLM", "task": "masked_lm", "config": {"tie_word_embeddings": True}}
    bert_like = replace(llama, meta={**llama.meta, "hf": hf})
    text = ex.to_megatron(StagePlan(son, ((0,),)), bert_like)
    assert "--untie-embeddings-and-output-weights" not in text  # the config's word wins over the graph
    notes = [x for x in text.splitlines() if x.startswith("# note:")]
    assert len(notes) == 1 and "BertForMaskedLM (masked_lm), not a GPT-style decoder" in notes[0]
    assert not any(x.startswith("# note:") for x in ex.to_megatron(StagePlan(one, ((0,),)), gpt).splitlines())


@pytest.fixture
def plan_dir(gpt, tmp_path):
    gpt.to_json(tmp_path / "graph.json")
    plans(gpt)["tp2 x pp2 1f1b m2"].to_json(tmp_path / "plan.json", graph=gpt,
                                           topology=load_topology("8x_a100_nvswitch"))
    return tmp_path


def export_cli(capsys, *args):
    """(exit code, stdout, stderr lines) of ``placement-rl export`` run in-process."""
    from placement_rl.cli.export import main

    code = 0
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, [x for x in err.splitlines() if x.strip()]


def test_cli_refuses_an_out_it_cannot_write_before_any_work(plan_dir, capsys):
    plan = plan_dir / "plan.json"
    (plan_dir / "file.txt").write_text("x")
    (plan_dir / "link.txt").symlink_to(plan_dir / "file.txt")
    before = sorted(p.name for p in plan_dir.iterdir())
    cases = [(plan_dir, "is a folder: give a file path"), (plan_dir / "file.txt" / "x.txt", "which is not a folder"),
             (plan_dir / "link.txt", "not a regular file"), ("/dev/null", "not a regular file")]
    if os.path.isdir("/proc"):
        cases.append(("/proc/nope/x.txt", "cannot be written"))
    for out, msg in cases:
        for plan_arg in (plan, plan_dir / "missing.json"):  # refused before the plan is even read
            code, _, err = export_cli(capsys, plan_arg, "--to", "megatron", "--out", out)
            assert code == 2 and len(err) == 1 and "--out" in err[0] and msg in err[0], (out, err)
    assert sorted(p.name for p in plan_dir.iterdir()) == before
    code, out, err = export_cli(capsys, plan, "--to", "megatron", "--out", plan_dir / "new" / "args.txt")
    assert code == 0 and not err and (plan_dir / "new" / "args.txt").is_file()


def test_cli_names_a_folder_given_as_the_plan(plan_dir, capsys):
    code, _, err = export_cli(capsys, plan_dir, "--to", "megatron")
    assert code == 2 and len(err) == 1 and "is a folder, not a plan file" in err[0], err
