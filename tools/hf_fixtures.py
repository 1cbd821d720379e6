#!/usr/bin/env python3
"""Hugging Face DiffLlama fixtures for difftx's checkpoint reader and converter.

Makes small, random-weight checkpoints of transformers' `DiffLlamaForCausalLM`
with transformers itself, as `save_pretrained` writes them, and the outputs
transformers computes from them, under tests/data/hf/<case>/:

    config.json, generation_config.json   as save_pretrained writes them
    model.safetensors                      (or model-0000i-of-0000n.safetensors
                                           + model.safetensors.index.json)
    tokenizer.model                        (case "tokenizer" only)
    expected.safetensors                   the oracle, see below

Run with the venv described in tools/make_fixtures.py (torch 2.15.0 and
transformers 5.23.0 from PyPI; CPU only), from anywhere:

    VENV/bin/python tools/make_fixtures.py --hf     # or: VENV/bin/python tools/hf_fixtures.py
    VENV/bin/python tools/hf_fixtures.py --cases llama3 llama3_legacy    # only these folders
    VENV/bin/python tools/hf_fixtures.py --roundtrip build/release/tools/difftx

The first form (re)writes every case folder; it is deterministic (fixed seeds,
one thread): running it twice gives byte-identical files. It refuses other
torch/transformers versions, whose last bits may differ. The second form checks
`difftx convert` both ways on every case folder (see roundtrip()) and writes
nothing in the repository.

Cases (V vocabulary, C hidden size, H query heads, Hkv key/value heads, hd
head_dim, L layers, F intermediate size):
    plain          V 80, C 32, H 4, Hkv 4, hd 8, L 2, F 64, eps 1e-5, theta 1e4, float32
    gqa            V 96, C 48, H 8, Hkv 4, hd 6, L 2, F 64 (grouped: 2 query heads per kv head)
    tied           V 72, C 32, H 4, Hkv 2, hd 8, L 2, F 48, tie_word_embeddings (no lm_head.weight in the file)
    sharded        V 96, C 32, H 4, Hkv 4, hd 8, L 3, F 64, saved in 5 shards with an index
    bf16           V 64, C 32, H 4, Hkv 2, hd 8, L 2, F 64, weights stored as BF16
    unusual        V 96, C 40, H 4, Hkv 2, hd 16 (H*hd != C), L 3, F 56, eps 1e-6, theta 5e5,
                   rope_parameters {"rope_type": "linear", "factor": 2.0}
    legacy_config  V 64, C 32, H 4, Hkv 2, hd 8, L 2, F 48, config.json as transformers 4.48 wrote it:
                   top-level rope_theta 5e4 and rope_scaling {"type": "linear", "factor": 4.0},
                   torch_dtype, no rope_parameters
    tokenizer      as plain with V 128 = a BPE SentencePiece model trained here (tokenizer.model)
    llama3         V 96, C 64, H 4, Hkv 2, hd 16, L 2, F 96, tied, weights stored as BF16, theta 5e5,
                   rope_parameters {"rope_type": "llama3", "factor": 32, "low_freq_factor": 1,
                   "high_freq_factor": 4, "original_max_position_embeddings": 64}: with hd 16 the
                   wavelengths fall in all three bands (kept, blended, divided) at this short context
    llama3_legacy  V 80, C 48, H 8, Hkv 4, hd 6, L 2, F 64, float32, config.json in 4.x keys: top-level
                   rope_theta 2e5 and rope_scaling {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                   "high_freq_factor": 8, "original_max_position_embeddings": 512} (again all three bands)

Weights are drawn in float64 from a fixed seed and rounded to the stored type:
embeddings N(0, 1), projections N(0, 1/in), lm_head N(0, 2^2/C), lambda_q1/k1/
q2/k2 N(0, 0.3^2), RMSNorm weights 1 + N(0, 0.1^2). The tied case draws embeddings
N(0, 0.3^2) and doubles o_proj and down_proj: with tied weights and N(0, 1)
embeddings the last token's own embedding dominates the logits and greedy
repeats it forever.

expected.safetensors (written by write_safetensors, read back with the safetensors package):
    tokens       I64 [2, 8]     ids spread over the vocabulary, 0 and V-1 included
    logits.f64   F64 [2, 8, V]  transformers' logits (eager attention) with the model
                                loaded in float64 (bf16 case: the bf16 weights upcast)
    logits.f32   F32 [2, 8, V]  the same in float32
    logits.exact F64 [2, 8, V]  an independent float64 evaluation written here
                                (exact_logits), every step in float64. transformers'
                                "float64" run is not float64 throughout: its
                                RMSNorm computes in float32, its RoPE tables, softmax
                                and lambda are float32, so logits.f64 agrees with a
                                true float64 model to about 1e-7 relative only
                                (metadata "exact_vs_f64" gives the measured value).
    prompt       I64 [P]        greedy's prompt (P = 5; tokenizer case: BOS + the
                                encoding of metadata "prompt.text")
    greedy       I64 [8]        model.generate(prompt, max_new_tokens=8,
                                do_sample=False) in float64, new tokens only; no step
                                is a near-tie (metadata "min_margin": the smallest
                                (top1 - top2) / max|logit| over the steps, > 1e-3), no
                                token is EOS (2) (tokenizer case: none of 0, 1, 2),
                                at least 4 distinct tokens; the first prompt drawn
                                (or listed, tokenizer case) that passes is kept
    text.ids     I64            tokenizer case: the encoding of metadata "text" (no BOS)
    __metadata__ case, description, transformers, torch, config (a one-line summary),
                 min_margin, min_margin.abs, exact_vs_f64, f32_vs_f64; tokenizer case:
                 text, prompt.text, text.decoded (SentencePiece's decode of greedy alone),
                 text.full (decode of the prompt's ids without BOS followed by greedy)

What transformers 5.23's DiffLlama computes (exact_logits restates it in float64),
in difftx's terms (docs/semantics.md) with h = H/2 differential heads, g = Hkv/2
groups, d = head_dim:
  - differential head i takes Q1 = query head i and Q2 = query head i + h; group
    j = i / (H/Hkv) takes K1 = kv head j, K2 = kv head j + g, and the value
    [v head j, v head j + g] (2d wide). o_proj's input is the heads' 2d outputs
    in order, as difftx's out_proj. So difftx's q_proj rows for head i are HF's
    rows of heads i then i + h; k_proj and v_proj rows for group j are HF's kv
    heads j then j + g. Hkv must be even (transformers raises otherwise).
  - RoPE rotates (x[t], x[t + d/2]) together (rotate_half), not (x[2t], x[2t+1]):
    permuting each d-block of q_proj and k_proj rows (HF row t -> 2t, t + d/2 ->
    2t + 1) gives difftx's interleaved RoPE; same frequencies theta^(-2t/d),
    divided by the factor for rope type linear. Scores are scaled by d^-0.5.
  - the per-head norm ("groupnorm") is an RMSNorm over 2d without weight (difftx's
    subln.weight = 1) and with eps = rms_norm_eps (not a fixed 1e-5), times
    (1 - lambda_init), lambda_init = 0.8 - 0.6 exp(-0.3 l); lambda as in difftx.
  - decoder layer: input_layernorm, self_attn, post_attention_layernorm, mlp
    (gate_proj, up_proj, down_proj: SwiGLU), model.norm, lm_head (or the
    embedding when tied).

Before writing, every case is checked: the folder reloads with from_pretrained
(no missing or unexpected keys), its logits equal the in-memory model's bit for
bit, loading in float64 equals loading in float32 then .to(float64) bit for bit,
logits.exact agrees with logits.f64, greedy agrees with full forwards (and with
exact_logits), the legacy config gives exactly the logits of the same weights
under an equivalent new-style config, and RoPE scaling visibly matters
(unusual, legacy_config: factor 1 gives other logits).
"""

