#!/usr/bin/env bash
# One call on the GPU machine for the papers' small-scale grids within a time
# budget: prepare the pycode corpus, measure the small model's speed per
# attention kind (one probe per GPU at a time), choose the tokens per run so
# that the planned runs fit on the given GPUs, run the sweeps side by side
# until the deadline, then summarise, plot and pack everything into
# $OUT/results.tar.gz. Runs the binary built on the workstation
# (build-repro/qattn, carried with .deps/ and data/cache/gpt2; the device
# cannot configure the project).
#   usage (device): tools/dev/device_reproduce.sh [BUDGET_S [PAPERS [GPUS]]]
#     BUDGET_S  seconds for the whole call (default 500)
#     PAPERS    kinterval,sagebwd (default both; side by side on the GPUs)
#     GPUS      GPU list for the sweeps, e.g. 0,1 (default 0)
#   environment: QATTN_BIN (default build-repro/qattn), TOKENS_PER_RUN (a fixed
#   budget instead of the planned one), OUT (default /tmp/qattn_out)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
START=$(date +%s)
BUDGET=${1:-500}
IFS=, read -r -a WANTED <<< "${2:-kinterval,sagebwd}"
GPUS=${3:-0}
IFS=, read -r -a GPU_LIST <<< "$GPUS"
for paper in "${WANTED[@]}"; do
  [[ $paper == kinterval || $paper == sagebwd ]] || { echo "PAPERS: '$paper' is not allowed; allowed: kinterval, sagebwd" >&2; exit 2; }
