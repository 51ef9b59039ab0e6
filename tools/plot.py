#!/usr/bin/python3
"""Loss curves and attention diagnostics of qattn runs and sweeps.

    tools/plot.py RUN_OR_SWEEP_DIR [--out PNG] [--smooth N] [--panel-by KEY|none]

RUN_OR_SWEEP_DIR is one run directory (with metrics.csv), a sweep directory
(with summary.csv, from `qattn sweep`), or a folder of run directories.
A sweep's settings are named by their labels (summary.csv's label column).

Figure 1 (--out, default <dir>/loss.png): train and val loss against tokens,
one line per setting; the runs of a setting that differ only in seed are
averaged, their spread (min..max) drawn as a band; a diverged run ends in an x.
The y axes show the last 80% of the tokens, where the settings separate; the
early losses above them are clipped, and a note on the axis says how many
points and up to which loss.
Figure 2 (<out stem>_gap.png, sweeps with baselines only): val loss minus the
baseline's val loss (same seed, same tokens) per setting, in nats.
Figure 3 (<out stem>_diag.png, when a run has diag.csv rows at two steps or
more): the attention diagnostics against tokens (docs/attention-maths.md §7):
(a) the largest max|S| over layers, log scale; (b), (c) the lowest cosine to
FPA of dQ and of dK over the quantised layers (exact-attention runs have none);
(d), sweeps with baselines only: each run's last paired val-loss gap against
its last worst-layer max|S|, one point per run: do the runs that trail have
growing scores. Runs with diagnostics at one step only are left out of it.
Panels: each figure draws a sweep's settings in one panel per value of
--panel-by KEY (a varied key of the sweep; default train.tokens_per_step where
the sweep varies it, so that each arm is read against its own baseline; none:
one panel), each with its own legend. A setting has one colour in every figure.

Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import argparse
import math
import os
import sys
from collections import OrderedDict

import run_csv

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py: matplotlib is missing; install Debian's python3-matplotlib and run with /usr/bin/python3")


class DiagPoint:
    """One diagnostics step of a run, reduced over its layers: the largest
    max|S|, and the lowest cos_dq and cos_dk over the layers compared to FPA
    (None where no layer is: an exact-attention run)."""

    def __init__(self, step, max_abs_score, cos_dq, cos_dk):
        self.step, self.max_abs_score, self.cos_dq, self.cos_dk = step, max_abs_score, cos_dq, cos_dk


DIAG_COLUMNS = ("step", "layer", "max_abs_score", "cos_dq", "cos_dk")


def read_diag(path):
    """diag.csv's steps as DiagPoints in step order; [] when there is none.
    Raises CsvError naming the file, line, column and value when a row is not
    what the trainer writes."""
    if not os.path.exists(path):
        return []
    by_step = {}  # step -> [(max_abs_score, cos_dq, cos_dk)] over its layers
    for line, row in run_csv.read_rows(path, DIAG_COLUMNS):
        step = run_csv.number(path, line, row, "step", int)
        by_step.setdefault(step, []).append(
            tuple(run_csv.number(path, line, row, c, empty_ok=c != "max_abs_score") for c in DIAG_COLUMNS[2:]))
    points = []
    for step, layers in sorted(by_step.items()):
        dq = [c for _, c, _ in layers if c is not None]
        dk = [c for _, _, c in layers if c is not None]
        points.append(DiagPoint(step, max(s for s, _, _ in layers), min(dq, default=None), min(dk, default=None)))
    return points


class Run:
    """One run directory: its metrics.csv rows, its diag.csv steps and its place
    in a sweep: setting and baseline by their labels, and its panel (None: the
    only one)."""

    def __init__(self, path, run_id, setting, status="", baseline="", seed="", panel=None):
        self.path, self.id, self.setting = path, run_id, setting
        self.status, self.baseline, self.seed, self.panel = status, baseline, seed, panel
        self.train = []  # (tokens, train_loss)
        self.val = []  # (tokens, val_loss)
        self.diverged_at = None  # tokens of the diverged row
        self.tokens_per_step = None  # from the last metrics row past step 0
        metrics = os.path.join(path, "metrics.csv")
        for line, row in run_csv.read_rows(metrics, run_csv.METRICS_COLUMNS):
            tokens = run_csv.number(metrics, line, row, "tokens")
            step = run_csv.number(metrics, line, row, "step", int)
            if step > 0 and tokens > 0:
                self.tokens_per_step = tokens / step
            if row["event"].startswith("diverged"):
                self.diverged_at = tokens
                continue
            train_loss = run_csv.number(metrics, line, row, "train_loss", empty_ok=True)
            val_loss = run_csv.number(metrics, line, row, "val_loss", empty_ok=True)
            if train_loss is not None:
                self.train.append((tokens, train_loss))
            if val_loss is not None:
                self.val.append((tokens, val_loss))
        if self.diverged_at is not None:
            self.status = "diverged"
        try:
            self.diag = read_diag(os.path.join(path, "diag.csv"))
        except run_csv.CsvError as e:
            print(f"plot.py: {e}; this run is left out of the diagnostics figure", file=sys.stderr)
            self.diag = []

    def diag_curve(self, field):
        """(tokens, value) of one DiagPoint field at every diagnostics step that has it and is finite."""
        if self.tokens_per_step is None:
            return []
        return [(p.step * self.tokens_per_step, getattr(p, field)) for p in self.diag
                if getattr(p, field) is not None and math.isfinite(getattr(p, field))]


# The default panel key: runs at different tokens per step are different
# schedules, each compared with its own baseline.
PANEL_KEY = "train.tokens_per_step"


class PanelError(ValueError):
    """A --panel-by that names no varied key of the sweep."""


def panel_key(summary, rows, panel_by):
    """The key whose values split the settings into panels (None: one panel).
    panel_by: None for the default, "none", or a varied key of the sweep (the
    columns of summary.csv between setting and status, the seed aside)."""
    columns = list(rows[0])  # a row's keys are the header, in its order
    keys = [k for k in columns[columns.index("setting") + 1:columns.index("status")] if k != "train.seed"]
    if panel_by is None:
        return PANEL_KEY if PANEL_KEY in keys and len({r[PANEL_KEY] for r in rows}) > 1 else None
    if panel_by == "none":
        return None
    if panel_by not in keys:
        raise PanelError(f"--panel-by {panel_by}: not a varied key of {summary}; allowed: none, "
                         + ", ".join(keys))
    return panel_by


def load_runs(root, panel_by=None):
    """Runs under root, from a sweep's summary.csv, a single run, or subfolders;
    panel_by as panel_key takes it."""
    summary = os.path.join(root, "summary.csv")
    if os.path.exists(summary):
        rows = [row for _, row in run_csv.read_rows(summary, run_csv.SUMMARY_COLUMNS)]
        if not rows:
            return []
        key = panel_key(summary, rows, panel_by)
        labels = {row["setting"]: run_csv.label(row) for row in rows}
        runs = []
        for row in rows:
            path = os.path.join(root, row["id"])
            if os.path.exists(os.path.join(path, "metrics.csv")):
                runs.append(Run(path, row["id"], labels[row["setting"]], row["status"],
                                labels.get(row["baseline"], row["baseline"]), row.get("train.seed", ""),
                                f"{key} = {row[key]}" if key else None))
        return runs
    if os.path.exists(os.path.join(root, "metrics.csv")):
        name = os.path.basename(os.path.normpath(root))
        return [Run(root, name, name)]
    if not os.path.isdir(root):
        raise run_csv.CsvError(f"{root}: {'no such directory' if not os.path.exists(root) else 'not a directory'}; "
                               "allowed: a run directory, a sweep directory or a folder of runs")
    runs = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.exists(os.path.join(path, "metrics.csv")):
            runs.append(Run(path, name, name))
    return runs


def smooth(points, window):
    """Trailing mean over `window` points (the train loss is noisy)."""
    out, total = [], 0.0
    for i, (x, y) in enumerate(points):
        total += y
        if i >= window:
            total -= points[i - window][1]
        out.append((x, total / min(i + 1, window)))
    return out


def aggregate(curves):
    """Mean, min and max over runs at the tokens all of them reached."""
    common = None
    for c in curves:
        xs = {x for x, _ in c}
        common = xs if common is None else common & xs
    xs = sorted(common or [])
    lookup = [dict(c) for c in curves]
    mean = [sum(d[x] for d in lookup) / len(lookup) for x in xs]
    lo = [min(d[x] for d in lookup) for x in xs]
    hi = [max(d[x] for d in lookup) for x in xs]
    return xs, mean, lo, hi


def by_setting(runs):
    groups = OrderedDict()
    for r in runs:
        groups.setdefault(r.setting, []).append(r)
    return groups


def by_panel(runs):
    """{panel: its runs}, the panels in the order they first appear."""
    groups = OrderedDict()
    for r in runs:
        groups.setdefault(r.panel, []).append(r)
    return groups


def panel_title(name, panel):
    """An axis title, and its panel on a second line (one line would run into the next axis's)."""
    return name if panel is None else f"{name}\n{panel}"


def draw_group(ax, curves, color, label):
    """One setting on one axis from its runs' (diverged, points) pairs: the mean
    line and the seed band of the runs that did not diverge; each diverged run
    drawn alone, dashed, up to an x."""
    healthy = [pts for diverged, pts in curves if not diverged and pts]
    if healthy:
        xs, mean, lo, hi = aggregate(healthy)
        ax.plot(xs, mean, color=color, lw=1.4, label=label + (f" ({len(healthy)} seeds)" if len(healthy) > 1 else ""))
        if len(healthy) > 1:
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
    for diverged, pts in curves:
        if diverged and pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, lw=0.8, ls="--",
                    label=None if healthy else label)
            ax.plot(pts[-1][0], pts[-1][1], marker="x", ms=9, mew=2, color=color)
            ax.annotate("diverged", pts[-1], textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)