import argparse
import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

torch.set_num_threads(1)

import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HF_DIR = os.path.join(ROOT, "tests", "data", "hf")
WANT_TORCH, WANT_TRANSFORMERS = "2.15.0", "5.23.0"

B, N = 2, 8               # tokens: batch, sequence length
P, K = 5, 8               # greedy: prompt length, new tokens
BOS, EOS = 1, 2
LOGIT_STD = 2.0           # lm_head ~ N(0, LOGIT_STD^2 / C)
LAMBDA_STD = 0.3
NORM_JITTER = 0.1
MIN_REL_MARGIN = 1e-3
MIN_DISTINCT = 4          # greedy: at least this many distinct tokens of K
ROUNDTRIP_BAR = 2e-6

CASES = [
    dict(name="plain", V=80, C=32, H=4, Hkv=4, L=2, F=64,
         desc="DiffLlama defaults: H = Hkv = 4, head_dim = C/H, float32, rope default theta 1e4, eps 1e-5"),
    dict(name="gqa", V=96, C=48, H=8, Hkv=4, L=2, F=64,
         desc="grouped query attention: H 8 on Hkv 4 (head_dim 6), float32"),
    dict(name="tied", V=72, C=32, H=4, Hkv=2, L=2, F=48, tied=True, emb_std=0.3, out_scale=2.0,
         desc="tie_word_embeddings: the file has no lm_head.weight, logits use model.embed_tokens.weight"),
    dict(name="sharded", V=96, C=32, H=4, Hkv=4, L=3, F=64, shard="40KB",
         desc="saved with max_shard_size 40KB: 4 shards and model.safetensors.index.json, float32"),
    dict(name="bf16", V=64, C=32, H=4, Hkv=2, L=2, F=64, dtype="bfloat16",
         desc="weights stored as BF16 (config dtype bfloat16); logits from those exact values upcast"),
    dict(name="unusual", V=96, C=40, H=4, Hkv=2, hd=16, L=3, F=56, eps=1e-6, theta=500000.0,
         rope={"rope_type": "linear", "factor": 2.0},
         desc="off the defaults: head_dim 16 with C 40 (H*hd != C), Hkv 2, eps 1e-6, theta 5e5, linear RoPE x2, 3 layers"),
    dict(name="legacy_config", V=64, C=32, H=4, Hkv=2, L=2, F=48, theta=50000.0,
         rope={"rope_type": "linear", "factor": 4.0}, legacy=True,
         desc="config.json as transformers 4.48 wrote it: top-level rope_theta 5e4, rope_scaling "
              "{type: linear, factor: 4.0}, torch_dtype, no rope_parameters"),
    dict(name="tokenizer", V=None, C=32, H=4, Hkv=4, L=2, F=64, tokenizer=True,
         desc="as plain, V = the size of tokenizer.model (SentencePiece BPE, unk 0, bos 1, eos 2, no byte fallback)"),
    dict(name="llama3", V=96, C=64, H=4, Hkv=2, hd=16, L=2, F=96, tied=True, emb_std=0.3, out_scale=2.0,
         dtype="bfloat16", theta=500000.0,
         rope={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
         desc="llama3 RoPE as the public DiffLlama-375M/300m/0.3B folders (theta 5e5, factor 32, low 1, high 4), "
              "with the original context 64 so that every band is hit; tied, GQA, BF16"),
    dict(name="llama3_legacy", V=80, C=48, H=8, Hkv=4, L=2, F=64, theta=200000.0, legacy=True,
         rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
               "original_max_position_embeddings": 512},
         desc="llama3 RoPE in 4.x keys (top-level rope_theta, rope_scaling with rope_type llama3), float32, GQA"),
]

