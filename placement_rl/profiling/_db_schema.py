"""The profile file's schema (``placement_rl.profile`` version 1, laid out in ``placement_rl.profiling.db``'s module
doc) and its validation: ``_validate`` refuses a damaged or foreign file with one ``ProfileError`` line naming it."""

from __future__ import annotations

import math
from typing import Any

from placement_rl.errors import ProfileError

SCHEMA = "placement_rl.profile"
VERSION = 1


def _stat(x: Any, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise ProfileError(f"{where}: expected a finite non-negative number, got {x!r}; re-profile")
    return float(x)


def _row(row: Any, layout: str, what: str) -> None:
    """``row``: a list of as many finite non-negative numbers as ``layout`` (``[fwd, bwd, count]``) names."""
    if not isinstance(row, list) or len(row) != layout.count(",") + 1:
        raise ProfileError(f"{what} must be {layout}")
    for x in row:
        _stat(x, what)


def _validate(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: not a profile (top level must be a JSON object); re-run `placement-rl profile`")
    if data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: field 'schema' is {data.get('schema')!r}, expected '{SCHEMA}': "
                           "not a profile file")
    if data.get("version") != VERSION:
        raise ProfileError(f"{where}: unknown profile schema version {data.get('version')!r} "
                           f"(this release reads version {VERSION}); re-run `placement-rl profile`")
    for key, typ in (("env", dict), ("devices", dict), ("graphs", dict), ("ops", dict), ("links", list)):
        if not isinstance(data.get(key), typ):
            raise ProfileError(f"{where}: field '{key}' must be a JSON {typ.__name__}; the file is damaged")
    for name, rec in data["devices"].items():
        if not isinstance(rec, dict) or not isinstance(rec.get("torch_device"), str):
            raise ProfileError(f"{where}: device '{name}' lacks a 'torch_device'; the file is damaged")
    for fp, entry in data["graphs"].items():
        w = f"{where}: graph {fp}"
        if not isinstance(entry, dict) or not isinstance(entry.get("times"), dict) \
                or not isinstance(entry.get("step"), dict) or not isinstance(entry.get("nodes"), list):
            raise ProfileError(f"{w} must hold 'nodes', 'times' and 'step'; the file is damaged")
        for dev, nodes in entry["times"].items():
            if dev not in data["devices"] or not isinstance(nodes, dict):
                raise ProfileError(f"{w}: times for unknown device '{dev}'; the file is damaged")
            for node, row in nodes.items():
                _row(row, "[fwd, fwd_iqr, bwd, bwd_iqr, repeats]", f"{w}: node '{node}' on '{dev}'")
        for dev, row in entry["step"].items():
            _row(row, "[median, iqr, repeats]", f"{w}: step on '{dev}'")
        opt = entry.get("optimizer", {})
        if not isinstance(opt, dict):
            raise ProfileError(f"{w}: 'optimizer' must be an object; the file is damaged")
        for dev, row in opt.items():
            _row(row, "[median, iqr, repeats, param_bytes]", f"{w}: optimizer on '{dev}'")
    for dev, ops in data["ops"].items():
        if not isinstance(ops, dict):
            raise ProfileError(f"{where}: ops of '{dev}' must be an object; the file is damaged")
        for sig, row in ops.items():
            _row(row, "[fwd, bwd, count]", f"{where}: op '{sig}' on '{dev}'")
    for k, rec in enumerate(data["links"]):
        if not isinstance(rec, dict) or not all(isinstance(rec.get(f), str) for f in ("src", "dst", "backend")):
            raise ProfileError(f"{where}: links[{k}] must have 'src', 'dst' and 'backend'; the file is damaged")
        _stat(rec.get("latency"), f"{where}: links[{k}] latency")
        bw = _stat(rec.get("bandwidth"), f"{where}: links[{k}] bandwidth")
        if bw <= 0:
            raise ProfileError(f"{where}: links[{k}] has bandwidth 0; re-run the link benchmark")
