"""Fidelity report: simulator (with measured profiles) against the local executor, for every zoo model.

    python scripts/fidelity.py --out outputs/fidelity [--models mlp gpt] [--random 4] [--steps 5]
    python scripts/fidelity.py --replay placement_rl/data/measured/nvidia_h200/executor [--out DIR]

For each model (small options so the whole run takes minutes on 2 CPU cores): capture, profile each
physical device of the topology (``placement_rl.profiling``), benchmark the ``copy`` link, then for a set
of placements (every single device, each baseline placer, random ones) predict the step time
(``predict_step_time``) and measure it (``run_placement``). Writes ``fidelity.csv``, ``fidelity.md``,
``fidelity.png`` and the profiles (``profiles.json``) to ``--out``. Topology: ``local`` when a CUDA GPU is
present, else ``2x_cpu`` (two logical devices sharing the CPU; see ``placement_rl.profiling.fidelity``).

``--replay DIR`` runs nothing: it reads a shipped ``DIR/profiles.json`` and ``DIR/fidelity.csv`` (made by this
script on another machine), re-captures each model of the csv, rebuilds the same placements (the placers run on
the shipped profiles' costs, same budget and seed) and re-predicts every row, against the csv's measured times.
The topology is the recorded machine's ``local`` one (its profiled devices, links from the profile's fits). A
model whose graph captures differently here (other torch / transformers: another fingerprint) is reported and
skipped. Writes ``replay.csv`` (shipped and replayed prediction per row) to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from placement_rl import baselines
from placement_rl.errors import PlacementRLError
from placement_rl.graph import zoo
from placement_rl.graph.capture import capture
from placement_rl.profiling import ProfileDB, bench_copy, measured_costs, physical_topology, profile_graph
from placement_rl.profiling.fidelity import evaluate_placements, summarize, write_report
from placement_rl.topology import Device, DeviceTopology, load_topology

# Small configurations: each model profiles and runs a step in well under a second on one CPU thread.
SMALL = {
    "mlp": dict(batch_size=64, in_features=256, hidden=512, layers=4),
    "resnet18": dict(batch_size=4, image_size=64, num_classes=10, width=16),
    "resnet50": dict(batch_size=2, image_size=64, num_classes=10, width=8),
    "inception": dict(batch_size=2, image_size=64, num_classes=10, num_modules=3),
    "nmt": dict(batch_size=16, src_len=8, tgt_len=8, vocab_size=500, hidden=64, enc_layers=2, dec_layers=2),
    "gpt": dict(batch_size=2, seq_len=64, vocab_size=512, d_model=128, n_layers=2, n_heads=4),
    "moe": dict(batch_size=2, seq_len=32, vocab_size=512, d_model=128, n_layers=2, n_heads=4, n_experts=4),
    "gpt2_hf": dict(batch_size=2, seq_len=32, vocab_size=512, d_model=128, n_layers=2, n_heads=4),
    "bert_hf": dict(batch_size=2, seq_len=32, vocab_size=512, d_model=128, n_layers=2, n_heads=4),
}
SKIP_BASELINES = ("exhaustive",)  # exponential in the node count


def placements_for(graph, costs, topology, *, num_random: int, budget: int, seed: int) -> dict[str, np.ndarray]:
    n, d = graph.num_nodes, topology.num_devices
    out: dict[str, np.ndarray] = {f"all_on_{topology.devices[j].name}": np.full(n, j) for j in range(d)}
    for name in baselines.names():
        if name in SKIP_BASELINES:
            continue
        try:
            p = baselines.get(name)(graph, costs, topology, budget=budget, seed=seed)
        except PlacementRLError as exc:
            print(f"  baseline {name} skipped: {exc}")
            continue
        out[name] = np.asarray(p.device_of_node)
    rng = np.random.default_rng(seed)
    for k in range(num_random):
        out[f"random{k}"] = rng.integers(0, d, n)
    return out


def recorded_topology(db: ProfileDB, name: str = "local") -> DeviceTopology:
    """The topology a shipped profile was measured on: one device per profiled device (``cpu`` first), linked by
    the profile's measured ``copy`` fits (``apply_links``). Only what the prediction and the placers read matters
    here: measured times replace the devices' peak figures; memory is not a constraint for these small models."""
    devs = db.data["devices"]
    names = sorted(devs, key=lambda n: (devs[n].get("kind") != "cpu", n))
    devices = tuple(Device(name=n, kind=devs[n]["kind"], torch_device=devs[n]["torch_device"], peak_flops=1e12,
                           mem_bandwidth=1e11, memory_bytes=1e12, host=0, model=str(devs[n].get("model", "")))
                    for n in names)
    k = len(devices)
    bw, lat = np.full((k, k), np.inf), np.zeros((k, k))
    kinds = tuple(tuple("local" if i == j else "pcie" for j in range(k)) for i in range(k))
    for i in range(k):
        for j in range(k):
            if i != j:
                bw[i, j], lat[i, j] = 16e9, 1e-5  # replaced by the measured fits below
    topo = DeviceTopology(name=name, devices=devices, link_bandwidth=bw, link_latency=lat, link_kind=kinds,
                          description=f"recorded: {', '.join(d.model or d.name for d in devices)}")
    return db.apply_links(topo)