done
DEADLINE=$((START + BUDGET))
# Reserved at the end: running runs checkpoint on SIGTERM, summaries, plots, tar.
FINAL_RESERVE_S=35
# Planned per run besides its tokens: start-up, evaluations, the diagnostics
# step, final checkpoint.
RUN_OVERHEAD_S=8
export QATTN_BIN=${QATTN_BIN:-$PWD/build-repro/qattn}
log() { echo "[device_reproduce +$(($(date +%s) - START))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$QATTN_BIN" --help > /dev/null || { log "carried qattn does not start:"; ldd "$QATTN_BIN" | grep "not found"; exit 1; }
echo "commit ${QATTN_COMMIT:-unknown} (the workstation's HEAD when the binaries were built)"
rm -rf /tmp/qattn_probe /tmp/qattn_probe_*.log

# ---- data
log "data/prepare.sh pycode"
data/prepare.sh pycode 2>&1 | tail -n 4
log "data ready"

# ---- speed of the small model per attention kind (tokens per step as the K-interval grid)
BASE=configs/repro/gpt2_6l384_pycode.json
probe() {  # probe GPU NAME [--set ...]: median tokens/s of steps 3..10 (0 when the run failed)
  local gpu=$1 name=$2 speed
  shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout 45 "$QATTN_BIN" train "$BASE" --set train.tokens=655360 --set train.tokens_per_step=65536 \
    --set train.warmup=1 --set eval.every=0 --set eval.batches=1 --set log.diag_every=0 \
    --set log.out=/tmp/qattn_probe --set log.name="$name" "$@" > "/tmp/qattn_probe_$name.log" 2>&1 ||
    log "probe $name failed: $(tail -n 3 "/tmp/qattn_probe_$name.log")" >&2
  speed=$(python3 -c 'import csv,statistics,sys; r=[float(x["tokens_per_s"]) for x in csv.DictReader(open(sys.argv[1])) if x["tokens_per_s"] and int(x["step"])>=3]; print(int(statistics.median(r)) if len(r) >= 5 else 0)' \
    "/tmp/qattn_probe/$name/metrics.csv" 2> /dev/null)
  echo "${speed:-0}"
}
# Only the kinds the wanted papers use, each probe on a GPU of its own when there are several.
want() { [[ " ${WANTED[*]} " == *" $1 "* ]]; }
gpu_of() { echo "${GPU_LIST[$(($1 % ${#GPU_LIST[@]}))]}"; }
SAGE=0 KI=0
probe "$(gpu_of 0)" fpa > /tmp/qattn_speed_fpa &
want sagebwd && probe "$(gpu_of 1)" sage --set attention.kind=sage > /tmp/qattn_speed_sage &
want kinterval && probe "$(gpu_of 2)" kinterval --set attention.kind=kinterval --set attention.kinterval.calibration=fwm \
  --set attention.kinterval.rounding=nearest --set attention.kinterval.ste=prob > /tmp/qattn_speed_kinterval &
wait
FPA=$(cat /tmp/qattn_speed_fpa)
want sagebwd && SAGE=$(cat /tmp/qattn_speed_sage)
want kinterval && KI=$(cat /tmp/qattn_speed_kinterval)
log "speed, tokens/s: fpa $FPA, sage $SAGE, kinterval (nearest, prob STE) $KI"

# ---- tokens per run: the planned runs (seed 1 of every cell, and seed 2 of
# the first cells in each file's priority order) in the time left. A paper
# whose attention kind failed its probe is left out (its kernel would fail or
# hang every run).
PAPERS=()
want kinterval && ((KI > 0)) && PAPERS+=(kinterval)
want sagebwd && ((SAGE > 0)) && PAPERS+=(sagebwd)
((FPA > 0)) || PAPERS=()
((${#PAPERS[@]} > 0)) || { log "no attention kind ran; nothing to reproduce"; exit 1; }
TOKENS=$(python3 - "$FPA" "$SAGE" "$KI" "$((DEADLINE - $(date +%s) - FINAL_RESERVE_S))" "$RUN_OVERHEAD_S" \
  "${#GPU_LIST[@]}" "${PAPERS[@]}" <<'PY'
import sys
fpa, sage, ki, left, overhead, gpus = (float(x) for x in sys.argv[1:7])
speed = {"fpa": fpa, "sage": sage, "kinterval": ki}
# (kind, runs) per paper: K-interval seed 1: fpa + 11 kinterval cells, seed 2 of
# the first 5 cells (fpa + 4); SageBwd seed 1: 4 fpa + 7 sage cells, seed 2 of
# the first 4 (2 + 2).
plans = {"kinterval": [("fpa", 1 + 1), ("kinterval", 11 + 4)], "sagebwd": [("fpa", 4 + 2), ("sage", 7 + 2)]}
plan = [entry for paper in sys.argv[7:] for entry in plans[paper]]
runs = sum(n for _, n in plan)
tokens = (gpus * left - overhead * runs) / sum(n / speed[k] for k, n in plan)
step = 262144  # the largest tokens per step of the grids
print(max(4 * step, int(tokens // step) * step))
PY
)
# TOKENS_PER_RUN (environment) fixes the budget instead, e.g. to match another paper's call.
[[ -n ${TOKENS_PER_RUN:-} ]] && TOKENS=$TOKENS_PER_RUN
log "papers: ${PAPERS[*]}; tokens per run: $TOKENS"

# ---- the grids side by side until the deadline. The sweeps ask for one SPEC §5
# diagnostics step per run, at its end (fp64 CPU references of every layer's
# heads, a few seconds: part of RUN_OVERHEAD_S).
SWEEP_DEADLINE=$((DEADLINE - FINAL_RESERVE_S + 20))
PIDS=()
for paper in "${PAPERS[@]}"; do
  "tools/reproduce_$paper.sh" --no-data --tokens "$TOKENS" --deadline "$SWEEP_DEADLINE" --gpus "$GPUS" \
    > "$OUT/$paper.log" 2>&1 &
  PIDS+=($!)
done
wait "${PIDS[@]}"
log "sweeps ended"

# ---- pack: summaries, plots, diagnostics, every run's metrics/diag/status/config/console (no checkpoints)
NAMES=()
for paper in "${PAPERS[@]}"; do NAMES+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "runs/repro/${paper}_small.json")"); done
tar czf "$OUT/results.tar.gz" --exclude='checkpoints' --exclude='events.log' runs/repro "${NAMES[@]/#/runs/}" \
  /tmp/qattn_probe/*/metrics.csv /tmp/qattn_probe_*.log 2> /dev/null
ls -la "$OUT"
for n in "${NAMES[@]}"; do
  echo "===== runs/$n/summary.md"
  sed -n '1,/^## Runs/p' "runs/$n/summary.md"
done
log "done"
