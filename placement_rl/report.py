"""Tables and plots: comparison tables (markdown + CSV), speed-up bar charts, Gantt timelines, curves."""

from __future__ import annotations

import csv
import io
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from placement_rl.graph.io import atomic_write_text


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}"
    return str(v)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                   headers: Sequence[str] | None = None) -> str:
    headers = list(headers or columns)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    return "\n".join(out) + "\n"


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in columns})
    return atomic_write_text(path, buf.getvalue())


def _savefig(fig, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    with warnings.catch_warnings():  # a title in a script the font lacks (a graph named in CJK) draws boxes
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speedup_bars(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, title: str = "") -> Path:
    """Grouped bars: speed-up over the best single device per case and placer (infeasible hatched)."""
    plt = _plt()
    cases = list(dict.fromkeys(r["case"] for r in rows))
    placers = list(dict.fromkeys(r["placer"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(cases) * max(1, len(placers)) / 4), 4.5))
    width = 0.8 / max(1, len(placers))
    cmap = plt.get_cmap("tab20")
    for j, p in enumerate(placers):
        xs, ys, hatch = [], [], []
        for i, c in enumerate(cases):
            r = next((r for r in rows if r["case"] == c and r["placer"] == p), None)
            if r is None or not np.isfinite(r["speedup"]):
                continue
            xs.append(i + j * width)
            ys.append(r["speedup"])
            hatch.append(not r["feasible"])
        bars = ax.bar(xs, ys, width, label=p, color=cmap(j % 20))
        for b, h in zip(bars, hatch):
            if h:
                b.set_hatch("//")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("speed-up over best single device")
    ax.set_title(title or "simulated training-step speed-up (hatched: infeasible)")
    ax.legend(fontsize=7, ncol=2)
    return _savefig(fig, path)


def gantt(timeline: Iterable[Any], path: str | os.PathLike, *, title: str = "") -> Path:
    """Gantt chart of a simulated step: one lane per device and per used link."""
    plt = _plt()
    items = list(timeline)
    lanes = list(dict.fromkeys(iv.resource for iv in items))
    lanes.sort(key=lambda s: ("->" in s, s))
    colors = {"fwd": "tab:blue", "bwd": "tab:orange", "xfer": "tab:green", "transfer": "tab:green",
              "grad_transfer": "tab:olive", "allreduce": "tab:red"}
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(lanes) + 1.5))
    for iv in items:
        y = lanes.index(iv.resource)
        ax.barh(y, (iv.end - iv.start) * 1e3, left=iv.start * 1e3, height=0.7,
                color=colors.get(iv.kind, "tab:gray"), edgecolor="white", linewidth=0.4)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    from matplotlib.patches import Patch

    kinds = list(dict.fromkeys(iv.kind for iv in items))
    ax.legend(handles=[Patch(color=colors.get(k, "tab:gray"), label=k) for k in kinds], fontsize=8, loc="lower right")
    return _savefig(fig, path)


def training_curve(curve: Sequence[tuple[int, float, float]], path: str | os.PathLike, *,
                   references: Mapping[str, float] | None = None, title: str = "") -> Path:
    """Step time of each episode's placement and the best so far, with horizontal reference lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    if curve:
        ep = np.array([c[0] for c in curve])
        t = np.array([c[1] for c in curve]) * 1e3
        best = np.array([c[2] for c in curve]) * 1e3
        ax.plot(ep, t, ".", ms=2, alpha=0.3, label="episode")
        k = max(1, len(t) // 50)
        smooth = np.convolve(t, np.ones(k) / k, mode="valid")
        ax.plot(ep[k - 1:], smooth, lw=1.5, label=f"mean of {k}")
        ax.plot(ep, best, lw=1.5, label="best so far")
    for i, (name, v) in enumerate((references or {}).items()):
        if np.isfinite(v):
            ax.axhline(v * 1e3, ls="--", lw=1, color=f"C{i + 3}", label=name)
    ax.set_xlabel("episode")
    ax.set_ylabel("simulated step time (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _savefig(fig, path)
