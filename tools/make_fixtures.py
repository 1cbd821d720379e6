#!/usr/bin/python3
"""Generate golden test fixtures for difftx (Differential Transformer layers).

This is an independent float64 PyTorch implementation of the contract in
../shared/spec/semantics.md (RMSNorm, SwiGLU, interleaved RoPE, the bare
differential attention operator, multi-head differential attention, the
baseline GQA attention, the decoder layer, and differential attention V2
with its layer). It was written from the spec
alone, independently of the C++ code; every gradient comes from torch
autograd, none is derived by hand.

Run from the repository root (Debian's python3 with torch and numpy):

    /usr/bin/python3 tools/make_fixtures.py

It writes tests/data/<case>.safetensors, deterministically (fixed seed per
case, one thread): running it twice gives byte-identical files. (On the same
kind of CPU: torch and OpenBLAS pick their vector kernels by CPU, so elsewhere
a few float64 results can move in the last bit.)

File format (safetensors, written by hand): an 8-byte little-endian u64 header
length n, then n bytes of UTF-8 JSON (padded with spaces so 8 + n is a multiple
of 8), then the raw data. The header maps "__metadata__" to {str: str} (module
name and config values as decimal strings) and each tensor name to
{"dtype": "F64", "shape": [...], "data_offsets": [begin, end]}; offsets are
relative to the start of the data section; tensors are little-endian float64,
C order, packed in alphabetical order of name. Tensors per file: "input" (or
"input.q/k/v" for diff_attn), every parameter under its spec weight name,
"output", "grad_output" (dY; the loss is sum(dY * Y)), "grad_input" (or
"grad_input.q/k/v") and "grad.<param name>" for every parameter.

For weight interop it also writes, from the same tensors:
- tests/data/npy/<case>.<tensor>.<f64|f32>.npy with numpy.save: the
  decoder_layer case's input, grad_output, output and grad_input (float64 and
  float32, rank 3), decoder_layer_d6's input and grad_output, diff_attn_causal's
  input.q (rank 5) and its lambda (rank 0);
- tests/data/decoder_layer.weights.<f32|f16|bf16>.safetensors: that case's
  parameters only, converted by torch (round to nearest even), with its metadata.

Low-precision fixtures, for tests/accuracy_test.cpp (FlashAttention's rule:
difftx's error against float64 at most 2x PyTorch's own):

    python3 -m venv /path/outside/the/repo && /path/outside/the/repo/bin/pip install torch==2.15.0 numpy
    /path/outside/the/repo/bin/python tools/make_fixtures.py --lowp

writes tests/data/lowp_<multihead|decoder_layer>_<bf16|f16>.safetensors,
deterministically as above. Debian's torch 1.13 has no float16 CPU kernels
(matmul, softmax, sigmoid, exp, rsqrt raise "not implemented for 'Half'"), and
emulating PyTorch would not measure PyTorch, so --lowp runs PyTorch 2.15.0
from PyPI (CPU; it refuses a torch without float16 kernels). The float64
fixtures above stay on Debian's torch: under 2.15 their last bits change.
Per file: "input", every parameter and "grad_output" drawn in float64 as above
and rounded to the type (stored in it: exact), so both sides start from the
same numbers; "output", "grad_input", "grad.<name>": the float64 reference
from those values (F64); "torch.output", "torch.grad_input",
"torch.grad.<name>": PyTorch's own run, module, parameters, input and
autograd in the type (the formulas below with every tensor in the type,
PyTorch's kernels choosing their internal precision), stored in the type.
Metadata as above, plus "dtype" and "torch" (the version).

Hugging Face DiffLlama checkpoints, for difftx's HF reader and converter:

    python3 -m venv DIR && DIR/bin/pip install torch==2.15.0 transformers==5.23.0 safetensors sentencepiece numpy
    DIR/bin/python tools/make_fixtures.py --hf

runs tools/hf_fixtures.py (its docstring has the details): it writes
tests/data/hf/<case>/ for eight cases (plain, gqa, tied, sharded, bf16, unusual,
legacy_config, tokenizer), each a folder as transformers' save_pretrained writes
it (config.json, generation_config.json, model.safetensors or shards with
model.safetensors.index.json; tokenizer.model for the tokenizer case; the
legacy_config case's config.json in the 4.4x format) with random weights, and
expected.safetensors: tokens, transformers' logits in float64 and float32
(eager attention), an independent float64 evaluation, and a greedy prompt and
continuation from transformers' generate. Deterministic as above; it refuses
other torch/transformers versions. `--hf --roundtrip PATH/TO/difftx` checks
`difftx convert` HF -> difftx -> HF on every case folder instead (writes
nothing in the repository).
"""

