"""Max-load splits of instances in the dnn-partitioning format (``placement_rl.baselines.maxload``): the reader's
one-line errors, loads computed by hand, the dynamic program equal to the best contiguous split by enumeration and
CP-SAT to the best split of any shape, and the ``maxload`` command."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from placement_rl.baselines import maxload_cp
from placement_rl.baselines.maxload import enumerate_splits, evaluate, lower_bound
from placement_rl.baselines.maxload_blocks import blocks_of
from placement_rl.baselines.maxload_dp import contiguous_dp
from placement_rl.baselines.maxload_instances import node_entry, random_instance
from placement_rl.baselines.maxload_solve import solve
from placement_rl.errors import GraphError
from placement_rl.graph.maxload_file import read_instance, read_split


def _write(tmp_path, data, name="inst.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_loads_by_hand(tmp_path):
    """a -> b, a -> c, b -> c on accelerators 0 / 0 / 1: accelerator 0 runs a and b and sends both outputs (a's
    once, though two edges leave it); accelerator 1 runs c and receives both; a CPU core pays no transfer."""
    data = {"maxSizePerFPGA": 100, "maxFPGAs": 2, "maxCPUs": 1,
            "nodes": [node_entry(1, 1.0, 10.0, size=40), node_entry(2, 2.0, 20.0, size=40),
                      node_entry(3, 4.0, 40.0, size=40)],
            "edges": [{"sourceId": 1, "destId": 2, "cost": 0.5}, {"sourceId": 1, "destId": 3, "cost": 0.5},
                      {"sourceId": 2, "destId": 3, "cost": 0.25}]}
    inst = read_instance(_write(tmp_path, data))
    loads, broken = evaluate(inst, np.array([0, 0, 1]))
    assert loads.tolist() == pytest.approx([1 + 2 + 0.5 + 0.25, 4 + 0.5 + 0.25, 0.0]) and broken == []
    loads, broken = evaluate(inst, np.array([2, 0, 0]))  # a on the CPU core: only accelerator 0 pays for its output
    assert loads.tolist() == pytest.approx([2 + 4 + 0.5, 0.0, 10.0]) and broken == []
    _, broken = evaluate(inst, np.array([0, 0, 0]))
    assert broken == ["accelerator 0 holds 120 bytes, over maxSizePerFPGA 100"]


@pytest.mark.parametrize("seed", range(12))
def test_dp_and_cp_sat_match_enumeration(tmp_path, seed):
    """On random 6-7-node instances (plain, with backward nodes, with a colour class, tight memory, nodes an
    accelerator cannot run) the dynamic program finds the best contiguous split and CP-SAT the best split of any
    shape, proving it; the lower bound is below both."""
    kw = dict(backward=seed % 3 == 1, colour=seed % 3 == 2, max_size=12 if seed % 2 else 1e9,
              unsupported=0.15 if seed % 4 == 3 else 0.0, n=6 if seed % 3 == 1 else 7)
    inst = read_instance(_write(tmp_path, random_instance(seed, **kw)))
    best_contiguous, best_any = enumerate_splits(inst)
    dp = contiguous_dp(inst, blocks_of(inst))
    assert dp.contiguous_optimum and dp.max_load == pytest.approx(best_contiguous, rel=1e-9)
    assert lower_bound(inst) <= best_any * (1 + 1e-9)
    if not maxload_cp.available():
        pytest.skip("OR-Tools is not installed")
    res = solve(inst, seconds=5)
    assert res.best.max_load == pytest.approx(best_any, rel=1e-9) and res.optimal
    assert res.lower_bound <= best_any * (1 + 1e-9) and res.lower_bound >= best_any * (1 - 1e-4)


def test_local_search_keeps_every_rule_and_finds_the_best_split_of_small_instances(tmp_path):
    """The local search (no CP-SAT) from the best contiguous split never breaks memory, colour classes or an
    accelerator's unsupported nodes, never ends worse than its start, reports the loads ``evaluate`` gives, and on
    random 7-node instances finds the best split of any shape (by enumeration) on most."""
    from placement_rl.baselines.maxload import improve

    hits, cases = 0, 0
    for seed in range(16):
        kw = dict(backward=seed % 3 == 1, colour=seed % 3 == 2, max_size=12 if seed % 2 else 1e9,
                  unsupported=0.15 if seed % 4 == 3 else 0.0, n=6 if seed % 3 == 1 else 7)
        inst = read_instance(_write(tmp_path, random_instance(100 + seed, acc=3, **kw)))
        try:
            dp = contiguous_dp(inst, blocks_of(inst))
        except GraphError:
            continue
        _, best_any = enumerate_splits(inst)
        got = improve(inst, blocks_of(inst, contiguous=False), dp, seconds=2.0)
        loads, broken = evaluate(inst, got.device)
        assert broken == [] and got.max_load <= dp.max_load * (1 + 1e-12), seed
        assert got.max_load == pytest.approx(loads.max(), rel=1e-12) and got.stats["stalled"] == 1.0
        cases += 1
        hits += got.max_load <= best_any * (1 + 1e-9)
    assert cases >= 12 and hits >= cases - 2, (hits, cases)


def test_blocks_merge_a_colour_cycle_and_place_backward_only_classes(tmp_path):
    """Colour class 7 holds a and c of a -> b -> c: b must sit with them (a contiguous split cannot put it
    elsewhere), so the three form one block; a backward node with no forward node of its class gets its own block,
    ordered by its gradient edges."""
    data = {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 0,
            "nodes": [node_entry(1, 1, 1, colour=7), node_entry(2, 1, 1), node_entry(3, 1, 1, colour=7),
                      node_entry(4, 1, 1),
                      node_entry(5, 1, 1, backward=1, colour=9), node_entry(6, 1, 1, backward=1, colour=7)],
            "edges": [{"sourceId": 1, "destId": 2, "cost": 1}, {"sourceId": 2, "destId": 3, "cost": 1},
                      {"sourceId": 3, "destId": 4, "cost": 1}, {"sourceId": 4, "destId": 5, "cost": 1},
                      {"sourceId": 5, "destId": 6, "cost": 1}]}
    inst = read_instance(_write(tmp_path, data))
    blocks = blocks_of(inst)
    b = blocks.block
    assert b[0] == b[1] == b[2] == b[5] and len({b[0], b[3], b[4]}) == 3 and blocks.count == 3
    assert blocks.preds[b[4]] >> b[0] & 1  # node 5's class follows the class its gradient flows to


@pytest.mark.parametrize("seed", range(4))
def test_too_many_ideals_searches_a_smaller_family(tmp_path, seed):
    """Past the limit the dynamic program keeps classes with one neighbour beside it, then (still past it) cuts
    at the prefixes of one topological order; either way it says the split is not proven optimal, and it is no
    better than the optimum."""
    inst = read_instance(_write(tmp_path, random_instance(seed, n=9, acc=3, cpus=0)))
    full = contiguous_dp(inst, blocks_of(inst))
    for limit, words in ((full.stats["ideals"] - 1, "kept beside it"), (3, "prefixes of one topological order")):
        some = contiguous_dp(inst, blocks_of(inst), ideal_limit=int(limit))
        assert full.contiguous_optimum and not some.contiguous_optimum, limit
        assert some.max_load >= full.max_load * (1 - 1e-12) and some.stats["ideals"] <= max(limit, 10)
        if limit == 3:
            assert words in some.notes[0]


def test_no_split_fits_is_one_line(tmp_path):
    data = random_instance(1, n=5, acc=2, cpus=0)
    data["nodes"][2]["supportedOnFpga"] = 0
    with pytest.raises(GraphError, match="no contiguous split fits: some nodes cannot run on an accelerator"):
        contiguous_dp(read_instance(p := _write(tmp_path, data)), blocks_of(read_instance(p)))


def _edit(data, change):
    data = json.loads(json.dumps(data))
    change(data)
    return data


BAD = [
    (lambda d: d.pop("maxFPGAs"), "the instance has no 'maxFPGAs'"),
    (lambda d: d.update(maxFPGAs=0, maxCPUs=0), "no device to place on"),
    (lambda d: d.update(maxFPGAs=1.5), "maxFPGAs must be a whole number"),
    (lambda d: d["nodes"][1].update(fpgaLatency=-1), r"nodes\[1\].fpgaLatency must be a finite number >= 0"),
    (lambda d: d["nodes"][1].update(id=10), r"nodes\[1\].id 10 is used by an earlier node"),
    (lambda d: d["nodes"][0].pop("isBackwardNode"), r"nodes\[0\] has no 'isBackwardNode'"),
    (lambda d: d["edges"][0].update(destId=99), r"edges\[0\].destId 99 is not the id of any node"),
    (lambda d: d["edges"].append({"sourceId": 14, "destId": 10, "cost": 0.1}), "cycle"),
    (lambda d: d["edges"].append({"sourceId": 14, "destId": 14, "cost": 0.1}), "self-loop"),
    (lambda d: d["edges"].append({"sourceId": d["edges"][0]["sourceId"], "destId": 14, "cost": 99}),
     "differs from another edge out of node"),
    (lambda d: d["nodes"].append(node_entry(50, 1, 1, backward=1)) or d["edges"].append(
        {"sourceId": 50, "destId": 14, "cost": 0.1}), "from backward node 50 to forward node 14"),
    (lambda d: d.update(nodes=[]), "nodes must be a non-empty list"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m for _, m in BAD])
def test_bad_instances_are_one_line(tmp_path, change, message):
    with pytest.raises(GraphError, match=message) as exc:
        read_instance(_write(tmp_path, _edit(random_instance(0, n=5), change)))
    assert "\n" not in str(exc.value)


def test_split_file_and_forward_only_split(tmp_path):
    """A split names node ids per device; a node it leaves out joins its colour class's device (a forward split
    scores a training graph); a node in two groups or unknown is one line."""
    inst = read_instance(p := _write(tmp_path, random_instance(4, n=4, backward=True)))
    split = _write(tmp_path, {"fpgas": [{"nodes": [10, 11]}, {"nodes": [12]}], "cpus": [{"nodes": [13]}]}, "s.json")
    device = read_split(split, inst)
    assert device.tolist() == [0, 0, 1, 2, 0, 0, 1, 2]
    bad = _write(tmp_path, {"fpgas": [{"nodes": [10, 11]}, {"nodes": [11]}], "cpus": []}, "b.json")
    with pytest.raises(GraphError, match="node 11 is listed twice"):
        read_split(bad, inst)
    assert p.is_file()


def test_command_writes_a_split_it_scores_again(tmp_path, capsys):
    from placement_rl.cli.maxload import main

    path = _write(tmp_path, random_instance(9, n=7, max_size=12))
    out = tmp_path / "split.json"
    main([str(path), "--out", str(out), "--seconds", "2"])
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert "contiguous split (dynamic program over all" in text and f"wrote {out}" in text
    assert set(data) >= {"maxLoad", "fpgas", "cpus", "lower_bound", "optimal"}
    main([str(path), "--split", str(out)])
    assert f"max-load {data['maxLoad']:.6g}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "missing.json")])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("seed", range(3))
def test_classes_with_no_edge(tmp_path, seed):
    """Isolated nodes (a batch-norm counter update) are split with the rest while the ideals stay under the limit
    (the best contiguous split, as enumeration finds it); past it they are placed last on the device they raise
    least, and the split is optimal only where they raise nothing."""
    data = random_instance(seed, n=5)
    data["nodes"] += [node_entry(60 + k, 0.9 + k, 4.0 + k, size=1) for k in range(2)]
    inst = read_instance(_write(tmp_path, data))
    blocks = blocks_of(inst)
    assert blocks.free.sum() == 2
    best_contiguous, _ = enumerate_splits(inst)
    full = contiguous_dp(inst, blocks)
    assert full.contiguous_optimum and full.max_load == pytest.approx(best_contiguous, rel=1e-9)
    after = contiguous_dp(inst, blocks, ideal_limit=full.stats["ideals"] - 1)
    assert after.stats["free_classes"] == 2 and after.max_load >= best_contiguous * (1 - 1e-12)
    assert after.contiguous_optimum == (after.max_load <= after.stats["dp_value"] * (1 + 1e-12))


def test_command_makes_an_instance_from_a_project_graph(tmp_path, capsys):
    """``--topology`` reads one of the project's graph files and makes the instance on it (GPUs the accelerators,
    CPUs the cores, a backward node per node under training costs); each file read as the other is one line."""
    from placement_rl.cli.maxload import main
    from placement_rl.graph.spec import graph_from_spec

    graph = graph_from_spec({"source": "zoo", "name": "mlp", "overrides": {},
                             "coarsen": {"enabled": True, "depth": None, "max_nodes": None}})
    gpath, ipath = tmp_path / "graph.json", tmp_path / "inst.json"
    graph.to_json(gpath)
    main([str(gpath), "--topology", "cpu_2gpu", "--seconds", "0", "--write-instance", str(ipath)])
    assert f"wrote the instance to {ipath}" in capsys.readouterr().out
    inst = read_instance(ipath)
    assert (inst.accelerators, inst.cpus, inst.num_nodes) == (2, 1, 2 * graph.num_nodes)
    n = graph.num_nodes
    assert inst.backward.sum() == n and (inst.colour[:n] == np.arange(n)).all()
    for argv, words in (([str(gpath)], "one of placement_rl's graph files"),
                        ([str(ipath), "--topology", "cpu_2gpu"], "leave --topology out"),
                        ([str(ipath), "--write-instance", str(tmp_path / "x.json")], "needs --topology")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and words in err and err.count("\n") == 1, argv


def test_latency_by_hand(tmp_path):
    """a -> b -> c, a -> c: a on accelerator 0, b on a CPU, c on accelerator 1. Accelerator 0 runs a and sends
    its output once (1 + 0.5); b starts then (1.5 + 4 = 5.5); accelerator 1 starts when a and b are ready and pays
    both inputs (5.5 + 2 + 0.5 + 0.25 = 8.25). With a and c on one accelerator the path leaves it and comes back:
    no latency."""
    from placement_rl.baselines.maxload_latency import latency_of

    data = {"maxSizePerFPGA": 100, "maxFPGAs": 2, "maxCPUs": 1,
            "nodes": [node_entry(1, 1.0, 3.0), node_entry(2, 1.0, 4.0), node_entry(3, 2.0, 9.0)],
            "edges": [{"sourceId": 1, "destId": 2, "cost": 0.5}, {"sourceId": 1, "destId": 3, "cost": 0.5},
                      {"sourceId": 2, "destId": 3, "cost": 0.25}]}
    inst = read_instance(_write(tmp_path, data))
    assert latency_of(inst, np.array([0, 2, 1])) == pytest.approx(8.25)
    assert latency_of(inst, np.array([2, 2, 2])) == pytest.approx(16.0)
    assert latency_of(inst, np.array([0, 2, 0])) == np.inf


def _latency_reference(inst, device):
    """The latency model written plainly (networkx): the quotient graph of accelerators and CPU nodes in
    topological order, each unit ready when its inputs are plus its time."""
    import networkx as nx

    na = inst.accelerators
    device = np.minimum(device, na)
    cost = evaluate(dataclasses.replace(inst, cpus=1), device)[0][:na]
    unit = [("a", int(d)) if d < na else ("c", v) for v, d in enumerate(device.tolist())]
    q = nx.DiGraph()
    q.add_nodes_from(set(unit))
    q.add_edges_from((unit[u], unit[v]) for u, v in inst.edges.tolist() if unit[u] != unit[v])
    if not nx.is_directed_acyclic_graph(q):
        return np.inf
    ready = {}
    for x in nx.topological_sort(q):
        ready[x] = max((ready[p] for p in q.predecessors(x)), default=0.0) + (
            float(cost[x[1]]) if x[0] == "a" else float(inst.cpu[x[1]]))
    return max(ready.values())


def test_latency_kernel_equals_the_plain_model_and_the_search_keeps_the_rules(tmp_path):
    """``latency_of`` (a numba kernel) equals the plainly written model on random splits of random instances, cycles
    included; the latency search's split keeps memory, colour classes and unsupported nodes and has a latency."""
    from placement_rl.baselines.maxload_latency import latency_of, solve_latency

    rng = np.random.default_rng(0)
    cycles = 0
    for seed in range(8):
        inst = read_instance(_write(tmp_path, random_instance(300 + seed, n=12, acc=3, colour=seed % 2 == 1,
                                                              max_size=20 if seed % 2 else 1e9,
                                                              unsupported=0.1 if seed % 4 == 3 else 0.0)))
        for _ in range(40):
            device = rng.integers(0, 4 + seed % 2, inst.num_nodes)
            want = _latency_reference(inst, device)
            cycles += want == np.inf
            assert latency_of(inst, device) == pytest.approx(want, rel=1e-12)
        res = solve_latency(inst, seconds=1)
        assert np.isfinite(res.latency) and res.latency == pytest.approx(_latency_reference(inst, res.device))
        assert evaluate(dataclasses.replace(inst, cpus=1), np.minimum(res.device, 3))[1] == []
        assert res.candidates["local_search"] <= min(res.candidates["all_cpu"],
                                                     res.candidates["maxload_split"] or np.inf) * (1 + 1e-12)
    assert cycles > 20


