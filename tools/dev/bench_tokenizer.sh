#!/usr/bin/env bash
# tools/dev/bench_tokenizer.sh [FILE...]: tokenizer throughput of `qattn tokenize`
# (read, encode, write shards; vocab loading excluded), in MB of input text per
# second with one thread and with all cores, best of 3 runs each. "per
# CPU-second" divides by the CPU time used, which is what one thread achieves
# on an idle core even when the machine is busy.
# Default corpus: the State of the Union + Moby Dick texts (data/prepare.sh
# quickstart fetches them); GPT-2 needs data/cache/gpt2 (data/prepare.sh gpt2-vocab).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${QATTN_BIN:-$ROOT/build/qattn}"
[[ -x "$BIN" ]] || { echo "bench_tokenizer: no qattn binary at $BIN (build it or set QATTN_BIN)" >&2; exit 1; }
VOCAB="$ROOT/data/cache/gpt2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if (($# > 0)); then
  printf '%s\n' "$@" > "$tmp/files.txt"
else
  ls "$ROOT"/data/cache/npm/datasets-sotu-*/package/data/*.txt \
     "$ROOT"/data/cache/npm/datasets-moby-dick-*/package/data/*.txt > "$tmp/files.txt" 2>/dev/null ||
    { echo "bench_tokenizer: no corpus; run data/prepare.sh quickstart or pass FILE..." >&2; exit 1; }
fi
mb=$(xargs -d '\n' stat -c %s < "$tmp/files.txt" | awk '{ s += $1 } END { printf "%.1f", s / 1e6 }')
cores=$(nproc)
echo "corpus: $(wc -l < "$tmp/files.txt") files, $mb MB; $cores cores"

# best_rates TOKENIZER THREADS: "wall-MB/s cpu-MB/s", the best of three runs.
best_rates() {
  local best_wall=0 best_cpu=0 line wall cpu
  for _ in 1 2 3; do
    line=$("$BIN" tokenize --tokenizer "$1" --vocab "$VOCAB" --files-from "$tmp/files.txt" \
             --out "$tmp/out" --val-fraction 0 --threads "$2" 2>/dev/null | grep ' MB/s with ')
    wall=$(sed -n 's/.* = \([0-9.]*\) MB\/s.*/\1/p' <<< "$line")
    cpu=$(sed -n 's/.*(\([0-9.]*\) MB per CPU-second).*/\1/p' <<< "$line")
    best_wall=$(awk -v a="$best_wall" -v b="$wall" 'BEGIN { print (b > a ? b : a) }')
    best_cpu=$(awk -v a="$best_cpu" -v b="$cpu" 'BEGIN { print (b > a ? b : a) }')
  done
  echo "$best_wall $best_cpu"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %8s %10s %16s %18s\n' tokenizer threads "MB/s" "MB/s per thread" "MB per CPU-second"
for tok in gpt2 bytes; do
  [[ $tok == gpt2 && ! -f "$VOCAB/encoder.json" ]] && { echo "gpt2: skipped (no $VOCAB)"; continue; }
  for threads in 1 "$cores"; do
    read -r wall cpu <<< "$(best_rates "$tok" "$threads")"
    printf '%-10s %8d %10.1f %16.1f %18.1f\n' "$tok" "$threads" "$wall" \
      "$(awk -v r="$wall" -v t="$threads" 'BEGIN { print r / t }')" "$cpu"
  done
done
