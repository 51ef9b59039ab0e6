#!/usr/bin/python3
"""tools/plot.py on a made-up sweep: a setting has one colour in the loss and
the gap figure, and losses the y axis clips are named on the axis.
Exit 77 (CTest: skipped) without matplotlib."""
import csv
import importlib.util
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import matplotlib  # noqa: F401
except ImportError:
    print("matplotlib is missing (Debian: python3-matplotlib); skipped")
    sys.exit(77)

spec = importlib.util.spec_from_file_location("plot", os.path.join(ROOT, "tools", "plot.py"))
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)

HEADER = "step,tokens,lr,train_loss,val_loss,grad_norm,step_ms,tokens_per_s,mfu,skipped,event\n"


def make_sweep(root):
    """Baseline fpa, then sage and kinterval against it, two seeds each; the
    first steps' losses are far above the rest (an untrained model's)."""
    settings = [("kind=fpa", "fpa", "(baseline)"), ("kind=sage", "sage", "kind=fpa"),
                ("kind=kinterval", "kinterval", "kind=fpa")]
    rows = []
    for n, (setting, kind, baseline) in enumerate(settings):
        for seed in (1, 2):
            run_id = f"{setting}_seed={seed}"
            os.makedirs(os.path.join(root, run_id))
            with open(os.path.join(root, run_id, "metrics.csv"), "w") as f:
                f.write(HEADER)
                f.write("0,0,,,9.5,,,,,0,\n")
                for step in range(1, 101):
                    loss = 8.0 if step <= 5 else 3.0 - 0.01 * step + 0.05 * n + 0.001 * seed
                    val = f"{loss + 0.1:.4f}" if step % 10 == 0 else ""
                    f.write(f"{step},{step * 100},0.001,{loss:.4f},{val},1.0,1,1,,0,\n")
            rows.append({"id": run_id, "setting": setting, "attention.kind": kind, "train.seed": str(seed),
                         "status": "finished", "baseline": baseline})
    with open(os.path.join(root, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["id", "setting", "attention.kind", "train.seed", "status", "baseline"])
        w.writeheader()
        w.writerows(rows)


def line_colors(ax):
    """Legend label -> colour of the lines drawn with a label."""
    return {line.get_label(): line.get_color() for line in ax.get_lines() if not line.get_label().startswith("_")}


class PlotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        make_sweep(self.dir.name)
        self.runs = plot.load_runs(self.dir.name)
        self.colors = plot.setting_colors(self.runs)

    def tearDown(self):
        self.dir.cleanup()

    def test_a_setting_has_one_colour_in_both_figures(self):
        losses = plot.plot_losses(self.runs, 1, "t", self.colors)
        gaps = plot.plot_gaps(self.runs, "t", self.colors)
        self.assertIsNotNone(gaps)
        in_losses = line_colors(losses.axes[1])
        in_gaps = line_colors(gaps.axes[0])
        self.assertEqual(len(in_gaps), 2)
        for label, color in in_gaps.items():
            setting = label.split(" - ")[0]
            matching = [c for name, c in in_losses.items() if name.startswith(setting + " (")]
            self.assertEqual(matching, [color], f"{setting}: {in_losses} vs {in_gaps}")
        self.assertEqual(len(set(in_losses.values())), 3)

    def test_clipped_losses_are_named_on_the_axis(self):
        fig = plot.plot_losses(self.runs, 1, "t", self.colors)
        ax_train, ax_val = fig.axes[:2]
        for ax, highest in ((ax_train, "8.00"), (ax_val, "9.50")):
            top = ax.get_ylim()[1]
            self.assertLess(top, 4.0)
            notes = [t.get_text() for t in ax.texts if "clipped" in t.get_text()]
            self.assertEqual(len(notes), 1, [t.get_text() for t in ax.texts])
            self.assertIn(f"(up to {highest})", notes[0])

    def test_nothing_clipped_no_note(self):
        for i, r in enumerate(self.runs):  # flat curves: the late range holds every point
            r.train = [(x, 3.0 + 0.01 * i) for x, _ in r.train]
            r.val = [(x, 3.1 + 0.01 * i) for x, _ in r.val]
        fig = plot.plot_losses(self.runs, 1, "t", self.colors)
        for ax in fig.axes[:2]:
            self.assertFalse([t for t in ax.texts if "clipped" in t.get_text()])


if __name__ == "__main__":
    unittest.main()