def replay(folder: Path, out: Path | None, *, models: list[str] | None, num_random: int, budget: int,
           seed: int, fit_crossing: bool = False) -> list[dict]:
    """Re-predict every row of ``folder/fidelity.csv`` from ``folder/profiles.json`` (see the module docstring).

    Each row is predicted twice: ``crossing=False`` (the model the csv was made with: must reproduce its
    ``predicted_s``) and with the host timeline for CPU + GPU placements (``HOST_CROSSING_FACTOR``).
    ``fit_crossing``: also print the factor that minimises the MAPE over these rows (grid 0-6, step 0.05).
    """
    import csv

    from placement_rl.profiling import fidelity as fid

    db = ProfileDB.load(folder / "profiles.json")
    topology = recorded_topology(db)
    phys, _ = physical_topology(topology)
    with open(folder / "fidelity.csv", newline="") as fh:
        shipped = list(csv.DictReader(fh))
    order = list(dict.fromkeys(r["model"] for r in shipped))
    out_rows: list[dict] = []
    cases = []
    for name in order:
        if models and name not in models:
            continue
        module, inputs = zoo.build(name, **SMALL.get(name, {}))
        graph = capture(module, inputs, name=name)
        if db.graph_entry(graph) is None:
            entries = [fp for fp, e in db.data["graphs"].items() if e["name"] == name]
            recorded = db.data["graphs"][entries[0]] if entries else None
            print(f"{name}: SKIPPED, captured graph {graph.fingerprint()} ({graph.num_nodes} nodes) is not in the "
                  f"profile (recorded: {entries or 'none'}"
                  + (f", {len(recorded['nodes'])} nodes" if recorded else "") + "): the graph captures differently "
                  "here (torch / transformers versions; the shipped gpt2_hf graphs were captured with "
                  "transformers 5.10), so its placements cannot be rebuilt")
            continue
        costs = measured_costs(graph, topology, db)
        from placement_rl.baselines.search import FORMER_SETTINGS, annealing_settings

        with annealing_settings(**FORMER_SETTINGS):  # the shipped runs placed with the former annealing
            places = placements_for(graph, costs, topology, num_random=num_random, budget=budget, seed=seed)
        phys_costs = measured_costs(graph, phys, db)
        for r in (r for r in shipped if r["model"] == name):
            if r["placement"] not in places:
                print(f"  {name}/{r['placement']}: not rebuilt here")
                continue
            dev = places[r["placement"]]
            before = fid.predict_step_time(graph, topology, dev, db, costs=phys_costs, crossing=False)
            after = fid.predict_step_time(graph, topology, dev, db, costs=phys_costs)
            old = float(r["predicted_s"])
            cases.append((graph, dev, phys_costs, float(r["measured_s"]), after.host_serial))
            out_rows.append({"model": name, "placement": r["placement"], "transfers": before.num_transfers,
                             "transfers_shipped": int(r["transfers"]),
                             "devices_used": int(len(set(np.asarray(dev).tolist()))),
                             "crossing": before.num_transfers > 0, "host_serial": after.host_serial,
                             "crossings": after.crossings, "crossing_cost_s": after.crossing_cost,
                             "predicted_shipped_s": old, "predicted_s": before.step_time,
                             "predicted_host_s": after.step_time, "measured_s": float(r["measured_s"]),
                             "rel_diff": (before.step_time - old) / old})
    if out_rows:
        worst = max(abs(r["rel_diff"]) for r in out_rows)
        same_t = all(r["transfers"] == r["transfers_shipped"] for r in out_rows)
        print(f"replayed {len(out_rows)} of {len(shipped)} rows; max |relative difference| of the crossing=False "
              f"prediction from the shipped predicted_s {worst:.2e}; "
              f"transfer counts {'all equal' if same_t else 'DIFFER'}")
        print(f"{'rows':10s} {'n':>3s}  {'MAPE before':>11s} {'Spearman':>8s}  {'MAPE after':>10s} {'Spearman':>8s}")
        groups = [("all", out_rows), ("crossing", [r for r in out_rows if r["crossing"]])]
        groups += [(m, [r for r in out_rows if r["model"] == m]) for m in dict.fromkeys(r["model"] for r in out_rows)]
        for label, sel in groups:
            m = np.array([r["measured_s"] for r in sel])
            b = fid.fidelity_stats(np.array([r["predicted_s"] for r in sel]), m)
            a = fid.fidelity_stats(np.array([r["predicted_host_s"] for r in sel]), m)
            print(f"{label:10s} {b['n']:3d}  {b['mape']:10.1f}% {b['spearman']:8.3f}  "
                  f"{a['mape']:9.1f}% {a['spearman']:8.3f}")
    if fit_crossing and cases:
        grid = np.round(np.arange(0.0, 6.0001, 0.05), 2)
        meas = np.array([c[3] for c in cases])
        errs = []
        for f in grid:
            pred = np.array([fid.predict_step_time(g, topology, d, db, costs=pc, crossing_factor=float(f)).step_time
                             for g, d, pc, _, _ in cases])
            errs.append(fid.mape(pred, meas))
        k = int(np.argmin(errs))
        print(f"crossing factor minimising the MAPE over these {len(cases)} rows: {grid[k]:.2f} "
              f"(MAPE {errs[k]:.2f}%; factor 0: {errs[0]:.2f}%; in use: {fid.HOST_CROSSING_FACTOR})")
    if out is not None and out_rows:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "replay.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(out_rows[0]))
            w.writeheader()
            w.writerows(out_rows)
    return out_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="default outputs/fidelity (none with --replay)")
    ap.add_argument("--replay", default=None,
                    help="folder with a shipped profiles.json and fidelity.csv: re-predict its rows, run nothing")
    ap.add_argument("--fit-crossing", action="store_true",
                    help="with --replay: print the host-crossing factor that minimises the MAPE over the rows")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--topology", default=None)
    ap.add_argument("--random", type=int, default=4)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="thread: CPU time of the (single) torch thread, for a CPU shared with other processes")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.replay:
        replay(Path(args.replay), Path(args.out) if args.out else None, models=args.models, num_random=args.random,
               budget=args.budget, seed=args.seed, fit_crossing=args.fit_crossing)
        return
    args.out = args.out or "outputs/fidelity"
    topo_name = args.topology or ("local" if torch.cuda.is_available() else "2x_cpu")
    topology = load_topology(topo_name)
    phys, _ = physical_topology(topology)
    out = Path(args.out)
    db = ProfileDB.open(out / "profiles.json")
    tds = sorted({d.torch_device for d in topology.devices})
    for a in tds:
        for b in tds:
            if db.link(a, b, "copy") is None:
                f = bench_copy(a, b)
                db.put_link(f.src, f.dst, "copy", f.sizes, f.times, f.latency, f.bandwidth)
    models = args.models or [m for m in zoo.names() if m in SMALL]
    rows = []
    t_all = time.perf_counter()
    for name in models:
        t0 = time.perf_counter()
        try:
            module, inputs = zoo.build(name, **SMALL.get(name, {}))
        except PlacementRLError as exc:
            print(f"{name}: skipped ({exc})")
            continue
        graph = capture(module, inputs, name=name)
        for dev in phys.devices:
            profile_graph(module, inputs, graph, dev, warmup=2, repeats=args.repeats, step_repeats=3 * args.repeats,
                          progress=False, db=db,
                          clock=args.clock)
        db.save()
        costs = measured_costs(graph, topology, db)
        places = placements_for(graph, costs, topology, num_random=args.random, budget=args.budget, seed=args.seed)
        rows += evaluate_placements(module, inputs, graph, topology, places, db, model=name, steps=args.steps,
                                    warmup=args.warmup, clock=args.clock)
        s = summarize([r for r in rows if r.model == name])[name]
        print(f"{name}: {graph.num_nodes} nodes, {len(places)} placements, MAPE {s['mape']:.1f}%, "
              f"Spearman {s['spearman']:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    devices = ", ".join(f"{d.name}={d.torch_device}" for d in topology.devices)
    notes = (f"Topology `{topology.name}` ({devices}); torch {torch.__version__}, {args.threads} thread(s), "
             f"{args.clock} clock; executor: {args.steps} timed steps after {args.warmup} warm-up, median; "
             f"profiles: median of {args.repeats}. Total {time.perf_counter() - t_all:.0f} s.")
    stats = write_report(rows, out, title=f"Simulator fidelity on {topology.name}", notes=notes)
    a = stats["all"]
    print(f"ALL: {a['n']} placements, MAPE {a['mape']:.1f}%, Spearman {a['spearman']:.3f} -> {out}/fidelity.md")


if __name__ == "__main__":
    main()
