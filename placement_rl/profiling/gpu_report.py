"""Sections of ``docs/fidelity_gpu.md``: whole-model tables, op-class errors, PipeDream layers, collectives.

Pure formatting and small computations over the rows of ``placement_rl.profiling.gpu_fidelity``; the
driver is ``scripts/fidelity_gpu.py``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from placement_rl.cost.calibrated import CLASSES, GpuFit, GpuSpec, features, node_times
from placement_rl.profiling.gpu_fidelity import (NEUSIGHT_PUBLISHED, ClassRow, WorkloadRow, mape, per_node_floor,
                                                 spearman)

GPU_LABEL = {"NVIDIA_A100_80GB_PCIe": "A100 80GB PCIe", "Tesla_V100-PCIE-32GB": "V100 PCIe 32GB",
             "NVIDIA_A100-PCIE-40GB": "A100 40GB PCIe", "Tesla_P100-PCIE-16GB": "P100 PCIe 16GB", "Tesla_P4": "P4",
             "Tesla_T4": "T4", "NVIDIA_H100_80GB_HBM3": "H100 80GB HBM3 (SXM)", "NVIDIA_L4": "L4"}
KERNEL_OPS_ORDER = ("linear", "bmm", "conv", "ln", "softmax", "gelu", "add")


def kernel_table(rows: Sequence, models: Sequence[str], base: str = "roofline", model: str = "") -> list[str]:
    """Per (GPU, kernel op): per-kernel MAPE of each model over the table's rows (>= 50 us); ``model`` rows that
    do not beat ``base`` are marked."""
    out = ["| GPU | op (class) | rows | " + " | ".join(models) + " |", "|" + "---|" * (3 + len(models))]
    cls = {"ln": "norm", "gelu": "ew", "add": "ew_pass"}
    for r in sorted(rows, key=lambda r: (KERNEL_OPS_ORDER.index(r.op), r.gpu)):
        cells = []
        for m in models:
            c = f"{r.mape[m]:.1f}%"
            if m == model and r.mape[m] > r.mape[base]:
                c += " (worse than the roofline)"
            cells.append(c)
        out.append(f"| {GPU_LABEL.get(r.gpu, r.gpu)} | {r.op}{f' ({cls[r.op]})' if r.op in cls else ''} | {r.rows} | "
                   + " | ".join(cells) + " |")
    return out


def kernel_summary(rows: Sequence, models: Sequence[str]) -> list[str]:
    """Per kernel op: the mean over the GPUs of the per-GPU MAPE, and the worst GPU."""
    out = ["| op | GPUs | " + " | ".join(f"{m}: mean (worst GPU)" for m in models) + " |",
           "|" + "---|" * (2 + len(models))]
    for op in KERNEL_OPS_ORDER:
        sel = [r for r in rows if r.op == op]
        if not sel:
            continue
        cells = []
        for m in models:
            v = np.array([r.mape[m] for r in sel])
            cells.append(f"{v.mean():.1f}% ({v.max():.1f}%)")
        out.append(f"| {op} | {len(sel)} | " + " | ".join(cells) + " |")
    return out


def per_gpu_whole(rows: Sequence[WorkloadRow], models: Sequence[str], *, train: bool) -> list[str]:
    """Whole-model MAPE / max per GPU (training or inference runs)."""
    out = ["| GPU | runs | " + " | ".join(models) + " |", "|" + "---|" * (2 + len(models))]
    for g in sorted({r.gpu for r in rows if r.train == train}):
        sel = [r for r in rows if r.gpu == g and r.train == train]
        cells = []
        for m in models:
            e = np.array([abs(r.error(m)) for r in sel])
            cells.append(f"{e.mean():.1f}% (max {e.max():.1f}%)")
        out.append(f"| {GPU_LABEL.get(g, g)} | {len(sel)} | " + " | ".join(cells) + " |")
    return out


def whole_table(rows: Sequence[WorkloadRow], models: Sequence[str], *, train: bool = True) -> list[str]:
    head = "| GPU (measured by NeuSight) | workload | measured ms | " + " | ".join(models) + " | NeuSight (published) |"
    out = [head, "|" + "---|" * (4 + len(models))]
    for r in rows:
        if r.train != train:
            continue
        pub = NEUSIGHT_PUBLISHED.get((r.gpu, r.key))
        cells = " | ".join(f"{r.predicted[m] * 1e3:.0f} ({r.error(m):+.1f}%)" for m in models)
        out.append(f"| {GPU_LABEL.get(r.gpu, r.gpu)} | {r.key} | {r.measured * 1e3:.0f} | {cells} | "
                   f"{f'{pub:.1f}%' if pub is not None else '-'} |")
    stats = []
    for m in models:
        a, b = mape(list(rows), m, train=train)
        stats.append(f"MAPE {a:.1f}%, max {b:.1f}%, Spearman {spearman([r for r in rows if r.train == train], m):.2f}")
    out.append("| **all** | | | " + " | ".join(stats) + " | |")
    return out


def floor_table(rows: Sequence[WorkloadRow]) -> list[str]:
    """The per-node oracles of ``per_node_floor``: what a per-op predictor can reach on the whole-model times."""
    out = ["| predictor | what it knows | MAPE | max |", "|---|---|---|---|"]
    out += [f"| {f.predictor} | {f.knows} | {f.mape:.1f}% | {f.max:.1f}% |" for f in per_node_floor(list(rows))]
    return out


def work_table(rows: Sequence[WorkloadRow], models: Sequence[str]) -> list[str]:
    """Per training run: each model's per-op (isolated) times summed against the run's measured per-node sum."""
    out = ["| GPU | workload | measured per-node sum ms | " + " | ".join(models) + " |",
           "|" + "---|" * (3 + len(models))]
    for r in rows:
        if r.train:
            cells = " | ".join(f"{r.work_error(m):+.1f}%" for m in models)
            out.append(f"| {GPU_LABEL.get(r.gpu, r.gpu)} | {r.key} | {r.node_sum * 1e3:.0f} | {cells} |")
    stats = [f"MAPE {a:.1f}%, max {b:.1f}%" for a, b in (mape(list(rows), m, work=True) for m in models)]
    out.append("| **all** | | | " + " | ".join(stats) + " |")
    return out


def class_table(classes: Sequence[ClassRow], models: Sequence[str]) -> list[str]:
    """Per (GPU, op class): the error of the class total over every workload (fwd + bwd, isolated timings)."""
    out = ["| GPU | op class | measured ms | " + " | ".join(models) + " |", "|" + "---|" * (3 + len(models))]
    for c in sorted(classes, key=lambda c: (c.gpu, CLASSES.index(c.cls))):
        cells = " | ".join(f"{100 * (c.predicted.get(m, 0.0) / c.measured - 1):+.1f}%" for m in models)
        out.append(f"| {GPU_LABEL.get(c.gpu, c.gpu)} | {c.cls} | {c.measured * 1e3:.1f} | {cells} |")
    return out


def class_wins(classes: Sequence[ClassRow], model: str, base: str = "roofline") -> tuple[int, int, list[str]]:
    """How many (GPU, class) rows ``model`` beats ``base`` on (absolute error), and the ones it does not."""
    wins, losses = 0, []
    for c in classes:
        e_m = abs(c.predicted.get(model, 0.0) / c.measured - 1)
        e_b = abs(c.predicted.get(base, 0.0) / c.measured - 1)
        if e_m <= e_b:
            wins += 1
        else:
            losses.append(f"{GPU_LABEL.get(c.gpu, c.gpu)} {c.cls}")
    return wins, len(classes), losses


def pipedream_rows(profiles: Sequence, graphs: Sequence, spec: GpuSpec, fits: Mapping[str, GpuFit | None]
                   ) -> tuple[list[str], dict[str, float]]:
    """Per-layer fwd / bwd errors on PipeDream's CNN and GNMT profiles, one fitted speed factor per model
    kind (the profiles' GPU is unnamed): factor = total measured / total predicted time over all models."""
    from placement_rl.profiling import pipedream as pdm
    from placement_rl.profiling.gpu_fidelity import roofline_node_times
    from placement_rl.profiling.calibrate import GraphSample

    preds: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {m: [] for m in fits}
    for prof, g in zip(profiles, graphs):
        mf, mb = pdm.measured_times(prof, g)
        feat = features(g)
        for label, fit in fits.items():
            if fit is None:
                s = GraphSample("", spec, feat, mf, mb, np.ones(g.num_nodes), 0.0, True)
                f, b = roofline_node_times(s)
            else:
                f, b, _ = node_times(feat, spec, fit, isolated=True)
            preds[label].append((f, b, mf, mb))
    factors, lines = {}, []
    for label, items in preds.items():  # one factor: total measured over total predicted time
        meas = sum(float(m_f.sum() + m_b.sum()) for _, _, m_f, m_b in items)
        pred = sum(float(p_f.sum() + p_b.sum()) for p_f, p_b, _, _ in items)
        factors[label] = meas / pred
    head = "| model | layers | measured fwd+bwd ms | " + " | ".join(
        f"{m}: layer MAPE fwd / bwd, model sum" for m in fits) + " |"
    lines += [head, "|" + "---|" * (3 + len(fits))]
    for i, (prof, g) in enumerate(zip(profiles, graphs)):
        cells = []
        for label in fits:
            f, b, mf, mb = preds[label][i]
            k = factors[label]
            ef = _layer_mape(k * f, mf)
            eb = _layer_mape(k * b, mb)
            tot = 100 * (k * (f.sum() + b.sum()) / (mf.sum() + mb.sum()) - 1)
            cells.append(f"{ef:.0f}% / {eb:.0f}%, {tot:+.1f}%")
        lines.append(f"| {prof.model} | {g.num_nodes} | {(mf.sum() + mb.sum()) * 1e3:.0f} | " + " | ".join(cells) + " |")
    return lines, factors


def _layer_mape(pred: np.ndarray, meas: np.ndarray, floor: float = 1e-4) -> float:
    """Time-weighted per-layer error: sum |pred - meas| / sum meas over layers measured above ``floor`` s."""
    m = meas > floor
    return float(100 * np.abs(pred[m] - meas[m]).sum() / meas[m].sum()) if m.any() else float("nan")


def collective_table(series: Sequence, fits: Sequence[dict]) -> tuple[list[str], dict[str, float]]:
    from placement_rl.profiling.collective_fits import fit_errors, neighbour_consistency

    out = ["| source | system | collective | GPUs (per node) | rows >= 1 MiB | mean abs error | p95 | within 10% | "
           "rows within 10% of their neighbours (the table's own noise) |", "|---|---|---|---|---|---|---|---|---|"]
    pooled: dict[str, list[np.ndarray]] = {}
    for s, f in zip(series, fits):
        e = np.abs(fit_errors(f, s))
        if not e.size:
            continue
        pooled.setdefault(s.kind, []).append(e)
        nb = np.abs(neighbour_consistency(s))
        out.append(f"| {s.source} | {s.system} | {s.kind} | {s.n_gpus} ({s.devices_per_node}) | {e.size} | "
                   f"{100 * e.mean():.1f}% | {100 * np.percentile(e, 95):.1f}% | {100 * np.mean(e <= 0.1):.0f}% | "
                   f"{f'{100 * np.mean(nb <= 0.1):.0f}%' if nb.size else '-'} |")
    summary = {k: float(100 * np.mean(np.concatenate(v) <= 0.1)) for k, v in pooled.items()}
    summary.update({f"{k}_mean": float(100 * np.concatenate(v).mean()) for k, v in pooled.items()})
    return out, summary


def simulator_collective_table(series: Sequence) -> tuple[list[str], dict[str, float]]:
    """The simulators' prices on the presets that name a measured system (``collective_fit:``) against that
    system's tables (one node, messages >= 1 MiB): ``collective_time`` for all-reduce, ``simulate()``'s link
    table for p2p; beside them the analytic alpha-beta price of the same preset (what it was before)."""
    from placement_rl.cost.collectives import collective_coeffs, collective_time
    from placement_rl.cost.comm_fit import SYSTEM_KEY, envelope, link_segments, segment_time
    from placement_rl.topology import load_topology, preset_names

    presets = {}
    for name in preset_names():
        topo = load_topology(name)
        if topo.meta.get(SYSTEM_KEY):
            presets.setdefault(topo.meta[SYSTEM_KEY], topo)
    out = ["| preset | system | collective | GPUs | rows >= 1 MiB | simulator: within 10% (mean abs error) | "
           "analytic links: within 10% (mean abs error) |", "|---|---|---|---|---|---|---|"]
    pooled: dict[str, list[np.ndarray]] = {}
    for s in series:
        topo = presets.get(s.system)
        if topo is None or s.devices_per_node < s.n_gpus or s.n_gpus > topo.num_devices or \
                s.kind not in ("all_reduce", "p2p"):
            continue
        sizes, meas = s.sizes[s.sizes >= 2.0 ** 20], s.times[s.sizes >= 2.0 ** 20]
        devs = list(range(s.n_gpus))
        if s.kind == "p2p":
            sim = np.array([segment_time(link_segments(topo)[0, 1], n) for n in sizes])
            ana = topo.link_latency[0, 1] + sizes / topo.link_bandwidth[0, 1]
        else:
            sim = np.array([collective_time("allreduce", float(n), devs, topo) for n in sizes])
            env = envelope(collective_coeffs("allreduce", devs, topo).values())
            ana = np.array([segment_time(env, float(n)) for n in sizes])
        es, ea = np.abs(sim / meas - 1), np.abs(ana / meas - 1)
        pooled.setdefault(s.kind, []).append(es)
        pooled.setdefault(f"{s.kind}_analytic", []).append(ea)
        out.append(f"| {topo.name} | {s.system} | {s.kind} | {s.n_gpus} | {sizes.size} | "
                   f"{100 * np.mean(es <= 0.1):.0f}% ({100 * es.mean():.1f}%) | "
                   f"{100 * np.mean(ea <= 0.1):.0f}% ({100 * ea.mean():.1f}%) |")
    return out, {k: float(100 * np.mean(np.concatenate(v) <= 0.1)) for k, v in pooled.items()}


def split_lines(root) -> list[str]:
    """Per training run: the end-to-end forward and backward (JSON ``fw_latency`` / ``bwall_latency``) over the
    sum of the per-node ``fw_latency`` / ``bw_latency + acc_latency`` (embedding + L x layer + head), and the
    forward's excess per kernel-launching node, from the label files under ``root`` (the neusight folder)."""
    from placement_rl.cost.calibrated import CLASSES, features
    from placement_rl.profiling import neusight as ns

    out = ["| GPU | workload | forward: end to end / per-node sum | backward (with acc) | forward excess per "
           "kernel |", "|---|---|---|---|---|"]
    for p in ns.label_files(root):
        w = ns.read_labels(p)
        if w.mode != "train":
            continue
        g = ns.label_graph(w)
        f, b = ns.measured_times(w, g)
        wt = ns.layer_weights(g, w.num_layer)
        kernels = float(wt @ (features(g).cls != CLASSES.index("view")))
        out.append(f"| {GPU_LABEL.get(w.gpu, w.gpu)} | {w.key} | {w.fwd_total / (wt @ f):.2f} | "
                   f"{w.bwd_total / (wt @ b):.2f} | {1e6 * (w.fwd_total - wt @ f) / kernels:+.0f} us |")
    return out


def newer_gpu_table(graphs: Sequence, spec: GpuSpec, fits: Mapping[str, GpuFit]) -> list[str]:
    """Training workloads (the label graphs' shapes) priced on another GPU's datasheet by each fit: whole-model
    time, the ratio to the first fit, and the share of the GEMM classes. No measurement: what the fits predict."""
    names = list(fits)
    out = ["| workload | " + " | ".join(f"{m} ms" for m in names) + f" | {names[-1]} / {names[0]} | "
           f"{names[-1]}: GEMM share |", "|" + "---|" * (3 + len(names))]
    seen = set()
    for s_ in graphs:
        if not s_.train or s_.key in seen:
            continue
        seen.add(s_.key)
        tot, share = [], 0.0
        for label, fit in fits.items():
            f, b, _ = node_times(s_.feat, spec, fit)
            t = f + b
            tot.append(float(s_.weights @ t))
            g = np.isin(s_.feat.cls, [CLASSES.index(c) for c in ("linear", "bmm", "conv")])
            share = float(s_.weights[g] @ t[g]) / tot[-1]
        out.append(f"| {s_.key} | " + " | ".join(f"{1e3 * t:.0f}" for t in tot) + f" | {tot[-1] / tot[0]:.3f} | "
                   f"{100 * share:.0f}% |")
    return out
