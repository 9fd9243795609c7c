"""Property-based fuzzing of every file reader: graph JSON, topology YAML, placement / plan JSON, ProfileDB and
checkpoints. Random truncations, wrong types, missing fields and swapped values give the reader's own error (or a
valid object), never another exception; random DAGs with an added back edge name a real cycle; through the CLI
such a file is one line and exit code 2, with no output written."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from placement_rl.errors import CheckpointError, GraphError, PlanError, ProfileError, TopologyError  # noqa: E402
from placement_rl.graph import CompGraph, make_graph  # noqa: E402
from placement_rl.plans import Placement, StagePlan, load_plan  # noqa: E402
from placement_rl.topology import DeviceTopology, conf_dir, load_topology  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WRONG = [None, True, False, -1, 0, 2.5, -1e300, float("nan"), float("inf"), "x", "", [], [1, "a"], {}, {"k": 1}]


# --------------------------------------------------------------------------------------------- helpers
def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys / indices) into a nested JSON-like document."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _at(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


@st.composite
def mutated(draw, base: Any) -> Any:
    """``base`` with one to three random edits: a field deleted, a value replaced by a wrong type, or two sibling
    values swapped."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _at(doc, path[:-1]), path[-1]
        action = draw(st.sampled_from(["delete", "replace", "swap"]))
        if action == "delete":
            del parent[key]
        elif action == "replace":
            parent[key] = copy.deepcopy(draw(st.sampled_from(WRONG)))
        else:
            keys = list(parent.keys()) if isinstance(parent, dict) else list(range(len(parent)))
            other = draw(st.sampled_from(keys))
            parent[key], parent[other] = parent[other], parent[key]
    return doc


@st.composite
def truncated(draw, text: str) -> str:
    return text[: draw(st.integers(0, max(len(text) - 1, 0)))]


def _expect(call: Callable[[], Any], error: type[Exception]) -> Any:
    """Run a reader: a valid result or ``error`` (one line, says something); anything else fails the test."""
    try:
        return call()
    except error as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return None


def _graph() -> CompGraph:
    nodes = [{"name": n, "fwd_flops": 1e9 * (i + 1), "bwd_flops": 2e9, "param_bytes": 4e6, "act_bytes": 1e6,
              "out_bytes": 1e6} for i, n in enumerate("abcd")]
    return make_graph(nodes, [[0, 1, 1e6], [0, 2, 1e6], [1, 3, 1e6], [2, 3, 1e6]], name="diamond")


GRAPH = _graph()
TOPOLOGY = load_topology("2x_cpu")


# ----------------------------------------------------------------------------------------------- graph
@st.composite
def dag_with_back_edge(draw):
    n = draw(st.integers(2, 12))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = sorted(set(draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=3 * n))))
    succ: dict[int, set[int]] = {i: set() for i in range(n)}
    for s, d in edges:
        succ[s].add(d)
    reach = []  # (i, j) with j reachable from i
    for i in range(n):
        seen, todo = set(), [i]
        while todo:
            for v in succ[todo.pop()]:
                if v not in seen:
                    seen.add(v)
                    todo.append(v)
        reach += [(i, j) for j in seen]
    i, j = draw(st.sampled_from(reach))
    order = draw(st.permutations(range(n)))  # node order unrelated to the topological order
    rename = {old: new for new, old in enumerate(order)}
    all_edges = [(rename[s], rename[d]) for s, d in edges] + [(rename[j], rename[i])]
    return n, all_edges


@FUZZ
@given(dag_with_back_edge())
def test_a_dag_with_a_back_edge_names_a_real_cycle(case):
    n, edges = case
    doc = _graph_doc(n, edges)
    with pytest.raises(GraphError) as info:
        CompGraph.from_json(json.dumps(doc))
    m = re.match(r"graph has a cycle: (.*); remove one of its edges$", str(info.value))
    assert m, str(info.value)
    names = re.findall(r"'(n\d+)'", m.group(1))
    assert len(names) >= 3 and names[0] == names[-1]
    index = [int(x[1:]) for x in names]
    assert all((a, b) in set(edges) for a, b in zip(index, index[1:]))


def _graph_doc(n: int, edges: list[tuple[int, int]]) -> dict:
    base = json.loads(GRAPH.to_json())
    node = dict(base["nodes"][0])
    nodes = [dict(node, name=f"n{k}") for k in range(n)]
    return dict(base, nodes=nodes, edges=[[s, d, 8] for s, d in edges])


