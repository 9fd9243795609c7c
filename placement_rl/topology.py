"""``DeviceTopology``: the devices of a cluster and the links between every pair.

YAML schema (presets live in ``conf/topology/<name>.yaml``)::

    name: 4x_v100_nvlink
    description: free text
    devices:                       # a list; an entry with count: k expands to name0..name{k-1}
      - {name: gpu, count: 4, kind: gpu, torch_device: cuda, host: 0,
         peak_flops: 15.7e12, mem_bandwidth: 900e9, memory_bytes: 32e9, launch_overhead: 1.0e-5,
         sm_count: 80, l2_bytes: 6291456, model: V100-SXM2-32GB,          # optional datasheet figures
         peak_flops_tf32: 0, peak_flops_bf16: 0}                            # optional tensor-core peaks
    dtype: fp32                    # optional: fp32 (default), tf32 or bf16; the GPU cost model's precision
    cost_model: calibrated         # optional: calibrated (default for GPUs) or roofline
    collective_fit: a100_dgx       # optional: a measured system whose NCCL fits price the links and
                                   # collectives (placement_rl.cost.comm_fit; checked when first priced)
    links:
      intra_host: {bandwidth: 16e9, latency: 1.0e-5, kind: pcie}    # default between devices of one host
      inter_host: {bandwidth: 12.5e9, latency: 5.0e-6, kind: ib}    # default across hosts
      pairs:                                                         # overrides, symmetric
        - {between: [gpu0, gpu1], bandwidth: 25e9, latency: 5.0e-6, kind: nvlink}

Units: FLOP/s, bytes/s, bytes, seconds. A topology-level ``peak_flops_tf32`` / ``peak_flops_bf16`` / ``l2_bytes`` is
the default of every GPU that does not set its own. A GPU whose ``model`` is a product ``placement_rl.datasheets``
knows (``- {name: gpu, count: 8, model: L40S}``) may leave out any of ``peak_flops``, ``mem_bandwidth``,
``memory_bytes``, ``sm_count``, ``l2_bytes`` and the tensor-core peaks: they come from its datasheet (a figure
given on the device or at the top level wins). A device entry may also set ``index_start`` (the first CUDA
index of its ``count`` devices) and ``numbered: true`` (number its name even when ``count`` is 1).

A device entry, ``links``, ``links.intra_host`` / ``inter_host`` and a ``links.pairs`` entry accept only the
fields above: any other (a typo such as ``modle``) is a ``TopologyError`` listing the valid ones. Two
``links.pairs`` entries for the same pair (in either order) must agree. Other top-level keys are kept in
``meta`` (free-form notes, detection sources), except one that looks like a field (``link:``, ``dtpye:``) or a
device / links field at the top (``hosts: 2``, ``memory_bytes:``): that is a ``TopologyError`` naming it.
"""

from __future__ import annotations

import logging
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl.errors import TopologyError

DEVICE_KINDS = ("cpu", "gpu")
DEVICE_FIELDS = ("name", "count", "kind", "torch_device", "host", "index_start", "numbered", "model", "peak_flops",
                 "mem_bandwidth", "memory_bytes", "launch_overhead", "sm_count", "l2_bytes", "peak_flops_tf32",
                 "peak_flops_bf16")
LINKS_FIELDS = ("intra_host", "inter_host", "pairs")
LINK_FIELDS = ("bandwidth", "latency", "kind")
PAIR_FIELDS = ("between",) + LINK_FIELDS
DEFAULT_LAUNCH_OVERHEAD = {"cpu": 2e-6, "gpu": 8e-6}
# top-level fields the loader reads; any other top-level key is kept in ``meta`` unless it is a near miss of one of
# these or of a device / links field (a typo such as ``link:`` or a device field such as ``hosts:`` at the top)
TOP_FIELDS = ("name", "description", "devices", "links", "dtype", "cost_model", "collective_fit", "l2_bytes",
              "peak_flops_tf32", "peak_flops_bf16")
