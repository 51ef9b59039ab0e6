#!/usr/bin/env python3
"""The attention diagnostics of a sweep as markdown (SageBwd's Table 2;
docs/attention-maths.md §7).

    tools/diag_table.py SWEEP_DIR [--step N]

For every run of the sweep (summary.csv) with a diag.csv: per layer at the last
diagnostics step (or at step N), its attention kind, σ_Q and σ_K (RMS of q and
k), max |S|, and for the quantised kinds the cosine similarity to FPA on the
same inputs of O, P, dS, dQ, dK and dV, the quantity with the lowest cosine
named: which one carries the error. A first table gives each run's worst layer,
a short overview.
"""
import argparse
import csv
import os
import sys

QUANTITIES = ("o", "p", "ds", "dq", "dk", "dv")


def read_diag(path, step):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None, []
    steps = sorted({int(r["step"]) for r in rows})
    at = step if step is not None else steps[-1]
    return at, [r for r in rows if int(r["step"]) == at]


def cosines(row):
    if not row.get("cos_o"):
        return None
    return {q: float(row["cos_" + q]) for q in QUANTITIES}


def worst(c):
    return min(QUANTITIES, key=lambda q: c[q])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--step", type=int, help="diagnostics step (default: each run's last)")
    a = p.parse_args()
    summary = os.path.join(a.sweep_dir, "summary.csv")
    if not os.path.exists(summary):
        sys.exit(f"diag_table.py: {summary} is missing (run qattn sweep SWEEP --summary)")
    with open(summary, newline="") as f:
        runs = [r for r in csv.DictReader(f) if os.path.exists(os.path.join(a.sweep_dir, r["id"], "diag.csv"))]
    name = os.path.basename(os.path.normpath(a.sweep_dir))
    print(f"# Attention diagnostics: {name}\n")
    print("Per layer on the fixed probe batch (the first validation batch), against FPA on the same")
    print("inputs (attention-maths.md §7; SageBwd's Table 2). σ_Q, σ_K: RMS of q and k;")
    print("cos: cosine similarity.\n")
    tables = []
    print("| run | status | step | worst layer | σ_Q | σ_K | max \\|S\\| | cos O | cos P | cos dS | cos dQ | cos dK | cos dV | lowest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        at, rows = read_diag(os.path.join(a.sweep_dir, r["id"], "diag.csv"), a.step)
        if not rows:
            continue
        tables.append((r, at, rows))
        compared = [(row, cosines(row)) for row in rows if cosines(row)]
        if compared:
            row, c = min(compared, key=lambda rc: min(rc[1].values()))
            cells = [f"{c[q]:.5f}" for q in QUANTITIES] + [worst(c)]
        else:
            row = max(rows, key=lambda x: float(x["max_abs_score"]))
            cells = [""] * 6 + ["(exact kind)"]
        print(f"| {r['id']} | {r['status']} | {at} | {row['layer']} | {float(row['q_rms']):.3f} | "
              f"{float(row['k_rms']):.3f} | {float(row['max_abs_score']):.2f} | " + " | ".join(cells) + " |")
    for r, at, rows in tables:
        print(f"\n## {r['id']} (step {at})\n")
        print("| layer | kind | σ_Q | σ_K | max \\|S\\| | cos O | cos P | cos dS | cos dQ | cos dK | cos dV | lowest |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            c = cosines(row)
            cells = [f"{c[q]:.5f}" for q in QUANTITIES] + [worst(c)] if c else [""] * 7
            print(f"| {row['layer']} | {row.get('kind', '')} | {float(row['q_rms']):.3f} | {float(row['k_rms']):.3f} | "
                  f"{float(row['max_abs_score']):.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