GRAPH_DOC = json.loads(GRAPH.to_json())


@FUZZ
@given(mutated(GRAPH_DOC))
def test_graph_json_mutations_give_graph_error(doc):
    text = json.dumps(doc)
    g = _expect(lambda: CompGraph.from_json(text), GraphError)
    if g is not None:
        g.validate()
        assert np.all(np.isfinite(g.fwd_flops)) and g.num_nodes == len(doc["nodes"])


def _annotated_graph_doc() -> dict:
    """``GRAPH`` coarsened by hand (members) with the meta fields planners read: batch size, zoo options, TP."""
    doc = json.loads(GRAPH.to_json())
    for nd in doc["nodes"]:
        nd["members"] = [nd["name"], nd["name"] + "_act"]
    doc["meta"] = {"batch_size": 8, "zoo_options": {"batch_size": 8, "n_heads": 2},
                   "tp": {"version": 1, "nodes": {"b": "column", "b_act": "sharded", "d": "row"},
                          "ar_fwd": {"d": 4096.0}, "ar_bwd": {"b": 4096.0},
                          "pairs": [{"columns": ["b"], "row": "d", "sharded_ops": 1, "head_dim": None}],
                          "divisors": [2, 64], "heads": {"n_heads": 2}, "vocab": None, "note": ""}}
    return doc


ANNOTATED_DOC = _annotated_graph_doc()


@FUZZ
@given(mutated(ANNOTATED_DOC))
def test_graph_meta_and_members_mutations_give_graph_error(doc):
    """Whatever the reader accepts, the planners can read: a batch size or none, a TP annotation, members that
    partition the original ops."""
    from placement_rl.graph import tp
    from placement_rl.plans import graph_batch_size

    text = json.dumps(doc)
    g = _expect(lambda: CompGraph.from_json(text), GraphError)
    if g is not None:
        batch = graph_batch_size(g)
        assert batch is None or (isinstance(batch, int) and batch >= 1)
        ann = tp.annotation(g)
        assert ann.kind.shape == (g.num_nodes,) and all(isinstance(d, int) and d >= 1 for d in ann.divisors)
        if g.members is not None:
            flat = [m for grp in g.members for m in grp]
            assert all(g.members) and len(flat) == len(set(flat))


@FUZZ
@given(truncated(GRAPH.to_json()))
def test_graph_json_truncations_give_graph_error(text):
    if not text.lstrip().startswith("{"):
        text = "{" + text  # a string that does not look like JSON is read as a path
    with pytest.raises(GraphError):
        CompGraph.from_json(text)


# -------------------------------------------------------------------------------------------- topology
TOPOLOGY_DOC = yaml.safe_load((conf_dir() / "topology" / "2x4_v100_ib.yaml").read_text())


def _read_topology(text: str) -> DeviceTopology | None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.yaml"
        path.write_text(text)
        return _expect(lambda: DeviceTopology.from_yaml(path), TopologyError)


@FUZZ
@given(mutated(TOPOLOGY_DOC))
def test_topology_yaml_mutations_give_topology_error(doc):
    topo = _read_topology(yaml.safe_dump(doc))
    if topo is not None:
        assert topo.num_devices >= 1
        assert all(d.peak_flops > 0 and d.memory_bytes > 0 for d in topo.devices)
        assert np.all(topo.link_bandwidth > 0) and np.all(topo.link_latency >= 0)


@FUZZ
@given(truncated(yaml.safe_dump(TOPOLOGY_DOC)))
def test_topology_yaml_truncations_give_topology_error(text):
    _read_topology(text)


# -------------------------------------------------------------------------------------------- plans
PLACEMENT_DOC = json.loads(Placement([0, 1, 0, 1]).to_json(graph=GRAPH, topology=TOPOLOGY))
STAGE_DOC = json.loads(StagePlan(stage_of_node=[0, 0, 1, 1], stage_devices=[[0], [1]], num_microbatches=2,
                                 schedule="1f1b").to_json(graph=GRAPH, topology=TOPOLOGY))


