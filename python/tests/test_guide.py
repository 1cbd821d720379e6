"""docs/guide/pytorch.md's Python blocks run as written, in order, in one namespace."""

import os
import re

import pytest

GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guide", "pytorch.md")


def test_the_guide_runs():
    pytest.importorskip("transformers")
    blocks = re.findall(r"```python\n(.*?)```", open(GUIDE, encoding="utf-8").read(), flags=re.S)
    assert blocks
    namespace = {}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{GUIDE} (block {number})", "exec"), namespace)
