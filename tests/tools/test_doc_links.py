#!/usr/bin/env python3
"""Every relative link of the hand-written docs resolves: README.md,
data/README.md, docs/*.md and docs/results/README.md. A link names a file or
folder that exists, and a #fragment names a heading of the Markdown file it
points into, under the anchor GitHub gives that heading. Links inside code
(fenced blocks and `spans`) are text, not links, and are not checked."""
import glob
import os
import re
import sys
import tempfile
import unicodedata
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The generated files under docs/results/<sweep>/ are the sweep tools' output, not docs.
DOCS = ["README.md", "data/README.md", "docs/*.md", "docs/results/README.md"]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text, blank_code=True):
    """(line number, line) of the text outside fenced code blocks, with every
    `code span` blanked out unless blank_code is False (a span's brackets are
    not a link; a heading's span is part of its anchor)."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        opener = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence:
            if opener and opener.group(1)[0] == fence[0] and len(opener.group(1)) >= len(fence):
                fence = None
            continue
        if opener:
            fence = opener.group(1)
            continue
        yield n, re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line) if blank_code else line


def heading_text(raw):
    """What a heading shows: links as their text, code spans as their content,
    emphasis markers gone."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    parts = re.split(r"(`+)(.+?)\1", text)  # prose, then (ticks, code, prose) per span
    shown = []
    for i, part in enumerate(parts):
        if i % 3 == 0:
            shown.append(re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", part))
        elif i % 3 == 2:
            shown.append(part)
    return "".join(shown)


def slug(heading):
    """GitHub's anchor of a heading: lower case, every character that is not a
    letter, mark, number, connector (_), space or hyphen dropped, spaces as
    hyphens (so "6 layers × 384" keeps both spaces round the dropped ×)."""
    kept = []
    for ch in heading_text(heading).strip().lower():
        if ch in " -" or unicodedata.category(ch)[0] in "LMN" or unicodedata.category(ch) == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path):
    """Every anchor a Markdown file's headings give, repeats numbered as GitHub does."""
    seen, out = {}, set()
    with open(path, encoding="utf-8") as f:
        for _, line in prose_lines(f.read(), blank_code=False):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path, root=ROOT):
    """'file:line: target: why' for each relative link of the file that does not resolve."""
    problems = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    rel = os.path.relpath(path, root)
    for n, line in prose_lines(text):
        for m in LINK.finditer(line):
            target = m.group(1)
            if SCHEME.match(target):
                continue
            file_part, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{rel}:{n}: {target}"
            if not os.path.exists(dest):
                problems.append(f"{where}: {os.path.relpath(dest, root)} does not exist")
            elif fragment:
                if not dest.endswith(".md") or os.path.isdir(dest):
                    problems.append(f"{where}: a #fragment into something that is not a Markdown file")
                elif fragment not in anchors(dest):
                    problems.append(f"{where}: no heading of {os.path.relpath(dest, root)} "
                                    f"has the anchor #{fragment}")
    return problems


def doc_files():
    return sorted({p for pattern in DOCS for p in glob.glob(os.path.join(ROOT, pattern))})


class Slugs(unittest.TestCase):
    def test_github_anchors_of_the_headings_the_docs_link_to(self):
        self.assertEqual(slug("The reproductions' small model (6 layers × 384, vocabulary 50,257)"),
                         "the-reproductions-small-model-6-layers--384-vocabulary-50257")
        self.assertEqual(slug("attention.sage"), "attentionsage")
        self.assertEqual(slug("SageBwd (`sagebwd_*.json`)"), "sagebwd-sagebwd_json")
        self.assertEqual(slug("Speed: why INT8 does not beat bf16 here"), "speed-why-int8-does-not-beat-bf16-here")
        self.assertEqual(slug("4.10 Reference accuracy of ψ and μ_K"), "410-reference-accuracy-of-ψ-and-μ_k")

    def test_repeated_headings_are_numbered(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.md")
            with open(path, "w", encoding="utf-8") as f:
                f.write("# Measured\n\n```\n# not a heading\n```\n\n## Measured\n\n### Measured\n")
            self.assertEqual(anchors(path), {"measured", "measured-1", "measured-2"})


class Checker(unittest.TestCase):
    def test_finds_a_missing_file_a_missing_anchor_and_skips_code(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "b.md"), "w", encoding="utf-8") as f:
                f.write("# Top\n\n## The part\n")
            path = os.path.join(d, "a.md")
            with open(path, "w", encoding="utf-8") as f:
                f.write("[ok](b.md#the-part) [self](#here) [web](https://example.org/x#y)\n\n# Here\n\n"
                        "[gone](c.md) and [stale](b.md#the-old-part)\n"
                        "`[code](nowhere.md)`\n\n```\n[block](nowhere.md)\n```\n")
            problems = broken_links(path, d)
            self.assertEqual(len(problems), 2, problems)
            self.assertIn("a.md:5: c.md: c.md does not exist", problems[0])
            self.assertIn("a.md:5: b.md#the-old-part: no heading of b.md has the anchor #the-old-part", problems[1])


class Docs(unittest.TestCase):
    def test_every_relative_link_and_anchor_resolves(self):
        files = doc_files()
        self.assertGreaterEqual(len(files), 10, files)
        problems = [p for path in files for p in broken_links(path)]
        self.assertEqual(problems, [], "\n" + "\n".join(problems))


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False, verbosity=1).result.wasSuccessful() else 1)
