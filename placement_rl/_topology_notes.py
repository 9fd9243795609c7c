"""What a topology file may not say as its author meant, in one warning line each (``_topology_reader`` emits them
for a file, or for ``from_dict(notes=True)``): figures implausible for their unit, an ``architecture`` that replaces
a known model's, GPUs without a ``model`` priced by their name, ``count`` names ending in a digit, and GPUs of a
host on one ``torch_device``."""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from placement_rl.devices import Device

# the plausible range of a figure (FLOP/s, B/s, bytes, seconds): outside it, a unit slip such as TFLOP/s or TB/s
# written without the exponent (``peak_flops: 67``, ``mem_bandwidth: 3.35``, a link's ``bandwidth: 25``) priced a step
# at 30 years; 0, an optional figure the device lacks (no tensor cores), is none
PLAUSIBLE_MIN = {"peak_flops": 1e9, "peak_flops_tf32": 1e9, "peak_flops_bf16": 1e9, "peak_flops_fp16": 1e9,
                 "peak_flops_fp64": 1e9, "mem_bandwidth": 1e6, "memory_bytes": 1e6, "l2_bytes": 1e4, "bandwidth": 1e6}
PLAUSIBLE_MAX = {"latency": 1.0}
UNITS = {"mem_bandwidth": "B/s", "memory_bytes": "bytes", "l2_bytes": "bytes", "bandwidth": "B/s", "latency": "s"}


def _implausible(key: str, v: float) -> str:
    """``"small"`` for a figure of field ``key`` below ``PLAUSIBLE_MIN`` (0 aside), ``"large"`` for one above
    ``PLAUSIBLE_MAX``, else ``""``."""
    if 0 < v < PLAUSIBLE_MIN.get(key, 0.0):
        return "small"
    return "large" if v > PLAUSIBLE_MAX.get(key, float("inf")) else ""


def _meant(key: str, v: float) -> str:
    """The figure an implausible ``v`` of field ``key`` likely meant (``peak_flops: 67``: ``67e12 (TFLOP/s)``)."""
    if key == "memory_bytes":
        unit, meant = ("GiB", v * 2**30) if v < 1e4 else ("MiB", v * 2**20)
        return f"{v:g} {unit} ({meant:.0f})"
    if key == "l2_bytes":
        unit, meant = ("MiB", v * 2**20) if v < 1e3 else ("KiB", v * 2**10)
        return f"{v:g} {unit} ({meant:.0f})"
    if key.startswith("peak_flops"):
        return f"{v:g}e12 (TFLOP/s)" if v < 1e3 else f"{v:g}e9 (GFLOP/s)"
    if key == "mem_bandwidth":
        return f"{v:g}e12 (TB/s)" if v < 20 else f"{v:g}e9 (GB/s)"
    if key == "bandwidth":
        return f"{v:g}e9 (GB/s)" if v < 1e3 else f"{v:g}e6 (MB/s)"
    return f"{v:g}e-6 (us)" if v < 1e3 else f"{v:g}e-9 (ns)"  # latency


def _unit_notes(vals: Mapping[str, float], w: str) -> list[str]:
    """One line per figure of a device entry, the top level or a link outside its plausible range
    (``_implausible``), saying the figure it likely meant."""
    return [f"{w}: {key} {v:g} {UNITS.get(key, 'FLOP/s')} is implausibly {_implausible(key, v)}: did you mean "
            f"{_meant(key, v)}?" for key, v in vals.items() if _implausible(key, v)]


def _pair_notes(figures: Sequence[tuple[int, Mapping[str, float]]], where: str) -> list[str]:
    """``_unit_notes`` of the ``links.pairs`` entries ``(entry, its figures)``: per field, the first entry's line and
    how many more entries the slip has (a file of 28 pairs written in GB/s gets one line, not 28)."""
    lines = []
    for key in ("bandwidth", "latency"):
        odd = [(k, vals[key]) for k, vals in figures if _implausible(key, vals[key])]
        if odd:
            more = f" (and {len(odd) - 1} more links.pairs entries)" if len(odd) > 1 else ""
            lines += _unit_notes({key: odd[0][1]}, f"{where}: links.pairs[{odd[0][0]}]{more}")
    return lines


def _family(product: str) -> str:
    """The family of a datasheet product: its model number (``A100`` of ``A100 SXM4 80GB``, ``3080`` of ``GeForce
    RTX 3080 Ti 12GB``), else its words less the memory size (``TITAN V``). The products of one family have the
    architecture facts the cost model prices a GPU by (``cost.gpu_spec.datasheet``; the tests check the table)."""
    words = [x for x in product.split(" (")[0].split() if not x.upper().endswith("GB")]
    return next((x for x in words if any(c.isdigit() for c in x)), " ".join(words))


def _architecture_note(model: str, arch: str, w: str) -> list[str]:
    """The line for a GPU whose ``model`` is a datasheet product and whose ``architecture`` names a product of another
    family (``_family``): the cost model prices it by the architecture, not by its model (an A100 with
    ``architecture: H100`` priced 7% slower without a word), while ``architecture`` is for GPUs the datasheets do
    not know."""
    from placement_rl.datasheets import lookup

    sheet = lookup(model) if model and arch else None
    like = lookup(arch) if sheet else None  # a name ``_architecture`` accepted: known
    if sheet is None or like is None or _family(sheet.product) == _family(like.product):
        return []
    return [f"{w}: architecture '{arch}' replaces the architecture of model '{model}' ({sheet.product}): the cost "
            f"model prices it as built like {like.product}; 'architecture' is for a GPU the datasheets do not know: "
            "drop it, or name such a GPU in 'model:'"]


