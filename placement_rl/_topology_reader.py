"""Reading a topology mapping (a YAML file's contents) into ``DeviceTopology`` fields: the schema's fields,
datasheet fill for GPUs that name their product, per-field checks with one-line ``TopologyError``s, and the links matrix
(the schema is in ``placement_rl.topology``'s docstring). ``DeviceTopology.from_dict`` / ``from_yaml`` call it; with
``notes`` it also warns where a valid file may not say what its author meant (``naming_notes``, a figure implausible
for its unit, ``_unit_notes``: ``peak_flops: 67`` for 67 TFLOP/s, and an ``architecture`` that replaces a known model's,
``_architecture_note``)."""

from __future__ import annotations

import logging
import numbers
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.errors import TopologyError
from placement_rl.devices import DEFAULT_LAUNCH_OVERHEAD, DEVICE_KINDS, TORCH_DEVICE_HINT, Device, is_torch_device
from placement_rl._topology_notes import _architecture_note, _pair_notes, _say_once, _unit_notes, naming_notes

DEVICE_FIELDS = ("name", "count", "kind", "torch_device", "host", "index_start", "numbered", "model", "peak_flops",
                 "mem_bandwidth", "memory_bytes", "launch_overhead", "sm_count", "l2_bytes", "peak_flops_tf32",
                 "peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp64", "architecture")
LINKS_FIELDS = ("intra_host", "inter_host", "pairs")
LINK_FIELDS = ("bandwidth", "latency", "kind")
PAIR_FIELDS = ("between",) + LINK_FIELDS
# top-level fields the loader reads; any other top-level key is kept in ``meta`` unless it is a near miss of one of
# these or of a device / links field (a typo such as ``link:`` or a device field such as ``hosts:`` at the top)
TOP_FIELDS = ("name", "description", "devices", "links", "dtype", "cost_model", "collective_fit", "l2_bytes",
              "peak_flops_tf32", "peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp64")
NOTE_FIELDS = ("peak_flops_base", "peak_flops_tensor")  # datasheet notes in presets, not read
OPTIONAL_PEAKS = ("peak_flops_fp16", "peak_flops_fp64")  # without them fp16 runs at the bf16 peak, fp64 at fp32's
MAX_DEVICE_COUNT = 65536  # devices per entry: a larger count is a typo, not a cluster (and would not fit in memory)
FILLED_LINES = 4  # datasheet lines (runs of entries alike) past which they fold into one per datasheet
EXTRA_FIGURES = ("l2_bytes", "peak_flops_tf32", "peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp64")


