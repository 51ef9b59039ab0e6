#!/usr/bin/env bash
# Where a GPT-2 124M training step spends its time, per kernel, on the GPU
# machine: Nsight Compute times every kernel of one micro-step-sized step
# (65,536 tokens, micro-batch 64) after the first steps, and a table sums them
# by kernel name. Synthetic token ids (speed only). Binaries as in
# device_integration.sh (built on the workstation, carried with .deps/).
# CONFIG picks another model (e.g. configs/repro/gpt2_6l384_pycode.json, whose
# steps are shorter: STEPS=12 gives the skipped and timed launches room).
#   usage (device): BUILD=carry-gpu OUT=/tmp/out tools/dev/profile_step.sh [attention.kind [CONFIG]]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
KIND=${1:-fpa}
CONFIG=${2:-configs/gpt2_124m_fpa.json}
STEPS=${STEPS:-4}
# The run's length in the key the config gives it (train.steps or train.tokens).
LENGTH=(--set train.steps="$STEPS")
grep -q '"tokens":' "$CONFIG" && LENGTH=(--set train.tokens=$((STEPS * 65536)))
DATA=/tmp/qattn_profile_synth
python3 - "$DATA" <<'PY'
import array, os, random, struct, sys
out = sys.argv[1]; os.makedirs(out, exist_ok=True); random.seed(0)
for name, count in (("train", 8 * 65536 + 1025), ("val", 4 * 64 * 1025)):
    with open(f"{out}/synth_{name}_000.bin", "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, count) + bytes(4 * 253))
        f.write(array.array("H", (random.randrange(50257) for _ in range(count))).tobytes())
PY
# Steps 1-2 warm up (algorithm choice, first launches); 700 launches from there
# cover more than one step.
timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 700 \
  --launch-count 700 --csv "$BUILD/qattn" train "$CONFIG" \
  --set attention.kind="$KIND" --set "data.train=$DATA/synth_train_*.bin" \
  --set "data.val=$DATA/synth_val_*.bin" "${LENGTH[@]}" --set train.warmup=1 \
  --set train.micro_batch=64 --set train.tokens_per_step=65536 --set eval.every=0 \
  --set eval.batches=1 --set log.diag_every=0 --set train.checkpoint_every=0 \
  --out /tmp/qattn_profile_run > "$OUT/profile_$KIND.csv" 2> "$OUT/profile_$KIND.err"
echo "ncu rc=$?"
python3 - "$OUT/profile_$KIND.csv" <<'PY'
import collections, csv, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name_at, value_at, unit_at = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
us = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
total, count = collections.Counter(), collections.Counter()
for r in rows[1:]:
    try:
        t = float(r[value_at].replace(",", "")) * us[r[unit_at]]
    except (ValueError, KeyError):
        continue
    name = re.sub(r"\(.*", "", r[name_at])[:90]
    total[name] += t
    count[name] += 1
all_us = sum(total.values())
print(f"{all_us / 1000:.2f} ms in {sum(count.values())} kernel launches")
for name, t in total.most_common(25):
    print(f"{t / 1000:8.3f} ms {100 * t / all_us:5.1f}%  x{count[name]:<4d} {name}")
PY
