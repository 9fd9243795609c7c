#!/usr/bin/env bash
# The GPU work still owed, as the one prepared command to run when a GPU is lent (the device tool: one call,
# timeout 600 s; about 9 minutes of work here):
#
#   bash scripts/gpu_session.sh                # writes $OUT/gpu_session.tgz ($OUT: the device tool's folder)
#   OUT=/tmp/x DEVICE=cpu SECONDS_PER_OP=2 bash scripts/gpu_session.sh    # a smoke run of the plumbing on a CPU
#
# 1. shapes: the shape columns of the shipped H100 kernel tables (NeuSight's shapes, placement_rl/data/measured/);
# 2. tensor-core kernels: scripts/measure_gpu.py --dtype bf16 (linear, bmm, softmax, gelu, add) and --dtype tf32
#    (linear), with each dtype's 8192^3 matmul rate (env.json) -- no public table has them, and the cost model
#    prices them from datasheet peaks with the fp32 fit's tile and traffic terms;
# 3. fp32 conv kernels with the kernels every 4th shape launched (--kernel-names-every): does cuDNN run the lent
#    GPU's 3x3 stride-1 convolutions as Winograd, as it did on NeuSight's five GPUs (the cost model assumes it may);
# 4. the tests marked gpu (CUDA timing, local GPU detection, the executor on CUDA).
# Every step is time-boxed and logged; a failed step does not stop the others. The tarball holds bf16/, tf32/,
# conv_names/
# (measure_gpu.py's layout: kernels_<dtype>/<op>.csv, env.json) and the logs. To ship the tables: copy
# kernels_<dtype>/<op>.csv to placement_rl/data/measured/<gpu>/kernels_<dtype>/<op>/<GPU name>.csv (the name of
# its device_configs/ file) and run python scripts/fidelity_measured_gpu.py --gpu <gpu>.
set -u
OUT=${OUT:-outputs/gpu_session}
DEVICE=${DEVICE:-cuda}
PER_OP=${SECONDS_PER_OP:-45}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
W=$(mktemp -d)
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$W/session.log"; }

log "device $DEVICE, $PER_OP s per op class"
{ nvidia-smi || true; $PY -c "import torch; print(torch.__version__, torch.cuda.is_available())"; } \
  >> "$W/session.log" 2>&1
timeout 60 $PY - "$W/shapes" >> "$W/session.log" 2>&1 <<'EOF'
import csv, pathlib, sys
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
src = pathlib.Path("placement_rl/data/measured/nvidia_h100/kernels")
skip = {"OPName", "Latency", "Device"}
for table in sorted(src.glob("*/*.csv")):
    with table.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cols = [c for c in rows[0] if c not in skip]
    with (out / f"shapes_{table.parent.name}.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerows([r[c] for c in cols] for r in rows)
    print(f"shapes_{table.parent.name}.csv: {len(rows)} rows")
EOF
log "shapes: $(ls "$W/shapes" 2>/dev/null | tr '\n' ' ')"
timeout $((PER_OP * 5 + 60)) $PY scripts/measure_gpu.py --out "$W/bf16" --shapes "$W/shapes" --device "$DEVICE" \
  --parts env kernels --dtype bf16 --ops linear bmm softmax gelu add --kernel-seconds "$PER_OP" \
  > "$W/bf16.log" 2>&1
log "bf16 kernels: exit $? ($(tail -1 "$W/bf16.log"))"
timeout $((PER_OP + 60)) $PY scripts/measure_gpu.py --out "$W/tf32" --shapes "$W/shapes" --device "$DEVICE" \
  --parts env kernels --dtype tf32 --ops linear --kernel-seconds "$PER_OP" > "$W/tf32.log" 2>&1
log "tf32 kernels: exit $? ($(tail -1 "$W/tf32.log"))"
timeout $((PER_OP + 60)) $PY scripts/measure_gpu.py --out "$W/conv_names" --shapes "$W/shapes" --device "$DEVICE" \
  --parts kernels --ops conv --kernel-seconds "$PER_OP" --kernel-names-every 4 > "$W/conv_names.log" 2>&1
log "fp32 conv kernels with their names: exit $? ($(tail -1 "$W/conv_names.log"))"
timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider tests/ > "$W/pytest_gpu.log" 2>&1
log "tests marked gpu: exit $? ($(tail -1 "$W/pytest_gpu.log"))"
tar czf "$OUT/gpu_session.tgz" -C "$W" --exclude=shapes .
log "wrote $OUT/gpu_session.tgz"
cp "$W/session.log" "$OUT/session.log"
