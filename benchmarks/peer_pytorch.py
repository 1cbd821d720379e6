#!/usr/bin/env python3
"""difftx's CPU MultiHead against PyTorch on the CPU, in one run.

Times, for the same shapes and thread count:
  - difftx (policy::simd, float32): by running the Google Benchmark binary
    build/release/benchmarks/difftx_bench (JSON output);
  - PyTorch, the two recipes a user of the reference code would write:
      naive: the reference repo's MultiheadDiffAttn (both softmax maps
             materialised, N x N per head and map, then subtracted);
      sdpa:  its MultiheadFlashDiff1 recipe, two
             torch.nn.functional.scaled_dot_product_attention calls (q1/k1 and
             q2/k2 against the shared 2D-wide values), where PyTorch has SDPA.
    Both are written here from the spec (RoPE interleaved, grouped heads,
    subln, lambda), forward and forward + backward (autograd, w.r.t. the input
    and every parameter);
  - the fused attention op alone next to Eigen's SGEMM, from the same binary;
  - with --decode, PyTorch alone: one cached decode step of MultiHead (the new
    token's projections, interleaved RoPE at its absolute position, k/v written
    into a preallocated cache, the two maps over the cached keys, subln,
    out_proj; under torch.inference_mode()), with the cache already filled to
    --context tokens, per thread count, next to a full forward over context + 1
    tokens; the step's output is first checked against that full forward;
  - with --v2, differential attention V2 (the authors' Diff-Transformer-V2,
    multihead_flashdiffv2.py): difftx's MultiHeadV2 rows (12 output heads of 64,
    24 query heads on 12 kv heads: matched to the baseline) next to its MultiHead
    (V1) and Attention (baseline) rows, and DiffMultiHeadV2 in PyTorch, the
    authors' recipe (ONE causal scaled_dot_product_attention over the 2h query
    heads, grouped kv heads through enable_gqa where torch has it, then
    a[:, :, 0::2] - sigmoid(lambda_proj(x)) a[:, :, 1::2], o_proj), forward and
    forward + backward, first checked (output and every gradient) against the
    formulas in float64 at a small shape; and V2's head combination alone
    (op:diff_heads) as a share of the V2 module's time. Writes
    OUT/benchmarks_v2.json and prints its two tables (nothing else).

Otherwise writes OUT/benchmarks.json (--out, default build/peer_pytorch) and
prints its tables; benchmarks/measure_cpu.sh turns it into
benchmarks/results/layers.json. Run from the repository root:

    python3 benchmarks/peer_pytorch.py [--threads 2] [--lengths 512 1024 2048 4096]
    /usr/bin/time -v python3 benchmarks/peer_pytorch.py --memory naive 4096   # peak memory of one recipe
    python3 benchmarks/peer_pytorch.py --decode --context 1024 [--decode-threads 1 2]   # cached decode step
    python3 benchmarks/peer_pytorch.py --v2 [--threads 2] [--lengths 512 1024 2048]   # differential attention V2

needs torch (>= 2.0 for the sdpa recipe and --v2; enable_gqa from 2.5) and numpy.
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

C, H, D = 768, 6, 64  # d_model, differential heads, half head size (the shape)


# --- the spec in PyTorch ------------------------------------------------------

def rope(x, theta=10000.0):
    """Interleaved rotary embedding on the last axis of x [B, N, V, d]."""
    n, d = x.shape[1], x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    cos = ang.cos().to(x.dtype)[None, :, None, :]
    sin = ang.sin().to(x.dtype)[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class DiffMultiHead(torch.nn.Module):
    def __init__(self, layer_index=0, recipe="naive"):
        super().__init__()
        self.recipe = recipe
        self.q_proj = torch.nn.Linear(C, 2 * H * D, bias=False)
        self.k_proj = torch.nn.Linear(C, 2 * H * D, bias=False)
        self.v_proj = torch.nn.Linear(C, 2 * H * D, bias=False)
        self.out_proj = torch.nn.Linear(2 * H * D, C, bias=False)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_index)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, torch.nn.Parameter(torch.randn(D) * 0.1))
        self.subln = torch.nn.Parameter(torch.ones(2 * D))

    def forward(self, x):
        b, n, _ = x.shape
        q = rope(self.q_proj(x).view(b, n, 2 * H, D))
        k = rope(self.k_proj(x).view(b, n, 2 * H, D))
        v = self.v_proj(x).view(b, n, H, 2 * D)
        lam = (torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
               + self.lambda_init)
        if self.recipe == "naive":
            # both maps materialised: [B, 2H, N, N]
            qh, kh, vh = q.transpose(1, 2) * D ** -0.5, k.transpose(1, 2), v.transpose(1, 2)
            mask = torch.full((n, n), float("-inf")).triu(1)
            a = F.softmax(qh @ kh.transpose(-1, -2) + mask, dim=-1).view(b, H, 2, n, n)
            o = (a[:, :, 0] - lam * a[:, :, 1]) @ vh  # [B, H, N, 2D]
            o = o.transpose(1, 2)
        else:
            q = q.view(b, n, H, 2, D)
            k = k.view(b, n, H, 2, D)
            vh = v.transpose(1, 2)
            o1 = F.scaled_dot_product_attention(q[:, :, :, 0].transpose(1, 2), k[:, :, :, 0].transpose(1, 2), vh,
                                                is_causal=True)
            o2 = F.scaled_dot_product_attention(q[:, :, :, 1].transpose(1, 2), k[:, :, :, 1].transpose(1, 2), vh,
                                                is_causal=True)
            o = (o1 - lam * o2).transpose(1, 2)
        o = rmsnorm(o, self.subln) * (1 - self.lambda_init)
        return self.out_proj(o.reshape(b, n, 2 * H * D))


def has_sdpa_gqa():
    """Whether this torch's scaled_dot_product_attention takes enable_gqa (>= 2.5)."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return False
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4),
                                       enable_gqa=True)
        return True
    except TypeError:
        return False