def palette():
    """Matplotlib's ten colours and five more: a panel has up to 15 settings."""
    return plt.rcParams["axes.prop_cycle"].by_key()["color"] + ["black", "darkgoldenrod", "navy", "lime", "teal"]


def setting_colors(runs):
    """One colour per setting, in the order the settings first appear in their
    panel, the same in every figure (the gap figure leaves the baseline out but
    not its colour). Settings of different panels never share an axis, so each
    panel starts the palette again."""
    colors = palette()
    return {setting: colors[i % len(colors)] for members in by_panel(runs).values()
            for i, setting in enumerate(by_setting(members))}


def zoom_to_late(ax, curves):
    """y range of the last 80% of the tokens, where the settings separate; the
    points it leaves out are named in a note on the axis."""
    end = max((pts[-1][0] for pts in curves if pts), default=0)
    ys = [y for pts in curves for x, y in pts if x >= 0.2 * end]
    if not ys:
        return
    pad = 0.05 * (max(ys) - min(ys) or 1.0)
    lo, hi = min(ys) - pad, max(ys) + pad
    ax.set_ylim(lo, hi)
    above = [y for pts in curves for _, y in pts if y > hi]
    below = [y for pts in curves for _, y in pts if y < lo]
    notes = []
    if above:
        notes.append(f"clipped: {len(above)} early points above {hi:.2f} (up to {max(above):.2f})")
    if below:
        notes.append(f"clipped: {len(below)} points below {lo:.2f} (down to {min(below):.2f})")
    if notes:
        ax.text(0.99, 0.98, "\n".join(notes), transform=ax.transAxes, ha="right", va="top", fontsize=7,
                color="dimgray", bbox={"facecolor": "white", "edgecolor": "lightgray", "alpha": 0.8})


