#!/usr/bin/env bash
# One attention kernel per SASS instruction, on the GPU machine: Nsight Compute
# samples the warps of the first launch whose name matches KERNEL (a regex) in
# one `qattn bench attention` run (no warm-up, one timed run, no CPU check),
# with the SourceCounters and WarpStateStats sections; the source page goes to
# $OUT/sass_<name>.csv.gz and tools/dev/sass_ledger.py prints its ledger (stall
# reasons, opcodes per loop step, the instructions that hold the samples).
# Binaries as in device_integration.sh (built on the workstation, carried with .deps/).
#   usage (device): BUILD=carry-gpu OUT=/tmp/out tools/dev/profile_source.sh sage_dkdv_sm90 \
#                     --kind sage --shape 4,16,4096,128 [more bench arguments]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
[ $# -ge 1 ] || { echo "usage: $0 KERNEL_REGEX [bench arguments]" >&2; exit 2; }
kernel=$1
shift
name=$(echo "$kernel" | tr -c 'A-Za-z0-9_\n' '_')
report=$(mktemp -d)/source
timeout 300 ncu --kernel-name "regex:$kernel" --launch-count 1 --section SourceCounters --section WarpStateStats \
  -o "$report" "$BUILD/qattn" bench attention --warmup 0 --reps 1 --no-check "$@" > "$OUT/ncu_$name.log" 2>&1 ||
  { echo "ncu failed: $(tail -n 5 "$OUT/ncu_$name.log")"; exit 1; }
ncu -i "$report.ncu-rep" --page source --csv --print-source sass | gzip > "$OUT/sass_$name.csv.gz" ||
  { echo "ncu could not export the source page of $report.ncu-rep"; exit 1; }
rm -f "$report.ncu-rep"
python3 tools/dev/sass_ledger.py "$OUT/sass_$name.csv.gz" --top 30
