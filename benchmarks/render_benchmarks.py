#!/usr/bin/env python3
"""Write docs/benchmarks.md from benchmarks/results/*.json.

Each results file answers one question (benchmarks/collect_cpu.py writes the
CPU ones from benchmarks/measure_cpu.sh's runs; gpu.json holds a GPU run):

  {"question": title, "order": position on the page,
   "machine": the CPU or GPU, "date": "YYYY-MM-DD", "quiet": "yes" | "no" | "unchecked" | "n/a",
   "reproduce": the one command that measures it again,
   "tables": [{"caption", "columns": [...], "rows": [[...]], "commands": [what reproduce runs]}],
   "reading": one paragraph}

    python3 benchmarks/render_benchmarks.py            # writes docs/benchmarks.md
    python3 benchmarks/render_benchmarks.py --check    # exit 1 if docs/benchmarks.md is not what it would write
"""

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = ("question", "order", "machine", "date", "reproduce", "tables", "reading")

HEADER = """# Benchmarks

What difftx's speed is, one section per question, on the machine and date each
section names. This page is generated: `benchmarks/measure_cpu.sh` measures
the CPU sections and writes `benchmarks/results/<question>.json`, and
`python3 benchmarks/render_benchmarks.py` writes this page from those files.
Do not edit it by hand; measure again instead (`benchmarks/measure_cpu.sh
QUESTION` for one section). Earlier measurements are in the history of this
file and of `benchmarks/results/`.

Timings depend on the machine: compare ratios measured together, not figures
from different sections. Every CPU contender gets the same threads.
"""


def anchor(title):
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def cell(value):
    return str(value).replace("|", "\\|")


def render(results):
    out = [HEADER]
    for r in results:
        out.append(f"- [{r['question']}](#{anchor(r['question'])})")
    out.append("")
    for r in results:
        out += [f"## {r['question']}", "", f"Measured {r['date']} on {r['machine']}.", "",
                f"Reproduce: `{r['reproduce']}`", ""]
        for t in r["tables"]:
            out += [t["caption"], ""]
            out.append("| " + " | ".join(cell(c) for c in t["columns"]) + " |")
            align = ["---" if i == 0 or not _numeric(t["rows"], i) else "--:" for i in range(len(t["columns"]))]
            out.append("|" + "|".join(align) + "|")
            out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t["rows"]]
            out.append("")
            if t.get("commands"):
                out += ["<details><summary>Commands</summary>", "", "```sh"] + t["commands"] + ["```", "", "</details>", ""]
        out += [r["reading"], ""]
    return "\n".join(out).rstrip() + "\n"


def _numeric(rows, i):
    cells = [str(row[i]) for row in rows if i < len(row)]
    return cells and all(re.match(r"^[-+0-9.,x%–— ]+$|^n/a$|^not (run|built)$", c) for c in cells)


def load(folder):
    results = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            r = json.load(f)
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            sys.exit(f"render_benchmarks: {path} lacks {', '.join(missing)}")
        for t in r["tables"]:
            if any(len(row) != len(t["columns"]) for row in t["rows"]):
                sys.exit(f"render_benchmarks: {path}: a row of '{t['caption'][:40]}...' does not have "
                         f"{len(t['columns'])} cells")
        results.append(r)
    if not results:
        sys.exit(f"render_benchmarks: no results in {folder}")
    return sorted(results, key=lambda r: r["order"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args()
    text = render(load(a.results))
    if a.check:
        with open(a.out, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{a.out} is not generated from {a.results}: run python3 benchmarks/render_benchmarks.py")
        return
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
