#!/usr/bin/env python3
"""Tests of the reproduction tools: tools/scale_sweep.py keeps the warmup and
evaluation interval in steps at any budget, tools/results_store.py keeps,
restores and times finished runs, tools/gap_table.py prints paired gaps
with the Student-t quantile `qattn sweep` uses, to the baseline or (--pair)
between two cells named by their labels or settings' keys, tools/diag_table.py
names each run by its cell's label and seed, tools/reproduce.sh --summary-only
rebuilds a results folder from its kept runs without training, and tools/dev/gpt2_ledger.py
counts a GPT-2 step's products as the parameter count does and turns
measured tokens/s into what a speed-up asks of attention."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from file_tree import write_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, TOOLS)
import gap_table  # noqa: E402  (found through TOOLS)

sys.path.insert(0, os.path.join(TOOLS, "dev"))
import gpt2_ledger  # noqa: E402


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
            self.assertEqual(name, "kinterval_small_30Mi")  # 30 * 2^20 tokens
            self.assertEqual(scaled["set"]["train.tokens"], 31457280)
            # The protocol: a smaller budget changes the run's length, not its warmup.
            self.assertEqual(scaled["set"]["train.warmup"], own["set"]["train.warmup"])
            self.assertEqual(scaled["set"]["eval.every"], own["set"]["eval.every"])
            factor = 31457280 / own["set"]["train.tokens"]
            self.assertEqual(scaled["set"]["log.diag_every"], round(own["set"]["log.diag_every"] * factor))

    def test_budget_labels_name_one_budget(self):
        """The label is exact: a rounded one named 31,457,280 and 31,000,000 tokens
        alike ("31M"), and the runs of both budgets went to one folder."""
        with tempfile.TemporaryDirectory() as d:
            source = os.path.join(d, "s.json")
            with open(source, "w") as f:
                json.dump({"name": "s", "base": "b.json", "set": {"train.tokens": 1000}}, f)
            names = {}
            for tokens in (31457280, 31000000, 31500000, 16000000, 16777216, 2000, 2048, 1500, 999):
                names[tokens] = tool(os.path.join(TOOLS, "scale_sweep.py"), source, "--out",
                                     os.path.join(d, f"{tokens}.json"), "--tokens", str(tokens))
            self.assertEqual(names, {31457280: "s_30Mi", 31000000: "s_31M", 31500000: "s_31500k", 16000000: "s_16M",
                                     16777216: "s_16Mi", 2000: "s_2k", 2048: "s_2Ki", 1500: "s_1500", 999: "s_999"})

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

    def test_keep_before_any_run_finished_makes_the_store(self):
        """A first deadline before any run finished: the store is made and keeps
        the summary (it stopped on "No such file or directory")."""
        with tempfile.TemporaryDirectory() as d:
            sweep, store = os.path.join(d, "sweep"), os.path.join(d, "new", "store")
            fake_run(os.path.join(sweep, "a"), "interrupted")
            with open(os.path.join(sweep, "summary.md"), "w") as f:
                f.write("# s\n")
            self.assertEqual(tool(os.path.join(TOOLS, "results_store.py"), "keep", sweep, store),
                             f"kept 0 finished runs in {store} (0 new)")
            self.assertEqual(os.listdir(store), ["summary.md"])

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


def write_run(sweep_dir, name, losses, diverged_at=None):
    """A run's metrics.csv: val loss at (step, loss) pairs, a million tokens a step."""
    os.makedirs(os.path.join(sweep_dir, name))
    with open(os.path.join(sweep_dir, name, "metrics.csv"), "w") as f:
        f.write("step,tokens,train_loss,val_loss,event\n")
        for step, loss in losses:
            f.write(f"{step},{step * 1000000},,{loss},\n")
        if diverged_at:
            f.write(f"{diverged_at},{diverged_at * 1000000},nan,,diverged: non-finite train loss\n")


# A SageBwd-like sweep: FPA, int8 sage and fp8 sage; the gap_table.py --pair tests.
PAIR_HEADER = "id,setting,attention.kind,attention.sage.precision.qk,train.seed,status,final_val_loss,baseline\n"
FP8, INT8 = "attention.sage.precision.qk=fp8", "attention.kind=sage,attention.sage.precision.qk=int8"


