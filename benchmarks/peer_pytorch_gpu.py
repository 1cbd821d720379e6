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
        [--backends flash cudnn]   (fewer SDPA backends: the whole run takes over 8 minutes on an H100)

With --decode it times PyTorch alone: one cached decode step (C = 3072, h = 12,
D = 128, bfloat16, the cache already filled to --context tokens, batches 1 and
32; CUDA events): the new token's projections, interleaved RoPE at its absolute
position, k/v written into a preallocated cache, the maps over the cached keys
through scaled_dot_product_attention (non-causal: the one query is the last
position), subln, out_proj, under torch.inference_mode(); for MultiHead with
two SDPA calls (sdpa) and four (sdpa4), and for the baseline with 2h heads of D.
It first checks each step against a full causal forward in float32:

    python3 benchmarks/peer_pytorch_gpu.py --decode [--context 4096] [--batches 1 32]
"""

import argparse
import json
import math
import os
import re
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


def sdpa(q, k, v, backend, causal=True):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


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


def time_cuda(fn, repeats, warmup=2):
    for _ in range(warmup):
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


# --- cached decode in PyTorch ---------------------------------------------------

def rope_tables(capacity, dtype, device, theta=10000.0):
    """cos and sin [capacity, D/2] of the angles rope() uses, computed once."""
    inv = theta ** (-torch.arange(0, D, 2, dtype=torch.float64, device=device) / D)
    ang = torch.arange(capacity, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rope_at(x, cos, sin):
    """Interleaved RoPE of x [B, V, D], all at the one position whose table rows are cos, sin [D/2]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class DiffDecoder:
    """A DiffMultiHead's KV cache and its one-token decode step, written the way an
    inference user writes it: caches preallocated to `capacity` positions
    (head-major as Hugging Face's StaticCache: keys [B, 2h, capacity, D], values
    [B, h, capacity, 2D]; no torch.cat per step), RoPE tables and lambda computed
    once, and per step the new token's q/k/v projections, RoPE at its absolute
    position (= the cache length), k/v written into that slot, the two maps over
    the cache slice [0, L] through SDPA (non-causal: the one query is the last
    position), O = A1 V - lambda A2 V, subln scaled by (1 - lambda_init), out_proj.
    The module's recipe picks two SDPA calls with the 2D-wide V (sdpa) or four
    with V in halves (sdpa4); its backend, if set, is forced."""

    def __init__(self, module, batch, capacity):
        w, h = module.q_proj.weight, module.h
        self.m, self.h, self.length = module, h, 0
        self.k = torch.zeros(batch, 2 * h, capacity, D, dtype=w.dtype, device=w.device)
        self.v = torch.zeros(batch, h, capacity, 2 * D, dtype=w.dtype, device=w.device)
        self.cos, self.sin = rope_tables(capacity, w.dtype, w.device)
        with torch.no_grad():
            m = module
            self.lam = (torch.exp((m.lambda_q1 * m.lambda_k1).sum().float())
                        - torch.exp((m.lambda_q2 * m.lambda_k2).sum().float()) + m.lambda_init).to(w.dtype)
        self.out_scale = 1 - module.lambda_init

    def prefill(self, x):
        """Fills the cache with the keys and values of x [B, N, C] at positions 0..N-1."""
        b, n, _ = x.shape
        self.k[:, :, :n] = rope(self.m.k_proj(x).view(b, n, 2 * self.h, D)).transpose(1, 2)
        self.v[:, :, :n] = self.m.v_proj(x).view(b, n, self.h, 2 * D).transpose(1, 2)
        self.length = n

    def step(self, x):
        """x [B, 1, C], the token at position L = self.length; returns its MultiHead output [B, 1, C]."""
        b, h, pos, backend = x.shape[0], self.h, self.length, self.m.backend
        cos, sin = self.cos[pos], self.sin[pos]
        q = rope_at(self.m.q_proj(x).view(b, 2 * h, D), cos, sin).view(b, h, 2, 1, D)
        self.k[:, :, pos] = rope_at(self.m.k_proj(x).view(b, 2 * h, D), cos, sin)
        self.v[:, :, pos] = self.m.v_proj(x).view(b, h, 2 * D)
        self.length = n = pos + 1
        k = self.k[:, :, :n].view(b, h, 2, n, D)  # head i's two key halves are cache heads 2i and 2i + 1
        v = self.v[:, :, :n]                      # [B, h, L + 1, 2D]
        if self.m.recipe == "sdpa4":
            v1, v2 = v[..., :D], v[..., D:]
            o1 = torch.cat([sdpa(q[:, :, 0], k[:, :, 0], v1, backend, False),
                            sdpa(q[:, :, 0], k[:, :, 0], v2, backend, False)], dim=-1)
            o2 = torch.cat([sdpa(q[:, :, 1], k[:, :, 1], v1, backend, False),
                            sdpa(q[:, :, 1], k[:, :, 1], v2, backend, False)], dim=-1)
        else:
            o1 = sdpa(q[:, :, 0], k[:, :, 0], v, backend, False)  # [B, h, 1, 2D]
            o2 = sdpa(q[:, :, 1], k[:, :, 1], v, backend, False)
        o = rmsnorm(o1 - self.lam * o2, self.m.subln) * self.out_scale
        return self.m.out_proj(o.reshape(b, 1, 2 * h * D))


