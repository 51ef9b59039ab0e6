#!/usr/bin/env python3
"""The attention diagnostics of a sweep as markdown (SageBwd's Table 2;
docs/attention-maths.md §7).

    tools/diag_table.py SWEEP_DIR [--step N]

For every run of the sweep (summary.csv) with a diag.csv, shown by its cell's
label and its seed: per layer at the last
diagnostics step (or at step N), its attention kind, σ_Q and σ_K (RMS of q and
k), max |S|, and for the quantised kinds the cosine similarity to FPA on the
same inputs of O, P, dS, dQ, dK and dV, the quantity with the lowest cosine
named: which one carries the error. A first table gives each run's worst layer,
a short overview.
"""
import argparse
import os
import sys

import run_csv

QUANTITIES = ("o", "p", "ds", "dq", "dk", "dv")


def read_diag(path, step):
    """The step shown (step, or the file's last) and diag.csv's rows at it, each
    with its numbers read: q_rms, k_rms, max_abs_score as floats and "cos" the
    cosines by quantity (None for a layer not compared to FPA)."""
    rows = run_csv.read_rows(path, run_csv.DIAG_COLUMNS + tuple("cos_" + q for q in QUANTITIES))
    if not rows:
        return None, []
    steps = [run_csv.number(path, line, r, "step", int) for line, r in rows]
    at = step if step is not None else max(steps)
    out = []
    for s, (line, r) in zip(steps, rows):
        if s != at:
            continue
        read = {c: run_csv.number(path, line, r, c) for c in ("q_rms", "k_rms", "max_abs_score")}
        compared = run_csv.number(path, line, r, "cos_o", empty_ok=True) is not None  # then every cosine is there
        cos = {q: run_csv.number(path, line, r, "cos_" + q) for q in QUANTITIES} if compared else None
        out.append({**r, **read, "cos": cos})
    return at, out


def cosines(row):
    return row["cos"]


def worst(c):
    return min(QUANTITIES, key=lambda q: c[q])


def seed_of(row):
    return row.get("train.seed", "")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--step", type=int, help="diagnostics step (default: each run's last)")
    a = p.parse_args()
    summary = os.path.join(a.sweep_dir, "summary.csv")
    if not os.path.exists(summary):
        sys.exit(f"diag_table.py: {summary} is missing (run qattn sweep SWEEP --summary)")
    try:
        runs = [r for _, r in run_csv.read_rows(summary, run_csv.SUMMARY_COLUMNS)
                if os.path.exists(os.path.join(a.sweep_dir, r["id"], "diag.csv"))]
        diags = [(r, *read_diag(os.path.join(a.sweep_dir, r["id"], "diag.csv"), a.step)) for r in runs]
    except run_csv.CsvError as e:
        sys.exit(f"diag_table.py: {e}")
    if a.step is not None and not any(rows for _, _, rows in diags):
        sys.exit(f"diag_table.py: --step {a.step}: no run of {summary} has diagnostics at that step")
    name = os.path.basename(os.path.normpath(a.sweep_dir))
    print(f"# Attention diagnostics: {name}\n")
    print("Per layer on the fixed probe batch (the first validation batch), against FPA on the same")
    print("inputs (attention-maths.md §7; SageBwd's Table 2). σ_Q, σ_K: RMS of q and k;")
    print("cos: cosine similarity.\n")
    tables = []
    print("| cell | seed | status | step | worst layer | σ_Q | σ_K | max \\|S\\| | cos O | cos P | cos dS | cos dQ | cos dK "
          "| cos dV | lowest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r, at, rows in diags:
        if not rows:
            continue
        tables.append((r, at, rows))
        compared = [(row, cosines(row)) for row in rows if cosines(row)]
        if compared:
            row, c = min(compared, key=lambda rc: min(rc[1].values()))
            cells = [f"{c[q]:.5f}" for q in QUANTITIES] + [worst(c)]
        else:
            row = max(rows, key=lambda x: x["max_abs_score"])
            cells = [""] * 6 + ["(exact kind)"]
        print(f"| {run_csv.md_cell(run_csv.label(r))} | {seed_of(r)} | {r['status']} | {at} | {row['layer']} | "
              f"{row['q_rms']:.3f} | {row['k_rms']:.3f} | {row['max_abs_score']:.2f} | " + " | ".join(cells) + " |")
    for r, at, rows in tables:
        seed = f", seed {seed_of(r)}" if seed_of(r) else ""
        print(f"\n## {run_csv.label(r)}{seed} (step {at})\n")
        print("| layer | kind | σ_Q | σ_K | max \\|S\\| | cos O | cos P | cos dS | cos dQ | cos dK | cos dV | lowest |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            c = cosines(row)
            cells = [f"{c[q]:.5f}" for q in QUANTITIES] + [worst(c)] if c else [""] * 7
            print(f"| {row['layer']} | {row.get('kind', '')} | {row['q_rms']:.3f} | {row['k_rms']:.3f} | "
                  f"{row['max_abs_score']:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
