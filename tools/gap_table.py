#!/usr/bin/env python3
"""The paired gap to the baseline against tokens, per cell of a sweep, as markdown.

    tools/gap_table.py SWEEP_DIR [--every STEPS] [--pair CELL_A CELL_B]

For every cell with a baseline (summary.csv of `qattn sweep`; a cell is
shown by its label), at every
evaluation step that is a multiple of --every (default: 8 columns over the
run) and at the last one: the mean over seeds of (val loss of the run - val
loss of the baseline with the same seed, at the same step), in nats, with its
95% Student-t interval when two or more seeds reached that step. These are
evaluations inside each run, so a curve is one schedule read at several
times (docs/reproducing.md, rule 4). A run that diverged is listed with the
tokens at which it diverged. A cell whose interval excludes 0 at a step is
marked * there.

With --pair, one row instead: cell A minus cell B, paired by seed (two cells
of the grid, neither of them necessarily a baseline; e.g. SageBwd's fp8 sage
against int8 sage), and the final gap from summary.csv's final_val_loss as
summary.md gives it: mean ± std, 95% interval (* where it excludes 0), n. A
cell is named by its label or its setting in summary.csv, or by
key=value[,key=value...] over the sweep's varied keys (summary.csv's columns
between setting and status) that exactly one setting matches; anything else
is an error listing the candidates. Seeds with a run in one cell only are skipped and named.
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


def mean_sd(xs):
    """The mean of xs and their sample standard deviation (None below two values)."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))


def mean_ci(xs):
    """The mean of xs and the half-width of its 95% Student-t interval (None below two values)."""
    mean, sd = mean_sd(xs)
    return mean, None if sd is None else t975(len(xs) - 1) * sd / math.sqrt(len(xs))


def cell(xs):
    if not xs:
        return ""
    mean, half = mean_ci(xs)
    if half is None:
        return f"{mean:+.3f} (n=1)"
    star = "*" if abs(mean) > half else ""
    return f"{mean:+.3f} ± {half:.3f}{star}"


def final_cells(xs):
    """The final gap's columns as summary.md prints them: mean ± std, 95% interval
    (* where it excludes 0), n."""
    if not xs:
        return ["", "", "0"]
    mean, sd = mean_sd(xs)
    if sd is None:
        return [f"{mean:+.4f}", "", "1"]
    half = mean_ci(xs)[1]
    star = "*" if abs(mean) > half else ""
    return [f"{mean:+.4f} ± {sd:.4f}", f"[{mean - half:+.4f}, {mean + half:+.4f}]{star}", str(len(xs))]


class SelectError(ValueError):
    """A --pair argument that names no setting of summary.csv, or more than one."""