@pytest.mark.parametrize("seed", range(6))
def test_latency_cp_sat_matches_enumeration(tmp_path, seed):
    """On random 6-node inference instances the latency search finds the least latency over every split that
    breaks nothing (each accelerator one subgraph, the CPUs one pool), never worse than its two baselines."""
    import itertools

    from placement_rl.baselines.maxload_latency import latency_of, solve_latency

    if not maxload_cp.available():
        pytest.skip("OR-Tools is not installed")
    inst = read_instance(_write(tmp_path, random_instance(seed, n=6, colour=seed % 3 == 2,
                                                          max_size=10 if seed % 2 else 1e9)))
    best = np.inf
    for assign in itertools.product(range(3), repeat=inst.num_nodes):
        device = np.array(assign)
        if evaluate(inst, np.minimum(device, 2))[1]:
            continue
        best = min(best, latency_of(inst, device))
    res = solve_latency(inst, seconds=5)
    assert res.latency == pytest.approx(best, rel=1e-9) and res.optimal
    assert res.latency <= min(v for v in res.candidates.values() if v is not None) * (1 + 1e-12)


def test_latency_command(tmp_path, capsys):
    from placement_rl.cli.maxload import main

    path = _write(tmp_path, random_instance(8, n=7))
    out = tmp_path / "lat.json"
    main([str(path), "--objective", "latency", "--seconds", "3", "--out", str(out)])
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert "every node on a CPU: latency" in text and set(data) >= {"totalLatency", "fpgas", "cpus"}
    main([str(path), "--objective", "latency", "--split", str(out)])
    assert f"latency {data['totalLatency']:.6g}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([str(_write(tmp_path, random_instance(1, n=4, backward=True), "b.json")), "--objective", "latency"])
    assert exc.value.code == 2 and "is for inference graphs" in capsys.readouterr().err


