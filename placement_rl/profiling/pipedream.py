"""Importer for PipeDream's public per-layer profiles (msr-fiddle/pipedream, MIT licence; SOSP 2019).

``<model>.graph.txt``: one line per PyTorch layer ``node<k> -- <layer repr> -- forward_compute_time=<ms>,
backward_compute_time=<ms>, activation_size=<bytes>, parameter_size=<bytes>`` and one line per edge
``\\tnode<a> -- node<b>``. The GPU is not named in the files (the paper's servers used V100s); the ``Input``
node includes data loading and is not a compute cost (its times are dropped). Any problem is a one-line
``ProfileError`` naming the file.

``pipedream_graph(profile)`` builds a ``CompGraph`` with FLOPs from the layer repr and the recorded sizes
(convolutions: ``2 * out_elems * in_channels * kh * kw / groups``; linear: ``2 * out_elems * in_features``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placement_rl.errors import ProfileError

_NODE = re.compile(r"^(?P<id>node\d+) -- (?P<desc>.*) -- forward_compute_time=(?P<f>[-0-9.eE+]+), "
                   r"backward_compute_time=(?P<b>[-0-9.eE+]+), activation_size=(?P<a>\[[^]]*\]|[-0-9.eE+]+), "
                   r"parameter_size=(?P<p>[-0-9.eE+]+)\s*$")
_EDGE = re.compile(r"^\s+(?P<a>node\d+) -- (?P<b>node\d+)\s*$")
_OPS = (("Conv2d", "conv2d"), ("BatchNorm", "batch_norm"), ("ReLU", "relu"), ("MaxPool", "max_pool2d"),
        ("AvgPool", "avg_pool2d"), ("AdaptiveAvgPool", "adaptive_avg_pool2d"), ("Linear", "linear"),
        ("Dropout", "dropout"), ("Add", "add"), ("Concat", "cat"), ("Cat", "cat"), ("View", "view"),
        ("Size", "size"), ("Flatten", "flatten"), ("LSTM", "lstm"), ("Embedding", "embedding"),
        ("Softmax", "softmax"), ("LogSoftmax", "log_softmax"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"),
        ("Input", "input"), ("LRN", "local_response_norm"), ("LocalResponseNorm", "local_response_norm"))


@dataclass(frozen=True)
class Layer:
    node: str
    desc: str
    op_type: str
    fwd: float            # seconds
    bwd: float
    out_bytes: float
    param_bytes: float
    first_out_bytes: float = 0.0   # the first output (an LSTM also returns its states)


@dataclass(frozen=True)
class PipeDreamProfile:
    path: str
    model: str
    layers: tuple[Layer, ...]
    edges: tuple[tuple[str, str], ...]


def _op_type(desc: str) -> str:
    head = desc.split("(", 1)[0].strip()
    for prefix, op in sorted(_OPS, key=lambda x: -len(x[0])):
        if head.startswith(prefix):
            return op
    return head.lower() or "op"


def read_profile(path: str | Path) -> PipeDreamProfile:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"PipeDream profile '{p}' does not exist")
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{p}: cannot read ({exc.__class__.__name__}); expected a PipeDream graph.txt") from None
    layers, edges = [], []
    for k, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        m = _NODE.match(line)
        if m:
            try:
                first = float(m.group("a").strip("[]").split(";")[0])
                vals = [float(m.group("f")), float(m.group("b")),
                        sum(float(v) for v in m.group("a").strip("[]").split(";")), float(m.group("p"))]
            except ValueError:
                raise ProfileError(f"{p}: line {k}: activation_size is not a number or a [a; b] list") from None
            if not all(np.isfinite(v) and v >= 0 for v in vals):
                raise ProfileError(f"{p}: line {k}: times and sizes must be finite and non-negative")
            op = _op_type(m.group("desc"))
            f, b = (0.0, 0.0) if op == "input" else (vals[0] * 1e-3, vals[1] * 1e-3)
            layers.append(Layer(m.group("id"), m.group("desc"), op, f, b, vals[2], vals[3], first))
            continue
        e = _EDGE.match(line)
        if e:
            edges.append((e.group("a"), e.group("b")))
            continue
        raise ProfileError(f"{p}: line {k} is neither a layer nor an edge; expected a PipeDream graph.txt")
    if not layers:
        raise ProfileError(f"{p}: no layers; expected a PipeDream graph.txt")
    ids = {x.node for x in layers}
    for a, b in edges:
        if a not in ids or b not in ids:
            raise ProfileError(f"{p}: edge {a} -- {b} names an unknown node")
    return PipeDreamProfile(str(p), p.name.split(".")[0], tuple(layers), tuple(edges))


def _ints(desc: str) -> list[int]:
    """The integers of a layer repr's arguments (``Conv2d(64, 128, kernel_size=(3, 3))`` -> 64, 128, 3, 3)."""
    args = desc.split("(", 1)[1] if "(" in desc else ""
    return [int(x) for x in re.findall(r"\d+", args)]


def pipedream_graph(prof: PipeDreamProfile):
    """A ``CompGraph`` of the profile's layers (topological order), FLOPs from the layer repr and sizes."""
    import networkx as nx

    from placement_rl.graph.ir import CompGraph

    by_id = {x.node: x for x in prof.layers}
    g = nx.DiGraph()
    g.add_nodes_from(by_id)
    g.add_edges_from(prof.edges)
    if not nx.is_directed_acyclic_graph(g):
        raise ProfileError(f"{prof.path}: the layer graph has a cycle")
    order = list(nx.lexicographical_topological_sort(g, key=lambda n: int(n[4:])))
    index = {n: i for i, n in enumerate(order)}
    flops = []
    for n in order:
        x = by_id[n]
        out_el = x.out_bytes / 4.0
        nums = _ints(x.desc)
        f = 0.0
        if x.op_type == "conv2d" and len(nums) >= 4:
            cin, kh, kw = nums[0], nums[2], nums[3 if len(nums) > 3 else 2]
            grp = re.search(r"groups=(\d+)", x.desc)
            f = 2.0 * out_el * cin * kh * kw / (int(grp.group(1)) if grp else 1)
        elif x.op_type == "linear" and nums:
            f = 2.0 * out_el * nums[0]
        elif x.op_type == "lstm" and len(nums) >= 2:  # 4 gates x (input + hidden) x hidden per token
            f = 8.0 * (x.first_out_bytes / 4.0) * (nums[0] + nums[1])
        flops.append(f)
    layers = [by_id[n] for n in order]
    edges = [(index[a], index[b]) for a, b in prof.edges]
    return CompGraph(names=tuple(order), op_types=tuple(x.op_type for x in layers),
                     module_paths=tuple(f"{prof.model}.{x.node}" for x in layers), fwd_flops=flops,
                     bwd_flops=[2.0 * f for f in flops], out_bytes=[x.out_bytes for x in layers],
                     param_bytes=[x.param_bytes for x in layers], act_bytes=[x.out_bytes for x in layers],
                     edges=np.array(edges, dtype=np.int64).reshape(-1, 2),
                     edge_bytes=[by_id[a].out_bytes for a, _ in prof.edges], name=f"pipedream:{prof.model}",
                     meta={"source": "pipedream", "model": prof.model})


def measured_times(prof: PipeDreamProfile, graph) -> tuple[np.ndarray, np.ndarray]:
    by_id = {x.node: x for x in prof.layers}
    return (np.array([by_id[n].fwd for n in graph.names]), np.array([by_id[n].bwd for n in graph.names]))