def pair_sweep(d, fp8, int8):
    """summary.csv and metrics.csv of FPA (seeds 1-3), fp8 sage ({seed: final val
    loss}) and int8 sage (the same); a sage run's evaluation at step 200 is its final
    loss, at step 100 it is 4.1 (fp8) or 4.0 (int8); FPA's is 4 and 3."""
    with open(os.path.join(d, "summary.csv"), "w") as f:
        f.write(PAIR_HEADER)
        for seed in (1, 2, 3):
            f.write(f"f{seed},kind=fpa_qk=int8,fpa,int8,{seed},finished,3.0,(baseline)\n")
            write_run(d, f"f{seed}", [(0, 10.0), (100, 4.0), (200, 3.0)])
        for name, qk, at_100, finals in (("e", "fp8", 4.1, fp8), ("i", "int8", 4.0, int8)):
            for seed, loss in finals.items():
                f.write(f"{name}{seed},kind=sage_qk={qk},sage,{qk},{seed},finished,{loss},kind=fpa_qk=int8\n")
                write_run(d, f"{name}{seed}", [(0, 10.0), (100, at_100), (200, loss)])


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
                write_run(d, name, losses, diverged_at)
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

    def test_pair_of_two_cells_by_seed(self):
        """fp8 sage minus int8 sage: gaps 0.10, 0.15, 0.05 at the last step and in the
        final val loss, mean 0.10, std sqrt((0 + 0.05^2 + 0.05^2) / 2) = 0.05,
        half-width 4.302653 * 0.05 / sqrt(3) = 0.1242: the interval [-0.0242, +0.2242]
        holds 0, so no *; at step 100 the gaps are 0.1 three times: ± 0, *."""
        with tempfile.TemporaryDirectory() as d:
            pair_sweep(d, {1: 3.10, 2: 3.25, 3: 3.05}, {1: 3.00, 2: 3.10, 3: 3.00})
            lines = tool(os.path.join(TOOLS, "gap_table.py"), d, "--every", "100", "--pair", FP8, INT8).splitlines()
            self.assertEqual(lines[2], f"- A: kind=sage_qk=fp8 (`{FP8}`)")
            self.assertEqual(lines[3], f"- B: kind=sage_qk=int8 (`{INT8}`)")
            self.assertEqual(lines[5], "| cell | seeds | diverged at (tokens) | 100M | 200M | "
                                       "final gap (mean ± std) | 95% CI | n |")
            self.assertEqual(lines[7], "| A − B | 3 |  | +0.100 ± 0.000* | +0.100 ± 0.124 | "
                                       "+0.1000 ± 0.0500 | [-0.0242, +0.2242] | 3 |")
            self.assertEqual(len(lines), 8, "no seed is skipped")
            # A setting's exact name selects it too; B minus A is the same gap negated.
            lines = tool(os.path.join(TOOLS, "gap_table.py"), d, "--every", "100", "--pair", INT8,
                         "kind=sage_qk=fp8").splitlines()
            self.assertEqual(lines[7], "| A − B | 3 |  | -0.100 ± 0.000* | -0.100 ± 0.124 | "
                                       "-0.1000 ± 0.0500 | [-0.2242, +0.0242] | 3 |")

    def test_cells_by_their_labels(self):
        """summary.csv's labels name the cells of the table and of --pair, and select them."""
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "summary.csv"), "w") as f:
                f.write("id,label,setting,attention.kind,train.seed,status,final_val_loss,baseline\n")
                for seed in (1, 2):
                    f.write(f"b{seed},1: FPA,kind=fpa,fpa,{seed},finished,3.0,(baseline)\n")
                    f.write(f"q{seed},2: K=4 | lerp,kind=kinterval,kinterval,{seed},finished,3.1,kind=fpa\n")
                    write_run(d, f"b{seed}", [(0, 10.0), (100, 3.0)])
                    write_run(d, f"q{seed}", [(0, 10.0), (100, 3.1)])
            lines = tool(os.path.join(TOOLS, "gap_table.py"), d).splitlines()
            self.assertEqual(lines[2], "| 2: K=4 \\| lerp | 2 |  | +0.100 ± 0.000* |")
            lines = tool(os.path.join(TOOLS, "gap_table.py"), d, "--pair", "2: K=4 | lerp", "1: FPA").splitlines()
            self.assertEqual(lines[2:4], ["- A: 2: K=4 | lerp (`2: K=4 | lerp`)", "- B: 1: FPA (`1: FPA`)"])
            self.assertEqual(lines[7], "| A − B | 2 |  | +0.100 ± 0.000* | +0.1000 ± 0.0000 | "
                                       "[+0.1000, +0.1000]* | 2 |")
            for seed in (1, 2):
                for run, kind in ((f"b{seed}", "fpa"), (f"q{seed}", "kinterval")):
                    with open(os.path.join(d, run, "diag.csv"), "w") as f:
                        f.write(DIAG + f"100,0,{kind},1,1,2" + (",,,,,," if kind == "fpa" else ",1,1,1,0.9,1,1")
                                + "\n")
            lines = tool(os.path.join(TOOLS, "diag_table.py"), d).splitlines()
            self.assertTrue(lines[6].startswith("| cell | seed | status | step |"), lines[6])
            self.assertTrue(lines[8].startswith("| 1: FPA | 1 | finished | 100 | 0 |"), lines[8])
            self.assertTrue(lines[11].startswith("| 2: K=4 \\| lerp | 2 | finished | 100 | 0 |"), lines[11])
            self.assertIn("## 2: K=4 | lerp, seed 2 (step 100)", lines)

    def test_pair_skips_and_names_seeds_of_one_cell(self):
        """Seed 3 only in fp8, seed 4 only in int8: seeds 1 and 2 pair, gaps 0.1 and
        0.3, mean 0.2, std 0.1414, half-width 12.7062 * 0.1414 / sqrt(2) = 1.2706."""
        with tempfile.TemporaryDirectory() as d:
            pair_sweep(d, {1: 3.1, 2: 3.4, 3: 3.0}, {1: 3.0, 2: 3.1, 4: 3.0})
            lines = tool(os.path.join(TOOLS, "gap_table.py"), d, "--every", "100", "--pair", FP8, INT8).splitlines()
            self.assertEqual(lines[7], "| A − B | 2 |  | +0.100 ± 0.000* | +0.200 ± 1.271 | "
                                       "+0.2000 ± 0.1414 | [-1.0706, +1.4706] | 2 |")
            self.assertEqual(lines[9], "Skipped, a finished or diverged run in one cell only: "
                                       "seed 3 (A only), 4 (B only).")

    def test_documented_sagebwd_pair_names_cells_5_and_2(self):
        """The command of docs/reproducing.md selects cell 5 (all six products in fp8)
        and cell 2 (int8 sage, no QK-norm, 262,144 tokens per step) of
        configs/sweeps/sagebwd_small.json, from a summary.csv with its columns and
        rows as `qattn sweep` writes them (grid cells, then their FPA baselines)."""
        with open(os.path.join(ROOT, "configs", "sweeps", "sagebwd_small.json")) as f:
            sweep = json.loads("\n".join(l for l in f.read().splitlines() if not l.lstrip().startswith("//")))
        zipped = sweep["zip"][0]
        keys = [k for k in zipped if k != "label"]
        def text(v):  # value_text of src/train/sweep.cpp: a string as is, else compact JSON
            return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), sort_keys=True)
        rows, settings = [], {}
        cells = [{k: zipped[k][i] for k in keys} for i in range(len(zipped[keys[0]]))]
        baselines = [{**sweep["baseline"]["set"], **{m: c[m] for m in sweep["baseline"]["match"]}} for c in cells]
        for i, overrides in enumerate(cells + baselines):
            values = tuple(text(overrides[k]) if k in overrides else "" for k in keys)
            name = settings.setdefault(values, f"cell{i + 1}" if i < len(cells) else f"baseline{i + 1 - len(cells)}")
            label = zipped["label"][int(name[4:]) - 1] if name.startswith("cell") else name
            rows.append({"id": name, "label": label, "setting": name, **dict(zip(keys, values)), "train.seed": "1",
                         "status": "finished"})
        self.assertEqual(gap_table.find_setting(rows, SAGEBWD_FP8, "--pair A"), "cell5")
        self.assertEqual(gap_table.find_setting(rows, "5: sage fp8, no QK-norm, 262k", "--pair A"), "cell5")
        self.assertEqual(gap_table.find_setting(rows, SAGEBWD_INT8, "--pair B"), "cell2")
        # A JSON value keeps its commas: the last cell, QK-norm at lr_mult 10.
        self.assertEqual(gap_table.find_setting(rows, 'attention.kind=sage,model.qk_norm={"form":"gain","lr_mult":10}',
                                                "--pair A"), "cell19")
        with open(os.path.join(ROOT, "docs", "reproducing.md")) as f:
            self.assertTrue(f'--pair "{SAGEBWD_FP8}" \\\n    "{SAGEBWD_INT8}"' in f.read(),
                            "docs/reproducing.md does not give the --pair command of this test")