# English text for the tokenizer case (written for this file).
SP_TEXT = """\
The small river ran past the old mill, and the children of the village walked beside it every morning on their way to school.
In the spring the water was high and fast, and the miller opened the gates so that the great wheel turned all day long.
When summer came the river grew slow and warm. The children took off their shoes and waded in the shallow places, looking for smooth stones and little fish.
Autumn brought rain and wind. Leaves fell from the trees along the bank and floated down the river like small brown boats.
In winter the river was quiet under a thin sheet of ice, and the mill stood still until the days grew long again.
The teacher told the children that every river finds its way to the sea, however long the journey takes.
They wrote stories about the water, drew maps of the valley, and counted the birds that came to drink at the edge of the stream.
"""
SP_VOCAB = 128
SP_SENTENCE = "The children walked along the river to the old mill."
SP_PROMPTS = ["In the spring the children", "The river ran past the", "Every morning the miller",
              "When the water was warm", "The teacher drew a map of", "Leaves fell on the small"]


# ----------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------

def die(msg):
    sys.exit(f"hf_fixtures: {msg}")


def check(cond, msg):
    if not cond:
        die("check failed: " + msg)


DTYPE_CODES = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata):
    """A safetensors file with a reproducible header (the safetensors package orders __metadata__
    differently from run to run): JSON with sorted keys, padded with spaces to a multiple of 8 bytes,
    tensors little-endian, C order, packed in alphabetical order of name."""
    header, blobs, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": DTYPE_CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def rel_err(a, b):
    a, b = a.to(torch.float64), b.to(torch.float64)
    return float((a - b).abs().max() / b.abs().max())


def spec_of(case):
    """Fill a case's defaults."""
    s = dict(hd=None, eps=1e-5, theta=10000.0, rope=None, dtype="float32", tied=False, shard=None,
             legacy=False, tokenizer=False, emb_std=1.0, out_scale=1.0)
    s.update(case)
    s["head_dim"] = s["hd"] or s["C"] // s["H"]
    return s


def train_sentencepiece():
    """A tiny BPE SentencePiece model, deterministic (one thread). Returns its bytes."""
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for line in SP_TEXT.splitlines() if line]), model_writer=buf,
        vocab_size=SP_VOCAB, model_type="bpe", byte_fallback=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, character_coverage=1.0, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, minloglevel=2)
    return buf.getvalue()