def _read_plan(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(text)

        def read():
            plan = load_plan(path, topology=TOPOLOGY, graph=GRAPH)
            plan.validate(GRAPH, TOPOLOGY)
            return plan

        return _expect(read, PlanError)


@FUZZ
@given(st.one_of(mutated(PLACEMENT_DOC), mutated(STAGE_DOC)))
def test_plan_json_mutations_give_plan_error(doc):
    _read_plan(json.dumps(doc))


@FUZZ
@given(st.one_of(truncated(json.dumps(PLACEMENT_DOC)), truncated(json.dumps(STAGE_DOC))))
def test_plan_json_truncations_give_plan_error(text):
    assert _read_plan(text) is None


# ------------------------------------------------------------------------------------------ ProfileDB
def _profile_doc() -> dict:
    from placement_rl.profiling import ProfileDB

    db = ProfileDB()
    db.add_device("cpu0", TOPOLOGY.devices[0])
    for n in GRAPH.names:
        db.put_node(GRAPH, "cpu0", n, [1e-3, 1.1e-3, 0.9e-3], [2e-3, 2e-3], signature=f"op:{n}")
    db.put_step(GRAPH, "cpu0", [5e-3, 5.5e-3])
    db.put_optimizer(GRAPH, "cpu0", [1e-4], 16e6)
    db.put_link("cpu0", "cpu1", "gloo", [1e3, 1e6], [1e-5, 1e-4], 1e-5, 1e10)
    return json.loads(json.dumps(db.data))


PROFILE_DOC = _profile_doc()


def _read_profile(text: str):
    from placement_rl.cost import resolve_costs
    from placement_rl.profiling import ProfileDB

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.json"
        path.write_text(text)

        def read():
            db = ProfileDB.load(path, device_map={d.name: "cpu0" for d in TOPOLOGY.devices})
            costs = resolve_costs(GRAPH, TOPOLOGY, profiles=[db])  # the reader's data in use
            assert np.all(np.isfinite(costs.fwd_time)) and np.all(costs.fwd_time >= 0)
            return db

        return _expect(read, ProfileError)


@FUZZ
@given(mutated(PROFILE_DOC))
def test_profile_mutations_give_profile_error(doc):
    _read_profile(json.dumps(doc))


@FUZZ
@given(truncated(json.dumps(PROFILE_DOC)))
def test_profile_truncations_give_profile_error(text):
    assert _read_profile(text) is None


# ---------------------------------------------------------------------------------------- checkpoints
def _checkpoint_doc() -> dict:
    from placement_rl.agents.checkpoint import FORMAT, FORMAT_VERSION

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "algo": "reinforce",
            "config": {"env_id": "placement_rl/PlacementEnv-v0", "encoder": {"name": "sage", "hidden": 8, "layers": 1}},
            "obs": {"max_nodes": 8, "max_edges": 16, "max_devices": 2, "op_type_buckets": 4, "num_features": 10},
            "num_timesteps": 10, "policy": {"w": torch.ones(2, 2)}, "optimizer": {}}


def _mutable(doc: dict) -> dict:
    """Tensors hidden from the mutation strategy's walk (kept as leaves)."""
    return {k: (v if not isinstance(v, dict) or k != "policy" else {"w": "<tensor>"}) for k, v in doc.items()}


CHECKPOINT_DOC = _checkpoint_doc()


def _read_checkpoint(payload: bytes | dict):
    from placement_rl.agents.checkpoint import load_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.pt"
        if isinstance(payload, bytes):
            path.write_bytes(payload)
        else:
            torch.save(payload, path)
        data = _expect(lambda: load_checkpoint(path), CheckpointError)
        if data is not None:  # what place / train read from a loaded checkpoint is there
            assert isinstance(data["config"]["env_id"], str) and isinstance(data["config"]["encoder"], dict)
            assert all(isinstance(data["obs"][k], int) for k in ("max_devices", "op_type_buckets"))
            assert all(isinstance(t, torch.Tensor) for t in data["policy"].values())
        return data


@FUZZ
@given(mutated(_mutable(CHECKPOINT_DOC)))
def test_checkpoint_mutations_give_checkpoint_error(doc):
    if isinstance(doc.get("policy"), dict):
        doc["policy"] = {k: (torch.ones(2, 2) if v == "<tensor>" else v) for k, v in doc["policy"].items()}
    _read_checkpoint(doc)


def _checkpoint_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.pt"
        torch.save(CHECKPOINT_DOC, path)
        return path.read_bytes()