def lay_out(fig, legends):
    """Lays the axes out, then puts each (source, ax) of legends to the right
    of ax, the last axis of its panel, with the labels of source's lines: long
    labels inside the axes would hide the curves. Added after the layout, the
    legends keep the axes' widths; the saved image grows to hold them (save)."""
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # 0.4 inch on top for the suptitle
    for source, ax in legends:
        handles, labels = source.get_legend_handles_labels()
        if handles:
            ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


def setting_label(setting, members):
    return setting + (" [baseline]" if members[0].baseline == "(baseline)" else "")


def plot_losses(runs, window, title, colors):
    """Figure 1, a row (train, val) per panel; returns it."""
    panels = by_panel(runs)
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 5 * len(panels)), squeeze=False)
    train_title = "train loss" + (f" (trailing mean of {window} steps)" if window > 1 else "")
    for (panel, members), (ax_train, ax_val) in zip(panels.items(), axes):
        for setting, group in by_setting(members).items():
            label = setting_label(setting, group)
            draw_group(ax_train, [(r.status == "diverged", smooth(r.train, window)) for r in group], colors[setting],
                       label)
            draw_group(ax_val, [(r.status == "diverged", r.val) for r in group], colors[setting], label)
        for ax, name in ((ax_train, train_title), (ax_val, "val loss")):
            ax.set_xlabel("tokens")
            ax.set_ylabel("loss (nats)")
            ax.set_title(panel_title(name, panel))
            ax.grid(alpha=0.3)
        zoom_to_late(ax_val, [r.val for r in members if r.status != "diverged"])
        zoom_to_late(ax_train, [smooth(r.train, window) for r in members if r.status != "diverged"])
    fig.suptitle(title)
    lay_out(fig, [(ax_val, ax_val) for _, ax_val in axes])
    return fig