NOTE_FIELDS = ("peak_flops_fp64", "peak_flops_base", "peak_flops_tensor")  # datasheet notes in presets, not read


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    torch_device: str
    peak_flops: float
    mem_bandwidth: float
    memory_bytes: float
    host: int = 0
    launch_overhead: float = 0.0
    sm_count: int = 0               # streaming multiprocessors (0: unknown)
    l2_bytes: float = 0.0           # L2 cache (0: unknown)
    peak_flops_tf32: float = 0.0    # tensor-core peaks (0: unknown)
    peak_flops_bf16: float = 0.0
    model: str = ""                 # hardware model, e.g. "A100-80GB-PCIe"


@dataclass(frozen=True, eq=False)
class DeviceTopology:
    """Devices plus symmetric per-pair links. ``link_bandwidth[i, i]`` is inf and ``link_latency[i, i]`` 0."""

    name: str
    devices: tuple[Device, ...]
    link_bandwidth: np.ndarray
    link_latency: np.ndarray
    link_kind: tuple[tuple[str, ...], ...]
    description: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        for key in ("link_bandwidth", "link_latency"):
            arr = np.array(getattr(self, key), dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)
        self.validate()

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    @property
    def num_hosts(self) -> int:
        return len({d.host for d in self.devices})

    def index_of(self, name: str) -> int:
        for i, d in enumerate(self.devices):
            if d.name == name:
                return i
        raise TopologyError(f"topology '{self.name}' has no device '{name}' (devices: {', '.join(self.device_names)})")

    def array(self, attr: str) -> np.ndarray:
        """Per-device float array of a Device attribute (``peak_flops``, ``memory_bytes`` ...)."""
        return np.array([float(getattr(d, attr)) for d in self.devices], dtype=np.float64)

    def validate(self) -> None:
        n = self.num_devices
        if n == 0:
            raise TopologyError(f"topology '{self.name}': field 'devices' is empty")
        names = [d.name for d in self.devices]
        if len(set(names)) != n:
            dup = next(x for x in names if names.count(x) > 1)
            raise TopologyError(f"topology '{self.name}': duplicate device name '{dup}'")
        for d in self.devices:
            if d.kind not in DEVICE_KINDS:
                raise TopologyError(f"device '{d.name}': field 'kind' is {d.kind!r}, expected one of {DEVICE_KINDS}")
            for key in ("peak_flops", "mem_bandwidth", "memory_bytes"):
                v = getattr(d, key)
                if not (isinstance(v, numbers.Real) and not isinstance(v, bool) and np.isfinite(v) and v > 0):
                    raise TopologyError(f"device '{d.name}': field '{key}' must be a positive number, got {v!r}")
            for key in ("l2_bytes", "peak_flops_tf32", "peak_flops_bf16"):
                v = getattr(d, key)
                if not (isinstance(v, numbers.Real) and not isinstance(v, bool) and np.isfinite(v) and v >= 0):
                    raise TopologyError(f"device '{d.name}': field '{key}' must be a number >= 0, got {v!r}")
            if not isinstance(d.sm_count, int) or isinstance(d.sm_count, bool) or d.sm_count < 0:
                raise TopologyError(f"device '{d.name}': field 'sm_count' must be an integer >= 0")
            lo = d.launch_overhead
            if not (isinstance(lo, numbers.Real) and not isinstance(lo, bool) and np.isfinite(lo) and lo >= 0):
                raise TopologyError(f"device '{d.name}': field 'launch_overhead' must be >= 0")
        for key in ("link_bandwidth", "link_latency"):
            arr = getattr(self, key)
            if arr.shape != (n, n):
                raise TopologyError(f"topology '{self.name}': '{key}' must be {n}x{n}, got {arr.shape}")
            if not np.allclose(arr, arr.T, equal_nan=False):
                raise TopologyError(f"topology '{self.name}': '{key}' must be symmetric")
        if len(self.link_kind) != n or any(len(row) != n for row in self.link_kind):
            raise TopologyError(f"topology '{self.name}': 'link_kind' must be {n}x{n}")
        off = ~np.eye(n, dtype=bool)
        bw, lat = self.link_bandwidth[off], self.link_latency[off]
        if n > 1 and not (np.all(np.isfinite(bw)) and np.all(bw > 0)):
            i, j = np.argwhere(off & ~(np.isfinite(self.link_bandwidth) & (self.link_bandwidth > 0)))[0]
            raise TopologyError(f"link {names[i]} <-> {names[j]}: 'bandwidth' must be a positive number")
        if n > 1 and not (np.all(np.isfinite(lat)) and np.all(lat >= 0)):
            i, j = np.argwhere(off & ~(np.isfinite(self.link_latency) & (self.link_latency >= 0)))[0]
            raise TopologyError(f"link {names[i]} <-> {names[j]}: 'latency' must be a non-negative number")

    def summary(self) -> str:
        lines = [f"topology {self.name}: {self.num_devices} devices on {self.num_hosts} host(s)"]
        for d in self.devices:
            lines.append(f"  {d.name:<8} {d.kind:<3} {d.torch_device:<8} host {d.host}  "
                         f"{d.peak_flops / 1e12:8.2f} TFLOP/s  {d.mem_bandwidth / 1e9:7.1f} GB/s  "
                         f"{d.memory_bytes / 2**30:7.1f} GiB")
        return "\n".join(lines)

    def subset(self, indices: Sequence[int], name: str | None = None) -> "DeviceTopology":
        idx = [int(i) for i in indices]
        if not idx:
            raise TopologyError(f"topology '{self.name}': subset needs at least one device index")
        bad = [i for i in idx if not 0 <= i < self.num_devices]
        if bad:
            raise TopologyError(f"topology '{self.name}': subset index {bad[0]} out of range 0..{self.num_devices - 1}")
        return DeviceTopology(name=name or f"{self.name}[{','.join(map(str, idx))}]",
                              devices=tuple(self.devices[i] for i in idx),
                              link_bandwidth=self.link_bandwidth[np.ix_(idx, idx)],
                              link_latency=self.link_latency[np.ix_(idx, idx)],
                              link_kind=tuple(tuple(self.link_kind[i][j] for j in idx) for i in idx),
                              description=self.description, meta=dict(self.meta))

    # ----------------------------------------------------------------- YAML
    @staticmethod
    def from_dict(data: Any, *, where: str = "topology") -> "DeviceTopology":
        return _from_dict(data, where)

    @staticmethod
    def from_yaml(path: str | os.PathLike) -> "DeviceTopology":
        import yaml

        p = Path(path)
        if not p.is_file():
            raise TopologyError(f"topology file '{p}' does not exist")
        try:
            data = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise TopologyError(f"{p}: malformed YAML ({str(exc).splitlines()[0]})") from None
        return _from_dict(data, str(p))

    def to_dict(self) -> dict[str, Any]:
        n = self.num_devices
        pairs = [{"between": [self.devices[i].name, self.devices[j].name],
                  "bandwidth": float(self.link_bandwidth[i, j]), "latency": float(self.link_latency[i, j]),
                  "kind": self.link_kind[i][j]} for i in range(n) for j in range(i + 1, n)]
        devs = [{"name": d.name, "kind": d.kind, "torch_device": d.torch_device, "host": d.host,
                 "peak_flops": d.peak_flops, "mem_bandwidth": d.mem_bandwidth, "memory_bytes": d.memory_bytes,
                 "launch_overhead": d.launch_overhead, "sm_count": d.sm_count, "l2_bytes": d.l2_bytes,
                 "peak_flops_tf32": d.peak_flops_tf32, "peak_flops_bf16": d.peak_flops_bf16, "model": d.model}
                for d in self.devices]
        return {**dict(self.meta), "name": self.name, "description": self.description, "devices": devs,
                "links": {"pairs": pairs}}


