"""Read any public GPU measurement file by its kind, for ``placement-rl profile measurements=<file>``.

Kinds (by name): a NeuSight label CSV (``<model>-<train|inf>-<seq>-<batch>.csv``, with its ``.json``), a
NeuSight kernel table (``kernels/<op>/<GPU>.csv``), a PipeDream ``<model>.graph.txt``, a Sailor
``p2p_*.csv`` / ``prim_*_<n>gpus.csv`` and a Vidur ``all_reduce.csv`` / ``send_recv.csv``. Each reader raises
its own one-line ``ProfileError`` for a missing or malformed file. A NeuSight label file also becomes a
``ProfileDB`` of its node graph (``cost_source`` ``measured:neusight-<GPU>-<workload>.json:gpu0``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placement_rl.errors import ProfileError


def read_measurements(path: str | Path) -> tuple[list[str], object | None]:
    """``(summary lines, ProfileDB or None)`` of one measurement file."""
    from placement_rl.profiling import neusight, pipedream, sailor, vidur

    p = Path(path)
    if p.is_dir():
        raise ProfileError(f"measurement file '{p}' is a folder: name one file in it")
    if not p.exists():
        raise ProfileError(f"measurement file '{p}' does not exist")
    name = p.name
    if name.endswith(".graph.txt"):
        prof = pipedream.read_profile(p)
        f = sum(x.fwd for x in prof.layers)
        b = sum(x.bwd for x in prof.layers)
        return [f"pipedream {prof.model}: {len(prof.layers)} layers, forward {f * 1e3:.1f} ms, "
                f"backward {b * 1e3:.1f} ms (GPU unnamed)"], None
    if name.startswith("p2p_"):
        s = sailor.read_p2p(p)
        return [_series_line(s)], None
    if name.startswith("prim_"):
        return [_series_line(sailor.read_collective(p))], None
    if p.stem in ("all_reduce", "send_recv"):
        return [_series_line(s) for s in vidur.read_table(p)], None
    if p.suffix == ".csv" and p.parent.parent.name == "kernels":
        from placement_rl.profiling.calibrate import load_kernels
        from placement_rl.cost.gpu_spec import GpuSpec

        k = load_kernels(p, p.parent.name, p.stem, GpuSpec(1.0, 1.0), max_rows=10**9, min_latency=0.0)
        return [f"neusight kernels {p.parent.name} on {p.stem}: {len(k.fwd)} rows, median "
                f"{np.median(k.fwd) * 1e3:.3f} ms"], None
    if p.suffix == ".csv":
        w = neusight.read_labels(p)
        g = neusight.label_graph(w)
        fwd, bwd = neusight.measured_times(w, g)
        db = label_profile(w, g, fwd, bwd)
        return [f"neusight {w.key} on {w.gpu}: {g.num_nodes} nodes (one layer of {w.num_layer}), whole model "
                f"{w.e2e * 1e3:.1f} ms end to end"], db
    raise ProfileError(f"'{p}': not a known measurement file (NeuSight label or kernel CSV, PipeDream "
                       "*.graph.txt, Sailor p2p_*/prim_*.csv, Vidur all_reduce.csv/send_recv.csv)")


def label_profile(w, graph, fwd: np.ndarray, bwd: np.ndarray):
    """A ``ProfileDB`` of a NeuSight label graph with its measured per-node times."""
    from placement_rl.profiling.measured_map import MapResult, mapped_profile

    res = MapResult(fwd, bwd, tuple(graph.names))
    return mapped_profile(graph, res, label=f"neusight-{w.gpu}-{w.key}", gpu_model=w.gpu)


def _series_line(s) -> str:
    return (f"{s.source} {s.system} {s.kind} on {s.n_gpus} GPUs ({s.devices_per_node} per node): {len(s.sizes)} "
            f"sizes {s.sizes.min():.0f}-{s.sizes.max():.0f} B, {s.times.min() * 1e3:.3f}-{s.times.max() * 1e3:.3f} ms")
