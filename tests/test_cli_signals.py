"""``train`` and ``place`` stopped by SIGTERM (what ``timeout``, Slurm and Kubernetes send) end as Ctrl-C ends
them, in every phase: exit code 130 and one line naming what was written (SIGTERM gave 143 and no line), and a
rerun's earlier files put back where the run wrote none of its own yet, else named where they are (a SIGTERM in
place's greedy pass left them in a hidden folder; a Ctrl-C after the plan was written put the earlier
metrics.json back beside the new plan). A signal the process was started ignoring stays ignored.

The end-to-end tests run the command in a real process with one phase's function held (it prints a line, then
waits on stdin): the signal is sent once that line is read."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from placement_rl.cli import common, run_folder
from placement_rl.cli.place_notes import INTERRUPTED_EXIT, said_on_signal
from placement_rl.cli.signals import _raise_interrupt, sigterm_as_interrupt

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------ in this process
def test_sigterm_raises_keyboard_interrupt_in_the_block_and_an_ignored_one_stays_ignored(monkeypatch):
    monkeypatch.delenv(common.DRIVER_PID, raising=False)
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigterm_as_interrupt():
                assert signal.getsignal(signal.SIGTERM) is _raise_interrupt
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # back after the block
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a job started with SIGTERM ignored
        with sigterm_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            signal.raise_signal(signal.SIGTERM)  # nothing happens
        monkeypatch.setenv(common.DRIVER_PID, str(os.getpid() + 1))  # a launcher's job worker: its driver says it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with sigterm_as_interrupt(worker=common.in_job_worker()):
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def _earlier(folder: Path) -> dict[str, str]:
    """An earlier finished run's files in ``folder`` (each holding its own name)."""
    names = ("metrics.json", "placement.json", "graph.json", "best/placement.json")
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"earlier {name}")
    return {name: f"earlier {name}" for name in names}


def _app(tmp_path, monkeypatch, run) -> int:
    """``run`` as a command replacing an earlier run's files in ``tmp_path/run``: its exit code."""
    monkeypatch.setenv(common.DRIVER_PID, "0")  # main() sets it: put back after the test
    monkeypatch.setattr(common, "_TASK_STARTED", False)
    monkeypatch.setattr(sys, "argv", ["placement-rl", f"hydra.run.dir={tmp_path}/run", "progress=false"])
    with pytest.raises(SystemExit) as exc:
        common.hydra_app("place", replaces=("metrics.json", "placement.json", "graph.json", "best/placement.json"),
                         sigterm=True)(run)()
    return exc.value.code


def test_an_interrupt_after_the_run_wrote_files_keeps_them_and_names_where_the_earlier_ones_are(
        tmp_path, monkeypatch, capsys):
    """Put back beside the new placement.json, the earlier metrics.json would pass for this run's results."""
    folder = tmp_path / "run"
    earlier = _earlier(folder)

    def wrote_then_stopped(cfg) -> None:
        written: list[str] = []
        with common.files_on_interrupt(written, ["metrics.json"]):
            (folder / "placement.json").write_text("new")
            written.append("placement.json")
            signal.raise_signal(signal.SIGTERM)

    code = _app(tmp_path, monkeypatch, wrote_then_stopped)
    [store] = run_folder.held()
    try:
        assert code == 130 and capsys.readouterr().err.strip().splitlines()[-1] == (
            f"interrupted: wrote placement.json; metrics.json not written; the earlier run's files it replaced are "
            f"in {store}")
        assert sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix != ".log") == ["placement.json"]
        assert (folder / "placement.json").read_text() == "new"
        assert {n: (store / n).read_text() for n in earlier} == earlier
    finally:
        run_folder.restore_held()