def naming_notes(devices: Sequence[Device], numbered: Sequence[tuple[str, str, list[str]]], where: str, *,
                 roofline: bool = False) -> list[str]:
    """Warning lines for a valid topology that may not say what its author meant: GPUs without a ``model`` (the
    calibrated cost model takes their architecture from the device name), an entry whose name ends in a digit
    (``numbered``: ``name: l4, count: 2`` names ``l40``, ``l41``) and two GPUs of a host on one ``torch_device``."""
    lines = [] if roofline else _model_notes(devices, where)
    misread = [e for e in numbered if _reads_as(e[1], e[2])]  # 'h2' + 0 reads as an H20: said entry by entry
    plain = [e for e in numbered if not _reads_as(e[1], e[2])]
    if len(plain) > DIGIT_LINES:  # a file of many hosts named h0, h1, ...: one line, not one per entry
        lines.append(_digit_notes_folded(plain, where))
        plain = []
    lines += [_digit_note(*entry) for entry in numbered if entry in misread or entry in plain]
    return lines + _shared_torch_device(devices, where)


DIGIT_LINES = 4  # entries whose names end in a digit said one line each up to this many, then in one line


def _digit_notes_folded(numbered: Sequence[tuple[str, str, list[str]]], where: str) -> str:
    """One line for many entries whose names end in a digit (``_digit_note`` says one)."""
    names = [name for _, name, _ in numbered]
    first = numbered[0][2]
    return (f"{where}: {len(names)} entries' names end in a digit ({_listed(names)}), so their devices run name and "
            f"number together ({_listed(first, 2)} ...); a separator keeps them apart (name: {names[0]}_ gives "
            f"{names[0]}_0, {names[0]}_1)")


def _product(name: str) -> str:
    """The datasheet product ``name`` names (``placement_rl.datasheets.lookup``, its bracketed note left out), or
    "" for none."""
    from placement_rl.datasheets import lookup

    sheet = lookup(name)
    return sheet.product.split(" (")[0] if sheet else ""


def _listed(names: Sequence[str], show: int = 3) -> str:
    """``'a', 'b', 'c' and 5 more``."""
    shown = ", ".join(f"'{x}'" for x in names[:show])
    return shown + (f" and {len(names) - show} more" if len(names) > show else "")


def _model_notes(devices: Sequence[Device], where: str) -> list[str]:
    """One line per datasheet product whose name GPUs without a ``model`` carry: the calibrated cost model reads a
    GPU's architecture (compute capability, memory kind, FP32 lanes per SM) from its ``model``, else from its device
    name (``placement_rl.cost.gpu_spec.spec_of_device``), so a device named ``t4`` is priced as a T4 whatever
    figures it gives. A name no product matches is said when the cost model prices it (as a generic GPU)."""
    unnamed: dict[str, list[str]] = {}
    for d in devices:
        if d.kind == "gpu" and not d.model and not d.architecture and _product(d.name):
            unnamed.setdefault(_product(d.name), []).append(d.name)
    lines = []
    for product, names in unnamed.items():
        one = len(names) == 1
        lines.append(f"{where}: device{'' if one else 's'} {_listed(names)} ha{'s' if one else 've'} no 'model': "
                     f"priced with the architecture of the datasheet product "
                     f"{'its name matches' if one else 'their names match'} ({product}); set 'model:' (or "
                     "'architecture:') to choose")
    return lines


def _reads_as(name: str, names: Sequence[str]) -> str:
    """The datasheet product the first numbered device reads as where the entry's own name does not (``l4`` + 0:
    the L40), else ""."""
    other = _product(names[0])
    return other if other and other != _product(name) else ""


def _digit_note(where: str, name: str, names: Sequence[str]) -> str:
    """The line for an entry whose ``name`` ends in a digit, so that its numbered devices ``names`` run name and
    number together (``l4`` + 0 reads as an L40)."""
    other = _reads_as(name, names)
    reads = f"; '{names[0]}' reads as {other}" if other else ""
    example = ", ".join(f"{name}_{c}" for c in range(min(len(names), 2)))
    return (f"{where}: name '{name}' ends in a digit, so its devices are named {_listed(names)}{reads}; a separator "
            f"keeps name and number apart (name: {name}_ gives {example})")


def _shared_torch_device(devices: Sequence[Device], where: str) -> list[str]:
    """The line for two GPUs of one host on the same ``torch_device`` (``torch_device: cuda`` on two entries gives
    both ``cuda:0``): deploy then binds ranks in ``LOCAL_RANK`` order, not to the plan's devices."""
    seen: dict[tuple[int, str], str] = {}
    shared: list[tuple[str, str, int, str]] = []
    for d in devices:
        if d.kind == "gpu":
            other = seen.setdefault((d.host, d.torch_device), d.name)
            if other != d.name:
                shared.append((other, d.name, d.host, d.torch_device))
    if not shared:
        return []
    a, b, host, td = shared[0]
    more = f" (and {len(shared) - 1} more such GPU{'s' if len(shared) > 2 else ''})" if len(shared) > 1 else ""
    return [f"{where}: devices '{a}' and '{b}' on host {host} both have torch_device '{td}'{more}: deploy then gives "
            "ranks GPUs in LOCAL_RANK order, not the plan's devices (docs/deploy.md); give each GPU of a host its own "
            "index (torch_device: cuda:<index>, or index_start on the entry)"]


_SAID: set[str] = set()


def _say_once(text: str) -> None:
    """A warning line, once per process and text (the CLI reads a topology file twice: to check it, then to use it)."""
    if text not in _SAID:
        _SAID.add(text)
        logging.getLogger("placement_rl._topology_reader").warning(text)  # the reader's log, as its other lines