class BaselineDecoder:
    """The same for BaselineAttention (2h heads of D): caches [B, 2h, capacity, D]."""

    def __init__(self, module, batch, capacity):
        w = module.qkv.weight
        self.m, self.length = module, 0
        self.k = torch.zeros(batch, module.h2, capacity, D, dtype=w.dtype, device=w.device)
        self.v = torch.zeros(batch, module.h2, capacity, D, dtype=w.dtype, device=w.device)
        self.cos, self.sin = rope_tables(capacity, w.dtype, w.device)

    def prefill(self, x):
        b, n, _ = x.shape
        _, k, v = self.m.qkv(x).view(b, n, 3, self.m.h2, D).unbind(2)
        self.k[:, :, :n] = rope(k).transpose(1, 2)
        self.v[:, :, :n] = v.transpose(1, 2)
        self.length = n

    def step(self, x):
        b, h2, pos = x.shape[0], self.m.h2, self.length
        cos, sin = self.cos[pos], self.sin[pos]
        q, k, v = self.m.qkv(x).view(b, 3, h2, D).unbind(1)
        self.k[:, :, pos] = rope_at(k, cos, sin)
        self.v[:, :, pos] = v
        self.length = n = pos + 1
        o = sdpa(rope_at(q, cos, sin).unsqueeze(2), self.k[:, :, :n], self.v[:, :, :n], self.m.backend, False)
        return self.m.out_proj(o.reshape(b, 1, h2 * D))  # o [B, 2h, 1, D]


def decode_recipes(c, h):
    return {"MultiHead sdpa": lambda: DiffMultiHead(c, h, "sdpa"),
            "MultiHead sdpa4": lambda: DiffMultiHead(c, h, "sdpa4"),
            "baseline (2h heads)": lambda: BaselineAttention(c, h)}


def decoder_for(module, batch, capacity):
    return (BaselineDecoder if isinstance(module, BaselineAttention) else DiffDecoder)(module, batch, capacity)


def check_decode(c, h, context, device):
    """Each recipe's decode step at position L = context against the last row of its
    module's causal full forward over L + 1 tokens (float32, same weights): returns
    {recipe: (max |diff|, max |full|)}."""
    out = {}
    with torch.inference_mode():
        x = torch.randn(2, context + 1, c, device=device)
        for name, make in decode_recipes(c, h).items():
            module = make().to(device)
            full = module(x)[:, -1:]
            dec = decoder_for(module, 2, context + 1)
            dec.prefill(x[:, :context])
            y = dec.step(x[:, context:])
            out[name] = ((y - full).abs().max().item(), full.abs().max().item())
    return out


