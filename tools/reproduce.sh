#!/usr/bin/env bash
# tools/reproduce.sh PAPER [options]: one paper's ablation grid end to end —
# data, sweep, summary, plots, diagnostics table. PAPER is kinterval or
# sagebwd (tools/reproduce_kinterval.sh and tools/reproduce_sagebwd.sh call
# this). The sweep is configs/sweeps/PAPER_SCALE.json; results land in
# runs/<sweep name>/ (summary.md, summary.csv, loss.png, loss_gap.png,
# loss_diag.png, diag.md, gap_curve.md).
# Resumable: run the same command again and finished runs are skipped, the
# others continue from their checkpoints.
#
#   --scale small|full   small (default): 6-layer 384-wide GPT-2 on Python source
#                        (data/prepare.sh pycode); full: the papers' scale on
#                        FineWeb shards you provide (see docs/reproducing.md)
#   --tokens N           tokens per run (default: the sweep's own); the step
#                        counts scale with it and the run folder is named for it
#   --deadline EPOCH_S   stop at this time (date +%s): running runs checkpoint,
#                        the summary covers what finished
#   --gpus LIST          GPUs, one run per GPU at a time (default 0)
#   --no-data            do not run data/prepare.sh (data already prepared)
#   --set PATH=VALUE     an override for every run (repeatable; the grid's keys
#                        still win); the run folder's name gets a hash of them
#   --one-pass           run the sweep in file order; by default seed 1 of every
#                        cell runs first, then the other seeds in cell order
#   --results DIR        accumulate across machines: finished runs kept in
#                        DIR/runs/<id>/ (status, metrics, diagnostics, config)
#                        are restored before the sweep and skipped; every run
#                        that finishes is added there, and the summary, plots
#                        and diagnostics table of all of them are copied to DIR
#   --run-seconds S      with --deadline: the longest a run takes; no run starts
#                        later than S before the deadline (default: the longest
#                        wall time among the finished runs, else 600)
#   --summary-only       no data, no training: the summary, plots and tables of
#                        the runs there (with --results, the kept runs restored
#                        first and the outputs copied back: a results folder
#                        rebuilt from its kept runs on any machine, GPU or not)
# Environment: QATTN_BIN (the qattn binary, default build/qattn).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
die() { echo "reproduce.sh: $*" >&2; exit 2; }

(($# > 0)) || die "usage: tools/reproduce.sh kinterval|sagebwd [--scale small|full] [--tokens N] [--deadline EPOCH_S] [--gpus LIST] [--no-data] [--set PATH=VALUE]... [--one-pass] [--results DIR] [--run-seconds S] [--summary-only]"
PAPER=$1
shift
[[ $PAPER == kinterval || $PAPER == sagebwd ]] || die "PAPER '$PAPER' is not allowed; allowed: kinterval | sagebwd"
SCALE=small TOKENS="" DEADLINE="" GPUS=0 DATA=1 SEED_PASSES=1 RESULTS="" RUN_SECONDS="" TRAIN=1
SETS=()
while (($# > 0)); do
  case "$1" in
    --scale) SCALE=${2:?--scale needs small or full}; shift 2 ;;
    --tokens) TOKENS=${2:?--tokens needs a count}; shift 2 ;;
    --deadline) DEADLINE=${2:?--deadline needs a time in seconds since the epoch}; shift 2 ;;
    --gpus) GPUS=${2:?--gpus needs a list like 0,1}; shift 2 ;;
    --no-data) DATA=0; shift ;;
    --set) SETS+=(--set "${2:?--set needs PATH=VALUE}"); shift 2 ;;
    --one-pass) SEED_PASSES=0; shift ;;
    --results) RESULTS=${2:?--results needs a folder}; shift 2 ;;
    --run-seconds) RUN_SECONDS=${2:?--run-seconds needs a number of seconds}; shift 2 ;;
    --summary-only) TRAIN=0 DATA=0; shift ;;
    *) die "unknown option '$1'" ;;
  esac
done
[[ $SCALE == small || $SCALE == full ]] || die "--scale '$SCALE' is not allowed; allowed: small | full"
[[ -z $TOKENS || $TOKENS =~ ^[0-9]+$ ]] || die "--tokens '$TOKENS' is not allowed; allowed: a token count"
[[ -z $DEADLINE || $DEADLINE =~ ^[0-9]+$ ]] || die "--deadline '$DEADLINE' is not allowed; allowed: seconds since the epoch"
[[ -z $RUN_SECONDS || $RUN_SECONDS =~ ^[0-9]+$ ]] || die "--run-seconds '$RUN_SECONDS' is not allowed; allowed: whole seconds"

