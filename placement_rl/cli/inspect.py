"""``placement-rl inspect``: summarise a graph and write ``graph.json`` to the run directory."""

from __future__ import annotations

from collections import Counter

from omegaconf import DictConfig

from placement_rl.cli.common import build_graph, heartbeat, hydra_app, output_dir
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import member_graph


def _fmt(x: float, unit: str = "") -> str:
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f} {suffix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def summarize(graph: CompGraph, *, top: int = 8) -> str:
    """A human-readable summary: size, FLOPs, parameters, activation memory, edge traffic, the precision capture
    recorded (a graph with no ``meta["dtype"]`` or ``meta["param_dtype"]`` is fp32: no line), top op types. For a
    coarsened graph the traffic is given between its ops and between its groups, and the op types are its ops'
    (from the graph it was made from, ``meta["member_graph"]``; where it no longer keeps that, the groups', each
    counted as the type of its costliest op, and said so)."""
    t = graph.totals()
    groups = graph.num_nodes
    fine = member_graph(graph)  # (the graph of the ops, group of each op) of a coarsened graph, or None
    ops = sum(len(m) for m in graph.members) if graph.members is not None else graph.num_nodes
    lines = [
        f"graph {graph.name}  (fingerprint {graph.fingerprint()})",
        f"  ops {ops}   nodes/groups {groups}   edges {graph.num_edges}",
        f"  forward {_fmt(t['fwd_flops'], 'FLOP')}   backward {_fmt(t['bwd_flops'], 'FLOP')}",
        f"  parameters {_fmt(t['param_bytes'], 'B')}   activations kept for backward {_fmt(t['act_bytes'], 'B')}",
        f"  edge traffic {_traffic(graph, fine)}",
    ]
    if graph.meta.get("dtype") or graph.meta.get("param_dtype"):  # captured in half precision, or under autocast
        lines.append(_precision(graph))
    hf = graph.meta.get("hf")
    if isinstance(hf, dict) and hf.get("model_type"):  # graph=hf: what was built from the config
        size = hf.get("image_size")
        shape = (f"{hf.get('batch_size', '?')} images of {size} x {size}" if size else
                 f"{hf.get('batch_size', '?')} x {hf.get('seq_len', '?')} tokens")
        ops = [*graph.op_types, *(m for grp in graph.members or () for m in grp)]  # a coarsened graph's members
        attends = any(k in op for op in ops for k in ("softmax", "scaled_dot_product"))  # not a CNN's
        lines.append(f"  transformers {hf.get('class', hf['model_type'])} ({hf.get('task', '?')}): "
                     f"{_fmt(float(hf.get('params', 0)))} parameters, {shape}"
                     + (f", {hf.get('attention', 'eager')} attention" if attends else ""))
        if hf.get("unused_params"):
            lines.append(f"  text input only: {_fmt(float(hf['unused_params']))} parameters of its vision / audio "
                         "towers take no part in the step and are not in the graph")
    by, unit = (graph, "nodes") if graph.members is None else (fine[0], "ops") if fine else (graph, "groups")
    lines.append({"nodes": "  top op types (by forward FLOPs):",
                  "ops": f"  top op types of the {by.num_nodes} ops (by forward FLOPs):",
                  "groups": "  top op types of the groups (each counted as its costliest op's type; by forward "
                            "FLOPs):"}[unit])
    flops: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for op, f in zip(by.op_types, by.fwd_flops.tolist()):
        flops[op] += f
        count[op] += 1
    total = max(float(by.fwd_flops.sum()), 1.0)
    for op, f in flops.most_common(top):
        lines.append(f"    {op:<28} {count[op]:>5} {unit:<6} {100 * f / total:6.2f}% of FLOPs")
    return "\n".join(lines)


def _precision(graph: CompGraph) -> str:
    """The dtype capture recorded (``meta["dtype"]``: the ops' outputs; ``meta["param_dtype"]`` where the
    parameters differ) and what the calibrated GPU model runs it in (``cost.resolve``): a half-precision graph in
    its dtype on a GPU with that tensor-core peak, else fp32, unless the topology's ``dtype:`` names one."""
    dtype, params = graph.meta.get("dtype"), graph.meta.get("param_dtype")
    line = f"  precision {dtype} (meta.dtype)" if dtype else "  precision fp32 (no meta.dtype)"
    line += f", parameters {params} (meta.param_dtype)" if params else ""
    if dtype in ("bf16", "fp16"):
        return line + (f"\n    the calibrated GPU model runs it in {dtype} where the GPU has a {dtype} peak, else fp32 "
                       "(a topology's dtype: decides)")
    if dtype == "fp64":
        return line + ("\n    the calibrated GPU model runs it in fp64 at a GPU's peak_flops_fp64, else at its FP32 "
                       "peak (optimistic; a topology's dtype: decides)")
    return line + "\n    the calibrated GPU model runs it in fp32 (a topology's dtype: tf32 / bf16 / fp16 decides)"


def _traffic(graph: CompGraph, fine) -> str:
    """The bytes the edges carry: of the graph, or of a coarsened graph's ops and between its groups (the edges
    inside a group vanish, and a tensor one group sends to another counts once)."""
    between = _fmt(float(graph.edge_bytes.sum()), "B")
    if graph.members is None:
        return between
    ops = f"{_fmt(float(fine[0].edge_bytes.sum()), 'B')} between the ops, " if fine else ""
    return f"{ops}{between} between the {graph.num_nodes} groups"


PROGRESS_EVERY = 10.0  # seconds between the lines that say a graph is still being built


def _building(gcfg: DictConfig) -> tuple[str, str]:
    """(what is built, what building it does) for the lines printed while a slow graph is built."""
    if gcfg.get("path"):
        what, work = f"graph {gcfg.path}", "reading"
    elif gcfg.get("source", "zoo") == "synthetic":
        what, work = f"synthetic {gcfg.get('family')} graph", "sampling"
    elif gcfg.get("source", "zoo") == "hf":
        what, work = f"transformers model {gcfg.get('config') or gcfg.get('model_type')}", "capture"
    else:
        what, work = f"zoo model {gcfg.get('name')}", "capture"
    coarsen = gcfg.get("coarsen") or {}
    return what, work + (" and coarsening" if coarsen.get("enabled", False) else "") + " running"


def run(cfg: DictConfig) -> CompGraph:
    what, work = _building(cfg.graph)
    with heartbeat(what, lambda: work, PROGRESS_EVERY):  # a large model's capture takes minutes
        graph = build_graph(cfg.graph)
    print(summarize(graph))
    out = output_dir() / "graph.json"
    graph.to_json(out)
    print(f"wrote {out}")
    return graph


main = hydra_app("inspect", writes=("graph.json",))(run)