def split_filter(text):
    """key=value parts of text, split at the commas outside braces, brackets and
    quotes, so that a value such as {"form":"gain","lr_mult":10} stays whole."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted
        elif not quoted and c in "{[":
            depth += 1
        elif not quoted and c in "}]":
            depth -= 1
        elif not quoted and depth == 0 and c == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def find_setting(rows, text, what):
    """The one setting of summary.csv's rows that text names: a label or a
    setting exactly, or key=value[,key=value...] over the columns `qattn sweep`
    writes between setting and status (the sweep's varied keys), each value as
    summary.csv writes it. Raises SelectError naming text and the candidates
    (by their labels) otherwise."""
    first = {}
    for r in rows:
        first.setdefault(r["setting"], r)
    if text in first:
        return text
    by_label = {run_csv.label(r): s for s, r in first.items()}
    if text in by_label:
        return by_label[text]
    header = list(rows[0])
    keys = [k for k in header[header.index("setting") + 1:header.index("status")] if k != "train.seed"]
    pairs = []
    for part in split_filter(text):
        key, eq, value = part.partition("=")
        if key == "train.seed":
            raise SelectError(f"{what} '{text}': train.seed is not allowed; runs are paired by seed; "
                              f"allowed keys: {', '.join(keys)}")
        if not eq or key not in keys:
            raise SelectError(f"{what} '{text}': '{part}' is not allowed; allowed: a label or setting of summary.csv, "
                              f"or key=value[,key=value...] with keys from {', '.join(keys)}")
        pairs.append((key, value))
    equal = {s: sum(r[k] == v for k, v in pairs) for s, r in first.items()}
    matches = [s for s in first if equal[s] == len(pairs)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        best = max(equal.values())
        nearest = {}
        for s, r in first.items():
            if equal[s] == best:
                shown = ",".join(f"{k}={r[k]}" for k, _ in pairs)
                nearest[shown] = nearest.get(shown, 0) + 1
        raise SelectError(f"{what} '{text}' matches no setting of summary.csv; the nearest ({best} of {len(pairs)} "
                          "keys equal): " + "; ".join(f"{shown} ({n} setting{'s' if n > 1 else ''})"
                                                      for shown, n in nearest.items()))
    differing = [k for k in keys if len({first[s][k] for s in matches}) > 1]
    raise SelectError(f"{what} '{text}' matches {len(matches)} settings; name one, or add keys that tell them apart: "
                      + "; ".join(f"{run_csv.label(first[s])} ({', '.join(f'{k}={first[s][k]}' for k in differing)})"
                                  for s in matches))


def load_runs(sweep_dir, rows):
    """{id: (line, row, vals, diverged)} of the rows whose run finished or diverged and has its metrics.csv."""
    runs = {}
    for line, r in rows:
        d = os.path.join(sweep_dir, r["id"])
        if r["status"] in ("finished", "diverged") and os.path.isfile(os.path.join(d, "metrics.csv")):
            runs[r["id"]] = (line, r, *val_by_step(d))
    return runs


def print_table(runs, every, rows):
    """The markdown table: a column per evaluation step of runs that is a multiple
    of every (0: 8 columns) or the last; rows are (label, seeds, diverged, {step: [gap]},
    extra cells), and a row with extra cells gets the final gap's columns."""
    last = max((max(v) for _, _, v, _ in runs.values() if v), default=0)
    every = every or max(1, last // 8)
    steps = sorted({s for _, _, v, _ in runs.values() for s in v if s > 0 and (s % every == 0 or s == last)})
    tokens = {}
    for _, _, v, _ in runs.values():
        for s, (t, _) in v.items():
            tokens.setdefault(s, t)
    final = any(extra for *_, extra in rows)
    print("| cell | seeds | diverged at (tokens) | " + " | ".join(f"{tokens[s] / 1e6:.0f}M" for s in steps) + " |"
          + (" final gap (mean ± std) | 95% CI | n |" if final else ""))
    print("|---|---|---|" + "---|" * (len(steps) + 3 * final))
    for label, seeds, diverged, gaps, extra in rows:
        print(f"| {label} | {seeds} | {diverged} | " + " | ".join(cell(gaps.get(s, [])) for s in steps) + " |"
              + "".join(f" {c} |" for c in extra))


def gap(a, b, steps):
    """{step: [val loss of a - val loss of b]} at the steps both evaluated."""
    return {s: [a[s][1] - b[s][1]] for s in steps if s in a and s in b}


def baseline_rows(runs):
    """A row per cell with a baseline: its gap to the baseline of the same seed."""
    baselines = {(r["setting"], r.get("train.seed", "")): rid for rid, (_, r, _, _) in runs.items()
                 if r["baseline"] == "(baseline)"}
    cells = {}
    for _, r, vals, diverged in runs.values():
        if r["baseline"] and r["baseline"] != "(baseline)":
            cells.setdefault(r["setting"], []).append((r, vals, diverged))
    out = []
    for members in cells.values():
        gaps = {}
        for r, vals, _ in members:
            base = runs.get(baselines.get((r["baseline"], r.get("train.seed", ""))), (None, None, {}, None))[2]
            for s, g in gap(vals, base, vals).items():
                gaps.setdefault(s, []).extend(g)
        div = ", ".join(f"{d / 1e6:.1f}M (seed {r.get('train.seed', '')})" for r, _, d in members if d is not None)
        out.append((run_csv.md_cell(run_csv.label(members[0][0])), len(members), div, gaps, []))
    return out


def seed_order(seed):
    return (0, int(seed), "") if seed.isdigit() else (1, 0, seed)


def pair_rows(summary, runs, a, b, labels):
    """The row of A - B paired by seed (settings a and b, shown by labels[a] and
    labels[b]), and a note naming the seeds only one of them has."""
    by_seed = {a: {}, b: {}}
    for line, r, vals, diverged in runs.values():
        if r["setting"] in by_seed:
            by_seed[r["setting"]][r.get("train.seed", "")] = (line, r, vals, diverged)
    common = sorted(set(by_seed[a]) & set(by_seed[b]), key=seed_order)
    if not common:
        seeds = {s: ", ".join(sorted(by_seed[s], key=seed_order)) or "none" for s in (a, b)}
        sys.exit(f"gap_table.py: --pair: no seed has a finished or diverged run in both cells "
                 f"(A {labels[a]}: seeds {seeds[a]}; B {labels[b]}: seeds {seeds[b]})")
    gaps, finals, div = {}, [], []
    for seed in common:
        (la, ra, va, da), (lb, rb, vb, db) = by_seed[a][seed], by_seed[b][seed]
        for s, g in gap(va, vb, va).items():
            gaps.setdefault(s, []).extend(g)
        if ra["status"] == rb["status"] == "finished":
            finals.append(run_csv.number(summary, la, ra, "final_val_loss")
                          - run_csv.number(summary, lb, rb, "final_val_loss"))
        div += [f"{d / 1e6:.1f}M ({name}, seed {seed})" for name, d in (("A", da), ("B", db)) if d is not None]
    only = [f"{seed} (A only)" for seed in sorted(set(by_seed[a]) - set(common), key=seed_order)]
    only += [f"{seed} (B only)" for seed in sorted(set(by_seed[b]) - set(common), key=seed_order)]
    pair_runs = {rid: run for seed in common for rid, run in ((by_seed[a][seed][1]["id"], by_seed[a][seed]),
                                                            (by_seed[b][seed][1]["id"], by_seed[b][seed]))}
    return pair_runs, [("A − B", len(common), ", ".join(div), gaps, final_cells(finals))], only


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--every", type=int, default=0, help="steps between columns (default: 8 columns)")
    p.add_argument("--pair", nargs=2, metavar=("CELL_A", "CELL_B"),
                   help="the gap of cell A to cell B, paired by seed, instead of each cell's gap to its baseline; "
                        "a cell is a label or setting of summary.csv or key=value[,key=value...] over its columns")
    a = p.parse_args()
    summary = os.path.join(a.sweep_dir, "summary.csv")
    if not os.path.isfile(summary):
        sys.exit(f"gap_table.py: {summary}: no such file; run `qattn sweep SWEEP.json --summary` first")
    if a.every < 0:
        sys.exit(f"gap_table.py: --every {a.every}: allowed: a step count >= 1, or 0 for 8 columns")
    try:
        rows = run_csv.read_rows(summary, run_csv.SUMMARY_COLUMNS + (("final_val_loss",) if a.pair else ()))
        if a.pair:
            if not rows:
                sys.exit(f"gap_table.py: {summary}: no runs")
            labels = {r["setting"]: run_csv.label(r) for _, r in rows}
            cells = [find_setting([r for _, r in rows], text, f"--pair {name}") for text, name in zip(a.pair, "AB")]
            if cells[0] == cells[1]:
                sys.exit(f"gap_table.py: --pair '{a.pair[0]}' '{a.pair[1]}': both name the cell {labels[cells[0]]}; "
                         "allowed: two different cells")
            runs = load_runs(a.sweep_dir, [(line, r) for line, r in rows if r["setting"] in cells])
            runs, table, only = pair_rows(summary, runs, *cells, labels)
        else:
            runs = load_runs(a.sweep_dir, rows)
            table, only = baseline_rows(runs), []
    except (run_csv.CsvError, SelectError) as e:
        sys.exit(f"gap_table.py: {e}")
    if not table:
        sys.exit(f"gap_table.py: {summary}: no finished run with a finished baseline")
    if a.pair:
        print("Paired gap A − B by seed, in nats.\n")
        for name, setting, text in zip("AB", cells, a.pair):
            print(f"- {name}: {labels[setting]} (`{text}`)")
        print()
    print_table(runs, a.every, table)
    if only:
        print(f"\nSkipped, a finished or diverged run in one cell only: seed {', '.join(only)}.")


if __name__ == "__main__":
    main()
