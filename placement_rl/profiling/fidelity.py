"""Predicted (simulator + measured profiles) against measured (local executor) step times.

What the prediction assumes about the executor it is compared with (``predict_step_time``):

* **Logical devices that share one torch device** (``2x_cpu``: two CPU "devices" on ``cpu``) share one
  executor: the local executor runs every op of one process in program order on the same cores, so two
  such devices never compute at the same time. They are collapsed into one physical device before
  simulating (``physical_topology``): their ops serialise, and the prediction is placement-independent
  except for the transfers below. Simulating them as independent devices would predict a speed-up that
  no run on shared cores can show.
* **Transfers between collapsed devices** still run (the executor's ``.to`` on the same device, a
  Python call that returns its input): each one (per source value and destination device, as the
  simulator counts them) is charged the measured ``copy`` link fit for that torch-device pair, serially.
  Between distinct torch devices the simulator's own link model applies, with measured link fits.
* **The optimizer step** (Adam, as the executor runs it) is not in the simulator; it is added from the
  profile's measured optimizer time, split over physical devices by parameter bytes (devices update in
  parallel: the maximum counts).
* **Per-step overhead no op owns** (autograd engine start, gradient accumulation where a value has several
  consumers, ``AccumulateGrad`` of parameters, Python between ops): the profile's whole-step time minus
  the sum of its per-op times on the same device (both measured, never the executor's figure being
  predicted), added once (``step_overhead``; the one-process executor pays it on one host thread).
  Negative residuals (noise) count as 0.

* **A CPU and a CUDA GPU on one host** (topology ``local``), when a placement uses both: the executor is one
  Python thread, and every crossing synchronises it with the GPU stream (a GPU -> CPU ``.to()`` is a
  synchronous copy that waits for the GPU queue to drain; a CPU -> GPU copy from pageable memory syncs the
  stream before it starts and blocks the host while it stages), so CPU and GPU work do not overlap across
  a crossing, and between crossings the GPU only runs behind the host's launches (at these sizes the GPU
  ops are launch-bound: their measured times are host time). The simulator's two free-running devices are
  replaced by one host timeline (``host_serial_step``): every op's measured fwd + bwd time, plus each forward
  transfer and each gradient transfer (``needs_grad``) at the measured link fit, plus ``crossing_cost`` per
  CPU<->GPU transfer in either pass: what the copy benchmark (one warm ``.to()``, CUDA events) does not see,
  i.e. the wait for the stream and, in backward, the autograd engine's hand-off between its CPU thread and
  its CUDA device thread. That cost is ``HOST_CROSSING_FACTOR`` x the GPU's measured engine start
  (``bwd_call_overhead`` of the profiled GPU, which is one such hand-off and back); the factor is the one
  free constant, fitted on the H200's executor rows only (``scripts/fidelity.py --replay ... --fit-crossing``),
  the H100's rows held out. The optimizer steps of the two devices run one after the other on that thread
  (summed, not the maximum).

``fidelity_stats`` gives MAPE and Spearman's rank correlation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placement_rl.cost import needs_grad, resolve_costs, simulate
from placement_rl.cost.types import CostTable
from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement
from placement_rl.profiling.db import ProfileDB
from placement_rl.topology import DeviceTopology


def _torch_key(td: str) -> str:
    import torch

    dev = torch.device(td)
    return f"cuda:{dev.index or 0}" if dev.type == "cuda" else str(dev)


def physical_topology(topology: DeviceTopology) -> tuple[DeviceTopology, np.ndarray]:
    """Devices sharing a (host, torch device) merged into the first of them; ``phys_of[logical]`` indices."""
    keys: dict[tuple[int, str], int] = {}
    reps: list[int] = []
    phys_of = np.zeros(topology.num_devices, dtype=np.int64)
    for i, d in enumerate(topology.devices):
        k = (d.host, _torch_key(d.torch_device))
        if k not in keys:
            keys[k] = len(reps)
            reps.append(i)
        phys_of[i] = keys[k]
    if len(reps) == topology.num_devices:
        return topology, phys_of
    return topology.subset(reps, name=f"{topology.name}:physical"), phys_of


def measured_costs(graph: CompGraph, topology: DeviceTopology, db: ProfileDB, *, backend: str = "copy") -> CostTable:
    """``resolve_costs`` with the DB as the measured source and its link fits in place of the topology's.

    The cost table's ``source`` says per device ``measured:<profile>`` or ``roofline``; its ``meta`` has
    ``link_sources`` (which links were measured).
    """
    linked = db.apply_links(topology, backend=backend)
    costs = resolve_costs(graph, linked, profiles=db)
    return CostTable(fwd_time=costs.fwd_time, bwd_time=costs.bwd_time, link_latency=costs.link_latency,
                     link_bandwidth=costs.link_bandwidth, source=costs.source,
                     graph_fingerprint=costs.graph_fingerprint, topology_name=costs.topology_name,
                     meta={**dict(costs.meta), "link_sources": dict(linked.meta.get("link_sources", {}))},
                     launch_overhead=costs.launch_overhead)


# Crossing cost of the one-thread executor (see the module docstring), in units of the GPU's measured autograd
# engine start (``bwd_call_overhead``). Fitted (MAPE over the 60 rows) on the H200 executor rows only:
# placement_rl/data/measured/nvidia_h200/executor, ``scripts/fidelity.py --replay <it> --fit-crossing``.
HOST_CROSSING_FACTOR = 1.80


@dataclass(frozen=True)
class Prediction:
    step_time: float  # simulated + shared-device transfers + optimizer
    simulated: float  # simulator step time on the physical topology (the host timeline when host_serial)
    shared_transfers: float  # seconds of transfers between logical devices on one torch device
    optimizer: float  # seconds of the optimizer step (slowest physical device; summed when host_serial)
    step_overhead: float  # measured whole step minus the sum of per-op times (largest over used devices)
    num_transfers: int  # cross-device transfers of the placement (logical devices)
    source: tuple[str, ...]  # cost source per physical device
    host_serial: bool = False  # a CPU and a CUDA device of one host both used: one host timeline (docstring)
    crossings: int = 0  # CPU<->GPU transfers, forward and gradient, charged crossing_cost each
    crossing_cost: float = 0.0  # seconds per crossing (HOST_CROSSING_FACTOR x the GPU's engine start)


def _transfers(graph: CompGraph, dev: np.ndarray) -> list[tuple[int, int, float]]:
    """One (source node, destination device, bytes) per value sent to another device (largest edge)."""
    out: dict[tuple[int, int], float] = {}
    for e, (s, d) in enumerate(graph.edges.tolist()):
        if dev[s] != dev[d]:
            key = (s, int(dev[d]))
            out[key] = max(out.get(key, 0.0), float(graph.edge_bytes[e]))
    return [(s, d, b) for (s, d), b in out.items()]


def _torch_type(td: str) -> str:
    return "cuda" if td.startswith("cuda") else td.split(":", 1)[0]


def mixes_host_cpu_and_cuda(topology: DeviceTopology, used: np.ndarray | list[int]) -> bool:
    """True when the devices ``used`` include a CPU and a CUDA device on one host (one executor thread)."""
    kinds: dict[int, set[str]] = {}
    for j in sorted(set(np.asarray(used).tolist())):
        d = topology.devices[int(j)]
        kinds.setdefault(d.host, set()).add(_torch_type(d.torch_device))
    return any({"cpu", "cuda"} <= k for k in kinds.values())


def gpu_crossing_cost(db: ProfileDB, gpu, factor: float = HOST_CROSSING_FACTOR) -> float:
    """Seconds one CPU<->GPU crossing costs the one-thread executor beyond the link fit: ``factor`` x the GPU's
    measured autograd engine start (``bwd_call_overhead``, recorded by ``profile_graph``)."""
    name = db.resolve_device(gpu)
    got = db.data["devices"].get(name, {}).get("bwd_call_overhead") if name is not None else None
    if got is None:
        raise ProfileError(f"profile {db.label} has no 'bwd_call_overhead' for device '{gpu.name}': profile a graph "
                           "there (profile_graph records it)")
    return factor * float(got)


def host_serial_step(graph: CompGraph, costs: CostTable, phys: DeviceTopology, pdev: np.ndarray,
                     crossing_cost: dict[int, float]) -> tuple[float, int, float]:
    """Forward + backward time of a placement on physical devices as one host thread runs it (module docstring).

    Every op's fwd + bwd on its device, plus each transfer (one per source value and destination device, the
    largest edge's bytes) at ``latency + bytes / bandwidth`` of the cost table's link, once forward and once
    more for its gradient when the value needs one, plus ``crossing_cost[gpu index]`` for each of those between
    a CPU and a CUDA device. Returns ``(seconds, crossings, seconds of crossing costs)``.
    """
    pdev = np.asarray(pdev, dtype=np.int64)
    idx = np.arange(graph.num_nodes)
    total = float(costs.fwd_time[idx, pdev].sum() + costs.bwd_time[idx, pdev].sum())
    need = needs_grad(graph)
    crossings, extra = 0, 0.0
    for s, d, nbytes in _transfers(graph, pdev):
        a, b = int(pdev[s]), int(d)
        passes = 2 if need[s] else 1
        total += passes * (float(costs.link_latency[a, b]) + nbytes / float(costs.link_bandwidth[a, b]))
        ta, tb = _torch_type(phys.devices[a].torch_device), _torch_type(phys.devices[b].torch_device)
        if {ta, tb} == {"cpu", "cuda"} and phys.devices[a].host == phys.devices[b].host:
            crossings += passes
            extra += passes * crossing_cost[a if ta == "cuda" else b]
    return total + extra, crossings, extra


def predict_step_time(graph: CompGraph, topology: DeviceTopology, placement: Placement | np.ndarray, db: ProfileDB,
                      *, costs: CostTable | None = None, optimizer: bool = True,
                      step_overhead: bool = True, crossing: bool = True,
                      crossing_factor: float = HOST_CROSSING_FACTOR) -> Prediction:
    """Predicted training-step time of ``placement`` as the local executor runs it (see module docstring).

    ``costs``: a cost table already resolved for the physical topology (``measured_costs(graph,
    physical_topology(topology)[0], db)``), to save resolving it per placement. ``crossing=False``: the
    simulator's free-running devices even where a CPU and a GPU of one host are both used (the model before
    the host timeline; ``scripts/fidelity.py --replay`` reproduces shipped predictions with it).
    """
    dev = np.asarray(placement.device_of_node if isinstance(placement, Placement) else placement, dtype=np.int64)
    phys, phys_of = physical_topology(topology)
    if costs is None:
        costs = measured_costs(graph, phys, db)
    pdev = phys_of[dev]
    host_serial = crossing and mixes_host_cpu_and_cuda(phys, pdev)
    crossings, per_crossing = 0, 0.0
    if host_serial:
        cost_of = {j: gpu_crossing_cost(db, d, crossing_factor) for j, d in enumerate(phys.devices)
                   if _torch_type(d.torch_device) == "cuda" and j in set(pdev.tolist())}
        sim, crossings, extra = host_serial_step(graph, costs, phys, pdev, cost_of)
        per_crossing = extra / crossings if crossings else 0.0
    else:
        sim = float(simulate(graph, costs, phys, Placement(pdev)).step_time)
    transfers = _transfers(graph, dev)
    shared = 0.0
    for s, d, nbytes in transfers:
        src, dst = topology.devices[int(dev[s])], topology.devices[d]
        if phys_of[int(dev[s])] != phys_of[d]:
            continue  # a real link: the simulator charged it
        fit = db.link(_torch_key(src.torch_device), _torch_key(dst.torch_device), "copy")
        if fit is None:
            raise ProfileError(f"profile {db.label} has no 'copy' link fit for {src.torch_device} -> "
                               f"{dst.torch_device}: run the link benchmarks (run_profile links=True)")
        shared += fit[0] + nbytes / fit[1]
    overhead = 0.0
    if step_overhead:
        for j in sorted(set(phys_of[dev].tolist())):
            name = db.resolve_device(phys.devices[j])
            step = db.step_time(graph, name) if name is not None else None
            times = db.node_times(graph, name) if name is not None else {}
            if step is not None and times:
                overhead = max(overhead, step - sum(v[0] + v[2] for v in times.values()))
    opt = 0.0
    if optimizer:
        total = float(graph.param_bytes.sum())
        per_phys = np.zeros(phys.num_devices)
        np.add.at(per_phys, phys_of[dev], graph.param_bytes)
        for j, d in enumerate(phys.devices):
            if per_phys[j] <= 0:
                continue
            name = db.resolve_device(d)
            got = db.optimizer_time(graph, name) if name is not None else None
            if got is None:
                raise ProfileError(f"profile {db.label} has no optimizer time for graph '{graph.name}' on device "
                                   f"'{d.name}': profile this graph there (profile_graph)")
            share = got[0] * per_phys[j] / max(total, 1.0)
            opt = opt + share if host_serial else max(opt, share)  # one thread steps each device in turn
    return Prediction(step_time=sim + shared + opt + overhead, simulated=sim, shared_transfers=shared,
                      optimizer=opt, step_overhead=overhead, num_transfers=len(transfers), source=costs.source,
                      host_serial=host_serial, crossings=crossings, crossing_cost=per_crossing)


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error of predictions, in percent of the measured values."""
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    return float(np.mean(np.abs(p - m) / m) * 100.0)


