#!/usr/bin/env python3
"""Write a random-weight Hugging Face DiffLlama checkpoint folder, for timing.

The folder is what transformers' DiffLlamaForCausalLM.from_pretrained reads:
config.json (transformers 5 style: rope_parameters, dtype), generation_config.json,
and the weights under transformers' names, in safetensors shards of at most
--shard-gb GB (model-0000i-of-0000n.safetensors with model.safetensors.index.json;
a single model.safetensors when everything fits in one). The tensors are drawn
and written one shard at a time, with the safetensors package: no model is built
in PyTorch, and peak memory is about one shard (plus one tensor in float32 when
--dtype bfloat16).

Weights (seeded, --seed): every matrix N(0, 0.02^2) (transformers' initializer_range
default), lambda_q1/k1/q2/k2 N(0, 0.1^2) (lambda_std_dev), RMSNorm weights 1. The
model computes nothing meaningful; it is for decode-speed comparisons
(benchmarks/peer_transformers_generate.py) and for difftx's reader at scale.

The default is a ~1.16B-parameter model: C 2048, 20 layers, 16 heads, 16 kv
heads (head_dim 128), intermediate 5632, vocabulary 32000, untied: 4.6 GB in
float32, 2.3 GB in bfloat16. Keep the output outside the repository:

    python3 tools/make_big_checkpoint.py --out /work/big_ckpt [--dtype bfloat16]
    python3 tools/make_big_checkpoint.py --out /tmp/tiny --layers 2 --hidden 64 --heads 4 \\
        --kv-heads 2 --intermediate 96 --vocab 128 --verify

Needs torch and safetensors; --verify (loads the folder with transformers, checks
that no weight is missing or unexpected and runs a forward) needs transformers.
DiffLlama requires an even number of kv heads (at least 2) dividing the heads.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
from safetensors.torch import save_file

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def plan(a):
    """[(name, shape, init)] in the order written."""
    C, hd, F = a.hidden, a.head_dim, a.intermediate
    out = [("model.embed_tokens.weight", (a.vocab, C), "matrix")]
    for l in range(a.layers):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,), "norm"),
                (p + "self_attn.q_proj.weight", (a.heads * hd, C), "matrix"),
                (p + "self_attn.k_proj.weight", (a.kv_heads * hd, C), "matrix"),
                (p + "self_attn.v_proj.weight", (a.kv_heads * hd, C), "matrix"),
                (p + "self_attn.o_proj.weight", (C, a.heads * hd), "matrix")]
        out += [(p + f"self_attn.lambda_{x}", (hd,), "lambda") for x in ("q1", "k1", "q2", "k2")]
        out += [(p + "post_attention_layernorm.weight", (C,), "norm"),
                (p + "mlp.gate_proj.weight", (F, C), "matrix"),
                (p + "mlp.up_proj.weight", (F, C), "matrix"),
                (p + "mlp.down_proj.weight", (C, F), "matrix")]
    out.append(("model.norm.weight", (C,), "norm"))
    if not a.tie:
        out.append(("lm_head.weight", (a.vocab, C), "matrix"))
    return out


LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # as the public llama3-RoPE DiffLlama folders


def config_json(a):
    rope = dict(LLAMA3) if a.rope_type == "llama3" else {"rope_type": "default"}
    config = {
        "architectures": ["DiffLlamaForCausalLM"], "model_type": "diffllama",
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim, "hidden_act": "silu", "max_position_embeddings": a.max_positions,
        "initializer_range": 0.02, "rms_norm_eps": a.eps, "use_cache": True, "pad_token_id": None,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": a.tie,
        "rope_parameters": dict(rope, rope_theta=a.rope_theta),
        "attention_bias": False, "attention_dropout": 0.0, "lambda_std_dev": 0.1, "dtype": a.dtype,
    }
    if a.legacy_config:  # transformers 4.x's keys: top-level rope_theta, rope_scaling, torch_dtype
        del config["rope_parameters"], config["dtype"]
        config.update(rope_theta=a.rope_theta, rope_scaling=rope if a.rope_type != "default" else None,
                      torch_dtype=a.dtype)
    return config


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (created; must be empty or absent)")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, help="default hidden / heads")
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--tie", action="store_true", help="tie_word_embeddings (no lm_head.weight)")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rope-type", choices=["default", "llama3"], default="default",
                    help="llama3: factor 32, low 1, high 4, original context 8192, as the public folders")
    ap.add_argument("--legacy-config", action="store_true",
                    help="config.json in transformers 4.x keys (top-level rope_theta and rope_scaling)")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--max-positions", type=int, default=4096)
    ap.add_argument("--shard-gb", type=float, default=2.0, help="largest shard, in GB (10^9 bytes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--verify", action="store_true", help="load it with transformers afterwards (small models!)")
    a = ap.parse_args()
    a.head_dim = a.head_dim or a.hidden // a.heads
    if a.kv_heads < 2 or a.kv_heads % 2 or a.heads % a.kv_heads:
        sys.exit("make_big_checkpoint: DiffLlama needs an even number of kv heads (>= 2) dividing the heads")
    if a.head_dim % 2:
        sys.exit("make_big_checkpoint: head_dim must be even (RoPE)")
    if os.path.isdir(a.out) and os.listdir(a.out):
        sys.exit(f"make_big_checkpoint: {a.out} is not empty")
    torch.set_num_threads(a.threads)
    dtype = DTYPES[a.dtype]
    esize = torch.empty((), dtype=dtype).element_size()  # (torch.dtype.itemsize is torch >= 2.1; Debian's is 1.13)

    # Assign tensors to shards in order, a new shard when the next tensor would pass the limit.
    tensors, limit = plan(a), int(a.shard_gb * 1e9)
    shards, size = [[]], 0
    for t in tensors:
        nbytes = math.prod(t[1]) * esize
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])

    os.makedirs(a.out, exist_ok=True)
    gen = torch.Generator().manual_seed(a.seed)
    weight_map, total_bytes, total_params, t0 = {}, 0, 0, time.time()
    for fname, shard in zip(names, shards):
        data = {}
        for name, shape, init in shard:
            if init == "norm":
                w = torch.ones(shape, dtype=dtype)
            else:
                std = 0.1 if init == "lambda" else 0.02
                w = torch.randn(shape, generator=gen, dtype=torch.float32).mul_(std).to(dtype)
            data[name] = w
            weight_map[name] = fname
            total_bytes += w.numel() * esize
            total_params += w.numel()
        save_file(data, os.path.join(a.out, fname), metadata={"format": "pt"})
        del data
        print(f"{fname}: {len(shard)} tensors, {os.path.getsize(os.path.join(a.out, fname)) / 1e9:.2f} GB "
              f"({time.time() - t0:.0f} s)", flush=True)
    if len(names) > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_parameters": total_params, "total_size": total_bytes},
                       "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
            f.write("\n")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config_json(a), f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f, indent=2)
        f.write("\n")
    print(f"{a.out}: {total_params / 1e9:.3f}B parameters, {total_bytes / 1e9:.2f} GB in {len(names)} file(s), "
          f"{time.time() - t0:.0f} s")

    if a.verify:
        from transformers import DiffLlamaForCausalLM
        model, info = DiffLlamaForCausalLM.from_pretrained(a.out, dtype=dtype, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        if bad:
            sys.exit(f"make_big_checkpoint: transformers' loading info: {bad}")
        n = sum(p.numel() for p in model.parameters())
        if n != total_params:
            sys.exit(f"make_big_checkpoint: the model has {n} parameters, the files {total_params}")
        with torch.no_grad():
            logits = model(torch.tensor([[1, 5, 7, a.vocab - 1]])).logits
        if not torch.isfinite(logits).all():
            sys.exit("make_big_checkpoint: non-finite logits")
        print(f"verify: transformers loads it ({n} parameters, nothing missing or unexpected), logits "
              f"{tuple(logits.shape)} finite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
