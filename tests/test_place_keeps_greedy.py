"""``place`` keeps what it found: the greedy placement is written before the samples (a run stopped in them kept
nothing of a 4-minute greedy pass on 5,000 nodes), a SIGTERM there ends the run with one line saying so, the line
before long samples says how to cap them, and ``search_seconds``'s policy_search starts from the plan (it returned
49.3 ms where the plan was 45.4 ms)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from placement_rl.agents.constructive import Rollout
from placement_rl.cli import place
from placement_rl.cli.common import Phases, _compose
from placement_rl.cli.place_notes import INTERRUPTED_EXIT, said_on_signal, samples_note

torch.set_num_threads(1)

SMALL = ("graph=synthetic", "graph.num_nodes=10", "topology=2x_k80", "progress=false", "compare=false")


def _cfg(*overrides: str):
    cfg, _ = _compose("place", list(overrides), [])
    return OmegaConf.create(cfg)


def _devices(path) -> list[int]:
    return json.loads(path.read_text())["device_of_node"]


def test_greedy_placement_is_written_before_the_samples_and_a_faster_sample_replaces_it(tmp_path, monkeypatch):
    """placement.json holds the greedy placement when the samples start, and the faster sample once they end."""
    import placement_rl.agents.constructive_eval as ce

    seen, faster = [], []

    def one_faster_sample(policy, res, samples, generator, done=None):
        seen.append(_devices(tmp_path / "placement.json"))  # before: no file until every phase had run
        other = 1 - res.greedy.devices[0]  # every node on the other of the two GPUs
        faster.append(other.tolist())
        return dataclasses.replace(res, sampled=Rollout(other[None], np.array([res.greedy_time / 2]),
                                                        np.array([True])), link_scales=())

    monkeypatch.setattr(ce, "with_samples", one_faster_sample)
    monkeypatch.setattr(place, "warm_up", lambda policy: 0.0)  # (it runs the samples on a graph of its own)
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    m = place.run(_cfg(*SMALL, "samples=1"))
    assert m["chosen"] == "sample 1" and m["step_time"] == m["greedy_step_time"] / 2
    assert seen[0] != faster[0] and _devices(tmp_path / "placement.json") == faster[0]
    assert (tmp_path / "graph.json").is_file() and (tmp_path / "metrics.json").is_file()


@pytest.fixture
def exits(monkeypatch):
    """``os._exit`` recorded instead of ending pytest (``said_on_signal``'s watcher calls it from its thread), and
    SIGTERM caught meanwhile (without a watcher it would end pytest). SIGINT as an interactive run has it, whatever
    pytest was started with (a script's background job starts with SIGINT ignored, which ``said_on_signal`` keeps)."""
    codes: list[int] = []
    done = threading.Event()
    monkeypatch.setattr(os, "_exit", lambda code: (codes.append(code), done.set()))
    before = signal.signal(signal.SIGTERM, lambda *_: None)
    before_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield codes, done
    signal.signal(signal.SIGTERM, before)
    signal.signal(signal.SIGINT, before_int)


class _Ended(Exception):
    """Where the process would have ended (``os._exit``)."""


def test_sigterm_in_the_samples_ends_the_run_keeping_the_greedy_placement_with_one_line(tmp_path, monkeypatch,
                                                                                        capsys, exits):
    """A SIGTERM (``timeout``, Slurm) in the samples: one line on stderr naming the file that holds the greedy
    placement, exit code 130 at once (from a thread: the main one may be inside a compiled decode for minutes)."""
    import placement_rl.agents.constructive_eval as ce

    codes, done = exits

    def killed(policy, res, samples, generator, done_=None, **_):
        os.kill(os.getpid(), signal.SIGTERM)
        assert done.wait(10), "no line and no exit after SIGTERM"
        raise _Ended

    monkeypatch.setattr(ce, "with_samples", killed)
    monkeypatch.setattr(place, "warm_up", lambda policy: 0.0)
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    with pytest.raises(_Ended):
        place.run(_cfg(*SMALL, "samples=4"))
    assert codes == [INTERRUPTED_EXIT]
    # the command's one line (other lines on stderr here are earlier tests' logging handlers on closed streams)
    err = [x for x in capsys.readouterr().err.strip().splitlines() if x.startswith("interrupted")]
    assert len(err) == 1 and err[0].startswith(f"interrupted in the samples: placement.json in {tmp_path} holds the "
                                               "greedy placement (")
    assert err[0].endswith("ms); metrics.json not written")
    assert (tmp_path / "placement.json").is_file() and not (tmp_path / "metrics.json").exists()
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == handlers  # back after the block


def test_said_on_signal_answers_sigint_too_and_nothing_after_the_block(capsys, exits):
    codes, done = exits
    with said_on_signal("stopped here"):
        os.kill(os.getpid(), signal.SIGINT)
        assert done.wait(10)
    assert codes == [INTERRUPTED_EXIT] and capsys.readouterr().err == "stopped here\n"
    done.clear()
    with said_on_signal("never"):
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # the test's own handler again: nothing printed, no exit
    assert not done.wait(0.2) and codes == [INTERRUPTED_EXIT] and capsys.readouterr().err == ""


def test_long_samples_line_says_how_many_take_about_ten_minutes():
    """The 5,000-node run's line gave 65 min and only samples=0 to skip them."""
    assert samples_note(16, 243.8) == ("16 samples next, about 16 x the greedy pass's 243.8 s (65 min): each places "
                                       "every node again (5 on slower links, 11 drawn); samples=2 caps them at about "
                                       "8 min, samples=0 skips them")
    assert samples_note(4, 700.0).endswith("(4 on slower links); samples=0 skips them")  # not one fits 10 min
    assert samples_note(16, 21.0).endswith("samples=0 skips them, fewer take less")  # 6 min: as before


@pytest.fixture(scope="module")
def case():
    """The shipped policy, a 40-node dataflow graph on 8 V100s, and a plan that fits (round robin)."""
    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.cost import resolve_costs, simulate
    from placement_rl.graph import synthetic
    from placement_rl.topology import load_topology

    policy, _, _ = load_policy(default_checkpoint(), log=lambda *_: None)
    g = synthetic.sample("dataflow", num_nodes=40, seed=2)
    t = load_topology("2x4_v100_ib")
    c = resolve_costs(g, t)
    plan = np.arange(g.num_nodes) % t.num_devices
    assert simulate(g, c, t, plan).feasible
    return policy, g, c, t, plan


def test_policy_search_in_place_starts_from_the_plan_and_is_never_slower(case):
    """``run_searches(start=plan)``: policy_search's result is never slower than the plan it is given (a plan no
    search beats within the seconds stays), its row says where it started, and its calls are its own."""
    from placement_rl.cli import place_search
    from placement_rl.cost import simulate
    from placement_rl.envs.constructive_task import ConstructiveTask

    policy, g, c, t, plan = case
    plan_time = simulate(g, c, t, plan).step_time
    found = place_search.run_searches(policy, g, c, t, ConstructiveTask(g, t, c), 0.3, seed=0, compare=False,
                                      phases=Phases(False), start=plan)
    row = found["policy_search"]
    assert row["start"] == "plan" and row["start_time"] == pytest.approx(plan_time, rel=1e-9)
    assert row["step_time"] <= plan_time and row["trace"][0][2] == pytest.approx(plan_time, rel=1e-9)
    assert row["sim_calls"] >= 1 and 0 < row["seconds"]
    assert simulate(g, c, t, row["devices"]).step_time == pytest.approx(row["step_time"], rel=1e-9)
    assert f", from the plan's {plan_time * 1e3:.3f} ms" in place_search.summary(found)


def test_policy_search_from_a_given_start_paces_its_first_repair(case, monkeypatch):
    """From a given start no decode of its own timed the policy: the first repair was predicted at 0 s per decision,
    so not shortened (500 nodes on 64 GPUs: the 2 s search ran 2.9 s, that repair dropped, the start returned)."""
    import placement_rl.agents.policy_search as ps

    policy, g, c, t, plan = case
    rates, real = [], ps.suffix_start
    monkeypatch.setattr(ps, "suffix_start", lambda s, n, rate, left, pace=ps.PACE: (rates.append(rate),
                                                                                   real(s, n, rate, left, pace))[1])
    p = ps.policy_search(policy, g, c, t, seconds=0.3, seed=0, start=plan, anneal_share=0.0)
    assert p.meta["starts"] == ["given"] and rates and rates[0] > 0


def test_place_search_seconds_starts_policy_search_from_its_plan(tmp_path, monkeypatch, capsys):
    """``place search_seconds=S``: policy_search's row starts at the plan's step time and ends no slower."""
    monkeypatch.setattr(place, "output_dir", lambda: tmp_path)
    m = place.run(_cfg(*SMALL, "samples=1", "search_seconds=0.2"))
    row = m["policy_search"]["policy_search"]
    assert m["feasible"] and row["start"] == "plan" and row["start_time"] == pytest.approx(m["step_time"], rel=1e-9)
    assert row["step_time"] <= m["step_time"]
    assert f"from the plan's {m['step_time'] * 1e3:.3f} ms" in capsys.readouterr().out


def test_said_on_signal_names_an_earlier_runs_held_files_and_keeps_an_ignored_sigint(tmp_path, capsys, exits):
    """Ending at once skips putting back an earlier run's files set aside from the folder: the line says where they
    are. A SIGINT the process was started ignoring (a script's background job) stays ignored in the block."""
    from placement_rl.cli import run_folder

    codes, done = exits
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text("{}")
    earlier = run_folder.set_aside(folder, ["metrics.json"])
    assert earlier.store is not None and run_folder.held() == [earlier.store]
    with said_on_signal("stopped here"):
        os.kill(os.getpid(), signal.SIGTERM)
        assert done.wait(10)
    assert capsys.readouterr().err == f"stopped here; the earlier run's files it replaced are in {earlier.store}\n"
    earlier.restore()
    assert run_folder.held() == [] and (folder / "metrics.json").is_file()
    done.clear()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with said_on_signal("never"):
            os.kill(os.getpid(), signal.SIGINT)
            assert not done.wait(0.3)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert codes == [INTERRUPTED_EXIT]
