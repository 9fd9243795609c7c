"""Leftovers of the CLI: ``evaluate placers=[...]`` says which stage planners run and why; a run folder given
again holds one run's files after the rerun fails, finishes or is interrupted, Hydra's own (``.hydra/``, the log)
included: an earlier run's were left beside this run's ``.hydra/`` (written before the command runs) and its log
went on in the earlier one's."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from placement_rl import baselines
from placement_rl.cli import common, evaluate, run_folder
from placement_rl.errors import ConfigError

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- evaluate: which planners run
def test_placers_naming_no_planner_says_that_pipeline_runs_every_one():
    planners = baselines.pipeline_names()
    ops, parts, line = evaluate.chosen_placers(["single_device"], True)
    assert (ops, parts) == (["single_device"], planners)
    assert line == (f"stage planners: all {len(planners)} (placers= names none of them, and pipeline=true runs "
                    "every one; pipeline=false runs none, or name those to run in placers=)")
    assert evaluate.chosen_placers(["single_device"], False) == (["single_device"], [], "stage planners: none "
                                                                                         "(pipeline=false)")
    assert evaluate.chosen_placers(["heft", "dp"], True) == (["heft"], ["dp"], "stage planners: dp (named in "
                                                                               "placers=)")
    assert evaluate.chosen_placers(["heft", "dp"], False) == (["heft"], [], "stage planners: none (pipeline=false; "
                                                                            "dp named in placers= not run)")
    assert evaluate.chosen_placers(None, True) == (None, planners, "")  # every placer: nothing to explain


def test_evaluate_says_which_planners_run_first(tmp_path, monkeypatch, capsys):
    from tests.test_cli import tiny_graph_object

    tiny_graph_object().to_json(tmp_path / "tiny.json")
    monkeypatch.setattr(evaluate, "output_dir", lambda: tmp_path)
    cfg, _ = common._compose("evaluate", ["suite=single", f"graph.path={tmp_path / 'tiny.json'}", "topology=2x_k80",
                                          "placers=[single_device]", "pipeline=false", "budget=8", "progress=false"],
                             [])
    rows = evaluate.run(OmegaConf.create(cfg))
    assert [r.placer for r in rows] == ["single_device"]
    assert capsys.readouterr().out.splitlines()[0] == "stage planners: none (pipeline=false)"


# ----------------------------------------------------------------------------- a run folder given again
PLACE = ("metrics.json", "placement.json", "graph.json")


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (Hydra's included) and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _app(folder: Path, monkeypatch, run, *overrides: str) -> int:
    """``run`` as ``place`` is run (it replaces an earlier run's files, SIGTERM is its Ctrl-C) in ``folder``, in this
    process: its exit code."""
    monkeypatch.setenv(common.DRIVER_PID, "0")  # main() sets it: put back after the test
    monkeypatch.setattr(common, "_TASK_STARTED", False)
    monkeypatch.setattr(sys, "argv", ["placement-rl", f"hydra.run.dir={folder}", "progress=false", *overrides])
    try:
        common.hydra_app("place", replaces=PLACE, sigterm=True)(run)()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _finished(folder: Path) -> None:
    logging.getLogger("placement_rl.test").info("the first run")
    for name in PLACE:  # metrics.json last, as a finished run writes it
        (folder / name).write_text(f"first {name}")


@pytest.fixture
def earlier(tmp_path, monkeypatch) -> tuple[Path, dict[str, bytes]]:
    """A run folder an earlier finished run left (its files, ``.hydra/`` and log) and those files."""
    folder = tmp_path / "run"
    assert _app(folder, monkeypatch, lambda cfg: _finished(folder), "seed=1") == 0
    files = _files(folder)
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", *PLACE} <= set(files)
    [log] = [n for n in files if n.endswith(".log")]
    assert b"the first run" in files[log]
    yield folder, files
    run_folder.restore_held()


def _second(folder: Path, write: bool):
    def run(cfg) -> None:
        logging.getLogger("placement_rl.test").info("the second run")
        written: list[str] = []
        with common.files_on_interrupt(written, ["metrics.json"]):
            if write:
                (folder / "placement.json").write_text("second")
                written.append("placement.json")
            signal.raise_signal(signal.SIGTERM)
    return run


def test_interrupted_before_writing_the_folder_is_exactly_the_earlier_run(earlier, monkeypatch, capsys):
    """Its ``.hydra/`` had this run's config beside the earlier run's results, and its log this run's lines."""
    folder, files = earlier
    assert _app(folder, monkeypatch, _second(folder, write=False), "seed=2") == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted: no file written"
    assert _files(folder) == files and run_folder.held() == []
    assert list(folder.parent.glob(".run-earlier-*")) == []


def test_interrupted_after_writing_the_earlier_run_is_whole_in_the_folder_named(earlier, monkeypatch, capsys):
    """The folder holds this run's files and Hydra's of this run only; the hidden folder the line names, the earlier
    run's every file, its ``.hydra/`` and log included."""
    folder, files = earlier
    assert _app(folder, monkeypatch, _second(folder, write=True), "seed=2") == 130
    [store] = run_folder.held()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"interrupted: wrote placement.json; metrics.json not written; the earlier run's files it replaced are in "
        f"{store}")
    assert _files(store) == files
    now = _files(folder)
    assert {n for n in now if not n.endswith(".log")} == {".hydra/config.yaml", ".hydra/hydra.yaml",
                                                          ".hydra/overrides.yaml", "placement.json"}
    assert b"seed=2" in now[".hydra/overrides.yaml"]
    [log] = [n for n in now if n.endswith(".log")]
    assert b"the second run" in now[log] and b"the first run" not in now[log]