def test_colour_cycles_bind_only_contiguous_splits(tmp_path):
    """1 -> 2 -> 3 with 1 and 3 in one class on two CPU cores: a contiguous split keeps 2 with them (12), a split of
    any shape need not (10, proved); the bound holds for the latter. With memory that the merged block overflows,
    no contiguous split fits but one of any shape does."""
    data = {"maxSizePerFPGA": 10, "maxFPGAs": 0, "maxCPUs": 2,
            "nodes": [node_entry(1, 0, 1, colour=9), node_entry(2, 0, 10), node_entry(3, 0, 1, colour=9)],
            "edges": [{"sourceId": 1, "destId": 2, "cost": 0}, {"sourceId": 2, "destId": 3, "cost": 0}]}
    inst = read_instance(_write(tmp_path, data))
    assert blocks_of(inst).count == 1 and blocks_of(inst, contiguous=False).count == 2
    assert lower_bound(inst, blocks_of(inst, contiguous=False)) <= 10
    if not maxload_cp.available():
        pytest.skip("OR-Tools is not installed")
    res = solve(inst, seconds=2)
    assert res.contiguous.max_load == pytest.approx(12) and res.best.max_load == pytest.approx(10) and res.optimal
    tight = dict(data, maxFPGAs=2, maxCPUs=0, maxSizePerFPGA=7)
    tight["nodes"] = [node_entry(1, 1, 1, size=3, colour=9), node_entry(2, 1, 1, size=5),
                      node_entry(3, 1, 1, size=3, colour=9)]
    inst = read_instance(_write(tmp_path, tight, "tight.json"))
    res = solve(inst, seconds=2)
    assert res.contiguous is None and "no contiguous split fits" in res.notes[0]
    assert res.best.max_load == pytest.approx(2.0) and res.optimal  # 1 and 3 on one accelerator, 2 on the other


