#!/usr/bin/env bash
# One call on the GPU machine for the CUDA backend: the GPU tests of its kernels
# and of the whole model, then a GPT-2 124M training speed run (T = 1024,
# 524,288 tokens per step) on synthetic tokens. Runs the binaries built on the
# workstation, carried in build-cuda/ with .deps/ (the device lacks pcre2's
# development files, so a build there does not configure).
# Logs go to $OUT; a summary is printed last.
#   usage (device): tools/dev/device_cuda_backend.sh [steps]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
STEPS=${1:-12}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

BUILD=build-cuda
# (Catch2 v2's --list-tests exits with the number of tests: ask the CLI instead.)
if ! "$BUILD/qattn" --help > /dev/null 2>&1; then
  echo "carried binaries do not start here:"; ldd "$BUILD/qattn" | grep "not found"; exit 1
fi

timeout 150 "$BUILD/tests/qattn_gpu_tests" "[kernels],[model]" -d yes > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"

# Synthetic llm.c shards: uniform random GPT-2 token ids (speed only).
DATA=/tmp/qattn_synth
python3 - "$DATA" "$STEPS" <<'PY'
import array, os, struct, sys
out, steps = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
for name, count in (("train", (steps + 2) * 524288 + 1025), ("val", 4 * 64 * 1025)):
    tokens = array.array("H", os.urandom(2 * count))
    tokens = array.array("H", (t % 50257 for t in tokens))
    with open(f"{out}/synth_{name}_000.bin", "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, count) + bytes(4 * 253))
        f.write(tokens.tobytes())
PY
cat > /tmp/gpt2_124m_speed.json <<JSON
{
  "model": {"vocab": 50257, "layers": 12, "heads": 12, "dim": 768, "seq_len": 1024},
  "attention": {"kind": "fpa"},
  "data": {"train": "$DATA/synth_train_*.bin", "val": "$DATA/synth_val_*.bin"},
  "train": {"tokens_per_step": 524288, "micro_batch": 64, "steps": $STEPS, "lr": 6e-4,
            "warmup": 2, "device": "cuda"},
  "eval": {"every": 0, "batches": 1},
  "log": {"every": 1, "out": "/tmp/qattn_runs", "name": "gpt2_124m_speed"}
}
JSON
timeout 150 "$BUILD/qattn" train /tmp/gpt2_124m_speed.json > "$OUT/train.log" 2>&1
echo "train rc=$?"
cp /tmp/qattn_runs/gpt2_124m_speed/metrics.csv "$OUT/" 2>/dev/null

echo "===== gpu tests (tail)"
grep -E "rel L2|^step|FAILED|failed|passed|SKIP|error" "$OUT/gpu_tests.log" | tail -60
echo "===== train (tail)"
tail -n 25 "$OUT/train.log"
python3 - "$OUT/metrics.csv" <<'PY'
import csv, statistics, sys
try:
    rows = list(csv.DictReader(open(sys.argv[1])))
except OSError:
    sys.exit("no metrics.csv")
tok = [float(r["tokens_per_s"]) for r in rows[2:] if r.get("tokens_per_s")]
if tok:
    print(f"124M speed: median {statistics.median(tok):,.0f} tokens/s over {len(tok)} steps "
          f"(PyTorch compiled anchor 532,000: {statistics.median(tok) / 532000:.2f}x)")
PY
