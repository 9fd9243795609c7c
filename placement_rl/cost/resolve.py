"""``resolve_costs``: per-node, per-device fwd/bwd times and link arrays for one (graph, topology).

Roofline estimate (used for every device that no profile covers)::

    bytes_moved[v] = out_bytes[v] + sum(edge_bytes of v's input edges) + param_bytes[v]
    fwd[v, d] = max(fwd_flops[v] / peak_flops[d], bytes_moved[v] / mem_bandwidth[d]) + overhead[v, d]
    bwd[v, d] = max(bwd_flops[v] / peak_flops[d], 2 * bytes_moved[v] / mem_bandwidth[d]) + overhead[v, d]
    overhead[v, d] = launch_overhead[d] * ops_in_node[v]   (len(members[v]) for coarsened groups, else 1)

Backward moves about twice the bytes (it reads the output gradient and the saved activations and writes
the input and parameter gradients). A node whose output needs no gradient (no parameters on it or on any
ancestor, and no ``bwd_flops`` on it or any ancestor: e.g. a data input) has no backward: ``bwd = 0``.

GPU devices use the calibrated model by default (``placement_rl.cost.calibrated``: per op class, fitted on
public GPU measurements, a function of op features and the GPU's datasheet), labelled ``calibrated:<fit>``
(plus ``:<dtype>`` for tf32 / bf16 / fp16); ``gpu_model="roofline"`` (or ``cost_model: roofline`` in the
topology YAML) keeps the plain roofline above. CPU devices always use the roofline.

Measured sources plug in through the ``CostSource`` protocol: any object with
``lookup(graph, device) -> (fwd [N], bwd [N], label) | None``; a device it answers for is labelled
``measured:<label>``, every other device ``calibrated:<fit>`` or ``roofline``.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

import placement_rl.cost.calibrated as cal
from placement_rl.cost.grad import needs_grad
from placement_rl.cost.types import CostTable
from placement_rl.datasheets import lookup
from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import member_graph
from placement_rl.topology import Device, DeviceTopology


@runtime_checkable
class CostSource(Protocol):
    """A source of measured per-node times (a ProfileDB implements it)."""

    def lookup(self, graph: CompGraph, device: Device) -> tuple[np.ndarray, np.ndarray, str] | None:
        """``(fwd_time [N], bwd_time [N], label)`` in seconds for ``graph`` on ``device``, or None."""
        ...


def ops_in_node(graph: CompGraph) -> np.ndarray:
    """Number of original ops each node stands for (group size after coarsening, else 1)."""
    if graph.members is None:
        return np.ones(graph.num_nodes, dtype=np.float64)
    return np.array([max(len(m), 1) for m in graph.members], dtype=np.float64)


def bytes_moved(graph: CompGraph) -> np.ndarray:
    """Forward memory traffic per node: output + inputs (edge bytes) + parameters."""
    inputs = np.zeros(graph.num_nodes, dtype=np.float64)
    if graph.num_edges:
        np.add.at(inputs, graph.edges[:, 1], graph.edge_bytes)
    return graph.out_bytes + inputs + graph.param_bytes


def roofline_times(graph: CompGraph, device: Device) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fwd [N], bwd [N], overhead [N])`` of every node on ``device`` by the roofline model."""
    moved = bytes_moved(graph)
    overhead = device.launch_overhead * ops_in_node(graph)
    fwd = np.maximum(graph.fwd_flops / device.peak_flops, moved / device.mem_bandwidth) + overhead
    bwd = np.maximum(graph.bwd_flops / device.peak_flops, 2.0 * moved / device.mem_bandwidth) + overhead
    bwd = np.where(needs_grad(graph), bwd, 0.0)
    return fwd, bwd, overhead


