"""``placement-rl <subcommand> [hydra overrides]``: dispatch to one Hydra app per subcommand."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

# SIGTERM while a subcommand of ``SIGTERM_AS_INTERRUPT`` starts: Ctrl-C's path (``main``'s line, exit 130)
from placement_rl.cli.signals import sigterm_as_interrupt

# subcommand -> (module, one-line help). Only subcommands that exist are listed.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("placement_rl.cli.inspect", "summarise a graph (zoo model, JSON file or synthetic), write graph.json"),
    "evaluate": ("placement_rl.cli.evaluate", "compare every placer on a benchmark suite, one case, or a given plan"),
    "train": ("placement_rl.cli.train", "train a placement / pipeline policy (checkpoint, plan, metrics, comparison)"),
    "place": ("placement_rl.cli.place", "zero-shot placement of a graph with a trained policy checkpoint"),
    "profile": ("placement_rl.cli.profile", "measure per-node times and link speeds on local devices (ProfileDB)"),
    "deploy": ("placement_rl.cli.deploy", "run a plan.json (DP x PP on torch.distributed) or placement.json for real"),
    "export": ("placement_rl.cli.export", "write a plan.json as torchtitan's job config or Megatron-LM's arguments"),
    "maxload": ("placement_rl.cli.maxload", "max-load split of a graph in the dnn-partitioning JSON format"),
}

# subcommands that answer SIGTERM as Ctrl-C (``hydra_app(sigterm=True)``), from the start: exit code 130 and a line
SIGTERM_AS_INTERRUPT = ("train", "place")


USAGE = "usage: placement-rl <subcommand> [hydra overrides ...]   (placement-rl <subcommand> --help for its config)"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        print("subcommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<10} {text}")
        sys.exit(0 if args else 2)
    cmd, rest = args[0], args[1:]
    if cmd not in COMMANDS:
        print(f"error: unknown subcommand '{cmd}' (choose one of: {', '.join(COMMANDS)})", file=sys.stderr)
        sys.exit(2)
    # this process does not fork after placing: its greedy decodes may branch on threads (placement_rl.cost.split);
    # idle OpenMP threads spin briefly, then sleep (set before torch and numba load the runtime; measured: with the
    # default spin, serial work after a threaded decode kept a second core busy, CPU 1.7x wall; passive waiting
    # cost a third of the threads' gain at 20,000 nodes; 30,000 spins: CPU 1.1x wall, the gain kept)
    os.environ.setdefault("PLACEMENT_RL_DECODE_THREADS", "auto")
    os.environ.setdefault("GOMP_SPINCOUNT", "30000")
    from placement_rl.decode_env import parse_threads
    from placement_rl.errors import ConfigError

    try:
        parse_threads(os.environ["PLACEMENT_RL_DECODE_THREADS"])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:  # SIGTERM as Ctrl-C from the start (seconds of imports), the rule its run applies again
        with sigterm_as_interrupt() if cmd in SIGTERM_AS_INTERRUPT else contextlib.nullcontext():
            module = importlib.import_module(COMMANDS[cmd][0])
            sys.argv = [f"placement-rl {cmd}", *rest]
            module.main()
    except KeyboardInterrupt:  # stopped before its run began (the run itself answers with its own line)
        print("interrupted: no file written", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # output piped into a reader that stopped (``| head``): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    main()