METRICS = "step,tokens,lr,train_loss,val_loss,grad_norm,step_ms,tokens_per_s,mfu,skipped,event\n"
SUMMARY = "id,setting,train.seed,status,baseline\nb,base,1,finished,(baseline)\nq,quant,1,finished,base\n"
DIAG = "step,layer,kind,q_rms,k_rms,max_abs_score,cos_o,cos_p,cos_ds,cos_dq,cos_dk,cos_dv\n"


class Gpt2Ledger(unittest.TestCase):
    CONFIG = os.path.join(ROOT, "configs", "gpt2_124m_fpa.json")

    def test_products_as_the_parameter_count_has_them(self):
        with open(self.CONFIG) as f:
            model = json.load(f)["model"]
        L, C, T, Vp = model["layers"], model["dim"], model["seq_len"], 50304
        tokens = 524288
        per_kind = {}
        for kind in ("fpa", "sage-fp8"):
            ops, accum = gpt2_ledger.step_ops(model, 64, tokens, kind)
            self.assertEqual(accum, 8)
            flops = lambda groups: sum(op.flops for op in ops if op.group in groups) / tokens
            # forward, dinp and dW of every weight matrix: 6 FLOPs per weight per token
            self.assertAlmostEqual(flops({"matmul", "lm head"}), 6 * (L * 12 * C * C + Vp * C), delta=1)
            # the forward's 2 causal products and the backward's 7, T·C FLOPs per token each
            self.assertAlmostEqual(flops({"attention"}), 9 * L * T * C, delta=1)
            per_kind[kind] = [op for op in ops if op.group == "attention"]
        fp8 = {op.name for op in per_kind["sage-fp8"] if op.fp8}
        self.assertEqual(fp8, {"sage forward", "sage dq", "sage dkdv"})
        # sage's pre-passes read K, Q, K, V, dO, O in bf16 and write eight
        # 8-bit copies; scales, sums, δ and norms add under 2%
        B, H, d = 64, 12, C // model["heads"]
        n = B * T * H * d
        pre = sum(op.bytes for op in gpt2_ledger.attention_ops("sage-fp8", B, H, T, d) if op.flops == 0)
        self.assertGreater(pre, 6 * 2 * n + 8 * n)
        self.assertLess(pre, 1.02 * (6 * 2 * n + 8 * n))

    def test_measured_steps_and_the_target(self):
        out = tool(os.path.join(TOOLS, "dev", "gpt2_ledger.py"), self.CONFIG, "--micro-batch", "64",
                   "--tokens-per-s", "fpa=524288", "--tokens-per-s", "slow=262144", "--target", "1.25",
                   "--call-ms", "fpa=5")
        # steps of 1 s and 2 s; 96 attention calls; 1.25x: 800 ms, 200 ms from attention
        self.assertIn("slow            262,144 tokens/s    2000.0 ms  +1000.0 ms vs fpa, +10.417 ms per call", out)
        self.assertIn("1.25x fpa: 655,360 tokens/s, step 800.0 ms: attention 200.0 ms per step under fpa's, "
                      "2.083 ms per call", out)
        self.assertIn("slow: 12.500 ms per call faster than now", out)
        self.assertIn("fpa: attention 480.0 ms of 1000.0 per step (48.0%)", out)
        self.assertIn("1.25x fpa asks attention of 2.917 ms per call, 1.71x fpa's speed", out)


