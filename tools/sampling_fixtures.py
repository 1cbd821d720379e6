#!/usr/bin/env python3
"""Sampling fixtures: which tokens transformers' warpers keep, and with what probabilities.

For each case, a row of logits goes through transformers' TemperatureLogitsWarper,
TopKLogitsWarper and TopPLogitsWarper in generate's order (each only where it
applies: temperature != 1, top_k > 0, top_p < 1), in float64; the tokens left
with a finite score are the kept set, and softmax over them gives their
probabilities. difftx's token_sampler::distribution must give exactly that set
and those probabilities (tests/generation_test.cpp).

    VENV/bin/python tools/sampling_fixtures.py      # writes tests/data/sampling.json

VENV: torch 2.15.0 and transformers 5.23.0 from PyPI (see tools/make_fixtures.py).
Deterministic: fixed seeds, and the file is written with sorted keys.
"""

import json
import os

import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "data", "sampling.json")

# (vocabulary, temperature, top_k, top_p, how the logits are drawn)
CASES = [
    (8, 1.0, 0, 1.0, "normal"),
    (8, 0.7, 0, 1.0, "normal"),
    (50, 1.3, 5, 1.0, "normal"),
    (50, 1.0, 0, 0.9, "normal"),
    (50, 0.8, 10, 0.7, "normal"),
    (64, 1.0, 3, 1.0, "ties"),        # equal logits at the k-th place: all of them stay
    (64, 0.5, 0, 0.5, "peaked"),      # one dominant token: top-p keeps it alone
    (300, 1.0, 40, 0.95, "normal"),
    (300, 2.0, 0, 0.3, "flat"),
    (5, 1.0, 7, 1.0, "normal"),       # k above the vocabulary: no limit
]


def logits_of(profile, V, gen):
    if profile == "ties":
        x = torch.randint(0, 6, (V,), generator=gen).to(torch.float64)
    elif profile == "peaked":
        x = torch.randn(V, generator=gen, dtype=torch.float64)
        x[V // 3] = 12.0
    elif profile == "flat":
        x = 0.1 * torch.randn(V, generator=gen, dtype=torch.float64)
    else:
        x = 2.0 * torch.randn(V, generator=gen, dtype=torch.float64)
    return x


def main():
    gen = torch.Generator().manual_seed(20261126)
    cases = []
    for V, temperature, top_k, top_p, kind in CASES:
        x = logits_of(kind, V, gen)
        scores = x[None, :].clone()
        ids = torch.zeros((1, 1), dtype=torch.int64)
        if temperature != 1.0:
            scores = TemperatureLogitsWarper(temperature)(ids, scores)
        if top_k > 0:
            scores = TopKLogitsWarper(top_k)(ids, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(ids, scores)
        kept = torch.isfinite(scores[0]).nonzero()[:, 0]
        probs = torch.softmax(scores[0, kept], dim=-1)
        cases.append({"logits": x.tolist(), "temperature": temperature, "top_k": top_k, "top_p": top_p,
                      "kind": kind, "kept": kept.tolist(), "probabilities": probs.tolist()})
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/sampling_fixtures.py", "transformers_warpers":
                   "Temperature, TopK, TopP (generate's order), float64", "cases": cases}, f, sort_keys=True)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases, kept sizes {[len(c['kept']) for c in cases]}")


if __name__ == "__main__":
    main()
