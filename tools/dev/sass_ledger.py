#!/usr/bin/env python3
"""Where one kernel's warps spend their time, per SASS instruction: reads the
source page that Nsight Compute exports with the SourceCounters section
(tools/dev/profile_source.sh writes it, gzip or plain CSV) and prints
  - the warp-state samples by stall reason (all warps: an idle producer warp's
    waits count as much as a consumer's),
  - the executed instructions by opcode, per step of the kernel's main loop
    (`--per N`: the executed count of one per-step instruction, e.g. the
    loop's mbarrier wait; default the count that covers the most executions,
    the loop body's), with their samples,
  - the instructions that hold the most samples, with their top stall reasons.
usage: tools/dev/sass_ledger.py sass_dkdv.csv.gz [--top 40] [--per N]"""
import argparse, collections, csv, gzip, re

ap = argparse.ArgumentParser()
ap.add_argument("page")
ap.add_argument("--top", type=int, default=40)
ap.add_argument("--per", type=int, default=0)
a = ap.parse_args()
opener = gzip.open if a.page.endswith(".gz") else open
with opener(a.page, "rt") as f:
    rows = list(csv.reader(f))
head_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
head, data = rows[head_at], [r for r in rows[head_at + 1:] if len(rows[head_at]) <= len(r)]
col = {c: i for i, c in enumerate(head)}
stalls = [c for c in head if c.startswith("stall_") and "Not Issued" not in c]
num = lambda r, c: int(r[col[c]] or 0)

def opcode(src):
    return re.sub(r"^@!?U?P\w+\s+", "", src.strip()).split(" ")[0].split(".")[0]

samples = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
print(f"{rows[0][1] if len(rows[0]) > 1 else a.page}\n{samples} warp samples")
reasons = collections.Counter()
for r in data:
    for c in stalls: reasons[c] += num(r, c)
for c, v in reasons.most_common():
    if v: print(f"  {c[6:]:18s} {v:8d} {100 * v / samples:5.1f}%")

execs = collections.Counter(num(r, "Instructions Executed") for r in data if num(r, "Instructions Executed"))
per = a.per or max(execs, key=lambda c: c * execs[c])  # the count that covers the most executions
ops, op_samples = collections.Counter(), collections.Counter()
for r in data:
    o = opcode(r[col["Source"]])
    ops[o] += num(r, "Instructions Executed")
    op_samples[o] += num(r, "Warp Stall Sampling (All Samples)")
total = sum(ops.values())
print(f"{total} warp instructions executed, {total / per:.0f} per step (steps: {per} warp-steps)")
for o, v in ops.most_common(25):
    print(f"  {o:12s} {v / per:7.1f} per step {100 * v / total:5.1f}%   samples {100 * op_samples[o] / samples:5.1f}%")

print("instructions holding the most samples (index, samples, executed / step, SASS, top stalls):")
top = sorted(range(len(data)), key=lambda i: -num(data[i], "Warp Stall Sampling (All Samples)"))[: a.top]
for i in sorted(top):
    r = data[i]
    why = sorted(((num(r, c), c[6:]) for c in stalls), reverse=True)[:3]
    print(f"{i:5d} {num(r, 'Warp Stall Sampling (All Samples)'):6d} {num(r, 'Instructions Executed') / per:5.2f}  "
          f"{r[col['Source']].strip()[:64]:64s} " + ", ".join(f"{n} {v}" for v, n in why if v))
