#!/usr/bin/env bash
# Tokens/s of a config's training steps under variants of its settings, one
# run after another on one GPU: the median over steps 5..STEPS of each run's
# logged tokens_per_s and MFU from step 5 (no evaluation, checkpoints or
# diagnostics). TOKENS: the tokens of each run (train.tokens).
#   usage (device): tools/dev/step_speed.sh CONFIG TOKENS 'LABEL|PATH=VALUE ...' ...
#   e.g. tools/dev/step_speed.sh configs/repro/gpt2_6l384_pycode.json 1966080 \
#          'mb32|train.micro_batch=32' 'mb64|train.micro_batch=64'
# environment: QATTN_BIN (default build-repro/qattn), OUT (default /tmp/qattn_out)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, .deps/ libraries
CONFIG=${1:?usage: step_speed.sh CONFIG TOKENS 'LABEL|PATH=VALUE ...' ...}
TOKENS=${2:?TOKENS: the tokens of each run}
shift 2
QATTN=${QATTN_BIN:-build-repro/qattn}
printf '%-28s %12s %8s\n' variant tokens/s mfu
for variant in "$@"; do
  label=${variant%%|*}
  sets=()
  for a in ${variant#*|}; do sets+=(--set "$a"); done
  dir=/tmp/qattn_step_speed/$label
  rm -rf "$dir"
  "$QATTN" train "$CONFIG" --set train.tokens="$TOKENS" --set train.warmup=1 --set eval.every=0 --set log.every=1 \
    --set log.diag_every=0 --set train.checkpoint_every=0 "${sets[@]}" --out "$dir" --fresh > "$OUT/step_speed_$label.log" 2>&1 ||
    { printf '%-28s failed: %s\n' "$label" "$(tail -n 1 "$OUT/step_speed_$label.log")"; continue; }
  python3 - "$dir/metrics.csv" "$label" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["tokens_per_s"] and int(r["step"]) >= 5]
print(f"{sys.argv[2]:<28} {statistics.median(float(r['tokens_per_s']) for r in rows):12.0f} "
      f"{statistics.median(float(r['mfu']) for r in rows):8.3f}")
PY
done
