"""Importer for Vidur's public NCCL measurements (microsoft/vidur, MIT licence).

``<system>/all_reduce.csv`` and ``send_recv.csv``: per message ``size`` (bytes), ``num_workers`` and
``devices_per_node``, the min / max / mean / median / std time in ms. The median is used. Any problem is a
one-line ``ProfileError`` naming the file.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from placement_rl.errors import ProfileError
from placement_rl.profiling.sailor import Series

KINDS = {"all_reduce": "all_reduce", "send_recv": "p2p"}


def read_table(path: str | Path, system: str | None = None) -> list[Series]:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"Vidur table '{p}' does not exist")
    if p.stem not in KINDS:
        raise ProfileError(f"{p}: name must be all_reduce.csv or send_recv.csv")
    col = f"time_stats.{p.stem}.median"
    groups: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    try:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            need = (col, "size", "num_workers", "devices_per_node")
            missing = [c for c in need if c not in (reader.fieldnames or [])]
            if missing:
                raise ProfileError(f"{p}: column '{missing[0]}' missing; expected a Vidur network table")
            for k, r in enumerate(reader, start=2):
                try:
                    size, t = float(r["size"]), float(r[col])
                    n, dpn = int(r["num_workers"]), int(r["devices_per_node"])
                except (TypeError, ValueError):
                    raise ProfileError(f"{p}: row {k}: size, time, num_workers or devices_per_node is not a "
                                       "number") from None
                if not (np.isfinite(size) and np.isfinite(t) and size > 0 and t > 0 and n >= 2 and dpn >= 1):
                    raise ProfileError(f"{p}: row {k}: sizes and times must be positive, num_workers >= 2")
                groups[(n, dpn)].append((size, t * 1e-3))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ProfileError(f"{p}: cannot read ({exc.__class__.__name__}); expected a Vidur network table") from None
    if not groups:
        raise ProfileError(f"{p}: no rows")
    out = []
    for (n, dpn), rows in sorted(groups.items()):
        a = np.array(sorted(rows))
        out.append(Series("vidur", system or p.parent.name, KINDS[p.stem], n, dpn, a[:, 0], a[:, 1]))
    return out


def read_system(folder: str | Path) -> list[Series]:
    d = Path(folder)
    if not d.is_dir():
        raise ProfileError(f"Vidur folder '{d}' does not exist")
    out = [s for name in ("all_reduce", "send_recv") if (d / f"{name}.csv").is_file()
           for s in read_table(d / f"{name}.csv")]
    if not out:
        raise ProfileError(f"{d}: no all_reduce.csv or send_recv.csv")
    return out
