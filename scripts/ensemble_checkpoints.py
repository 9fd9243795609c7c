"""Combine pretraining runs (or checkpoint files) into one ensemble checkpoint (``agents.ensemble``).

    python scripts/ensemble_checkpoints.py RUN0 RUN1 RUN2 --out OUT

Each RUN is a ``placement-rl train trainer=pretrain`` run folder (its ``checkpoint.pt``; and, where every run has
one, ``checkpoint_imitation.pt`` and ``checkpoint_pi.pt``, so that ``scripts/bench_generalization.py --part test
--runs OUT ...`` reads the ensemble as it reads a run) or a checkpoint file. ``OUT`` is a folder: the ensemble is
written there under the same file names. Use it as any checkpoint: ``placement-rl place checkpoint=OUT/checkpoint.pt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PHASES = ("checkpoint.pt", "checkpoint_imitation.pt", "checkpoint_pi.pt")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="pretraining run folders or checkpoint files (>= 2)")
    ap.add_argument("--out", required=True, help="folder to write the ensemble checkpoint(s) to")
    a = ap.parse_args(argv)
    from agents.ensemble import combine
    from placement_rl.errors import PlacementRLError

    paths = [Path(r) for r in a.runs]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"error: no such run folder or checkpoint: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(a.out)
    try:
        if all(p.is_file() for p in paths):
            written = [combine(paths, out / "checkpoint.pt")]
        else:
            if not all(p.is_dir() for p in paths):
                print("error: give run folders or checkpoint files, not both", file=sys.stderr)
                return 2
            written = [combine([p / name for p in paths], out / name) for name in PHASES
                       if all((p / name).is_file() for p in paths)]
            if not written:
                print(f"error: the run folders hold no common {' / '.join(PHASES)}", file=sys.stderr)
                return 2
    except PlacementRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"ensemble of {len(paths)} members: {', '.join(str(w) for w in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