def _measured(source: CostSource, graph: CompGraph, device: Device) -> tuple[np.ndarray, np.ndarray, str] | None:
    got = source.lookup(graph, device)
    if got is None:
        return None
    try:
        fwd, bwd, label = got
        fwd = np.asarray(fwd, dtype=np.float64).reshape(-1)
        bwd = np.asarray(bwd, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ProfileError(f"profile lookup for device '{device.name}' must return (fwd[N], bwd[N], label) "
                           "or None") from None
    n = graph.num_nodes
    for what, arr in (("fwd", fwd), ("bwd", bwd)):
        if arr.shape != (n,):
            raise ProfileError(f"profile '{label}' gives {arr.shape[0]} {what} times for device '{device.name}' "
                               f"but graph '{graph.name}' has {n} nodes: re-profile this graph")
        if not np.all(np.isfinite(arr) & (arr >= 0)):
            raise ProfileError(f"profile '{label}' has a negative or non-finite {what} time for device "
                               f"'{device.name}': re-profile it")
    return fwd, bwd, str(label)


GPU_MODELS = ("calibrated", "roofline")


def _estimator(graph: CompGraph, topology: DeviceTopology, gpu_model: str | None,
               precision: tuple[str | None, str | None] | None = None):
    """``estimate(device) -> (fwd, bwd, overhead, label)``: the calibrated model for GPUs, else the roofline. A
    coarsened group is priced as the sum of its members on the graph it was made from, where the coarse graph
    carries it (``placement_rl.graph.members``): priced as one op of its dominant member's class with the
    members' summed FLOPs and bytes, a transformer block's group came out 1.2-1.6x its members' sum on a GPU.

    The run's dtype is the topology's ``dtype``; where it names none, the graph's (``meta["dtype"]``, what capture
    saw: a model captured in bf16 runs in bf16 on a GPU with a bf16 peak, one in fp16 in fp16 on a GPU with an fp16
    or bf16 peak (the V100's and T4's FP16 tensor cores), each in fp32 on a GPU without; one in fp64 in fp64, at the
    GPU's ``peak_flops_fp64`` or, where it gives none, its FP32 peak with a warning that this is optimistic; a
    topology ``dtype`` that overrides the graph's is said once); the roofline ignores the dtype;
    ``precision``: the graph's ``(dtype, param_dtype)`` (default: its meta's), kept for the graph of its members."""
    precision = precision or (graph.meta.get("dtype"), graph.meta.get("param_dtype"))
    captured = precision[0]
    fine = member_graph(graph)
    if fine is not None:
        inner, gof, n = _estimator(fine[0], topology, gpu_model, precision), fine[1], graph.num_nodes

        def estimate_groups(dev: Device) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
            f, b, o, label = inner(dev)
            return (np.bincount(gof, weights=f, minlength=n), np.bincount(gof, weights=b, minlength=n),
                    np.bincount(gof, weights=o, minlength=n), label)

        return estimate_groups
    model = gpu_model if gpu_model is not None else str(topology.meta.get("cost_model", "calibrated"))
    if model not in GPU_MODELS:
        raise ProfileError(f"unknown GPU cost model '{model}' (valid: {', '.join(GPU_MODELS)})")
    given = topology.meta.get("dtype")
    dtype = str(given) if given is not None else (str(captured) if captured in ("bf16", "fp16", "fp64") else "fp32")
    if given is not None and captured not in (None, given) and model == "calibrated":
        _say_once(f"topology '{topology.name}' says dtype {given}: graph '{graph.name}', captured in {captured}, is "
                  f"priced in {given}")
    fit = cal.shipped_fit() if model == "calibrated" else None
    lacking = [d.name for d in topology.devices if d.kind == "gpu" and not d.peak_flops_fp64]
    if dtype == "fp64" and fit is not None and lacking:
        _say_once(f"graph '{graph.name}' runs in fp64 and topology '{topology.name}' gives no 'peak_flops_fp64' for "
                  f"{', '.join(lacking[:4])}{' ...' if len(lacking) > 4 else ''}: their GEMMs are priced at the FP32 "
                  "peak, optimistic (most GPUs run FP64 at 1/32-1/64 of it, the V100 / A100 / H100 at 1/2 or "
                  "with FP64 tensor cores): give the devices' peak_flops_fp64")
    feat: list = []
    memo: dict[tuple, tuple] = {}

    def estimate(dev: Device) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        if fit is None or dev.kind != "gpu":
            f, b, o = roofline_times(graph, dev)
            return f, b, o, "roofline"
        tensor = {"tf32": dev.peak_flops_tf32, "bf16": dev.peak_flops_bf16,
                  "fp16": dev.peak_flops_fp16 or dev.peak_flops_bf16, "fp64": dev.peak_flops_fp64}.get(dtype, 0.0)
        run = dtype
        if dtype not in ("fp32", "fp64") and not tensor:
            if given is not None:
                raise ProfileError(_no_peak(dev, dtype))
            run = "fp32"  # a half-precision capture on a GPU with no bf16 peak: its fp32 peak, fp32 bytes
        key = (dev.peak_flops, dev.mem_bandwidth, dev.sm_count, dev.l2_bytes, tensor, run,
               cal.datasheet(str(dev.model or dev.name)))
        if key not in memo:
            if not feat:
                feat.append(cal.features(graph, *precision))
            spec = cal.spec_of_device(dev)  # datasheet figures + architecture from the model name
            memo[key] = cal.node_times(feat[0], spec, fit, dtype=run, tensor_peak=tensor or None)
        f, b, o = memo[key]
        label = f"calibrated:{fit.name}" + ("" if run == "fp32" else f":{run}")
        return f, b, o, label

    return estimate


_SAID: set[str] = set()


def _say_once(text: str) -> None:
    """A warning line, once per process and text."""
    if text not in _SAID:
        _SAID.add(text)
        logging.getLogger(__name__).warning(text)


def _no_peak(dev: Device, dtype: str) -> str:
    """The one line for a topology ``dtype`` a GPU has no peak for: a product whose datasheet has none lacks those
    tensor cores (a V100 has no BF16 / TF32 ones); else the figure to give."""
    sheet = lookup(str(dev.model or dev.name))
    if sheet is not None and not getattr(sheet, f"peak_flops_{dtype}", 0.0):
        other = [d for d in ("fp16", "bf16", "tf32") if getattr(sheet, f"peak_flops_{d}", 0.0)]
        return (f"dtype '{dtype}': device '{dev.name}' ({sheet.product}) has no {dtype.upper()} tensor cores: use "
                f"dtype {' or '.join(other + ['fp32'])}")
    return (f"dtype '{dtype}' needs device '{dev.name}' to give a positive 'peak_flops_{dtype}' (in its device "
            f"entry: one at the topology's top level applies to every device, replacing their datasheet figures)")


def resolve_costs(graph: CompGraph, topology: DeviceTopology,
                  profiles: CostSource | Sequence[CostSource] | None = None, *,
                  gpu_model: str | None = None) -> CostTable:
    """Per-node fwd/bwd time on every device plus link latency/bandwidth, with the source of each device.

    ``profiles``: None (estimates everywhere), a ``CostSource`` or a sequence of them (first answer wins).
    ``gpu_model``: ``calibrated`` or ``roofline`` for GPUs no profile covers (default: the topology's
    ``cost_model``, else ``calibrated``).
    """
    if profiles is None:
        sources: list[CostSource] = []
    elif isinstance(profiles, CostSource):
        sources = [profiles]
    else:
        sources = list(profiles)
        for s in sources:
            if not isinstance(s, CostSource):
                raise ProfileError(f"profiles must provide lookup(graph, device); got {type(s).__name__}")
    n, d = graph.num_nodes, topology.num_devices
    fwd = np.zeros((n, d))
    bwd = np.zeros((n, d))
    overhead = np.zeros((n, d))
    labels: list[str] = []
    estimate = _estimator(graph, topology, gpu_model)
    for j, dev in enumerate(topology.devices):
        label = ""
        got = None
        for src in sources:
            got = _measured(src, graph, dev)
            if got is not None:
                break
        f, b, o, label = estimate(dev)
        if got is not None:
            f, b, label = got[0], got[1], f"measured:{got[2]}"
            o = np.minimum(o, f)  # the fixed part can not exceed the measured time
        fwd[:, j], bwd[:, j], overhead[:, j] = f, b, o
        labels.append(label)
    return CostTable(fwd_time=fwd, bwd_time=bwd, link_latency=topology.link_latency,
                     link_bandwidth=topology.link_bandwidth, source=tuple(labels),
                     graph_fingerprint=graph.fingerprint(), topology_name=topology.name,
                     launch_overhead=overhead)
