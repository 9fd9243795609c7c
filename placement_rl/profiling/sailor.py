"""Importer for Sailor's public NCCL measurements (eth-easl/sailor, MIT licence).

``<GPU>/p2p_intra_node.csv`` / ``p2p_inter_node.csv``: first row message sizes (MB), second row measured
bandwidth (GB/s). ``<GPU>/prim_GPT-Neo-2.7_<collective>_<n>gpus.csv``: ``data_size(MB),time(ms)`` of
all-reduce, all-gather and reduce-scatter on ``n`` GPUs of one node. MB is taken as 2**20 bytes and GB/s as
1e9 bytes/s. Rows timed 1e9 ms (Sailor's marker for a size that did not run) are dropped. Any problem is a one-line ``ProfileError`` naming the file.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placement_rl.errors import ProfileError

MB = 2.0 ** 20
SENTINEL_MS = 1e6
_PRIM = re.compile(r"^prim_.*_(?P<kind>all_reduce|all_gather|reduce_scatter)_(?P<n>\d+)gpus$")


@dataclass(frozen=True)
class Series:
    """Times of one collective on one system: ``sizes`` bytes, ``times`` seconds (sorted by size)."""

    source: str
    system: str
    kind: str               # all_reduce | all_gather | reduce_scatter | p2p
    n_gpus: int
    devices_per_node: int
    sizes: np.ndarray
    times: np.ndarray

    @property
    def key(self) -> str:
        return f"{self.system}:{self.kind}:{self.n_gpus}:{self.devices_per_node}"


def _numbers(row: list[str], path: Path, what: str) -> np.ndarray:
    try:
        vals = np.array([float(x) for x in row if x.strip() != ""])
    except ValueError:
        raise ProfileError(f"{path}: {what} must be numbers; expected a Sailor measurement file") from None
    if not vals.size or not np.all(np.isfinite(vals) & (vals > 0)):
        raise ProfileError(f"{path}: {what} must be positive numbers; expected a Sailor measurement file")
    return vals


def read_p2p(path: str | Path, system: str | None = None) -> Series:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"Sailor p2p file '{p}' does not exist")
    try:
        rows = [r for r in csv.reader(p.open(newline="")) if r]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ProfileError(f"{p}: cannot read ({exc.__class__.__name__}); expected a Sailor p2p file") from None
    if len(rows) < 2:
        raise ProfileError(f"{p}: needs two rows (sizes in MB, bandwidth in GB/s); expected a Sailor p2p file")
    sizes, bw = _numbers(rows[0], p, "message sizes"), _numbers(rows[1], p, "bandwidths")
    if sizes.shape != bw.shape:
        raise ProfileError(f"{p}: {sizes.size} sizes but {bw.size} bandwidths")
    b = sizes * MB
    intra = "intra" in p.stem
    return Series("sailor", system or p.parent.name, "p2p", 2, 2 if intra else 1, b, b / (bw * 1e9))


def read_collective(path: str | Path, system: str | None = None) -> Series:
    p = Path(path)
    m = _PRIM.match(p.stem)
    if not m:
        raise ProfileError(f"{p}: name must be prim_<model>_<all_reduce|all_gather|reduce_scatter>_<n>gpus.csv")
    if not p.is_file():
        raise ProfileError(f"Sailor collective file '{p}' does not exist")
    try:
        with p.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            rows = [r for r in reader if r]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ProfileError(f"{p}: cannot read ({exc.__class__.__name__})") from None
    if header is None or len(header) < 2 or not rows:
        raise ProfileError(f"{p}: expected a header 'data_size(MB),time(ms)' and rows")
    data = np.array([_numbers(r[:2], p, f"row {k + 2}") for k, r in enumerate(rows)])
    if data.ndim != 2 or data.shape[1] != 2:
        raise ProfileError(f"{p}: every row must hold data_size(MB),time(ms)")
    data = data[data[:, 1] < SENTINEL_MS]  # Sailor writes 1e9 ms where a size did not fit in memory
    if not len(data):
        raise ProfileError(f"{p}: no measured row (every time is the 1e9 ms 'did not run' marker)")
    order = np.argsort(data[:, 0], kind="stable")
    n = int(m.group("n"))
    return Series("sailor", system or p.parent.name, m.group("kind"), n, n, data[order, 0] * MB,
                  data[order, 1] * 1e-3)


def read_system(folder: str | Path) -> list[Series]:
    """Every p2p and collective table of one Sailor GPU folder (``A100-40``, ``V100-16``, ``GH-96``)."""
    d = Path(folder)
    if not d.is_dir():
        raise ProfileError(f"Sailor folder '{d}' does not exist")
    out = [read_p2p(p) for p in sorted(d.glob("p2p_*.csv"))]
    out += [read_collective(p) for p in sorted(d.glob("prim_*.csv"))]
    if not out:
        raise ProfileError(f"{d}: no p2p_*.csv or prim_*.csv tables")
    return out