def test_fallback_is_never_worse_than_prefixes(tmp_path):
    """A hub feeding 40 leaves and a sink: past the limit, keeping each leaf beside the hub would put everything on
    one device; the prefixes of one topological order are tried too and the better kept."""
    nodes = [node_entry(0, 1.0, 5.0)] + [node_entry(k, 1.0, 5.0) for k in range(1, 41)] + [node_entry(99, 1.0, 5.0)]
    edges = [{"sourceId": 0, "destId": k, "cost": 0.01} for k in range(1, 41)]
    edges += [{"sourceId": k, "destId": 99, "cost": 0.01} for k in range(1, 41)]
    data = {"maxSizePerFPGA": 1e9, "maxFPGAs": 4, "maxCPUs": 2, "nodes": nodes, "edges": edges}
    inst = read_instance(_write(tmp_path, data))
    blocks = blocks_of(inst)
    some = contiguous_dp(inst, blocks, ideal_limit=1000)
    linear = contiguous_dp(inst, blocks, linear=True)
    assert not some.contiguous_optimum and some.max_load <= linear.max_load * (1 + 1e-12)
    assert "prefixes of one topological order" in some.notes[0]


@pytest.mark.parametrize("text,words", [
    ('{"maxSizePerFPGA": 1, "maxFPGAs": 1, "maxCPUs": 1, "nodes": [{"id": NaN}], "edges": []}', "must be an integer"),
    ('{"maxSizePerFPGA": 1, "maxFPGAs": 1' + "0" * 400 + ', "maxCPUs": 1, "nodes": [], "edges": []}',
     "must be a whole number"),
    ("[" * 100000 + "]" * 100000, "nests its JSON too deeply"),
])
def test_odd_json_is_one_line(tmp_path, text, words):
    path = tmp_path / "odd.json"
    path.write_text(text)
    with pytest.raises(GraphError, match=words):
        read_instance(path)
    with pytest.raises(GraphError, match="is a folder"):
        read_instance(tmp_path)