def paired_gaps(runs):
    """{run id: [(tokens, val - baseline val)]} for every run compared to a
    baseline that is there and did not diverge (same seed, same tokens; from
    the first evaluation after step 0)."""
    baselines = {(r.setting, r.seed): r for r in runs if r.baseline == "(baseline)"}
    gaps = {}
    for r in runs:
        b = baselines.get((r.baseline, r.seed))
        if r.baseline == "(baseline)" or b is None or b.status == "diverged":
            continue
        base = dict(b.val)
        gaps[r.id] = [(x, y - base[x]) for x, y in r.val[1:] if x in base]
    return gaps


def plot_gaps(runs, title, colors):
    """Figure 2, val(setting) - val(baseline) on the same seed and tokens, a
    panel per panel that has compared runs; None when there is nothing to draw."""
    panels = by_panel([r for r in runs if r.baseline and r.baseline != "(baseline)"])
    if not panels:
        return None
    gaps = paired_gaps(runs)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 5 * len(panels)), squeeze=False)
    for (panel, members), (ax,) in zip(panels.items(), axes):
        for setting, group in by_setting(members).items():
            curves = [(r.status == "diverged", gaps[r.id]) for r in group if r.id in gaps]
            draw_group(ax, curves, colors[setting], f"{setting} vs {group[0].baseline}")
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("tokens")
        ax.set_ylabel("val loss gap to baseline (nats)")
        ax.set_title(panel_title(title, panel))
        ax.grid(alpha=0.3)
    lay_out(fig, [(ax, ax) for (ax,) in axes])
    return fig


# Figure 3's curve panels: the DiagPoint field, the panel's title and its y label.
DIAG_PANELS = (("max_abs_score", "(a) largest max|S| over layers", "max |S| (log scale)"),
               ("cos_dq", "(b) lowest cos(dQ, FPA's) over layers", "cosine"),
               ("cos_dk", "(c) lowest cos(dK, FPA's) over layers", "cosine"))


