"""Typed configs: every bad override is one line naming the key and what it accepts (exit 2), before any work or
run directory; evaluate's explicit graph=/topology= runs that single case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from placement_rl.cli import schema
from placement_rl.cli.common import preflight
from placement_rl.errors import ConfigError

BAD = [  # (command, overrides, words the one-line message must hold)
    ("train", ["agent=maskable_ppo", "agent.learning_rate=abc"], ["agent.learning_rate=abc", "number > 0"]),
    ("train", ["agent=maskable_ppo", "agent.gamma=1.5"], ["agent.gamma=1.5", "<= 1"]),
    ("train", ["agent=maskable_ppo", "agent.n_envs=2.5"], ["agent.n_envs", "integer >= 1"]),
    ("train", ["agent.rl_iters=-1"], ["agent.rl_iters=-1", ">= 0"]),
    ("train", ["agent.rl_algo=a2c"], ["agent.rl_algo=a2c", "sil, ppo"]),
    ("train", ["trainer=pretrain", "workers=0"], ["workers=0", "integer >= 1 or auto"]),
    ("train", ["trainer=pretrain", "workers=many"], ["workers=many", "integer >= 1 or auto"]),
    ("train", ["encoder=gnn"], ["encoder=gnn", "sage"]),
    ("train", ["agent=sac"], ["agent=sac", "maskable_ppo"]),
    ("train", ["trainer.total_steps=-5"], ["trainer.total_steps=-5", ">= 0"]),
    ("train", ["encoder.hidden=0"], ["encoder.hidden=0", ">= 1"]),
    ("place", ["checkpoint=x.pt", "samples=-1"], ["samples=-1", ">= 0"]),
    ("place", ["checkpoint=x.pt", "decode=beam"], ["decode=beam", "one_pass, sequential"]),
    ("place", ["samples=abc"], ["samples=abc", "integer >= 0"]),
    ("inspect", ["graph=foo"], ["graph=foo", "llama_hf", "mixtral_hf"]),
    ("inspect", ["+graph.overrides.n_layers=abc"], ["n_layers", "int"]),
    ("inspect", ["graph=synthetic", "graph.family=tree"], ["graph.family=tree", "layered"]),
    ("inspect", ["graph.coarsen.max_nodes=0"], ["graph.coarsen.max_nodes=0", ">= 1 (or null)"]),
    ("inspect", ["graph.coarsen.depth=0"], ["graph.coarsen.depth=0", ">= 1 (or null)"]),
    ("place", ["graph.model_type=llama"], ["graph.model_type is a key of graph=hf", "add graph=hf"]),
    ("inspect", ["graph=mlp", "graph.num_nodes=50"], ["graph.num_nodes is a key of graph=synthetic"]),
    ("inspect", ["graph=synthetic", "graph.num_nodes=100000000"], ["graph.num_nodes=100000000", "<= 1000000"]),
    ("inspect", ["graph.name=nope"], ["graph.name=nope", "no such zoo model", "gpt"]),
    ("inspect", ["foo=1"], ["foo", "+foo=1"]),
    ("train", ["trainer.total_stepz=10"], ["'trainer.total_stepz' is not a key", "did you mean trainer.total_steps?"]),
    ("evaluate", ["budget=0"], ["budget=0", ">= 1"]),
    ("evaluate", ["suite=all"], ["suite=all", "default, single"]),
    ("evaluate", ["placers=[heft,nope]"], ["placers", "nope", "m_etf"]),
    ("evaluate", ["suite=default", "graph=mlp"], ["suite=single"]),
    ("evaluate", ["topology=moon"], ["topology=moon", "2x_cpu"]),
    ("profile", ["repeats=0"], ["repeats=0", ">= 1"]),
    ("profile", ["threads=two"], ["threads=two", "integer >= 1 (or null)"]),
    ("deploy", ["plan=p.json", "lr=-1"], ["lr=-1", "> 0"]),
    ("deploy", ["plan=p.json", "device=tpu"], ["device=tpu", "auto, cpu, cuda"]),
    ("deploy", ["plan=p.json", "nnodes=0"], ["nnodes=0", ">= 1"]),
]


@pytest.mark.parametrize("command,overrides,words", BAD, ids=[" ".join([c, *o]) for c, o, _ in BAD])
def test_bad_override_is_one_line_naming_the_key(command, overrides, words):
    with pytest.raises(ConfigError) as info:
        preflight(command, overrides)
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message, message


@pytest.mark.parametrize("command,overrides", [
    ("train", ["agent=reinforce", "agent.reinforce.learning_rate=0.01", "trainer=quick"]),
    ("evaluate", ["suite=single", "graph=mlp", "topology=2x_cpu", "placers=[heft,m_etf]"]),
    ("inspect", ["graph=synthetic", "graph.family=layered", "graph.num_nodes=20"]),
    ("place", ["checkpoint=x.pt", "samples=0", "graph=llama_hf", "+graph.overrides.n_layers=1"]),
    ("deploy", ["plan=p.json", "node_rank=null", "threads=2"]),
    ("profile", ["devices=[cpu]", "threads=null"]),
])
def test_good_overrides_pass(command, overrides):
    preflight(command, overrides)


def test_evaluate_with_an_explicit_case_runs_that_case():
    assert preflight("evaluate", ["graph=mlp"]) == ["suite=single"]
    assert preflight("evaluate", ["topology=2x_cpu", "suite=single"]) == []
    assert preflight("evaluate", []) == []


def test_group_options_come_from_the_yaml_files_and_user_dirs(tmp_path):
    (tmp_path / "encoder").mkdir()
    (tmp_path / "encoder" / "mine.yaml").write_text("name: sage\nhidden: 8\nlayers: 1\n")
    try:
        schema.set_config_dirs([tmp_path])
        assert "mine" in schema.group_options("encoder") and "sage" in schema.group_options("encoder")
        schema.check_group_choice("encoder=mine")
    finally:
        schema.set_config_dirs([])
    with pytest.raises(ConfigError, match="encoder=mine: no such encoder"):
        schema.check_group_choice("encoder=mine")


def test_a_registered_key_is_checked():
    schema.register("inspect", "extra_count", schema.count(1))
    try:
        with pytest.raises(ConfigError, match="extra_count=0: must be an integer >= 1"):
            schema.validate("inspect", {"extra_count": 0})
        schema.validate("inspect", {"extra_count": 3})
    finally:
        del schema.COMMANDS["inspect"]["extra_count"]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    root = str(Path(__file__).resolve().parent.parent)  # this checkout, whatever is installed
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=root)
    return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.parametrize("args", [
    ("train", "agent.learning_rate=abc"),
    ("evaluate", "graph=gpt", "topology.path=broken.yaml"),
    ("place", "checkpoint=x.pt", "samples=-1"),
])
def test_cli_exit_2_one_line_and_no_run_directory(tmp_path, args):
    (tmp_path / "broken.yaml").write_text("devices: [\n")
    r = _cli(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "outputs").exists()


# ------------------------------------------------------------------- multirun sweeps over config groups
@pytest.mark.parametrize("command,overrides,extra", [
    ("place", ["-m", "graph=mlp", "topology=2x_k80,4x_v100_pcie"], []),
    ("place", ["--multirun", "graph=mlp,gpt", "seed=0,1"], []),
    ("place", ["-m", "graph=choice(mlp,gpt)", "seed=range(0,2)"], []),
    ("evaluate", ["-m", "graph=mlp,gpt"], ["suite=single"]),
])
def test_sweeps_over_a_group_pass(command, overrides, extra):
    assert preflight(command, overrides) == extra


@pytest.mark.parametrize("command,overrides,words", [
    ("place", ["-m", "topology=2x_k80,4x_v100_pcei"], ["topology=4x_v100_pcei", "no such topology", "2x_k80"]),
    ("evaluate", ["-m", "graph=choice(mlp,gtp)"], ["graph=gtp", "no such graph"]),
    ("place", ["-m", "graph=mlp", "samples=2,-1"], ["samples=-1", ">= 0"]),
])
def test_a_misspelt_sweep_value_is_one_line_naming_it(command, overrides, words):
    with pytest.raises(ConfigError) as info:
        preflight(command, overrides)
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("command,overrides,words", [
    ("place", ["topology=my/cluster.yaml"], ["topology=my/cluster.yaml", "topology.path=my/cluster.yaml"]),
    ("evaluate", ["graph=g.json"], ["graph=g.json", "graph.path=g.json"]),
])
def test_a_file_given_as_a_group_option_is_told_its_path_key(command, overrides, words):
    with pytest.raises(ConfigError) as info:
        preflight(command, overrides)
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in words), str(info.value)


# ------------------------------------------------------------------------------------- output paths
def _refused(command: str, overrides: list[str], *words: str) -> str:
    with pytest.raises(ConfigError) as info:
        preflight(command, overrides)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_a_run_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    _refused("place", [f"hydra.run.dir={tmp_path}/afile/sub"], f"hydra.run.dir={tmp_path}/afile/sub",
             "is a file, not a folder")
    _refused("place", [f"hydra.run.dir={tmp_path}/afile"], "is a file, not a folder")
    _refused("place", ["-m", "seed=0,1", f"hydra.sweep.dir={tmp_path}/afile/sub"], "hydra.sweep.dir=")
    assert preflight("place", [f"hydra.run.dir={tmp_path}/new/run"]) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # the probe leaves nothing behind


@pytest.mark.skipif(not (Path("/proc").is_dir() and Path("/sys").is_dir()), reason="needs Linux /proc and /sys")
@pytest.mark.parametrize("path", ["/proc/x", "/sys/x"])
def test_a_run_folder_that_cannot_be_made_is_refused(path):
    _refused("place", [f"hydra.run.dir={path}"], f"hydra.run.dir={path}", "cannot create files in")


def test_profile_output_is_checked_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    _refused("profile", [f"output={tmp_path}/afile/profile.json"], f"output={tmp_path}/afile/profile.json",
             "is a file, not a folder")
    _refused("profile", [f"output={tmp_path}"], "is a folder; give a file path")
    if Path("/proc").is_dir():
        _refused("profile", ["output=/proc/x/profile.json"], "output=/proc/x/profile.json", "cannot create")


def test_profile_refuses_a_graph_file_with_its_own_message(tmp_path):
    _refused("profile", [f"graph.path={tmp_path}/g.json"], "profile needs a zoo model")
    _refused("profile", ["graph=synthetic"], "profile needs a zoo model")


def test_a_graph_path_that_is_a_folder_says_so(tmp_path):
    _refused("inspect", [f"graph.path={tmp_path}"], f"graph.path={tmp_path} is a folder")


def test_a_folder_where_a_command_writes_a_file_is_refused(tmp_path):
    (tmp_path / "placement.json").mkdir()
    with pytest.raises(ConfigError, match="placement.json is a folder"):
        schema.check_not_folders(tmp_path, ["graph.json", "placement.json"])
    schema.check_not_folders(tmp_path, ["graph.json"])


# -------------------------------------------------------------------------------------- small things
def test_messages_and_files_write_numbers_plainly(tmp_path):
    import json

    import numpy as np

    from placement_rl.cli.common import plain_numbers, plural, write_json

    assert plain_numbers("edge_bytes=np.float64(-5.0): must be >= 0, got np.int64(3)") == \
        "edge_bytes=-5.0: must be >= 0, got 3"
    assert (plural(1, "device"), plural(4, "device"), plural(0, "sample")) == ("1 device", "4 devices", "0 samples")
    write_json(tmp_path / "m.json", {"a": float("nan"), "b": [np.float32(1.5), float("inf")], "c": np.int64(2)})
    text = (tmp_path / "m.json").read_text()
    strict = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in {text}"))
    assert strict == {"a": None, "b": [1.5, None], "c": 2}


def test_a_sweep_without_multirun_is_one_line_saying_how():
    _refused("place", ["seed=0,1"], "seed=0,1 lists several values", "-m", "seed=[...]")


def test_pretrain_ranges_are_two_integers():
    """``trainer.pretrain.sizes=[16]`` was a ``ValueError`` traceback (exit 1), ``[a, b]`` a comparison error."""
    from placement_rl.studies.pretrain import PretrainSpec

    for bad in ([16], (16, 40, 80), ("a", "b"), (16.5, 40), 16):
        with pytest.raises(ConfigError, match="sizes must be \\[lo, hi\\], two integers"):
            PretrainSpec(sizes=bad)
    with pytest.raises(ConfigError, match="devices must be"):
        PretrainSpec(devices=[2])
    assert PretrainSpec(sizes=(16, 40), devices=[2, 4]).sizes == (16, 40)


def test_train_refuses_a_folder_with_an_earlier_run_and_a_resume_it_cannot_do(tmp_path, capsys):
    """A second run into one folder replaced some of the first run's files and left the others (one folder, two
    runs); ``resume=true`` was ignored outside pretraining and said nothing where there was nothing to resume."""
    from omegaconf import OmegaConf

    from placement_rl.cli.train import check_run_folder

    def cfg(**kw):
        return OmegaConf.create({"trainer": {"pretrain": kw.pop("pretrain", None)}, "resume": False,
                                 "checkpoint": None, **kw})

    check_run_folder(cfg(), tmp_path)  # an empty folder
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds an earlier run \\(metrics.json\\)"):
        check_run_folder(cfg(), tmp_path)
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    check_run_folder(cfg(checkpoint=str(tmp_path / "checkpoint.pt")), tmp_path)  # going on from its own checkpoint
    with pytest.raises(ConfigError, match="resume=true continues an unfinished trainer=pretrain run"):
        check_run_folder(cfg(resume=True), tmp_path)
    check_run_folder(cfg(resume=True, pretrain={"sizes": [16, 40]}), tmp_path)
    assert "holds no unfinished pretraining" in capsys.readouterr().out


def test_the_train_header_says_when_ppo_runs_more_steps_than_asked():
    from types import SimpleNamespace

    from placement_rl.cli.train import _rollout_note

    ppo = SimpleNamespace(algo="maskable_ppo", n_envs=16, n_steps=32)
    assert _rollout_note(ppo, 256) == " (run as 512: whole rollouts of n_envs x n_steps = 512)"
    assert _rollout_note(ppo, 1024) == "" and _rollout_note(SimpleNamespace(algo="reinforce", n_envs=16,
                                                                            n_steps=32), 256) == ""
