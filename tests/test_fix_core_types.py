"""The value types built by hand (``CompGraph``, ``make_graph``, ``Placement``, ``StagePlan``, ``CostTable``) refuse
malformed input with one-line domain errors instead of reading it as something else, write strict JSON, and stay
read-only after a pickle round trip."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import numpy as np
import pytest

from placement_rl.cost import CostTable, resolve_costs, simulate
from placement_rl.cost.modes import inference_costs
from placement_rl.errors import GraphError, PlanError, ProfileError
from placement_rl.graph.ir import CompGraph, make_graph
from placement_rl.plans import Placement, StagePlan
from placement_rl.topology import load_topology

TOPO = "4x_v100_nvlink"


def three(**changes) -> CompGraph:
    """A 3-node chain built with the constructor, ``changes`` replacing its fields."""
    fields = dict(names=("a", "b", "c"), op_types=("linear",) * 3, module_paths=("",) * 3, fwd_flops=[1e9] * 3,
                  bwd_flops=[2e9] * 3, out_bytes=[1e3] * 3, param_bytes=[1e3] * 3, act_bytes=[1e3] * 3,
                  edges=[[0, 1], [1, 2]], edge_bytes=[1e3, 1e3])
    return CompGraph(**{**fields, **changes})


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.fixture(scope="module")
def problem():
    g = three()
    topo = load_topology(TOPO)
    return g, topo, resolve_costs(g, topo)


# ---------------------------------------------------------------- CostTable


def hand(costs: CostTable, **changes) -> CostTable:
    fields = dict(fwd_time=costs.fwd_time, bwd_time=costs.bwd_time, link_latency=costs.link_latency,
                  link_bandwidth=costs.link_bandwidth, source=costs.source)
    return CostTable(**{**fields, **changes})


@pytest.mark.parametrize("changes, match", [
    (lambda c: {"bwd_time": c.bwd_time[:2]}, r"'bwd_time' has shape \[2, 4\], expected \[3, 4\]"),
    (lambda c: {"bwd_time": c.bwd_time[:1]}, r"'bwd_time' has shape \[1, 4\]"),
    (lambda c: {"launch_overhead": np.zeros((3, 2))}, r"'launch_overhead' has shape \[3, 2\], expected \[3, 4\]"),
    (lambda c: {"fwd_time": c.fwd_time[:, 0]}, r"'fwd_time' must be \[N nodes, D devices\], got shape \[3\]"),
    (lambda c: {"link_latency": np.zeros((3, 3))}, r"'link_latency' has shape \[3, 3\], expected \[4, 4\]"),
    (lambda c: {"link_bandwidth": np.ones(4)}, r"'link_bandwidth' has shape \[4\], expected \[4, 4\]"),
    (lambda c: {"source": ("roofline",)}, r"'source' must list 4 strings"),
    (lambda c: {"fwd_time": np.where(np.arange(3)[:, None] == 1, np.nan, c.fwd_time)},
     r"'fwd_time' is nan for node #1 on device #0"),
    (lambda c: {"bwd_time": -c.bwd_time}, r"'bwd_time' is -[0-9.e-]+ for node #0 on device #0: times must be"),
    (lambda c: {"fwd_time": np.full((3, 4), np.inf)}, r"'fwd_time' is inf"),
    (lambda c: {"link_bandwidth": np.zeros((4, 4))}, r"'link_bandwidth' is 0.0 between devices #0 and #1"),
    (lambda c: {"link_latency": -np.ones((4, 4))}, r"'link_latency' is -1.0 between devices #0 and #1"),
    (lambda c: {"link_latency": np.full((4, 4), np.nan)}, r"'link_latency' is nan"),
    (lambda c: {"fwd_time": [["x"] * 4] * 3}, r"'fwd_time' must be an array of numbers"),
])
def test_cost_table_refuses_malformed_arrays(problem, changes, match):
    g, topo, costs = problem
    with pytest.raises(ProfileError, match=match) as exc:
        hand(costs, **changes(costs))
    assert one_line(exc).startswith("cost table field '")


def test_cost_table_accepts_what_the_project_builds(problem):
    g, topo, costs = problem
    # the topology's own links (diagonal: bandwidth inf, latency 0), inference tables (backward 0), free links
    assert hand(costs).fwd_time.shape == (3, 4)
    assert inference_costs(costs).bwd_time.sum() == 0.0
    free = hand(costs, link_bandwidth=np.full((4, 4), np.inf), link_latency=np.zeros((4, 4)))
    assert simulate(g, free, topo, [0, 1, 2]).feasible
    odd_diagonal = np.array(costs.link_bandwidth)
    np.fill_diagonal(odd_diagonal, 0.0)  # never read: a device does not send to itself
    hand(costs, link_bandwidth=odd_diagonal, launch_overhead=None)
    dataclasses.replace(costs, fwd_time=costs.fwd_time * 2)


# ---------------------------------------------------------------- CompGraph


@pytest.mark.parametrize("edges, match", [
    ([[0, 1, 2], [0, 2, 1]], r"field 'edges' must be an \[E, 2\] array .* got shape \[2, 3\]"),
    ([[0, 1.9], [1, 2.7]], r"field 'edges': edge #0 endpoint 1.9 is not an integer"),
    (np.array([[0.0, 1.0], [1.0, np.nan]]), r"edge #1 endpoint nan is not an integer"),
    ([[0, 1], [1, 2**70]], r"edge #1 endpoint .* is beyond int64"),
    (np.array([[0, 2**64 - 1]], dtype=np.uint64), r"edge #0 endpoint 18446744073709551615 is beyond int64"),
    ([0, 1, 1, 2], r"got shape \[4\]"),
    (None, r"got None"),
])
def test_graph_edges_must_be_integer_pairs(edges, match):
    with pytest.raises(GraphError, match=match) as exc:
        three(edges=edges)  # checked before the edge count is compared with edge_bytes
    one_line(exc)


def test_graph_accepts_integral_and_empty_edges():
    assert three(edges=[[0.0, 1.0], [1.0, 2.0]]).edges.tolist() == [[0, 1], [1, 2]]
    assert three(edges=np.array([[0, 1], [1, 2]], dtype=np.int32)).edges.dtype == np.int64
    assert three(edges=[], edge_bytes=[]).num_edges == 0
    assert three(edges=np.zeros((0, 2)), edge_bytes=[]).edges.shape == (0, 2)


@pytest.mark.parametrize("changes, match", [
    ({"fwd_flops": [[1, 2, 3]]}, r"field 'fwd_flops' must be a flat list of numbers \(one per node\), got shape"),
    ({"act_bytes": np.ones((3, 1))}, r"field 'act_bytes' must be a flat list .* got shape \[3, 1\]"),
    ({"fwd_flops": None}, r"field 'fwd_flops' must be a flat list of numbers \(one per node\), got None"),
    ({"meta": None}, r"field 'meta' must be a dict .* got None"),
    ({"members": 5}, r"field 'members' must be a list of op-name lists"),
])
def test_graph_fields_of_the_wrong_kind_are_one_line_errors(changes, match):
    with pytest.raises(GraphError, match=match) as exc:
        three(**changes)
    one_line(exc)


# ---------------------------------------------------------------- make_graph


@pytest.mark.parametrize("nodes, edges, match", [
    ([{"name": "a"}, {"name": "b"}], [["a"]], r"edge #0 must be \[src, dst\] or \[src, dst, bytes\], got \['a'\]"),
    ([{"name": "a"}, {"name": "b"}], [["a", "b", 1], ["a", "b", "x"]], r"edge #1 has bytes='x': must be a number"),
    ([{"name": "a"}, {"name": "b"}], [[None, 1]], r"edge #0 has src=None: give a node name or an index in \[0, 2\)"),
    ([{"name": "a"}, {"name": "b"}], [[0, 0.7]], r"edge #0 has dst=0.7"),
    ([{"name": "a"}, {"name": "b"}], [[0, 2**70]], r"edge #0 has dst=1180591620717411303424"),
    ([{"name": "a"}, {"name": "b"}], [["a", "zz"]], r"edge #0 dst 'zz' names no node"),
    (["a", "b"], [[0, 1]], r"node #0 must be a dict with 'name' and per-node fields, got 'a'"),
    ([{"name": "a", "fwd_flop": 1e9}, {"name": "b"}], [], r"node 'a' \(#0\) has unknown field 'fwd_flop': did you "
                                                         r"mean 'fwd_flops'\?"),
    ([{"name": "a"}, {"name": "b", "fwd_flops": None}], [], r"node 'b' \(#1\) has fwd_flops=None: must be a number"),
    ([{"name": "a"}, {"name": "b"}], None, r"edges must be a list of \[src, dst, bytes\], got None"),
])
def test_make_graph_names_the_bad_node_or_edge(nodes, edges, match):
    with pytest.raises(GraphError, match=match) as exc:
        make_graph(nodes, edges)
    one_line(exc)


def test_make_graph_still_takes_its_documented_forms():
    g = make_graph([{"name": "a", "fwd_flops": 1e9, "op_type": "linear", "members": ["a"]}, {"name": "b"},
                    {"name": "c", "param_bytes": np.float32(4.0)}],
                   np.array([[0, 1, 5.0], [1, 2, 2.0]]), name="g", meta={"batch_size": 2})
    assert g.edges.tolist() == [[0, 1], [1, 2]] and g.edge_bytes.tolist() == [5.0, 2.0]
    assert make_graph([{"name": "a"}, {"name": "b"}], [("a", "b")]).edge_bytes.tolist() == [0.0]


# ---------------------------------------------------------------- plans


@pytest.mark.parametrize("make, match", [
    (lambda: Placement([0.7, 1.2, 0]), r"device_of_node entry #0: 0.7 is not an integer"),
    (lambda: Placement([[0, 1, 0]]), r"device_of_node must be a flat list .* got shape \[1, 3\]"),
    (lambda: Placement(None), r"device_of_node must be a list of integer device index values, got None"),
    (lambda: StagePlan(stage_of_node=[0.5] * 3, stage_devices=((0,),)), r"stage_of_node entry #0: 0.5 is not"),
    (lambda: StagePlan(stage_of_node=[0] * 3, stage_devices=((0.5,),)), r"stage_devices\[0\] entry #0: 0.5 is not"),
])
def test_plans_refuse_fractional_indices(make, match):
    with pytest.raises(PlanError, match=match) as exc:
        make()
    one_line(exc)


def test_plans_keep_integral_indices():
    assert Placement(np.array([1.0, 0.0])).device_of_node.tolist() == [1, 0]
    assert Placement([]).device_of_node.shape == (0,)
    plan = StagePlan(stage_of_node=np.array([0, 0, 1], dtype=np.int32), stage_devices=([0, 1.0], np.array([2])))
    assert plan.stage_devices == ((0, 1), (2,))


def test_placement_json_is_strict_and_takes_numpy_values(problem):
    g, topo, _ = problem
    text = Placement([0, 1, 1], meta={"x": np.float32(1.5), "n": np.int64(3), "arr": np.arange(2)}).to_json()
    assert json.loads(text)["meta"] == {"x": 1.5, "n": 3, "arr": [0, 1]}
    # JSON has no NaN / infinity: written as null (an infeasible stage plan's meta holds an infinite best time)
    text = Placement([0, 1, 1], meta={"ok": 1, "bad": float("nan"), "inf": [np.float64("inf"), 2.0]}).to_json(
        graph=g, topology=topo)
    assert json.loads(text)["meta"] == {"ok": 1, "bad": None, "inf": [None, 2.0]}
    plan = StagePlan(stage_of_node=[0, 0, 0], stage_devices=((0,),), meta={"ideal_best_steady": float("inf")})
    assert json.loads(plan.to_json())["meta"]["ideal_best_steady"] is None
    with pytest.raises(PlanError, match="placement has no entries") as exc:
        Placement([]).to_json()
    one_line(exc)
    with pytest.raises(PlanError, match=r"stage plan meta\['s'\] cannot be written as JSON"):
        StagePlan(stage_of_node=[0, 0, 0], stage_devices=((0,),), meta={"s": {1, 2}}).to_json()


# ---------------------------------------------------------------- pickling


def test_unpickled_values_stay_read_only(problem):
    g, topo, costs = problem
    values = [g, costs, Placement([0, 1, 1]), StagePlan(stage_of_node=[0, 0, 1], stage_devices=((0,), (1,)))]
    for value in values:
        for back in (pickle.loads(pickle.dumps(value)), copy.deepcopy(value)):
            arrays = [v for v in vars(back).values() if isinstance(v, np.ndarray)]
            assert arrays and not any(a.flags.writeable for a in arrays), type(value).__name__
    back = pickle.loads(pickle.dumps(g))
    with pytest.raises(ValueError):
        back.edges[0, 0] = 2
    assert back.fingerprint() == g.fingerprint()