class DiffMultiHeadV2(torch.nn.Module):
    """Differential attention V2 in the authors' recipe (MultiheadFlashDiffV2): h
    output heads of d, 2h query heads and g key/value heads (interleaved RoPE on q
    and k); ONE causal scaled_dot_product_attention over all 2h query heads, query
    head j on kv head j // (2h / g) (enable_gqa=True where torch has it, else k and
    v repeat_interleave'd); lambda = sigmoid(lambda_proj(x)) per token and output
    head; o = a[:, :, 0::2] - lambda * a[:, :, 1::2]; o_proj. No subln, no biases.
    The default shape is difftx's MultiHeadV2 row, matched to the baseline: 12
    output heads of 64 and 12 kv heads, so 24 query heads."""

    def __init__(self, heads=2 * H, kv_heads=2 * H, head_dim=D, d_model=C, gqa=None):
        super().__init__()
        assert (2 * heads) % kv_heads == 0
        self.h, self.g, self.d = heads, kv_heads, head_dim
        self.gqa = has_sdpa_gqa() if gqa is None else gqa
        self.q_proj = torch.nn.Linear(d_model, 2 * heads * head_dim, bias=False)
        self.k_proj = torch.nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.v_proj = torch.nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * head_dim, d_model, bias=False)
        self.lambda_proj = torch.nn.Linear(d_model, heads, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        h, g, d = self.h, self.g, self.d
        q = rope(self.q_proj(x).view(b, n, 2 * h, d)).transpose(1, 2)  # [B, 2h, N, d]
        k = rope(self.k_proj(x).view(b, n, g, d)).transpose(1, 2)      # [B, g, N, d]
        v = self.v_proj(x).view(b, n, g, d).transpose(1, 2)
        if self.gqa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            r = 2 * h // g
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1),
                                               is_causal=True)
        a = a.transpose(1, 2)                     # [B, N, 2h, d]
        lam = torch.sigmoid(self.lambda_proj(x))  # [B, N, h]
        o = a[:, :, 0::2] - lam[..., None] * a[:, :, 1::2]
        return self.o_proj(o.reshape(b, n, h * d))