def make_config(s):
    rope = dict(s["rope"] or {"rope_type": "default"})
    rope["rope_theta"] = s["theta"]
    kw = dict(vocab_size=s["V"], hidden_size=s["C"], intermediate_size=s["F"], num_hidden_layers=s["L"],
              num_attention_heads=s["H"], num_key_value_heads=s["Hkv"], rms_norm_eps=s["eps"],
              rope_parameters=rope, max_position_embeddings=128, tie_word_embeddings=s["tied"],
              bos_token_id=BOS, eos_token_id=EOS, lambda_std_dev=LAMBDA_STD)
    if s["hd"] is not None:
        kw["head_dim"] = s["hd"]
    return DiffLlamaConfig(**kw)


def draw_weights(model, seed, emb_std=1.0, out_scale=1.0):
    """Overwrite every parameter (tied ones once) with fixed-seed float64 draws. out_scale multiplies
    o_proj and down_proj (what the layers add to the residual stream)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            z = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.endswith("embed_tokens.weight"):
                w = emb_std * z
            elif name == "lm_head.weight":
                w = z * (LOGIT_STD / math.sqrt(p.shape[1]))
            elif name.endswith("norm.weight"):
                w = 1.0 + NORM_JITTER * z
            elif ".lambda_" in name:
                w = LAMBDA_STD * z
            elif name.endswith("_proj.weight"):
                w = z / math.sqrt(p.shape[1]) * (out_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1)
            else:
                die(f"no rule to draw {name}")
            p.copy_(w)


def load(folder, dtype):
    model, info = DiffLlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                        output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    check(not bad, f"{folder}: loading info {bad}")
    return model.eval()


@torch.no_grad()
def logits_of(model, tokens):
    return model(input_ids=tokens, use_cache=False).logits


def legacy_config_json(s, saved):
    """config.json as transformers 4.4x wrote a DiffLlama config (no rope_parameters)."""
    keys = ["architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
            "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "lambda_std_dev",
            "max_position_embeddings", "model_type", "num_attention_heads", "num_hidden_layers",
            "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings", "use_cache", "vocab_size"]
    c = {k: saved[k] for k in keys}
    c["rope_theta"] = s["theta"]
    if s["rope"] and s["rope"]["rope_type"] == "llama3":  # as Llama 3.1's config.json spells it
        c["rope_scaling"] = dict(s["rope"])
    else:
        c["rope_scaling"] = {"type": s["rope"]["rope_type"], "factor": s["rope"]["factor"]} if s["rope"] else None
    c["torch_dtype"] = s["dtype"]
    c["transformers_version"] = "4.48.0"
    return c


# ----------------------------------------------------------------------------
# An independent float64 evaluation of a DiffLlama folder (config.json read here).
# ----------------------------------------------------------------------------

def read_hf_config(folder):
    """The hyper-parameters of config.json, new style (rope_parameters) or old (rope_theta, rope_scaling)."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    check(kind in ("default", "linear", "llama3"), f"rope type {kind}")
    return dict(V=c["vocab_size"], C=c["hidden_size"], F=c["intermediate_size"], L=c["num_hidden_layers"],
                H=c["num_attention_heads"], Hkv=c.get("num_key_value_heads") or c["num_attention_heads"],
                hd=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], eps=c["rms_norm_eps"],
                theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                rope_type=kind, rope=rope, tied=bool(c.get("tie_word_embeddings", False)))


