"""Placement and StagePlan: validation (each PlanError case) and JSON round trips."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from placement_rl.errors import PlanError
from placement_rl.graph.ir import make_graph
from placement_rl.plans import Placement, StagePlan, load_plan
from placement_rl.topology import DeviceTopology


@pytest.fixture
def topo() -> DeviceTopology:
    return DeviceTopology.from_dict({
        "name": "four", "devices": [{"name": "gpu", "count": 4, "kind": "gpu", "peak_flops": 1e13,
                                     "mem_bandwidth": 1e12, "memory_bytes": 16e9}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})


@pytest.fixture
def g():
    return make_graph([dict(name=f"n{i}", fwd_flops=1e9) for i in range(6)], [(i, i + 1, 1e6) for i in range(5)])


def test_placement_json_round_trip(g, topo, tmp_path) -> None:
    p = Placement([0, 1, 3, 3, 2, 0], meta={"placer": "test"}).validate(g, topo)
    path = tmp_path / "placement.json"
    p.to_json(path, graph=g, topology=topo)
    data = json.loads(path.read_text())
    assert data["devices"] == ["gpu0", "gpu1", "gpu2", "gpu3"] and data["nodes"] == list(g.names)
    back = Placement.from_json(path, topology=topo, graph=g)
    np.testing.assert_array_equal(back.device_of_node, p.device_of_node)
    assert back.meta == {"placer": "test"}
    assert isinstance(load_plan(path, topology=topo, graph=g), Placement)
    # device names survive a topology whose devices are listed in another order
    flipped = topo.subset([3, 2, 1, 0])
    again = Placement.from_json(p.to_json(graph=g, topology=topo), topology=flipped)
    assert [flipped.devices[d].name for d in again.device_of_node] == ["gpu0", "gpu1", "gpu3", "gpu3", "gpu2", "gpu0"]


def test_placement_nodes_listed_in_another_order_keep_their_devices(g, topo) -> None:
    """A placement file says which node each entry is (``nodes``): entries in another order mean the same
    placement; a name the graph lacks or a name given twice is refused."""
    p = Placement([0, 1, 3, 3, 2, 0])
    data = json.loads(p.to_json(graph=g, topology=topo))
    order = [5, 2, 0, 4, 1, 3]
    data["nodes"] = [data["nodes"][v] for v in order]
    data["device_of_node"] = [data["device_of_node"][v] for v in order]
    back = Placement.from_json(json.dumps(data), topology=topo, graph=g)
    np.testing.assert_array_equal(back.device_of_node, p.device_of_node)
    data["nodes"][0] = "elsewhere"
    with pytest.raises(PlanError, match="names node 'elsewhere'"):
        Placement.from_json(json.dumps(data), topology=topo, graph=g)
    data["nodes"][0] = data["nodes"][1]
    with pytest.raises(PlanError, match="must name each node once"):
        Placement.from_json(json.dumps(data), topology=topo, graph=g)


def test_stage_plan_json_round_trip(g, topo, tmp_path) -> None:
    plan = StagePlan(stage_of_node=[0, 0, 1, 1, 2, 2], stage_devices=[(0, 1), (2,), (3,)], num_microbatches=4,
                     schedule="gpipe", batch_size=16).validate(g, topo)
    assert plan.dp_degrees == (2, 1, 1) and plan.world_size == 4 and plan.num_stages == 3
    path = tmp_path / "plan.json"
    plan.to_json(path, graph=g, topology=topo)
    back = load_plan(path, topology=topo, graph=g)
    assert isinstance(back, StagePlan)
    np.testing.assert_array_equal(back.stage_of_node, plan.stage_of_node)
    assert (back.stage_devices, back.num_microbatches, back.schedule, back.batch_size) == \
        (plan.stage_devices, 4, "gpipe", 16)


def test_unknown_device_name_in_json(g, topo) -> None:
    text = Placement([0] * 6).to_json(graph=g)  # no topology: devices named dev0
    with pytest.raises(PlanError, match="device 'dev0'"):
        Placement.from_json(text, topology=topo)
    plan_text = StagePlan(stage_of_node=[0] * 6, stage_devices=[(0,)]).to_json()
    with pytest.raises(PlanError, match="device 'dev0'"):
        StagePlan.from_json(plan_text, topology=topo)


def test_wrong_length(g, topo) -> None:
    with pytest.raises(PlanError, match="5 entries but graph"):
        Placement([0] * 5).validate(g, topo)
    with pytest.raises(PlanError, match="7 entries but graph"):
        StagePlan(stage_of_node=[0] * 7, stage_devices=[(0,)]).validate(g, topo)
    with pytest.raises(PlanError, match="device index 4"):
        Placement([0, 0, 0, 0, 0, 4]).validate(g, topo)


def test_gap_in_stages(g, topo) -> None:
    with pytest.raises(PlanError, match="stage 1 has no nodes"):
        StagePlan(stage_of_node=[0, 0, 0, 2, 2, 2], stage_devices=[(0,), (1,), (2,)]).validate(g, topo)


def test_backward_edge(g, topo) -> None:
    with pytest.raises(PlanError, match="goes backwards"):
        StagePlan(stage_of_node=[0, 1, 0, 1, 1, 1], stage_devices=[(0,), (1,)]).validate(g, topo)


def test_non_divisible_batch(g, topo) -> None:
    with pytest.raises(PlanError, match="not divisible"):
        StagePlan(stage_of_node=[0, 0, 0, 1, 1, 1], stage_devices=[(0, 1), (2,)], num_microbatches=3,
                  batch_size=9).validate(g, topo)


def test_device_shared_between_stages(g, topo) -> None:
    with pytest.raises(PlanError, match="used by stages 0 and 1"):
        StagePlan(stage_of_node=[0, 0, 0, 1, 1, 1], stage_devices=[(0, 1), (1, 2)]).validate(g, topo)
    # interleaved virtual stages may share a group
    StagePlan(stage_of_node=[0, 0, 1, 1, 2, 3], stage_devices=[(0,), (1,), (0,), (1,)],
              schedule="interleaved1f1b", num_microbatches=2).validate(g, topo)


def test_other_plan_errors(g, topo, tmp_path) -> None:
    with pytest.raises(PlanError, match="unknown schedule"):
        StagePlan(stage_of_node=[0] * 6, stage_devices=[(0,)], schedule="pipedream")
    with pytest.raises(PlanError, match="num_microbatches"):
        StagePlan(stage_of_node=[0] * 6, stage_devices=[(0,)], num_microbatches=0)
    with pytest.raises(PlanError, match="does not exist"):
        Placement.from_json(tmp_path / "missing.json")
    with pytest.raises(PlanError, match="malformed JSON"):
        Placement.from_json("{not json")
    with pytest.raises(PlanError, match="schema"):
        load_plan(_write(tmp_path / "x.json", {"schema": "other"}))


def _write(path, data):
    path.write_text(json.dumps(data))
    return path


def _twin(g):
    """A graph with ``g``'s node count (and names and edges) but other sizes: another graph to a plan."""
    return g.replace(fwd_flops=g.fwd_flops * 2)


