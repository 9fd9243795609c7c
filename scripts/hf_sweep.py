"""Capture every transformers model type that `graph=hf` can build, each from its library defaults cut to 2 layers.

    python scripts/hf_sweep.py --out outputs/hf_sweep.jsonl [--types llama gemma3 ...] [--jobs 2]

One subprocess per model type (a 120 s limit each, ``--jobs`` at a time): the type's default config with every
layer count above 2 set to 2 (``text_config``'s for a composite config), batch 2 x 32 tokens, ``task: auto``. Each
result is a JSON line: ``ok`` (nodes, seconds, task, class), ``clean`` (the one-line error a user would see),
``traceback`` (a bug: the exception and its last frame) or ``timeout``; the counts are printed at the end. The
types are those with a class in one of the four auto mappings the builder uses (causal / masked / seq2seq LM,
image classification) in the installed transformers.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers", "num_encoder_layers", "decoder_num_layers")


def one(kind: str) -> dict:
    """Build and capture one model type (run in its own process)."""
    import traceback

    import torch

    torch.set_num_threads(1)
    out: dict = {"type": kind}
    t0 = time.perf_counter()
    try:
        import transformers as tf

        from placement_rl.graph.spec import graph_from_spec

        tf.logging.set_verbosity_error()
        try:
            base = tf.AutoConfig.for_model(kind)
        except Exception:  # noqa: BLE001 -- the builder reports it (a default config the library refuses)
            base = None
        ov = {} if base is None else {k: 2 for k in LAYER_KEYS if k in base.to_dict() and isinstance(
            getattr(base, k, None), int) and not isinstance(getattr(base, k), bool) and getattr(base, k) > 2}
        text = getattr(base, "text_config", None)
        if base is not None and not ov and isinstance(getattr(text, "num_hidden_layers", None), int) and text.num_hidden_layers > 2:
            ov["num_hidden_layers"] = 2  # the builder sets it in text_config
        g = graph_from_spec({"source": "hf", "model_type": kind, "overrides": ov, "batch_size": 2, "seq_len": 32})
        hf = g.meta["hf"]
        out.update(status="ok", nodes=g.num_nodes, task=hf["task"], cls=hf["class"], params=hf["params"])
    except BaseException as exc:  # noqa: BLE001 -- every outcome is a record
        from placement_rl.errors import PlacementRLError

        if isinstance(exc, PlacementRLError):
            out.update(status="clean", msg=str(exc)[:300])
        else:
            tb = traceback.extract_tb(exc.__traceback__)
            out.update(status="traceback", exc=type(exc).__name__, msg=(str(exc).strip().splitlines() or [""])[0][:300],
                       last=f"{tb[-1].filename.split('site-packages/')[-1]}:{tb[-1].lineno}" if tb else None)
    out["secs"] = round(time.perf_counter() - t0, 1)
    return out


def model_types() -> list[str]:
    from transformers.models.auto import modeling_auto

    from placement_rl.graph.models.hf_auto import _MAPPING_NAMES

    return sorted({k for attr in _MAPPING_NAMES.values() for k in getattr(modeling_auto, attr, {})})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/hf_sweep.jsonl")
    ap.add_argument("--types", nargs="*", default=None, help="model types (default: every type with a class)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the subprocess
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(a.one)))
        return 0
    types = a.types or model_types()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    counts: collections.Counter[str] = collections.Counter()

    def run(kind: str) -> dict:
        try:
            r = subprocess.run([sys.executable, __file__, "--one", kind], capture_output=True, text=True, timeout=120,
                               env=env)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            res = json.loads(lines[-1][7:]) if lines else {"type": kind, "status": "crash", "rc": r.returncode,
                                                           "msg": (r.stderr.strip().splitlines() or [""])[-1][:300]}
        except subprocess.TimeoutExpired:
            res = {"type": kind, "status": "timeout"}
        return res

    with open(out, "w") as fh, ThreadPoolExecutor(max(1, a.jobs)) as ex:
        for i, res in enumerate(ex.map(run, types), 1):
            fh.write(json.dumps(res) + "\n")
            fh.flush()
            counts[res["status"]] += 1
            print(f"[{i}/{len(types)}] {res['type']}: {res['status']} {res.get('cls') or res.get('msg', '')}"[:160],
                  flush=True)
    print(f"{len(types)} model types: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()) + f"; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