def inverse_frequencies(cfg, hd):
    """RoPE's f_t for t < hd/2 in float64: theta^(-2t/hd), then the rope type's scaling. llama3:
    wavelengths 2 pi / f above L / low_freq_factor are divided by the factor, those below
    L / high_freq_factor kept, the band between blended linearly in L / wavelength."""
    t = torch.arange(hd // 2, dtype=torch.float64)
    base = torch.pow(torch.tensor(cfg["theta"], dtype=torch.float64), -2.0 * t / hd)
    r = cfg["rope"]
    if cfg["rope_type"] == "linear":
        return base / r["factor"]
    if cfg["rope_type"] != "llama3":
        return base
    factor, lo, hi = float(r["factor"]), float(r["low_freq_factor"]), float(r["high_freq_factor"])
    L = float(r["original_max_position_embeddings"])
    wave = 2 * math.pi / base
    blend = (L / wave - lo) / (hi - lo)
    out = (1 - blend) * base / factor + blend * base
    out = torch.where(wave > L / lo, base / factor, out)
    return torch.where(wave < L / hi, base, out)


def read_hf_weights(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for name in files:
        w.update({k: v.to(torch.float64) for k, v in load_file(os.path.join(folder, name)).items()})
    return w


def exact_logits(folder, tokens):
    """Logits [B, N, V] of the DiffLlama checkpoint in `folder`, every operation in float64.

    Per layer l, with h = H/2 differential heads and m = Hkv/2: differential head i
    pairs query heads i and i + h; its keys are kv heads j = i // (H/Hkv) and j + m,
    its value the concatenation of kv heads j and j + m (2 hd wide). RoPE is the
    half-split kind ((x[t], x[t + hd/2]) rotated together by p * f_t, inverse_frequencies).
    The per-head norm is an RMSNorm without weight, eps = rms_norm_eps, times
    (1 - lambda_init(l)).
    """
    cfg, w = read_hf_config(folder), read_hf_weights(folder)
    V, C, H, Hkv, hd, eps = cfg["V"], cfg["C"], cfg["H"], cfg["Hkv"], cfg["hd"], cfg["eps"]
    h, m, grp, half = H // 2, Hkv // 2, H // Hkv, hd // 2
    b, n = tokens.shape
    f64 = torch.float64

    def rms(x, weight=None):
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        return y if weight is None else y * weight

    def rope(x):  # x [b, n, heads, hd]
        ang = torch.arange(n, dtype=f64)[:, None] * inverse_frequencies(cfg, hd)[None, :]  # [n, hd/2]
        c, s = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
        lo, hi = x[..., :half], x[..., half:]
        return torch.cat([lo * c - hi * s, hi * c + lo * s], dim=-1)

    x = w["model.embed_tokens.weight"][tokens]
    mask = torch.triu(torch.full((n, n), float("-inf"), dtype=f64), diagonal=1)
    for l in range(cfg["L"]):
        p = f"model.layers.{l}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = rope((a @ w[p + "self_attn.q_proj.weight"].T).reshape(b, n, H, hd))
        k = rope((a @ w[p + "self_attn.k_proj.weight"].T).reshape(b, n, Hkv, hd))
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(b, n, Hkv, hd)
        lam_init = 0.8 - 0.6 * math.exp(-0.3 * l)
        lam = (torch.exp(torch.dot(w[p + "self_attn.lambda_q1"], w[p + "self_attn.lambda_k1"]))
               - torch.exp(torch.dot(w[p + "self_attn.lambda_q2"], w[p + "self_attn.lambda_k2"])) + lam_init)
        heads = []
        for i in range(h):
            j = i // grp
            s1 = torch.einsum("bqd,bkd->bqk", q[:, :, i], k[:, :, j]) / math.sqrt(hd) + mask
            s2 = torch.einsum("bqd,bkd->bqk", q[:, :, i + h], k[:, :, j + m]) / math.sqrt(hd) + mask
            val = torch.cat([v[:, :, j], v[:, :, j + m]], dim=-1)              # [b, n, 2 hd]
            o = (torch.softmax(s1, -1) - lam * torch.softmax(s2, -1)) @ val
            heads.append(rms(o) * (1.0 - lam_init))
        x = x + torch.cat(heads, dim=-1) @ w[p + "self_attn.o_proj.weight"].T
        f = rms(x, w[p + "post_attention_layernorm.weight"])
        g = f @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g * torch.sigmoid(g)) * (f @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if cfg["tied"] else w["lm_head.weight"]
    out = rms(x, w["model.norm.weight"]) @ head.T
    check(out.shape == (b, n, V), "exact logits shape")
    return out


# ----------------------------------------------------------------------------
# Greedy decoding with margins.
# ----------------------------------------------------------------------------

@torch.no_grad()
def greedy_of(model, prompt):
    out = model.generate(prompt[None, :], attention_mask=torch.ones_like(prompt)[None, :], max_new_tokens=K,
                         do_sample=False, pad_token_id=EOS)
    return out[0, prompt.numel():]


def margins(logits_rows):
    """(top1 - top2) / max|row| and top1 - top2 for each row."""
    top = torch.topk(logits_rows, 2, dim=-1).values
    gap = top[:, 0] - top[:, 1]
    return gap / logits_rows.abs().max(-1).values, gap


@torch.no_grad()
def check_greedy(m64, folder, prompt, new, banned):
    """None if new is a clean greedy continuation, else why not; (min rel, its abs gap) if clean."""
    if new.numel() != K:
        return f"stopped after {new.numel()} tokens"
    if any(int(t) in banned for t in new):
        return f"greedy holds a banned token {new.tolist()}"
    if len(set(new.tolist())) < MIN_DISTINCT:
        return f"greedy repeats itself {new.tolist()}"
    seq = torch.cat([prompt, new])[None, :-1]
    rows = logits_of(m64, seq)[0, prompt.numel() - 1:]
    if not torch.equal(rows.argmax(-1), new):
        return "generate disagrees with full forwards"
    rel, gap = margins(rows)
    if float(rel.min()) <= MIN_REL_MARGIN:
        return f"near tie: relative margin {float(rel.min()):.2e}"
    ex = exact_logits(folder, seq)[0, prompt.numel() - 1:]
    if not torch.equal(ex.argmax(-1), new):
        return "exact_logits disagrees with generate"
    i = int(rel.argmin())
    return float(rel[i]), float(gap[i])


# ----------------------------------------------------------------------------
# One case.
# ----------------------------------------------------------------------------

def make_case(index, case, sp_bytes):
    s = spec_of(case)
    seed = 7000 + 100 * index
    sp = None
    if s["tokenizer"]:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_proto=sp_bytes)
        s["V"] = sp.get_piece_size()
        check((sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, BOS, EOS), "sentencepiece special ids")
    name, V = s["name"], s["V"]
    folder = os.path.join(HF_DIR, name)

    torch.manual_seed(seed)
    cfg = make_config(s)
    model = DiffLlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("eager")
    draw_weights(model, seed + 1, s["emb_std"], s["out_scale"])
    if s["dtype"] == "bfloat16":
        model.to(torch.bfloat16)

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    kw = {"max_shard_size": s["shard"]} if s["shard"] else {}
    model.save_pretrained(folder, **kw)
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)
    check(saved.get("dtype") == s["dtype"], f"{name}: saved dtype {saved.get('dtype')}")
    if s["legacy"]:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(legacy_config_json(s, saved), f, indent=2, sort_keys=True)
            f.write("\n")
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump({"_from_model_config": True, "bos_token_id": BOS, "eos_token_id": EOS,
                       "transformers_version": "4.48.0"}, f, indent=2, sort_keys=True)
            f.write("\n")
    if sp_bytes is not None:
        with open(os.path.join(folder, "tokenizer.model"), "wb") as f:
            f.write(sp_bytes)
        check(len(sp_bytes) < 300_000, "tokenizer.model too large")

    # What the folder holds.
    files = sorted(os.listdir(folder))
    shards = [f for f in files if f.startswith("model") and f.endswith(".safetensors")]
    if s["shard"]:
        check(len(shards) >= 3 and "model.safetensors.index.json" in files, f"{name}: shards {shards}")
    else:
        check(shards == ["model.safetensors"], f"{name}: files {files}")
    stored = {}
    for f in shards:
        stored.update(load_file(os.path.join(folder, f)))
    check(("lm_head.weight" in stored) == (not s["tied"]), f"{name}: lm_head.weight present: {'lm_head.weight' in stored}")
    want = torch.bfloat16 if s["dtype"] == "bfloat16" else torch.float32
    check(all(t.dtype == want for t in stored.values()), f"{name}: stored dtypes")

    # Reload: same weights, same logits bit for bit.
    gen = torch.Generator().manual_seed(seed + 2)
    mid = torch.randperm(V - 2, generator=gen)[: B * N - 2] + 1
    tokens = torch.cat([mid, torch.tensor([0, V - 1])])[torch.randperm(B * N, generator=gen)].reshape(B, N)
    m32, m64 = load(folder, torch.float32), load(folder, torch.float64)
    check(m32.model.rotary_emb.rope_type == (s["rope"] or {}).get("rope_type", "default"), f"{name}: rope type")
    for k, t in m32.state_dict().items():
        ref = stored.get(k, stored["model.embed_tokens.weight"] if k == "lm_head.weight" else None)
        check(ref is not None and torch.equal(t, ref.to(torch.float32)), f"{name}: reloaded {k}")
    # The in-memory weights in a fresh float32 model (model.to(bfloat16) also rounds the RoPE
    # inv_freq buffer to bfloat16; from_pretrained keeps it float32).
    mem = DiffLlamaForCausalLM(cfg).eval()
    mem.set_attn_implementation("eager")
    mem.load_state_dict({k: t.to(torch.float32) for k, t in model.state_dict().items()})
    if s["legacy"]:
        # The in-memory model has the equivalent new-style config: the legacy file must mean the same.
        check(all(m32.config.rope_parameters[k] == v for k, v in s["rope"].items())
              and m32.config.rope_parameters["rope_theta"] == s["theta"], f"{name}: {m32.config.rope_parameters}")
        check(m32.config.dtype == torch.float32, f"{name}: dtype {m32.config.dtype}")
    f32 = logits_of(m32, tokens)
    check(torch.equal(f32, logits_of(mem, tokens)), f"{name}: reloaded float32 logits differ from in-memory")
    f64 = logits_of(m64, tokens)
    check(torch.equal(f64, logits_of(mem.to(torch.float64), tokens)), f"{name}: float64 load != .to(float64)")
    check(f64.dtype == torch.float64 and f32.dtype == torch.float32, "logit dtypes")
    if s["rope"] and s["rope"].get("factor", 1.0) != 1.0:
        plain_cfg = make_config(dict(s, rope=None))
        plain = DiffLlamaForCausalLM(plain_cfg).eval()
        plain.set_attn_implementation("eager")
        plain.load_state_dict(m64.state_dict())
        d = rel_err(logits_of(plain.to(torch.float64), tokens), f64)
        check(d > 1e-3, f"{name}: rope factor barely matters ({d:.1e})")
    exact = exact_logits(folder, tokens)
    exact_vs_f64 = rel_err(f64, exact)
    check(exact_vs_f64 < 1e-5, f"{name}: exact_logits vs transformers float64: {exact_vs_f64:.2e}")
    f32_vs_f64 = rel_err(f32, f64)

    # Greedy: a prompt whose continuation has no near-tie and no banned token.
    banned = {0, BOS, EOS} if sp else {EOS}
    meta_extra, result = {}, None
    for attempt in range(len(SP_PROMPTS) if sp else 200):
        if sp:
            text = SP_PROMPTS[attempt]
            ids = sp.encode(text)
            check(0 not in ids, f"prompt {text!r} has unknown pieces")
            prompt = torch.tensor([BOS] + ids, dtype=torch.int64)
        else:
            g = torch.Generator().manual_seed(seed + 1000 + attempt)
            prompt = torch.randint(0, V, (P,), generator=g, dtype=torch.int64)
        new = greedy_of(m64, prompt)
        result = check_greedy(m64, folder, prompt, new, banned)
        if not isinstance(result, str):
            break
        if attempt < 3:
            print(f"  {name}: prompt attempt {attempt} rejected: {result}")
    check(not isinstance(result, str), f"{name}: no clean greedy prompt found")
    min_rel, min_abs = result
    if sp:
        meta_extra["prompt.text"] = text
        meta_extra["text"] = SP_SENTENCE
        meta_extra["text.decoded"] = sp.decode(new.tolist())
        meta_extra["text.full"] = sp.decode(prompt[1:].tolist() + new.tolist())
        text_ids = sp.encode(SP_SENTENCE)
        check(0 not in text_ids, "text has unknown pieces")
        check(sp.decode(text_ids) == SP_SENTENCE, "text does not round-trip through sentencepiece")

    tensors = {"tokens": tokens.contiguous(), "logits.f64": f64.contiguous(), "logits.f32": f32.contiguous(),
               "logits.exact": exact.contiguous(), "prompt": prompt.contiguous(), "greedy": new.contiguous()}
    if sp:
        tensors["text.ids"] = torch.tensor(text_ids, dtype=torch.int64)
    summary = (f"V={V} C={s['C']} H={s['H']} Hkv={s['Hkv']} head_dim={s['head_dim']} layers={s['L']} F={s['F']} "
               f"eps={s['eps']:g} theta={s['theta']:g} rope={(s['rope'] or {}).get('rope_type', 'default')}"
               f" factor={(s['rope'] or {}).get('factor', 1.0):g} dtype={s['dtype']} tied={int(s['tied'])}"
               f" shards={len(shards)}")
    meta = {"case": name, "description": s["desc"], "transformers": transformers.__version__,
            "torch": torch.__version__, "generator": "tools/hf_fixtures.py", "config": summary,
            "min_margin": f"{min_rel:.6e}", "min_margin.abs": f"{min_abs:.6e}",
            "exact_vs_f64": f"{exact_vs_f64:.3e}", "f32_vs_f64": f"{f32_vs_f64:.3e}",
            "attn_implementation": "eager", "max_new_tokens": str(K)}
    meta.update(meta_extra)
    path = os.path.join(folder, "expected.safetensors")
    write_safetensors(path, tensors, meta)
    with safe_open(path, "pt") as f:
        check(f.metadata() == meta and set(f.keys()) == set(tensors), "expected.safetensors reads back")
        check(all(torch.equal(f.get_tensor(k), t) for k, t in tensors.items()), "expected.safetensors reads back")

    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    check(size < 300_000, f"{name}: {size} bytes on disk")
    print(f"{name:14s} {size:7d} bytes  {summary}  min_margin={min_rel:.3e}  exact_vs_f64={exact_vs_f64:.1e}"
          f"  f32_vs_f64={f32_vs_f64:.1e}  greedy={new.tolist()}")
    if sp:
        print(f"{'':14s} prompt.text={text!r} text.decoded={meta_extra['text.decoded']!r}")
    return size


