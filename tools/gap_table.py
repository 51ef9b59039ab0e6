#!/usr/bin/env python3
"""The paired gap to the baseline against tokens, per cell of a sweep, as markdown.

    tools/gap_table.py SWEEP_DIR [--every STEPS]

For every cell with a baseline (summary.csv of `qattn sweep`), at every
evaluation step that is a multiple of --every (default: 8 columns over the
run) and at the last one: the mean over seeds of (val loss of the run - val
loss of the baseline with the same seed, at the same step), in nats, with its
95% Student-t interval when two or more seeds reached that step. These are
evaluations inside each run, so a curve is one schedule read at several
times (docs/reproducing.md, rule 4). A run that diverged is listed with the
tokens at which it diverged. A cell whose interval excludes 0 at a step is
marked * there.
"""
import argparse
import csv
import math
import os
import sys

# 97.5% quantiles of Student's t, df 1..30 (printed tables), then the normal's.
T975 = [12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
        2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
        2.0518, 2.0484, 2.0452, 2.0423]


def t975(df):
    return T975[df - 1] if df <= len(T975) else 1.96


def val_by_step(run_dir):
    """{step: (tokens, val loss)} of a run's evaluations, and the tokens where it diverged (or None)."""
    vals, diverged = {}, None
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        for row in csv.DictReader(f):
            if (row.get("event") or "").startswith("diverged"):
                diverged = int(float(row["tokens"] or 0))
            elif row.get("val_loss"):
                vals[int(row["step"])] = (int(float(row["tokens"])), float(row["val_loss"]))
    return vals, diverged


def mean_ci(xs):
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)


def cell(xs):
    if not xs:
        return ""
    mean, half = mean_ci(xs)
    if half is None:
        return f"{mean:+.3f} (n=1)"
    star = "*" if abs(mean) > half else ""
    return f"{mean:+.3f} ± {half:.3f}{star}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--every", type=int, default=0, help="steps between columns (default: 8 columns)")
    a = p.parse_args()
    summary = os.path.join(a.sweep_dir, "summary.csv")
    if not os.path.isfile(summary):
        sys.exit(f"gap_table.py: {summary}: no such file; run `qattn sweep SWEEP.json --summary` first")
    if a.every < 0:
        sys.exit(f"gap_table.py: --every {a.every}: allowed: a step count >= 1, or 0 for 8 columns")
    with open(summary, newline="") as f:
        rows = list(csv.DictReader(f))
    runs = {}
    for r in rows:
        d = os.path.join(a.sweep_dir, r["id"])
        if r["status"] in ("finished", "diverged") and os.path.isfile(os.path.join(d, "metrics.csv")):
            runs[r["id"]] = (r, *val_by_step(d))
    baselines = {(r["setting"], r.get("train.seed", "")): rid for rid, (r, _, _) in runs.items()
                 if r["baseline"] == "(baseline)"}
    cells = {}
    for rid, (r, vals, diverged) in runs.items():
        if r["baseline"] and r["baseline"] != "(baseline)":
            cells.setdefault(r["setting"], []).append((r, vals, diverged))
    if not cells:
        sys.exit(f"gap_table.py: {summary}: no finished run with a finished baseline")
    last = max(max(v) for _, v, _ in runs.values() if v)
    every = a.every or max(1, last // 8)
    steps = sorted({s for _, v, _ in runs.values() for s in v if s > 0 and (s % every == 0 or s == last)})
    tokens = {}
    for _, v, _ in runs.values():
        for s, (t, _) in v.items():
            tokens.setdefault(s, t)
    print("| cell | seeds | diverged at (tokens) | " + " | ".join(f"{tokens[s] / 1e6:.0f}M" for s in steps) + " |")
    print("|---|---|---|" + "---|" * len(steps))
    for setting, members in cells.items():
        gaps = {s: [] for s in steps}
        for r, vals, _ in members:
            base = runs.get(baselines.get((r["baseline"], r.get("train.seed", ""))), (None, {}, None))[1]
            for s in steps:
                if s in vals and s in base:
                    gaps[s].append(vals[s][1] - base[s][1])
        div = ", ".join(f"{d / 1e6:.1f}M (seed {r.get('train.seed', '')})" for r, _, d in members if d is not None)
        print(f"| {setting} | {len(members)} | {div} | " + " | ".join(cell(gaps[s]) for s in steps) + " |")


if __name__ == "__main__":
    main()
