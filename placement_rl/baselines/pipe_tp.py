"""Planners with tensor parallelism: ``tp``, ``megatron`` and ``exact`` (DP x TP x PP, DDP or FSDP).

Every plan has one DP degree and one TP degree for all its stages (the 3-D ``pp x dp x tp`` mesh the executor
runs); stage ``k`` takes the next ``dp x tp`` devices of ``PipeProblem.devs`` (fastest first, index order on
homogeneous presets), TP innermost, and a TP degree is offered only when it divides the devices of every host
in that order (TP groups never span hosts) and the graph's split sizes (``graph.tp.check_degree``).

* ``tp``: all devices of a host in one TP group (the largest degree <= the host size that the graph allows),
  DP across hosts, one stage; micro-batch count and DDP / FSDP searched.
* ``megatron``: the usual Megatron-LM rule -- TP within a host (as ``tp``), PP across hosts (every divisor of
  the host count), DP for the rest; time-balanced cuts; micro-batches searched; DDP.
* ``exact``: every ``(pp, dp, tp)`` with ``pp x dp x tp <= D`` (also plans on fewer devices: a DP plan over 8
  GPUs can be slower than one GPU), every micro-batch count the batch allows, DDP and FSDP; for each, the cuts
  come from a dynamic program over cut points (Alpa's inter-operator pass): for a bound ``t_max`` on a stage's
  per-micro-batch time, minimise ``sum_k tau_k + (m - 1) t_max`` over stage splits with every ``tau_k <=
  t_max`` and every stage within its devices' memory, over the candidate bounds in increasing order until
  ``(m - 1) t_max + min sum`` cannot win. Each resulting plan (and the minimax-bottleneck cuts) is then simulated
  and the best simulated plan is kept.

``tau_k`` (one micro-batch, forward + backward, on the stage's first device): variable node time / (m dp) +
fixed (launch) time + the TP all-reduces at the micro-batch's bytes + both directions of the boundary transfer.
Limits of ``exact``: it is exact over the discrete choices and over cuts *for that analytic objective*
(the simulator's event-level schedule, DP / FSDP collective overlap and the DP gradient sync are only in the
final simulated ranking); cut points are ``cut_grid(n, 128)`` (every position up to 128 nodes, evenly spaced
beyond: coarsen big graphs or accept the grid); at most ``MAX_BOUNDS`` bounds per configuration are tried
(``meta["bounds_capped"]`` counts configurations that hit it); heterogeneous devices are priced at the group's
first device. Candidates are simulated best analytic estimate first; a budget smaller than the candidate count
simulates only the first ones (``meta["exhaustive"]`` is then false).
"""

from __future__ import annotations

import numpy as np

from placement_rl.baselines.pipe_common import PipeProblem, Plan, cut_grid, microbatch_choices
from placement_rl.cost.memory import BUCKET_BYTES, FSDP_GATHER_FACTOR, STATE_FACTOR
from placement_rl.cost.tensor_parallel import segment_times
from placement_rl.errors import ConfigError, PlanError
from placement_rl.graph import tp as tpmod
from placement_rl.plans import SHARDINGS

EXACT_GRID = 128
MAX_BOUNDS = 1024


def host_size(pp: PipeProblem) -> int:
    """Devices per host run in ``pp.devs`` order (the smallest run: TP groups must fit every host)."""
    hosts = [pp.topology.devices[int(d)].host for d in pp.devs]
    runs, cur = [], 1
    for a, b in zip(hosts, hosts[1:]):
        if a == b:
            cur += 1
        else:
            runs.append(cur)
            cur = 1
    runs.append(cur)
    return min(runs)


def tp_choices(pp: PipeProblem, limit: int | None = None) -> list[int]:
    """TP degrees the graph allows that divide every host's run of devices (1 always)."""
    h = host_size(pp)
    ann = tpmod.annotation(pp.graph)
    out = [1]
    for t in range(2, min(h, limit or h) + 1):
        if h % t:
            continue
        try:
            tpmod.check_degree(pp.graph, t, ann)
        except PlanError:
            continue
        out.append(t)
    return out


def _plans_whole(pp: PipeProblem, t: int, shardings=SHARDINGS) -> list[Plan]:
    d = pp.d // t
    return [([0, pp.n], (d,), m, sh, (t,)) for m in microbatch_choices(1, d, pp.batch_size, schedule=pp.schedule)
            for sh in shardings]


