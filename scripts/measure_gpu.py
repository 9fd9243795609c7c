"""Measure the local CUDA GPU the way NeuSight's public tables were measured, in NeuSight's file formats, so the
calibrated cost model can be checked on (or fitted with) a GPU of your own.

    python scripts/measure_gpu.py --out outputs/gpu_<name> --shapes <dir of shapes_<op>.csv>
           [--parts env models kernels] [--kernel-seconds 120] [--models bert_large gpt2_large ...]

Writes under ``--out``:

* ``env.json``: the device's properties (torch, ``nvidia-smi``), a measured device-to-device copy bandwidth and
  an fp32 (no TF32) matrix-product rate;
* ``labels/<workload>.json``: whole-model fp32 forward and forward + backward times of the NeuSight workloads
  (``<model>-<train|inf>-<seq>-<batch>``, Hugging Face models built from their configs with eager attention,
  median of the timed steps), the format of NeuSight's ``labels/<GPU>/*.json``; and ``optimizer.json``, an
  AdamW step over each trained model's parameters;
* ``kernels/<op>.csv``: single-kernel fp32 forward times (ms, ``Latency``) of linear, bmm, conv, ln, softmax,
  gelu and add at the shapes listed in ``--shapes`` (the columns of NeuSight's kernel tables), in the listed order
  until ``--kernel-seconds`` per op class run out; with ``--kernel-names-every N`` every N-th shape also records
  the kernels one call launched (``Kernels``, as NeuSight's tables do: e.g. whether cuDNN ran a convolution as
  Winograd).

Timing: CUDA events, after warm-up; TF32 off for matrix products and cuDNN (fp32 as NeuSight measured);
``cudnn.benchmark`` on. Progress lines go to stdout.

``--dtype tf32`` (TF32 on for matrix products and cuDNN) or ``--dtype bf16`` (kernels on bf16 tensors, models
under ``torch.autocast(bfloat16)``) measures the tensor-core paths the cost model prices from datasheet peaks
alone (no public table has them): the kernels go to ``kernels_<dtype>/``, the models to ``labels_<dtype>/``, and
``env.json`` gains ``<dtype>_matmul_flops``; ``scripts/fidelity_measured_gpu.py`` checks them against the model
with ``dtype=<dtype>`` when the folder has them.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import torch
import torch.nn.functional as F

from placement_rl.profiling.timing import synchronize as sync

# The NeuSight workloads: Hugging Face architecture and sizes read off the label files' one-layer traces
# (hidden size, heads, layers, vocabulary, head).
MODELS = {
    "bert_large": dict(arch="bert", hidden=1024, heads=16, layers=24, ffn=4096, vocab=30522, pos=512),
    "gpt2_large": dict(arch="gpt2", hidden=1280, heads=20, layers=36, ffn=5120, vocab=50257, pos=1024),
    "gpt3_xl": dict(arch="gpt2", hidden=3072, heads=24, layers=24, ffn=12288, vocab=50257, pos=2048),
    "gpt3_27": dict(arch="gpt2", hidden=2560, heads=32, layers=32, ffn=10240, vocab=50257, pos=2048),
    "opt_13": dict(arch="opt", hidden=2048, heads=32, layers=24, ffn=8192, vocab=50272, pos=2048),
}
WORKLOADS = [
    "bert_large-train-512-2", "bert_large-train-512-8", "gpt2_large-train-1024-1", "gpt2_large-train-1024-4",
    "gpt3_xl-train-2048-1", "gpt3_27-train-2048-1", "opt_13-train-2048-1", "opt_13-train-2048-2",
    "bert_large-inf-512-8", "bert_large-inf-512-16", "gpt2_large-inf-1024-4", "gpt2_large-inf-1024-8",
    "gpt3_xl-inf-2048-2", "gpt3_27-inf-2048-2", "opt_13-inf-2048-2", "opt_13-inf-2048-8",
]
OPS = ("linear", "bmm", "conv", "ln", "softmax", "gelu", "add")
DTYPES = ("fp32", "tf32", "bf16")


def suffix(dtype: str) -> str:
    """Folder suffix of a dtype's files: fp32 keeps NeuSight's names (``kernels``, ``labels``)."""
    return "" if dtype == "fp32" else f"_{dtype}"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def timed(fn, dev: torch.device, *, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` (CUDA events between calls; wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    sync(dev)
    if dev.type != "cuda":
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    ev[0].record()
    for i in range(repeats):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize(dev)
    return [1e-3 * ev[i].elapsed_time(ev[i + 1]) for i in range(repeats)]


# ---------------------------------------------------------------------------------------------------- env


def part_env(out: Path, dev: torch.device, dtype: str = "fp32") -> None:
    env: dict = {"torch": torch.__version__, "python": sys.version.split()[0], "device": str(dev)}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env["props"] = {k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                        for k in dir(p) if not k.startswith("_") for v in [getattr(p, k)]
                        if not callable(v)}
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        q = ("name,clocks.max.sm,clocks.max.mem,clocks.sm,clocks.mem,power.limit,power.max_limit,memory.total,"
             "driver_version,pcie.link.gen.max,temperature.gpu")
        try:
            env["nvidia_smi"] = dict(zip(q.split(","), subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True,
                timeout=20).stdout.strip().split(", ")))
        except (OSError, subprocess.SubprocessError) as exc:
            env["nvidia_smi"] = f"failed: {exc}"
    # copy bandwidth: bytes read + written over time
    n = (1 << 28) if dev.type == "cuda" else (1 << 24)
    a = torch.randn(n, device=dev)
    b = torch.empty_like(a)
    t = median(timed(lambda: b.copy_(a), dev, warmup=3, repeats=10))
    env["copy_bytes_per_s"] = 2 * 4 * n / t
    a = b = None  # free the copy buffers before the matrix product
    # fp32 matrix product (TF32 off)
    m = 8192 if dev.type == "cuda" else 512
    x, y = torch.randn(m, m, device=dev), torch.randn(m, m, device=dev)
    t = median(timed(lambda: x @ y, dev, warmup=3, repeats=10))
    env["fp32_matmul_flops"] = 2 * m ** 3 / t
    if dtype != "fp32":  # the same product on the tensor-core path measured
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        xd, yd = (x, y) if dtype == "tf32" else (x.bfloat16(), y.bfloat16())
        t = median(timed(lambda: xd @ yd, dev, warmup=3, repeats=10))
        env[f"{dtype}_matmul_flops"] = 2 * m ** 3 / t
        torch.backends.cuda.matmul.allow_tf32 = False
        xd = yd = None
    prev = out / "env.json"
    if prev.is_file():  # a later call for another dtype keeps what an earlier call measured
        env = {**json.loads(prev.read_text()), **env}
    prev.write_text(json.dumps(env, indent=1))
    log(f"env: copy {env['copy_bytes_per_s'] / 1e9:.0f} GB/s, fp32 matmul {env['fp32_matmul_flops'] / 1e12:.1f} "
        f"TFLOP/s")


# ---------------------------------------------------------------------------------------------------- models


def build_model(name: str, dev: torch.device, scale: float = 1.0):
    """The Hugging Face model of a NeuSight workload, fp32, eager attention, initialised on ``dev``."""
    import transformers as tf
    c = dict(MODELS[name])
    if scale != 1.0:  # a small stand-in for a CPU smoke test
        c.update(hidden=64, heads=4, layers=2, ffn=256, vocab=1000)
    if c["arch"] == "bert":
        cfg = tf.BertConfig(hidden_size=c["hidden"], num_attention_heads=c["heads"], num_hidden_layers=c["layers"],
                            intermediate_size=c["ffn"], vocab_size=c["vocab"], max_position_embeddings=c["pos"])
        cls = tf.BertForSequenceClassification
    elif c["arch"] == "gpt2":
        cfg = tf.GPT2Config(n_embd=c["hidden"], n_head=c["heads"], n_layer=c["layers"], n_inner=c["ffn"],
                            vocab_size=c["vocab"], n_positions=c["pos"], use_cache=False)
        cls = tf.GPT2LMHeadModel
    else:
        cfg = tf.OPTConfig(hidden_size=c["hidden"], num_attention_heads=c["heads"], num_hidden_layers=c["layers"],
                           ffn_dim=c["ffn"], vocab_size=c["vocab"], max_position_embeddings=c["pos"],
                           word_embed_proj_dim=c["hidden"], use_cache=False)
        cls = tf.OPTForCausalLM
    try:
        cfg._attn_implementation = "eager"
    except (AttributeError, ValueError):
        pass
    with torch.device(dev):
        model = cls(cfg)
    return model.float(), c["layers"], c["vocab"], getattr(cfg, "_attn_implementation", "?")


def part_models(out: Path, dev: torch.device, names: list[str], *, steps: int, warmup: int, scale: float,
                dtype: str = "fp32") -> None:
    import contextlib

    lab = out / f"labels{suffix(dtype)}"
    lab.mkdir(exist_ok=True)
    cast = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if dtype == "bf16" else contextlib.nullcontext
    opt_rows = {}
    for w in WORKLOADS:
        model_name, mode, seq, batch = w.split("-")
        if model_name not in names:
            continue
        seq, batch = int(seq), int(batch)
        if scale != 1.0:
            seq, batch = min(seq, 32), min(batch, 2)
        t0 = time.perf_counter()
        try:
            model, layers, vocab, attn = build_model(model_name, dev, scale)
            ids = torch.randint(0, vocab, (batch, seq), device=dev)
            train = mode == "train"
            model.train(train)

            def fwd():
                with cast():
                    o = model(input_ids=ids)
                return o.logits

            if train:
                fw, bw = [], []
                for i in range(warmup + steps):
                    model.zero_grad(set_to_none=True)
                    e = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if dev.type == "cuda" else None
                    sync(dev)
                    t_a = time.perf_counter()
                    if e:
                        e[0].record()
                    loss = fwd().float().mean()
                    if e:
                        e[1].record()
                    sync(dev)
                    t_b = time.perf_counter()
                    loss.backward()
                    if e:
                        e[2].record()
                    sync(dev)
                    t_c = time.perf_counter()
                    if i >= warmup:
                        if e:
                            fw.append(1e-3 * e[0].elapsed_time(e[1]))
                            bw.append(1e-3 * e[1].elapsed_time(e[2]))
                        else:
                            fw.append(t_b - t_a)
                            bw.append(t_c - t_b)
                rec = {"num_layer": layers, "fw_latency": 1e3 * median(fw), "bwall_latency": 1e3 * median(bw)}
                rec["e2e_latency"] = rec["fw_latency"] + rec["bwall_latency"]
                if model_name not in opt_rows:  # one AdamW step over the trained model's parameters
                    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
                    ts = timed(opt.step, dev, warmup=2, repeats=max(3, steps))
                    opt_rows[model_name] = {"params": sum(p.numel() for p in model.parameters()),
                                            "adamw_step_ms": 1e3 * median(ts), "foreach": True}
                    del opt
            else:
                with torch.no_grad():
                    fw = timed(fwd, dev, warmup=warmup, repeats=steps)
                rec = {"num_layer": layers, "fw_latency": 1e3 * median(fw), "bwall_latency": 0.0}
                rec["e2e_latency"] = rec["fw_latency"]
            rec.update(steps=steps, samples_ms=[1e3 * x for x in fw], attn=attn, dtype=dtype,
                       peak_mem_gb=(torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None))
            (lab / f"{w}.json").write_text(json.dumps(rec, indent=1))
            log(f"{w}: e2e {rec['e2e_latency']:.1f} ms (fw {rec['fw_latency']:.1f}, bw {rec['bwall_latency']:.1f}; "
                f"attention {attn}; {time.perf_counter() - t0:.0f} s)")
        except Exception as exc:  # one workload failing (memory, API) must not stop the rest
            log(f"{w}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            model = ids = loss = None  # noqa: F841
            if dev.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
        (out / f"optimizer{suffix(dtype)}.json").write_text(json.dumps(opt_rows, indent=1))


# ---------------------------------------------------------------------------------------------------- kernels


def kernel_fn(op: str, r: dict[str, int], dev: torch.device, dtype: str = "fp32"):
    """A closure running one forward kernel of ``op`` at row ``r``'s shape (NeuSight's naming: a linear or bmm
    row is ``(B, M, N) @ (N, K) -> (B, M, K)``), on bf16 tensors for ``dtype="bf16"``."""
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = lambda *s: torch.randn(*s, device=dev, dtype=kind)  # noqa: E731
    if op in ("linear", "bmm"):
        b, m, n, k = r["B"], r["M"], r["N"], r["K"]
        if op == "linear":
            x, w = g(b, m, n), g(k, n)
            return lambda: F.linear(x, w)
        x, y = g(b, m, n), g(b, n, k)
        return lambda: torch.bmm(x, y)
    if op == "conv":
        b, ci, co, ks, hw, st, pd = (r[c] for c in ("B", "Input_Channel", "Output_Channel", "Kernel_Szie",
                                                      "Input_Size", "Stride", "Padding"))
        x, w, bias = g(b, ci, hw, hw), g(co, ci, ks, ks), g(co)
        return lambda: F.conv2d(x, w, bias, stride=st, padding=pd)
    b, h = r["B"], r["H"]
    x = g(b, h)
    if op == "ln":
        wt, bs = g(h), g(h)
        return lambda: F.layer_norm(x, (h,), wt, bs)
    if op == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if op == "gelu":
        return lambda: F.gelu(x)
    y = g(b, h)
    return lambda: x + y


def kernel_names(fn, dev: torch.device) -> str:
    """The kernels one call of ``fn`` launches, ';'-joined in launch order without repeats (the format of
    NeuSight's ``Kernels`` column), from ``torch.profiler``: CUDA kernels on a GPU (which algorithm cuDNN / cuBLAS
    ran: Winograd, implicit GEMM, split-K ...), the aten ops on a CPU (a smoke test of the plumbing)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        sync(dev)
    want = DeviceType.CUDA if cuda else DeviceType.CPU
    names: list[str] = []
    for e in prof.events():
        if e.device_type == want and e.name not in names:
            names.append(e.name.replace(";", ","))
    return ";".join(names)