def spearman(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Spearman's rank correlation (nan when either side is constant)."""
    from scipy.stats import spearmanr

    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    if p.size < 2 or np.ptp(p) == 0 or np.ptp(m) == 0:
        return float("nan")
    return float(spearmanr(p, m).statistic)


def fidelity_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    return {"mape": mape(predicted, measured), "spearman": spearman(predicted, measured),
            "n": int(np.asarray(predicted).size)}


# ------------------------------------------------------------------ evaluation and report
@dataclass(frozen=True)
class FidelityRow:
    model: str
    placement: str
    devices_used: int
    transfers: int
    predicted: float
    measured: float
    simulated: float
    optimizer: float
    step_overhead: float = 0.0

    @property
    def error_pct(self) -> float:
        return (self.predicted - self.measured) / self.measured * 100.0


def evaluate_placements(module, inputs, graph: CompGraph, topology: DeviceTopology,
                        placements: dict[str, np.ndarray], db: ProfileDB, *, model: str, steps: int = 5,
                        warmup: int = 2, clock: str = "wall") -> list[FidelityRow]:
    """Predict and measure (``run_placement``) every named placement of one model."""
    from placement_rl.executor.local import run_placement
    from placement_rl.profiling.program import export_program

    phys, _ = physical_topology(topology)
    costs = measured_costs(graph, phys, db)
    program = export_program(module, inputs)
    rows = []
    for label, dev in placements.items():
        pred = predict_step_time(graph, topology, dev, db, costs=costs)
        res = run_placement(module, inputs, graph, dev, topology, steps=steps, warmup=warmup, program=program,
                            clock=clock)
        rows.append(FidelityRow(model=model, placement=label, devices_used=int(len(set(np.asarray(dev).tolist()))),
                                transfers=pred.num_transfers, predicted=pred.step_time,
                                measured=res.median_step_time, simulated=pred.simulated, optimizer=pred.optimizer,
                                step_overhead=pred.step_overhead))
    return rows


def summarize(rows: list[FidelityRow]) -> dict[str, dict[str, float]]:
    """Fidelity stats per model and pooled over all rows (key ``all``)."""
    out: dict[str, dict[str, float]] = {}
    for m in dict.fromkeys(r.model for r in rows):
        sel = [r for r in rows if r.model == m]
        out[m] = fidelity_stats(np.array([r.predicted for r in sel]), np.array([r.measured for r in sel]))
    out["all"] = fidelity_stats(np.array([r.predicted for r in rows]), np.array([r.measured for r in rows]))
    return out


def write_report(rows: list[FidelityRow], out_dir, *, title: str, notes: str = "") -> dict[str, object]:
    """Write ``fidelity.csv``, ``fidelity.md`` (per-model and pooled MAPE/Spearman) and ``fidelity.png``."""
    import csv
    import io
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from placement_rl.graph.io import atomic_write_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "placement", "devices_used", "transfers", "predicted_s", "measured_s", "error_pct",
                "simulated_s", "optimizer_s", "step_overhead_s"])
    for r in rows:
        w.writerow([r.model, r.placement, r.devices_used, r.transfers, f"{r.predicted:.6g}", f"{r.measured:.6g}",
                    f"{r.error_pct:.2f}", f"{r.simulated:.6g}", f"{r.optimizer:.6g}", f"{r.step_overhead:.6g}"])
    atomic_write_text(out / "fidelity.csv", buf.getvalue())
    stats = summarize(rows)
    lines = [f"# {title}", "", notes, "", "| model | placements | MAPE % | Spearman |", "|---|---:|---:|---:|"]
    for m, s in stats.items():
        label = "**all (pooled)**" if m == "all" else m
        lines.append(f"| {label} | {s['n']} | {s['mape']:.1f} | {s['spearman']:.3f} |")
    lines += ["", "| model | placement | devices | transfers | predicted ms | measured ms | error % |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.placement} | {r.devices_used} | {r.transfers} | {r.predicted * 1e3:.2f} | "
                     f"{r.measured * 1e3:.2f} | {r.error_pct:+.1f} |")
    atomic_write_text(out / "fidelity.md", "\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 6))
    for m in dict.fromkeys(r.model for r in rows):
        sel = [r for r in rows if r.model == m]
        ax.scatter([r.measured * 1e3 for r in sel], [r.predicted * 1e3 for r in sel], label=m, s=18)
    lo = min(min(r.measured, r.predicted) for r in rows) * 1e3 * 0.8
    hi = max(max(r.measured, r.predicted) for r in rows) * 1e3 * 1.25
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured step time (ms)", ylabel="predicted step time (ms)",
           title=f"{title}\nMAPE {stats['all']['mape']:.1f}%, Spearman {stats['all']['spearman']:.3f}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = out / ".fidelity.png.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out / "fidelity.png")
    return stats