SAGEBWD_FP8 = "attention.sage.precision.qk=fp8"
SAGEBWD_INT8 = ("attention.kind=sage,attention.sage.precision.qk=int8,model.qk_norm=false,"
                "train.tokens_per_step=262144")


class BadInput(unittest.TestCase):
    """Every tool answers files that are missing, empty, cut short or not what
    qattn writes, and arguments out of range, with one line naming the file (and
    line, column and value) or argument: never a traceback, never an empty table."""

    def check(self, files, args, message):
        """Writes files ({relative path: text}, None for a folder) into a fresh
        folder d, runs args (with {d} filled in) and expects a failure whose
        stderr holds message (with {d} filled in)."""
        with tempfile.TemporaryDirectory() as d:
            write_tree(d, files)
            argv = [a.format(d=d) for a in args]
            r = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0, f"{argv}: {r.stdout}")
            self.assertNotIn("Traceback", r.stderr, argv)
            self.assertIn(message.format(d=d), r.stderr, argv)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_gap_and_diag_tables(self):
        gap, diag = os.path.join(TOOLS, "gap_table.py"), os.path.join(TOOLS, "diag_table.py")
        runs = {"b/metrics.csv": METRICS + "0,0,,,9.5,,,,,0,\n", "q/metrics.csv": METRICS + "0,0,,,9.4,,,,,0,\n"}
        for files, args, message in (
            ({"summary.csv": ""}, [gap, "{d}"], "{d}/summary.csv: empty; allowed: a CSV file whose header has id"),
            ({"summary.csv": "a,b\n1,2\n"}, [diag, "{d}"], "{d}/summary.csv: its header has no id, setting, status"),
            ({"summary.csv": SUMMARY, **runs, "q/metrics.csv": METRICS + "0,x,,,9.4,,,,,0,\n"}, [gap, "{d}"],
             "{d}/q/metrics.csv: line 2: tokens 'x' is not allowed; allowed: an integer"),
            ({"summary.csv": SUMMARY, **runs, "q/metrics.csv": METRICS + "0,0,,,9.4,,,,,0,\n7,700,0.1\n"},
             [gap, "{d}"], "{d}/q/metrics.csv: line 3: 3 cells, its header has 11; the file is cut short"),
            ({"summary.csv": SUMMARY, **runs, "b/metrics.csv": "step,val_loss\n0,9\n"}, [gap, "{d}"],
             "{d}/b/metrics.csv: its header has no tokens, train_loss, event"),
            ({"summary.csv": SUMMARY, "q/diag.csv": DIAG + "x,0,fpa,1,1,1,,,,,,\n"}, [diag, "{d}"],
             "{d}/q/diag.csv: line 2: step 'x' is not allowed; allowed: an integer"),
            ({"summary.csv": SUMMARY, "q/diag.csv": DIAG + "5,0,sage,1,1,1,0.9,,,,,\n"}, [diag, "{d}"],
             "{d}/q/diag.csv: line 2: cos_p '' is not allowed; allowed: a number"),
            ({"summary.csv": SUMMARY, "q/diag.csv": DIAG + "5,0,fpa,1,1,1,,,,,,\n"}, [diag, "{d}", "--step", "7"],
             "--step 7: no run of {d}/summary.csv has diagnostics at that step"),
        ):
            with self.subTest(message):
                self.check(files, args, message)

    def test_gap_table_pair(self):
        """An ambiguous, unmatched or malformed --pair cell is named with the candidates."""
        gap = os.path.join(TOOLS, "gap_table.py")
        summary = PAIR_HEADER + "".join(
            f"{kind}{seed},kind={kind}_qk={qk},{kind},{qk},{seed},finished,3.0,{base}\n"
            for kind, qk, base in (("fpa", "int8", "(baseline)"), ("sage", "int8", "kind=fpa_qk=int8"),
                                   ("sage", "fp8", "kind=fpa_qk=int8")) for seed in (1, 2))
        files = {"summary.csv": summary}
        for args, message in (
            ([gap, "{d}", "--pair", "attention.kind=sage", FP8],
             "--pair A 'attention.kind=sage' matches 2 settings; name one, or add keys that tell them apart: "
             "kind=sage_qk=int8 (attention.sage.precision.qk=int8); "
             "kind=sage_qk=fp8 (attention.sage.precision.qk=fp8)"),
            ([gap, "{d}", "--pair", FP8, "attention.kind=sage,attention.sage.precision.qk=fp9"],
             "--pair B 'attention.kind=sage,attention.sage.precision.qk=fp9' matches no setting of summary.csv; "
             "the nearest (1 of 2 keys equal): attention.kind=sage,attention.sage.precision.qk=int8 (1 setting); "
             "attention.kind=sage,attention.sage.precision.qk=fp8 (1 setting)"),
            ([gap, "{d}", "--pair", "attention.sage.precision.qk=fp9", INT8],
             "the nearest (0 of 1 keys equal): attention.sage.precision.qk=int8 (2 settings); "
             "attention.sage.precision.qk=fp8 (1 setting)"),
            ([gap, "{d}", "--pair", "qk=fp8", INT8],
             "--pair A 'qk=fp8': 'qk=fp8' is not allowed; allowed: a label or setting of summary.csv, or "
             "key=value[,key=value...] with keys from attention.kind, attention.sage.precision.qk"),
            ([gap, "{d}", "--pair", "train.seed=1", INT8], "--pair A 'train.seed=1': train.seed is not allowed"),
            ([gap, "{d}", "--pair", "kind=sage_qk=int8", INT8], "both name the cell kind=sage_qk=int8"),
            ([gap, "{d}", "--pair", FP8, INT8], "--pair: no seed has a finished or diverged run in both cells "
                                                "(A kind=sage_qk=fp8: seeds none; B kind=sage_qk=int8: seeds none)"),
        ):
            with self.subTest(message):
                self.check(files, args, message)

    def test_results_store_and_scale_sweep(self):
        store, scale = os.path.join(TOOLS, "results_store.py"), os.path.join(TOOLS, "scale_sweep.py")
        sweep = '{"name": "s", "base": "b.json", "seeds": [1, 2], "set": {"train.tokens": 1000}}'
        finished = {"sw/r/status.json": '{"status": "finished"}'}
        for files, args, message in (
            ({}, [store, "keep", "{d}/typo", "{d}/store"], "keep: {d}/typo: not a directory; allowed: a sweep"),
            ({}, [store, "restore", "{d}/typo", "{d}/sw"], "restore: {d}/typo/runs: not a directory"),
            ({**finished, "file": ""}, [store, "keep", "{d}/sw", "{d}/file"], "keep: {d}/file/runs: Not a directory"),
            # It said "keep: None: None" (shutil.SameFileError).
            ({**finished, "sw/summary.md": ""}, [store, "keep", "{d}/sw", "{d}/sw/."],
             "keep: STORE {d}/sw/. is SWEEP_DIR {d}/sw; allowed: another folder"),
            ({}, [scale, "{d}/none.json", "--out", "{d}/o.json"], "{d}/none.json: cannot read: No such file"),
            ({"s.json": "[1]"}, [scale, "{d}/s.json", "--out", "{d}/o.json"],
             "(the whole file): [1] is not allowed; allowed: a sweep object"),
            ({"s.json": '{"name": "s"}'}, [scale, "{d}/s.json", "--out", "{d}/o.json"],
             "base: null is not allowed; allowed: the path of the base config"),
            ({"s.json": '{"name": "s", "base": "b", "set": {"train.tokens": 9}, "grid": {"log.diag_every": 5}}'},
             [scale, "{d}/s.json", "--out", "{d}/o.json", "--tokens", "90"],
             "grid.log.diag_every: 5 is not allowed; allowed: a list of values"),
            ({"s.json": sweep}, [scale, "{d}/s.json", "--out", "{d}/o.json", "--seeds", "1,1"],
             "--seeds '1,1' is not allowed; allowed: distinct integers"),
            ({"s.json": sweep}, [scale, "{d}/s.json", "--out", "{d}/o.json", "--seeds", ""], "--seeds '' is not"),
            ({"s.json": sweep, "file": ""}, [scale, "{d}/s.json", "--out", "{d}/file/o.json"],
             "cannot write: {d}/file is a file, not a folder"),
        ):
            with self.subTest(message):
                self.check(files, args, message)

    def test_gpt2_ledger(self):
        ledger = os.path.join(TOOLS, "dev", "gpt2_ledger.py")
        config = {"model": {"layers": 2, "heads": 2, "dim": 128, "seq_len": 256, "vocab": 300},
                  "train": {"tokens_per_step": 4096, "micro_batch": 4}}
        good = {"c.json": json.dumps(config)}
        for files, args, message in (
            ({}, [ledger, "{d}/none.json"], "{d}/none.json: cannot read: No such file"),
            ({"c.json": "{"}, [ledger, "{d}/c.json"], "{d}/c.json: not JSON"),
            ({"c.json": '{"model": {}}'}, [ledger, "{d}/c.json"], "{d}/c.json: needs a 'model' and a 'train' object"),
            ({"c.json": json.dumps({**config, "model": {**config["model"], "heads": 0}})}, [ledger, "{d}/c.json"],
             "{d}/c.json: model.heads 0 is not allowed; allowed: a positive integer"),
            (good, [ledger, "{d}/c.json", "--micro-batch", "3"],
             "{d}/c.json: train.tokens_per_step 4096 is not a whole number of micro-batches of 3 x 256 tokens"),
            (good, [ledger, "{d}/c.json", "--micro-batch", "0"], "--micro-batch 0 is not allowed"),
            (good, [ledger, "{d}/c.json", "--tokens-per-s", "fpa"],
             "--tokens-per-s 'fpa' is not allowed; allowed: NAME=NUMBER with NUMBER > 0"),
            (good, [ledger, "{d}/c.json", "--tokens-per-s", "sage=5"], "--tokens-per-s: fpa=VALUE is needed"),
            (good, [ledger, "{d}/c.json", "--tokens-per-s", "fpa=5", "--call-ms", "sage=1"],
             "--call-ms sage: no --tokens-per-s sage=VALUE to set it against"),
        ):
            with self.subTest(message):
                self.check(files, args, message)


