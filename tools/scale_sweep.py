#!/usr/bin/env python3
"""Writes a copy of a sweep file at another token budget, or with fewer seeds.

    tools/scale_sweep.py SWEEP.json --out NEW.json [--tokens N] [--seeds 1,2] [--set PATH=VALUE]...

--tokens N sets train.tokens of every run to N. The warmup and the evaluation
interval stay as the sweep gives them, in steps (docs/reproducing.md: a warmup
scaled down with the budget changes the run, not only its length); the
diagnostics and checkpoint intervals (log.diag_every, train.checkpoint_every,
in "set", "grid" and "zip") are multiplied by N / (the sweep's own
train.tokens), so a run still takes as many of them. The sweep's name gets the
budget appended (kinterval_small -> kinterval_small_16M), so runs of different
budgets never share a folder: the budget in the largest of M (10^6), Mi (2^20),
k (10^3) and Ki (2^10) that divides it, else in tokens, so that a label names
one budget (31,457,280 tokens is 30Mi; 31,000,000 is 31M). --seeds keeps only the given
seeds (same name, same run ids: a later run of the full sweep skips them).
--set PATH=VALUE adds an override to the sweep's "set" (VALUE parsed as JSON,
a bare word is a string; the grid and zip still win for the keys they vary),
and the name gets "_set-" and a hash of the overrides appended.
"base" becomes an absolute path, so NEW.json may live anywhere.
The sweep must give train.tokens in its "set" when --tokens is used.
"""
import argparse
import hashlib
import json
import os
import re
import sys

# Step counts that scale with the budget. train.warmup and eval.every do not:
# the protocol fixes them in steps.
SCALED_STEP_KEYS = ("log.diag_every", "train.checkpoint_every")


def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"scale_sweep.py: {path}: cannot read: {getattr(e, 'strerror', None) or e}")
    # qattn reads sweep files with // comments; the ones here are whole lines.
    text = re.sub(r"(?m)^\s*//.*$", "", text)
    try:
        s = json.loads(text)
    except json.JSONDecodeError as e:
        sys.exit(f"scale_sweep.py: {path}: not valid JSON after removing // comment lines: {e}")
    check_shape(s, path)
    return s


def check_shape(s, path):
    """The parts of a sweep file this tool reads have the types `qattn sweep`
    requires (docs/runs.md); it checks the rest when it runs NEW.json."""
    def refuse(where, value, allowed):
        text = json.dumps(value)
        text = text if len(text) <= 60 else text[:57] + "..."
        sys.exit(f"scale_sweep.py: {path}: {where}: {text} is not allowed; allowed: {allowed}")

    if not isinstance(s, dict):
        refuse("(the whole file)", s, "a sweep object")
    if not isinstance(s.get("name"), str) or not s["name"]:
        refuse("name", s.get("name"), "a non-empty string")
    if not isinstance(s.get("base"), str):
        refuse("base", s.get("base"), "the path of the base config, a string")
    if not isinstance(s.get("set", {}), dict):
        refuse("set", s["set"], "an object of json.path: value")
    if not isinstance(s.get("grid", {}), dict):
        refuse("grid", s["grid"], "an object of json.path: [values]")
    for key, values in s.get("grid", {}).items():
        if not isinstance(values, list):
            refuse(f"grid.{key}", values, "a list of values")
    if not isinstance(s.get("zip", []), list):
        refuse("zip", s["zip"], "a list of objects of json.path: [values]")
    for g, group in enumerate(s.get("zip", [])):
        if not isinstance(group, dict):
            refuse(f"zip[{g}]", group, "an object of json.path: [values]")
        for key, values in group.items():
            if not isinstance(values, list):
                refuse(f"zip[{g}].{key}", values, "a list of values")
    seeds = s.get("seeds", [])
    if not isinstance(seeds, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        refuse("seeds", seeds, "a list of integers")


# Units of a budget label, tried in order; a label names one count because its
# unit divides that count exactly (a rounded "31M" would name 31,000,000 and
# 31,457,280 alike, and their runs would share a folder).
BUDGET_UNITS = (("M", 10**6), ("Mi", 2**20), ("k", 10**3), ("Ki", 2**10))


def budget_label(tokens):
    for suffix, unit in BUDGET_UNITS:
        if tokens % unit == 0:
            return f"{tokens // unit}{suffix}"
    return str(tokens)


def scaled(value, factor, where):
    if not isinstance(value, int) or value < 0:
        sys.exit(f"scale_sweep.py: {where}: {value!r} is not a step count (an integer >= 0)")
    return 0 if value == 0 else max(1, round(value * factor))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep")
    p.add_argument("--out", required=True, help="the new sweep file")
    p.add_argument("--tokens", type=int, help="train.tokens of every run")
    p.add_argument("--seeds", help="comma-separated subset of the sweep's seeds")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="override for every run")
    a = p.parse_args()
    s = load(a.sweep)
    s["base"] = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(a.sweep)), s["base"]))
    if a.tokens is not None:
        old = s.get("set", {}).get("train.tokens")
        if not isinstance(old, int) or old <= 0:
            sys.exit(f"scale_sweep.py: {a.sweep}: set.train.tokens is missing; --tokens needs it to scale the step counts")
        if a.tokens <= 0:
            sys.exit(f"scale_sweep.py: --tokens {a.tokens}: allowed: a positive token count")
        factor = a.tokens / old
        s["set"]["train.tokens"] = a.tokens
        for key in SCALED_STEP_KEYS:
            if key in s["set"]:
                s["set"][key] = scaled(s["set"][key], factor, f"set.{key}")
            if key in s.get("grid", {}):
                s["grid"][key] = [scaled(v, factor, f"grid.{key}") for v in s["grid"][key]]
            for g, group in enumerate(s.get("zip", [])):
                if key in group:
                    group[key] = [scaled(v, factor, f"zip[{g}].{key}") for v in group[key]]
        s["name"] = f"{s['name']}_{budget_label(a.tokens)}"
    if a.set:
        extra = {}
        for assignment in a.set:
            path, eq, value = assignment.partition("=")
            if not eq or not path:
                sys.exit(f"scale_sweep.py: --set {assignment!r}: allowed: PATH=VALUE, e.g. train.device=cpu")
            try:
                extra[path] = json.loads(value)
            except json.JSONDecodeError:
                extra[path] = value
        s.setdefault("set", {}).update(extra)
        digest = hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()[:8]
        s["name"] = f"{s['name']}_set-{digest}"
    if a.seeds is not None:
        parts = a.seeds.split(",")
        if not all(x.strip().lstrip("-").isdigit() for x in parts) or len(set(map(int, parts))) != len(parts):
            sys.exit(f"scale_sweep.py: --seeds {a.seeds!r} is not allowed; allowed: distinct integers separated "
                     "by commas, e.g. 1,2")
        wanted = [int(x) for x in parts]
        missing = [x for x in wanted if x not in s.get("seeds", [])]
        if missing:
            sys.exit(f"scale_sweep.py: --seeds {a.seeds}: {missing} not among the sweep's seeds {s.get('seeds')}")
        s["seeds"] = wanted
    try:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(s, f, indent=2)
            f.write("\n")
    except FileExistsError as e:  # makedirs met a file where the path needs a folder
        sys.exit(f"scale_sweep.py: --out {a.out}: cannot write: {e.filename} is a file, not a folder")
    except OSError as e:
        sys.exit(f"scale_sweep.py: --out {a.out}: cannot write: {e.strerror}")
    print(s["name"])


if __name__ == "__main__":
    main()
