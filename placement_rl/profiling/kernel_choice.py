"""What the GEMM library chose in NeuSight's single-kernel tables, and what that choice costs the model.

Every row of NeuSight's linear / bmm tables names the cuBLAS kernel that ran (``ampere_sgemm_128x64_tn`` ...); the
name carries the kernel's CTA tile. The tile model (``placement_rl.cost.gemm_time``) takes the fastest of its
candidate tiles and split-K factors, as an ideal library would; the real library follows its own heuristic per
GPU. This module reads the named tiles (``named_tiles``), how often two GPUs picked the same tile for the same
shape (``agreement``), and the model's in-sample error when it is told the named tile (``named_tile_errors``):
an upper bound on what modelling the library's choice could give, not a model (it needs the measured GPU's own
kernel names). ``scripts/fidelity_gpu.py`` reports them in docs/fidelity_gpu.md.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placement_rl.cost.calibrated import GpuFit, table_times, trend
from placement_rl.cost.gemm_time import _gemm_time
from placement_rl.errors import ProfileError

TILE = re.compile(r"sgemm_(\d+)x(\d+)(_sliced1x4)?")  # in a cuBLAS kernel's name
NAME = re.compile(r"(\d+)x(\d+)(_sliced1x4)?/(\d+)")  # a ``named_tiles`` name
SHAPE = ("B", "M", "N", "K")


def named_tiles(path: str | Path, min_latency: float = 5e-5) -> tuple[list[str], list[tuple[int, ...]]]:
    """``(tile, shape)`` of every row at least ``min_latency`` seconds long, in file order (the rows and order of
    ``calibrate.load_kernels`` when it keeps them all): the tile as the kernel names it (``128x64``,
    ``32x32_sliced1x4``; ``other`` for a kernel without one) with the split-K factor of its launch after a slash
    (``128x64/3``: the grid's z over the batch, cuBLAS's split-K slices) and the row's (B, M, N, K)."""
    p = Path(path)
    try:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        keep = [r for r in rows if float(r["Latency"]) * 1e-3 >= min_latency]
        tiles = []
        for r in keep:
            m = TILE.search(r["Kernel Name"])
            split = max(1, round(float(r["Grid z"]) / max(float(r["B"]), 1.0))) if "Grid z" in r else 1
            tiles.append(f"{m.group(1)}x{m.group(2)}{m.group(3) or ''}/{split}" if m else "other")
        shapes = [tuple(int(float(r[c])) for c in SHAPE) for r in keep]
    except KeyError as exc:
        raise ProfileError(f"{p}: column {exc} missing; expected a NeuSight linear / bmm kernel file") from None
    except (ValueError, TypeError, csv.Error, UnicodeDecodeError):
        raise ProfileError(f"{p}: a Latency or shape value is not a number") from None
    return tiles, shapes


def shares(tiles: list[str]) -> dict[str, float]:
    """Fraction of rows per named tile (split-K factors together), largest first."""
    names, counts = np.unique(np.asarray([t.split("/")[0] for t in tiles]), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return {str(names[i]): float(counts[i] / counts.sum()) for i in order}


def agreement(a: tuple[list[str], list[tuple[int, ...]]], b: tuple[list[str], list[tuple[int, ...]]]
              ) -> tuple[int, float]:
    """Shapes timed in both tables (``named_tiles`` of each) and the fraction of them run with the same tile and
    split-K factor."""
    first = dict(zip(a[1], a[0]))
    both = [(first[s], t) for t, s in zip(*b) if s in first]
    return len(both), (float(np.mean([x == y for x, y in both])) if both else float("nan"))


@dataclass(frozen=True)
class NamedTileRow:
    gpu: str
    op: str
    rows: int
    model: float  # in-sample MAPE (%) of the shipped model (its fastest tile)
    named: float  # ... priced on the tile each row's kernel names, times one scale for the GPU
    scale: float  # that scale (median measured / named-tile time)


def tile_of(name: str) -> tuple[tuple[int, int], int] | None:
    """``((rows, columns), split-K)`` of a ``named_tiles`` name (cuBLAS writes its tile column-major,
    ``<columns>x<rows>`` of the output); None for ``other``."""
    m = NAME.fullmatch(name)
    return None if m is None else ((int(m.group(2)), int(m.group(1))), int(m.group(4)))


def named_tile_times(k, tiles: list[str], fit: GpuFit, *, model: np.ndarray | None = None) -> np.ndarray:
    """Kernel-table times of ``k``'s rows (a ``calibrate.KernelSample`` of a linear / bmm table): the shipped
    model's (``table_times``, or ``model`` when the caller has it) with its GEMM time on the fastest candidate
    replaced by the GEMM time on the tile and split-K factor each row's launch names; NaN for a row whose kernel
    names none."""
    f = k.feat
    if len(tiles) != len(f.flops):
        raise ProfileError(f"{k.gpu} {k.op}: {len(tiles)} kernel names for {len(f.flops)} rows")
    model = table_times(f, k.spec, fit) if model is None else model
    priced = (fit, k.spec, k.spec.peak_flops, 4.0, trend(k.spec, fit))  # fp32, as the tables were measured
    fastest = _gemm_time(f.flops, f.dims, f.cls, *priced)
    out = np.full(len(tiles), np.nan)
    arr = np.asarray(tiles)
    for name in np.unique(arr):
        got = tile_of(str(name))
        if got is None:
            continue
        idx = np.flatnonzero(arr == name)
        named = _gemm_time(f.flops[idx], f.dims[idx], f.cls[idx], *priced, tiles=(got[0],), splits=(got[1],))
        out[idx] = model[idx] - fastest[idx] + named
    return out


def named_tile_errors(k, tiles: list[str], fit: GpuFit) -> NamedTileRow:
    """The shipped model's in-sample MAPE on ``k`` against the same model told each row's named tile (one scale
    per GPU: the fitted efficiencies belong to the fastest-tile choice, so their level does not carry over)."""
    model = table_times(k.feat, k.spec, fit)
    named = named_tile_times(k, tiles, fit, model=model)
    ok = np.isfinite(named)
    scale = float(np.exp(np.median(np.log(k.fwd[ok] / named[ok]))))
    return NamedTileRow(gpu=k.gpu, op=k.op, rows=int(len(k.fwd)),
                        model=float(100 * np.mean(np.abs(model / k.fwd - 1))),
                        named=float(100 * np.mean(np.abs(scale * named[ok] / k.fwd[ok] - 1))), scale=scale)