def test_a_rerun_that_finishes_or_fails_leaves_one_runs_files(earlier, monkeypatch, capsys):
    """Failed (a bad input): the earlier run as it was. Finished: this run's files, config and log alone."""
    folder, files = earlier

    def refused(cfg) -> None:
        raise ConfigError("graph.path=x.json: no such file")

    assert _app(folder, monkeypatch, refused, "seed=2") == 2
    assert _files(folder) == files and run_folder.held() == []

    def finished(cfg) -> None:
        logging.getLogger("placement_rl.test").info("the second run")
        for name in PLACE:
            (folder / name).write_text(f"second {name}")

    capsys.readouterr()
    assert _app(folder, monkeypatch, finished, "seed=2") == 0
    [said] = [ln for ln in capsys.readouterr().out.splitlines() if "held an earlier place run's files" in ln]
    assert said.endswith("they are): graph.json, metrics.json, placement.json")  # the command's, not Hydra's
    now = _files(folder)
    assert {now[n] for n in PLACE} == {f"second {n}".encode() for n in PLACE} and b"seed=2" in now[
        ".hydra/overrides.yaml"]
    [log] = [n for n in now if n.endswith(".log")]
    assert b"the second run" in now[log] and b"the first run" not in now[log]
    assert run_folder.held() == [] and list(folder.parent.glob(".run-earlier-*")) == []


def _command(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop(common.DRIVER_PID, None)
    return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("args, held, again", [
    (("place", "graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "samples=2", "search_seconds=0.2",
      "compare=false", "progress=false"), "placement_rl.agents.constructive_eval:greedy_result", ()),
    (("train", "graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "progress=false",
      "agent.ft_search_rounds=0", "agent.search_budget=20", "agent.eval_samples=2", "trainer.compare=false"),
     "placement_rl.studies.finetune:finetune", ("checkpoint={run}/checkpoint.pt",))],  # train goes on from its own
    ids=["place", "train"])
def test_a_rerun_stopped_before_writing_leaves_the_earlier_run_as_it_was(tmp_path, args, held, again):
    """A real run, then the same folder again stopped by SIGTERM before it wrote a file: every file of the folder,
    ``.hydra/`` and the log included, is the first run's (and so after a train refused there)."""
    from tests.test_cli_signals import _stopped

    run = tmp_path / "run"
    first = _command(tmp_path, [*args, f"hydra.run.dir={run}"])
    assert first.returncode == 0, first.stderr[-2000:]
    files = _files(run)
    assert {".hydra/config.yaml", f"{args[0]}.log", "metrics.json", "placement.json"} <= set(files)
    second = [*args, *(a.format(run=run) for a in again), "seed=3", f"hydra.run.dir={run}"]
    code, line = _stopped(tmp_path, held, second, (signal.SIGTERM,))
    assert (code, line) == (130, "interrupted: no file written")
    assert _files(run) == files and list(tmp_path.glob(".run-earlier-*")) == []
    if args[0] == "train":  # refused: the folder holds an earlier run
        refused = _command(tmp_path, [*args, "seed=3", f"hydra.run.dir={run}"])
        assert refused.returncode == 2 and "holds an earlier run" in refused.stderr
        assert _files(run) == files