def generate_all(cases=None):
    if (torch.__version__.split("+")[0], transformers.__version__) != (WANT_TORCH, WANT_TRANSFORMERS):
        die(f"needs torch {WANT_TORCH} and transformers {WANT_TRANSFORMERS} (have {torch.__version__}, "
            f"{transformers.__version__}); see tools/make_fixtures.py's docstring")
    os.makedirs(HF_DIR, exist_ok=True)
    sp_bytes = train_sentencepiece()
    check(train_sentencepiece() == sp_bytes, "sentencepiece training is not deterministic")
    unknown = set(cases or []) - {c["name"] for c in CASES}
    if unknown:
        die(f"unknown cases {sorted(unknown)}")
    total = 0
    for i, case in enumerate(CASES):  # a case's seeds follow its index, so --cases rewrites the same bytes
        if not cases or case["name"] in cases:
            total += make_case(i, case, sp_bytes if case.get("tokenizer") else None)
    print(f"{'total':14s} {total:7d} bytes")
    return 0


# ----------------------------------------------------------------------------
# Round trip through difftx convert (HF -> difftx -> HF).
# ----------------------------------------------------------------------------

def roundtrip(binary, cases=None):
    """For each case folder: difftx convert --input <case> --output TMP/ours.safetensors, then
    difftx convert --input TMP/ours.safetensors --output TMP/hf_back; load TMP/hf_back with
    DiffLlamaForCausalLM.from_pretrained (float64, eager) and compare its logits on `tokens` with
    logits.f64 (max|a - b| / max|b| <= 2e-6). One line per case; exit code 1 on any failure."""
    binary = os.path.abspath(binary)
    if not os.access(binary, os.X_OK):
        die(f"{binary} is not an executable")
    names = cases or sorted(d for d in os.listdir(HF_DIR) if os.path.isfile(os.path.join(HF_DIR, d, "config.json")))
    if not names:
        die(f"no case folder under {HF_DIR}")
    failed = 0
    for name in names:
        folder = os.path.join(HF_DIR, name)
        tmp = tempfile.mkdtemp(prefix=f"difftx_roundtrip_{name}_")
        ours, back = os.path.join(tmp, "ours.safetensors"), os.path.join(tmp, "hf_back")
        status = ""
        try:
            for src, dst in ((folder, ours), (ours, back)):
                r = subprocess.run([binary, "convert", "--input", src, "--output", dst], capture_output=True,
                                   text=True, timeout=600)
                if r.returncode != 0:
                    tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
                    raise RuntimeError(f"difftx convert --input {src} --output {dst}: exit {r.returncode}: {tail[0]}")
            if not os.path.isfile(ours):
                raise RuntimeError(f"{ours} was not written")
            if not os.path.isfile(os.path.join(back, "config.json")):
                raise RuntimeError(f"{back}/config.json was not written")
            exp = load_file(os.path.join(folder, "expected.safetensors"))
            model = load(back, torch.float64)
            got = logits_of(model, exp["tokens"])
            if got.shape != exp["logits.f64"].shape:
                raise RuntimeError(f"logits shape {tuple(got.shape)} != {tuple(exp['logits.f64'].shape)}")
            err = rel_err(got, exp["logits.f64"])
            ok = err <= ROUNDTRIP_BAR
            status = f"{'pass' if ok else 'FAIL'}  max|a-b|/max|b| = {err:.2e} (bar {ROUNDTRIP_BAR:.0e})"
        except Exception as e:  # noqa: BLE001 -- one line per case, whatever went wrong
            ok, status = False, f"FAIL  {type(e).__name__}: {e}"
        print(f"{name:14s} {status}" + ("" if ok else f"  (files kept in {tmp})"), flush=True)
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        failed += not ok
    print(f"roundtrip: {len(names) - failed}/{len(names)} cases pass")
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roundtrip", metavar="DIFFTX", help="check `DIFFTX convert` both ways on every case folder")
    ap.add_argument("--cases", nargs="+", help="only these case folders (generation or --roundtrip)")
    args = ap.parse_args(argv)
    if args.roundtrip:
        return roundtrip(args.roundtrip, args.cases)
    return generate_all(args.cases)


if __name__ == "__main__":
    sys.exit(main())
