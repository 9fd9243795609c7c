"""Measured NCCL fits as the simulators' link and collective prices, for the systems the tables hold.

The fits (``placement_rl/data/collective_fit.json``, written by ``scripts/fit_gpu_costs.py`` from the Sailor and
Vidur tables, see ``placement_rl/data/NOTICE`` and ``placement_rl.profiling.collective_fits``) are
piecewise-linear curves of ``log(seconds)`` against ``log2(bytes)``. A topology that names its system::

    collective_fit: a100_dgx      # a Vidur system or a Sailor GPU folder (collective_fits.systems())

is priced from them: every point-to-point link of ``simulate()`` (intra-host pairs from the system's intra-node
send/recv series, cross-host pairs from its inter-node one) and every collective of ``simulate_pipeline()``
whose kind the system has measured. Anything the tables do not hold (another system, a collective kind or a
link that was not measured, a collective across nodes on a system measured within one node or the other way
round, a GPU count the measured ones do not carry to: ``select_fit``) keeps the analytic models.

Both simulators price a transfer from a **segment table** ``float64 [K, 3]`` of rows ``(upper bytes, alpha,
beta)``, sorted by upper bound, the last one ``inf``: a message of ``n`` bytes takes ``alpha + beta * n`` of
the first row with ``n < upper`` (``_op_kernel.seg_time``, a binary search). An analytic link is one row; a
measured curve is its knots joined by straight lines in bytes (about a quarter octave apart, so the difference
from the log-log curve is below 1%); the analytic collective algorithms become the lower envelope of their lines.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from placement_rl.errors import ProfileError, TopologyError

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
SCHEMA = "placement_rl.collective_fit"
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "collective_fit.json"
SYSTEM_KEY = "collective_fit"  # the topology field naming a measured system
RULE_AGREE = 0.10  # how closely two measured GPU counts must follow the ring factor for it to price a third


def evaluate_fit(entry: dict[str, Any], nbytes: np.ndarray | float) -> np.ndarray:
    """Seconds of one fitted series at ``nbytes`` (below the table: its smallest time; above: the last
    octave's bandwidth continued linearly)."""
    x = np.log2(np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0))
    k = np.asarray(entry["log2_bytes"])
    c = np.asarray(entry["log_seconds"])
    t = np.exp(np.interp(x, k, c))
    top = x > k[-1]
    if np.any(top):
        t = np.where(top, np.exp(c[-1]) + _tail_slope(entry) * (2.0 ** x - 2.0 ** k[-1]), t)
    return t


def _tail_slope(entry: dict[str, Any]) -> float:
    """Seconds per byte above the largest knot: the curve's slope over its last octave (that octave's bandwidth).
    Where that is not positive (the time falls at a protocol switch inside the last octave, or a fit written
    before the curves rose), the largest size's own time per byte, so time keeps growing with the bytes. A p2p
    series keeps its last segment's slope, floored at 0 (the rule the links' published figures were measured
    with; no shipped p2p series ends falling)."""
    k, c = np.asarray(entry["log2_bytes"]), np.asarray(entry["log_seconds"])
    if entry.get("kind") == "p2p":  # the links keep the rule their published figures were measured with
        return max((np.exp(c[-1]) - np.exp(c[-2])) / (2.0 ** k[-1] - 2.0 ** k[-2]), 0.0)
    half = max(k[-1] - 1.0, k[0])
    top = np.exp(c[-1])
    slope = (top - np.exp(np.interp(half, k, c))) / (2.0 ** k[-1] - 2.0 ** half) if k[-1] > half else 0.0
    return float(slope) if slope > 0 else float(top / 2.0 ** k[-1])


@lru_cache(maxsize=1)
def shipped() -> tuple[dict[str, Any], ...]:
    """The shipped fits (empty when the package carries none)."""
    if not SHIPPED.is_file():
        return ()
    try:
        data = json.loads(SHIPPED.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProfileError(f"{SHIPPED}: malformed collective fit; re-run scripts/fit_gpu_costs.py") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("fits"), list):
        raise ProfileError(f"{SHIPPED}: not a collective fit; re-run scripts/fit_gpu_costs.py")
    return tuple(data["fits"])


