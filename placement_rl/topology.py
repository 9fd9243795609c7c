"""``DeviceTopology``: the devices of a cluster and the links between every pair.

YAML schema (presets live in ``conf/topology/<name>.yaml``)::

    name: 4x_v100_nvlink
    description: free text
    devices:                       # a list; an entry with count: k expands to name0..name{k-1}
      - {name: gpu, count: 4, kind: gpu, torch_device: cuda, host: 0,
         peak_flops: 15.7e12, mem_bandwidth: 900e9, memory_bytes: 32e9, launch_overhead: 1.0e-5,
         sm_count: 80, l2_bytes: 6291456, model: V100-SXM2-32GB,          # optional datasheet figures
         peak_flops_tf32: 0, peak_flops_bf16: 0, peak_flops_fp16: 125e12,   # optional tensor-core peaks
         peak_flops_fp64: 7.8e12}                                           # and FP64 peak
    dtype: fp32                    # optional: fp32 (default), tf32, bf16 or fp16; the GPU cost model's precision
                                   # (fp64: a graph captured in fp64 runs in it, no topology dtype asks for it)
    cost_model: calibrated         # optional: calibrated (default for GPUs) or roofline
    collective_fit: a100_dgx       # optional: a measured system whose NCCL fits price the links and
                                   # collectives (placement_rl.cost.comm_fit; checked when first priced)
    links:
      intra_host: {bandwidth: 16e9, latency: 1.0e-5, kind: pcie}    # default between devices of one host
      inter_host: {bandwidth: 12.5e9, latency: 5.0e-6, kind: ib}    # default across hosts
      pairs:                                                         # overrides, symmetric
        - {between: [gpu0, gpu1], bandwidth: 25e9, latency: 5.0e-6, kind: nvlink}

Units: FLOP/s, bytes/s, bytes, seconds. A topology-level ``peak_flops_tf32`` / ``peak_flops_bf16`` /
``peak_flops_fp16`` / ``peak_flops_fp64`` / ``l2_bytes`` is the default of every GPU that does not set its own. A
GPU whose ``model`` is a product ``placement_rl.datasheets`` knows (``- {name: gpu, count: 8, model: L40S}``) may
leave out any of ``peak_flops``, ``mem_bandwidth``, ``memory_bytes``, ``sm_count``, ``l2_bytes``, the
tensor-core peaks and the FP64 one: they come from its datasheet (a figure
given on the device or at the top level wins). A device entry may also set ``index_start`` (the first CUDA
index of its ``count`` devices) and ``numbered: true`` (number its name even when ``count`` is 1). A GPU entry
with neither ``torch_device`` nor ``index_start`` takes the CUDA indices after those of the entries before it on
its host (``{name: a, count: 2}`` then ``{name: b, count: 2}``: ``cuda:0`` to ``cuda:3``). A GPU the
datasheets do not know (its figures given on the entry) may set ``architecture`` to a product it is built like
(``architecture: H100``): the cost model takes that product's compute capability, memory kind, FP32 lanes per SM
and board power class, and none of its figures; without it, from ``model``, else from the device name. On a GPU
whose ``model`` the datasheets know, an ``architecture`` of another product family still wins, with a warning.

A file that reads but may not say what its author meant gets a warning line (``from_yaml``; ``from_dict`` with
``notes=True``): a GPU without ``model`` (the cost model then takes its architecture from the device *name*: one
named ``t4`` is priced as a T4, one named ``gpu`` as a generic GPU), a ``count`` entry whose name ends in a digit
(``name: l4, count: 2`` gives ``l40``, ``l41``; ``name: l4_`` gives ``l4_0``, ``l4_1``), two GPUs of one host
on the same ``torch_device``, an ``architecture`` that replaces a known ``model``'s, and a figure implausible for
its unit (a unit slip: ``peak_flops: 67`` or ``peak_flops_bf16: 312`` for TFLOP/s, ``l2_bytes: 40`` for MiB, a
link's ``bandwidth: 25`` for GB/s or ``latency: 10`` for microseconds).

A device entry, ``links``, ``links.intra_host`` / ``inter_host`` and a ``links.pairs`` entry accept only the
fields above: any other (a typo such as ``modle``) is a ``TopologyError`` listing the valid ones. Two
``links.pairs`` entries for the same pair (in either order) must agree. Other top-level keys are kept in
``meta`` (free-form notes, detection sources), except one that looks like a field (``link:``, ``dtpye:``) or a
device / links field at the top (``hosts: 2``, ``memory_bytes:``): that is a ``TopologyError`` naming it. The
reader and its checks are ``placement_rl._topology_reader``.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placement_rl import _local
from placement_rl._topology_reader import read_topology
from placement_rl.devices import DEFAULT_LAUNCH_OVERHEAD, DEVICE_KINDS, Device  # noqa: F401 (re-exported)
from placement_rl.errors import TopologyError


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
        try:
            devices = tuple(self.devices)
        except TypeError:
            raise TopologyError(f"topology '{self.name}': field 'devices' must be a list of Device, "
                                f"got {_shown(self.devices)}") from None
        for k, d in enumerate(devices):
            if not isinstance(d, Device):
                raise TopologyError(f"topology '{self.name}': devices[{k}] is a {type(d).__name__}, not a Device "
                                    "(build each with Device(...), or read mappings with DeviceTopology.from_dict)")
        object.__setattr__(self, "devices", tuple(_plain(d) for d in devices))
        for key in ("link_bandwidth", "link_latency"):
            try:
                arr = np.array(getattr(self, key), dtype=np.float64)
            except (TypeError, ValueError, OverflowError):
                n = len(devices)
                raise TopologyError(f"topology '{self.name}': '{key}' must be a {n}x{n} array of numbers, got "
                                    f"{_shown(getattr(self, key))}") from None
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)
        self.validate()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled (``multiprocessing``, ``copy.deepcopy``): the link arrays read-only again, as built."""
        self.__dict__.update(state)
        for key in ("link_bandwidth", "link_latency"):
            arr = state.get(key)
            if isinstance(arr, np.ndarray):
                arr.setflags(write=False)

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
                if not (_finite(v) and v > 0):
                    raise TopologyError(f"device '{d.name}': field '{key}' must be a finite positive number, "
                                        f"got {_shown(v)}")
            for key in ("l2_bytes", "peak_flops_tf32", "peak_flops_bf16", "peak_flops_fp16", "peak_flops_fp64",
                        "launch_overhead"):
                v = getattr(d, key)
                if not (_finite(v) and v >= 0):
                    raise TopologyError(f"device '{d.name}': field '{key}' must be a finite number >= 0, "
                                        f"got {_shown(v)}")
            if not _integer(d.sm_count) or d.sm_count < 0:
                raise TopologyError(f"device '{d.name}': field 'sm_count' must be an integer >= 0, "
                                    f"got {_shown(d.sm_count)}")
            if not _integer(d.host) or d.host < 0:
                raise TopologyError(f"device '{d.name}': field 'host' must be an integer >= 0 (devices of one "
                                    f"machine share it), got {_shown(d.host)}")
        off = ~np.eye(n, dtype=bool)
        for key, what in (("link_bandwidth", "bandwidth"), ("link_latency", "latency")):
            arr = getattr(self, key)
            if arr.shape != (n, n):
                raise TopologyError(f"topology '{self.name}': '{key}' must be {n}x{n}, got {arr.shape}")
            bad = off & ~(np.isfinite(arr) & ((arr > 0) if what == "bandwidth" else (arr >= 0)))
            if bad.any():  # each value before the symmetry: a NaN is not finite, whatever its mirror holds
                i, j = np.argwhere(bad)[0]
                need = "positive" if what == "bandwidth" else "non-negative"
                raise TopologyError(f"link {names[i]} <-> {names[j]}: '{what}' must be a finite {need} number, "
                                    f"got {arr[i, j]:g}")
            if np.isnan(np.diag(arr)).any():
                i = int(np.flatnonzero(np.isnan(np.diag(arr)))[0])
                raise TopologyError(f"topology '{self.name}': '{key}[{i}, {i}]' ({names[i]} to itself) is nan; "
                                    f"the diagonal is {'inf' if what == 'bandwidth' else '0'}")
            if not np.allclose(arr, arr.T, equal_nan=False):
                raise TopologyError(f"topology '{self.name}': '{key}' must be symmetric")
        if len(self.link_kind) != n or any(len(row) != n for row in self.link_kind):
            raise TopologyError(f"topology '{self.name}': 'link_kind' must be {n}x{n}")

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
    def from_dict(data: Any, *, where: str = "topology", notes: bool = False) -> "DeviceTopology":
        """The topology a mapping describes (the YAML schema above). ``notes=True`` warns, as ``from_yaml`` does for
        a file, where it may not say what its author meant (a GPU without ``model:`` priced by its name, a name
        ending in a digit that ``count`` numbers, two GPUs of a host on one ``torch_device``); off by default, for
        topologies built in code (the training sampler names its GPUs ``h0_t4_0`` and so on on purpose)."""
        return DeviceTopology(**read_topology(data, where, notes=notes))

    @staticmethod
    def from_yaml(path: str | os.PathLike) -> "DeviceTopology":
        import yaml

        p = Path(path)
        if p.is_dir():
            raise _folder_error(p)
        if not p.is_file():
            raise TopologyError(f"topology file '{p}' does not exist")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise TopologyError(f"{p}: malformed YAML ({str(exc).splitlines()[0]})") from None
        except UnicodeDecodeError as exc:
            raise TopologyError(f"{p}: is not a UTF-8 text file (byte {exc.start}: {exc.reason}); a topology "
                                "file is YAML text") from None
        return DeviceTopology(**read_topology(data, str(p), notes=True))

    def to_dict(self) -> dict[str, Any]:
        n = self.num_devices
        pairs = [{"between": [self.devices[i].name, self.devices[j].name],
                  "bandwidth": float(self.link_bandwidth[i, j]), "latency": float(self.link_latency[i, j]),
                  "kind": self.link_kind[i][j]} for i in range(n) for j in range(i + 1, n)]
        devs = [{"name": d.name, "kind": d.kind, "torch_device": d.torch_device, "host": d.host,
                 "peak_flops": d.peak_flops, "mem_bandwidth": d.mem_bandwidth, "memory_bytes": d.memory_bytes,
                 "launch_overhead": d.launch_overhead, "sm_count": d.sm_count, "l2_bytes": d.l2_bytes,
                 "peak_flops_tf32": d.peak_flops_tf32, "peak_flops_bf16": d.peak_flops_bf16,
                 "peak_flops_fp16": d.peak_flops_fp16, "peak_flops_fp64": d.peak_flops_fp64, "model": d.model,
                 **({"architecture": d.architecture} if d.architecture else {})}
                for d in self.devices]
        return {**dict(self.meta), "name": self.name, "description": self.description, "devices": devs,
                "links": {"pairs": pairs}}