def test_an_interrupt_before_the_run_wrote_any_file_puts_the_earlier_ones_back(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "run"
    earlier = _earlier(folder)

    def stopped(cfg) -> None:
        with common.files_on_interrupt([], ["metrics.json"]):
            signal.raise_signal(signal.SIGTERM)

    code = _app(tmp_path, monkeypatch, stopped)
    assert code == 130 and capsys.readouterr().err.strip().splitlines()[-1] == "interrupted: no file written"
    assert {n: (folder / n).read_text() for n in earlier} == earlier and run_folder.held() == []


@pytest.fixture
def exits(monkeypatch):
    """``os._exit`` recorded instead of ending pytest (``said_on_signal``'s watcher calls it from its thread), and
    SIGTERM caught meanwhile (with no watcher it would end pytest)."""
    codes: list[int] = []
    done = threading.Event()
    monkeypatch.setattr(os, "_exit", lambda code: (codes.append(code), done.set()))
    before = signal.signal(signal.SIGTERM, lambda *_: None)
    yield codes, done
    signal.signal(signal.SIGTERM, before)


def test_said_on_signal_puts_an_earlier_runs_files_back_before_it_ends_the_process(tmp_path, capsys, exits):
    """The greedy pass writes nothing of the new run: a signal there puts the earlier run's files back at once
    (Slurm's or Kubernetes' SIGKILL follows its SIGTERM within about 30 s; the pass may take minutes)."""
    codes, done = exits
    folder = tmp_path / "run"
    earlier = _earlier(folder)
    store = run_folder.set_aside(folder, list(earlier)).store
    assert store is not None and not (folder / "metrics.json").exists()
    with said_on_signal("interrupted: no file written", restore=True):
        signal.raise_signal(signal.SIGTERM)
        assert done.wait(10)
    assert codes == [INTERRUPTED_EXIT] and capsys.readouterr().err == "interrupted: no file written\n"
    assert {n: (folder / n).read_text() for n in earlier} == earlier and run_folder.held() == []
    assert not store.exists()


# ------------------------------------------------------------------------------------------ real processes
# the command with one function replaced by one that prints a line and waits on stdin (then runs the real one)
DRIVER = textwrap.dedent("""
    import importlib, sys

    module, name = sys.argv[1].rsplit(":", 1)
    mod = importlib.import_module(module)
    real = getattr(mod, name)

    def held(*args, **kwargs):
        print("held in", name, flush=True)
        sys.stdin.readline()
        return real(*args, **kwargs)

    setattr(mod, name, held)
    for cli in ("place", "train"):  # the numba warm-up runs the decodes on a graph of its own: not the phase held
        setattr(importlib.import_module("placement_rl.cli." + cli), "warm_up", lambda policy: 0.0)
    from placement_rl.cli.main import main

    main(sys.argv[2:])
""")


def _handlers(ignored: tuple[int, ...]):
    """The child's signals: SIGINT and SIGTERM as a terminal leaves them (a shell running pytest in the background
    ignores SIGINT, and the child would too), those of ``ignored`` ignored."""
    def set_them() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    return set_them


def _stopped(tmp_path: Path, held: str, args: list[str], sigs: tuple[int, ...], *, ignored: tuple[int, ...] = (),
             go: bool = False) -> tuple[int, str]:
    """Run ``placement-rl <args>`` with ``held`` held; once it says so send ``sigs`` (then, given ``go``, let it go
    on): its exit code and the last line on stderr."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop(common.DRIVER_PID, None)
    with open(tmp_path / "stderr.txt", "w") as err:
        p = subprocess.Popen([sys.executable, "-c", DRIVER, held, *args], cwd=tmp_path, env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                             preexec_fn=_handlers(ignored))
        try:
            for line in p.stdout:
                if line.startswith("held in"):
                    break
            else:
                pytest.fail(f"ended before the phase held: {(tmp_path / 'stderr.txt').read_text()[-2000:]}")
            for sig in sigs:
                p.send_signal(sig)
            p.communicate("go\n" if go else "", timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    lines = (tmp_path / "stderr.txt").read_text().strip().splitlines()
    return p.returncode, lines[-1] if lines else ""


PLACE = ("place", "graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "samples=2", "search_seconds=0.2",
         "compare=false", "progress=false")
SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGINT, id="SIGINT")]


def _hidden(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob(".run-earlier-*"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_place_stopped_in_its_greedy_pass_puts_the_earlier_runs_files_back(tmp_path, sig):
    """SIGTERM there ended the run with 143 and no line, the earlier files left in a hidden folder beside it."""
    run = tmp_path / "run"
    earlier = _earlier(run)
    code, line = _stopped(tmp_path, "placement_rl.agents.constructive_eval:greedy_result",
                          [*PLACE, f"hydra.run.dir={run}"], (sig,))
    assert (code, line) == (130, "interrupted: no file written")
    assert {n: (run / n).read_text() for n in earlier} == earlier and _hidden(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("held, said", [
    ("placement_rl.agents.constructive_eval:with_samples",
     r"interrupted in the samples: placement\.json in {run} holds the greedy placement \([0-9.]+ ms\); metrics\.json "
     r"not written"),
    ("placement_rl.agents.policy_search:policy_search",
     r"interrupted: wrote graph\.json, placement\.json; policy_search/\*, metrics\.json not written")],
    ids=["samples", "search_seconds"])
def test_place_stopped_after_writing_its_plan_keeps_it_and_names_where_the_earlier_files_are(tmp_path, sig, held,
                                                                                              said):
    """The greedy placement written stays; the earlier run's files stay set aside (put back, its metrics.json would
    pass for this run's), in the folder the line names."""
    run = tmp_path / "run"
    earlier = _earlier(run)
    code, line = _stopped(tmp_path, held, [*PLACE, f"hydra.run.dir={run}"], (sig,))
    [store] = _hidden(tmp_path)
    assert code == 130 and re.fullmatch(said.format(run=re.escape(str(run))) + re.escape(
        f"; the earlier run's files it replaced are in {store}"), line), line
    assert {n: (store / n).read_text() for n in earlier} == earlier
    assert not (run / "metrics.json").exists() and (run / "placement.json").read_text() != earlier["placement.json"]


@pytest.mark.slow
def test_place_started_with_sigint_and_sigterm_ignored_ignores_them(tmp_path):
    """A script's background job starts with SIGINT ignored (and a launcher may ignore SIGTERM): the run goes on."""
    run = tmp_path / "run"
    _earlier(run)
    code, _ = _stopped(tmp_path, "placement_rl.agents.constructive_eval:greedy_result",
                       [*PLACE, f"hydra.run.dir={run}"], (signal.SIGTERM, signal.SIGINT),
                       ignored=(signal.SIGINT, signal.SIGTERM), go=True)
    assert code == 0 and (run / "metrics.json").read_text() != "earlier metrics.json" and _hidden(tmp_path) == []


TRAIN = ("train", "graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "progress=false",
         "agent.ft_search_rounds=0", "agent.search_budget=20", "agent.eval_samples=2")


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("held, args, said", [
    ("placement_rl.studies.pretrain:build_tasks", ("train", "trainer=pretrain", "workers=1"), "interrupted"),
    ("placement_rl.studies.finetune:finetune", (*TRAIN, "trainer.compare=false"), "interrupted: no file written"),
    ("placement_rl.studies.finetune:equal_seconds_rows", (*TRAIN, "trainer.compare=true"),
     "interrupted: wrote checkpoint.pt, graph.json, placement.json; search/placement.json, learned.md, training.png, "
     "comparison.*, metrics.json not written")],
    ids=["pretraining", "fine-tuning", "comparisons"])
def test_train_stopped_by_sigterm_says_what_ctrl_c_says(tmp_path, sig, held, args, said):
    """SIGTERM ended train with 143 and no line in every phase; the checkpoint written before the comparisons stays."""
    run = tmp_path / "run"
    code, line = _stopped(tmp_path, held, [*args, f"hydra.run.dir={run}"], (sig,))
    assert (code, line) == (130, said)
    assert (run / "checkpoint.pt").is_file() == ("checkpoint.pt" in said) and not (run / "metrics.json").exists()


def test_sigterm_while_train_or_place_starts_is_answered_as_ctrl_c(monkeypatch, capsys):
    """Seconds of imports pass before a run installs its own handler: SIGTERM then raises KeyboardInterrupt too, and
    ``main`` says so in one line, exit 130 (Python's default: exit 143, no line); SIGTERM ignored at start stays so."""
    import importlib
    import signal

    from placement_rl.cli import main as cli_main

    seen = []

    def stopped_in_import(name):
        seen.append(signal.getsignal(signal.SIGTERM))
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", stopped_in_import)
    before = signal.getsignal(signal.SIGTERM)
    try:
        for ignored in (False, True):
            signal.signal(signal.SIGTERM, signal.SIG_IGN if ignored else signal.SIG_DFL)
            with pytest.raises(SystemExit) as exc:
                cli_main.main(["place"])
            assert exc.value.code == 130
            assert capsys.readouterr().err.strip().splitlines() == ["interrupted: no file written"]
            assert seen[-1] is (signal.SIG_IGN if ignored else _raise_interrupt)
    finally:
        signal.signal(signal.SIGTERM, before)
