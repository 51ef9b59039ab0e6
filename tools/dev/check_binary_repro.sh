#!/usr/bin/env bash
# Whether a qattn binary reproduces runs kept in a grid's results folder bit for
# bit, so that a grid can go on with a binary built from a later tree. Each
# named kept run is trained again from its own config.json for SECONDS, then
# stopped (SIGINT), and every metrics.csv row both runs have (train loss, val
# loss, grad norm, lr) is compared exactly. Needs the run's data (e.g.
# data/prepare.sh pycode first). Exits 0 when every row of every run agrees,
# 1 when one differs (the first difference is printed), 2 on bad arguments.
#   usage (device): tools/dev/check_binary_repro.sh RESULTS_DIR SECONDS RUN...
#     RESULTS_DIR  e.g. docs/results/kinterval_small (runs kept under runs/)
#     RUN          a kept run's folder name under RESULTS_DIR/runs
#   environment: QATTN_BIN (default build-repro/qattn), OUT (default /tmp/qattn_out)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
(($# >= 3)) || { sed -n '2,12p' "$0" >&2; exit 2; }
RESULTS=$1
SECONDS_PER_RUN=$2
shift 2
[[ $SECONDS_PER_RUN =~ ^[0-9]+$ ]] || { echo "SECONDS: '$SECONDS_PER_RUN' is not a whole number of seconds" >&2; exit 2; }
QATTN_BIN=${QATTN_BIN:-$PWD/build-repro/qattn}
status=0
for run in "$@"; do
  kept=$RESULTS/runs/$run
  [[ -f $kept/config.json && -f $kept/metrics.csv ]] ||
    { echo "RUN: '$kept' has no config.json and metrics.csv" >&2; exit 2; }
  again=$OUT/repro_check/$run
  rm -rf "$again" "$again.json"
  mkdir -p "$again"
  # config.json is the effective config: drop what train derives (grad_accum,
  # and tokens beside steps) so that it reads as an input config again.
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["train"].pop("grad_accum", None); c["train"].pop("tokens", None)
json.dump(c, open(sys.argv[2], "w"), indent=1)' "$kept/config.json" "$again.json"
  timeout -s INT "$SECONDS_PER_RUN" "$QATTN_BIN" train "$again.json" --out "$again" --fresh \
    > "$OUT/repro_check_$(echo "$run" | md5sum | cut -c1-8).log" 2>&1
  python3 - "$kept/metrics.csv" "$again/metrics.csv" "$run" <<'EOF' || status=1
import csv, sys
kept_path, again_path, run = sys.argv[1:]
def rows(path):
    with open(path) as f:
        return {(r["step"], r["event"]): r for r in csv.DictReader(f)}
kept, again = rows(kept_path), rows(again_path)
fields = ["lr", "train_loss", "val_loss", "grad_norm"]
common = sorted((k for k in again if k in kept), key=lambda k: int(k[0]))
if len(common) < 2:
    sys.exit(f"{run}: only {len(common)} rows to compare; give it more SECONDS")
for key in common:
    for f in fields:
        if kept[key][f] != again[key][f]:
            sys.exit(f"{run}: differs at step {key[0]}, {f}: kept {kept[key][f]}, again {again[key][f]}")
print(f"{run}: identical over {len(common)} rows (to step {common[-1][0]})")
EOF
done
exit $status