import json
import math
import os
import struct
import sys

import numpy
import torch

torch.set_num_threads(1)
DT = torch.float64
GENERATOR = "tools/make_fixtures.py"
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")

PROJ_SCALE = 1.5     # projection weights ~ N(0, s^2 / in_features)
LAMBDA_STD = 0.3     # lambda vectors ~ N(0, 0.3^2)
NORM_JITTER = 0.2    # norm weights = 1 + 0.2 N(0, 1)
SUBLN_EPS = 1e-5


# ----------------------------------------------------------------------------
# The modules, literally as in the spec.
# ----------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def swiglu(x, wg, w1, w2):
    """(swish(x W_G^T) * (x W_1^T)) W_2^T, swish(z) = z sigmoid(z)."""
    a = x @ wg.T
    return ((a * torch.sigmoid(a)) * (x @ w1.T)) @ w2.T


def rope(x, theta):
    """Interleaved RoPE. x: [B, N, ..., d]; position p = index along dim 1."""
    n, d = x.shape[1], x.shape[-1]
    assert d % 2 == 0
    i = torch.arange(d // 2, dtype=DT)
    inv_freq = torch.pow(torch.tensor(theta, dtype=DT), -2.0 * i / d)      # [d/2]
    p = torch.arange(n, dtype=DT)
    ang = p[:, None] * inv_freq[None, :]                                   # [N, d/2]
    shape = [1, n] + [1] * (x.dim() - 3) + [d // 2]
    # The tables in float64, then in x's dtype (as a low-precision user's would be).
    c, s = torch.cos(ang).reshape(shape).to(x.dtype), torch.sin(ang).reshape(shape).to(x.dtype)
    xe, xo = x[..., 0::2], x[..., 1::2]
    ye = xe * c - xo * s
    yo = xe * s + xo * c
    return torch.stack([ye, yo], dim=-1).reshape(x.shape)


def lambda_init_of(layer_index):
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


def lambda_full(lq1, lk1, lq2, lk2, layer_index):
    return torch.exp(torch.dot(lq1, lk1)) - torch.exp(torch.dot(lq2, lk2)) + lambda_init_of(layer_index)


def softmax_attn(q, k, causal):
    """q: [B, N, d], k: [B, N, d] -> softmax(q k^T / sqrt(d)) [B, N, N]."""
    n, d = q.shape[1], q.shape[-1]
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if causal:
        mask = torch.arange(n)[None, :] > torch.arange(n)[:, None]     # key > query
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1)


def diff_attention(q, k, v, lam, causal):
    """Steps 3-5. q [B,N,h,2,d], k [B,N,g,2,d], v [B,N,g,2d] -> O [B,N,h,2d].

    Head i reads group j = i // r: Q1 with that group's K1, Q2 with its K2.
    """
    h, g = q.shape[2], k.shape[2]
    assert h % g == 0
    r = h // g
    outs = []
    for i in range(h):
        j = i // r
        a1 = softmax_attn(q[:, :, i, 0, :], k[:, :, j, 0, :], causal)
        a2 = softmax_attn(q[:, :, i, 1, :], k[:, :, j, 1, :], causal)
        outs.append((a1 - lam * a2) @ v[:, :, j, :])
    return torch.stack(outs, dim=2)


def multihead(x, p, h, g, d, layer_index, theta, causal, pre=""):
    """Multi-head differential attention; p holds the spec's weight names."""
    b, n, _ = x.shape
    q = (x @ p[pre + "q_proj.weight"].T).reshape(b, n, h, 2, d)
    k = (x @ p[pre + "k_proj.weight"].T).reshape(b, n, g, 2, d)
    v = (x @ p[pre + "v_proj.weight"].T).reshape(b, n, g, 2 * d)
    q, k = rope(q, theta), rope(k, theta)
    lam = lambda_full(p[pre + "lambda_q1"], p[pre + "lambda_k1"],
                      p[pre + "lambda_q2"], p[pre + "lambda_k2"], layer_index)
    o = diff_attention(q, k, v, lam, causal)                               # [B,N,h,2d]
    o = rmsnorm(o, p[pre + "subln.weight"], SUBLN_EPS) * (1.0 - lambda_init_of(layer_index))
    return o.reshape(b, n, h * 2 * d) @ p[pre + "out_proj.weight"].T, lam


def attention(x, p, hh, gg, dh, theta, causal):
    """Baseline GQA softmax attention with RoPE, no subln."""
    b, n, _ = x.shape
    q = rope((x @ p["q_proj.weight"].T).reshape(b, n, hh, dh), theta)
    k = rope((x @ p["k_proj.weight"].T).reshape(b, n, gg, dh), theta)
    v = (x @ p["v_proj.weight"].T).reshape(b, n, gg, dh)
    r = hh // gg
    outs = [softmax_attn(q[:, :, i], k[:, :, i // r], causal) @ v[:, :, i // r] for i in range(hh)]
    return torch.cat(outs, dim=-1) @ p["out_proj.weight"].T


def multihead_v2(x, p, h, g, d, theta, causal, differential=True, pre=""):
    """Differential attention V2 (the authors' Diff-Transformer-V2, from the
    issue's formulas): 2h query heads of d in one GQA softmax attention with g
    key/value heads (query head j reads group j // (2h/g)); output head i is
    a[2i] - sigmoid(x W_lambda^T)[i] a[2i+1]; then o_proj. differential=False:
    the authors' baseline, h query heads and no lambda."""
    b, n, _ = x.shape
    hq = 2 * h if differential else h
    q = rope((x @ p[pre + "q_proj.weight"].T).reshape(b, n, hq, d), theta)
    k = rope((x @ p[pre + "k_proj.weight"].T).reshape(b, n, g, d), theta)
    v = (x @ p[pre + "v_proj.weight"].T).reshape(b, n, g, d)
    r = hq // g
    a = torch.stack([softmax_attn(q[:, :, j], k[:, :, j // r], causal) @ v[:, :, j // r] for j in range(hq)],
                    dim=2)                                                 # [B,N,hq,d]
    if differential:
        lam = torch.sigmoid(x @ p[pre + "lambda_proj.weight"].T)          # [B,N,h], one per token and head
        a = a[:, :, 0::2] - lam[..., None] * a[:, :, 1::2]
    return a.reshape(b, n, h * d) @ p[pre + "o_proj.weight"].T


def decoder_layer_v2(x, p, h, g, d, theta, causal, eps):
    y = multihead_v2(rmsnorm(x, p["attn_norm.weight"], eps), p, h, g, d, theta, causal, pre="attn.") + x
    f = swiglu(rmsnorm(y, p["ffn_norm.weight"], eps), p["ffn.gate_proj.weight"],
               p["ffn.up_proj.weight"], p["ffn.down_proj.weight"])
    return f + y


def decoder_layer(x, p, h, g, d, layer_index, theta, causal, eps):
    a, lam = multihead(rmsnorm(x, p["attn_norm.weight"], eps), p, h, g, d, layer_index, theta,
                       causal, pre="attn.")
    y = a + x
    f = swiglu(rmsnorm(y, p["ffn_norm.weight"], eps), p["ffn.gate_proj.weight"],
               p["ffn.up_proj.weight"], p["ffn.down_proj.weight"])
    return f + y, lam


# ----------------------------------------------------------------------------
# Random parameters.
# ----------------------------------------------------------------------------

def randn(*shape):
    return torch.randn(*shape, dtype=DT)


def proj(out_f, in_f):
    return randn(out_f, in_f) * (PROJ_SCALE / math.sqrt(in_f))


def norm_w(n):
    return 1.0 + NORM_JITTER * randn(n)


def lambdas(d):
    return {k: LAMBDA_STD * randn(d) for k in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}


def multihead_params(c, h, g, d, pre=""):
    p = {"q_proj.weight": proj(2 * h * d, c), "k_proj.weight": proj(2 * g * d, c),
         "v_proj.weight": proj(2 * g * d, c), "out_proj.weight": proj(c, 2 * h * d)}
    p.update(lambdas(d))
    p["subln.weight"] = norm_w(2 * d)
    return {pre + k: v for k, v in p.items()}


def multihead_v2_params(c, h, g, d, differential=True, pre=""):
    hq = 2 * h if differential else h
    p = {"q_proj.weight": proj(hq * d, c), "k_proj.weight": proj(g * d, c),
         "v_proj.weight": proj(g * d, c), "o_proj.weight": proj(c, h * d)}
    if differential:
        p["lambda_proj.weight"] = proj(h, c)
    return {pre + k: v for k, v in p.items()}


def swiglu_params(c, f, pre=""):
    p = {"gate_proj.weight": proj(f, c), "up_proj.weight": proj(f, c), "down_proj.weight": proj(c, f)}
    return {pre + k: v for k, v in p.items()}


# ----------------------------------------------------------------------------
# Safetensors writer.
# ----------------------------------------------------------------------------

# Each file dtype: the torch dtype and how to get its little-endian bytes
# (numpy has no bfloat16, so those go out as their int16 bit patterns).
FILE_DTYPES = {
    "F64": (torch.float64, lambda t: t.numpy().astype("<f8").tobytes()),
    "F32": (torch.float32, lambda t: t.numpy().astype("<f4").tobytes()),
    "F16": (torch.float16, lambda t: t.numpy().astype("<f2").tobytes()),
    "BF16": (torch.bfloat16, lambda t: t.view(torch.int16).numpy().astype("<i2").tobytes()),
}


def write_safetensors(path, tensors, metadata=None, dtype=None):
    """Floating tensors (a state_dict, say), each stored as dtype (converted by
    torch) or, with dtype=None, in its own dtype (F64, F32, F16 or BF16)."""
    own = {td: name for name, (td, _) in FILE_DTYPES.items()}
    header = {"__metadata__": {k: str(v) for k, v in (metadata or {}).items()}}
    blobs, off = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        file_dtype = dtype or own.get(t.dtype)
        if not t.is_floating_point() or file_dtype is None:
            raise ValueError(f"write_safetensors: tensor {name!r} has dtype {t.dtype}; expected float64, float32,"
                             " float16 or bfloat16 (any floating dtype when dtype= is given)")
        torch_dtype, to_bytes = FILE_DTYPES[file_dtype]
        raw = to_bytes(t.to(torch_dtype))
        header[name] = {"dtype": file_dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for raw in blobs:
            f.write(raw)
    return os.path.getsize(path)


def write_npy(name, tensor):
    """tests/data/npy/<name>.f64.npy and .f32.npy (numpy.save, C order, little-endian)."""
    sizes = 0
    for suffix, np_dtype in (("f64", "<f8"), ("f32", "<f4")):
        path = os.path.join(OUT_DIR, "npy", f"{name}.{suffix}.npy")
        numpy.save(path, tensor.detach().numpy().astype(np_dtype, order="C"))
        sizes += os.path.getsize(path)
    return sizes


def write_interop(name, tensors, meta):
    """The extra files of the module docstring; returns their total size."""
    size = 0
    if name == "decoder_layer":
        for t in ("input", "grad_output", "output", "grad_input"):
            size += write_npy(f"{name}.{t}", tensors[t])
        params = {k: v for k, v in tensors.items()
                  if k not in ("input", "output", "grad_output", "grad_input") and not k.startswith("grad.")}
        for dtype in ("F32", "F16", "BF16"):
            path = os.path.join(OUT_DIR, f"{name}.weights.{dtype.lower()}.safetensors")
            size += write_safetensors(path, params, meta, dtype)
    if name == "decoder_layer_d6":
        for t in ("input", "grad_output"):
            size += write_npy(f"{name}.{t}", tensors[t])
    if name == "diff_attn_causal":
        size += write_npy(f"{name}.input.q", tensors["input.q"])
        size += write_npy(f"{name}.lambda", torch.tensor(float(meta["lambda"]), dtype=DT))
    return size


# ----------------------------------------------------------------------------
# Running a case: forward, loss = sum(dY * Y), autograd backward.
# ----------------------------------------------------------------------------

def run_case(inputs, params, fwd):
    """inputs/params: dict name -> tensor. fwd(inputs, params) -> (Y, lam or None)."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    pleaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    y, lam = fwd(leaves, pleaves)
    dy = randn(*y.shape)
    names = list(leaves) + list(pleaves)
    grads = torch.autograd.grad((y * dy).sum(), [leaves[k] for k in leaves] + [pleaves[k] for k in pleaves])
    out = {}
    for k, v in inputs.items():
        out[k] = v
    out.update(params)
    out["output"] = y.detach()
    out["grad_output"] = dy
    for name, gr in zip(names, grads):
        if name in leaves:
            out[name.replace("input", "grad_input", 1)] = gr
        else:
            out["grad." + name] = gr
    return out, (None if lam is None else float(lam))


CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def base_meta(module, **kw):
    m = {"module": module, "generator": GENERATOR}
    m.update({k: (repr(v) if isinstance(v, float) else str(v)) for k, v in kw.items()})
    return m


@case
def rmsnorm_case():
    b, n, c, eps = 2, 3, 8, 1e-5
    x = randn(b, n, c)
    p = {"weight": norm_w(c)}
    t, _ = run_case({"input": x}, p, lambda i, q: (rmsnorm(i["input"], q["weight"], eps), None))
    return "rmsnorm", t, base_meta("rmsnorm", batch=b, seq=n, d_model=c, eps=eps)


@case
def swiglu_case():
    b, n, c, f = 2, 3, 8, 12
    x = randn(b, n, c)
    p = swiglu_params(c, f)
    t, _ = run_case({"input": x}, p, lambda i, q: (swiglu(i["input"], q["gate_proj.weight"],
                                                          q["up_proj.weight"], q["down_proj.weight"]), None))
    return "swiglu", t, base_meta("swiglu", batch=b, seq=n, d_model=c, ffn_dim=f)


def diff_attn_case(name, b, n, h, g, d, layer_index, causal):
    ins = {"input.q": randn(b, n, h, 2, d), "input.k": randn(b, n, g, 2, d), "input.v": randn(b, n, g, 2 * d)}
    p = lambdas(d)

    def fwd(i, q):
        lam = lambda_full(q["lambda_q1"], q["lambda_k1"], q["lambda_q2"], q["lambda_k2"], layer_index)
        return diff_attention(i["input.q"], i["input.k"], i["input.v"], lam, causal), lam

    t, lam = run_case(ins, p, fwd)
    return name, t, base_meta("diff_attn", batch=b, seq=n, heads=h, kv_heads=g, head_dim=d,
                              layer_index=layer_index, causal=int(causal),
                              lambda_init=lambda_init_of(layer_index), **{"lambda": lam})


@case
def diff_attn_causal():
    return diff_attn_case("diff_attn_causal", 2, 5, 4, 2, 4, 1, True)


@case
def diff_attn_noncausal():
    return diff_attn_case("diff_attn_noncausal", 1, 6, 2, 1, 2, 0, False)


def multihead_case(name, b, n, c, h, g, d, layer_index, theta, causal):
    x = randn(b, n, c)
    p = multihead_params(c, h, g, d)
    t, lam = run_case({"input": x}, p,
                      lambda i, q: multihead(i["input"], q, h, g, d, layer_index, theta, causal))
    return name, t, base_meta("multihead", batch=b, seq=n, d_model=c, heads=h, kv_heads=g, head_dim=d,
                              layer_index=layer_index, rope_theta=theta, causal=int(causal),
                              eps=SUBLN_EPS, lambda_init=lambda_init_of(layer_index), **{"lambda": lam})


@case
def multihead_causal():
    return multihead_case("multihead_causal", 2, 5, 16, 2, 2, 4, 0, 10000.0, True)


@case
def multihead_gqa_noncausal():
    return multihead_case("multihead_gqa_noncausal", 1, 7, 12, 4, 2, 4, 5, 500.0, False)


@case
def multihead_n1():
    return multihead_case("multihead_n1", 2, 1, 8, 2, 1, 2, 3, 10000.0, True)


@case
def attention_causal():
    b, n, c, hh, gg, dh, theta = 2, 5, 16, 4, 2, 4, 10000.0
    x = randn(b, n, c)
    p = {"q_proj.weight": proj(hh * dh, c), "k_proj.weight": proj(gg * dh, c),
         "v_proj.weight": proj(gg * dh, c), "out_proj.weight": proj(c, hh * dh)}
    t, _ = run_case({"input": x}, p, lambda i, q: (attention(i["input"], q, hh, gg, dh, theta, True), None))
    return "attention_causal", t, base_meta("attention", batch=b, seq=n, d_model=c, heads=hh, kv_heads=gg,
                                            head_dim=dh, rope_theta=theta, causal=1)


def decoder_case(name, b, n, c, h, g, d, layer_index, f, eps, theta, causal):
    x = randn(b, n, c)
    p = {"attn_norm.weight": norm_w(c)}
    p.update(multihead_params(c, h, g, d, pre="attn."))
    p["ffn_norm.weight"] = norm_w(c)
    p.update(swiglu_params(c, f, pre="ffn."))
    t, lam = run_case({"input": x}, p,
                      lambda i, q: decoder_layer(i["input"], q, h, g, d, layer_index, theta, causal, eps))
    return name, t, base_meta("decoder_layer", batch=b, seq=n, d_model=c, heads=h, kv_heads=g, head_dim=d,
                              layer_index=layer_index, rope_theta=theta, causal=int(causal), ffn_dim=f,
                              eps=eps, lambda_init=lambda_init_of(layer_index), **{"lambda": lam})


@case
def decoder_layer_case():
    return decoder_case("decoder_layer", 2, 6, 16, 2, 1, 4, 2, 24, 1e-5, 10000.0, True)


@case
def decoder_layer_gqa_noncausal():
    return decoder_case("decoder_layer_gqa_noncausal", 1, 9, 16, 4, 2, 2, 7, 20, 1e-5, 10000.0, False)


@case
def decoder_layer_d6():
    # D = 6: no policy compiles it, so the C++ side runs difftx::dynamic.
    return decoder_case("decoder_layer_d6", 2, 5, 16, 2, 1, 6, 3, 24, 1e-5, 10000.0, True)


def multihead_v2_case(name, b, n, c, h, g, d, theta, causal, differential=True):
    x = randn(b, n, c)
    p = multihead_v2_params(c, h, g, d, differential)
    t, _ = run_case({"input": x}, p,
                    lambda i, q: (multihead_v2(i["input"], q, h, g, d, theta, causal, differential), None))
    return name, t, base_meta("multihead_v2", batch=b, seq=n, d_model=c, heads=h, kv_heads=g, head_dim=d,
                              rope_theta=theta, causal=int(causal), differential=int(differential))


@case
def multihead_v2_causal():
    return multihead_v2_case("multihead_v2_causal", 2, 5, 16, 2, 2, 4, 10000.0, True)


@case
def multihead_v2_gqa_noncausal():
    # g = 2 divides the 6 query heads but not h = 3: output heads straddle groups. D = 6 runs dynamic.
    return multihead_v2_case("multihead_v2_gqa_noncausal", 1, 7, 12, 3, 2, 6, 500.0, False)


@case
def multihead_v2_n1():
    return multihead_v2_case("multihead_v2_n1", 2, 1, 8, 1, 1, 2, 10000.0, True)


@case
def multihead_v2_baseline():
    return multihead_v2_case("multihead_v2_baseline", 2, 5, 16, 4, 2, 4, 10000.0, True, differential=False)


@case
def decoder_layer_v2_case():
    b, n, c, h, g, d, f, eps, theta = 2, 6, 16, 2, 1, 4, 24, 1e-5, 10000.0
    x = randn(b, n, c)
    p = {"attn_norm.weight": norm_w(c)}
    p.update(multihead_v2_params(c, h, g, d, pre="attn."))
    p["ffn_norm.weight"] = norm_w(c)
    p.update(swiglu_params(c, f, pre="ffn."))
    t, _ = run_case({"input": x}, p, lambda i, q: (decoder_layer_v2(i["input"], q, h, g, d, theta, True, eps), None))
    return "decoder_layer_v2", t, base_meta("decoder_layer_v2", batch=b, seq=n, d_model=c, heads=h, kv_heads=g,
                                            head_dim=d, rope_theta=theta, causal=1, differential=1, ffn_dim=f,
                                            eps=eps)


# ----------------------------------------------------------------------------
# Low-precision fixtures (--lowp), for tests/accuracy_test.cpp.
# ----------------------------------------------------------------------------

LOWP_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def grads_of(fwd, x, params, dy):
    """Y = fwd(x, params) and autograd's gradients for dY, in the tensors' own dtype."""
    x = x.clone().requires_grad_(True)
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    y = fwd(x, p)[0]
    g = torch.autograd.grad(y, [x] + list(p.values()), grad_outputs=dy)
    out = {"output": y.detach(), "grad_input": g[0]}
    out.update({"grad." + k: gr for k, gr in zip(p, g[1:])})
    return out


def lowp_tensors(low, x, params, fwd):
    """Rounds x, params and a fresh dY to `low`; the float64 reference from those
    values, and PyTorch's own run with module, parameters and input in `low`."""
    rnd = lambda t: t.to(low).to(DT)
    x, params = rnd(x), {k: rnd(v) for k, v in params.items()}
    dy = rnd(randn(*x.shape))
    t = {"input": x.to(low), "grad_output": dy.to(low)}
    t.update({k: v.to(low) for k, v in params.items()})
    t.update(grads_of(fwd, x, params, dy))
    low_run = grads_of(fwd, x.to(low), {k: v.to(low) for k, v in params.items()}, dy.to(low))
    assert all(v.dtype == low for v in low_run.values())
    t.update({"torch." + k: v for k, v in low_run.items()})
    return t, params


def lowp_multihead(low):
    b, n, c, h, g, d, layer_index, theta = 2, 32, 32, 2, 1, 8, 1, 10000.0
    fwd = lambda x, q: multihead(x, q, h, g, d, layer_index, theta, True)
    t, p = lowp_tensors(low, randn(b, n, c), multihead_params(c, h, g, d), fwd)
    lam = float(lambda_full(p["lambda_q1"], p["lambda_k1"], p["lambda_q2"], p["lambda_k2"], layer_index))
    return "multihead", t, base_meta("multihead", batch=b, seq=n, d_model=c, heads=h, kv_heads=g, head_dim=d,
                                     layer_index=layer_index, rope_theta=theta, causal=1, eps=SUBLN_EPS,
                                     lambda_init=lambda_init_of(layer_index), **{"lambda": lam})


def lowp_decoder_layer(low):
    b, n, c, h, g, d, layer_index, f, eps, theta = 2, 16, 32, 2, 2, 8, 2, 64, 1e-5, 10000.0
    p = {"attn_norm.weight": norm_w(c)}
    p.update(multihead_params(c, h, g, d, pre="attn."))
    p["ffn_norm.weight"] = norm_w(c)
    p.update(swiglu_params(c, f, pre="ffn."))
    fwd = lambda x, q: decoder_layer(x, q, h, g, d, layer_index, theta, True, eps)
    t, p = lowp_tensors(low, randn(b, n, c), p, fwd)
    lam = float(lambda_full(p["attn.lambda_q1"], p["attn.lambda_k1"], p["attn.lambda_q2"], p["attn.lambda_k2"],
                            layer_index))
    return "decoder_layer", t, base_meta("decoder_layer", batch=b, seq=n, d_model=c, heads=h, kv_heads=g,
                                         head_dim=d, layer_index=layer_index, rope_theta=theta, causal=1, ffn_dim=f,
                                         eps=eps, lambda_init=lambda_init_of(layer_index), **{"lambda": lam})


def lowp_main():
    """tests/data/lowp_<module>_<bf16|f16>.safetensors."""
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
        torch.softmax(torch.ones(2, dtype=torch.float16), -1)
    except RuntimeError as e:
        sys.exit(f"--lowp needs a torch with float16 CPU kernels (2.1 or later; this is {torch.__version__}: {e})."
                 " See the module docstring.")
    self_check()
    total = 0
    for seed, make in enumerate((lowp_multihead, lowp_decoder_layer)):
        for suffix, low in LOWP_DTYPES.items():
            torch.manual_seed(2000 + seed)  # the same float64 draws for both dtypes
            module, tensors, meta = make(low)
            meta.update(dtype=str(low).removeprefix("torch."), torch=torch.__version__)
            name = f"lowp_{module}_{suffix}.safetensors"
            size = write_safetensors(os.path.join(OUT_DIR, name), tensors, meta)
            total += size
            print(f"{name:40s} {size:8d} bytes")
    print(f"{'total':40s} {total:8d} bytes")
    return 0


# ----------------------------------------------------------------------------
# Self-checks for things autograd cannot catch.
# ----------------------------------------------------------------------------

def self_check():
    torch.manual_seed(12345)
    close = lambda a, b, tol=1e-12: torch.allclose(a, b, rtol=tol, atol=tol)

    # RMSNorm: mean(y^2 / w^2) = ms / (ms + eps) ~= 1 per row.
    x, w = randn(3, 8), norm_w(8)
    assert close((rmsnorm(x, w, 1e-5) ** 2 / w ** 2).mean(-1), torch.ones(3, dtype=DT), 1e-4)

    # RoPE: position 0 is identity, norms are kept, scores depend on p - p' only.
    q, k = randn(1, 6, 1, 4), randn(1, 6, 1, 4)
    rq = rope(q, 10000.0)
    assert close(rq[:, 0], q[:, 0]) and close(rq.norm(dim=-1), q.norm(dim=-1))
    qq, kk = q[:, :1].expand(1, 6, 1, 4), k[:, :1].expand(1, 6, 1, 4)
    rq, rk = rope(qq, 10000.0)[0, :, 0], rope(kk, 10000.0)[0, :, 0]
    assert abs(float(rq[3] @ rk[1] - rq[4] @ rk[2])) < 1e-12
    # Interleaved pair (x0, x1) at p=1 rotates by angle 1 (i = 0).
    e = torch.zeros(1, 2, 1, 2, dtype=DT)
    e[..., 0] = 1.0
    assert close(rope(e, 10000.0)[0, 1, 0], torch.tensor([math.cos(1.0), math.sin(1.0)], dtype=DT))

    # Grouped heads == explicitly repeated K/V (each group's two halves repeated r times).
    b, n, h, g, d = 1, 5, 4, 2, 3
    q, k, v = randn(b, n, h, 2, d), randn(b, n, g, 2, d), randn(b, n, g, 2 * d)
    lam = torch.tensor(0.37, dtype=DT)
    r = h // g
    ref = diff_attention(q, k.repeat_interleave(r, dim=2), v.repeat_interleave(r, dim=2), lam, True)
    assert close(diff_attention(q, k, v, lam, True), ref)

    # multihead with r = 1 equals the reference repo's naive "repeat 2g key heads" layout.
    def naive(q, k, v, lam, rep):
        bb, nn, hh = q.shape[:3]
        k2 = k.reshape(bb, nn, -1, d).repeat_interleave(rep, dim=2).reshape(bb, nn, hh, 2, d)
        v2 = v.repeat_interleave(rep, dim=2)
        return diff_attention(q, k2, v2, lam, True)
    q1, k1, v1 = randn(b, n, 2, 2, d), randn(b, n, 2, 2, d), randn(b, n, 2, 2 * d)
    assert close(diff_attention(q1, k1, v1, lam, True), naive(q1, k1, v1, lam, 1))
    assert not close(diff_attention(q, k, v, lam, True), naive(q, k, v, lam, r), 1e-6)  # differs for r > 1

    # Causality: output at position t does not depend on later inputs; non-causal does.
    for causal in (True, False):
        kv = k.clone().requires_grad_(True)
        o = diff_attention(q, kv, v, lam, causal)
        gk, = torch.autograd.grad(o[:, 1].sum(), kv)
        assert (gk[:, 2:].abs().max() == 0) == causal

    # lambda = 0: head 0 is plain softmax attention A1 V.
    lz = torch.tensor(0.0, dtype=DT)
    o = diff_attention(q, k, v, lz, False)
    a = torch.softmax(q[:, :, 0, 0] @ k[:, :, 0, 0].transpose(-1, -2) / math.sqrt(d), -1)
    assert close(o[:, :, 0], a @ v[:, :, 0])

    # lambda_init values.
    assert abs(lambda_init_of(0) - 0.2) < 1e-15 and abs(lambda_init_of(1) - (0.8 - 0.6 * math.exp(-0.3))) < 1e-15

    # V2 with the switch off is the GQA baseline attention (o_proj named out_proj there).
    pv = multihead_v2_params(8, 4, 2, 2, differential=False)
    xv = randn(2, 5, 8)
    pb = {("out_proj.weight" if k == "o_proj.weight" else k): v for k, v in pv.items()}
    assert close(multihead_v2(xv, pv, 4, 2, 2, 10000.0, True, False), attention(xv, pb, 4, 2, 2, 10000.0, True))
    # V2 with lambda_proj = 0 (lambda = 1/2) pairs heads as a[2i] - a[2i+1]/2, checked on the 2h-head baseline.
    pv = multihead_v2_params(8, 2, 2, 2)
    pv["lambda_proj.weight"] = torch.zeros_like(pv["lambda_proj.weight"])
    wide = {"q_proj.weight": pv["q_proj.weight"], "k_proj.weight": pv["k_proj.weight"],
            "v_proj.weight": pv["v_proj.weight"], "o_proj.weight": torch.eye(4 * 2, dtype=DT)}
    a = multihead_v2(xv, wide, 4, 2, 2, 10000.0, True, False).reshape(2, 5, 4, 2)
    expect = (a[:, :, 0::2] - 0.5 * a[:, :, 1::2]).reshape(2, 5, 4) @ pv["o_proj.weight"].T
    assert close(multihead_v2(xv, pv, 2, 2, 2, 10000.0, True), expect)

    # Autograd agrees with finite differences on a tiny multihead (sanity of the float64 graph).
    p = multihead_params(4, 2, 1, 2)
    xs = randn(1, 3, 4).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: multihead(x, p, 2, 1, 2, 1, 10000.0, True)[0], (xs,))
    pv = multihead_v2_params(4, 2, 1, 2)
    assert torch.autograd.gradcheck(lambda x: multihead_v2(x, pv, 2, 1, 2, 10000.0, True), (xs,))
    print("self-check: ok")


def main():
    self_check()
    os.makedirs(os.path.join(OUT_DIR, "npy"), exist_ok=True)
    total = 0
    for fn in CASES:
        torch.manual_seed(1000 + CASES.index(fn))
        name, tensors, meta = fn()
        size = write_safetensors(os.path.join(OUT_DIR, name + ".safetensors"), tensors, meta)
        total += size
        lam = (" lambda=" + meta["lambda"]) if "lambda" in meta else ""
        print(f"{name + '.safetensors':40s} {size:8d} bytes{lam}")
        extra = write_interop(name, tensors, meta)
        if extra:
            total += extra
            print(f"{name + ' (.npy, typed weights)':40s} {extra:8d} bytes")
    print(f"{'total':40s} {total:8d} bytes")
    return 0


def hf_main(argv):
    """--hf: tools/hf_fixtures.py, with the arguments after --hf."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_fixtures.py")
    spec = importlib.util.spec_from_file_location("hf_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--hf"]:
        sys.exit(hf_main(sys.argv[2:]))
    if sys.argv[1:] not in ([], ["--lowp"]):
        sys.exit("usage: tools/make_fixtures.py [--lowp | --hf [--roundtrip PATH/TO/difftx]]")
    sys.exit(lowp_main() if sys.argv[1:] else main())