def systems(fits: Iterable[dict[str, Any]] | None = None) -> list[str]:
    return sorted({f["system"] for f in (shipped() if fits is None else fits)})


def ring_factor(kind: str, n: int) -> float:
    return 2.0 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def select_fit(kind: str, n_gpus: int, system: str, devices_per_node: int | None = None, *,
               fits: Iterable[dict[str, Any]] | None = None, exact_p2p: bool = False
               ) -> tuple[dict[str, Any], float] | None:
    """``(series fit, time factor)`` for ``kind`` over ``n_gpus`` GPUs of ``system`` (see
    ``collective_fits.fitted_collective_time``), or None where the tables hold no such collective: the system did
    not measure ``kind``, or not in the asked layout class (all GPUs on one node, or across nodes: one class is
    never priced from the other's series), or not at a GPU count the rule below carries to ``n_gpus``.
    ``exact_p2p``: a p2p fit only for the asked devices per node (1 across nodes, 2 within one).

    A GPU count the system measured in this layout class but not at ``n_gpus`` (or at another count of GPUs per
    node) takes the nearest measured count, within a factor 2, scaled by the ring factor, and only where the rule
    holds on the system's own series: the measured counts next to ``n_gpus`` (one on each side, else the two
    nearest) must carry into each other within ``RULE_AGREE`` (mean relative error over their common sizes
    >= 1 MiB, both ways). With one measured count there is nothing to check it against and it is kept.
    Measured on the shipped files (each series left out and priced from the rest, rows >= 1 MiB): the rule
    holds between 4 and 8 GPUs on one node of ``a100_dgx`` and ``h100_dgx`` (6-7% mean error; the two counts
    carry into each other within 7-9%), and it is kept there. Elsewhere (2 <-> 4 GPUs of every system, the
    pairwise-NVLink machines, every layout across nodes) the counts disagree by 15-482%, the rule missed by
    5-607% (under 10% only on V100-16 reduce-scatter) and the analytic models, which price those counts instead,
    by 2-232% (on links fitted to each system's p2p series)."""
    if kind not in KINDS:
        raise ProfileError(f"unknown collective '{kind}' (valid: {', '.join(KINDS)})")
    if n_gpus < 1:
        raise ProfileError(f"n_gpus must be >= 1, got {n_gpus}")
    cands = [f for f in (shipped() if fits is None else fits) if f["system"] == system and f["kind"] == kind]
    if not cands:
        return None
    if kind == "p2p":
        dpn = 2 if devices_per_node is None else min(devices_per_node, 2)
        same = [f for f in cands if f["devices_per_node"] == dpn]
        if exact_p2p and not same:
            return None
        return (same or cands)[0], 1.0
    dpn = n_gpus if devices_per_node is None else devices_per_node
    exact = [f for f in cands if f["n_gpus"] == n_gpus and f["devices_per_node"] == dpn]
    if exact:
        return exact[0], 1.0
    intra = dpn >= n_gpus
    pool = [f for f in cands if (f["devices_per_node"] >= f["n_gpus"]) == intra]
    same = [f for f in pool if intra and f["n_gpus"] == n_gpus]  # on one node the node's size does not matter
    return (same[0], 1.0) if same else _other_count(kind, n_gpus, pool)