def _num(entry: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in entry:
        if default is not None:
            return default
        raise TopologyError(f"{where}: missing field '{key}'")
    v = entry[key]
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TopologyError(f"{where}: field '{key}' must be a number, got {v!r}") from None
    if isinstance(v, bool) or not np.isfinite(f):
        raise TopologyError(f"{where}: field '{key}' must be a finite number, got {v!r}")
    return f


def _with_datasheet(entry: Mapping[str, Any], kind: str, data: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """A GPU entry with the figures it leaves out taken from its ``model``'s datasheet (``placement_rl.datasheets``;
    a figure given on the device, or a topology-level L2 / tensor-core peak, wins). A required figure that is
    neither given nor known is a one-line error saying so."""
    from placement_rl.datasheets import lookup

    if kind != "gpu":
        return entry
    model = str(entry.get("model", "") or "")
    sheet = lookup(model) if model else None
    if sheet is None:
        missing = next((k for k in ("peak_flops", "mem_bandwidth", "memory_bytes") if k not in entry), None)
        if missing:
            hint = (f"model '{model}' is not a GPU placement_rl.datasheets knows" if model else
                    "or name the product in 'model:', e.g. H100-SXM5-80GB or L40S, to take its datasheet figures")
            raise TopologyError(f"{where}: missing field '{missing}' ({hint})")
        return entry
    filled = {k: v for k, v in sheet.fields().items() if k not in entry and k not in data}
    if filled:
        logging.getLogger(__name__).info("%s: %s from the datasheet of %s", where, ", ".join(filled), sheet.product)
    return {**filled, **entry}


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


def _from_dict(data: Any, where: str) -> DeviceTopology:
    if not isinstance(data, dict):
        raise TopologyError(f"{where}: top level must be a mapping with 'name', 'devices' and 'links'")
    _check_top_level(data, where)
    devs_in = data.get("devices")
    if not isinstance(devs_in, list) or not devs_in:
        raise TopologyError(f"{where}: field 'devices' must be a non-empty list")
    devices: list[Device] = []
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
        count = entry.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_DEVICE_COUNT:
            raise TopologyError(f"{w}: field 'count' must be an integer in [1, {MAX_DEVICE_COUNT}], got {count!r}")
        host = entry.get("host", 0)
        if not isinstance(host, int) or isinstance(host, bool) or host < 0:
            raise TopologyError(f"{w}: field 'host' must be a non-negative integer, got {host!r}")
        entry = _with_datasheet(entry, kind, data, w)
        vals = {key: _num(entry, key, w) for key in ("peak_flops", "mem_bandwidth", "memory_bytes")}
        for key, v in vals.items():
            if v <= 0:
                raise TopologyError(f"{w}: field '{key}' must be positive, got {v!r}")
        overhead = _num(entry, "launch_overhead", w, DEFAULT_LAUNCH_OVERHEAD[kind])
        extra = {key: _num(entry, key, w, _num(data, key, where, 0.0))
                 for key in ("l2_bytes", "peak_flops_tf32", "peak_flops_bf16")}
        for key, v in extra.items():
            if v < 0:
                raise TopologyError(f"{w}: field '{key}' must be >= 0, got {v!r}")
        sm = entry.get("sm_count", 0)
        if not isinstance(sm, int) or isinstance(sm, bool) or sm < 0:
            raise TopologyError(f"{w}: field 'sm_count' must be a non-negative integer, got {sm!r}")
        extra["sm_count"] = sm
        extra["model"] = str(entry.get("model", ""))
        base_td = str(entry.get("torch_device", "cpu" if kind == "cpu" else "cuda"))
        start = entry.get("index_start", 0)
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise TopologyError(f"{w}: field 'index_start' must be a non-negative integer, got {start!r}")
        for c in range(count):
            name = f"{entry['name']}{c}" if count > 1 or entry.get("numbered", False) else str(entry["name"])
            td = base_td if (":" in base_td or base_td == "cpu") else f"{base_td}:{start + c}"
            devices.append(Device(name=name, kind=kind, torch_device=td, host=host, launch_overhead=overhead,
                                  **vals, **extra))
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
        for i in range(n):
            for j in range(n):
                if i != j and (devices[i].host == devices[j].host) == same:
                    bw[i, j], lat[i, j], kind_m[i][j] = b, l_, str(spec.get("kind", key))
    if not isinstance(links.get("pairs", []) or [], list):
        raise TopologyError(f"{where}: field 'links.pairs' must be a list of {{between, bandwidth, latency}}")
    given: dict[tuple[int, int], tuple[int, float, float, str]] = {}  # pair -> (entry, bandwidth, latency, kind)
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
        first = given.setdefault((min(i, j), max(i, j)), (k, bv, lv, kv))
        if first[1:] != (bv, lv, kv):
            raise TopologyError(f"{w}: link {a} <-> {b_} (bandwidth {bv:g}, latency {lv:g}, kind {kv}) contradicts "
                                f"links.pairs[{first[0]}] (bandwidth {first[1]:g}, latency {first[2]:g}, kind "
                                f"{first[3]}): give each pair once")
        for x, y in ((i, j), (j, i)):
            bw[x, y], lat[x, y], kind_m[x][y] = bv, lv, kv
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
    if dtype not in ("fp32", "tf32", "bf16"):
        raise TopologyError(f"{where}: field 'dtype' is {dtype!r}, expected fp32, tf32 or bf16")
    model = data.get("cost_model", "calibrated")
    if model not in ("calibrated", "roofline"):
        raise TopologyError(f"{where}: field 'cost_model' is {model!r}, expected calibrated or roofline")
    return DeviceTopology(name=str(data.get("name", Path(where).stem)), devices=tuple(devices),
                          link_bandwidth=bw, link_latency=lat, link_kind=tuple(tuple(r) for r in kind_m),
                          description=str(data.get("description", "")),
                          meta={k: v for k, v in data.items() if k not in ("name", "devices", "links", "description")})


# ------------------------------------------------------------------ presets
MAX_DEVICE_COUNT = 65536  # devices per entry: a larger count is a typo, not a cluster (and would not fit in memory)
CONF_PACKAGE = "placement_rl.conf"  # where a wheel carries conf/ (pyproject.toml maps it at build time)


def source_conf_dir() -> Path | None:
    """``conf/`` beside the package in a source checkout or editable install, else None."""
    source = Path(__file__).resolve().parent.parent / "conf"
    return source if (source / "inspect.yaml").is_file() else None


def conf_dir() -> Path:
    """The Hydra configs and topology presets: ``$PLACEMENT_RL_CONF``, the checkout's ``conf/``, or the copy the
    wheel installed as the ``placement_rl.conf`` package data."""
    env = os.environ.get("PLACEMENT_RL_CONF")
    if env:
        return Path(env)
    source = source_conf_dir()
    if source is not None:
        return source
    import importlib

    try:
        return Path(list(importlib.import_module(CONF_PACKAGE).__path__)[0])
    except (ImportError, IndexError):
        raise TopologyError("no configs found: conf/ is neither beside the package nor installed as "
                            f"{CONF_PACKAGE}; reinstall placement-rl or set PLACEMENT_RL_CONF") from None


LOCAL = "local"  # conf/topology/local.yaml: not a preset, it asks for detect_local()


def preset_names() -> list[str]:
    """Names of the fixed presets in ``conf/topology/`` (``local`` is detection, not a preset)."""
    return sorted(p.stem for p in (conf_dir() / "topology").glob("*.yaml")
                  if not p.stem.startswith("_") and p.stem != LOCAL)


def load_topology(name_or_path: str | os.PathLike) -> DeviceTopology:
    """Load a preset by name (``conf/topology/<name>.yaml``) or a YAML file by path; ``local`` detects."""
    s = str(name_or_path)
    if s == LOCAL:
        return detect_local()
    p = Path(s)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        return DeviceTopology.from_yaml(p)
    preset = conf_dir() / "topology" / f"{s}.yaml"
    if not preset.is_file():
        raise TopologyError(f"unknown topology preset '{s}' (presets: {', '.join(preset_names())}, local; "
                            "or give a YAML file path)")
    return DeviceTopology.from_yaml(preset)


def detect_local(*, measure: bool = True) -> DeviceTopology:
    """The local machine: the CPU always, plus every CUDA GPU (NVML figures where available)."""
    from placement_rl import _local

    return _local.detect(measure=measure)
