"""Importer for NeuSight's public GPU measurements (sitar-lab/NeuSight, MIT licence; ASPLOS 2025).

Reads ``labels/<GPU>/<model>-<train|inf>-<seq>-<batch>.csv`` (one row per ``torch.fx`` node of the
embedding, **one** transformer layer and the head, with fwd / bwd / grad-accumulation times in ms) and
the ``.json`` beside it (the whole model measured end to end), ``kernels/<op>/<GPU>.csv`` (single-kernel
forward times) and ``device_configs/<GPU>.json`` (datasheet figures). Any problem is a one-line
``ProfileError`` naming the file.

``label_graph(workload)`` turns a label file into a ``CompGraph`` (FLOPs and bytes from the recorded
shapes, edges from the fx inputs), so the cost model predicts it like any captured graph; the whole
model is ``non-layer nodes + num_layer x layer nodes`` (``whole_model``).
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from placement_rl.errors import ProfileError

LABEL_COLUMNS = ("op", "target", "_input_nodes", "meta", "input_shapes", "output_shape", "fw_latency", "bw_latency",
                 "acc_latency", "dtype", "Name")
# embedding tables NeuSight's models hold (the fx rows give only the index shape of a call_module embedding)
VOCAB = {"bert_large": 30522, "gpt2_large": 50257, "gpt3_xl": 50257, "gpt3_27": 50257, "opt_13": 50272}
POSITIONS = {"bert_large": 512, "gpt2_large": 1024, "gpt3_xl": 2048, "gpt3_27": 2048, "opt_13": 2050}
_LAYER0 = re.compile(r"(^|\.)(h|layer|layers)\.0(\.|$)")
_FILE = re.compile(r"^(?P<model>[a-z0-9_]+)-(?P<mode>train|inf)-(?P<seq>\d+)-(?P<batch>\d+)$")
_DTYPE_BYTES = {"torch.float32": 4, "torch.int64": 8, "torch.bool": 1, "torch.float16": 2, "torch.bfloat16": 2,
                "torch.int32": 4}


@dataclass(frozen=True)
class LabelRow:
    name: str
    op_type: str        # normalised op name (``addmm``, ``linear``, ``layer_norm``, ``view`` ...)
    module_path: str    # innermost module of the fx node (``transformer.h.0.attn.c_attn``)
    inputs: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    out_bytes: float
    fwd: float          # seconds
    bwd: float          # seconds, backward + gradient accumulation
    param_bytes: float
    fwd_flops: float


@dataclass(frozen=True)
class LabelWorkload:
    """One label file: a model configuration measured on one GPU."""

    path: str
    gpu: str
    model: str
    mode: str
    seq_len: int
    batch: int
    num_layer: int
    e2e: float          # seconds, the whole model end to end (fwd + bwd for train)
    fwd_total: float
    bwd_total: float
    rows: tuple[LabelRow, ...]

    @property
    def key(self) -> str:
        return f"{self.model}-{self.mode}-{self.seq_len}-{self.batch}"


def _fail(path: Path, what: str) -> ProfileError:
    return ProfileError(f"{path}: {what}; expected a NeuSight label file (see ../shared/gpu-measurements/README.md)")


def _shapes(text: str, path: Path, row: int) -> tuple[tuple[int, ...], ...]:
    try:
        val = ast.literal_eval(text) if text.strip() else []
    except (ValueError, SyntaxError):
        raise _fail(path, f"row {row}: 'input_shapes' is not a list of shapes ({text[:40]!r})") from None
    if not isinstance(val, list):
        raise _fail(path, f"row {row}: 'input_shapes' is not a list")
    return tuple(tuple(int(x) for x in s) if isinstance(s, (list, tuple)) else () for s in val)


def _shape(text: str, path: Path, row: int) -> tuple[int, ...]:
    try:
        val = ast.literal_eval(text) if text.strip() else ()
    except (ValueError, SyntaxError):
        raise _fail(path, f"row {row}: 'output_shape' is not a shape ({text[:40]!r})") from None
    if isinstance(val, int):
        return (val,)
    if not isinstance(val, (list, tuple)) or not all(isinstance(x, int) for x in val):
        return ()
    return tuple(val)


def _ms(text: str, path: Path, row: int, col: str) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise _fail(path, f"row {row}: '{col}' is not a number ({text!r})") from None
    if not math.isfinite(v) or v < 0:
        raise _fail(path, f"row {row}: '{col}' must be a finite non-negative time, got {v}")
    return v * 1e-3


def _op_name(op: str, target: str, module_cls: str) -> str:
    if op in ("placeholder", "get_attr", "output"):
        return {"placeholder": "input", "get_attr": "get_attr", "output": "output"}[op]
    if op == "call_module":
        base = module_cls.rsplit(".", 1)[-1]
        return {"Linear": "linear", "Embedding": "embedding", "LayerNorm": "layer_norm", "Dropout": "dropout",
                "Tanh": "tanh", "ReLU": "relu", "GELUActivation": "gelu", "NewGELUActivation": "gelu",
                "Conv1D": "addmm", "Conv2d": "conv2d", "Softmax": "softmax"}.get(base, base.lower())
    if op == "call_method":
        return target
    m = re.match(r"<(?:built-in (?:function|method)|function|class) '?([A-Za-z_0-9.]+)", target)
    name = m.group(1).rsplit(".", 1)[-1] if m else target
    return {"truediv": "div", "floordiv": "div", "max": "maximum"}.get(name, name)


def _prod(shape: Sequence[int]) -> float:
    return float(np.prod(shape)) if shape else 1.0


def read_labels(path: str | Path) -> LabelWorkload:
    """Read one NeuSight label CSV and the whole-model JSON beside it."""
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"NeuSight label file '{p}' does not exist")
    m = _FILE.match(p.stem)
    if not m:
        raise _fail(p, "file name must be <model>-<train|inf>-<seq_len>-<batch>.csv")
    jpath = p.with_suffix(".json")
    if not jpath.is_file():
        raise ProfileError(f"{jpath}: whole-model measurement missing beside {p.name}")
    try:
        meta = json.loads(jpath.read_text())
        num_layer, e2e = int(meta["num_layer"]), float(meta["e2e_latency"]) * 1e-3
        fw_t, bw_t = float(meta["fw_latency"]) * 1e-3, float(meta.get("bwall_latency", 0.0)) * 1e-3
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProfileError(f"{jpath}: malformed JSON; expected num_layer, fw_latency, bwall_latency, e2e_latency"
                           ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{jpath}: field {exc} missing or not a number; expected num_layer, fw_latency, "
                           "bwall_latency, e2e_latency") from None
    if num_layer < 1 or not all(math.isfinite(x) and x >= 0 for x in (e2e, fw_t, bw_t)):
        raise ProfileError(f"{jpath}: num_layer must be >= 1 and latencies finite and non-negative")
    model = m.group("model")
    try:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in LABEL_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise _fail(p, f"column '{missing[0]}' missing")
            raw = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _fail(p, f"cannot read ({exc.__class__.__name__})") from None
    if not raw:
        raise _fail(p, "no rows")
    getattr_bytes: dict[str, float] = {}
    rows: list[LabelRow] = []
    for k, r in enumerate(raw, start=2):
        mods = re.findall(r"\('([^']*)', <class '([^']*)'>\)", r["meta"] or "")
        module_path, module_cls = (mods[-1] if mods else ("", ""))
        op = _op_name(r["op"], r["target"], module_cls if r["op"] == "call_module" else "")
        if op == "dropout" and m.group("mode") == "inf":
            op = "dropout_eval"  # an inference run is in eval mode: dropout is the identity, no kernel
        ins = tuple(re.findall(r"([A-Za-z_][A-Za-z_0-9]*): None", r["_input_nodes"] or ""))
        in_shapes = _shapes(r["input_shapes"], p, k)
        out_shape = _shape(r["output_shape"], p, k)
        elem = _DTYPE_BYTES.get((r["dtype"] or "").strip(), 0)
        out_bytes = _prod(out_shape) * elem if out_shape else 0.0
        fwd = _ms(r["fw_latency"], p, k, "fw_latency")
        bwd = _ms(r["bw_latency"], p, k, "bw_latency") + _ms(r["acc_latency"], p, k, "acc_latency")
        if op == "get_attr":
            getattr_bytes[r["Name"]] = _prod(out_shape) * 4 if out_shape else 0.0
            module_path = r["target"]
        params, flops = 0.0, 0.0
        params += sum(getattr_bytes.get(i, 0.0) for i in ins)
        if op == "linear" and in_shapes and out_shape:
            kdim, ndim = in_shapes[0][-1], out_shape[-1]
            params += 4.0 * (kdim * ndim + ndim)
            flops = 2.0 * _prod(out_shape) * kdim
        elif op in ("addmm", "mm", "matmul", "bmm", "baddbmm") and len(in_shapes) >= 2 and out_shape:
            a = in_shapes[-2] if op in ("addmm", "baddbmm") else in_shapes[0]
            flops = 2.0 * _prod(out_shape) * (a[-1] if a else 1)
        elif op == "layer_norm" and out_shape:
            params += 8.0 * out_shape[-1]
        elif op == "embedding" and out_shape and r["op"] == "call_module":
            leaf = module_path.rsplit(".", 1)[-1]
            rows_ = 2 if "token_type" in leaf else POSITIONS.get(model, 0) if ("pos" in leaf or leaf == "wpe") \
                else VOCAB.get(model, 0)
            params += 4.0 * rows_ * out_shape[-1]
        rows.append(LabelRow(name=r["Name"], op_type=op, module_path=module_path or r["target"], inputs=ins,
                             input_shapes=in_shapes, output_shape=out_shape, out_bytes=out_bytes, fwd=fwd, bwd=bwd,
                             param_bytes=params, fwd_flops=flops))
    return LabelWorkload(path=str(p), gpu=p.parent.name, model=model, mode=m.group("mode"),
                         seq_len=int(m.group("seq")), batch=int(m.group("batch")), num_layer=num_layer, e2e=e2e,
                         fwd_total=fw_t, bwd_total=bw_t, rows=tuple(rows))


def label_files(root: str | Path) -> list[Path]:
    """Every label CSV under ``<root>/labels/<GPU>/`` (``root`` is the ``neusight`` folder)."""
    base = Path(root) / "labels"
    if not base.is_dir():
        raise ProfileError(f"'{base}' is not a folder of NeuSight labels (labels/<GPU>/*.csv)")
    return sorted(base.glob("*/*.csv"))


def in_layer0(module_path: str) -> bool:
    """True for nodes of the first transformer layer (``...h.0...``, ``...layer.0...``, ``...layers.0...``)."""
    return bool(_LAYER0.search(module_path))


def label_graph(w: LabelWorkload):
    """A ``CompGraph`` of the label file's nodes (placeholders, parameters and the output dropped)."""
    from placement_rl.graph.ir import CompGraph

    keep = [r for r in w.rows if r.op_type not in ("get_attr", "output")]
    index = {r.name: i for i, r in enumerate(keep)}
    edges, ebytes = [], []
    for i, r in enumerate(keep):
        for src in r.inputs:
            j = index.get(src)
            if j is not None and j != i:
                edges.append((j, i))
                ebytes.append(keep[j].out_bytes)
    grad_ops = ("linear", "addmm", "mm", "matmul", "bmm", "baddbmm")
    return CompGraph(names=tuple(r.name for r in keep), op_types=tuple(r.op_type for r in keep),
                     module_paths=tuple(r.module_path for r in keep),
                     fwd_flops=[r.fwd_flops for r in keep],
                     bwd_flops=[2.0 * r.fwd_flops if r.op_type in grad_ops else 0.0 for r in keep],
                     out_bytes=[r.out_bytes for r in keep], param_bytes=[r.param_bytes for r in keep],
                     act_bytes=[0.0] * len(keep), edges=np.array(edges, dtype=np.int64).reshape(-1, 2),
                     edge_bytes=ebytes, name=f"neusight:{w.gpu}:{w.key}",
                     meta={"source": "neusight", "gpu": w.gpu, "workload": w.key})