CHECKPOINT_BYTES = _checkpoint_bytes()


@FUZZ
@given(st.integers(0, len(CHECKPOINT_BYTES) - 1), st.binary(max_size=64))
def test_checkpoint_truncations_and_garbage_give_checkpoint_error(cut, junk):
    assert _read_checkpoint(CHECKPOINT_BYTES[:cut]) is None
    assert _read_checkpoint(junk) is None


def test_a_valid_checkpoint_reads():
    assert _read_checkpoint(CHECKPOINT_DOC)["algo"] == "reinforce"


# ------------------------------------------------------------------------------------------------ CLI
def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=root)
    return subprocess.run([sys.executable, "-m", "placement_rl.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.slow
def test_bad_files_through_the_cli_are_one_line_exit_2_and_write_nothing(tmp_path):
    cyclic = json.loads(GRAPH.to_json())
    cyclic["edges"].append([3, 1, 8])  # d -> b closes b -> d -> b; node 'a' upstream, 'c' beside
    (tmp_path / "cyclic.json").write_text(json.dumps(cyclic))
    (tmp_path / "graph.json").write_text(GRAPH.to_json())
    (tmp_path / "cut.json").write_text(GRAPH.to_json()[:50])
    bad_plan = dict(PLACEMENT_DOC, device_of_node=[0, 1, "x", 1])
    (tmp_path / "plan.json").write_text(json.dumps(bad_plan))
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(dict(TOPOLOGY_DOC, devices="none")))
    cases = [
        (["inspect", "graph.path=cyclic.json"], "graph has a cycle: 'b' -> 'd' -> 'b'"),
        (["inspect", "graph.path=cut.json"], "malformed JSON"),
        (["evaluate", "graph.path=graph.json", "topology=2x_cpu", "plan=plan.json"], "device_of_node"),
        (["evaluate", "graph.path=graph.json", "topology.path=topo.yaml"], "topo.yaml"),
        (["place", "checkpoint=cut.json", "graph.path=graph.json", "topology=2x_cpu"], "checkpoint"),
    ]
    _assert_one_line_errors(tmp_path, cases)


def _assert_one_line_errors(tmp_path, cases) -> None:
    """Each ``(args, words)`` CLI run exits 2 with one ``error:`` line holding ``words``; no run folder is left."""
    for args, words in cases:
        r = _cli(tmp_path, *args)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and words in r.stderr, (args, r.stderr)
    assert not (tmp_path / "outputs").exists()


def test_mismatched_inputs_through_the_cli_are_one_line_exit_2(tmp_path):
    """A plan made for another graph with as many nodes, a topology field with a typo and a graph's unusable batch
    size: each is named on one line (exit 2), never scored or ignored."""
    other = GRAPH.replace(fwd_flops=GRAPH.fwd_flops * 3)
    (tmp_path / "graph.json").write_text(GRAPH.to_json())
    Placement([0, 1, 0, 1]).to_json(tmp_path / "placement.json", graph=other, topology=TOPOLOGY)
    bad_batch = json.loads(GRAPH.to_json())
    bad_batch["meta"]["batch_size"] = "two"
    (tmp_path / "batch.json").write_text(json.dumps(bad_batch))
    typo = copy.deepcopy(TOPOLOGY_DOC)
    typo["devices"][0]["modle"] = typo["devices"][0].pop("model")
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(typo))
    cases = [
        (["evaluate", "graph.path=graph.json", "topology=2x_cpu", "plan=placement.json"],
         f"placement was made for graph 'diamond' (fingerprint {other.fingerprint()}"),
        (["inspect", "graph.path=batch.json"], "field 'meta.batch_size' must be a positive integer"),
        (["evaluate", "graph.path=graph.json", "topology.path=topo.yaml"], "unknown field 'modle'"),
    ]
    _assert_one_line_errors(tmp_path, cases)


def test_checkpoint_file_gets_the_umask_permissions(tmp_path):
    """checkpoint.pt is written through a temporary file like every artifact: it must not stay private (0600)."""
    import os
    import stat

    import torch

    from placement_rl.agents.checkpoint import save_checkpoint

    old = os.umask(0o022)
    try:
        p = save_checkpoint(tmp_path / "checkpoint.pt", algo="x", config={}, obs={}, num_timesteps=0,
                            policy={"w": torch.zeros(1)}, optimizer=None)
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