def v2_formula(x, w, h, g, d):
    """V2 from the formulas, sharing nothing with DiffMultiHeadV2.forward but rope():
    x [B, N, C] and the weights w (by parameter name) in float64, every causal
    softmax map materialised, one query head at a time (head j on kv head j // (2h / g))."""
    b, n, _ = x.shape
    q = rope((x @ w["q_proj.weight"].T).view(b, n, 2 * h, d))
    k = rope((x @ w["k_proj.weight"].T).view(b, n, g, d))
    v = (x @ w["v_proj.weight"].T).view(b, n, g, d)
    mask = torch.full((n, n), float("-inf"), dtype=x.dtype).triu(1)
    a = []
    for j in range(2 * h):
        kv = j // (2 * h // g)
        p = torch.softmax(q[:, :, j] @ k[:, :, kv].transpose(-1, -2) / math.sqrt(d) + mask, dim=-1)  # [B, N, N]
        a.append(p @ v[:, :, kv])                                                                    # [B, N, d]
    lam = torch.sigmoid(x @ w["lambda_proj.weight"].T)                                               # [B, N, h]
    o = torch.stack([a[2 * i] - lam[:, :, i, None] * a[2 * i + 1] for i in range(h)], dim=2)        # [B, N, h, d]
    return o.reshape(b, n, h * d) @ w["o_proj.weight"].T


def check_v2(gqa, batch=2, n=7, heads=4, kv_heads=2, head_dim=16, d_model=32):
    """DiffMultiHeadV2 (float32, the recipe timed) against v2_formula (float64, the
    same weights) at a small shape with grouped kv heads (8 query heads on 2 kv
    heads): the output, and by autograd through both the gradients w.r.t. the input
    and every weight. Returns [(name, max |diff|, max |reference|)]."""
    module = DiffMultiHeadV2(heads, kv_heads, head_dim, d_model, gqa)
    x = torch.randn(batch, n, d_model, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(batch, n, d_model, dtype=torch.float64)
    w = {k: p.detach().double().requires_grad_() for k, p in module.named_parameters()}
    ref = v2_formula(x, w, heads, kv_heads, head_dim)
    ref_grads = torch.autograd.grad(ref, [x] + list(w.values()), dy)
    x32 = x.detach().float().requires_grad_()
    y = module(x32)
    y.backward(dy.float())
    ours = [y, x32.grad] + [p.grad for p in module.parameters()]
    names = ["y", "dx"] + [f"d{k.split('.')[0]}" for k in w]
    return [(name, (a.double() - r).abs().max().item(), r.abs().max().item())
            for name, a, r in zip(names, ours, [ref] + list(ref_grads))]


def time_torch(module, n, backward, repeats):
    x = torch.randn(1, n, C, requires_grad=backward)
    dy = torch.randn(1, n, C)
    times = []
    for i in range(repeats + 1):  # the first run warms up (and is the one run when repeats is 0)
        t0 = time.perf_counter()
        y = module(x)
        if backward:
            y.backward(dy)
        t1 = time.perf_counter()
        if i or not repeats:
            times.append(t1 - t0)
        module.zero_grad(set_to_none=True)
        x.grad = None
    return statistics.median(times) * 1e3


def set_threads(n):
    """torch.set_num_threads(n), and the same for an OpenBLAS loaded into the process
    (Debian's python3-torch calls the system BLAS, which torch.set_num_threads leaves
    at all cores: OpenBLAS would split even a one-row GEMM over both cores of a
    "1 thread" row)."""
    torch.set_num_threads(n)
    try:
        import ctypes
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if "openblas" in line.split()[-1]}
        for lib in libs:
            blas = ctypes.CDLL(lib)
            if hasattr(blas, "openblas_set_num_threads"):
                blas.openblas_set_num_threads(n)
    except OSError:
        pass


# --- cached decode in PyTorch ---------------------------------------------------

