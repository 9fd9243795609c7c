"""Plan files refuse unknown fields (naming the nearest known one), the TP-degree message when only TP 1 divides a
graph, and maxload's two lower bounds worded as the different bounds they are."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from placement_rl.errors import PlanError
from placement_rl.graph.ir import make_graph
from placement_rl.plans import PLACEMENT_KEYS, STAGE_PLAN_KEYS, Placement, StagePlan, load_plan
from placement_rl.topology import DeviceTopology

from tests.test_plans import topo  # noqa: E402,F401 - the fixture: four GPUs

torch.set_num_threads(1)


@pytest.fixture
def g():
    return make_graph([dict(name=f"n{i}", fwd_flops=1e9) for i in range(4)], [(i, i + 1, 1e6) for i in range(3)])


def test_a_misspelled_plan_field_is_refused_with_the_nearest_name(g, topo, tmp_path):
    """``microbatches`` for ``num_microbatches`` used to load as 1 micro-batch (priced 43.6 ms, not 22.97)."""
    plan = StagePlan(stage_of_node=[0, 0, 1, 1], stage_devices=[(0,), (1,)], num_microbatches=4, meta={"x": 1})
    data = json.loads(plan.to_json(graph=g, topology=topo))
    assert set(data) <= set(STAGE_PLAN_KEYS)  # everything the writer writes is read back
    assert StagePlan.from_json(json.dumps(data), topology=topo, graph=g) == plan
    data["microbatches"] = data.pop("num_microbatches")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="unknown field 'microbatches': did you mean 'num_microbatches'") as exc:
        load_plan(path, topology=topo, graph=g)
    assert "\n" not in str(exc.value)
    data["num_microbatches"] = data.pop("microbatches")
    data["meta"] = {"anything": {"goes": [1, 2]}, "microbatches": 3}  # meta stays free-form
    assert StagePlan.from_json(json.dumps(data), topology=topo).meta["microbatches"] == 3


def test_an_unknown_placement_field_is_refused(g, topo):
    p = Placement([0, 1, 1, 0], meta={"placer": "t"})
    data = json.loads(p.to_json(graph=g, topology=topo))
    assert set(data) <= set(PLACEMENT_KEYS)
    assert Placement.from_json(json.dumps(data), topology=topo, graph=g) == p
    with pytest.raises(PlanError, match="unknown field 'device_of_nodes': did you mean 'device_of_node'"):
        Placement.from_json(json.dumps({**data, "device_of_nodes": data["device_of_node"]}), topology=topo)
    with pytest.raises(PlanError, match="unknown field 'zzz': known fields: schema, version"):
        Placement.from_json(json.dumps({**data, "zzz": 1}), topology=topo)


def test_tp_message_when_only_tp_1_divides_the_graph():
    """vocab 33 with two heads, padding off: the gcd is 1, so the advice is TP 1 or padding (not "dividing 1")."""
    from placement_rl.graph.capture import capture_zoo

    gpt = capture_zoo("gpt", batch_size=4, seq_len=8, vocab_size=33, d_model=16, n_layers=1, n_heads=2)
    topo = DeviceTopology.from_dict({
        "name": "two", "devices": [{"name": "gpu", "count": 2, "kind": "gpu", "peak_flops": 1e13,
                                    "mem_bandwidth": 1e12, "memory_bytes": 16e9}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})
    plan = StagePlan(np.zeros(gpt.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,), make_vocab_size_divisible_by=0)
    with pytest.raises(PlanError) as exc:
        plan.validate(gpt, topo)
    text = str(exc.value)
    assert "does not divide vocab=33" in text and "only TP degree 1 divides" in text and "dividing 1" not in text
    assert "make_vocab_size_divisible_by > 0" in text


def test_maxload_scoring_and_solving_name_their_bounds(tmp_path, capsys):
    """Solving may print CP-SAT's bound, scoring ``--split`` the simple one: each says which, and the simple
    bound's value is the same in both."""
    from placement_rl.baselines.maxload_instances import random_instance
    from placement_rl.cli.maxload import main

    path, out = tmp_path / "inst.json", tmp_path / "split.json"
    path.write_text(json.dumps(random_instance(9, n=7, max_size=12)))
    main([str(path), "--out", str(out), "--seconds", "1"])
    solved = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("lower bound:"))
    main([str(path), "--split", str(out)])
    scored = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("lower bound:"))
    assert "the simple bound" in solved and "the simple bound" in scored and "CP-SAT" in scored
    simple = float(scored.split()[2])
    named = re.search(r"the simple bound \(.*\) is ([0-9.e+-]+)", solved)
    assert float(named.group(1) if named else solved.split()[2]) == pytest.approx(simple, rel=1e-5)
