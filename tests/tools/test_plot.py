#!/usr/bin/python3
"""tools/plot.py on a made-up sweep: a setting has one colour in the loss, the
gap and the diagnostics figure, and losses the y axis clips are named on the
axis; the diagnostics figure is drawn from diag.csv at two steps or more, has
no cosine line for exact attention, and a malformed diag.csv is named, not a
traceback; settings are named by summary.csv's labels, and a sweep over
tokens per step gets a panel per arm. Exit 77 (CTest: skipped) without
matplotlib."""
import csv
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

from file_tree import write_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import matplotlib  # noqa: F401
except ImportError:
    print("matplotlib is missing (Debian: python3-matplotlib); skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(ROOT, "tools"))  # plot.py imports run_csv from beside it
spec = importlib.util.spec_from_file_location("plot", os.path.join(ROOT, "tools", "plot.py"))
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)

HEADER = "step,tokens,lr,train_loss,val_loss,grad_norm,step_ms,tokens_per_s,mfu,skipped,event\n"
DIAG_HEADER = ("step,layer,kind,q_rms,k_rms,max_abs_score,cos_o,cos_p,cos_ds,cos_dq,cos_dk,cos_dv,"
               "rel_o,rel_p,rel_ds,rel_dq,rel_dk,rel_dv\n")
DIAG_STEPS = (0, 50, 100)


def max_abs_score(n, seed, step, layer):
    """Layer 1 holds the largest scores; they grow with the step, faster for later settings."""
    return (1.0 + layer) * (1.0 + 0.1 * step * (n + 1)) + 0.01 * seed


def cosine(n, step, layer, which):
    """Layer 0 is the worse one; dK falls faster than dQ."""
    return 1.0 - (0.001 + 0.002 * which) * step * n / 100 - 0.01 * (1 - layer)


def write_diag(run_dir, kind, n, seed, steps):
    """diag.csv at `steps` for two layers; exact attention (fpa) leaves the comparisons empty."""
    with open(os.path.join(run_dir, "diag.csv"), "w") as f:
        f.write(DIAG_HEADER)
        for step in steps:
            for layer in (0, 1):
                if kind == "fpa":
                    compared = [""] * 12
                else:
                    dq, dk = cosine(n, step, layer, 0), cosine(n, step, layer, 1)
                    compared = ["0.999", "0.999", "0.99", f"{dq:.6f}", f"{dk:.6f}", "0.999"] + ["0.01"] * 6
                f.write(f"{step},{layer},{kind},1.0,1.0,{max_abs_score(n, seed, step, layer):.4f},"
                        + ",".join(compared) + "\n")


SETTINGS = [("kind=fpa", "fpa", "(baseline)"), ("kind=sage", "sage", "kind=fpa"),
            ("kind=kinterval", "kinterval", "kind=fpa")]


def write_run(root, run_id, n, seed, kind, diag_steps, tokens_per_step=100):
    """A run's metrics.csv (100 steps; the first steps' losses far above the
    rest, an untrained model's; val loss 0.05 nats above per n) and diag.csv."""
    os.makedirs(os.path.join(root, run_id))
    with open(os.path.join(root, run_id, "metrics.csv"), "w") as f:
        f.write(HEADER)
        f.write("0,0,,,9.5,,,,,0,\n")
        for step in range(1, 101):
            loss = 8.0 if step <= 5 else 3.0 - 0.01 * step + 0.05 * n + 0.001 * seed
            val = f"{loss + 0.1:.4f}" if step % 10 == 0 else ""
            f.write(f"{step},{step * tokens_per_step},0.001,{loss:.4f},{val},1.0,1,1,,0,\n")
    write_diag(os.path.join(root, run_id), kind, n, seed, diag_steps)


