"""What both plan kinds (``placement_rl.plans``) share: the top-level keys every plan file has and the check that
refuses any other, index lists read as read-only int64 arrays, meta compared by value, and plan files written as
strict JSON."""

from __future__ import annotations

import difflib
import json
import math
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.errors import PlanError
from placement_rl.graph.ir import int_array

_FILE_KEYS = ("schema", "version", "meta", "graph", "graph_fingerprint", "topology")  # what to_dict writes, both kinds


def check_keys(data: Mapping[str, Any], known: Sequence[str], what: str) -> None:
    """``PlanError`` for a top-level key a plan file may not have (a typo such as ``microbatches`` would otherwise
    read as the field's default), naming the nearest known key. ``meta`` inside stays free-form."""
    for key in data:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"known fields: {', '.join(known)}"
            raise PlanError(f"{what} JSON has unknown field '{key}': {hint} (free-form data goes under 'meta')")


def _index_list(value: Any, field_: str, what: str) -> np.ndarray:
    """``value`` as a read-only int64 list of indices; ``PlanError`` for another shape, or an entry a cast would
    change (a fraction, NaN, beyond int64)."""
    if value is None or isinstance(value, (str, bytes, int, float, Mapping)):
        raise PlanError(f"{field_} must be a list of integer {what} values, got {value!r}"[:300])
    try:
        arr = int_array(value)
    except ValueError as exc:
        if len(exc.args) == 2:
            raise PlanError(f"{field_} entry #{exc.args[1]}: {exc.args[0]} (each is an integer {what})") from None
        raise PlanError(f"{field_} must be a list of integer {what} values ({exc})") from None
    except (TypeError, OverflowError) as exc:
        raise PlanError(f"{field_} must be a list of integer {what} values ({exc})") from None
    if arr.ndim != 1:
        got = f"shape {list(arr.shape)}" if arr.ndim else repr(value)
        raise PlanError(f"{field_} must be a flat list of integer {what} values, got {got}"[:300])
    arr.setflags(write=False)
    return arr


def _json_value(x: Any) -> Any:
    """``json.dumps``'s ``default``: numpy scalars and arrays as numbers and lists."""
    if isinstance(x, (np.generic, np.ndarray)):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} {x!r} is not JSON"[:200])


def _no_nan(x: Any) -> Any:
    """``x`` with every NaN / infinite number inside (dicts, lists, numpy values) as None: JSON has no form for them
    (an infeasible plan's meta holds an infinite best time)."""
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.ndarray):
        return _no_nan(x.tolist())
    if isinstance(x, Mapping):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_no_nan(v) for v in x]
    return x


def _dumps(data: Mapping[str, Any], what: str) -> str:
    """A plan file's text: strict JSON, numpy values written as numbers, a NaN or infinite number in ``meta`` as
    null; ``PlanError`` naming the ``meta`` field JSON cannot hold."""
    if isinstance(data.get("meta"), Mapping):
        data = {**data, "meta": _no_nan(data["meta"])}
    try:
        return json.dumps(data, indent=1, allow_nan=False, default=_json_value)
    except (TypeError, ValueError) as exc:
        meta = data.get("meta") or {}
        key = next((k for k, v in meta.items() if not _json_ok(v)), None)
        where = f"meta['{key}']" if key is not None else "a field"
        hint = ("NaN and infinity have no JSON form" if isinstance(exc, ValueError)
                else "store numbers, strings, lists and dicts")
        raise PlanError(f"{what} {where} cannot be written as JSON ({exc}): {hint}") from None


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False, default=_json_value)
    except (TypeError, ValueError):
        return False
    return True


def _same_meta(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Meta dicts equal by value (numpy arrays inside compared element-wise)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(np.asarray(x), np.asarray(y)):
                return False
        else:
            try:
                if not bool(x == y):
                    return False
            except (TypeError, ValueError):
                if repr(x) != repr(y):
                    return False
    return True