def test_plan_for_another_graph_with_as_many_nodes_is_refused(g, topo, tmp_path) -> None:
    other = _twin(g)
    assert other.num_nodes == g.num_nodes and other.fingerprint() != g.fingerprint()
    placement, stage_plan = Placement([0, 1, 2, 3, 0, 1]), StagePlan(stage_of_node=[0, 0, 0, 1, 1, 1],
                                                                     stage_devices=[(0,), (1,)])
    placement.to_json(tmp_path / "placement.json", graph=g, topology=topo)
    stage_plan.to_json(tmp_path / "plan.json", graph=g, topology=topo)
    for path, what in ((tmp_path / "placement.json", "placement"), (tmp_path / "plan.json", "stage plan")):
        with pytest.raises(PlanError, match=rf"^{re.escape(str(path))}: {what} was made for graph 'graph' \(fingerprint {g.fingerprint()}, "
                                            rf"6 nodes\), not this one"):
            load_plan(path, topology=topo, graph=other)
        assert load_plan(path, topology=topo, graph=g) is not None
    with pytest.raises(PlanError, match="made for graph"):  # checked without a topology too
        StagePlan.from_json(stage_plan.to_json(graph=g), graph=other)
    with pytest.raises(PlanError, match="made for graph"):
        Placement.from_json(placement.to_json(graph=g), graph=other)


