"""Render the README's headline figure table and docs/results.md from results/*.json.

    python scripts/render.py [--check]

``--check`` writes nothing and exits 1 when a document differs from its data (``placement_rl.studies.render``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from placement_rl.studies.render import RenderError, render_all

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a document differs from results/*.json")
    args = ap.parse_args()
    try:
        changed = render_all(ROOT, check=args.check)
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"{'differs from its data' if args.check else 'rendered'}: {path.relative_to(ROOT)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
