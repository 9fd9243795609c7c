"""GPU fidelity report: the cost model against public GPU measurements -> docs/fidelity_gpu.md.

    python scripts/fidelity_gpu.py [--data ../shared/gpu-measurements] [--out docs/fidelity_gpu.md] [--quick]

For every NeuSight workload: measured whole-model time vs the plain roofline, the shipped calibrated fit,
and fits that never saw the GPU they predict (leave-one-GPU-out; leave-one-architecture-out also drops the
A100 40GB kernel tables when the A100 80GB is predicted); per-op-class errors; the project's own captured
gpt2_hf / bert_hf / opt_hf graphs mapped onto the measured nodes; PipeDream's per-layer CNN / GNMT profiles (one
fitted speed factor, the GPU is unnamed); and the Sailor / Vidur collective fits. Several minutes on one
core (five fits and eight captures); --quick skips the captures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from placement_rl.cost import resolve_costs
from placement_rl.cost.calibrated import GpuSpec, features, node_times, shipped_fit
from placement_rl.errors import PlacementRLError
from placement_rl.graph.capture import capture_zoo
from placement_rl.graph.io import atomic_write_text
from placement_rl.profiling import calibrate, collective_fits, gpu_report, measured_map, neusight, pipedream
from placement_rl.profiling import sailor, vidur
from placement_rl.profiling.gpu_fidelity import evaluate, mape, per_node_floor
from placement_rl.topology import load_topology

PRESET = {"NVIDIA_A100_80GB_PCIe": "1x_a100_80gb_pcie", "Tesla_V100-PCIE-32GB": "1x_v100_pcie_32gb"}
MODELS = ["roofline", "calibrated", "leave-one-GPU-out", "leave-one-arch-out"]


def project_graph_rows(root: Path, logo: dict) -> list[str]:
    out = ["| GPU | workload | zoo graph (1 layer x L) | mapped / views / unmapped nodes | measured ms | "
           "roofline | calibrated | leave-one-arch-out | from the mapped profile |", "|" + "---|" * 9]
    for path in neusight.label_files(root / "neusight"):
        w = neusight.read_labels(path)
        cfg = measured_map.zoo_config(w)
        if w.mode != "train":
            continue
        if cfg is None:
            out.append(f"| {gpu_report.GPU_LABEL.get(w.gpu, w.gpu)} | {w.key} | no zoo entry | - | "
                       f"{w.e2e * 1e3:.0f} | - | - | - | - |")
            continue
        g = capture_zoo(cfg[0], **cfg[1])
        wts = measured_map.layer_weights(g, w.num_layer)
        topo = load_topology(PRESET[w.gpu])
        res = measured_map.map_neusight(w, g)
        db = measured_map.mapped_profile(g, res, label=f"neusight-{w.gpu}-{w.key}", gpu_model=w.gpu,
                                         fill_topology=topo)

        def whole(c) -> float:
            return float(wts @ (c.fwd_time[:, 0] + c.bwd_time[:, 0]))
        d = topo.devices[0]
        f, b, _ = node_times(features(g), GpuSpec(d.peak_flops, d.mem_bandwidth, d.sm_count, d.l2_bytes),
                             logo[w.gpu])
        vals = [whole(resolve_costs(g, topo, gpu_model="roofline")), whole(resolve_costs(g, topo)),
                float(wts @ (f + b)), whole(resolve_costs(g, topo, db))]
        cells = " | ".join(f"{v * 1e3:.0f} ({100 * (v / w.e2e - 1):+.1f}%)" for v in vals)
        out.append(f"| {gpu_report.GPU_LABEL.get(w.gpu, w.gpu)} | {w.key} | {cfg[0]} d={cfg[1]['d_model']} "
                   f"h={cfg[1]['n_heads']} | {res.mapped} / {res.views} / {len(res.unmapped)} "
                   f"({', '.join(sorted({g.op_types[i] for i in res.unmapped}))}) | {w.e2e * 1e3:.0f} | {cells} |")
    return out


def cnn_mapping_rows(root: Path) -> list[str]:
    """PipeDream's ResNet-18 / -50 layers mapped onto the zoo's resnet18 / resnet50 captured at its batch."""
    out = ["| zoo graph | PipeDream profile | batch | graph nodes | mapped / zero (views, scalar updates) / unmapped | "
           "cost_source of the mapped profile |", "|---|---|---|---|---|---|"]
    v100 = load_topology("1x_v100_pcie_32gb")
    for m in ("resnet18", "resnet50"):
        prof = pipedream.read_profile(root / "pipedream" / f"{m}.graph.txt")
        conv1 = next(x for x in prof.layers if x.op_type == "conv2d")
        batch = int(round(conv1.out_bytes / (64 * 112 * 112 * 4)))  # the stem's 64 x 112 x 112 fp32 output
        g = capture_zoo(m, batch_size=batch, image_size=224)
        res = measured_map.map_pipedream(prof, g)
        db = measured_map.mapped_profile(g, res, label=f"pipedream-{m}", gpu_model="unnamed", fill_topology=v100)
        src = resolve_costs(g, v100, db).source[0]
        out.append(f"| {m} | {prof.model}.graph.txt | {batch} | {g.num_nodes} | {res.mapped} / {res.views} / "
                   f"{len(res.unmapped)} ({', '.join(sorted({g.op_types[i] for i in res.unmapped}))}) | `{src}` |")
    out.append("| inception | inception_v3.graph.txt | - | - | not mapped: the zoo's inception is GoogLeNet-style, "
               "not Inception-v3 | - |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "fidelity_gpu.md"))
    ap.add_argument("--quick", action="store_true", help="skip capturing the project's graphs")
    ap.add_argument("--max-nfev", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    try:
        root = Path(args.data) if args.data else neusight.default_data_dir()
        if root is None:
            raise PlacementRLError("no GPU measurements found: pass --data or set PLACEMENT_RL_GPU_DATA")
        data = calibrate.load_neusight(root / "neusight")
        fit = shipped_fit()
        if fit is None:
            raise PlacementRLError("no shipped fit: run scripts/fit_gpu_costs.py first")
        label_gpus = sorted({s.gpu for s in data.graphs})
        logo_gpu = {g: calibrate.fit(data, exclude=[g], max_nfev=args.max_nfev) for g in label_gpus}
        logo_arch = {g: calibrate.fit(data, exclude=[x for x in data.gpus()
                                                     if calibrate.family(x) == calibrate.family(g)],
                                      max_nfev=args.max_nfev) for g in label_gpus}
        rows, classes = evaluate(data, {"calibrated": fit, "leave-one-GPU-out": logo_gpu,
                                        "leave-one-arch-out": logo_arch})
        profs = [pipedream.read_profile(p) for p in sorted((root / "pipedream").glob("*.graph.txt"))]
        graphs = [pipedream.pipedream_graph(p) for p in profs]
        v100 = load_topology("1x_v100_pcie_32gb").devices[0]
        spec = GpuSpec(v100.peak_flops, v100.mem_bandwidth, v100.sm_count, v100.l2_bytes)
        pd_lines, factors = gpu_report.pipedream_rows(profs, graphs, spec, {"roofline": None, "calibrated": fit})
        series = [s for d in sorted((root / "sailor").glob("*/")) for s in sailor.read_system(d)]
        series += [s for d in sorted((root / "vidur").glob("*/")) for s in vidur.read_system(d)]
        coll_lines, coll_sum = gpu_report.collective_table(series, collective_fits.shipped_fits_for(series))
        sim_lines, sim_sum = gpu_report.simulator_collective_table(series)
        proj = [] if args.quick else project_graph_rows(root, logo_arch)
        cnn = [] if args.quick else cnn_mapping_rows(root)
    except PlacementRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wins, total, losses = gpu_report.class_wins(classes, "leave-one-arch-out")
    lines = ["# GPU fidelity: the cost model against public GPU measurements", "",
             "Written by `python scripts/fidelity_gpu.py` from `../shared/gpu-measurements/` (NeuSight, PipeDream, "
             "Sailor, Vidur; MIT licence, see `placement_rl/data/NOTICE`). Every measured figure below was measured "
             "by those projects on the GPU named; nothing here ran on a GPU of ours. Times are fp32 training steps "
             "(forward + backward, no optimizer step), whole model = embedding + L x one layer + head.", "",
             "Models: **roofline** = `max(flops/peak, bytes/bandwidth) + 8 us` per op (the old default); "
             "**calibrated** = the shipped fit (`placement_rl/data/gpu_fit.json`, fitted on both GPUs); "
             "**leave-one-GPU-out** = refitted without the predicted GPU's data; **leave-one-arch-out** = "
             "refitted without any A100 (or any V100) data, the strict test of an unseen GPU.", "",
             "## Whole-model training time (NeuSight workloads)", ""]
    lines += gpu_report.whole_table(rows, MODELS)
    lines += ["", "The per-node measurements summed (embedding + L x layer + head) miss the measured whole model by "
              + ", ".join(f"{r.key}@{gpu_report.GPU_LABEL.get(r.gpu, r.gpu)} "
                          f"{100 * (float(s.weights @ (s.fwd + s.bwd)) / s.whole - 1):+.0f}%"
                          for r, s in zip(rows, data.graphs) if r.train)
              + ". Split into forward and backward (below), the whole difference on the A100 host is in the forward "
              "of some runs: the backward of the same runs matches its per-node sum. The excess is no per-kernel "
              "launch or host cost (same kernels, very different excess per kernel: bert_large at batch 2 and 8), "
              "not a clock limit (the backward right after runs at the per-node speed), and no monotone function "
              "of the workload (gpt2_large is slow at batch 1 and not at 4, opt_13 the other way round): it is "
              "run-to-run state of that host that a model of GPUs and ops cannot predict, and it bounds the "
              "whole-model error of any per-op predictor on these files.", ""]
    lines += gpu_report.split_lines(root / "neusight")
    lines += ["", "### What these files allow a per-op predictor", "",
              "A model of GPUs and ops predicts per-op times; at its very best it knows every per-node time these "
              "runs measured. The oracles below know exactly that, and turn it into a whole-model time. Even "
              "chosen on the very runs they are scored on, none reaches MAPE 8%: the two hosts' whole-model times "
              "sit on opposite sides of their per-node sums (A100 above, V100 below), so a factor learned on one "
              "GPU moves the other the wrong way, and only a factor chosen on the predicted GPU's own whole-model "
              "times (which no model of an unseen GPU has) gets below it.", ""]
    lines += gpu_report.floor_table(rows)
    lines += ["", "### The GPU work, op by op: per-op predictions summed against the measured per-node sums", "",
              "The same runs, against the truth a per-op model predicts: each model's per-op (isolated-timing) "
              "times summed over the step, against the run's own per-node measurements summed.", ""]
    lines += gpu_report.work_table(rows, MODELS)
    lines += ["", "## Inference workloads (V100, forward only)", ""]
    lines += gpu_report.whole_table(rows, MODELS, train=False)
    lines += ["", "## Per op class (sum over all workloads; isolated per-op timings vs the model's isolated mode)", "",
              f"Leave-one-arch-out beats the roofline on {wins} of {total} (GPU, class) rows"
              + (f"; not on: {', '.join(losses)}." if losses else "."), ""]
    lines += gpu_report.class_table(classes, MODELS)
    lines += ["", "## The project's captured graphs, mapped onto the measured nodes", "",
              "gpt2_hf / bert_hf / opt_hf captured with the workload's configuration and one layer (whole model = non-layer "
              "nodes + L x layer-0 nodes). Views need no kernel and map to zero; unmapped nodes (mask building, "
              "the loss, which NeuSight's traces do not hold) take the calibrated estimate in the mapped profile, "
              "whose `cost_source` is `measured:neusight-<GPU>-<workload>.json:gpu0`.", ""]
    lines += proj or ["(skipped: --quick)"]
    lines += ["", "CNN zoo graphs mapped onto PipeDream's layers by class order (the unmapped loss takes the "
              "calibrated estimate; PipeDream's Input layer is data loading and is dropped):", ""]
    lines += cnn or ["(skipped: --quick)"]
    lines += ["", "## PipeDream per-layer profiles (GPU unnamed; V100 PCIe datasheet times one fitted speed factor per cost model)", "",
              "Speed factors (total measured / total predicted over all 14 profiles): "
              + ", ".join(f"{k} {v:.2f}" for k, v in factors.items())
              + ". Layer errors are time-weighted over layers above 0.1 ms.", ""]
    lines += pd_lines
    lines += ["", "## Collectives (Sailor, Vidur): fitted curves against the tables, messages >= 1 MiB", "",
              "Share of rows within 10%: " + ", ".join(f"{k} {v:.0f}%" for k, v in coll_sum.items()
                                                       if not k.endswith("_mean"))
              + "; mean absolute error: " + ", ".join(f"{k[:-5]} {v:.1f}%" for k, v in coll_sum.items()
                                                      if k.endswith("_mean")) + ". The last column is the "
              "table's own noise: the share of rows within 10% of the median of their four nearest sizes (time per "
              "byte). Where it is low (Vidur's pairwise-NVLink machines across nodes), neighbouring message sizes "
              "differ by more than 10% and no smooth curve can be within 10% of every row.", ""]
    lines += coll_lines
    lines += ["", "## Collectives inside the simulators (presets naming a measured system)", "",
              "Presets with `collective_fit: <system>` price `simulate()`'s link transfers and `simulate_pipeline()`'s "
              "data-parallel / sharded collectives from the fitted curves (`placement_rl/cost/comm_fit.py`); other "
              "topologies, and collective kinds a system did not measure, keep the analytic alpha-beta model. "
              "The simulators' prices against the tables, one node, messages >= 1 MiB, and the preset's analytic "
              "alpha-beta price for comparison. Share within 10%: "
              + ", ".join(f"{k} {v:.0f}%" for k, v in sim_sum.items()) + ".", ""]
    lines += sim_lines
    atomic_write_text(Path(args.out), "\n".join(lines) + "\n")
    for m in MODELS:
        a, b = mape(rows, m)
        c, d = mape(rows, m, work=True)
        print(f"{m:22s} training MAPE {a:5.1f}%  max {b:5.1f}%   vs per-node sums {c:5.1f}%  max {d:5.1f}%")
    for f in per_node_floor(rows):
        print(f"oracle {f.predictor:45s} MAPE {f.mape:5.1f}%  max {f.max:5.1f}%")
    print(f"class rows where leave-one-arch-out beats the roofline: {wins}/{total}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
