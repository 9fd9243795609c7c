"""Measure what one CPU <-> GPU crossing costs an eager training step on one host thread (the executor's case).

    python scripts/measure_crossing.py --out crossing.json [--layers 32 --width 256 --batch 32 --steps 30]

A stack of ``--layers`` Linear + ReLU layers is split into k + 1 equal contiguous blocks that alternate between
the GPU and the CPU (k = 1, 3, 7, 15, 31 crossings: every split puts exactly half the layers on each device, so the
compute stays the same and only the number of crossings changes). Each training step runs forward, backward and
an Adam step, the activation moving with ``.to()`` at every block boundary (its gradient moves back in backward);
the step is timed on the host clock with both devices synchronised (median of ``--rounds`` x ``--steps`` steps, the k's taking turns). The
least-squares slope of step time over k is the cost of one crossing, forward and gradient together, as the
host pays it; ``scripts/fidelity.py``'s host timeline charges ``2 x (link fit + HOST_CROSSING_FACTOR x the GPU's
autograd engine start)`` for it. Also written: the engine start itself (``grad_call_overhead`` on the GPU), and
a synchronous device-to-host and host-to-device copy of one activation after a queued GPU op.
``--device cpu`` runs it with both blocks on the CPU (a smoke test: no crossing costs anything).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np
import torch

from placement_rl.graph.io import atomic_write_text
from placement_rl.profiling.ops import grad_call_overhead
from placement_rl.profiling.timing import synchronize


def build(k: int, gpu: torch.device, args):
    """A training step with k crossings (a closure)."""
    torch.manual_seed(0)
    blocks = k + 1
    per = args.layers // blocks
    layers, where = [], []
    for b in range(blocks):
        dev = gpu if b % 2 == 0 else torch.device("cpu")
        for _ in range(per):
            layers.append(torch.nn.Linear(args.width, args.width).to(dev))
            where.append(dev)
    params = [p for m in layers for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=1e-4)
    x0 = torch.randn(args.batch, args.width, device=gpu)

    def step():
        opt.zero_grad(set_to_none=True)
        h = x0
        for m, dev in zip(layers, where):
            if h.device != dev:
                h = h.to(dev)
            h = torch.relu(m(h))
        h.float().mean().backward()
        opt.step()

    return step


def step_times(ks: list[int], gpu: torch.device, args) -> dict[int, float]:
    """Median seconds of one training step per k; the k's take turns (``--rounds`` rounds of ``--steps`` steps
    each), so a slow spell of the host spreads over all of them instead of one."""
    steps = {k: build(k, gpu, args) for k in ks}
    for fn in steps.values():
        for _ in range(5):
            fn()
    synchronize(gpu)
    out: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.rounds):
        for k, fn in steps.items():
            for _ in range(args.steps):
                t0 = time.perf_counter()
                fn()
                synchronize(gpu)
                out[k].append(time.perf_counter() - t0)
    return {k: median(v) for k, v in out.items()}


def copies(gpu: torch.device, args) -> dict[str, float]:
    """Seconds of a synchronous D2H and H2D copy of one activation, each right after a queued GPU op."""
    a = torch.randn(args.batch, args.width, device=gpu)
    w = torch.randn(args.width, args.width, device=gpu)
    c = torch.randn(args.batch, args.width)
    d2h, h2d = [], []
    for i in range(args.steps + 5):
        synchronize(gpu)
        y = a @ w
        t0 = time.perf_counter()
        y.to("cpu")
        t1 = time.perf_counter()
        y = a @ w
        t2 = time.perf_counter()
        z = c.to(gpu)
        synchronize(gpu)
        t3 = time.perf_counter()
        if i >= 5:
            d2h.append(t1 - t0)
            h2d.append(t3 - t2)
    del z
    return {"d2h_after_op_s": median(d2h), "h2d_sync_s": median(h2d)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    gpu = torch.device(args.device)
    if gpu.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU visible; pass --device cpu for a smoke test", file=sys.stderr)
        return 2
    if args.layers % 32:
        print("error: --layers must be a multiple of 32 (k + 1 = 2 ... 32 equal blocks)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    ks = [1, 3, 7, 15, 31]
    times = step_times(ks, gpu, args)
    for k in ks:
        print(f"k = {k:2d} crossings: step {1e3 * times[k]:.3f} ms", flush=True)
    slope, icpt = np.polyfit(np.array(ks, float), np.array([times[k] for k in ks]), 1)
    res = {"device": torch.cuda.get_device_name(gpu) if gpu.type == "cuda" else "cpu", "torch": torch.__version__,
           "layers": args.layers, "width": args.width, "batch": args.batch, "steps": args.steps, "rounds": args.rounds,
           "step_s": {str(k): v for k, v in times.items()}, "per_crossing_s": float(slope), "base_s": float(icpt),
           "grad_call_overhead_s": grad_call_overhead(gpu, clock="wall"), **copies(gpu, args)}
    atomic_write_text(Path(args.out), json.dumps(res, indent=1))
    print(f"per crossing (forward + gradient): {1e6 * slope:.1f} us; engine start {1e6 * res['grad_call_overhead_s']:.1f}"
          f" us; D2H after an op {1e6 * res['d2h_after_op_s']:.1f} us; H2D synced {1e6 * res['h2d_sync_s']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