def test_plans_without_a_fingerprint_still_load(g, topo) -> None:
    for text in (Placement([0, 1, 2, 3, 0, 1]).to_json(graph=g, topology=topo),
                 StagePlan(stage_of_node=[0, 0, 0, 1, 1, 1], stage_devices=[(0,), (1,)]).to_json(graph=g,
                                                                                               topology=topo)):
        data = json.loads(text)
        del data["graph_fingerprint"]  # a file written before plans carried one
        assert load_plan_text(data, topo, _twin(g)) is not None
        data["graph_fingerprint"] = 12
        with pytest.raises(PlanError, match="'graph_fingerprint' must be a string"):
            load_plan_text(data, topo, g)


def load_plan_text(data, topo, graph):
    cls = StagePlan if data["schema"] == "placement_rl.stage_plan" else Placement
    return cls.from_json(json.dumps(data), topology=topo, graph=graph)


def test_every_plan_the_cli_writes_carries_the_graph_fingerprint(g, topo, tmp_path) -> None:
    from placement_rl.cli.common import save_plan

    stage_plan = StagePlan(stage_of_node=[0, 0, 0, 1, 1, 1], stage_devices=[(0,), (1,)])
    for value in (np.array([0, 1, 2, 3, 0, 1]), stage_plan):
        _, name = save_plan(value, g, topo, tmp_path)
        assert json.loads((tmp_path / name).read_text())["graph_fingerprint"] == g.fingerprint()


def test_plans_compare_by_value_so_gymnasiums_determinism_check_holds() -> None:
    a = StagePlan(stage_of_node=[0, 0, 1], stage_devices=[(0,), (1,)], num_microbatches=2, meta={"x": np.arange(3)})
    b = StagePlan(stage_of_node=np.array([0, 0, 1]), stage_devices=[[0], [1]], num_microbatches=2,
                  meta={"x": np.arange(3)})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != StagePlan(stage_of_node=[0, 0, 1], stage_devices=[(0,), (1,)], num_microbatches=4)
    assert a != StagePlan(stage_of_node=[0, 1, 1], stage_devices=[(0,), (1,)], num_microbatches=2,
                          meta={"x": np.arange(3)})
    assert a != StagePlan(stage_of_node=[0, 0, 1], stage_devices=[(0,), (1,)], num_microbatches=2,
                          meta={"x": np.arange(1, 4)})
    p, q = Placement([0, 1, 1], meta={"placer": "t"}), Placement(np.array([0, 1, 1]), meta={"placer": "t"})
    assert p == q and hash(p) == hash(q) and p != Placement([0, 1, 0], meta={"placer": "t"}) and p != a


def test_one_node_pipeline_env_passes_gymnasiums_checker() -> None:
    from gymnasium.utils.env_checker import check_env

    from placement_rl.envs import PipelineEnv
    one = DeviceTopology.from_dict({
        "name": "one", "devices": [{"name": "gpu", "count": 1, "kind": "gpu", "peak_flops": 1e13,
                                    "mem_bandwidth": 1e12, "memory_bytes": 16e9}],
        "links": {"intra_host": {"bandwidth": 1e10, "latency": 1e-5}}})
    g = make_graph([dict(name="n0", fwd_flops=1e9, bwd_flops=2e9, out_bytes=1e6, param_bytes=1e6, act_bytes=1e6)],
                   [], name="single")
    check_env(PipelineEnv(graph=g, topology=one), skip_render_check=True)


def test_sequence_parallel_without_a_tp_stage_is_refused(g, topo, tmp_path) -> None:
    with pytest.raises(PlanError, match="no stage has a TP degree > 1"):
        StagePlan(stage_of_node=[0] * 6, stage_devices=[(0, 1)], sequence_parallel=True)
    plan = StagePlan(stage_of_node=[0] * 6, stage_devices=[(0, 1)]).validate(g, topo)
    path = tmp_path / "plan.json"
    plan.to_json(path, graph=g, topology=topo)
    data = json.loads(path.read_text())
    data["sequence_parallel"] = True
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="set it false"):
        load_plan(path, topology=topo, graph=g)