def _other_count(kind: str, n_gpus: int, pool: list[dict[str, Any]]) -> tuple[dict[str, Any], float] | None:
    """The nearest series of ``pool`` (one system, collective and layout class) scaled to ``n_gpus`` by the ring
    factor, where ``select_fit``'s rule keeps it, else None."""
    if not pool:
        return None
    near = min(pool, key=lambda f: (abs(np.log2(f["n_gpus"] / n_gpus)), -f["n_gpus"]))
    if abs(np.log2(near["n_gpus"] / n_gpus)) > 1.0:
        return None
    # one series per other count (the most GPUs per node, where a count was measured in several layouts)
    by_count = {f["n_gpus"]: f for f in sorted(pool, key=lambda f: f["devices_per_node"]) if f["n_gpus"] != n_gpus}
    below = sorted(c for c in by_count if c < n_gpus)[-2:]
    above = sorted(c for c in by_count if c > n_gpus)[:2]
    pair = below[-1:] + above[:1] if below and above else below + above
    if len(pair) == 2 and _count_disagreement(kind, by_count[pair[0]], by_count[pair[1]]) > RULE_AGREE:
        return None
    return near, ring_factor(kind, n_gpus) / ring_factor(kind, near["n_gpus"])


def _count_disagreement(kind: str, a: dict[str, Any], b: dict[str, Any], points: int = 64) -> float:
    """How far the ring-factor rule carries series ``a`` into ``b`` and back: the larger mean relative error of
    the two directions over their common sizes >= 1 MiB (inf where they share none)."""
    lo = np.log2(max(2.0 ** 20, a["min_bytes"], b["min_bytes"]))
    hi = np.log2(min(a["max_bytes"], b["max_bytes"]))
    if hi < lo:
        return float("inf")
    n = 2.0 ** np.linspace(lo, hi, points)
    r = evaluate_fit(b, n) / (evaluate_fit(a, n) * ring_factor(kind, b["n_gpus"]) / ring_factor(kind, a["n_gpus"]))
    return float(max(np.mean(np.abs(r - 1.0)), np.mean(np.abs(1.0 / r - 1.0))))


def fit_segments(entry: dict[str, Any], factor: float = 1.0) -> np.ndarray:
    """Segment table ``[K, 3]`` of one fitted series (``factor`` scales every time)."""
    b = 2.0 ** np.asarray(entry["log2_bytes"], dtype=np.float64)
    t = np.exp(np.asarray(entry["log_seconds"], dtype=np.float64))
    beta = np.diff(t) / np.diff(b)
    alpha = t[:-1] - beta * b[:-1]
    rows = [(b[0], t[0], 0.0)] + [(b[i + 1], alpha[i], beta[i]) for i in range(len(beta))]
    slope = _tail_slope(entry)
    rows.append((np.inf, t[-1] - slope * b[-1], slope))
    out = np.array(rows, dtype=np.float64)
    out[:, 1:] *= factor
    return out


def envelope(lines: Iterable[tuple[float, float]]) -> np.ndarray:
    """Segment table of ``min(alpha + beta * n)`` over ``lines`` for ``n >= 0`` (lines with inf skipped)."""
    ls = sorted({(float(a), float(b)) for a, b in lines if np.isfinite(a) and np.isfinite(b)})
    if not ls:
        return np.array([[np.inf, np.inf, 0.0]])
    cur, x, rows = ls[0], 0.0, []
    while True:
        nxt = [((a - cur[0]) / (cur[1] - b), (a, b)) for a, b in ls if b < cur[1]]
        nxt = [(xi, ln) for xi, ln in nxt if xi > x]
        if not nxt:
            rows.append((np.inf, *cur))
            return np.array(rows, dtype=np.float64)
        xi, ln = min(nxt)
        rows.append((xi, *cur))
        cur, x = ln, xi


