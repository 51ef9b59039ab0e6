#!/usr/bin/env bash
# One call on the GPU machine that checks the whole CUDA side together: every
# GPU test, the attention kinds' speed beside cuDNN/FA2, and GPT-2 124M training
# speed for each attention kind beside PyTorch (eager, torch.compile) measured in
# the same call. Runs binaries built on the workstation (build-gpu/, carried with
# .deps/: the device lacks pcre2's development files). Logs go to $OUT.
#   usage (device): tools/dev/device_integration.sh [steps]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
STEPS=${1:-8}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader

# 1. Correctness: every GPU test.
timeout 240 "$BUILD/tests/qattn_gpu_tests" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?: $(tail -n 3 "$OUT/gpu_tests.log" | tr '\n' ' ')"

# 2. Attention kernels, each kind, beside the PyTorch peers: the issues' two
# shapes with the fp64 CPU check of head (0, 0), the other ANCHORS shapes and
# (8, 12, 2048, 64) without it (the check of a 16k row costs more than the bench).
check_shapes="--shape 8,12,1024,64 --shape 4,16,4096,128"
more_shapes="--shape 8,12,2048,64 --shape 4,12,4096,64 --shape 1,16,16384,128"
bench() {
  "$BUILD/qattn" bench attention "$@" $check_shapes
  "$BUILD/qattn" bench attention "$@" $more_shapes --no-check
}
SAGE_KINTERVAL="--set attention.sage.softmax.kind=kinterval --set attention.sage.softmax.K=16 \
--set attention.sage.softmax.calibration=fwm --set attention.sage.softmax.rounding=nearest \
--set attention.sage.softmax.ste=prob"  # one line: the settings list below splits at newlines
# All six products in fp8 (docs/sage.md, "FP8 operands").
SAGE_FP8="--set attention.sage.precision.qk=fp8 --set attention.sage.precision.pv=fp8 \
--set attention.sage.precision.dp=fp8 --set attention.sage.precision.dv=fp8 \
--set attention.sage.precision.dq=fp8 --set attention.sage.precision.dk=fp8"
{
  bench --kind fpa
  bench --kind sage
  bench --kind sage $SAGE_KINTERVAL
  bench --kind sage $SAGE_FP8
  bench --kind kinterval --rounding lerp --calibration minmax --K 4
  bench --kind kinterval --rounding nearest --calibration fwm --ste weight --K 4
  bench --kind kinterval --rounding nearest --calibration minmax --ste prob --K 4
  bench --kind kinterval --rounding lerp --calibration minmax --K 32 --detach-extrema
  python3 tools/dev/bench_peers.py --attention-only $check_shapes $more_shapes
} > "$OUT/bench_attention.log" 2>&1
echo "attention bench rc=$?"

# 3. GPT-2 124M, 524,288 tokens/step, synthetic tokens (speed only), per kind.
DATA=/tmp/qattn_synth
python3 - "$DATA" "$STEPS" <<'PY'
import array, os, random, struct, sys
out, steps = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
random.seed(0)
for name, count in (("train", (steps + 2) * 524288 + 1025), ("val", 4 * 64 * 1025)):
    with open(f"{out}/synth_{name}_000.bin", "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, count) + bytes(4 * 253))
        f.write(array.array("H", (random.randrange(50257) for _ in range(count))).tobytes())
PY
# Each attention setting: its name, attention.kind and further --set arguments.
KINTERVAL_PROB="--set attention.kinterval.rounding=nearest --set attention.kinterval.ste=prob"
SETTINGS=("fpa|fpa|" "sage|sage|" "kinterval|kinterval|" "kinterval-prob|kinterval|$KINTERVAL_PROB"
          "sage-kinterval|sage|$SAGE_KINTERVAL" "sage-fp8|sage|$SAGE_FP8")
for setting in "${SETTINGS[@]}"; do
  IFS='|' read -r name kind sets <<< "$setting"
  # shellcheck disable=SC2086 # $sets is a list of --set arguments
  timeout 120 "$BUILD/qattn" train configs/gpt2_124m_fpa.json --set attention.kind=$kind $sets \
    --set "data.train=$DATA/synth_train_*.bin" --set "data.val=$DATA/synth_val_*.bin" \
    --set train.steps=$STEPS --set train.warmup=2 --set train.micro_batch=64 \
    --set eval.every=0 --set eval.batches=1 --set log.diag_every=0 --set train.checkpoint_every=0 \
    --out /tmp/runs/$name > "$OUT/train_$name.log" 2>&1
  echo "train $name rc=$?"
done
timeout 240 python3 tools/dev/bench_peers.py --gpt2-only > "$OUT/bench_gpt2_peers.log" 2>&1
echo "gpt2 peers rc=$?"

echo "===== attention (median ms / TFLOP/s)"
grep -vE "^\s*$" "$OUT/bench_attention.log" | cut -c1-120
echo "===== GPT-2 124M tokens/s"
for setting in "${SETTINGS[@]}"; do
  name=${setting%%|*}
  python3 - "$name" "/tmp/runs/$name/metrics.csv" <<'PY'
import csv, statistics, sys
name, path = sys.argv[1], sys.argv[2]
try:
    rows = [r for r in csv.DictReader(open(path)) if r.get("tokens_per_s")]
except OSError:
    sys.exit(f"{name}: no metrics")
tok = [float(r["tokens_per_s"]) for r in rows[2:]]
mfu = [float(r["mfu"]) for r in rows[2:] if r.get("mfu")]
print(f"qattn {name:14s}: median {statistics.median(tok):>9,.0f} tokens/s, MFU {100*statistics.median(mfu):.1f}% over {len(tok)} steps")
PY
done
tail -n 6 "$OUT/bench_gpt2_peers.log"
grep -h "memory" /tmp/runs/fpa/events.log 2>/dev/null | head -2