def part_kernels(out: Path, dev: torch.device, shapes: Path, ops: list[str], *, seconds: float,
                 max_rows: int, dtype: str = "fp32", names_every: int = 0) -> None:
    kd = out / f"kernels{suffix(dtype)}"
    kd.mkdir(exist_ok=True)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    for op in ops:
        src = shapes / f"shapes_{op}.csv"
        if not src.exists():
            log(f"{op}: no {src}, skipped")
            continue
        with open(src) as fh:
            rd = csv.DictReader(fh)
            cols = list(rd.fieldnames or [])
            rows = [{c: int(float(v)) for c, v in r.items()} for r in rd][:max_rows]
        t_end = time.perf_counter() + seconds
        done, failed = [], 0
        for i, r in enumerate(rows):
            if time.perf_counter() > t_end:
                break
            try:
                fn = kernel_fn(op, r, dev, dtype)
                t = median(timed(fn, dev, warmup=3, repeats=7))
                row = [op, 1e3 * t, name] + [r[c] for c in cols]
                if names_every > 0:  # after the timing, so the profiler never slows a timed call
                    row.append(kernel_names(fn, dev) if i % names_every == 0 else "")
                done.append(row)
            except Exception:  # noqa: BLE001 - a shape that does not fit (memory) is skipped and counted
                failed += 1
            fn = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        with open(kd / f"{op}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["OPName", "Latency", "Device"] + cols + (["Kernels"] if names_every > 0 else []))
            w.writerows(done)
        log(f"{op}: {len(done)} of {len(rows)} shapes timed ({failed} failed)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=None, help="folder of shapes_<op>.csv (NeuSight kernel-table columns)")
    ap.add_argument("--parts", nargs="*", default=["env", "models", "kernels"],
                    choices=["env", "models", "kernels"])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--ops", nargs="*", default=list(OPS), choices=list(OPS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--kernel-seconds", type=float, default=20.0, help="time budget per op class")
    ap.add_argument("--max-rows", type=int, default=100000)
    ap.add_argument("--kernel-names-every", type=int, default=0, metavar="N",
                    help="record the kernels of every N-th timed shape in a Kernels column (torch.profiler, after "
                    "its timing; 0: none): which algorithm the library ran")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small stand-in models (a CPU smoke test of this script)")
    ap.add_argument("--dtype", default="fp32", choices=DTYPES,
                    help="fp32 (TF32 off, as NeuSight), tf32 (TF32 on) or bf16 (bf16 kernels, autocast models)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU visible; pass --device cpu --tiny for a smoke test", file=sys.stderr)
        return 2
    if "kernels" in args.parts and not args.shapes:
        print("error: --parts kernels needs --shapes <folder of shapes_<op>.csv>", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "env" in args.parts:
        part_env(out, dev, args.dtype)
    tf32 = args.dtype == "tf32"  # TF32 for the models' and kernels' matrix products and convolutions
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    if "models" in args.parts:
        part_models(out, dev, args.models, steps=args.steps, warmup=args.warmup, scale=0.01 if args.tiny else 1.0,
                    dtype=args.dtype)
    if "kernels" in args.parts:
        part_kernels(out, dev, Path(args.shapes), args.ops, seconds=args.kernel_seconds, max_rows=args.max_rows,
                     dtype=args.dtype, names_every=args.kernel_names_every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