def write_summary(root, rows):
    with open(os.path.join(root, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def make_sweep(root, diag_steps=DIAG_STEPS):
    """Baseline fpa, then sage and kinterval against it, two seeds each, 100
    tokens a step, diagnostics at diag_steps. A setting's val loss is 0.05 nats
    above the previous one's. summary.csv has no label column: the settings
    name the cells."""
    rows = []
    for n, (setting, kind, baseline) in enumerate(SETTINGS):
        for seed in (1, 2):
            run_id = f"{setting}_seed={seed}"
            write_run(root, run_id, n, seed, kind, diag_steps)
            rows.append({"id": run_id, "setting": setting, "attention.kind": kind, "train.seed": str(seed),
                         "status": "finished", "baseline": baseline})
    write_summary(root, rows)


# Two arms of tokens per step, each an FPA baseline and sage against it, as
# `qattn sweep` writes them: labels, then settings and the varied keys.
ARMS = ((100, "100"), (400, "400"))


def make_armed_sweep(root):
    rows = []
    for per_step, name in ARMS:
        for n, kind in enumerate(("fpa", "sage")):
            setting = f"kind={kind}_tokens_per_step={per_step}"
            for seed in (1, 2):
                run_id = f"{setting}_seed={seed}"
                write_run(root, run_id, n, seed, kind, DIAG_STEPS, per_step)
                rows.append({"id": run_id, "label": f"{kind.upper()} at {name}", "setting": setting,
                             "attention.kind": kind, "train.tokens_per_step": str(per_step),
                             "train.seed": str(seed), "status": "finished",
                             "baseline": "(baseline)" if kind == "fpa" else f"kind=fpa_tokens_per_step={per_step}"})
    write_summary(root, rows)


def labelled_lines(ax):
    """Legend label -> line, for the lines drawn with a label."""
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def line_colors(ax):
    """Legend label -> colour of the lines drawn with a label."""
    return {label: line.get_color() for label, line in labelled_lines(ax).items()}


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
            setting = label.split(" vs ")[0]
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


class LabelsAndPanels(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        make_armed_sweep(self.dir.name)

    def tearDown(self):
        self.dir.cleanup()

    def test_a_panel_per_tokens_per_step_each_with_its_cells_by_label(self):
        runs = plot.load_runs(self.dir.name)
        colors = plot.setting_colors(runs)
        losses = plot.plot_losses(runs, 1, "t", colors)
        self.assertEqual(len(losses.axes), 4)  # (train, val) per arm
        for row, (per_step, name) in enumerate(ARMS):
            ax_val = losses.axes[2 * row + 1]
            self.assertIn(f"train.tokens_per_step = {per_step}", ax_val.get_title())
            self.assertEqual(sorted(labelled_lines(ax_val)),
                             [f"FPA at {name} [baseline] (2 seeds)", f"SAGE at {name} (2 seeds)"])
            self.assertEqual([t.get_text() for t in ax_val.get_legend().get_texts()],
                             [f"FPA at {name} [baseline] (2 seeds)", f"SAGE at {name} (2 seeds)"])
            # The tokens follow each arm's tokens per step.
            self.assertEqual(max(labelled_lines(ax_val)[f"SAGE at {name} (2 seeds)"].get_xdata()), 100 * per_step)
        # Each panel starts the palette again: the cells at one place in their arm share a colour.
        self.assertEqual(colors["FPA at 100"], colors["FPA at 400"])
        self.assertNotEqual(colors["FPA at 100"], colors["SAGE at 100"])
        gaps = plot.plot_gaps(runs, "t", colors)
        self.assertEqual([sorted(labelled_lines(ax)) for ax in gaps.axes],
                         [[f"SAGE at {name} vs FPA at {name} (2 seeds)"] for _, name in ARMS])
        diag = plot.plot_diag(runs, "t", colors)
        self.assertEqual(len(diag.axes), 8)  # (a)-(d) per arm
        self.assertEqual(sorted(labelled_lines(diag.axes[4])), ["FPA at 400 [baseline] (2 seeds)",
                                                                 "SAGE at 400 (2 seeds)"])

    def test_panel_by_none_draws_one_panel_and_a_key_the_sweep_lacks_is_refused(self):
        runs = plot.load_runs(self.dir.name, "none")
        self.assertEqual(len(plot.plot_losses(runs, 1, "t", plot.setting_colors(runs)).axes), 2)
        self.assertEqual(len({c for c in plot.setting_colors(runs).values()}), 4)
        runs = plot.load_runs(self.dir.name, "attention.kind")
        self.assertEqual(len(plot.plot_losses(runs, 1, "t", plot.setting_colors(runs)).axes), 4)
        with self.assertRaises(plot.PanelError) as e:
            plot.load_runs(self.dir.name, "train.lr")
        self.assertEqual(str(e.exception), f"--panel-by train.lr: not a varied key of "
                         f"{os.path.join(self.dir.name, 'summary.csv')}; allowed: none, attention.kind, "
                         "train.tokens_per_step")


class DiagFigureTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def figures(self):
        runs = plot.load_runs(self.root)
        colors = plot.setting_colors(runs)
        return plot.plot_losses(runs, 1, "t", colors), plot.plot_diag(runs, "t", colors)

    def test_a_setting_keeps_its_colour_and_the_curves_follow_the_tokens(self):
        make_sweep(self.root)
        losses, diag = self.figures()
        self.assertIsNotNone(diag)
        in_losses = line_colors(losses.axes[1])
        scores = labelled_lines(diag.axes[0])
        self.assertEqual({label: line.get_color() for label, line in scores.items()}, in_losses)
        self.assertEqual(diag.axes[0].get_yscale(), "log")
        for n, (setting, _, _) in enumerate(SETTINGS):
            line = next(line for label, line in scores.items() if label.startswith(setting + " "))
            self.assertEqual(list(line.get_xdata()), [step * 100 for step in DIAG_STEPS])
            # The largest score over layers (layer 1's), the mean of seeds 1 and 2.
            for y, step in zip(line.get_ydata(), DIAG_STEPS):
                self.assertAlmostEqual(y, max_abs_score(n, 1.5, step, 1), places=3)

    def test_exact_attention_has_no_cosine_line(self):
        make_sweep(self.root)
        _, diag = self.figures()
        for ax, which in ((diag.axes[1], 0), (diag.axes[2], 1)):
            lines = labelled_lines(ax)
            self.assertEqual(sorted(label.split(" ")[0] for label in lines), ["kind=kinterval", "kind=sage"])
            for n, (setting, _, _) in enumerate(SETTINGS[1:], start=1):
                line = next(line for label, line in lines.items() if label.startswith(setting + " "))
                # The lowest cosine over layers (layer 0's).
                for y, step in zip(line.get_ydata(), DIAG_STEPS):
                    self.assertAlmostEqual(y, cosine(n, step, 0, which), places=5)

    def test_last_gap_against_last_score_one_point_per_compared_run(self):
        make_sweep(self.root)
        _, diag = self.figures()
        self.assertEqual(len(diag.axes), 4)
        points = sorted((round(line.get_ydata()[0], 4), round(line.get_xdata()[0], 2))
                        for line in diag.axes[3].get_lines() if line.get_marker() == "o")
        expected = sorted((round(0.05 * n, 4), round(max_abs_score(n, seed, DIAG_STEPS[-1], 1), 2))
                          for n in (1, 2) for seed in (1, 2))
        self.assertEqual(points, expected)

    def test_no_baselines_no_gap_panel(self):
        make_sweep(self.root)
        runs = plot.load_runs(self.root)
        for r in runs:
            r.baseline = ""
        diag = plot.plot_diag(runs, "t", plot.setting_colors(runs))
        self.assertEqual(len(diag.axes), 3)

    def test_diagnostics_at_one_step_draw_no_figure(self):
        make_sweep(self.root, diag_steps=(100,))
        self.assertIsNone(self.figures()[1])
        # One run with two steps draws the figure; the runs with one step stay out of it.
        write_diag(os.path.join(self.root, "kind=sage_seed=1"), "sage", 1, 1, (50, 100))
        _, diag = self.figures()
        self.assertIsNotNone(diag)
        self.assertEqual([label.split(" ")[0] for label in labelled_lines(diag.axes[0])], ["kind=sage"])

    def test_a_diverged_run_ends_in_an_x(self):
        make_sweep(self.root)
        with open(os.path.join(self.root, "kind=sage_seed=2", "metrics.csv"), "a") as f:
            f.write("101,10100,,,,,,,,0,diverged: loss nan\n")
        runs = plot.load_runs(self.root)
        colors = plot.setting_colors(runs)
        diag = plot.plot_diag(runs, "t", colors)
        for ax in diag.axes:
            ends = [line for line in ax.get_lines() if line.get_marker() == "x"]
            self.assertEqual([line.get_color() for line in ends], [colors["kind=sage"]])

    def test_a_malformed_diag_csv_is_named_and_the_figures_still_drawn(self):
        cases = {
            "a value": (DIAG_HEADER + "0,0,sage,1,1,0.5,,,,,,,,,,,,\n50,0,sage,1,1,huge,,,,,,,,,,,,\n",
                        "line 3: max_abs_score 'huge' is not allowed"),
            "a cut row": (DIAG_HEADER + "0,0,sage,1,1,0.5,,,,,,,,,,,,\n50,0,sa\n",
                          "line 3: 3 cells, its header has 18; the file is cut short or damaged"),
            "a step": (DIAG_HEADER + "x,0,sage,1,1,0.5,,,,,,,,,,,,\n", "line 2: step 'x' is not allowed"),
            "a header": ("step,layer,q_rms\n0,0,1\n", "its header has no max_abs_score, cos_dq, cos_dk"),
        }
        for name, (text, message) in cases.items():
            with self.subTest(name), tempfile.TemporaryDirectory() as root:
                make_sweep(root)
                bad = os.path.join(root, "kind=sage_seed=1", "diag.csv")
                with open(bad, "w") as f:
                    f.write(text)
                r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot.py"), root],
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertIn(f"plot.py: {bad}: {message}", r.stderr)
                self.assertIn("left out of the diagnostics figure", r.stderr)
                for png in ("loss.png", "loss_gap.png", "loss_diag.png"):
                    self.assertTrue(os.path.isfile(os.path.join(root, png)), png)

    def test_a_bad_metrics_or_summary_csv_or_argument_stops_with_one_line(self):
        """metrics.csv and summary.csv carry the curves: one that cannot be read
        stops plot.py naming the file, line, column and value, and so does a
        missing folder, a negative --smooth or an --out that cannot be written
        or names a format matplotlib does not write."""
        def metrics(rows):
            return HEADER + "0,0,,,9.5,,,,,0,\n" + rows
        cases = (
            ({"r/metrics.csv": ""}, ["{d}/r"], "{d}/r/metrics.csv: empty; allowed: a CSV file whose header has step"),
            ({"r/metrics.csv": "step,loss\n1,2\n"}, ["{d}/r"],
             "{d}/r/metrics.csv: its header has no tokens, train_loss, val_loss, event"),
            ({"r/metrics.csv": metrics("1,100,0.1,abc,,1,1,1,,0,\n")}, ["{d}/r"],
             "{d}/r/metrics.csv: line 3: train_loss 'abc' is not allowed; allowed: a number or empty"),
            ({"r/metrics.csv": metrics("1,100,0.1,3.0\n")}, ["{d}/r"],
             "{d}/r/metrics.csv: line 3: 4 cells, its header has 11; the file is cut short or damaged"),
            ({"r/metrics.csv": None}, ["{d}/r"], "{d}/r/metrics.csv: is a directory"),
            ({"s/summary.csv": ""}, ["{d}/s"], "{d}/s/summary.csv: empty"),
            ({"s/summary.csv": "a,b\n1,2\n"}, ["{d}/s"], "{d}/s/summary.csv: its header has no id, setting"),
            ({}, ["{d}/typo"], "{d}/typo: no such directory; allowed: a run directory"),
            ({"r/metrics.csv": metrics("")}, ["{d}/r", "--smooth", "-3"], "--smooth -3 is not allowed"),
            ({"r/metrics.csv": metrics("")}, ["{d}/r", "--out", "{d}/no/x.png"],
             "{d}/no/x.png: cannot write: No such file or directory"),
            # matplotlib raised ValueError (a traceback) after drawing the figure.
            ({"r/metrics.csv": metrics("")}, ["{d}/r", "--out", "{d}/x.txt"],
             "--out {d}/x.txt: the format 'txt' is not allowed; allowed: a file name ending in .eps, "),
        )
        for files, args, message in cases:
            with self.subTest(message), tempfile.TemporaryDirectory() as d:
                write_tree(d, files)
                # In this process (matplotlib loads once): main's sys.exit carries the message.
                argv = sys.argv
                sys.argv = ["plot.py", *[a.format(d=d) for a in args]]
                try:
                    with self.assertRaises(SystemExit) as stop:
                        plot.main()
                finally:
                    sys.argv = argv
                self.assertIn(f"plot.py: {message.format(d=d)}", str(stop.exception.code))

    def test_out_without_an_extension_gets_png_and_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            make_sweep(d)
            r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot.py"), d, "--out",
                                os.path.join(d, "curves")], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            for name in ("curves.png", "curves_gap.png", "curves_diag.png"):
                self.assertIn(f"wrote {os.path.join(d, name)}", r.stdout)
                self.assertTrue(os.path.isfile(os.path.join(d, name)), name)


if __name__ == "__main__":
    unittest.main()