def split_segments(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(upper [..., K], coef [..., K, 2])`` of segment tables ``[..., K, 3]``: the kernels' two arrays."""
    return np.ascontiguousarray(tables[..., 0]), np.ascontiguousarray(tables[..., 1:])


def pad_segments(tables: list[np.ndarray]) -> np.ndarray:
    """Stack segment tables ``[K_i, 3]`` into ``[len, K, 3]`` (each padded with its last, unbounded row)."""
    k = max(t.shape[0] for t in tables)
    return np.stack([np.vstack([t] + [t[-1:]] * (k - t.shape[0])) for t in tables])


def measured_system(topology: Any) -> str | None:
    """The measured system a topology names (``collective_fit:``), checked against the shipped fits."""
    name = topology.meta.get(SYSTEM_KEY)
    if name is None:
        return None
    known = systems()
    if not known:
        return None  # a package without the fit data: the analytic model
    if name not in known:
        raise TopologyError(f"topology '{topology.name}': {SYSTEM_KEY} '{name}' is not a measured system "
                            f"(known: {', '.join(known)})")
    return str(name)


def fit_applies(topology: Any, costs: Any = None) -> str | None:
    """The measured system whose fit prices ``topology``'s links and collectives, or None. A cost table
    carrying other link figures than the topology's (links profiled on this machine) keeps its own."""
    if costs is not None and not (np.array_equal(costs.link_latency, topology.link_latency)
                                  and np.array_equal(costs.link_bandwidth, topology.link_bandwidth)):
        return None
    return measured_system(topology)


def inverse_bandwidth(bandwidth: np.ndarray) -> np.ndarray:
    """Seconds per byte of every link ``[D, D]``: 0 on the diagonal and where a bandwidth is not positive."""
    inv = np.zeros_like(bandwidth, dtype=np.float64)
    ok = np.isfinite(bandwidth) & (bandwidth > 0)
    inv[ok] = 1.0 / bandwidth[ok]
    np.fill_diagonal(inv, 0.0)
    return inv


def link_segments(topology: Any, costs: Any = None) -> np.ndarray:
    """``float64 [D, D, K, 3]``: each link's segment table: the measured p2p fit where ``fit_applies`` and
    the pair's kind of link was measured, else ``latency + bytes / bandwidth`` (of ``costs``, else the
    topology). The kernels take it as ``split_segments(...)``. Built with array operations: a table per pair in
    Python took 0.22 s at 256 devices, which every search paid before its clock started."""
    d = topology.num_devices
    src = topology if costs is None else costs
    latency, inv = np.asarray(src.link_latency, dtype=np.float64), inverse_bandwidth(src.link_bandwidth)
    analytic = np.stack([np.full((d, d), np.inf), latency, inv], axis=-1)[:, :, None, :]  # one unbounded row
    system = fit_applies(topology, costs)
    segs: dict[int, np.ndarray] = {}
    if system is not None:
        fits = {dpn: select_fit("p2p", 2, system, dpn, exact_p2p=True) for dpn in (1, 2)}
        segs = {dpn: fit_segments(*f) for dpn, f in fits.items() if f is not None}
    if not segs:
        return np.ascontiguousarray(analytic)
    k = max(t.shape[0] for t in segs.values())
    out = np.repeat(analytic, k, axis=2)  # each table padded with its last, unbounded row (``pad_segments``)
    devs = topology.devices
    host = np.array([dv.host for dv in devs], dtype=object)
    gpu = np.array([dv.kind == "gpu" for dv in devs])
    same = host[:, None] == host[None, :]
    pairs = gpu[:, None] & gpu[None, :] & ~np.eye(d, dtype=bool)
    for dpn, tab in segs.items():  # 2 devices per node: the pair shares a host; 1: it does not
        out[pairs & (same if dpn == 2 else ~same)] = np.vstack([tab] + [tab[-1:]] * (k - tab.shape[0]))
    return np.ascontiguousarray(out)


def segment_time(table: np.ndarray, nbytes: float) -> float:
    """``alpha + beta * nbytes`` of the first row with ``nbytes < upper`` (``_op_kernel.seg_time`` in Python)."""
    r = int(np.searchsorted(table[:, 0], nbytes, side="right"))
    return float(table[r, 1] + table[r, 2] * nbytes)


__all__ = ["KINDS", "RULE_AGREE", "SYSTEM_KEY", "envelope", "evaluate_fit", "fit_applies", "fit_segments",
           "inverse_bandwidth", "link_segments", "measured_system", "pad_segments", "ring_factor", "segment_time",
           "select_fit", "shipped", "split_segments", "systems"]