def time_decode(module, batch, context, warmup, repeats):
    """CUDA-event median ms of one decode step with the cache filled to `context`
    tokens (the length is reset before every call: each step attends to context + 1 keys)."""
    c = module.out_proj.weight.shape[0]
    with torch.inference_mode():
        dec = decoder_for(module, batch, context + 1)
        dec.prefill(torch.randn(batch, context, c, device="cuda", dtype=DT))
        x = torch.randn(batch, 1, c, device="cuda", dtype=DT)

        def step():
            dec.length = context
            dec.step(x)
        return time_cuda(step, repeats, warmup)


def run_decode(args):
    c, h = 3072, 12
    device = "cuda"
    checks = check_decode(c, h, 256, device)
    ok = all(d <= 1e-4 * y for d, y in checks.values())
    for name, (d, y) in checks.items():
        print(f"check {name} (float32, L = 256): max |decode - full forward's last row| = {d:.2e} "
              f"(max |y| = {y:.2e})", file=sys.stderr)
    print(f"check: {'pass' if ok else 'FAIL'} (relative bound 1e-4)", file=sys.stderr)
    if not ok:
        sys.exit(1)
    rows = []
    for name, make in decode_recipes(c, h).items():
        module = make().cuda().to(DT)
        for batch in args.batches:
            row = {"recipe": name, "C": c, "h": h, "D": D, "batch": batch, "context": args.context}
            try:
                ms = time_decode(module, batch, args.context, args.warmup, args.decode_repeats)
                row.update(step_ms=ms, tokens_per_s=batch / ms * 1e3)
            except RuntimeError as error:
                row.update(step_ms=None, tokens_per_s=None, error=str(error).splitlines()[0][:80])
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
        del module
        torch.cuda.empty_cache()
    print(f"Cached decode step, GPU: {torch.cuda.get_device_name()}, PyTorch {torch.__version__} "
          f"(CUDA {torch.version.cuda}), C = {c}, h = {h}, D = {D}, bfloat16, cache filled to {args.context} tokens, "
          f"SDPA's own backend choice, torch.inference_mode(), eager; CUDA-event medians of {args.decode_repeats} "
          f"after {args.warmup} warm-ups\n")
    print("| recipe | batch | step ms | tokens/s |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['recipe']} | {r['batch']} | " + (f"{r['step_ms']:.3f} | {r['tokens_per_s']:.0f} |"
              if r["step_ms"] is not None else f"n/a ({r['error']}) | n/a |"))


def run_difftx(binary, saved):
    """difftx_cuda_bench's results: run now, or read from its earlier --benchmark_out JSON (`saved`)."""
    if saved:
        with open(saved) as f:
            results = json.load(f)
    else:
        out = subprocess.run([binary, "--benchmark_format=json"], check=True, capture_output=True, text=True)
        results = json.loads(out.stdout)
    return {re.sub(r"/iterations:\d+|/manual_time", "", b["name"]): b for b in results["benchmarks"]}


