#!/usr/bin/env python3
"""Time transformers' own greedy generate on a DiffLlama checkpoint, on the CPU or a GPU.

The peer for difftx's decode-speed comparison: Hugging Face transformers'
DiffLlamaForCausalLM.generate (greedy, do_sample=False, its default KV cache),
batch 1 (or --batch B prompts of the same length at once), on a checkpoint folder
(e.g. one written by tools/make_big_checkpoint.py):

    python3 benchmarks/peer_transformers_generate.py --model /work/big_ckpt --dtype float32 \\
        --threads 16 --prompt-tokens 128 --new-tokens 64 --repeats 5 [--attn sdpa|eager]

Prints the prefill time (ms), the decode speed (new tokens per second over the
batch, prefill excluded) and, last, one JSON line with every number and setting.

How prefill is separated from decoding: each repeat times generate(max_new_tokens=1)
and generate(max_new_tokens=K) on the same prompt. generate with one new token runs
exactly one forward, over the prompt, and picks its token from the prompt's last
logits: that is the prefill (with generate's fixed overhead: input checks, cache
creation, logits processing). generate with K new tokens runs the same prefill and
then K - 1 cached decode steps (each a forward of one token plus the greedy pick and
the cache update). So decode time = median(t_K) - median(t_1) over the repeats, and
decode speed = (K - 1) / that; generate's fixed overhead cancels. A streamer would
time the same steps but adds a Python callback per token to what is measured; the
difference of two plain generate calls measures generate exactly as users call it.
EOS is switched off (generation_config.eos_token_id = None) so that every call
produces exactly the tokens asked for; this is checked.

Device: --device cpu (the default) or cuda (the model and prompt moved to the
GPU; each generate call ends with torch.cuda.synchronize() before its clock
stops, so the times include all its GPU work).

Attention: --attn sdpa (the default, transformers' default on CPU: two
torch.nn.functional.scaled_dot_product_attention calls per layer in DiffLlama) or
eager (matmul + softmax, the implementation the fixtures use). The prompt is
--prompt-tokens ids drawn with a fixed seed from [3, V). Threads: torch.set_num_threads
(--threads) and torch.set_num_interop_threads(1). One untimed warm-up generate(K)
runs first. Needs torch and transformers (tested with torch 2.15.0, transformers 5.23.0).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a DiffLlama checkpoint folder")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1, help="prompts generated at once (all --prompt-tokens long)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    if a.new_tokens < 2 or a.prompt_tokens < 1 or a.repeats < 1 or a.batch < 1:
        sys.exit("peer_transformers_generate: needs --new-tokens >= 2, --prompt-tokens >= 1, --repeats >= 1, --batch >= 1")

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers
    from transformers import DiffLlamaForCausalLM
    transformers.utils.logging.disable_progress_bar()

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    t0 = time.perf_counter()
    model = DiffLlamaForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation=a.attn).eval().to(a.device)
    load_s = time.perf_counter() - t0
    model.generation_config.eos_token_id = None
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())

    gen = torch.Generator().manual_seed(a.seed)
    prompt = torch.randint(3, cfg.vocab_size, (a.batch, a.prompt_tokens), generator=gen).to(a.device)
    mask = torch.ones_like(prompt)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def run(k):
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(prompt, attention_mask=mask, max_new_tokens=k, do_sample=False, pad_token_id=0)
        sync()
        t = time.perf_counter() - t
        if out.shape[1] != a.prompt_tokens + k:
            sys.exit(f"peer_transformers_generate: generate gave {out.shape[1] - a.prompt_tokens} new tokens, not {k}")
        return t

    run(a.new_tokens)  # warm-up
    t1, tk = [], []
    for _ in range(a.repeats):
        t1.append(run(1))
        tk.append(run(a.new_tokens))
    prefill = statistics.median(t1)
    decode = statistics.median(tk) - prefill
    steps = a.new_tokens - 1
    tok_s = a.batch * steps / decode if decode > 0 else float("inf")

    where = torch.cuda.get_device_name() if a.device == "cuda" else f"{a.threads} threads"
    print(f"model {a.model}: {params / 1e6:.1f}M parameters, {a.dtype}, attn {a.attn}, {where}, batch {a.batch}")
    print(f"prefill ({a.batch} x {a.prompt_tokens} tokens): {prefill * 1e3:.1f} ms (median of {a.repeats})")
    print(f"decode ({steps} steps after the first token): {decode / steps * 1e3:.2f} ms/step, {tok_s:.2f} tokens/s")
    row = {"peer": "transformers.generate", "model": os.path.abspath(a.model), "parameters": params,
           "dtype": a.dtype, "attn_implementation": a.attn, "device": where, "threads": a.threads,
           "batch": a.batch, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens, "repeats": a.repeats,
           "prefill_ms": prefill * 1e3, "decode_ms_per_token": decode / steps * 1e3, "decode_tokens_per_s": tok_s,
           "t_generate_1_s": t1, "t_generate_k_s": tk, "load_s": load_s,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "machine": platform.machine(), "processor": platform.processor(), "cpus": os.cpu_count()}
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