QATTN=${QATTN_BIN:-$ROOT/build/qattn}
[[ -x $QATTN ]] || die "no qattn binary at $QATTN; build it (tools/build.sh) or set QATTN_BIN"
export QATTN_BIN=$QATTN
SOURCE=configs/sweeps/${PAPER}_${SCALE}.json
log() { echo "[reproduce $PAPER $(date -u +%H:%M:%S)] $*"; }

# ---- data
if ((DATA)); then
  if [[ $SCALE == small ]]; then
    data/prepare.sh pycode
  else
    log "full scale: the FineWeb shards named by the base config of $SOURCE must be there (docs/reproducing.md)"
  fi
fi

# ---- the sweep files: the whole grid, and seed 1 alone for the first pass
WORK=runs/repro
mkdir -p "$WORK"
ALL=$WORK/${PAPER}_${SCALE}.json
FIRST=$WORK/${PAPER}_${SCALE}.seed1.json
NAME=$(python3 tools/scale_sweep.py "$SOURCE" --out "$ALL" ${TOKENS:+--tokens "$TOKENS"} "${SETS[@]}")
FIRST_SEED=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("seeds", [""])[0])' "$ALL")
python3 tools/scale_sweep.py "$SOURCE" --out "$FIRST" ${TOKENS:+--tokens "$TOKENS"} "${SETS[@]}" \
  ${FIRST_SEED:+--seeds "$FIRST_SEED"} > /dev/null
SWEEP_DIR=runs/$NAME
log "sweep $NAME ($SOURCE${TOKENS:+, $TOKENS tokens per run}) -> $SWEEP_DIR"

if [[ -n $RESULTS && ! -d $RESULTS/runs ]]; then
  log "no finished runs kept in $RESULTS yet: the grid starts from its first run"
elif [[ -n $RESULTS ]]; then
  restored=$(python3 tools/results_store.py restore "$RESULTS" "$SWEEP_DIR") || die "restoring $RESULTS failed"
  log "$restored"
fi
if [[ -n $DEADLINE && -z $RUN_SECONDS ]]; then
  RUN_SECONDS=$(python3 tools/results_store.py longest "$SWEEP_DIR" 600)
fi

# Runs a sweep file until it is done or the deadline passes. No run starts
# later than RUN_SECONDS before the deadline, so every run that starts can
# finish; SIGTERM at the deadline makes a late one checkpoint. Runs that
# failed (exit 1) or were left by the deadline (4) still get their summary;
# a sweep refused whole (2: the sweep file, a config, the data or --gpus,
# named in qattn's message) ran nothing, and the script stops with it.
run_sweep() {
  local file=$1 left rc=0
  if [[ -n $DEADLINE ]]; then
    left=$((DEADLINE - $(date +%s)))
    ((left > RUN_SECONDS)) || { log "under ${RUN_SECONDS}s to the deadline; not starting $file"; return 0; }
    timeout --signal=TERM --kill-after=30 "$left" "$QATTN" sweep "$file" --gpus "$GPUS" \
      --start-until "$((DEADLINE - RUN_SECONDS))" || rc=$?
  else
    "$QATTN" sweep "$file" --gpus "$GPUS" || rc=$?
  fi
  ((rc != 2)) || die "qattn sweep refused $file (exit 2; its message is above): no run started"
  ((rc == 0)) || log "sweep $file: exit $rc"
}
if ((TRAIN)); then
  ((SEED_PASSES)) && run_sweep "$FIRST"
  run_sweep "$ALL"
fi

# ---- summary of the whole grid (pending runs included), plots, diagnostics
"$QATTN" sweep "$ALL" --summary > /dev/null
log "summary: $SWEEP_DIR/summary.md"
PY=""
for candidate in /usr/bin/python3 python3; do
  if "$candidate" -c 'import matplotlib' 2> /dev/null; then PY=$candidate; break; fi
done
if [[ -n $PY ]]; then
  "$PY" tools/plot.py "$SWEEP_DIR" || log "plot.py failed"
else
  log "no matplotlib here: no plots (run tools/plot.py $SWEEP_DIR where it is installed)"
fi
python3 tools/diag_table.py "$SWEEP_DIR" > "$SWEEP_DIR/diag.md" || log "diag_table.py failed"
python3 tools/gap_table.py "$SWEEP_DIR" > "$SWEEP_DIR/gap_curve.md" || log "gap_table.py: no gap yet"
if [[ -n $RESULTS ]]; then
  log "$(python3 tools/results_store.py keep "$SWEEP_DIR" "$RESULTS")"
fi
