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
import math
import os
import sys

import run_csv


def incomplete_beta(a, b, x):
    """The regularised incomplete beta function I_x(a, b), from its continued fraction
    (modified Lentz), which converges fast for x < (a + 1) / (a + b + 2); above that,
    the symmetry I_x(a, b) = 1 - I_{1-x}(b, a)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1 - incomplete_beta(b, a, 1 - x)
    tiny = 1e-300
    # 1 + d1/(1 + d2/(1 + ...)): d(2m) = m(b-m)x / ((a+2m-1)(a+2m)),
    # d(2m+1) = -(a+m)(a+b+m)x / ((a+2m)(a+2m+1)).
    f, c, d = 1.0, 1.0, 0.0
    for i in range(1, 10001):
        m = i // 2
        if i % 2 == 0:
            coef = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            coef = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1 + coef * d
        c = 1 + coef / c
        d = 1 / (tiny if abs(d) < tiny else d)
        if abs(c) < tiny:
            c = tiny
        f *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    return math.exp(log_front) / (a * f)


def t975(df):
    """The 97.5% quantile of Student's t with df >= 1 degrees of freedom, computed as
    `qattn sweep` computes it (student_t_975 in src/train/sweep.cpp), so that both print
    the same intervals at every df; a table interpolated beyond its last row would not.
    P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2) falls as t grows: bisect it onto 0.05."""
    if df < 1:
        raise ValueError(f"t975: df {df} is not allowed; allowed: >= 1")
    def two_sided_tail(t):
        return incomplete_beta(0.5 * df, 0.5, df / (df + t * t))
    lo, hi = 0.0, 1.0
    while two_sided_tail(hi) > 0.05:
        hi *= 2
    for _ in range(100):
        if hi - lo <= 1e-13:
            break
        mid = 0.5 * (lo + hi)
        if two_sided_tail(mid) > 0.05:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def val_by_step(run_dir):
    """{step: (tokens, val loss)} of a run's evaluations, and the tokens where it diverged (or None)."""
    vals, diverged = {}, None
    path = os.path.join(run_dir, "metrics.csv")
    for line, row in run_csv.read_rows(path, run_csv.METRICS_COLUMNS):
        tokens = run_csv.number(path, line, row, "tokens", int)
        val = run_csv.number(path, line, row, "val_loss", empty_ok=True)
        if row["event"].startswith("diverged"):
            diverged = tokens
        elif val is not None:
            vals[run_csv.number(path, line, row, "step", int)] = (tokens, val)
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
    runs = {}
    try:
        for _, r in run_csv.read_rows(summary, run_csv.SUMMARY_COLUMNS):
            d = os.path.join(a.sweep_dir, r["id"])
            if r["status"] in ("finished", "diverged") and os.path.isfile(os.path.join(d, "metrics.csv")):
                runs[r["id"]] = (r, *val_by_step(d))
    except run_csv.CsvError as e:
        sys.exit(f"gap_table.py: {e}")
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