class DiffDecoder:
    """A DiffMultiHead's KV cache and its one-token decode step, written the way an
    inference user writes it in PyTorch: key/value caches preallocated to
    `capacity` positions (head-major, [B, 2h, capacity, D] and [B, h, capacity, 2D],
    the layout of Hugging Face's StaticCache, so a head's cached keys are one
    contiguous block; no torch.cat per step), RoPE tables and lambda computed once
    (the weights are frozen), and per step: the new token's q/k/v projections,
    RoPE at its absolute position (= the cache length), k/v written into that
    slot, the two maps over the cached keys [0, L] (no mask: the one query is the
    last position), O = A1 V - lambda A2 V, subln scaled by (1 - lambda_init),
    out_proj. recipe "sdpa": two scaled_dot_product_attention calls on the cache
    slice (PyTorch >= 2.0); "explicit": both maps in one batched product, softmax,
    then (A1 - lambda A2) V (what the step is without SDPA, e.g. PyTorch 1.13)."""

    def __init__(self, module, batch, capacity, recipe, theta=10000.0):
        w = module.q_proj.weight
        self.m, self.recipe, self.length = module, recipe, 0
        self.k = torch.zeros(batch, 2 * H, capacity, D, dtype=w.dtype, device=w.device)
        self.v = torch.zeros(batch, H, capacity, 2 * D, dtype=w.dtype, device=w.device)
        inv = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # the same angles as rope() above
        ang = torch.arange(capacity, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().to(w.dtype), ang.sin().to(w.dtype)  # [capacity, D/2]
        with torch.no_grad():
            m = module
            self.lam = (torch.exp((m.lambda_q1 * m.lambda_k1).sum()) - torch.exp((m.lambda_q2 * m.lambda_k2).sum())
                        + m.lambda_init)
        self.out_scale = 1 - module.lambda_init

    def prefill(self, x):
        """Fills the cache with the keys and values of x [B, N, C] at positions 0..N-1."""
        b, n, _ = x.shape
        self.k[:, :, :n] = rope(self.m.k_proj(x).view(b, n, 2 * H, D)).transpose(1, 2)
        self.v[:, :, :n] = self.m.v_proj(x).view(b, n, H, 2 * D).transpose(1, 2)
        self.length = n

    def _rope(self, x, pos):  # x [B, V, D] at one position
        cos, sin = self.cos[pos], self.sin[pos]
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def step(self, x):
        """x [B, 1, C], the token at position L = self.length; returns its MultiHead output [B, 1, C]."""
        b, pos = x.shape[0], self.length
        q = self._rope(self.m.q_proj(x).view(b, 2 * H, D), pos)
        self.k[:, :, pos] = self._rope(self.m.k_proj(x).view(b, 2 * H, D), pos)
        self.v[:, :, pos] = self.m.v_proj(x).view(b, H, 2 * D)
        self.length = n = pos + 1
        k = self.k[:, :, :n].view(b, H, 2, n, D)  # head i's two key halves are cache heads 2i and 2i + 1
        v = self.v[:, :, :n]                      # [B, H, L + 1, 2D]
        q = q.view(b, H, 2, 1, D)
        if self.recipe == "sdpa":
            o1 = F.scaled_dot_product_attention(q[:, :, 0], k[:, :, 0], v)  # [B, H, 1, 2D]
            o2 = F.scaled_dot_product_attention(q[:, :, 1], k[:, :, 1], v)
            o = o1 - self.lam * o2
        else:
            a = torch.softmax((q * D ** -0.5) @ k.transpose(-1, -2), dim=-1)  # [B, H, 2, 1, L + 1]
            o = (a[:, :, 0] - self.lam * a[:, :, 1]) @ v                     # [B, H, 1, 2D]
        o = rmsnorm(o, self.m.subln) * self.out_scale
        return self.m.out_proj(o.reshape(b, 1, 2 * H * D))


def check_decode(recipe, context, batch=1):
    """The decode step's output at position L against the last row of a causal full
    forward (the naive recipe, same weights) over L + 1 tokens, both in float32: after
    prefilling L = context tokens, and stepping token by token from an empty cache."""
    module = DiffMultiHead(recipe="naive")
    errors = []
    with torch.inference_mode():
        x = torch.randn(batch, context + 1, C)
        full = module(x)
        dec = DiffDecoder(module, batch, context + 1, recipe)
        dec.prefill(x[:, :context])
        y, ref = dec.step(x[:, context:]), full[:, -1:]
        errors.append(((y - ref).abs().max().item(), ref.abs().max().item()))
        n = 16
        dec = DiffDecoder(module, batch, n, recipe)
        y, ref = torch.cat([dec.step(x[:, i:i + 1]) for i in range(n)], dim=1), module(x[:, :n])
        errors.append(((y - ref).abs().max().item(), ref.abs().max().item()))
    return errors  # (max |decode - full|, max |full|) for each


def time_decode(recipe, context, batch, warmup, repeats):
    """Median seconds of one decode step with the cache filled to `context` tokens
    (the length is reset before every call, so every timed step attends to context + 1 keys)."""
    module = DiffMultiHead(recipe="naive")
    with torch.inference_mode():
        dec = DiffDecoder(module, batch, context + 1, recipe)
        dec.prefill(torch.randn(batch, context, C))
        x = torch.randn(batch, 1, C)
        times = []
        for i in range(warmup + repeats):
            dec.length = context
            t0 = time.perf_counter()
            dec.step(x)
            t1 = time.perf_counter()
            if i >= warmup:
                times.append(t1 - t0)
    return statistics.median(times)


def run_decode(args):
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    recipe = "sdpa" if has_sdpa else "explicit"
    set_threads(max(args.decode_threads))
    (d0, y0), (d1, y1) = check_decode(recipe, args.context, args.batch)
    ok = max(d0 / y0, d1 / y1) < 1e-5
    print(f"check ({recipe}, float32): the decode step at L = {args.context} against the last row of a causal full "
          f"forward over {args.context + 1} tokens: max |diff| = {d0:.2e} (max |y| = {y0:.2e}); 16 steps from an "
          f"empty cache against a forward over 16 tokens: max |diff| = {d1:.2e} (max |y| = {y1:.2e}); "
          f"{'pass' if ok else 'FAIL'} (relative bound 1e-5)", file=sys.stderr)
    if not ok:
        sys.exit(1)
    rows = []
    for t in args.decode_threads:
        set_threads(t)
        step = time_decode(recipe, args.context, args.batch, args.warmup, args.decode_repeats)
        row = {"threads": t, "batch": args.batch, "context": args.context, "recipe": recipe,
               "decode_step_us": step * 1e6, "tokens_per_s": args.batch / step}
        with torch.inference_mode():
            for r in ("naive", "sdpa") if has_sdpa else ("naive",):
                row[f"full_forward_{r}_ms"] = time_torch(DiffMultiHead(recipe=r), args.context + 1, False, args.repeats)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    print(f"MultiHead cached decode step, B = {args.batch}, C = {C}, h = {H}, D = {D}, float32, cache filled to "
          f"{args.context} tokens (PyTorch {torch.__version__}, {recipe} maps, torch.inference_mode()); step: median "
          f"of {args.decode_repeats} after {args.warmup} warm-ups; full forward over {args.context + 1} tokens "
          f"(causal, no cache): median of {args.repeats}\n")
    fulls = [k for k in rows[0] if k.startswith("full_forward_")]
    print("| threads | decode step µs | tokens/s | " + " | ".join(
        f"full forward {k.split('_')[2]} ms" for k in fulls) + " |")
    print("|---:|---:|---:|" + "---:|" * len(fulls))
    for r in rows:
        print(f"| {r['threads']} | {r['decode_step_us']:.1f} | {r['tokens_per_s']:.0f} | " +
              " | ".join(f"{r[k]:.1f}" for k in fulls) + " |")


# --- difftx through its Google Benchmark binary -------------------------------

def run_difftx(binary, lengths, threads, min_time):
    ns = "|".join(map(str, lengths))
    return run_bench(binary, [f"MultiHead/simd/float32/(forward|forward_backward)/N:({ns})/",
                              f"Attention/simd/float32/(forward|forward_backward)/N:({ns})/",
                              f"op:(diff_attention|attention)/simd/float32/(forward|backward)/N:({ns})/",
                              "eigen_sgemm/2048"], threads, min_time)


def run_bench(binary, patterns, threads, min_time):
    """The rows of difftx_bench matching any of the regular expressions `patterns`:
    {name without /real_time: {"ms", "gflops"}}."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, f"--benchmark_filter={'|'.join(patterns)}", "--benchmark_format=json",
                          f"--benchmark_min_time={min_time}"], check=True, capture_output=True, text=True, env=env)
    results = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        results[b["name"].replace("/real_time", "")] = {"ms": b["real_time"], "gflops": b.get("GFLOP/s", 0)}  # the counter is in GFLOP/s
    return results


def list_bench(binary):
    """The names of difftx_bench's rows (without /real_time), or exit saying how to build it."""
    try:
        out = subprocess.run([binary, "--benchmark_list_tests"], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"cannot list the rows of {binary} ({e}); build it: cmake --preset release && "
                 f"cmake --build --preset release")
    return {line.strip().replace("/real_time", "") for line in out.stdout.splitlines() if line.strip()}


def machine_info(threads, sgemm):
    return {
        "cpu": platform.processor() or open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(":\t "),
        "threads": threads, "torch": torch.__version__, "torch_cpu_capability":
            torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?",
        "date": time.strftime("%Y-%m-%d"), "eigen_sgemm_2048_gflops": sgemm,
    }


# --- differential attention V2 ------------------------------------------------

def run_v2(args):
    """--v2: difftx's MultiHeadV2 next to its MultiHead (V1) and Attention (baseline)
    rows and to DiffMultiHeadV2 in PyTorch, plus V2's head combination (op:diff_heads)
    as a share of the V2 module's time."""
    if not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"--v2 needs torch >= 2.0 (scaled_dot_product_attention); this is {torch.__version__}")
    lengths, passes = args.lengths, ("forward", "forward_backward")
    # the binary's rows first: a stale build fails here, before anything is timed
    listed = list_bench(args.binary)
    missing = [name for n in lengths for module in ("MultiHeadV2", "MultiHead", "Attention") for key in passes
               if (name := f"{module}/simd/float32/{key}/N:{n}") not in listed]
    missing += [] if "eigen_sgemm/2048" in listed else ["eigen_sgemm/2048"]
    heads_at = sorted(int(name.rsplit(":", 1)[1]) for name in listed
                      if name.startswith("op:diff_heads/simd/float32/forward/N:")
                      and name.replace("/forward/", "/backward/") in listed)
    if not heads_at:
        missing.append("op:diff_heads/simd/float32/(forward|backward)/N:<any>")
    if missing:
        sys.exit(f"{args.binary} lacks the rows --v2 reads (a stale build: cmake --build --preset release; or a "
                 f"length that benchmarks/modules_bench.cpp does not register):\n  "
                 + "\n  ".join(missing))
    # op:diff_heads is linear in N: where the binary lacks a length, scale from the nearest one it has
    heads_from = {n: min(heads_at, key=lambda m: abs(math.log(m / n))) for n in lengths}

    # the PyTorch peer is V2: checked once against the formulas in float64
    gqa = has_sdpa_gqa()
    recipe = "one SDPA call, " + ("enable_gqa=True" if gqa else "k/v repeat_interleave'd")
    errors = check_v2(gqa)
    ok = all(d <= 1e-5 * r for _, d, r in errors)
    print(f"check (DiffMultiHeadV2, {recipe}, float32) against the formulas in float64 (materialised softmax, one "
          f"query head at a time), B = 2, N = 7, 4 output heads (8 query heads) on 2 kv heads, d = 16, C = 32: "
          + ", ".join(f"{name} {d / r:.1e}" for name, d, r in errors)
          + f" (max |diff| / max |reference|); {'pass' if ok else 'FAIL'} (relative bound 1e-5)", file=sys.stderr)
    if not ok:
        sys.exit(1)

    ns = "|".join(map(str, lengths))
    ms = "|".join(map(str, sorted(set(heads_from.values()))))
    ours = run_bench(args.binary, [f"(MultiHeadV2|MultiHead|Attention)/simd/float32/(forward|forward_backward)"
                                   f"/N:({ns})/", f"op:diff_heads/simd/float32/(forward|backward)/N:({ms})/",
                                   "eigen_sgemm/2048"], args.threads, args.min_time)
    rows = []
    for n in lengths:
        row = {"N": n}
        for key in passes:
            backward = key == "forward_backward"
            row[f"v2_{key}_ms"] = ours[f"MultiHeadV2/simd/float32/{key}/N:{n}"]["ms"]
            row[f"v2_{key}_gflops"] = ours[f"MultiHeadV2/simd/float32/{key}/N:{n}"]["gflops"]
            row[f"v1_{key}_ms"] = ours[f"MultiHead/simd/float32/{key}/N:{n}"]["ms"]
            row[f"baseline_{key}_ms"] = ours[f"Attention/simd/float32/{key}/N:{n}"]["ms"]
            with torch.no_grad() if not backward else torch.enable_grad():
                row[f"pytorch_v2_{key}_ms"] = time_torch(DiffMultiHeadV2(gqa=gqa), n, backward, args.repeats)
        m = heads_from[n]
        row["diff_heads_measured_at_N"] = m
        for p in ("forward", "backward"):
            row[f"diff_heads_{p}_ms"] = ours[f"op:diff_heads/simd/float32/{p}/N:{m}"]["ms"] * n / m
        rows.append(row)
        print(f"N={n}: " + ", ".join(f"{k}={v:.2f}" for k, v in row.items() if isinstance(v, float)), file=sys.stderr)

    machine = machine_info(args.threads, ours["eigen_sgemm/2048"]["gflops"])
    shape = {"B": 1, "C": C, "heads": 2 * H, "query_heads": 4 * H, "kv_heads": 2 * H, "head_dim": D, "causal": True,
             "dtype": "float32", "pytorch_v2": recipe}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "benchmarks_v2.json"), "w") as f:
        json.dump({"machine": machine, "shape": shape, "rows": rows}, f, indent=1)

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "n/a"

    print(f"Differential attention V2, B = 1, C = {C}, {2 * H} output heads of D = {D} ({4 * H} query heads, "
          f"{2 * H} kv heads), causal, float32, {args.threads} threads; V1 = MultiHead (h = {H} of 2·{D}), baseline = "
          f"Attention ({2 * H} heads of {D}); PyTorch {torch.__version__}, {recipe}. Times in ms: difftx from Google "
          f"Benchmark (at least {args.min_time} s per row), PyTorch the median of {args.repeats} after a warm-up\n")
    print("| N | pass | difftx V2 | difftx V1 (MultiHead) | difftx baseline (Attention) | V2 / V1 | V2 / baseline | "
          "PyTorch V2 (SDPA) | PyTorch / difftx V2 |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for key, label in (("forward", "forward"), ("forward_backward", "fwd + bwd")):
            v2, v1, base, peer = (r[f"{k}_{key}_ms"] for k in ("v2", "v1", "baseline", "pytorch_v2"))
            print(f"| {r['N']} | {label} | {v2:.1f} | {v1:.1f} | {base:.1f} | {ratio(v2, v1)} | {ratio(v2, base)} | "
                  f"{peer:.1f} | {ratio(peer, v2)} |")
    scaled = [r["N"] for r in rows if r["diff_heads_measured_at_N"] != r["N"]]
    print(f"\nV2's head combination alone (op:diff_heads, a [N, {4 * H}, {D}] -> o [N, {2 * H}, {D}]: o = a[:, 0::2] "
          f"- lambda a[:, 1::2]) as a share of the V2 module: what fusing it into the attention epilogue could save "
          f"at most\n")
    print("| N | combination fwd ms | combination bwd ms | V2 forward ms | fwd / V2 forward | V2 fwd + bwd ms | "
          "(fwd + bwd) / V2 fwd + bwd |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mark = "≈ " if r["N"] in scaled else ""
        fwd, bwd = r["diff_heads_forward_ms"], r["diff_heads_backward_ms"]
        print(f"| {r['N']} | {mark}{fwd:.2f} | {mark}{bwd:.2f} | {r['v2_forward_ms']:.1f} | "
              f"{mark}{fwd / r['v2_forward_ms']:.1%} | {r['v2_forward_backward_ms']:.1f} | "
              f"{mark}{(fwd + bwd) / r['v2_forward_backward_ms']:.1%} |")
    if scaled:
        print("\n≈: " + "; ".join(f"N = {', '.join(str(n) for n in scaled if heads_from[n] == m)} scaled by N from "
                                   f"the row at N = {m}" for m in sorted({heads_from[n] for n in scaled}))
              + " (the binary has op:diff_heads at N = " + ", ".join(map(str, heads_at)) + " only)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--lengths", type=int, nargs="+", help="default 512 1024 2048 4096 (--v2: 512 1024 2048)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--binary", default="build/release/benchmarks/difftx_bench")
    ap.add_argument("--min-time", default="1")
    ap.add_argument("--out", default="build/peer_pytorch")
    ap.add_argument("--memory", nargs=2, metavar=("RECIPE", "N"),
                    help="only run one forward + backward of RECIPE (naive or sdpa) at length N, for /usr/bin/time -v")
    ap.add_argument("--decode", action="store_true",
                    help="only time PyTorch's cached decode step of MultiHead (checked first against a full forward)")
    ap.add_argument("--context", type=int, default=1024, help="--decode: tokens already in the cache")
    ap.add_argument("--batch", type=int, default=1, help="--decode: sequences decoded together")
    ap.add_argument("--decode-threads", type=int, nargs="+", default=[1, 2], help="--decode: thread counts")
    ap.add_argument("--decode-repeats", type=int, default=500, help="--decode: timed steps per thread count")
    ap.add_argument("--warmup", type=int, default=50, help="--decode: untimed steps first")
    ap.add_argument("--v2", action="store_true",
                    help="only differential attention V2: difftx's MultiHeadV2 against its V1 and baseline and "
                         "against PyTorch (one SDPA call, checked first against the formulas)")
    args = ap.parse_args()
    args.lengths = args.lengths or ([512, 1024, 2048] if args.v2 else [512, 1024, 2048, 4096])
    set_threads(args.threads)
    torch.manual_seed(0)
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    if args.memory:
        recipe, n = args.memory[0], int(args.memory[1])
        print(f"{recipe} N={n}: forward + backward {time_torch(DiffMultiHead(recipe=recipe), n, True, 0):.0f} ms")
        return
    if args.decode:
        run_decode(args)
        return
    if args.v2:
        run_v2(args)
        return

    ours = run_difftx(args.binary, args.lengths, args.threads, args.min_time)
    rows = []
    for n in args.lengths:
        row = {"N": n}
        for backward, key in ((False, "forward"), (True, "forward_backward")):
            row[f"difftx_{key}_ms"] = ours[f"MultiHead/simd/float32/{key}/N:{n}"]["ms"]
            row[f"baseline_{key}_ms"] = ours[f"Attention/simd/float32/{key}/N:{n}"]["ms"]
            with torch.no_grad() if not backward else torch.enable_grad():
                row[f"naive_{key}_ms"] = time_torch(DiffMultiHead(recipe="naive"), n, backward, args.repeats)
                row[f"sdpa_{key}_ms"] = (time_torch(DiffMultiHead(recipe="sdpa"), n, backward, args.repeats)
                                         if has_sdpa else None)
        for op in ("diff_attention", "attention"):
            for p in ("forward", "backward"):
                row[f"op_{op}_{p}_gflops"] = ours[f"op:{op}/simd/float32/{p}/N:{n}"]["gflops"]
        rows.append(row)
        print(f"N={n}: " + ", ".join(f"{k}={v:.1f}" for k, v in row.items() if isinstance(v, float)), file=sys.stderr)
    sgemm = ours["eigen_sgemm/2048"]["gflops"]

    machine = machine_info(args.threads, sgemm)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "benchmarks.json"), "w") as f:
        json.dump({"machine": machine, "rows": rows}, f, indent=1)

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "n/a"

    print(f"MultiHead, B = 1, C = {C}, h = {H}, D = {D}, causal, float32, {args.threads} threads "
          f"(PyTorch {torch.__version__}); times are medians in ms, ratios are PyTorch / difftx\n")
    print("| N | pass | difftx | PyTorch naive | PyTorch SDPA | vs naive | vs SDPA | difftx baseline (H = 12) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for key, label in (("forward", "forward"), ("forward_backward", "fwd + bwd")):
            ours_ms, naive, sdpa = r[f"difftx_{key}_ms"], r[f"naive_{key}_ms"], r[f"sdpa_{key}_ms"]
            print(f"| {r['N']} | {label} | {ours_ms:.1f} | {naive:.1f} | {sdpa:.1f} | {ratio(naive, ours_ms)} | "
                  f"{ratio(sdpa, ours_ms)} | {r[f'baseline_{key}_ms']:.1f} |" if sdpa else
                  f"| {r['N']} | {label} | {ours_ms:.1f} | {naive:.1f} | n/a | {ratio(naive, ours_ms)} | n/a | "
                  f"{r[f'baseline_{key}_ms']:.1f} |")
    print(f"\nFused attention op alone, GFLOP/s (causal pairs only) next to Eigen SGEMM 2048: {sgemm:.1f} GFLOP/s\n")
    print("| N | differential fwd | differential bwd | standard fwd | standard bwd | diff fwd / SGEMM | diff bwd / SGEMM |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['N']} | {r['op_diff_attention_forward_gflops']:.1f} | {r['op_diff_attention_backward_gflops']:.1f} | "
              f"{r['op_attention_forward_gflops']:.1f} | {r['op_attention_backward_gflops']:.1f} | "
              f"{r['op_diff_attention_forward_gflops'] / sgemm:.0%} | {r['op_diff_attention_backward_gflops'] / sgemm:.0%} |")


if __name__ == "__main__":
    main()
