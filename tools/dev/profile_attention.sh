#!/usr/bin/env bash
# Where one attention forward + backward spends its time, per kernel, on the GPU
# machine: Nsight Compute profiles every kernel of one `qattn bench attention`
# run (no warm-up, one timed run, no CPU check) and prints, per kernel, its
# time, how often it issues, how busy the tensor and conversion (xu) pipes are,
# and its largest stall reasons (cycles per issued instruction). Binaries as in
# device_integration.sh (built on the workstation, carried with .deps/).
#   usage (device): BUILD=carry-gpu OUT=/tmp/out tools/dev/profile_attention.sh \
#                     --kind sage --shape 4,16,4096,128 [more bench arguments]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # the repository root, $OUT, $BUILD, .deps/ libraries
stalls="long_scoreboard short_scoreboard barrier wait gmma math_pipe_throttle mio_throttle lg_throttle \
dispatch_stall no_instruction not_selected selected branch_resolving sleeping membar"
metrics="gpu__time_duration.sum,sm__inst_issued.avg.pct_of_peak_sustained_active"
metrics+=",sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
metrics+=",sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"
metrics+=",sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"
metrics+=",sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread"
metrics+=",l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
for s in $stalls; do metrics+=",smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
csv="$OUT/profile_attention_$(date +%H%M%S).csv"
timeout 500 ncu --clock-control none --csv --print-units base --metrics "$metrics" \
  "$BUILD/qattn" bench attention --warmup 0 --reps 1 --no-check "$@" > "$csv" 2> "$csv.err" ||
  { echo "ncu failed: $(tail -n 5 "$csv.err")"; exit 1; }
python3 - "$csv" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
col = {name: head.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
kernels = collections.OrderedDict()
for r in rows:
    key = (r[col["ID"]], r[col["Kernel Name"]].split("(")[0].split("<")[0][-40:])
    kernels.setdefault(key, {})[r[col["Metric Name"]]] = r[col["Metric Value"]].replace(",", "")
def short(m):
    return m.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")
for (kid, name), m in kernels.items():
    f = lambda k: float(m.get(k, "nan"))
    stalls = sorted(((f(k), short(k)) for k in m if "issue_stalled" in k), reverse=True)[:5]
    print(f"{kid:>3} {name:40s} {f('gpu__time_duration.sum') / 1000:9.1f} us  issue {f('sm__inst_issued.avg.pct_of_peak_sustained_active'):4.0f}%"
          f"  tensor {f('sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'):4.0f}%"
          f"  xu {f('sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active'):4.0f}%"
          f"  alu {f('sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active'):4.0f}%"
          f"  fma {f('sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active'):4.0f}%"
          f"  warps {f('sm__warps_active.avg.pct_of_peak_sustained_active'):4.0f}%"
          f"  regs {m.get('launch__registers_per_thread', '?')}"
          f"  bank conflicts {m.get('l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum', '?')}")
    print("      stalls per issue: " + ", ".join(f"{n} {v:.2f}" for v, n in stalls))
PY
