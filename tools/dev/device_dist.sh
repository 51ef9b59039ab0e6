#!/usr/bin/env bash
# One call on the GPU machine for the data-parallel path (docs/distributed.md):
#   1. the [dist] GPU tests (the 2-GPU case skips itself on one GPU);
#   2. GPT-2 124M on real text (GCIDE shards) for 20 steps at 32,768 tokens per
#      step, trained as a plain single process, as one NCCL rank from the
#      environment (RANK=0 WORLD_SIZE=1) with ZeRO-0 and ZeRO-1, and through the
#      launcher with --nproc 1 (and --nproc 2, ZeRO-0 and ZeRO-1, when two GPUs
#      are visible); every run's losses and grad norms against the plain run's;
#   3. speed at 524,288 tokens per step: plain vs --nproc 1 (and --nproc 2).
# Runs binaries built on the workstation and carried in $BIN with .deps/ (the
# device lacks pcre2's development files), data in $BIN/data.
#   usage (device): tools/dev/device_dist.sh [BIN]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
BIN=${1:-build-h8/carry}
RUNS=/tmp/qattn_dist_runs
if ldd "$BIN/qattn" | grep -q "libnccl.*not found"; then  # NCCL from a Python wheel, if that is where it is
  NCCL_DIR=$(dirname "$(find / -name libnccl.so.2 -not -path "/proc/*" 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$NCCL_DIR:$LD_LIBRARY_PATH
fi
ldd "$BIN/qattn" | grep -E "nccl|not found"
NGPU=$(nvidia-smi -L | wc -l)
echo "GPUs: $NGPU | NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-unset} (left as the machine sets it)"

timeout 60 "$BIN/qattn_gpu_tests" "[dist]" -d yes > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests [dist] rc=$?"
grep -E "SKIP|passed|failed|FAILED|with expansion" "$OUT/gpu_tests.log" | head -20

config() {  # config NAME TOKENS_PER_STEP MICRO_BATCH STEPS EVAL_EVERY
  cat > "$RUNS/$1.json" <<JSON
{
  "model": {"vocab": 50257, "layers": 12, "heads": 12, "dim": 768, "seq_len": 1024},
  "attention": {"kind": "fpa"},
  "data": {"train": "$PWD/$BIN/data/gcide_train_*.bin", "val": "$PWD/$BIN/data/gcide_val_*.bin"},
  "train": {"tokens_per_step": $2, "micro_batch": $3, "steps": $4, "lr": 6e-4, "warmup": 5,
            "device": "cuda"},
  "eval": {"every": $5, "batches": 4},
  "log": {"every": 5, "out": "$RUNS", "name": "$1"}
}
JSON
}
run() {  # run NAME [ENV=VALUE ...] -- ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout 50 "$BIN/qattn" train "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"
  cp "$RUNS/$name/metrics.csv" "$OUT/$name.csv" 2>/dev/null
}

rm -rf "$RUNS" && mkdir -p "$RUNS"
for name in plain env_zero0 env_zero1 nproc1 nproc2_zero0 nproc2_zero1; do config "$name" 32768 16 20 10; done
run plain -- "$RUNS/plain.json"
run env_zero0 RANK=0 WORLD_SIZE=1 -- "$RUNS/env_zero0.json" --set dist.zero_stage=0
run env_zero1 RANK=0 WORLD_SIZE=1 -- "$RUNS/env_zero1.json" --set dist.zero_stage=1
run nproc1 -- "$RUNS/nproc1.json" --nproc 1
if [ "$NGPU" -ge 2 ]; then
  run nproc2_zero0 -- "$RUNS/nproc2_zero0.json" --nproc 2 --set dist.zero_stage=0
  run nproc2_zero1 -- "$RUNS/nproc2_zero1.json" --nproc 2 --set dist.zero_stage=1
fi

for name in speed_plain speed_nproc1 speed_nproc2; do config "$name" 524288 64 8 0; done
run speed_plain -- "$RUNS/speed_plain.json"
run speed_nproc1 -- "$RUNS/speed_nproc1.json" --nproc 1
[ "$NGPU" -ge 2 ] && run speed_nproc2 -- "$RUNS/speed_nproc2.json" --nproc 2

python3 - "$OUT" <<'PY'
import csv, os, statistics, sys
out = sys.argv[1]
def rows(name):
    p = f"{out}/{name}.csv"
    return list(csv.DictReader(open(p))) if os.path.exists(p) else None
def col(rs, key):
    return [float(r[key]) if r[key] else None for r in rs]
ref = rows("plain")
if ref is None:
    sys.exit("no plain run")
print("run            steps  max|d train_loss|  max|d val_loss|  max rel d grad_norm  final train_loss")
for name in ["plain", "env_zero0", "env_zero1", "nproc1", "nproc2_zero0", "nproc2_zero1"]:
    rs = rows(name)
    if rs is None:
        continue
    d = lambda key: max((abs(a - b) for a, b in zip(col(rs, key), col(ref, key)) if a is not None and b is not None), default=float("nan"))
    dn = max((abs(a - b) / b for a, b in zip(col(rs, "grad_norm"), col(ref, "grad_norm")) if a and b), default=float("nan"))
    print(f"{name:14s} {len(rs) - 1:5d}  {d('train_loss'):17.2e}  {d('val_loss'):15.2e}  {dn:19.2e}  {rs[-1]['train_loss']}")
for name in ["speed_plain", "speed_nproc1", "speed_nproc2"]:
    rs = rows(name)
    if rs:
        tok = [float(r["tokens_per_s"]) for r in rs[3:] if r.get("tokens_per_s")]
        if tok:
            print(f"{name}: median {statistics.median(tok):,.0f} tokens/s over steps 3..{len(rs) - 1}")
PY
