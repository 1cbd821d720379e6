#!/usr/bin/env python3
"""Checks the documentation against the tree; CTest runs it from the repository root.

- Every relative link in README.md and docs/**/*.md resolves to a file or
  folder of the repository (a #fragment after a path is not checked).
- Every ```cpp block of README.md and docs/**/*.md is compiled: each of its
  lines (trimmed) is a line of one file under examples/ or docs/guide/snippets/,
  which examples/CMakeLists.txt builds and CTest runs.
- The README's install command lists exactly the packages .ci/run installs.

    python3 tools/check_docs.py        # prints each problem; exit 1 if any
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def links(problems):
    for page in pages():
        text = re.sub(r"```.*?```", "", open(page, encoding="utf-8").read(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if not os.path.exists(path):
                problems.append(f"{os.path.relpath(page, ROOT)}: the link '{target}' resolves to nothing")


def code_blocks(problems):
    sources = glob.glob(os.path.join(ROOT, "examples", "*.cpp")) + glob.glob(
        os.path.join(ROOT, "docs", "guide", "snippets", "*.cpp"))
    compiled = set()
    for s in sources:
        compiled.update(line.strip() for line in open(s, encoding="utf-8"))
    for page in pages():
        text = open(page, encoding="utf-8").read()
        for block in re.findall(r"```cpp\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                if line.strip() and line.strip() not in compiled:
                    problems.append(f"{os.path.relpath(page, ROOT)}: a C++ line no snippet compiles: {line.strip()}")


def packages(problems):
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    listed = re.search(r"packages=\((.*?)\)", ci, flags=re.S)
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    install = re.search(r"apt-get install -y --no-install-recommends ([^&]*)&&", readme)
    if not listed or not install:
        problems.append("README.md or .ci/run: no package list found (packages=(...) / apt-get install -y --no-install-recommends)")
        return
    ours, theirs = install.group(1).split(), listed.group(1).split()
    if sorted(ours) != sorted(theirs):
        problems.append(f"README.md installs {' '.join(ours)}; .ci/run installs {' '.join(theirs)}")


def main():
    problems = []
    links(problems)
    code_blocks(problems)
    packages(problems)
    for p in problems:
        print(p)
    print(f"check_docs: {len(pages())} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
