#!/usr/bin/env python3
"""Keeps a sweep's finished runs in a compact folder that lives in the repository,
so that a grid too long for one machine accumulates over several.

    tools/results_store.py keep SWEEP_DIR STORE       finished runs -> STORE
    tools/results_store.py restore STORE SWEEP_DIR    STORE -> SWEEP_DIR (skipped by `qattn sweep`)
    tools/results_store.py longest SWEEP_DIR DEFAULT  seconds to plan for one run

keep copies, for every run of SWEEP_DIR whose status.json says finished or
diverged, the files that describe it (status.json, metrics.csv, diag.csv,
config.json; no checkpoints) to STORE/runs/<run id>/, and the sweep's
summary.md, summary.csv, diag.md, gap_curve.md and plots to STORE/. restore copies them back
into SWEEP_DIR/<run id>/ where that run has not finished there: `qattn sweep`
then skips it, and its summary and tools/plot.py cover it like a run made on
this machine. Runs that did not finish are never kept: they are rerun from
the start on the next machine. longest prints the longest wall time of a
finished run (plus 15%, for the variation between machines), or DEFAULT when
none has finished, for `tools/reproduce.sh --deadline`.
"""
import json
import math
import os
import shutil
import sys

RUN_FILES = ("status.json", "metrics.csv", "diag.csv", "config.json")
SWEEP_FILES = ("summary.md", "summary.csv", "diag.md", "gap_curve.md", "loss.png", "loss_gap.png",
               "loss_diag.png")
DONE = ("finished", "diverged")


def status_of(run_dir):
    """The run's status.json as a dict ({} when missing or unreadable)."""
    try:
        with open(os.path.join(run_dir, "status.json")) as f:
            status = json.load(f)
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def run_dirs(folder):
    if not os.path.isdir(folder):
        return []
    return sorted(d for d in os.listdir(folder) if os.path.isfile(os.path.join(folder, d, "status.json")))


def copy_run(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in RUN_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def keep(sweep_dir, store):
    if not os.path.isdir(sweep_dir):
        sys.exit(f"results_store.py keep: {sweep_dir}: not a directory; allowed: a sweep directory of `qattn sweep`")
    if os.path.isdir(store) and os.path.samefile(sweep_dir, store):
        sys.exit(f"results_store.py keep: STORE {store} is SWEEP_DIR {sweep_dir}; allowed: another folder (the "
                 "sweep's files would be copied onto themselves)")
    if not os.path.exists(store):  # made even when no run has finished yet: the summary and plots go there too
        os.makedirs(store)
    kept = new = 0
    for run in run_dirs(sweep_dir):
        src = os.path.join(sweep_dir, run)
        if status_of(src).get("status") not in DONE:
            continue
        dst = os.path.join(store, "runs", run)
        new += not os.path.isdir(dst)
        copy_run(src, dst)
        kept += 1
    for name in SWEEP_FILES:
        if os.path.isfile(os.path.join(sweep_dir, name)):
            shutil.copyfile(os.path.join(sweep_dir, name), os.path.join(store, name))
    return f"kept {kept} finished runs in {store} ({new} new)"


def restore(store, sweep_dir):
    restored = 0
    runs = os.path.join(store, "runs")
    if not os.path.isdir(runs):
        sys.exit(f"results_store.py restore: {runs}: not a directory; allowed: a STORE written by "
                 "`results_store.py keep`")
    for run in run_dirs(runs):
        src, dst = os.path.join(runs, run), os.path.join(sweep_dir, run)
        if status_of(src).get("status") not in DONE:
            sys.exit(f"results_store.py: {src}/status.json: status {status_of(src).get('status')!r}; "
                     f"a store holds only {' or '.join(DONE)} runs")
        if status_of(dst).get("status") in DONE:
            continue
        if os.path.isdir(dst):  # a run begun here: the stored, finished one replaces it
            shutil.rmtree(dst)
        copy_run(src, dst)
        restored += 1
    return f"restored {restored} finished runs from {store}"


def longest(sweep_dir, default):
    statuses = [status_of(os.path.join(sweep_dir, r)) for r in run_dirs(sweep_dir)]
    times = [s.get("wall_seconds") for s in statuses if s.get("status") == "finished"]
    times = [t for t in times if isinstance(t, (int, float)) and t > 0]
    return str(math.ceil(max(times) * 1.15)) if times else default


def main(argv):
    usage = __doc__.split("\n\n")[1]
    if len(argv) != 4 or argv[1] not in ("keep", "restore", "longest"):
        sys.exit("usage:\n" + usage)
    verb, a, b = argv[1:]
    if verb == "longest":
        if not b.isdigit():
            sys.exit(f"results_store.py longest: DEFAULT {b!r} is not allowed; allowed: whole seconds")
        print(longest(a, b))
    else:
        try:
            print(keep(a, b) if verb == "keep" else restore(a, b))
        except OSError as e:  # a STORE or SWEEP_DIR path through a file, a full disk, ...
            sys.exit(f"results_store.py {verb}: {e.filename}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv)