def test_split_ids_of_other_types_are_one_line(tmp_path):
    inst = read_instance(_write(tmp_path, random_instance(0, n=4)))
    for ids in ([10, 11, [12]], [10, {"a": 1}], [10.5]):
        path = _write(tmp_path, {"fpgas": [{"nodes": ids}], "cpus": []}, "s.json")
        with pytest.raises(GraphError, match="which .* does not have"):
            read_split(path, inst)


def test_unwritable_outputs_are_refused_before_solving(tmp_path, capsys):
    from placement_rl.cli.maxload import main

    path = _write(tmp_path, random_instance(0, n=4))
    (tmp_path / "afile").write_text("")
    for out, words in ((tmp_path, "is a folder"), (tmp_path / "afile" / "s.json", "which is not a folder")):
        with pytest.raises(SystemExit) as exc:
            main([str(path), "--out", str(out)])
        err = capsys.readouterr()
        assert exc.value.code == 2 and words in err.err and "instance:" not in err.out


def test_a_bound_of_zero_is_no_division(tmp_path, capsys):
    """Zero-time nodes on accelerators that cannot hold both: the simple bound is 0, the split pays transfers."""
    from placement_rl.cli.maxload import main

    data = {"maxSizePerFPGA": 10, "maxFPGAs": 2, "maxCPUs": 0,
            "nodes": [node_entry(1, 0, 0, size=6), node_entry(2, 0, 0, size=6)],
            "edges": [{"sourceId": 1, "destId": 2, "cost": 3}]}
    main([str(_write(tmp_path, data)), "--seconds", "0"])
    out = capsys.readouterr().out
    assert "max-load 3 " in out and "no bound above 0" in out and "--seconds 0" in out