def _num(entry: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in entry:
        if default is not None:
            return default
        raise TopologyError(f"{where}: missing field '{key}'")
    v = entry[key]
    try:
        f = float(v)
    except OverflowError:  # a Python int past float range
        raise TopologyError(f"{where}: field '{key}' must be a finite number, got {_shown(v)}") from None
    except (TypeError, ValueError):
        raise TopologyError(f"{where}: field '{key}' must be a number, got {_shown(v)}") from None
    if isinstance(v, (bool, np.bool_)) or not np.isfinite(f):
        raise TopologyError(f"{where}: field '{key}' must be a finite number, got {_shown(v)}")
    return f


def _int(entry: Mapping[str, Any], key: str, default: int) -> int | None:
    """``entry[key]`` (``default`` when absent) as a Python int when it is an integer (Python or numpy, not a
    bool), else None."""
    v = entry.get(key, default)
    return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else None


def _shown(v: Any, width: int = 60) -> str:
    """``repr(v)``, cut to ``width`` characters (a 400-digit integer)."""
    r = repr(v)
    return r if len(r) <= width else r[:width - 3] + "..."


def _with_datasheet(entry: Mapping[str, Any], kind: str, data: Mapping[str, Any], where: str,
                    filled_from: list | None = None) -> Mapping[str, Any]:
    """A GPU entry with the figures it leaves out taken from its ``model``'s datasheet (``placement_rl.datasheets``;
    a figure given on the device, or a topology-level L2 / tensor-core peak, wins). A required figure that is
    neither given nor known is a one-line error saying so (with the nearest known names), and so is a model the
    datasheet row it matches contradicts (``datasheets.resolve``: ``H100 94GB``, ``A100X``) unless the entry gives
    every figure the row would fill."""
    from placement_rl.datasheets import Datasheet, nearest, resolve

    if kind != "gpu":
        return entry
    model = str(entry.get("model", "") or "")
    wanted = [k for k in Datasheet.__dataclass_fields__ if k != "product" and k not in entry and k not in data]
    try:
        sheet = resolve(model) if model else None
    except TopologyError as exc:
        if not [k for k in wanted if k not in OPTIONAL_PEAKS]:  # the cost model does without them
            return entry
        raise TopologyError(f"{where}: {exc}") from None
    if sheet is None:
        missing = next((k for k in ("peak_flops", "mem_bandwidth", "memory_bytes") if k not in entry), None)
        if missing:
            near = nearest(model) if model else []
            hint = (f"model '{model}' is not a GPU placement_rl.datasheets knows" if model else
                    "or name the product in 'model:', e.g. H100-SXM5-80GB or L40S, to take its datasheet figures")
            hint += f"; nearest: {', '.join(near)}" if near else ""
            raise TopologyError(f"{where}: missing field '{missing}' ({hint})")
        return entry
    filled = {k: v for k, v in sheet.fields().items() if k in wanted}
    said = tuple(k for k in filled if k not in OPTIONAL_PEAKS)  # the optional peaks alone: not worth a line
    if said and filled_from is not None:  # the caller says it, once for a run of entries alike
        filled_from.append((said, sheet.product))
    elif said:
        logging.getLogger(__name__).info("%s: %s from the datasheet of %s", where, ", ".join(said), sheet.product)
    return {**filled, **entry}


def _say_filled(where: str, filled: list[tuple[int, tuple[str, ...], str]]) -> None:
    """One INFO line per run of consecutive device entries that took the same figures from the same datasheet
    (``devices[0-63]``: a topology of one entry per host said it 64 times); where that is more than ``FILLED_LINES``
    lines (hosts of several models in turn: 128 lines at 1,024 GPUs), one line per datasheet and figures, naming its
    entries and how many (``devices[0, 4, 8, ...] (32 entries)``). A line of one entry reads ``devices[4]``."""
    runs: list[tuple[list[int], tuple[str, ...], str]] = []
    for k, keys, product in filled:
        if runs and runs[-1][0][-1] == k - 1 and runs[-1][1:] == (keys, product):
            runs[-1][0].append(k)
        else:
            runs.append(([k], keys, product))
    if len(runs) > FILLED_LINES:
        alike: dict[tuple[tuple[str, ...], str], list[int]] = {}
        for entries, keys, product in runs:
            alike.setdefault((keys, product), []).extend(entries)
        runs = [(entries, keys, product) for (keys, product), entries in alike.items()]
    log = logging.getLogger(__name__)
    for entries, keys, product in runs:
        log.info("%s: %s: %s from the datasheet of %s", where, _entries_text(entries), ", ".join(keys), product)


def _entries_text(entries: list[int], show: int = 3) -> str:
    """``devices[4]``, ``devices[0-3]`` for a run, else its first ``show`` runs and how many entries in all
    (``devices[0, 4, 8, ...] (32 entries)``)."""
    runs: list[list[int]] = []
    for k in entries:
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    spans = [f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]
    if len(spans) == 1:
        return f"devices[{spans[0]}]"
    return f"devices[{', '.join(spans[:show])}{', ...' if len(spans) > show else ''}] ({len(entries)} entries)"


def _check_fields(entry: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    """``TopologyError`` naming the first key of ``entry`` not in ``allowed`` (a typo is never dropped silently)."""
    import difflib

    for key in entry:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise TopologyError(f"{where}: unknown field {str(key)!r}; {hint}valid fields: {', '.join(allowed)}")


def _check_top_level(data: Mapping[str, Any], where: str) -> None:
    """``TopologyError`` for a top-level key that is not a field but looks like one (free-form notes stay)."""
    import difflib

    for key in data:
        k = str(key)
        if k in TOP_FIELDS or k in NOTE_FIELDS:
            continue
        near = difflib.get_close_matches(k, TOP_FIELDS, n=1, cutoff=0.8)
        dev = [k] if k in DEVICE_FIELDS + LINKS_FIELDS else \
            difflib.get_close_matches(k, DEVICE_FIELDS + LINKS_FIELDS, n=1, cutoff=0.8)
        if near and not (dev and dev[0] == k):
            raise TopologyError(f"{where}: unknown top-level field {k!r}; did you mean '{near[0]}'?")
        if dev:
            place = "each device entry" if dev[0] in DEVICE_FIELDS else "'links'"
            raise TopologyError(f"{where}: top-level field {k!r} is not read; '{dev[0]}' belongs in {place}")


def _architecture(entry: Mapping[str, Any], kind: str, w: str) -> str:
    """A GPU entry's ``architecture``: a datasheet product whose architecture facts (compute capability, memory
    kind, FP32 lanes per SM, board power class) the cost model prices the GPU with, for a card the datasheets do not
    know (its figures given on the entry); a one-line error for a name they do not know or on a CPU."""
    from placement_rl.datasheets import lookup, nearest

    arch = entry.get("architecture", "")
    if arch in ("", None):
        return ""
    if kind != "gpu":
        raise TopologyError(f"{w}: field 'architecture' is for GPUs (the cost model prices a CPU by its roofline)")
    if not isinstance(arch, str) or lookup(arch) is None:
        near = nearest(str(arch))
        raise TopologyError(f"{w}: field 'architecture' is {arch!r}, not a product placement_rl/datasheets.py "
                            f"knows{' (nearest: ' + ', '.join(near) + ')' if near else ''}: name the product the "
                            "GPU is built like (e.g. H100, A100, L4, T4)")
    return arch


def read_topology(data: Any, where: str, *, notes: bool = False) -> dict[str, Any]:
    """The ``DeviceTopology`` fields ``data`` describes (``DeviceTopology(**read_topology(...))``); ``notes``: warn
    (once per process and line) about what ``_unit_notes``, ``_architecture_note`` and ``naming_notes`` find in a
    topology that is otherwise valid (off for topologies built in code: tests' made-up devices give ``peak_flops: 1``).
    A GPU entry without ``torch_device`` or ``index_start`` takes the CUDA indices after the highest its host's
    earlier entries took (each entry starting at ``cuda:0`` put two entries of a host on one GPU)."""
    if not isinstance(data, dict):
        raise TopologyError(f"{where}: top level must be a mapping with 'name', 'devices' and 'links'")
    _check_top_level(data, where)
    devs_in = data.get("devices")
    if not isinstance(devs_in, list) or not devs_in:
        raise TopologyError(f"{where}: field 'devices' must be a non-empty list")
    devices: list[Device] = []
    filled: list[tuple[int, tuple[str, ...], str]] = []  # (entry, figures, product) taken from datasheets
    numbered: list[tuple[str, str, list[str]]] = []  # (entry, its name, its devices' names) of names ending in a digit
    said: list[str] = []  # a figure implausible for its unit, an architecture replacing the model's (with notes)
    next_cuda: dict[int, int] = {}  # host -> the CUDA index after the highest its devices so far have
    for k, entry in enumerate(devs_in):
        w = f"{where}: devices[{k}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise TopologyError(f"{w} must be a mapping with a 'name'")
        _check_fields(entry, DEVICE_FIELDS, w)
        if not isinstance(entry.get("numbered", False), bool):
            raise TopologyError(f"{w}: field 'numbered' must be true or false, got {entry['numbered']!r}")
        kind = entry.get("kind", "gpu")
        if not isinstance(kind, str) or kind not in DEVICE_KINDS:
            raise TopologyError(f"{w}: field 'kind' is {kind!r}, expected one of {DEVICE_KINDS}")
        count = _int(entry, "count", 1)
        if count is None or not 1 <= count <= MAX_DEVICE_COUNT:
            raise TopologyError(f"{w}: field 'count' must be an integer in [1, {MAX_DEVICE_COUNT}], "
                                f"got {_shown(entry['count'])}")
        host = _int(entry, "host", 0)
        if host is None or host < 0:
            raise TopologyError(f"{w}: field 'host' must be a non-negative integer, got {_shown(entry['host'])}")
        took: list = []
        entry = _with_datasheet(entry, kind, data, w, took)
        filled += [(k, *x) for x in took]
        vals = {key: _num(entry, key, w) for key in ("peak_flops", "mem_bandwidth", "memory_bytes")}
        for key, v in vals.items():
            if v <= 0:
                raise TopologyError(f"{w}: field '{key}' must be positive, got {v!r}")
        overhead = _num(entry, "launch_overhead", w, DEFAULT_LAUNCH_OVERHEAD[kind])
        extra = {key: _num(entry, key, w, _num(data, key, where, 0.0)) for key in EXTRA_FIGURES}
        for key, v in extra.items():
            if v < 0:
                raise TopologyError(f"{w}: field '{key}' must be >= 0, got {v!r}")
        said += _unit_notes({**vals, **{key: v for key, v in extra.items() if key in entry}}, w)
        sm = _int(entry, "sm_count", 0)
        if sm is None or sm < 0:
            raise TopologyError(f"{w}: field 'sm_count' must be a non-negative integer, "
                                f"got {_shown(entry['sm_count'])}")
        extra["sm_count"] = sm
        extra["model"] = str(entry.get("model", ""))
        extra["architecture"] = _architecture(entry, kind, w)
        said += _architecture_note(extra["model"], extra["architecture"], w)
        base_td = str(entry.get("torch_device", "cpu" if kind == "cpu" else "cuda"))
        if not is_torch_device(base_td):
            raise TopologyError(f"{w}: field 'torch_device' is {base_td!r}, not a torch device: {TORCH_DEVICE_HINT}")
        own = "torch_device" in entry or "index_start" in entry  # else the host's numbering goes on
        start = _int(entry, "index_start", 0) if own else next_cuda.get(host, 0)
        if start is None or start < 0:
            raise TopologyError(f"{w}: field 'index_start' must be a non-negative integer, "
                                f"got {_shown(entry['index_start'])}")
        first = len(devices)
        for c in range(count):
            name = f"{entry['name']}{c}" if count > 1 or entry.get("numbered", False) else str(entry["name"])
            td = base_td if (":" in base_td or base_td == "cpu") else f"{base_td}:{start + c}"
            devices.append(Device(name=name, kind=kind, torch_device=td, host=host, launch_overhead=overhead,
                                  **vals, **extra))
            if td.startswith("cuda:"):
                next_cuda[host] = max(next_cuda.get(host, 0), int(td[5:]) + 1)
        if str(entry["name"])[-1:].isdigit() and devices[first].name != str(entry["name"]):
            numbered.append((w, str(entry["name"]), [d.name for d in devices[first:]]))
    _say_filled(where, filled)
    said += _unit_notes({key: _num(data, key, where) for key in EXTRA_FIGURES if key in data}, where)
    n = len(devices)
    names = [d.name for d in devices]
    if len(set(names)) != n:
        dup = next(x for x in names if names.count(x) > 1)
        raise TopologyError(f"{where}: duplicate device name '{dup}'")
    links = data.get("links", {}) or {}
    if not isinstance(links, dict):
        raise TopologyError(f"{where}: field 'links' must be a mapping")
    _check_fields(links, LINKS_FIELDS, f"{where}: links")
    bw = np.full((n, n), np.nan)
    lat = np.full((n, n), np.nan)
    kind_m = [["" for _ in range(n)] for _ in range(n)]
    for key, same in (("intra_host", True), ("inter_host", False)):
        spec = links.get(key)
        if spec is None:
            continue
        w = f"{where}: links.{key}"
        if not isinstance(spec, dict):
            raise TopologyError(f"{w} must be a mapping with 'bandwidth' and 'latency'")
        _check_fields(spec, LINK_FIELDS, w)
        b, l_ = _num(spec, "bandwidth", w), _num(spec, "latency", w)
        said += _unit_notes({"bandwidth": b, "latency": l_}, w)
        for i in range(n):
            for j in range(n):
                if i != j and (devices[i].host == devices[j].host) == same:
                    bw[i, j], lat[i, j], kind_m[i][j] = b, l_, str(spec.get("kind", key))
    if not isinstance(links.get("pairs", []) or [], list):
        raise TopologyError(f"{where}: field 'links.pairs' must be a list of {{between, bandwidth, latency}}")
    given: dict[tuple[int, int], tuple[int, float, float, str]] = {}  # pair -> (entry, bandwidth, latency, kind)
    pair_figures: list[tuple[int, dict[str, float]]] = []  # (entry, its figures) of links.pairs, for ``_pair_notes``
    for k, spec in enumerate(links.get("pairs", []) or []):
        w = f"{where}: links.pairs[{k}]"
        if not isinstance(spec, dict) or not isinstance(spec.get("between"), list) or len(spec["between"]) != 2:
            raise TopologyError(f"{w} must be a mapping with 'between: [dev_a, dev_b]'")
        _check_fields(spec, PAIR_FIELDS, w)
        a, b_ = spec["between"]
        for d in (a, b_):
            if d not in names:
                raise TopologyError(f"{w}: unknown device '{d}' (devices: {', '.join(names)})")
        i, j = names.index(a), names.index(b_)
        if i == j:
            raise TopologyError(f"{w}: a link must join two different devices, got '{a}' twice")
        bv, lv, kv = _num(spec, "bandwidth", w), _num(spec, "latency", w), str(spec.get("kind", "link"))
        pair_figures.append((k, {"bandwidth": bv, "latency": lv}))
        first = given.setdefault((min(i, j), max(i, j)), (k, bv, lv, kv))
        if first[1:] != (bv, lv, kv):
            raise TopologyError(f"{w}: link {a} <-> {b_} (bandwidth {bv:g}, latency {lv:g}, kind {kv}) contradicts "
                                f"links.pairs[{first[0]}] (bandwidth {first[1]:g}, latency {first[2]:g}, kind "
                                f"{first[3]}): give each pair once")
        for x, y in ((i, j), (j, i)):
            bw[x, y], lat[x, y], kind_m[x][y] = bv, lv, kv
    said += _pair_notes(pair_figures, where)
    for i in range(n):
        bw[i, i], lat[i, i], kind_m[i][i] = np.inf, 0.0, "local"
    missing = np.argwhere(np.isnan(bw))
    if missing.size:
        i, j = missing[0]
        raise TopologyError(f"{where}: no link between '{names[i]}' and '{names[j]}': "
                            "add links.intra_host / links.inter_host or a links.pairs entry")
    if np.any(bw <= 0):
        i, j = np.argwhere(bw <= 0)[0]
        raise TopologyError(f"{where}: link '{names[i]}' <-> '{names[j]}' has non-positive bandwidth")
    if np.any(lat < 0):
        i, j = np.argwhere(lat < 0)[0]
        raise TopologyError(f"{where}: link '{names[i]}' <-> '{names[j]}' has negative latency")
    dtype = data.get("dtype", "fp32")
    if dtype not in ("fp32", "tf32", "bf16", "fp16"):
        raise TopologyError(f"{where}: field 'dtype' is {dtype!r}, expected fp32, tf32, bf16 or fp16")
    model = data.get("cost_model", "calibrated")
    if model not in ("calibrated", "roofline"):
        raise TopologyError(f"{where}: field 'cost_model' is {model!r}, expected calibrated or roofline")
    if notes:
        for line in said + naming_notes(devices, numbered, where, roofline=model == "roofline"):
            _say_once(line)
    return dict(name=str(data.get("name", Path(where).stem)), devices=tuple(devices),
                link_bandwidth=bw, link_latency=lat, link_kind=tuple(tuple(r) for r in kind_m),
                description=str(data.get("description", "")),
                meta={k: v for k, v in data.items() if k not in ("name", "devices", "links", "description")})
