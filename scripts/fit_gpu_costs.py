"""Fit the calibrated GPU cost model on the public GPU measurements and write the shipped fit.

    python scripts/fit_gpu_costs.py [--data ../shared/gpu-measurements] [--out placement_rl/data/gpu_fit.json]

Reads every NeuSight label file (per-node and whole-model times, A100 80GB PCIe and V100 PCIe 32GB) and
the GEMM / bmm / conv kernel tables (A100 40GB / 80GB PCIe, V100), fits the parameters shared by all GPUs
(``placement_rl.profiling.calibrate.fit``) and writes them with the sources in the fit's meta. The
collective fits (Sailor, Vidur) are written beside it (``collective_fit.json``). Prints the fit and the
whole-model errors. Takes about a minute on one core.
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

FIT_NAME = "neusight-v1"
SOURCES = ["sitar-lab/NeuSight @ 6945927d9afc (MIT): labels, kernels, device_configs",
           "eth-easl/sailor @ cf2c8e3cc53c (MIT): collective tables",
           "microsoft/vidur @ 7d47513363ec (MIT): network tables"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="the gpu-measurements folder (default: ../shared/gpu-measurements)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "placement_rl" / "data"))
    ap.add_argument("--max-nfev", type=int, default=100)
    args = ap.parse_args()
    try:
        root = Path(args.data) if args.data else default_data_dir()
        if root is None:
            raise PlacementRLError("no GPU measurements found: pass --data <gpu-measurements folder> "
                                   "or set PLACEMENT_RL_GPU_DATA")
        data = calibrate.load_neusight(root / "neusight")
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
    m, worst = mape(rows, "calibrated")
    print(f"in-sample training MAPE {m:.1f}% (max {worst:.1f}%); wrote {out / 'gpu_fit.json'} and "
          f"{out / 'collective_fit.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