def plot_diag(runs, title, colors):
    """Figure 3, a 2 x 2 block of panels (a)-(d) per panel; None when no run has
    diagnostics at two steps or more (one step draws no curve)."""
    panels = by_panel([r for r in runs if len(r.diag_curve("max_abs_score")) >= 2])
    if not panels:
        return None
    gaps = {run_id: curve for run_id, curve in paired_gaps(runs).items() if curve}
    fig, axes = plt.subplots(2 * len(panels), 2, figsize=(13, 9 * len(panels)), squeeze=False)
    for block, (panel, traced) in enumerate(panels.items()):
        curve_axes = [axes[2 * block][0], axes[2 * block][1], axes[2 * block + 1][0]]
        ax_scatter = axes[2 * block + 1][1]
        for setting, members in by_setting(traced).items():
            for ax, (field, _, _) in zip(curve_axes, DIAG_PANELS):
                curves = [(r.status == "diverged", r.diag_curve(field)) for r in members]
                draw_group(ax, [(d, pts) for d, pts in curves if pts], colors[setting],
                           setting_label(setting, members))
            for r in members:
                if r.id in gaps:  # a diverged run is an x, as at the end of its curves
                    ax_scatter.plot(r.diag_curve("max_abs_score")[-1][1], gaps[r.id][-1][1], ls="none",
                                    marker="x" if r.status == "diverged" else "o", ms=7, color=colors[setting])
        for ax, (field, name, ylabel) in zip(curve_axes, DIAG_PANELS):
            ax.set_xlabel("tokens")
            ax.set_ylabel(ylabel)
            ax.set_title(panel_title(name, panel))
            ax.grid(alpha=0.3)
        curve_axes[0].set_yscale("log")
        if gaps.keys() & {r.id for r in traced}:
            ax_scatter.axhline(0.0, color="black", lw=0.8)
            ax_scatter.set_xscale("log")
            ax_scatter.set_xlabel("max |S| at the last diagnostics step (log scale)")
            ax_scatter.set_ylabel("last val loss gap to baseline (nats)")
            ax_scatter.set_title(panel_title("(d) gap against max|S|, one point per run", panel))
            ax_scatter.grid(alpha=0.3)
        else:
            fig.delaxes(ax_scatter)
    fig.suptitle(f"{title}: attention diagnostics")
    lay_out(fig, [(axes[2 * block][0], axes[2 * block][1]) for block in range(len(panels))])
    return fig


def save(fig, out):
    try:
        fig.savefig(out, dpi=120, bbox_inches="tight")
    except OSError as e:
        sys.exit(f"plot.py: {out}: cannot write: {e.strerror}")
    finally:
        plt.close(fig)
    print(f"wrote {out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="run directory, sweep directory, or folder of runs")
    p.add_argument("--out", help="PNG of the loss curves (default: DIR/loss.png); "
                   "the gap and diagnostics figures go beside it")
    p.add_argument("--smooth", type=int, default=0, help="train-loss window in steps (default: ~1/50 of the run)")
    p.add_argument("--panel-by", metavar="KEY", help="a panel per value of this varied key of the sweep, or none "
                   f"(default: {PANEL_KEY} where the sweep varies it)")
    a = p.parse_args()
    if a.smooth < 0:
        sys.exit(f"plot.py: --smooth {a.smooth} is not allowed; allowed: a window of steps >= 1, or 0 for the default")
    # matplotlib appends ".png" to a name without an extension; the messages name the file it writes.
    out = a.out or os.path.join(a.dir, "loss.png")
    if not os.path.splitext(out)[1]:
        out += ".png"
    # An extension matplotlib cannot write would stop it with a traceback after the figure is drawn.
    formats = plt.gcf().canvas.get_supported_filetypes()
    plt.close()
    if os.path.splitext(out)[1][1:].lower() not in formats:
        sys.exit(f"plot.py: --out {out}: the format {os.path.splitext(out)[1][1:]!r} is not allowed; allowed: "
                 f"a file name ending in .{', .'.join(sorted(formats))}")
    try:
        runs = load_runs(a.dir, a.panel_by)
    except (run_csv.CsvError, PanelError) as e:
        sys.exit(f"plot.py: {e}")
    if not runs:
        sys.exit(f"plot.py: {a.dir}: no metrics.csv in it, in its summary.csv runs, or in its subfolders")
    longest = max(len(r.train) for r in runs)
    window = a.smooth if a.smooth > 0 else max(1, longest // 50)
    title = os.path.basename(os.path.normpath(a.dir))
    colors = setting_colors(runs)
    save(plot_losses(runs, window, title, colors), out)
    stem, ext = os.path.splitext(out)
    gaps = plot_gaps(runs, f"{title}: gap to baseline", colors)
    if gaps:
        save(gaps, f"{stem}_gap{ext}")
    diag = plot_diag(runs, title, colors)
    if diag:
        save(diag, f"{stem}_diag{ext}")


if __name__ == "__main__":
    main()
