#!/usr/bin/env python3
"""Tests of the reproduction tools: tools/scale_sweep.py keeps the warmup and
evaluation interval in steps at any budget, tools/results_store.py keeps,
restores and times finished runs, and tools/gap_table.py prints paired gaps
with the Student-t quantile `qattn sweep` uses."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, TOOLS)
import gap_table  # noqa: E402  (found through TOOLS)


def tool(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True).stdout.strip()


class ScaleSweep(unittest.TestCase):
    def test_warmup_and_eval_interval_stay_in_steps(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "k.json")
            source = os.path.join(ROOT, "configs", "sweeps", "kinterval_small.json")
            name = tool(os.path.join(TOOLS, "scale_sweep.py"), source, "--out", out, "--tokens", "31457280")
            with open(out) as f:
                scaled = json.load(f)
            with open(source) as f:
                text = "\n".join(l for l in f.read().splitlines() if not l.lstrip().startswith("//"))
                own = json.loads(text)
            self.assertEqual(name, "kinterval_small_31M")
            self.assertEqual(scaled["set"]["train.tokens"], 31457280)
            # The protocol: a smaller budget changes the run's length, not its warmup.
            self.assertEqual(scaled["set"]["train.warmup"], own["set"]["train.warmup"])
            self.assertEqual(scaled["set"]["eval.every"], own["set"]["eval.every"])
            factor = 31457280 / own["set"]["train.tokens"]
            self.assertEqual(scaled["set"]["log.diag_every"], round(own["set"]["log.diag_every"] * factor))

    def test_committed_grid_follows_the_protocol(self):
        """Both grids: >= 3 seeds, evaluations every <= 100 steps, enough tokens per run
        (157M for K-interval, 105M for SageBwd), the warmup fixed in tokens across cells."""
        for grid, min_tokens in (("kinterval_small.json", 157_000_000), ("sagebwd_small.json", 104_000_000)):
            with open(os.path.join(ROOT, "configs", "sweeps", grid)) as f:
                text = "\n".join(l for l in f.read().splitlines() if not l.lstrip().startswith("//"))
                s = json.loads(text)
            self.assertGreaterEqual(len(s["seeds"]), 3, grid)
            tokens = s["set"]["train.tokens"]
            self.assertGreaterEqual(tokens, min_tokens, grid)
            zipped = s["zip"][0]
            cells = len(zipped["attention.kind"])
            def per_cell(key):
                return zipped[key] if key in zipped else [s["set"][key]] * cells
            for every, per_step, warmup in zip(per_cell("eval.every"), per_cell("train.tokens_per_step"),
                                               per_cell("train.warmup")):
                self.assertLessEqual(every, 100, grid)
                self.assertEqual(tokens % per_step, 0, grid)
                self.assertEqual(warmup * per_step, per_cell("train.warmup")[0] * per_cell("train.tokens_per_step")[0],
                                 f"{grid}: warmup not fixed in tokens")


def fake_run(folder, status, wall=10.0):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "status.json"), "w") as f:
        json.dump({"status": status, "wall_seconds": wall}, f)
    with open(os.path.join(folder, "metrics.csv"), "w") as f:
        f.write("step,val_loss\n0,10\n100,3\n")
    os.makedirs(os.path.join(folder, "checkpoints"), exist_ok=True)


class ResultsStore(unittest.TestCase):
    def test_keep_then_restore_on_a_bare_machine(self):
        with tempfile.TemporaryDirectory() as d:
            sweep, store, bare = (os.path.join(d, x) for x in ("sweep", "store", "bare"))
            fake_run(os.path.join(sweep, "a"), "finished", 100.0)
            fake_run(os.path.join(sweep, "b"), "diverged", 50.0)
            fake_run(os.path.join(sweep, "c"), "running")
            fake_run(os.path.join(sweep, "d"), "interrupted")
            for name in ("summary.md", "loss.png", "loss_gap.png", "loss_diag.png"):
                with open(os.path.join(sweep, name), "w") as f:
                    f.write("# s\n")
            self.assertEqual(tool(os.path.join(TOOLS, "results_store.py"), "keep", sweep, store),
                             f"kept 2 finished runs in {store} (2 new)")
            self.assertEqual(sorted(os.listdir(os.path.join(store, "runs"))), ["a", "b"])
            self.assertEqual(sorted(os.listdir(os.path.join(store, "runs", "a"))), ["metrics.csv", "status.json"])
            for name in ("summary.md", "loss.png", "loss_gap.png", "loss_diag.png"):
                self.assertTrue(os.path.isfile(os.path.join(store, name)), name)
            self.assertEqual(tool(os.path.join(TOOLS, "results_store.py"), "keep", sweep, store),
                             f"kept 2 finished runs in {store} (0 new)")
            # A machine with a half-done copy of "a": the finished one replaces it.
            fake_run(os.path.join(bare, "a"), "interrupted")
            self.assertEqual(tool(os.path.join(TOOLS, "results_store.py"), "restore", store, bare),
                             f"restored 2 finished runs from {store}")
            with open(os.path.join(bare, "a", "status.json")) as f:
                self.assertEqual(json.load(f)["status"], "finished")
            self.assertFalse(os.path.isdir(os.path.join(bare, "a", "checkpoints")))
            self.assertEqual(tool(os.path.join(TOOLS, "results_store.py"), "restore", store, bare),
                             f"restored 0 finished runs from {store}")

    def test_longest_plans_for_the_slowest_finished_run(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(tool(os.path.join(TOOLS, "results_store.py"), "longest", d, "600"), "600")
            fake_run(os.path.join(d, "a"), "finished", 100.0)
            fake_run(os.path.join(d, "b"), "finished", 120.0)
            fake_run(os.path.join(d, "c"), "diverged", 500.0)  # stopped early: not a run's length
            self.assertEqual(tool(os.path.join(TOOLS, "results_store.py"), "longest", d, "600"), "138")

    def test_a_store_holds_only_finished_runs(self):
        with tempfile.TemporaryDirectory() as d:
            fake_run(os.path.join(d, "store", "runs", "x"), "running")
            r = subprocess.run([sys.executable, os.path.join(TOOLS, "results_store.py"), "restore",
                                os.path.join(d, "store"), os.path.join(d, "sweep")], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("status 'running'", r.stderr)


class GapTable(unittest.TestCase):
    def test_t975_printed_quantiles(self):
        """Printed tables, to their 4 decimals; df 10^6 stands for infinity (the normal's 1.95996)."""
        for df, t in ((1, 12.7062), (2, 4.3027), (3, 3.1824), (10, 2.2281), (30, 2.0423), (60, 2.0003),
                      (120, 1.9799), (1000000, 1.9600)):
            self.assertLess(abs(gap_table.t975(df) - t), 0.6e-4, f"df {df}")
        with self.assertRaises(ValueError):
            gap_table.t975(0)

    def test_t975_equals_the_reference_at_every_df_to_200(self):
        """tests/reference/student_t_975.csv (mpmath, its header says how) is also what
        tests/unit/test_sweep.cpp holds `qattn sweep`'s student_t_975 to: both within 1e-9
        of it, so the two agree to far better than the 1e-4 their tables print."""
        rows = 0
        with open(os.path.join(ROOT, "tests", "reference", "student_t_975.csv")) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                df, t = line.split(",")
                self.assertLess(abs(gap_table.t975(int(df)) - float(t)), 1e-9, f"df {df}")
                rows += 1
        self.assertEqual(rows, 200)

    def test_paired_gap_per_step_with_interval(self):
        with tempfile.TemporaryDirectory() as d:
            def run(name, losses, diverged_at=None):
                os.makedirs(os.path.join(d, name))
                with open(os.path.join(d, name, "metrics.csv"), "w") as f:
                    f.write("step,tokens,train_loss,val_loss,event\n")
                    for step, loss in losses:
                        f.write(f"{step},{step * 1000000},,{loss},\n")
                    if diverged_at:
                        f.write(f"{diverged_at},{diverged_at * 1000000},nan,,diverged: non-finite train loss\n")
            with open(os.path.join(d, "summary.csv"), "w") as f:
                f.write("id,setting,attention.kind,train.seed,status,baseline\n")
                for seed in (1, 2, 3):
                    f.write(f"b{seed},base,fpa,{seed},finished,(baseline)\n")
                    f.write(f"q{seed},quant,kinterval,{seed},finished,base\n")
                f.write("x1,bad,kinterval,1,diverged,base\n")
            for seed, (b, q) in enumerate([(3.0, 3.1), (3.1, 3.2), (2.9, 3.0)], start=1):
                run(f"b{seed}", [(0, 10.0), (100, b + 1), (200, b)])
                run(f"q{seed}", [(0, 10.0), (100, q + 1.0), (200, q + 0.01 * seed)])
            run("x1", [(0, 10.0), (100, 4.5)], diverged_at=150)
            out = tool(os.path.join(TOOLS, "gap_table.py"), d, "--every", "100")
            lines = out.splitlines()
            self.assertEqual(lines[0], "| cell | seeds | diverged at (tokens) | 100M | 200M |")
            # Step 100: gaps 0.1, 0.1, 0.1 (interval 0); step 200: 0.11, 0.12, 0.13,
            # mean 0.12, half-width 4.3027 * 0.01 / sqrt(3) = 0.025.
            self.assertEqual(lines[2], "| quant | 3 |  | +0.100 ± 0.000* | +0.120 ± 0.025* |")
            self.assertEqual(lines[3], "| bad | 1 | 150.0M (seed 1) | +0.500 (n=1) |  |")


if __name__ == "__main__":
    unittest.main()
