#!/usr/bin/env python3
"""Check `difftx run` and `difftx generate` on any DiffLlama folder against transformers.

For a folder transformers' DiffLlamaForCausalLM loads (a public checkpoint, or one
from tools/make_big_checkpoint.py), on random token ids:
  - logits: `difftx run --model DIR --dtype float64` against transformers in float64
    (eager attention), and `--dtype float32` against transformers in float32, as
    max |a - b| / max |b| with the bars of tests/checkpoint_test.cpp (2e-6 and 2e-4);
  - greedy tokens: `difftx generate --model DIR --dtype float64 --ignore-eos`
    against transformers' generate(do_sample=False) in float64.
Prints one line per check and exits 1 if any fails.

    VENV/bin/python tools/check_against_transformers.py --model DIR --difftx build/release/tools/difftx \\
        [--tokens 2x16] [--new-tokens 16] [--seed 0]

VENV: torch and transformers from PyPI (tools/make_fixtures.py names the versions).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DiffLlamaForCausalLM  # noqa: E402

BARS = {"float64": 2e-6, "float32": 2e-4}


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def difftx(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{binary} {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--difftx", required=True)
    ap.add_argument("--tokens", default="2x16", help="BxN random token ids for the logits")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    B, N = (int(v) for v in a.tokens.split("x"))

    model = {t: DiffLlamaForCausalLM.from_pretrained(a.model, dtype=getattr(torch, t),
                                                     attn_implementation="eager").eval() for t in BARS}
    V = model["float64"].config.vocab_size
    gen = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, V, (B, N), generator=gen)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        ids = os.path.join(tmp, "ids.npy")
        np.save(ids, tokens.numpy().astype(np.int64))
        for dtype, bar in BARS.items():
            out = os.path.join(tmp, f"logits_{dtype}.npy")
            difftx(a.difftx, "run", "--model", a.model, "--tokens", ids, "--dtype", dtype, "--output", out)
            with torch.no_grad():
                want = model[dtype](input_ids=tokens, use_cache=False).logits.numpy()
            err = rel_err(np.load(out), want)
            ok = err <= bar
            failed += not ok
            print(f"logits {dtype:8s} max|a-b|/max|b| = {err:.2e} (bar {bar:.0e})  {'pass' if ok else 'FAIL'}")
    prompt = tokens[0, :8]
    with torch.no_grad():
        want = model["float64"].generate(prompt[None, :], attention_mask=torch.ones_like(prompt)[None, :],
                                         max_new_tokens=a.new_tokens, do_sample=False,
                                         eos_token_id=None, pad_token_id=0)[0, prompt.numel():].tolist()
    got = json.loads(difftx(a.difftx, "generate", "--model", a.model, "--prompt", ",".join(map(str, prompt.tolist())),
                            "--max-new-tokens", str(a.new_tokens), "--dtype", "float64", "--ignore-eos",
                            "--json").splitlines()[-1])["tokens"]
    ok = got == want
    failed += not ok
    print(f"greedy   {len(want)} tokens {'equal' if ok else 'differ'}: transformers {want} difftx {got}  "
          f"{'pass' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
