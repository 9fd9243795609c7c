"""``placement-rl maxload INSTANCE.json``: the max-load (time per sample) split of a layer or operator graph in the
format of Tarnawski et al. (NeurIPS 2020, msr-fiddle/dnn-partitioning) over its accelerators and CPU cores
(``placement_rl.baselines.maxload``; docs/maxload.md).

Prints the instance, the best contiguous split (a dynamic program over every ideal: optimal when it says so), the
best split of any shape (local search, then CP-SAT where OR-Tools is installed) and a lower bound on every split.
Plain flags: ``--out`` (write the best split in the solvers' JSON format, whole or not at all), ``--contiguous``
(write the contiguous one instead), ``--seconds`` (for the search after the dynamic program, whose own time comes
on top; 0: none), ``--ideals`` (how many ideals the dynamic program may enumerate), ``--split FILE`` (score a given
split instead, e.g. a published one), ``--topology T`` (INSTANCE is one of the project's graph JSON files: make the
instance on topology ``T``, ``--write-instance FILE`` keeps it), ``--objective latency`` (one sample's time through
an inference graph instead: ``baselines.maxload_latency``). Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from placement_rl.cli.args import check_output_file
from placement_rl.errors import PlacementRLError

USAGE = ("placement-rl maxload INSTANCE.json [--out FILE] [--contiguous] [--seconds S] [--ideals N] [--split FILE] "
         "[--objective maxload|latency] [--topology T [--write-instance FILE]]")


MAX_SECONDS = 1e6  # about 11.6 days: a larger --seconds is a typo, not a plan


def parser() -> argparse.ArgumentParser:
    from placement_rl.baselines.maxload_dp import IDEAL_LIMIT

    from placement_rl.cli.args import OneLineParser

    p = OneLineParser(prog="placement-rl maxload", description=__doc__.split("\n\n")[0], usage_line=USAGE)
    p.add_argument("instance", help="instance JSON (maxSizePerFPGA, maxFPGAs, maxCPUs, nodes, edges)")
    p.add_argument("--out", help="write the split here (JSON: maxLoad, fpgas, cpus as {load, nodes})")
    p.add_argument("--contiguous", action="store_true", help="write the best contiguous split, not the best one")
    p.add_argument("--seconds", type=float, default=10.0,
                   help=f"search after the dynamic program (default 10; 0: none; at most {MAX_SECONDS:.0f})")
    p.add_argument("--ideals", type=int, default=IDEAL_LIMIT,
                   help=f"most ideals the dynamic program enumerates (default {IDEAL_LIMIT})")
    p.add_argument("--split", help="score this split file (the solvers' output format) instead of solving")
    p.add_argument("--objective", choices=("maxload", "latency"), default="maxload",
                   help="maxload: time per sample of the pipeline (default); latency: one sample's time through "
                        "an inference graph (the paper's latency program; CPUs as many as needed)")
    p.add_argument("--topology", help="read INSTANCE as one of the project's graph JSON files (graph.json) and "
                   "make the instance from it on this topology preset or YAML (its GPUs the accelerators)")
    p.add_argument("--write-instance", help="with --topology: write the instance made here too")
    return p


def _from_graph(args: argparse.Namespace):
    """The instance made from a project graph on ``--topology`` (also written to ``--write-instance``)."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from placement_rl.baselines.maxload_instances import instance_from_graph
    from placement_rl.cost.resolve import resolve_costs
    from placement_rl.graph.files import atomic_write_text
    from placement_rl.graph.ir import CompGraph
    from placement_rl.graph.maxload_file import read_instance
    from placement_rl.topology import load_topology

    try:
        graph = CompGraph.from_json(args.instance)
    except PlacementRLError as exc:
        raise PlacementRLError(f"{exc} (with --topology, INSTANCE is a graph.json as `placement-rl inspect` writes "
                               "it; leave --topology out to read a max-load instance)") from None
    topology = load_topology(args.topology)
    costs = resolve_costs(graph, topology)
    if args.objective == "latency":
        from placement_rl.cost.modes import inference_costs

        costs = inference_costs(costs)
    data = json.dumps(instance_from_graph(graph, costs, topology)) + "\n"
    if args.write_instance:
        atomic_write_text(args.write_instance, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "instance.json"
        path.write_text(data)
        inst = read_instance(path)
    return dataclasses.replace(inst, path=f"{args.instance} on {topology.name}")


# the bound ``baselines.maxload.lower_bound`` computes with no search; ``solve`` may raise it with CP-SAT's
SIMPLE_BOUND = "the simple bound (the largest colour class on its cheapest device, or all work over all devices)"


def _as_given(x: float) -> str:
    """A number in its shortest exact spelling, less a trailing ``.0`` (``1000001``, where ``:g`` rounds it to
    ``1e+06``, the limit itself)."""
    text = repr(x)
    return text[:-2] if text.endswith(".0") else text


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


LOADS_SHOWN = 16  # the most loads of one kind printed one by one; past it, those not at 0 (or their range)


def _loads_line(inst, loads) -> str:
    parts = []
    for label, part in (("accelerators", loads[:inst.accelerators]), ("CPU cores", loads[inst.accelerators:])):
        busy = part[part != 0]
        if not len(part):
            continue
        if len(part) <= LOADS_SHOWN:
            parts.append(f"{label} [" + ", ".join(f"{x:.6g}" for x in part) + "]")
        elif (part == part[0]).all():
            parts.append(f"{len(part)} {label}: all at {part[0]:.6g}")
        else:
            zeros = len(part) - len(busy)
            head = f"{len(part)} {label}: " + (f"{zeros} at 0, the others " if zeros else "")
            parts.append(head + ("[" + ", ".join(f"{x:.6g}" for x in busy) + "]" if len(busy) <= LOADS_SHOWN else
                                 f"from {busy.min():.6g} to {busy.max():.6g}"))
    return ", ".join(parts)


def _gap(best: float, bound: float) -> str:
    return f"gap {best / bound - 1:.2%}" if bound > 0 else "no bound above 0"


def run(args: argparse.Namespace) -> list[str]:
    from placement_rl.baselines.maxload import Split, evaluate, lower_bound, split_json
    from placement_rl.baselines.maxload_blocks import blocks_of
    from placement_rl.baselines.maxload_solve import solve
    from placement_rl.graph.files import atomic_write_text
    from placement_rl.graph.maxload_file import read_instance, read_split

    t0 = time.perf_counter()
    if not (math.isfinite(args.seconds) and 0 <= args.seconds <= MAX_SECONDS):
        raise PlacementRLError(f"--seconds must be a finite number from 0 (no search) to {MAX_SECONDS:.0f} "
                               f"(got {_as_given(args.seconds)})")
    if args.ideals < 2:
        raise PlacementRLError(f"--ideals must be at least 2 (got {args.ideals})")
    if args.write_instance and not args.topology:
        raise PlacementRLError("--write-instance needs --topology (it writes the instance made from a graph)")
    check_output_file(args.out, "--out")
    check_output_file(args.write_instance, "--write-instance")
    inst = _from_graph(args) if args.topology else read_instance(args.instance)
    lines = [f"instance: {inst.describe()}"]
    if args.write_instance:
        lines.append(f"wrote the instance to {args.write_instance}")
    if args.objective == "latency":
        return lines + _latency(args, inst, t0)
    if args.split:
        device = read_split(args.split, inst)
        loads, broken = evaluate(inst, device)
        lines.append(f"split {args.split}: max-load {loads.max():.6g} ({_loads_line(inst, loads)})")
        bound = lower_bound(inst, blocks_of(inst, contiguous=False))
        lines.append(f"lower bound: {bound:.6g} (any split that breaks nothing: {SIMPLE_BOUND}; solving, without "
                     "--split, may prove a tighter one with CP-SAT)" if np.isfinite(bound) else
                     "lower bound: none (no split fits the instance without breaking a constraint)")
        lines += [f"warning: the split breaks a constraint: {b}" for b in broken]
        if args.out:
            split = Split(device, loads, float(loads.max()), f"given ({args.split})", None)  # not compared
            data = {**split_json(inst, split), "breaks": broken,
                    "lower_bound": bound if np.isfinite(bound) else None, "instance": inst.path,
                    "seconds": time.perf_counter() - t0}
            atomic_write_text(args.out, json.dumps(data, indent=1) + "\n")
            lines.append(f"wrote {args.out}")
        return lines
    res = solve(inst, ideal_limit=args.ideals, seconds=args.seconds, progress=_say)
    lines.append(f"blocks: {res.blocks[0]} for contiguous splits (colour classes; classes on a cycle of the forward "
                 f"graph merged), {res.blocks[1]} for splits of any shape")
    dp, best = res.contiguous, res.best
    if dp is None:
        lines.append("contiguous split: none fits")
    else:
        how = (f"all {dp.stats['ideals']:.0f} ideals" if dp.contiguous_optimum else
               f"{dp.stats['ideals']:.0f} ideals, not proven optimal")
        lines.append(f"contiguous split (dynamic program over {how}, {dp.stats['ideal_pairs']:.0f} pairs, "
                     f"{dp.stats['seconds']:.2f} s): max-load {dp.max_load:.6g} ({_loads_line(inst, dp.loads)})")
    notes = (dp.notes if dp else []) + res.notes
    lines += [f"note: {n}" for n in notes]
    if best is not dp:
        versus = f"{best.max_load / dp.max_load:.4f} x contiguous; " if dp is not None else ""
        lines.append(f"best split of any shape ({best.method}): max-load {best.max_load:.6g} "
                     f"({versus}{_loads_line(inst, best.loads)})")
    elif args.seconds > 0:
        lines.append(f"best split: the contiguous one (nothing of any shape beat it in {args.seconds:g} s)")
    else:
        lines.append("best split: the contiguous one (no search after the dynamic program: --seconds 0)")
    proof = "the best split is optimal" if res.optimal else _gap(best.max_load, res.lower_bound)
    simple = lower_bound(inst, blocks_of(inst, contiguous=False))
    how = (f"CP-SAT's bound; {SIMPLE_BOUND} is {simple:.6g}" if res.lower_bound > simple * (1 + 1e-9)
           else SIMPLE_BOUND)
    lines.append(f"lower bound: {res.lower_bound:.6g} (any split: {how}; {proof})")
    if args.out:
        if args.contiguous and dp is None:
            raise PlacementRLError("--contiguous: no contiguous split fits (leave it out to write the best split)")
        chosen = dp if args.contiguous else best
        data = {**split_json(inst, chosen), "notes": notes, "lower_bound": res.lower_bound,
                "optimal": res.optimal and chosen.max_load <= best.max_load * (1 + 1e-12), "instance": inst.path,
                "seconds": time.perf_counter() - t0}
        atomic_write_text(args.out, json.dumps(data, indent=1) + "\n")
        lines.append(f"wrote {args.out}")
    else:
        lines.append("(pass --out FILE to write the split)")
    return lines


def _latency(args: argparse.Namespace, inst, t0: float) -> list[str]:
    """The latency objective: score ``--split`` or solve (``baselines.maxload_latency``); ``t0``: when the run
    started (the written file's ``seconds``)."""
    import dataclasses

    from placement_rl.baselines.maxload import evaluate
    from placement_rl.baselines.maxload_latency import check_inference, latency_of, solve_latency
    from placement_rl.graph.files import atomic_write_text
    from placement_rl.graph.maxload_file import read_split

    if args.contiguous:
        raise PlacementRLError("--contiguous is for --objective maxload (the latency program's subgraphs are "
                               "contiguous already)")
    check_inference(inst)
    na = inst.accelerators

    def write(device, value, extra):
        groups = [sorted(inst.ids[v] for v in np.flatnonzero(device == d)) for d in range(na)]
        cpu = sorted(inst.ids[v] for v in np.flatnonzero(device >= na))
        data = {"totalLatency": value if np.isfinite(value) else None, "fpgas": [{"nodes": g} for g in groups if g],
                "cpus": [{"nodes": cpu}], **extra, "instance": inst.path, "seconds": time.perf_counter() - t0}
        atomic_write_text(args.out, json.dumps(data, indent=1) + "\n")
        return f"wrote {args.out}"

    if args.split:
        device = read_split(args.split, inst, pooled_cpus=True)
        value = latency_of(inst, device)
        # the latency program pools as many CPU cores as it needs: score the constraints with one pool
        broken = evaluate(dataclasses.replace(inst, cpus=max(inst.cpus, 1)), np.minimum(device, na))[1]
        lines = [f"split {args.split}: " + (f"latency {value:.6g}" if np.isfinite(value) else
                                            "no latency (its subgraphs feed each other in a cycle)")]
        lines += [f"warning: the split breaks a constraint: {b}" for b in broken]
        if args.out:
            lines.append(write(device, value, {"method": f"given ({args.split})", "breaks": broken, "notes": []}))
        return lines
    res = solve_latency(inst, seconds=args.seconds, ideal_limit=args.ideals, progress=_say)
    names = {"all_cpu": "every node on a CPU", "maxload_split": "the max-load dynamic program's split",
             "local_search": "local search from the better of those", "cp_sat": "CP-SAT from the best so far"}
    prefix = {"all_cpu": "every node", "maxload_split": "the max-load", "local_search": "local search",
              "cp_sat": "CP-SAT"}
    lines = []
    for key, value in res.candidates.items():
        if value is None:
            why = next((n for n in res.notes if n.startswith(prefix[key])), None)
            lines.append(f"{names[key]}: " + (why.split(": ", 1)[-1] if why else "none found"))
        else:
            lines.append(f"{names[key]}: " + (f"latency {value:.6g}" if np.isfinite(value) else "no latency"))
    proof = "optimal" if res.optimal else _gap(res.latency, res.bound)
    lines.append(f"best: {names[res.method]}, latency {res.latency:.6g}; lower bound {res.bound:.6g} ({proof})")
    if args.out:
        lines.append(write(res.device, res.latency, {"method": res.method, "lower_bound": res.bound,
                                                     "optimal": res.optimal, "notes": res.notes}))
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        lines = run(args)
    except (PlacementRLError, OSError) as exc:
        from placement_rl.cli.common import fail

        fail(str(exc))
        return
    print("\n".join(lines))


if __name__ == "__main__":
    main()
