"""Planners held to their seconds at scale, and what a large cluster's topology file logs: ``pipedream``'s dynamic
programs stop at their share of the seconds (they ran 38 CPU-s for a 2 s budget on 64 GPUs) with the plans of the
device counts done, and a one-pass DP gives the plans the two DPs gave; ``local_search`` cut short by the seconds
starts from a placement that fits memory where no single device holds the graph (it returned the single-device
placement); datasheet lines fold by model where hosts of several models alternate (128 lines at 1,024 GPUs)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import yaml

from placement_rl import baselines
from placement_rl.baselines import baechi, metis, pipe_fixed, search, simple
from placement_rl.baselines.common import StartCut
from placement_rl.baselines.pipe_common import PipeProblem, cut_grid
from placement_rl.cost import resolve_costs
from placement_rl.cost.memory import pinned_memory
from placement_rl.graph import synthetic
from placement_rl.topology import DeviceTopology, load_topology

torch.set_num_threads(1)

LINKS = {"intra_host": {"bandwidth": 150e9, "latency": 2e-6}, "inter_host": {"bandwidth": 25e9, "latency": 5e-6}}


def _hosts(models: list[str], per_host: int, memory: list[float | None] | None = None) -> DeviceTopology:
    """One entry of ``per_host`` GPUs per host, of the given models (and memory, where given)."""
    mem = memory or [None] * len(models)
    return DeviceTopology.from_dict({"name": "hosts", "links": LINKS, "devices": [
        {"name": f"h{k}_", "count": per_host, "kind": "gpu", "host": k, "model": m,
         **({} if b is None else {"memory_bytes": b})} for k, (m, b) in enumerate(zip(models, mem))]})


# ------------------------------------------------------------------------------------------------------ pipedream
def _two_dps(pp: PipeProblem) -> tuple[list[tuple], list[tuple]]:
    """The DPs ``pipedream`` ran before (one on time alone, one with every stage kept to memory, b by m by r), as
    (kept, timed) candidate lists: the reference the one-pass DP must match."""
    def dp(stage_cost):
        grid = cut_grid(pp.n)
        g, d = len(grid) - 1, pp.d
        a = np.full((g + 1, d + 1), np.inf)
        choice = np.zeros((g + 1, d + 1, 2), dtype=np.int64)
        a[0, 0] = 0.0
        for b in range(1, g + 1):
            for m in range(1, d + 1):
                for r in (r for r in range(1, m + 1) if pp.degree_ok(r)):
                    cost = np.maximum(a[:b, m - r], stage_cost(int(grid[b]), m - r, m, r)[grid[:b]])
                    i = int(np.argmin(cost))
                    if cost[i] < a[b, m]:
                        a[b, m], choice[b, m] = cost[i], (i, r)
        return pipe_fixed._dp_plans(grid, a, choice, d)

    kept = dp(lambda j, lo, m, r: np.where(pp.stage_fits(j, lo, m, r, pp.m, pp.m), pp.stage_time_vec(j, lo, m, r),
                                           np.inf))
    return kept, dp(pp.stage_time_vec)


@pytest.mark.parametrize("seed", range(4))
def test_pipedream_one_pass_dp_gives_the_plans_of_its_two_dps(seed):
    """The DPs run by device count in one pass (a stage's time computed once for both, columns with no finite prefix
    skipped): the same bottlenecks, cuts and degrees as the two DPs, on unequal hosts whose memory cuts some stages."""
    rng = np.random.default_rng(seed)
    family = ["dataflow", "layered", "transformer_like", "cnn_like"][seed]
    g = synthetic.sample(family, num_nodes=int(rng.integers(8, 30)), seed=seed)
    models = [str(x) for x in rng.choice(["H100-SXM5-80GB", "A100-SXM4-80GB", "V100-SXM2-32GB", "L40S"], size=3)]
    total = float(pinned_memory(g, resolve_costs(g, _hosts(models, 2))).sum())
    topo = _hosts(models, 2, [float(x) * total for x in rng.uniform(0.2, 1.2, size=3)])
    m = int(rng.choice([1, 2, 4]))
    pp = PipeProblem(g, resolve_costs(g, topo), topo, budget=100, seed=0, num_microbatches=m,
                     schedule=str(rng.choice(["1f1b", "gpipe"])), batch_size=m * int(rng.choice([1, 2, 6])))
    kept, timed, done = pipe_fixed._pipedream_dp(pp)
    want_kept, want_timed = _two_dps(pp)
    assert done == topo.num_devices
    assert [(float(b), c, r) for b, c, r in kept] == [(float(b), c, r) for b, c, r in want_kept]
    assert [(float(b), c, r) for b, c, r in timed] == [(float(b), c, r) for b, c, r in want_timed]


@pytest.fixture(scope="module")
def pipe_case():
    g = synthetic.sample("dataflow", num_nodes=40, seed=0)
    topo = load_topology("2x4_v100_ib")
    return g, resolve_costs(g, topo), topo


def test_pipedream_stops_its_dps_when_its_share_of_the_seconds_is_spent(pipe_case, monkeypatch):
    """Told 2 s on 300 nodes x 64 GPUs, pipedream ran 38 CPU-s: its DPs (O(P^2 D^2)) never looked at the clock. Now
    they stop at ``DP_SHARE`` of the seconds, once a device count has a plan, and the note says how far they got."""
    g, c, topo = pipe_case
    calls = []
    real = PipeProblem.stage_time_vec
    monkeypatch.setattr(PipeProblem, "stage_time_vec", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    full = baselines.get_pipeline("pipedream")(g, c, topo, budget=10**6, seed=0)
    whole = len(calls)
    calls.clear()
    cut = baselines.get_pipeline("pipedream")(g, c, topo, budget=10**6, seed=0, seconds=1e-4)
    assert 0 < len(calls) < whole / 4  # the first device count's column, and the look at the clock after it
    assert "its plans use at most 1 of the 8 devices" in cut.meta["note"]
    assert "seconds ran out" not in str(full.meta.get("note", ""))
    assert cut.meta["step_time"] >= full.meta["step_time"] * (1 - 1e-9)  # less searched, never better


# -------------------------------------------------------------------------------------------------- local_search
def _runs_past(prob):
    """A start that takes the rest of the seconds and is cut (as HEFT and the list schedulers at 5,000 nodes)."""
    prob.start -= prob.seconds
    raise StartCut


def test_local_search_cut_short_starts_from_a_fitting_placement(monkeypatch):
    """At 5,000 nodes on 64 GPUs in 2 s every start after the first was cut, and the first, the single-device
    placement, cannot fit: the search returned it. Where no single device holds the graph, m_topo (which fits
    here) is now the start the seconds never cut."""
    g = synthetic.sample("layered", num_nodes=40, seed=0)
    total = float(pinned_memory(g, resolve_costs(g, _hosts(["A100-SXM4-80GB"], 4))).sum())
    topo = _hosts(["A100-SXM4-80GB"], 4, [0.4 * total])
    costs = resolve_costs(g, topo)
    monkeypatch.setattr(search, "START_HEURISTICS", (simple.single_device, _runs_past, baechi.m_etf, baechi.m_sct,
                                                     baechi.m_topo, metis.metis, simple.round_robin))
    p = baselines.get("local_search")(g, costs, topo, budget=10**6, seed=0, seconds=60.0)
    assert p.meta["feasible"] and len(set(p.device_of_node.tolist())) > 1
    assert p.meta["starts_cut"] == ["_runs_past", "m_etf", "m_sct", "metis", "round_robin"]


@pytest.mark.parametrize("seed", range(3))
def test_local_search_with_every_start_run_is_as_before(seed):
    """Where the starts all run, m_topo first changes nothing: the starts are weighed in their listed order (two
    placements of one step time on equal devices went the other way), as without seconds."""
    rng = np.random.default_rng(seed)
    g = synthetic.sample(["series_parallel", "dataflow", "layered"][seed], num_nodes=int(rng.integers(8, 24)),
                         seed=seed)
    total = float(pinned_memory(g, resolve_costs(g, _hosts(["V100-SXM2-32GB"], 3))).sum())
    topo = _hosts(["V100-SXM2-32GB"], 3, [float(rng.uniform(0.4, 0.9)) * total])
    costs = resolve_costs(g, topo)
    with_s = baselines.get("local_search")(g, costs, topo, budget=60, seed=1, seconds=1e6)
    without = baselines.get("local_search")(g, costs, topo, budget=60, seed=1)
    assert with_s.device_of_node.tolist() == without.device_of_node.tolist()


# ------------------------------------------------------------------------------------------------ topology lines
def test_datasheet_lines_fold_by_model_where_hosts_alternate(tmp_path, caplog):
    """A cluster of one entry per host, models in turn, said which figures came from a datasheet once per entry
    (128 lines at 1,024 GPUs): now one line per model, naming its entries and how many; one entry reads as before."""
    models = ["H100-SXM5-80GB", "A100-SXM4-80GB", "L40S"] * 4 + ["V100-SXM2-32GB"]
    devices = [{"name": f"h{k}_", "count": 2, "kind": "gpu", "host": k, "model": m} for k, m in enumerate(models)]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "cluster", "devices": devices, "links": LINKS}))
    with caplog.at_level(logging.INFO, logger="placement_rl._topology_reader"):
        assert load_topology(path).num_devices == 26
    said = [r.getMessage().split(": ", 1)[1] for r in caplog.records]
    assert len(said) == 4, said
    assert said[0].startswith("devices[0, 3, 6, ...] (4 entries): peak_flops") and "H100 SXM5 80GB" in said[0]
    assert said[2].startswith("devices[2, 5, 8, ...] (4 entries): ") and said[2].endswith("L40S 48GB")
    assert said[3].startswith("devices[12]: peak_flops") and said[3].endswith("V100 SXM2 32GB")


def test_cp_sat_solvers_leave_ctrl_c_to_the_command(monkeypatch):
    """OR-tools catches SIGINT during a solve by default and only ends that search early: a Ctrl-C in `train`'s
    cp_sat row let the run go on and exit 0 with a cut-short row. Every CP-SAT solve the project runs leaves it."""
    from ortools.sat.python import cp_model

    made = []
    real = cp_model.CpSolver

    def spy():
        s = real()
        made.append(s)
        return s

    monkeypatch.setattr(cp_model, "CpSolver", spy)
    from placement_rl.baselines import cp_place
    from placement_rl.baselines.common import Problem
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.topology import load_topology

    g = synthetic.sample("layered", num_nodes=8, seed=1)
    t = load_topology("cpu_2gpu")
    cp_place.cp_sat(Problem(g, resolve_costs(g, t), t, budget=50, seed=0, seconds=1.0))
    assert made and all(not s.parameters.catch_sigint_signal for s in made)


def test_names_ending_in_a_digit_fold_into_one_line_but_a_misread_one_keeps_its_own(tmp_path, caplog):
    """Twelve hosts named h0 .. h11 were warned one line each: now one line for those whose devices read as no
    product, and their own line for h2 (h20 reads as the H20) and h10 (h100 as the H100)."""
    devices = [{"name": f"h{k}", "count": 2, "kind": "gpu", "host": k, "model": "A100-SXM4-80GB"} for k in range(12)]
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"name": "hosts", "devices": devices, "links": LINKS}))
    with caplog.at_level(logging.WARNING, logger="placement_rl._topology_reader"):
        assert load_topology(path).num_devices == 24
    said = [r.getMessage().split(": ", 1)[1] for r in caplog.records if "ends in a digit" in r.getMessage()
            or "end in a digit" in r.getMessage()]
    assert len(said) == 3, said
    assert said[0].startswith("10 entries' names end in a digit ('h0', 'h1', 'h3' and 7 more)")
    assert "'h20' reads as H20" in said[1] and "'h100' reads as H100" in said[2]