class Reproduce(unittest.TestCase):
    def run_script(self, d, *args):
        """tools/reproduce.sh in a copy of the repository under d, with a qattn
        whose sweep refuses (no data, as with --no-data and data never
        prepared) and whose --summary succeeds."""
        root = os.path.join(d, "repo")
        shutil.copytree(TOOLS, os.path.join(root, "tools"), ignore=shutil.ignore_patterns("__pycache__", "dev"))
        shutil.copytree(os.path.join(ROOT, "configs"), os.path.join(root, "configs"))
        fake = os.path.join(d, "qattn")
        with open(fake, "w") as f:
            f.write('#!/bin/sh\nfor a in "$@"; do [ "$a" = --summary ] && exit 0; done\n'
                    'echo "qattn: no shard matches data/cache/pycode/pycode_train_*.bin" >&2\nexit 2\n')
        os.chmod(fake, 0o755)
        return subprocess.run(["bash", os.path.join(root, "tools", "reproduce.sh"), *args], cwd=root,
                              capture_output=True, text=True, env={**os.environ, "QATTN_BIN": fake})

    def test_a_sweep_refused_whole_stops_the_script(self):
        """qattn sweep exits 2 when it refuses the sweep before starting a run.
        The script went on to an empty summary and plots and exited 0."""
        with tempfile.TemporaryDirectory() as d:
            r = self.run_script(d, "kinterval", "--no-data")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("reproduce.sh: qattn sweep refused runs/repro/kinterval_small.seed1.json (exit 2; its "
                          "message is above): no run started", r.stderr)
            self.assertNotIn("summary:", r.stdout)

    def test_summary_only_rebuilds_a_results_folder_without_training(self):
        """--summary-only restores the kept runs, writes the summary (qattn's
        --summary) and copies the outputs back; no data (the copy has no
        data/prepare.sh), no sweep run."""
        with tempfile.TemporaryDirectory() as d:
            store = os.path.join(d, "repo", "docs", "results", "kinterval_small")
            fake_run(os.path.join(store, "runs", "a"), "finished")
            r = self.run_script(d, "kinterval", "--results", "docs/results/kinterval_small", "--summary-only")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("restored 1 finished runs from docs/results/kinterval_small", r.stdout)
            self.assertIn("kept 1 finished runs in docs/results/kinterval_small (0 new)", r.stdout)
            self.assertNotIn("refused", r.stderr)  # the fake qattn refuses every sweep it is asked to run

    def test_the_first_visit_has_no_kept_runs(self):
        """--results naming a folder with no runs kept yet (a grid's first
        visit) starts the grid; it stopped with 'restoring ... failed'."""
        with tempfile.TemporaryDirectory() as d:
            r = self.run_script(d, "sagebwd", "--no-data", "--one-pass", "--results", "docs/results/sagebwd_new")
            self.assertIn("no finished runs kept in docs/results/sagebwd_new yet", r.stdout + r.stderr)
            self.assertNotIn("restoring", r.stderr)
            self.assertIn("qattn sweep refused", r.stderr)


if __name__ == "__main__":
    unittest.main()
