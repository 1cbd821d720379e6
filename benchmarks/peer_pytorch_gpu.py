#!/usr/bin/env python3
"""difftx's CUDA policy against PyTorch on the same GPU, in one run.

At the paper's shapes (C = 3072, h = 12, D = 128 at N = 2048 and 4096;
C = 5120, h = 20, D = 128 at N = 2048), bfloat16, causal, forward and
forward + backward:
  - difftx: build/release/benchmarks/difftx_cuda_bench (Google Benchmark JSON,
    CUDA-event timing): the fused attention op, MultiHead, the baseline
    Attention with 2h heads of D, DecoderLayer;
  - PyTorch, the recipes a user of the reference code would write, all written
    here from the spec:
      naive     both N x N maps materialised, then subtracted (multihead_diffattn);
      sdpa-<backend>  the flashdiff_1 recipe, two scaled_dot_product_attention
                calls with the 2D-wide values, under each SDPA backend PyTorch
                offers (flash, efficient, cudnn, math); one that refuses the
                shapes is reported, not hidden;
      sdpa4-<backend> the flashdiff_2 recipe, four calls with V split in halves
                (equal head sizes, which every backend accepts);
      floor     standard causal attention with 2h heads of D through the fastest
                SDPA backend: the matched Transformer's attention (1.5x fewer FLOPs);
    and a whole decoder layer in PyTorch eager with the fastest recipe.
Writes docs/benchmarks_gpu.json and prints the Markdown tables for
docs/benchmarks.md. Run from the repository root on the GPU machine:

    python3 benchmarks/peer_pytorch_gpu.py [--binary build/release/benchmarks/difftx_cuda_bench]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(3072, 12, 2048, 8192), (3072, 12, 4096, 8192), (5120, 20, 2048, 13824)]  # C, h, N, F
D = 128
DT = torch.bfloat16


def rope(x, theta=10000.0):
    """Interleaved rotary embedding on the last axis of x [B, N, V, d]."""
    n, d = x.shape[1], x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = torch.arange(n, dtype=torch.float64, device=x.device)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype)[None, :, None, :], ang.sin().to(x.dtype)[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def rmsnorm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def sdpa(q, k, v, backend):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class DiffMultiHead(torch.nn.Module):
    def __init__(self, c, h, recipe, backend=None, layer_index=0):
        super().__init__()
        self.c, self.h, self.recipe, self.backend = c, h, recipe, backend
        self.q_proj = torch.nn.Linear(c, 2 * h * D, bias=False)
        self.k_proj = torch.nn.Linear(c, 2 * h * D, bias=False)
        self.v_proj = torch.nn.Linear(c, 2 * h * D, bias=False)
        self.out_proj = torch.nn.Linear(2 * h * D, c, bias=False)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_index)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, torch.nn.Parameter(torch.randn(D) * 0.1))
        self.subln = torch.nn.Parameter(torch.ones(2 * D))

    def forward(self, x):
        b, n, _ = x.shape
        h = self.h
        q = rope(self.q_proj(x).view(b, n, 2 * h, D))
        k = rope(self.k_proj(x).view(b, n, 2 * h, D))
        v = self.v_proj(x).view(b, n, h, 2 * D)
        lam = (torch.exp((self.lambda_q1 * self.lambda_k1).sum().float())
               - torch.exp((self.lambda_q2 * self.lambda_k2).sum().float()) + self.lambda_init).to(x.dtype)
        if self.recipe == "naive":
            qh, kh, vh = q.transpose(1, 2) * D ** -0.5, k.transpose(1, 2), v.transpose(1, 2)
            mask = torch.full((n, n), float("-inf"), device=x.device).triu(1)
            a = F.softmax((qh @ kh.transpose(-1, -2)).float() + mask, dim=-1).to(x.dtype).view(b, h, 2, n, n)
            o = ((a[:, :, 0] - lam * a[:, :, 1]) @ vh).transpose(1, 2)
        else:
            q = q.view(b, n, h, 2, D).transpose(1, 2)
            k = k.view(b, n, h, 2, D).transpose(1, 2)
            vh = v.transpose(1, 2)
            if self.recipe == "sdpa":
                o1 = sdpa(q[:, :, :, 0], k[:, :, :, 0], vh, self.backend)
                o2 = sdpa(q[:, :, :, 1], k[:, :, :, 1], vh, self.backend)
            else:  # sdpa4: V in two halves of D
                v1, v2 = vh[..., :D], vh[..., D:]
                o1 = torch.cat([sdpa(q[:, :, :, 0], k[:, :, :, 0], v1, self.backend),
                                sdpa(q[:, :, :, 0], k[:, :, :, 0], v2, self.backend)], dim=-1)
                o2 = torch.cat([sdpa(q[:, :, :, 1], k[:, :, :, 1], v1, self.backend),
                                sdpa(q[:, :, :, 1], k[:, :, :, 1], v2, self.backend)], dim=-1)
            o = (o1 - lam * o2).transpose(1, 2)
        o = rmsnorm(o, self.subln) * (1 - self.lambda_init)
        return self.out_proj(o.reshape(b, n, 2 * h * D))


class BaselineAttention(torch.nn.Module):
    """Standard attention with 2h heads of D (the matched Transformer)."""
    def __init__(self, c, h, backend=None):
        super().__init__()
        self.h2, self.backend = 2 * h, backend
        self.qkv = torch.nn.Linear(c, 3 * 2 * h * D, bias=False)
        self.out_proj = torch.nn.Linear(2 * h * D, c, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h2, D).unbind(2)
        o = sdpa(rope(q).transpose(1, 2), rope(k).transpose(1, 2), v.transpose(1, 2), self.backend)
        return self.out_proj(o.transpose(1, 2).reshape(b, n, self.h2 * D))


class DecoderLayer(torch.nn.Module):
    def __init__(self, c, h, f, recipe, backend):
        super().__init__()
        self.attn = DiffMultiHead(c, h, recipe, backend)
        self.attn_norm = torch.nn.Parameter(torch.ones(c))
        self.ffn_norm = torch.nn.Parameter(torch.ones(c))
        self.gate = torch.nn.Linear(c, f, bias=False)
        self.up = torch.nn.Linear(c, f, bias=False)
        self.down = torch.nn.Linear(f, c, bias=False)

    def forward(self, x):
        y = self.attn(rmsnorm(x, self.attn_norm)) + x
        z = rmsnorm(y, self.ffn_norm)
        return self.down(F.silu(self.gate(z)) * self.up(z)) + y


def time_cuda(fn, repeats):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def time_module(module, c, n, backward, repeats):
    x = torch.randn(1, n, c, device="cuda", dtype=DT, requires_grad=backward)
    dy = torch.randn(1, n, c, device="cuda", dtype=DT)

    def step():
        if backward:
            module(x).backward(dy)
        else:
            with torch.no_grad():
                module(x)
    try:
        return time_cuda(step, repeats)
    except RuntimeError as error:  # a backend that refuses these shapes
        return f"n/a ({str(error).splitlines()[0][:60]})"


def run_difftx(binary):
    out = subprocess.run([binary, "--benchmark_format=json"], check=True, capture_output=True, text=True)
    return {b["name"].replace("/manual_time", ""): b for b in json.loads(out.stdout)["benchmarks"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/benchmarks/difftx_cuda_bench")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="docs")
    args = ap.parse_args()
    torch.manual_seed(0)
    from torch.nn.attention import SDPBackend
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}

    ours = run_difftx(args.binary)
    rows = []
    for c, h, n, f in SHAPES:
        row = {"C": c, "h": h, "N": n}
        for backward, key in ((False, "forward"), (True, "forward_backward")):
            tag = f"/cuda/bfloat16/{key}/C:{c}/N:{n}"
            for name in ("op:diff_attention", "op:attention", "MultiHead", "Attention", "DecoderLayer"):
                entry = ours.get(name + tag)
                row[f"difftx_{name}_{key}_ms"] = entry["real_time"] if entry else None
                row[f"difftx_{name}_{key}_tflops"] = entry.get("TFLOP/s", 0) if entry else None  # the counter is in TFLOP/s
            row[f"naive_{key}_ms"] = time_module(DiffMultiHead(c, h, "naive").cuda().to(DT), c, n, backward, args.repeats)
            for bname, backend in backends.items():
                for recipe in ("sdpa", "sdpa4"):
                    row[f"{recipe}-{bname}_{key}_ms"] = time_module(
                        DiffMultiHead(c, h, recipe, backend).cuda().to(DT), c, n, backward, args.repeats)
            row[f"floor_{key}_ms"] = time_module(BaselineAttention(c, h).cuda().to(DT), c, n, backward, args.repeats)
            numbers = {k: v for k, v in row.items() if k.endswith(f"{key}_ms") and isinstance(v, float)
                       and (k.startswith("sdpa") or k.startswith("naive"))}
            best = min(numbers, key=numbers.get)
            row[f"best_pytorch_{key}"] = best
            recipe, bname = (best.split("_")[0].split("-") + [None])[:2]
            layer = DecoderLayer(c, h, f, recipe if recipe != "naive" else "naive", backends.get(bname)).cuda().to(DT)
            row[f"pytorch_decoder_layer_{key}_ms"] = time_module(layer, c, n, backward, args.repeats)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    machine = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "date": time.strftime("%Y-%m-%d")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "benchmarks_gpu.json"), "w") as out:
        json.dump({"machine": machine, "rows": rows}, out, indent=1)

    def ms(v):
        return f"{v:.2f}" if isinstance(v, float) else (v or "n/a")

    print(f"GPU: {machine['gpu']}, PyTorch {machine['torch']} (CUDA {machine['cuda']}), bfloat16, causal, "
          f"{machine['date']}; medians in ms\n")
    for key, label in (("forward", "forward"), ("forward_backward", "forward + backward")):
        print(f"\n### MultiHead {label}\n")
        names = ["naive"] + [f"{r}-{b}" for b in backends for r in ("sdpa", "sdpa4")]
        print("| C | h | N | difftx | " + " | ".join(names) + " | floor (2h heads) | difftx / best | difftx / floor |")
        print("|" + "---:|" * (6 + len(names) + 1))
        for r in rows:
            best = r[f"{r[f'best_pytorch_{key}']}"]
            mine = r[f"difftx_MultiHead_{key}_ms"]
            cells = [ms(r[f"{n}_{key}_ms"]) for n in names]
            print(f"| {r['C']} | {r['h']} | {r['N']} | {ms(mine)} | " + " | ".join(cells) +
                  f" | {ms(r[f'floor_{key}_ms'])} | {best / mine:.2f}x | {mine / r[f'floor_{key}_ms']:.2f}x |"
                  if isinstance(mine, float) else "")
    print("\n### DecoderLayer (3B shape) and the fused attention op\n")
    print("| C | N | pass | difftx layer ms | PyTorch eager layer ms | ratio | fused diff attention TFLOP/s |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        for key in ("forward", "forward_backward"):
            mine, theirs = r[f"difftx_DecoderLayer_{key}_ms"], r[f"pytorch_decoder_layer_{key}_ms"]
            ratio = f"{theirs / mine:.2f}x" if isinstance(mine, float) and isinstance(theirs, float) else "n/a"
            print(f"| {r['C']} | {r['N']} | {key} | {ms(mine)} | {ms(theirs)} | {ratio} | "
                  f"{ms(r[f'difftx_op:diff_attention_{key}_tflops'])} |")


if __name__ == "__main__":
    main()