def tp_planner(pp: PipeProblem) -> Plan:
    t = tp_choices(pp)[-1]
    if t == 1:  # plain data parallelism, saying why
        note = tpmod.annotation(pp.graph).note
        pp.extra_meta = {"note": f"no TP degree > 1 for graph '{pp.graph.name}' on topology '{pp.topology.name}' "
                                 f"({note or 'no degree divides both the host size and the split sizes'})"}
    cands = _plans_whole(pp, t)
    if not cands:
        raise ConfigError(f"batch_size {pp.batch_size} does not split over DP degree {pp.d // t} (TP {t}): no tp plan")
    return pp.best_of(cands)


class _Stages:
    """Per-micro-batch stage times ``tau[a, b]`` over the cut grid for one (tp, dp, m), and stage sizes."""

    def __init__(self, pp: PipeProblem, grid: np.ndarray, t: int, dp: int, m: int) -> None:
        fvar, ffix, bvar, bfix, param, act, arf, arb = pp.sim.node_arrays(t)
        order, dev = pp.order, int(pp.devs[0])
        var = (fvar[dev] + bvar[dev])[order] / (m * dp)
        fixed = (ffix[dev] + bfix[dev])[order]
        if t > 1:
            tab = pp.sim._tp_collective(tuple(int(x) for x in pp.devs[:t]))[0]
            fixed = fixed + segment_times(tab, arf[order] / (m * dp)) + segment_times(tab, arb[order] / (m * dp))
        pre = np.concatenate([[0.0], np.cumsum(var + fixed)])
        ppar = np.concatenate([[0.0], np.cumsum(param[order])])
        pact = np.concatenate([[0.0], np.cumsum(act[order])])
        g = grid
        self.tau = pre[g][None, :] - pre[g][:, None]
        self.params = ppar[g][None, :] - ppar[g][:, None]
        self.act = (pact[g][None, :] - pact[g][:, None]) / (m * dp)
        valid = g[None, :] > g[:, None]
        self.tau = np.where(valid, self.tau, np.inf)
        # boundary after the stage (activations out, gradients back), on the link to the next group
        self.cross = np.zeros_like(self.tau)
        for b in range(1, len(g) - 1):
            self.cross[:b, b] = pp.crossing_out(int(g[b]))[g[:b]] / (m * dp)


def _dp_cuts(mats: list[np.ndarray], m: int, alpa: bool = True) -> tuple[list[int] | None, list[int] | None, int]:
    """(Alpa cuts, minimax cuts, 1 if the bound list was capped) over grid indices; None when infeasible."""
    s = len(mats)
    g = mats[0].shape[0] - 1

    def run(bound: float, mode: str) -> tuple[float, list[int]] | None:
        f = np.full(g + 1, np.inf)
        f[0] = 0.0
        arg = np.zeros((s, g + 1), dtype=np.int64)
        for k in range(s):
            tk = np.where(mats[k] <= bound, mats[k], np.inf)
            tot = np.maximum(f[:, None], tk) if mode == "max" else f[:, None] + tk
            arg[k] = np.argmin(tot, axis=0)
            f = tot[arg[k], np.arange(g + 1)]
        if not np.isfinite(f[g]):
            return None
        cuts, b = [g], g
        for k in range(s - 1, 0, -1):
            b = int(arg[k, b])
            cuts.append(b)
        return float(f[g]), [0] + cuts[::-1]

    mm = run(np.inf, "max")
    if mm is None or not alpa:
        return None, None if mm is None else mm[1], 0
    lb, lb_cuts = run(np.inf, "sum")
    if m == 1:  # no (m - 1) t_max term: the least total time is the optimum
        return lb_cuts, mm[1], 0
    vals = np.unique(np.concatenate([x[np.isfinite(x)] for x in mats]))
    vals = vals[vals >= mm[0] - 1e-15]
    best, best_cuts, capped = np.inf, None, 0
    for i, bound in enumerate(vals):
        if (m - 1) * bound + lb >= best:
            break
        if i >= MAX_BOUNDS:
            capped = 1
            break
        got = run(bound, "sum")
        if got is not None and got[0] + (m - 1) * bound < best:
            best, best_cuts = got[0] + (m - 1) * bound, got[1]
    return best_cuts, mm[1], capped


