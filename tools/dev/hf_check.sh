#!/usr/bin/env bash
# The Hugging Face round trip, end to end, on a machine with PyTorch and
# transformers (the GPU machine): trains a small GPT-2 with the qattn binary,
# exports it with `qattn export --format hf`, loads the directory with
# transformers' GPT2LMHeadModel and prints a table comparing
#   - the validation loss on the same windows: qattn's fp32 CPU model started
#     from the exported directory (model.init_from; its step-0 val loss)
#     against transformers in fp32; they must agree within 1e-3 nats;
#   - the greedy continuation of end-of-text: `qattn sample --temperature 0
#     --ids` against transformers' argmax, token for token.
# Exit 0 when both hold.
#
#   usage: QATTN_BIN=build-gpu/qattn tools/dev/hf_check.sh [steps]   (default 300)
#
# Data: pycode (data/prepare.sh pycode, offline given data/cache/gpt2). It is
# GPT-2-tokenised, so the model has vocab 50257, the GPT-2 transformers' tools
# expect; the byte-level quickstart data would load too (config.json carries
# vocab_size 257) but no GPT-2 tokenizer or tool could read its tokens.
# Work files go to $WORK (default /tmp/qattn_hf_check), replaced on each run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
QATTN_BIN=${QATTN_BIN:-build/qattn}
STEPS=${1:-300}
WORK=${WORK:-/tmp/qattn_hf_check}
B=8 T=256 EVAL_BATCHES=8 GREEDY=32

die() { echo "hf_check.sh: $*" >&2; exit 1; }
[[ -x $QATTN_BIN ]] || die "QATTN_BIN=$QATTN_BIN is not an executable (build qattn first)"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "steps: '$STEPS' is not allowed; allowed: a positive integer"
python3 -c "import torch, transformers" 2>/dev/null || die "python3 cannot import torch and transformers"
QATTN_BIN=$QATTN_BIN data/prepare.sh pycode | tail -n 2

rm -rf "$WORK"
mkdir -p "$WORK"
cat > "$WORK/hf_check.json" <<JSON
{
  "model": {"vocab": 50257, "layers": 4, "heads": 4, "dim": 256, "seq_len": $T},
  "attention": {"kind": "fpa"},
  "data": {"train": "data/cache/pycode/pycode_train_*.bin", "val": "data/cache/pycode/pycode_val_*.bin"},
  "train": {"tokens_per_step": $((B * T * 8)), "micro_batch": $B, "steps": $STEPS, "lr": 2e-3,
            "warmup": $(((STEPS + 9) / 10)), "seed": 1, "device": "auto"},
  "eval": {"every": 100, "batches": $EVAL_BATCHES},
  "log": {"out": "$WORK/runs", "name": "trained", "every": 100}
}
JSON
# run LOG ARGS...: qattn with its output in $WORK/LOG, shown when it fails.
run() {
  local log=$WORK/$1
  shift
  "$QATTN_BIN" "$@" > "$log" 2>&1 || { tail -n 20 "$log" >&2; die "qattn $1 failed (log: $log)"; }
}
# The val_loss column of the step-0 row, and of the last row that has one.
first_val() { awk -F, 'NR == 2 { print $5 }' "$1"; }
last_val() { awk -F, 'NR > 1 && $5 != "" { v = $5 } END { print v }' "$1"; }

echo "training $STEPS steps ($WORK/train.log) ..."
run train.log train "$WORK/hf_check.json"
run export.log export --checkpoint "$WORK/runs/trained" --format hf --out "$WORK/hf"
echo "qattn fp32 CPU evaluation of the exported directory ($WORK/eval.log) ..."
run eval.log train "$WORK/hf_check.json" --set "model.init_from=$WORK/hf" --set train.device=cpu \
  --set train.steps=1 --set train.warmup=0 --set "train.tokens_per_step=$((B * T))" --set log.name=evaluated
run sample.log sample --checkpoint "$WORK/runs/trained" --tokens "$GREEDY" --temperature 0 --ids
python3 tools/dev/hf_check.py --model "$WORK/hf" --val 'data/cache/pycode/pycode_val_*.bin' \
  --seq-len "$T" --micro-batch "$B" --batches "$EVAL_BATCHES" --vocab data/cache/gpt2 \
  --qattn-val "$(first_val "$WORK/runs/evaluated/metrics.csv")" \
  --qattn-train-val "$(last_val "$WORK/runs/trained/metrics.csv")" \
  --qattn-greedy "$(tail -n 1 "$WORK/sample.log")"
