"""``placement-rl maxload`` input and output: any integer ``colorClass`` is a class (negative ones too; only a
missing key means none) for the reader, the blocks, the evaluator, a partial split and the latency program, checked
against a brute force of its own; the latency objective reports the max-load dynamic program's progress; the written
file's keys; the loads summary of devices all at one load; type errors show a string as a string; ``--seconds``
must be finite."""

from __future__ import annotations

import itertools
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest

from placement_rl.baselines.maxload import enumerate_splits, evaluate
from placement_rl.baselines.maxload_instances import node_entry, random_instance
from placement_rl.baselines.maxload_solve import solve
from placement_rl.errors import GraphError
from placement_rl.graph.maxload_file import read_instance, read_split


def _write(tmp_path, data, name="inst.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _tiny(seed: int) -> dict:
    """4-6 forward nodes on a random DAG, colour classes drawn from negative and positive integers (some nodes
    without one), 2 accelerators of tight memory and 1 CPU core."""
    r = random.Random(seed)
    n = r.randint(4, 6)
    labels = [-1, -5, -(2**40), 0, 3, None]
    nodes = []
    for i in range(n):
        c = r.choice(labels)
        nodes.append(node_entry(20 + i, round(r.uniform(0.5, 4), 2), round(r.uniform(2, 9), 2), size=r.randint(1, 4),
                                colour=c, supported=int(r.random() > 0.1)))
    edges, cost = [], {}
    for v in range(1, n):
        for u in r.sample(range(v), k=min(v, r.randint(0, 2))):
            edges.append({"sourceId": 20 + u, "destId": 20 + v,
                          "cost": cost.setdefault(u, round(r.uniform(0.1, 1.5), 2))})
    total = sum(x["size"] for x in nodes)
    return {"maxSizePerFPGA": max(4, int(total * 0.6)), "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes, "edges": edges}


def _brute(data: dict) -> float:
    """The least max-load over every assignment of nodes to devices (accelerators first) that keeps the file's
    colour classes (the raw ``colorClass`` values), memory and supported nodes: computed from the JSON alone."""
    nodes, na = data["nodes"], data["maxFPGAs"]
    nd = na + data["maxCPUs"]
    pos = {x["id"]: k for k, x in enumerate(nodes)}
    consumers: dict[int, set[int]] = {}
    cost = {}
    for e in data["edges"]:
        consumers.setdefault(pos[e["sourceId"]], set()).add(pos[e["destId"]])
        cost[pos[e["sourceId"]]] = e["cost"]
    best = np.inf
    for assign in itertools.product(range(nd), repeat=len(nodes)):
        by_class: dict[int, int] = {}
        if any(by_class.setdefault(x["colorClass"], d) != d for x, d in zip(nodes, assign) if "colorClass" in x):
            continue
        if any(d < na and not x["supportedOnFpga"] for x, d in zip(nodes, assign)):
            continue
        loads = [0.0] * nd
        for d in range(na):
            if sum(x["size"] for x, e in zip(nodes, assign) if e == d) > data["maxSizePerFPGA"]:
                break
        else:
            for k, (x, d) in enumerate(zip(nodes, assign)):
                loads[d] += x["fpgaLatency"] if d < na else x["cpuLatency"]
            for u, vs in consumers.items():
                for d in range(na):  # an output crossing an accelerator's boundary, sent or received, once
                    inside = [assign[v] == d for v in vs]
                    if (assign[u] == d and not all(inside)) or (assign[u] != d and any(inside)):
                        loads[d] += cost[u]
            best = min(best, max(loads))
    return best


def _keeps_classes(data: dict, device: np.ndarray) -> bool:
    seen: dict[int, int] = {}
    return all(seen.setdefault(x["colorClass"], int(d)) == int(d) for x, d in zip(data["nodes"], device)
               if "colorClass" in x)


@pytest.mark.parametrize("seed", range(8))
def test_negative_colour_classes_against_brute_force(tmp_path, seed):
    """On tiny instances whose colour classes are negative and positive integers, the best split of any shape found
    by enumeration over blocks and by the search equals a brute force over the raw file's classes, the bound is at
    most it, and no split breaks a class."""
    data = _tiny(seed)
    inst = read_instance(_write(tmp_path, data))
    want = _brute(data)
    if not np.isfinite(want):
        with pytest.raises(GraphError):
            solve(inst, seconds=1)
        return
    assert enumerate_splits(inst)[1] == pytest.approx(want, rel=1e-9)
    res = solve(inst, seconds=1)
    assert res.lower_bound <= want * (1 + 1e-9)
    assert res.best.max_load >= want * (1 - 1e-9)
    assert not res.optimal or res.best.max_load == pytest.approx(want, rel=1e-6)
    for split in (res.best, res.contiguous):
        if split is not None:
            assert _keeps_classes(data, split.device) and not evaluate(inst, split.device)[1]


def test_a_negative_class_shared_by_three_nodes_stays_together(tmp_path, capsys):
    """Nodes 1-3 in class -5 and node 4 without one on 2 accelerators: 15 (1, 2, 3 together), as with class 5."""
    from placement_rl.cli.maxload import main

    for label in (-5, 5):
        data = {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 0, "edges": [],
                "nodes": [node_entry(k, 5, 5, colour=label if k < 4 else None) for k in range(1, 5)]}
        out = tmp_path / f"split{label}.json"
        main([str(_write(tmp_path, data)), "--seconds", "0.2", "--out", str(out)])
        assert "blocks: 2 for contiguous splits" in capsys.readouterr().out
        written = json.loads(out.read_text())
        assert written["maxLoad"] == 15 and sorted(g["nodes"] for g in written["fpgas"]) == [[1, 2, 3], [4]]


def test_negative_classes_in_the_reader_evaluator_and_partial_split(tmp_path):
    """-1 is a class like any other (not "none"); a split that separates it is named by node ids; a node a split
    leaves out joins its (negative) class's device; a null colorClass is one line."""
    data = {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "edges": [],
            "nodes": [node_entry(1, 1, 1, colour=-1), node_entry(2, 1, 1), node_entry(3, 1, 1, colour=-1),
                      node_entry(4, 1, 1), node_entry(5, 1, 1, colour=-(2**40))]}
    inst = read_instance(_write(tmp_path, data))
    assert inst.colour[0] == inst.colour[2] and len(set(inst.colour.tolist())) == 4
    _, broken = evaluate(inst, np.array([0, 0, 1, 1, 2]))
    assert broken == ["a colour class is split over devices: node 1 on accelerator 0, node 3 on accelerator 1"]
    split = _write(tmp_path, {"fpgas": [{"nodes": [1, 2]}], "cpus": [{"nodes": [4, 5]}]}, "s.json")
    assert read_split(split, inst).tolist() == [0, 0, 0, 2, 2]  # node 3 joins node 1
    data["nodes"][1]["colorClass"] = None
    with pytest.raises(GraphError, match=r"nodes\[1\]\.colorClass must be an integer \(got null\)"):
        read_instance(_write(tmp_path, data, "null.json"))


def test_latency_keeps_a_negative_class_together(tmp_path):
    """Two independent nodes in class -3, two accelerators: apart they would take 5, together 10."""
    from placement_rl.baselines.maxload_latency import solve_latency

    data = {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "edges": [],
            "nodes": [node_entry(1, 5, 100, colour=-3), node_entry(2, 5, 100, colour=-3)]}
    res = solve_latency(read_instance(_write(tmp_path, data)), seconds=1)
    assert res.latency == pytest.approx(10) and res.device[0] == res.device[1]


def test_latency_objective_reports_the_dynamic_programs_progress(tmp_path, capsys, monkeypatch):
    """``--objective latency`` passes a progress callback to the max-load dynamic program (its lines go to
    stderr, as under the max-load objective)."""
    from placement_rl.baselines import maxload_latency
    from placement_rl.cli.maxload import main

    real = maxload_latency.contiguous_dp

    def reporting(inst, blocks, **kw):
        assert kw.get("progress") is not None
        kw["progress"]("dynamic program: 1/2 ideals, 3 pairs, 10 s")
        return real(inst, blocks, **kw)

    monkeypatch.setattr(maxload_latency, "contiguous_dp", reporting)
    main([str(_write(tmp_path, random_instance(8, n=6))), "--objective", "latency", "--seconds", "0"])
    assert "dynamic program: 1/2 ideals, 3 pairs, 10 s" in capsys.readouterr().err


def test_written_files_keys_notes_and_seconds(tmp_path, capsys):
    """The max-load file has the same keys whatever found the split, ``notes`` every note printed, ``seconds``
    the whole run (no less than the method's own, kept under ``figures``); the latency file has notes and seconds."""
    from placement_rl.cli.maxload import main

    path = _write(tmp_path, random_instance(3, n=6, acc=1000, cpus=50))
    out = tmp_path / "split.json"
    main([str(path), "--seconds", "0.5", "--out", str(out)])
    printed = [x[len("note: "):] for x in capsys.readouterr().out.splitlines() if x.startswith("note: ")]
    data = json.loads(out.read_text())
    assert set(data) == {"maxLoad", "fpgas", "cpus", "method", "contiguous_optimum", "lower_bound", "optimal",
                         "instance", "notes", "seconds", "figures"}
    assert printed and data["notes"] == printed and any("searched on" in n for n in data["notes"])
    assert data["seconds"] >= data["figures"]["seconds"] > 0
    main([str(path), "--seconds", "0", "--out", str(out), "--contiguous"])
    contiguous = json.loads(out.read_text())
    assert set(contiguous) == set(data) and {"ideals", "ideal_pairs"} <= set(contiguous["figures"])
    main([str(path), "--split", str(out), "--out", str(tmp_path / "again.json")])
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["breaks"] == [] and again["notes"] == [] and again["seconds"] > 0
    lat = tmp_path / "lat.json"
    main([str(path), "--objective", "latency", "--seconds", "0", "--out", str(lat)])
    latency = json.loads(lat.read_text())
    assert {"notes", "seconds", "method", "lower_bound", "optimal"} <= set(latency)
    assert any("--seconds 0" in n for n in latency["notes"])


def test_loads_summary_of_devices_all_at_one_load():
    from placement_rl.cli.maxload import _loads_line

    inst = SimpleNamespace(accelerators=1000, cpus=50)
    loads = np.zeros(1050)
    loads[:3] = [1, 2, 3]
    assert _loads_line(inst, loads) == "1000 accelerators: 997 at 0, the others [1, 2, 3], 50 CPU cores: all at 0"
    loads[1000:] = 2.5
    assert _loads_line(inst, loads).endswith("50 CPU cores: all at 2.5")
    loads[1000:] = np.arange(1, 51)
    assert _loads_line(inst, loads).endswith("50 CPU cores: from 1 to 50")


@pytest.mark.parametrize(("where", "value", "words"), [
    ("id", "1", r"nodes\[0\]\.id must be an integer \(got '1', a string\)"),
    ("fpgaLatency", "1.0", r"nodes\[0\]\.fpgaLatency must be a finite number >= 0 \(got '1.0', a string\)"),
    ("colorClass", "7", r"nodes\[0\]\.colorClass must be an integer \(got '7', a string\)"),
])
def test_type_errors_show_a_string_as_a_string(tmp_path, where, value, words):
    data = random_instance(1, n=3)
    data["nodes"][0][where] = value
    with pytest.raises(GraphError, match=words):
        read_instance(_write(tmp_path, data))
    data = random_instance(1, n=3)
    data["edges"][0]["cost"] = "1.0"
    with pytest.raises(GraphError, match=r"edges\[0\]\.cost must be a finite number >= 0 \(got '1\.0', a string\)"):
        read_instance(_write(tmp_path, data, "cost.json"))


@pytest.mark.parametrize("seconds", ["inf", "nan", "1e30", "-1"])
def test_seconds_must_be_finite(tmp_path, capsys, seconds):
    from placement_rl.cli.maxload import main

    with pytest.raises(SystemExit) as exc:
        main([str(_write(tmp_path, random_instance(1, n=3))), "--seconds", seconds])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--seconds must be a finite number from 0" in err and len(err.splitlines()) == 1