def _pipeline_plans(pp: PipeProblem, grid: np.ndarray, s: int, t: int, dp: int, m: int,
                    shardings=SHARDINGS, alpa: bool = True) -> tuple[list[tuple[float, Plan]], int]:
    """Plans of ``s`` stages for one (tp, dp, m), each with its analytic estimate (inf: over memory)."""
    st = _Stages(pp, grid, t, dp, m)
    cap = pp.topology.array("memory_bytes")[pp.devs]
    width = dp * t
    out, capped = [], 0
    for sh in shardings:
        mats = []
        for k in range(s):
            lo, hi = k * width, (k + 1) * width
            lat_n, inv_n = 0.0, 0.0
            if k + 1 < s:
                lat, bw = pp.costs.link_latency, pp.costs.link_bandwidth
                a, b = pp.devs[lo:hi:t][:1], pp.devs[hi:hi + width:t][:1]
                lat_n, inv_n = float(lat[a, b].max()), float((1.0 / bw[a, b]).max())
            tau = st.tau + (2.0 * (lat_n + st.cross * inv_n) if k + 1 < s else 0.0)
            if sh == "fsdp" and dp > 1:
                state = STATE_FACTOR * st.params / dp + FSDP_GATHER_FACTOR * np.minimum(st.params, BUCKET_BYTES)
            else:
                state = STATE_FACTOR * st.params
            inflight = m if pp.schedule == "gpipe" else min(m, s - k)
            mem = state + st.act * inflight
            mats.append(np.where(mem <= cap[lo:hi].min(), tau, np.inf))
        if s == 1:
            est = float(mats[0][0, -1])
            out.append((m * est, ([0, pp.n], (dp,), m, sh, (t,))))
            continue
        a_cuts, mm_cuts, c = _dp_cuts(mats, m, alpa)
        capped += c
        for cuts in {tuple(x) for x in (a_cuts, mm_cuts) if x is not None}:
            taus = [float(mats[k][cuts[k], cuts[k + 1]]) for k in range(s)]
            out.append((sum(taus) + (m - 1) * max(taus), ([int(grid[i]) for i in cuts], (dp,) * s, m, sh, (t,) * s)))
    return out, capped


def megatron(pp: PipeProblem) -> Plan:
    t = tp_choices(pp)[-1]
    hosts = max(1, pp.d // host_size(pp))
    cands: list[Plan] = []
    grid = cut_grid(pp.n, EXACT_GRID)
    for s in (s for s in range(1, hosts + 1) if hosts % s == 0 and s <= len(grid) - 1):
        dp = pp.d // (t * s)
        for m in microbatch_choices(s, dp, pp.batch_size, schedule=pp.schedule):
            cands += [c for _, c in _pipeline_plans(pp, grid, s, t, dp, m, shardings=("dp",), alpa=False)[0]]
    if not cands:
        raise ConfigError(f"megatron found no plan: batch_size {pp.batch_size} does not split over the DP degrees "
                          f"left after TP {t} x PP")
    return pp.best_of(cands)


def configurations(pp: PipeProblem) -> list[tuple[int, int, int, int]]:
    """Every ``(pp, dp, tp, m)`` the exact search visits (stages <= cut points, devices <= D)."""
    g = len(cut_grid(pp.n, EXACT_GRID)) - 1
    out = []
    for t in tp_choices(pp):
        for s in range(1, min(pp.d // t, g) + 1):
            for dp in range(1, pp.d // (t * s) + 1):
                for m in microbatch_choices(s, dp, pp.batch_size, schedule=pp.schedule):
                    out.append((s, dp, t, m))
    return out


def exact(pp: PipeProblem) -> Plan:
    confs = configurations(pp)
    grid = cut_grid(pp.n, EXACT_GRID)
    cands: list[tuple[float, Plan]] = []
    capped = 0
    for s, dp, t, m in confs:
        got, c = _pipeline_plans(pp, grid, s, t, dp, m)
        cands += got
        capped += c
    if not cands:
        raise ConfigError(f"exact found no plan: batch_size {pp.batch_size} admits no DP degree x micro-batch count")
    cands.sort(key=lambda c: c[0])  # best estimate first: what a short budget simulates
    pp.extra_meta = {"configurations": len(confs), "candidates": len(cands), "bounds_capped": capped,
                     "exhaustive": len(cands) <= pp.budget}
    return pp.best_of([c for _, c in cands])


__all__ = ["configurations", "exact", "host_size", "megatron", "tp_choices", "tp_planner"]
