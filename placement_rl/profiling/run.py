"""``run_profile``: the library function behind ``placement-rl profile`` (profile a model and the links).

Profiles zoo model ``model`` (built with ``overrides`` and captured as ``capture`` does) on every selected
local device (``detect_local`` names: ``cpu``, ``gpu0``, ...), then runs the link benchmarks that apply
(``copy`` between the devices, pinned host<->GPU, GPU peer-to-peer, gloo and NCCL send/recv), and writes
everything to the ProfileDB at ``output``. Re-running with the same output resumes: nodes and links
already in the file are kept and skipped (``ProfileRun.kept`` counts them), provided they were timed with the same
thread count and repeats; other settings are refused (``ProfileError``: another output file, or the same settings).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.profiling.db import ProfileDB
from placement_rl.profiling.links import DEFAULT_SIZES, local_link_benchmarks
from placement_rl.profiling.ops import profile_graph
from placement_rl.topology import Device, detect_local


@dataclass(frozen=True, eq=False)
class ProfileRun:
    db: ProfileDB
    graph: CompGraph
    devices: tuple[str, ...]
    path: Path
    kept: Mapping[str, int] = field(default_factory=dict)  # per device: nodes whose times an earlier run recorded


def check_resume(db: ProfileDB, graph: CompGraph, device: str, *, threads: int, repeats: int) -> int:
    """How many of ``graph``'s nodes ``db`` already timed on ``device`` (a resumed run keeps them); a
    ``ProfileError`` when those times, or the device's, were taken with another thread count or repeats."""
    from placement_rl.profiling.ops import op_names_of

    rec = db.data["devices"].get(device)
    done = db.node_times(graph, device)
    kept = [n for n in op_names_of(graph) if n in done]
    had_threads = rec.get("threads") if rec is not None else None
    had_repeats = sorted({int(done[n][4]) for n in kept})
    if (had_threads is not None and int(had_threads) != threads) or (had_repeats and had_repeats != [repeats]):
        was = ", ".join(x for x in (f"{had_threads} thread{'s' if had_threads != 1 else ''}"
                                    if had_threads is not None else "",
                                    f"repeats {'/'.join(map(str, had_repeats))}" if had_repeats else "") if x)
        raise ProfileError(f"profile {db.label} timed device '{device}' with {was}, not {threads} "
                           f"thread{'s' if threads != 1 else ''} and repeats {repeats}: resume it with those settings, "
                           f"or write another output file")
    return len(kept)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` intra-op threads (None: leave the setting alone), restoring it afterwards."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def select_devices(names: Sequence[str] | None) -> list[Device]:
    """Local devices by name (default: all of them); an unknown name is a ``ProfileError``."""
    local = detect_local(measure=False)
    if not names:
        return list(local.devices)
    have = {d.name: d for d in local.devices}
    out = []
    for n in names:
        if n not in have:
            raise ProfileError(f"no local device '{n}' to profile (this machine has: {', '.join(have)})")
        out.append(have[n])
    return out


def run_profile(model: str, *, output: str | os.PathLike, overrides: Mapping[str, Any] | None = None,
                devices: Sequence[str] | None = None, warmup: int = 3, repeats: int = 10, links: bool = True,
                link_sizes: Sequence[int] = DEFAULT_SIZES, link_repeats: int = 10, processes: bool = True,
                threads: int | None = None, progress: bool = True, graph_out: str | os.PathLike | None = None,
                save_every: int = 25) -> ProfileRun:
    """Profile zoo model ``model`` on local ``devices`` (and their links) into the ProfileDB ``output``.

    ``threads``: torch intra-op threads while timing (None keeps the current setting; it is recorded with
    each device). ``processes``: also run the two-process gloo/NCCL send/recv benchmarks.
    ``graph_out``: where to write the captured graph's JSON (its fingerprint keys the profile).
    """
    from placement_rl.graph import zoo
    from placement_rl.graph.capture import capture

    overrides = dict(overrides or {})
    module, inputs = zoo.build(model, **overrides)
    graph = capture(module, inputs, name=model,
                    meta={"zoo": model, "zoo_overrides": overrides,
                          "zoo_options": zoo.resolve_options(model, overrides)})
    devs = select_devices(devices)
    db = ProfileDB.open(output)
    timing_threads = int(threads) if threads is not None else torch.get_num_threads()
    kept = {dev.name: check_resume(db, graph, dev.name, threads=timing_threads, repeats=repeats) for dev in devs}
    if graph_out is not None:
        graph.to_json(graph_out)
    with torch_threads(threads):
        for dev in devs:
            profile_graph(module, inputs, graph, dev, warmup=warmup, repeats=repeats, progress=progress, db=db,
                          save_every=save_every)
        if links:
            have = {(r["src"], r["dst"], r["backend"]) for r in db.links()}
            fits = local_link_benchmarks([d.torch_device for d in devs], sizes=link_sizes, repeats=link_repeats,
                                         processes=processes and not {("cpu", "cpu", "gloo")} <= have)
            for f in fits:
                if (f.src, f.dst, f.backend) not in have:
                    db.put_link(f.src, f.dst, f.backend, f.sizes, f.times, f.latency, f.bandwidth)
    db.save()
    return ProfileRun(db=db, graph=graph, devices=tuple(d.name for d in devs), path=Path(output), kept=kept)