def print_attention_ops(ours, attention):
    """The differential op against standard attention (2h heads of D) over N, on each attention path built."""
    print("\n### The attention op alone (h = 12, D = 128, bfloat16, causal), TFLOP/s counting both maps\n")
    print("| N | pass | " + " | ".join(f"diff op ({a}) | standard op ({a})" for a in attention) +
          " | diff / standard (" + attention[-1] + ") |")
    print("|---:|---|" + "---:|" * (2 * len(attention) + 1))
    for n in (2048, 4096, 8192, 16384):
        for key in ("forward", "forward_backward"):
            cells, last = [], None
            for a in attention:
                tag = f"/cuda/bfloat16/{key}/C:3072/N:{n}/attention:{a}"
                diff, std = ours.get("op:diff_attention" + tag), ours.get("op:attention" + tag)
                cells += [f"{diff['TFLOP/s']:.0f}" if diff else "n/a", f"{std['TFLOP/s']:.0f}" if std else "n/a"]
                last = diff["TFLOP/s"] / std["TFLOP/s"] if diff and std else None
            print(f"| {n} | {key} | " + " | ".join(cells) + (f" | {last:.0%} |" if last else " | n/a |"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/release/benchmarks/difftx_cuda_bench")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--difftx-json", help="read difftx_cuda_bench's results from this --benchmark_out file instead")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--backends", nargs="+", default=["flash", "efficient", "cudnn", "math"],
                    choices=["flash", "efficient", "cudnn", "math"], help="the SDPA backends timed (default: all)")
    ap.add_argument("--decode", action="store_true", help="only time PyTorch's cached decode step (checked first)")
    ap.add_argument("--context", type=int, default=4096, help="--decode: tokens already in the cache")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="--decode: batch sizes")
    ap.add_argument("--decode-repeats", type=int, default=100, help="--decode: timed steps per row")
    ap.add_argument("--warmup", type=int, default=10, help="--decode: untimed steps first")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.decode:
        run_decode(args)
        return
    from torch.nn.attention import SDPBackend
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}

    ours = run_difftx(args.binary, args.difftx_json)
    # the tables below use cuDNN's attention where the binary was built with it (policy::cuda's default then)
    attention = ["difftx"] + (["cudnn"] if any(k.endswith("/attention:cudnn") for k in ours) else [])
    rows = []
    for c, h, n, f in SHAPES:
        row = {"C": c, "h": h, "N": n}
        for backward, key in ((False, "forward"), (True, "forward_backward")):
            tag = f"/cuda/bfloat16/{key}/C:{c}/N:{n}/attention:{attention[-1]}"
            for name in ("op:diff_attention", "op:attention", "MultiHead", "Attention", "DecoderLayer", "BaselineLayer"):
                entry = ours.get(name + tag)
                row[f"difftx_{name}_{key}_ms"] = entry["real_time"] if entry else None
                row[f"difftx_{name}_{key}_tflops"] = entry.get("TFLOP/s", 0) if entry else None  # the counter is in TFLOP/s
            row[f"naive_{key}_ms"] = time_module(DiffMultiHead(c, h, "naive").cuda().to(DT), c, n, backward, args.repeats)
            for bname, backend in ((b, backends[b]) for b in args.backends):
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
          f"{machine['date']}; medians in ms; difftx's attention on {attention[-1]}\n")
    print_attention_ops(ours, attention)
    for key, label in (("forward", "forward"), ("forward_backward", "forward + backward")):
        print(f"\n### MultiHead {label}\n")
        names = ["naive"] + [f"{r}-{b}" for b in args.backends for r in ("sdpa", "sdpa4")]
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
    print("| C | N | pass | difftx layer ms | PyTorch eager layer ms | ratio | diff layer / baseline layer tokens/s |"
          " diff attention TFLOP/s |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        for key in ("forward", "forward_backward"):
            mine, theirs = r[f"difftx_DecoderLayer_{key}_ms"], r[f"pytorch_decoder_layer_{key}_ms"]
            ratio = f"{theirs / mine:.2f}x" if isinstance(mine, float) and isinstance(theirs, float) else "n/a"
            base = r[f"difftx_BaselineLayer_{key}_ms"]
            table7 = f"{base / mine:.0%}" if isinstance(mine, float) and isinstance(base, float) else "n/a"
            print(f"| {r['C']} | {r['N']} | {key} | {ms(mine)} | {ms(theirs)} | {ratio} | {table7} | "
                  f"{ms(r[f'difftx_op:diff_attention_{key}_tflops'])} |")


if __name__ == "__main__":
    main()
