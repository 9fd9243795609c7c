"""Fit the calibrated GPU cost model on the public GPU measurements and write the shipped fit.

    python scripts/fit_gpu_costs.py [--data ../shared/gpu-measurements] [--out placement_rl/data]
    python scripts/fit_gpu_costs.py --list-files      # the public files the fit reads, and whether each is there

Reads, under the gpu-measurements folder (public, MIT licence; sources and commits in its README and in
``placement_rl/data/NOTICE``; a user without ``../shared`` fetches them from the repositories named there):

* ``neusight/device_configs/<GPU>.json`` for the five GPUs below (datasheet figures);
* ``neusight/kernels/<op>/<GPU>.csv``, op in linear, bmm, conv, ln, softmax, gelu, add, GPU in
  NVIDIA_A100-PCIE-40GB (conv: NVIDIA_A100_80GB_PCIe), Tesla_V100-PCIE-32GB, Tesla_P100-PCIE-16GB, Tesla_P4,
  Tesla_T4 (sitar-lab/NeuSight @ 6945927d9afc, ``scripts/asplos/data/dataset/train/collect/<op>/p2.1.0/``);
* ``neusight/labels/<GPU>/*.csv`` and the ``.json`` beside each (per-node and whole-model times; training on
  the A100 80GB PCIe and V100, inference on the V100, P100, P4, T4; NeuSight ``scripts/asplos/label/``);
* ``sailor/<GPU>/*.csv`` and ``vidur/<system>/*`` for the collective fit (``collective_fit.json``).

fits the parameters shared by all GPUs (``placement_rl.profiling.calibrate.fit``; a GPU enters only through its
datasheet and architecture) and writes them with their sources in the fit's meta. The raw files are never
copied: only the fitted parameters ship. Prints the fit and its in-sample whole-model errors. About two
minutes on one core.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from placement_rl.errors import PlacementRLError
from placement_rl.graph.io import atomic_write_text
from placement_rl.profiling import calibrate, collective_fits
from placement_rl.profiling.gpu_fidelity import evaluate, mape
from placement_rl.profiling.neusight import default_data_dir

FIT_NAME = "neusight-v2"
SOURCES = ["sitar-lab/NeuSight @ 6945927d9afc (MIT): labels, kernels, device_configs",
           "eth-easl/sailor @ cf2c8e3cc53c (MIT): collective tables",
           "microsoft/vidur @ 7d47513363ec (MIT): network tables"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="the gpu-measurements folder (default: ../shared/gpu-measurements "
                    "or $PLACEMENT_RL_GPU_DATA)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "placement_rl" / "data"))
    ap.add_argument("--max-nfev", type=int, default=calibrate.FIT_NFEV)
    ap.add_argument("--kernel-rows", type=int, default=calibrate.FIT_KERNEL_ROWS,
                    help="rows sampled per kernel table (seeded)")
    ap.add_argument("--list-files", action="store_true", help="list the public files the fit needs and exit")
    args = ap.parse_args()
    try:
        root = Path(args.data) if args.data else default_data_dir()
        if args.list_files:
            missing = 0
            for rel in calibrate.needed_files():
                there = root is not None and (root / rel).is_file()
                missing += not there
                print(f"{'ok     ' if there else 'MISSING'} {rel}")
            return 0 if missing == 0 else 2
        if root is None:
            raise PlacementRLError("no GPU measurements found: pass --data <gpu-measurements folder> "
                                   "or set PLACEMENT_RL_GPU_DATA (--list-files lists what is needed)")
        data = calibrate.load_neusight(root / "neusight", max_kernel_rows=args.kernel_rows)
        fit = calibrate.fit(data, name=FIT_NAME, max_nfev=args.max_nfev)
        fit = type(fit)(name=fit.name, params=fit.params, meta={**fit.meta, "sources": SOURCES})
        colls = collective_fits.fit_all(root)
    except PlacementRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    atomic_write_text(out / "gpu_fit.json", json.dumps(fit.to_dict(), indent=1, sort_keys=True))
    atomic_write_text(out / "collective_fit.json", json.dumps(colls, indent=1, sort_keys=True))
    rows, _ = evaluate(data, {"calibrated": fit})
    for r in rows:
        print(f"{r.gpu:24s} {r.key:28s} measured {r.measured * 1e3:9.1f} ms  calibrated {r.error('calibrated'):+6.1f}%"
              f"  roofline {r.error('roofline'):+6.1f}%")
    for train in (True, False):
        m, worst = mape(rows, "calibrated", train=train)
        print(f"in-sample {'training' if train else 'inference'} MAPE {m:.1f}% (max {worst:.1f}%)")
    print(f"wrote {out / 'gpu_fit.json'} and {out / 'collective_fit.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