def test_a_long_chain_runs_level_by_level(tmp_path):
    """The dynamic program runs one size of ideal at a time: 600 levels (its batch size once overflowed a float
    past about 515)."""
    nodes = [node_entry(k, 1.0, 5.0) for k in range(600)]
    edges = [{"sourceId": k, "destId": k + 1, "cost": 0.01} for k in range(599)]
    inst = read_instance(_write(tmp_path, {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes,
                                           "edges": edges}))
    dp = contiguous_dp(inst, blocks_of(inst))
    assert dp.contiguous_optimum and dp.stats["ideals"] == 601 and dp.max_load < 300


def test_latency_optimal_only_where_it_meets_the_bound(tmp_path):
    """A CPU time a million times the others once made the small nodes round to 0 ticks and a worse split was
    called optimal; ticks now count fractions of the best latency known."""
    from placement_rl.baselines.maxload_latency import solve_latency

    if not maxload_cp.available():
        pytest.skip("OR-Tools is not installed")
    data = {"maxSizePerFPGA": 1e9, "maxFPGAs": 1, "maxCPUs": 1,
            "nodes": [node_entry(1, 1, 1e6), node_entry(2, 0.01, 0.09), node_entry(3, 0.01, 0.09)],
            "edges": [{"sourceId": 1, "destId": 2, "cost": 0}, {"sourceId": 2, "destId": 3, "cost": 0.02}]}
    res = solve_latency(read_instance(_write(tmp_path, data)), seconds=2)
    assert res.latency == pytest.approx(1.02) and res.optimal and res.bound <= res.latency


def test_latency_split_warnings_and_refusals(tmp_path, capsys):
    """A latency split is checked as a max-load one (memory, unsupported nodes, colour classes), with the CPUs as
    one pool; --contiguous is refused with it; an output path that is a link is refused before any work."""
    from placement_rl.cli.maxload import main

    data = random_instance(2, n=4, cpus=0, max_size=3)
    path = _write(tmp_path, data)
    split = _write(tmp_path, {"fpgas": [{"nodes": [10, 11, 12, 13]}], "cpus": []}, "s.json")
    main([str(path), "--objective", "latency", "--split", str(split)])
    assert "warning: the split breaks a constraint: accelerator 0 holds" in capsys.readouterr().out
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "target.json")
    for argv, words in (([str(path), "--objective", "latency", "--contiguous"], "--contiguous is for"),
                        ([str(path), "--out", str(link)], "is not a regular file")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "target.json").exists()
