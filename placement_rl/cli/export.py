"""``placement-rl export plan.json --to torchtitan|megatron``: a stage plan as torchtitan's job config or
Megatron-LM's arguments (``placement_rl.export``; docs/export.md).

A file conversion with no experiment to configure, so plain flags rather than Hydra overrides:
``--graph`` (default: ``graph.json`` beside the plan), ``--topology`` (default: the preset the plan names, needed
only to read its device names and to price a training step the plan does not carry: a snapped plan, one planned
for inference or made to recompute uniformly), ``--out`` (default: stdout; written whole or not at
all, refused before any work when it cannot be written), ``--snap`` (move a module the plan splits between stages
whole to the stage holding most of its FLOPs), ``--uniform-recompute`` (a plan whose stages recompute differently,
which both trainers cannot run as planned, is refused unless given: then every stage recomputes as much as the most
recomputing one, and the header prices that). Bad input: one line, exit 2. Notes on what the target trainer will
not see as planned (``# note:`` lines of the output) also go to stderr when the output goes to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from placement_rl.errors import PlacementRLError


def parser() -> argparse.ArgumentParser:
    from placement_rl.export import FORMATS

    from placement_rl.cli.args import OneLineParser

    p = OneLineParser(prog="placement-rl export", description=__doc__.split("\n\n")[0],
                      usage_line="placement-rl export PLAN --to torchtitan|megatron")
    p.add_argument("plan", help="plan.json (a stage plan written by place / train / evaluate)")
    p.add_argument("--to", required=True, choices=FORMATS, help="target trainer")
    p.add_argument("--graph", help="the plan's graph JSON (default: graph.json beside the plan)")
    p.add_argument("--topology", help="topology preset or YAML (default: the one the plan names)")
    p.add_argument("--out", help="output file (default: stdout)")
    p.add_argument("--snap", action="store_true", help="move modules split between stages to their main stage")
    p.add_argument("--uniform-recompute", action="store_true",
                   help="stages that recompute differently: recompute in every stage as the most recomputing one does")
    return p


def run(args: argparse.Namespace) -> str:
    from placement_rl.cli.args import check_output_file
    from placement_rl.export import export_plan
    from placement_rl.graph.ir import CompGraph
    from placement_rl.graph.io import atomic_write_text
    from placement_rl.plan_files import read_plan_file
    from placement_rl.plans import STAGE_PLAN_SCHEMA, StagePlan
    from placement_rl.topology import load_topology

    check_output_file(args.out, "--out")
    path = Path(args.plan)
    data = read_plan_file(path)
    if data.get("schema") != STAGE_PLAN_SCHEMA:
        raise PlacementRLError(f"{path} is not a stage plan (schema '{STAGE_PLAN_SCHEMA}'); export takes a pipeline "
                               "plan.json, not an op-level placement")
    gpath = Path(args.graph) if args.graph else path.parent / "graph.json"
    if not gpath.is_file():
        raise PlacementRLError(f"graph file {gpath} does not exist: pass the plan's graph with --graph")
    graph = CompGraph.from_json(gpath)
    topo_name = args.topology or data.get("topology")
    try:
        topology = load_topology(topo_name) if topo_name else None
    except PlacementRLError:
        if args.topology:
            raise
        raise PlacementRLError(f"{path} was planned on topology '{topo_name}', which is not a preset: pass its YAML "
                               "with --topology <file>") from None
    plan = StagePlan.from_json(path, topology=topology, graph=graph)
    text = export_plan(plan, graph, args.to, snap=args.snap, topology=topology, uniform=args.uniform_recompute)
    if args.out:
        try:
            atomic_write_text(args.out, text)
        except OSError as exc:  # checked up front; this is what changed since (a full disk, a folder removed)
            raise PlacementRLError(f"--out {args.out} cannot be written ({exc.strerror or exc})") from None
    return text


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = run(args)
    except PlacementRLError as exc:
        from placement_rl.cli.common import fail

        fail(str(exc))
        return
    if args.out:
        for line in text.splitlines():
            if line.startswith("# note:"):
                print(line[2:], file=sys.stderr)
        print(f"wrote {args.out} ({args.to})")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
