#!/usr/bin/env bash
# One visit to the GPU machine for a paper's small-scale grid at the protocol's
# budget (docs/reproducing.md): prepare the pycode corpus, restore the finished
# runs kept in docs/results/<sweep name>/, run the rest in the grid's order
# (every seed of a cell before the next cell) until the time is up, keep every
# run that finished, and pack that folder into $OUT/results.tar.gz. No run
# starts that could not finish before the deadline (tools/reproduce.sh
# --deadline plans with the longest finished run), so nothing is lost when the
# machine goes back; the next visit carries on where this one stopped.
# Runs the binary built on the workstation (build-repro/qattn, carried with
# .deps/ and data/cache/gpt2; the device cannot configure the project).
#   usage (device): tools/dev/device_reproduce.sh [BUDGET_S [PAPER [GPUS]]]
#     BUDGET_S  seconds for the whole call (default 560)
#     PAPER     kinterval or sagebwd (default kinterval)
#     GPUS      GPU list, one run per GPU at a time (default 0)
#   environment: QATTN_BIN (default build-repro/qattn), RUN_SECONDS (the
#   longest a run takes, when no run of the grid has finished yet; default 130
#   for kinterval, whose runs take 103-111 s on one H200, and 150 for sagebwd,
#   whose 400-step runs at 262,144 tokens/step took about 110 s),
#   OUT (default /tmp/qattn_out)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
START=$(date +%s)
BUDGET=${1:-560}
PAPER=${2:-kinterval}
GPUS=${3:-0}
[[ $PAPER == kinterval || $PAPER == sagebwd ]] || { echo "PAPER: '$PAPER' is not allowed; allowed: kinterval, sagebwd" >&2; exit 2; }
# Reserved at the end: summaries, plots, the tar.
FINAL_RESERVE_S=20
export QATTN_BIN=${QATTN_BIN:-$PWD/build-repro/qattn}
log() { echo "[device_reproduce +$(($(date +%s) - START))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$QATTN_BIN" --help > /dev/null || { log "carried qattn does not start:"; ldd "$QATTN_BIN" | grep "not found"; exit 1; }

log "data/prepare.sh pycode"
data/prepare.sh pycode 2>&1 | tail -n 2
log "data ready"

NAME=$(python3 -c 'import json,re,sys; print(json.loads(re.sub(r"(?m)^\s*//.*$", "", open(sys.argv[1]).read()))["name"])' \
  "configs/sweeps/${PAPER}_small.json")
RESULTS=docs/results/$NAME
RUN_ARGS=()
# Until a run of the grid has finished, RUN_SECONDS is the plan for one run.
FIRST_RUN_SECONDS=130
[[ $PAPER == sagebwd ]] && FIRST_RUN_SECONDS=150
[[ -d $RESULTS/runs ]] || RUN_ARGS+=(--run-seconds "${RUN_SECONDS:-$FIRST_RUN_SECONDS}")
"tools/reproduce_$PAPER.sh" --no-data --one-pass --results "$RESULTS" --deadline "$((START + BUDGET - FINAL_RESERVE_S))" \
  --gpus "$GPUS" "${RUN_ARGS[@]}" > "$OUT/$PAPER.log" 2>&1
log "grid visit ended ($(grep -c '' "$OUT/$PAPER.log") log lines)"
grep -E "restored|kept|start |: finished|: diverged|: failed|not started|deadline" "$OUT/$PAPER.log" | tail -n 60

tar czf "$OUT/results.tar.gz" "$RESULTS"
sed -n '1,/^## Runs/p' "$RESULTS/summary.md"
log "done"