def _finite(v: Any) -> bool:
    """``v`` is a real number (not a bool) that a float holds finitely (a Python int past float range is not)."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _integer(v: Any) -> bool:
    """``v`` is an integer (a Python or numpy one), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _shown(v: Any, width: int = 60) -> str:
    """``repr(v)``, cut to ``width`` characters (a 400-digit integer, a long list)."""
    r = repr(v)
    return r if len(r) <= width else r[:width - 3] + "..."


def _plain(d: Device) -> Device:
    """``d`` with numpy scalars as Python numbers (``np.int32(80)`` -> 80), so ``to_dict`` writes plain YAML."""
    fields = {k: v.item() for k, v in vars(d).items() if isinstance(v, np.generic)}
    return replace(d, **fields) if fields else d


# ------------------------------------------------------------------ presets
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
    if not preset.is_file() and p.is_dir():
        raise _folder_error(p)
    if not preset.is_file():
        raise TopologyError(f"unknown topology preset '{s}' (presets: {', '.join(preset_names())}, local; "
                            "or give a YAML file path)")
    return DeviceTopology.from_yaml(preset)


def _folder_error(p: Path) -> TopologyError:
    """A topology path that is a folder: say so, and name a few of its YAML files."""
    files = sorted(str(q) for q in p.glob("*.y*ml") if q.suffix in (".yaml", ".yml"))
    hint = (f"give one of its files ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})" if files
            else "it holds no .yaml file; give a topology YAML file")
    return TopologyError(f"topology '{p}' is a folder, not a YAML file: {hint} or a preset name")


def detect_local(*, measure: bool = True) -> DeviceTopology:
    """The local machine: the CPU always, plus every CUDA GPU (NVML figures where available)."""
    return DeviceTopology(**_local.detect(measure=measure))