def measured_times(w: LabelWorkload, graph) -> tuple[np.ndarray, np.ndarray]:
    """``(fwd [N], bwd [N])`` measured seconds of ``label_graph(w)``'s nodes."""
    by_name = {r.name: r for r in w.rows}
    return (np.array([by_name[n].fwd for n in graph.names]), np.array([by_name[n].bwd for n in graph.names]))


def layer_weights(graph, num_layer: int) -> np.ndarray:
    """Per-node multiplicity in the whole model: ``num_layer`` for first-layer nodes, 1 for the rest."""
    return np.array([float(num_layer) if in_layer0(m) else 1.0 for m in graph.module_paths])


def whole_model(fwd: np.ndarray, bwd: np.ndarray, weights: np.ndarray, train: bool = True) -> float:
    """Whole-model time from per-node times of a one-layer graph."""
    return float(weights @ (fwd + (bwd if train else 0.0)))


@dataclass(frozen=True)
class DeviceConfig:
    name: str
    memory_bytes: float
    mem_bandwidth: float
    sm_count: int
    peak_flops: float
    l2_bytes: float
    clock_mhz: float


def read_device_config(path: str | Path) -> DeviceConfig:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"NeuSight device config '{p}' does not exist")
    try:
        d = json.loads(p.read_text())
        return DeviceConfig(name=str(d["Device"]), memory_bytes=float(d["Dev_Mem"]) * 2**30,
                            mem_bandwidth=float(d["Mem_Bw"]) * 1e9, sm_count=int(d["Num_Sm"]),
                            peak_flops=float(d["SingleFLOPs"]) * 1e9, l2_bytes=float(d["L2Cache"]) * 2**20,
                            clock_mhz=float(d["Freq"]))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProfileError(f"{p}: malformed JSON; expected a NeuSight device config") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{p}: field {exc} missing or not a number (Device, Dev_Mem, Mem_Bw, Num_Sm, "
                           "SingleFLOPs, L2Cache, Freq)") from None


def default_data_dir() -> Path | None:
    """The public GPU measurements: ``$PLACEMENT_RL_GPU_DATA``, else ``<repo>/../shared/gpu-measurements``."""
    import os

    env = os.environ.get("PLACEMENT_RL_GPU_DATA")
    if env:
        return Path(env)
    p = Path(__file__).resolve().parents[3] / "shared" / "gpu-measurements"
    return p if p.is_dir() else None
