"""A placer of one's own: ``baselines.register``, its output checked (no silent truncation), ``compare`` taking
names only, the documented example running, and the SB3 graph policies refusing the constructive env clearly."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from placement_rl import baselines, envs
from placement_rl.cost import resolve_costs, simulate
from placement_rl.errors import ConfigError, PlanError
from placement_rl.evaluate import compare
from placement_rl.graph.ir import make_graph
from placement_rl.topology import load_topology

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
CONSTRUCTIVE = "placement_rl/ConstructivePlacementEnv-v0"


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """Each test registers into a copy of the registry: nothing it adds outlives it."""
    monkeypatch.setattr(baselines, "_PLACERS", dict(baselines._PLACERS))


@pytest.fixture(scope="module")
def case():
    g = make_graph([dict(name=f"n{i}", op_type="linear", fwd_flops=1e10, bwd_flops=2e10, param_bytes=1e6,
                         out_bytes=1e6, act_bytes=1e6) for i in range(5)], [[i, i + 1, 1e6] for i in range(4)])
    topology = load_topology("2x_k80")
    return g, resolve_costs(g, topology), topology


def alternate(problem: baselines.Problem) -> np.ndarray:
    return np.arange(problem.n) % problem.d


def test_a_placer_returning_fractions_is_refused_naming_it_and_the_entry(case):
    baselines.register("floaty", lambda prob: np.array([0.2, 0.9, 1.7, 1.2, 0.4]))
    with pytest.raises(PlanError, match=r"placer 'floaty' .*entry #0: 0\.2 is not an integer"):
        baselines.get("floaty")(*case, budget=5, seed=0)  # it was placed on [0, 0, 1, 1, 0] in silence


@pytest.mark.parametrize("out, what", [(np.array([[0, 1, 0, 1, 0]]), "flat"), (np.array([0, 1]), "2 entries"),
                                       (None, "device indices must be integers"), (["1"] * 5, "must be integers"),
                                       ([True] * 5, "must be integers"), (np.array([0, 1, 0, 1, 5]), "device index 5")])
def test_a_placer_returning_another_shape_or_device_is_refused_naming_it(case, out, what):
    baselines.register("bad", lambda prob: out)
    with pytest.raises(PlanError, match=rf"placer 'bad' .*{what}"):
        baselines.get("bad")(*case, budget=5, seed=0)


def test_integral_floats_are_taken_as_devices(case):
    baselines.register("floats", lambda prob: np.array([0.0, 1.0, 0.0, 1.0, 0.0]))
    p = baselines.get("floats")(*case, budget=5, seed=0)
    assert p.device_of_node.dtype == np.int64 and p.device_of_node.tolist() == [0, 1, 0, 1, 0]


def test_a_registered_placer_runs_in_get_names_and_compare(case):
    g, costs, topology = case
    baselines.register("alternate", alternate)
    assert baselines.names()[-1] == "alternate"
    p = baselines.get("alternate")(g, costs, topology, budget=5, seed=0)
    assert p.device_of_node.tolist() == [0, 1, 0, 1, 0] and p.meta["placer"] == "alternate"
    assert p.meta["step_time"] == simulate(g, costs, topology, p.device_of_node).step_time
    rows = {r.placer: r for r in compare(g, costs, topology, budget=5, placers=["alternate", "heft"])}
    assert set(rows) == {"single_device", "alternate", "heft"}
    assert rows["alternate"].step_time == p.meta["step_time"] and not rows["alternate"].note


def test_register_refuses_bad_names_and_functions():
    assert "register" in baselines.__all__
    for name in ("", "  ", None, 3):
        with pytest.raises(ConfigError, match="non-empty string"):
            baselines.register(name, alternate)
    with pytest.raises(ConfigError, match="'heft' is already registered: pass overwrite=True"):
        baselines.register("heft", alternate)
    with pytest.raises(ConfigError, match="must be a function"):
        baselines.register("x", "heft")

    def full_signature(graph, costs, topology, *, budget, seed):  # a Placer, not fn(problem)
        return None

    with pytest.raises(ConfigError, match="must take one argument, the Problem"):
        baselines.register("x", full_signature)
    assert "x" not in baselines.names()
    baselines.register("heft", alternate, overwrite=True)
    assert baselines._PLACERS["heft"] is alternate


def test_compare_refuses_a_function_in_placers(case):
    with pytest.raises(ConfigError, match=r"got <function alternate.*baselines\.register"):
        compare(*case, budget=5, placers=[alternate])  # it was a NaN row noting "unknown placer '<function ...>'"


def test_compare_takes_one_name_as_a_string(case):
    assert [r.placer for r in compare(*case, budget=5, placers="heft")] == ["single_device", "heft"]


def test_the_documented_example_runs(capsys):
    text = (ROOT / "docs" / "baselines.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    exec(compile(code, "docs/baselines.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"^alternate: [\d.]+ ms$", out, re.M) and re.search(r"^best_of_random: [\d.]+ ms", out, re.M)


def test_names_and_pipeline_names_have_docstrings():
    for fn in (baselines.names, baselines.pipeline_names, baselines.register):
        assert fn.__doc__ and fn.__doc__.strip()


def test_graph_policies_on_the_constructive_env_say_which_envs_they_are_for():
    from sb3_contrib import MaskablePPO

    from placement_rl.agents.sb3 import MaskableGraphPolicy

    assert CONSTRUCTIVE in envs.ENV_IDS  # importing envs registered it
    env = gym.make(CONSTRUCTIVE, graph="synthetic:layered", topology="2x_k80")
    with pytest.raises(ConfigError, match=r"Placement, OneShot and Pipeline envs: this observation has no "
                                          r"'op_type' key .*ConstructiveTrainer"):
        MaskablePPO(MaskableGraphPolicy, env, n_steps=64, batch_size=32, device="cpu")  # was KeyError: 'op_type'


def test_a_long_non_integer_placement_is_refused_in_one_line(case):
    baselines.register("bools", lambda prob: np.ones((40, 40), dtype=bool))  # its repr: 40 lines
    baselines.register("labels", lambda prob: np.array([["gpu0"] * 30] * 30))
    for name in ("bools", "labels"):
        with pytest.raises(PlanError) as info:
            baselines.get(name)(*case, budget=5, seed=0)
        assert "\n" not in str(info.value) and len(str(info.value)) < 200 and f"placer '{name}'" in str(info.value)
