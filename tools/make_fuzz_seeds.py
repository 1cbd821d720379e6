#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets under fuzz/corpus/<target>/.

    python3 tools/make_fuzz_seeds.py

Python's standard library only; the same files every time (fixed values, no
randomness), so the committed seeds can be regenerated and compared:
  fuzz_npy/          two small files from tests/data/npy and .npy files of each
                     version (1.0, 2.0, 3.0), float32/float64, rank 0 to 3, an empty shape
  fuzz_safetensors/  tests/data/rmsnorm.safetensors, the weights of two other
                     fixtures (trimmed: no gradients, inputs or outputs), and files
                     of each dtype with metadata, a scalar and an empty tensor
  fuzz_run/          one complete `difftx run` per module kind, in fuzz_run's input
                     format (fuzz/fuzz_run.cpp): arguments, then the weights, the
                     input and dY, separated by "\\n%%\\n"; each runs with exit code 0
  fuzz_tokenizer_json/ each tokenizer.json of tests/data/tokenizer trimmed (its first
                     merges, the tokens they and the file's other parts need), some
                     followed by "\\n%%\\n" and a short text (fuzz/fuzz_tokenizer_json.cpp)
It writes only the files it names (a regression input added by hand stays).
"""
import json
import math
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
DATA = ROOT / "tests" / "data"
SEPARATOR = b"\n%%\n"


# --- encoding --------------------------------------------------------------

def encode(dtype, values):
    if dtype in ("F64", "<f8"):
        return struct.pack(f"<{len(values)}d", *values)
    if dtype in ("F32", "<f4"):
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    if dtype == "BF16":  # the top half of the float32 bits (rounding toward zero)
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    raise ValueError(dtype)


def values(count, scale=0.25, phase=0):
    """count fixed values in [-scale, scale], none zero."""
    return [round(scale * math.sin(1.3 * (i + phase) + 0.4), 4) or scale / 8 for i in range(count)]


def numel(shape):
    n = 1
    for e in shape:
        n *= e
    return n


def safetensors(tensors, metadata=None):
    """tensors: {name: (dtype, shape, values)} in name order, as difftx writes them."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dtype, shape, vals = tensors[name]
        raw = encode(dtype, vals)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def npy(descr, shape, vals, version=1, quote="'"):
    dims = ", ".join(str(e) for e in shape) + ("," if len(shape) == 1 else "")
    q = quote
    header = f"{{{q}descr{q}: {q}{descr}{q}, {q}fortran_order{q}: False, {q}shape{q}: ({dims}), }}".encode()
    size_bytes = 2 if version == 1 else 4
    unpadded = 6 + 2 + size_bytes + len(header) + 1
    header += b" " * (-unpadded % 64) + b"\n"
    size = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header + encode(descr, vals)


def read_safetensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def trimmed(path, keep):
    """The tensors of a fixture whose names keep() accepts, with its metadata."""
    header, data = read_safetensors(path)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__" or not keep(name):
            continue
        begin, end = entry["data_offsets"]
        fmt = {"F64": "d", "F32": "f", "F16": "e"}[entry["dtype"]]
        size = struct.calcsize(fmt)
        vals = list(struct.unpack(f"<{(end - begin) // size}{fmt}", data[begin:end]))
        out[name] = (entry["dtype"], entry["shape"], vals)
    return safetensors(out, header.get("__metadata__"))


# --- module weights --------------------------------------------------------

def weights(module, dtype, C, heads=1, kv_heads=None, D=2, F=8, prefix=""):
    """The spec's parameter names and shapes for one module (tools/difftx/module_kinds.hpp's kinds)."""
    g = kv_heads or heads
    t = {}

    def add(name, shape, scale=0.25, phase=0):
        t[prefix + name] = (dtype, shape, values(numel(shape), scale, phase + len(t)))

    if module == "rmsnorm":
        add("weight", [C], 1.0)
    elif module == "swiglu":
        add("gate_proj.weight", [F, C])
        add("up_proj.weight", [F, C])
        add("down_proj.weight", [C, F])
    elif module == "attention":
        add("q_proj.weight", [heads * D, C])
        add("k_proj.weight", [g * D, C])
        add("v_proj.weight", [g * D, C])
        add("out_proj.weight", [C, heads * D])
    elif module == "multihead":
        add("q_proj.weight", [2 * heads * D, C])
        add("k_proj.weight", [2 * g * D, C])
        add("v_proj.weight", [2 * g * D, C])
        add("out_proj.weight", [C, 2 * heads * D])
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            add(name, [D], 0.1)
        add("subln.weight", [2 * D], 1.0)
    elif module == "decoder_layer":
        add("attn_norm.weight", [C], 1.0)
        add("ffn_norm.weight", [C], 1.0)
        t.update(weights("multihead", dtype, C, heads, kv_heads, D, F, prefix + "attn."))
        t.update(weights("swiglu", dtype, C, heads, kv_heads, D, F, prefix + "ffn."))
    else:
        raise ValueError(module)
    return t


def run_seed(arguments, weight_file, x, dy=None):
    parts = [arguments.encode(), weight_file, x] + ([dy] if dy is not None else [])
    for p in parts[1:]:
        assert SEPARATOR not in p, "a file holds the separator: change its values"
    return SEPARATOR.join(parts)


# --- the corpora -----------------------------------------------------------

def npy_seeds():
    seeds = {
        "lambda_f32_rank0.npy": (DATA / "npy" / "diff_attn_causal.lambda.f32.npy").read_bytes(),
        "lambda_f64_rank0.npy": (DATA / "npy" / "diff_attn_causal.lambda.f64.npy").read_bytes(),
        "f32_2x3_v1.npy": npy("<f4", [2, 3], values(6)),
        "f64_1x2x2_v1.npy": npy("<f8", [1, 2, 2], values(4)),
        "f32_3_v2.npy": npy("<f4", [3], values(3), version=2),
        "f64_2x1_v3_doublequotes.npy": npy("<f8", [2, 1], values(2), version=3, quote='"'),
        "f32_0x4_empty.npy": npy("<f4", [0, 4], []),
    }
    return seeds


def safetensors_seeds():
    weights_only = lambda name: not name.startswith("grad") and name not in ("input", "output")
    seeds = {
        "rmsnorm_fixture.safetensors": (DATA / "rmsnorm.safetensors").read_bytes(),
        "multihead_n1_weights.safetensors": trimmed(DATA / "multihead_n1.safetensors", weights_only),
        "swiglu_weights.safetensors": trimmed(DATA / "swiglu.safetensors", weights_only),
        "each_dtype_metadata.safetensors": safetensors(
            {"a.f64": ("F64", [2], values(2)), "b.f32": ("F32", [2, 2], values(4)),
             "c.f16": ("F16", [3], values(3)), "d.bf16": ("BF16", [1, 2], values(2))},
            {"generator": "tools/make_fuzz_seeds.py", "note": "one tensor of each dtype"}),
        "scalar_and_empty.safetensors": safetensors(
            {"empty": ("F32", [0, 3], []), "scalar": ("F64", [], [1.5]), "vector": ("BF16", [4], values(4))}),
        "empty_file.safetensors": safetensors({}),
    }
    return seeds


def run_seeds():
    common = "--weights w --input x --output y"
    backward = "--grad-output dy --grad-input dx --grad-weights dw"
    C, B, N = 4, 1, 3
    x32 = npy("<f4", [B, N, C], values(B * N * C, 1.0, 7))
    x64 = npy("<f8", [B, N, C], values(B * N * C, 1.0, 7))
    dy32 = npy("<f4", [B, N, C], values(B * N * C, 0.5, 11))
    seeds = {
        "rmsnorm_float64.run": run_seed(f"--module rmsnorm {common} --dtype float64 --eps 1e-6",
                                        safetensors(weights("rmsnorm", "F64", C)), x64),
        "swiglu_backward.run": run_seed(f"--module swiglu {common} {backward} --ffn-dim 8",
                                        safetensors(weights("swiglu", "F32", C)), x32, dy32),
        "multihead_gqa_float16.run": run_seed(
            f"--module multihead {common} --heads 2 --kv-heads 1 --layer-index 3 --dtype float16",
            safetensors(weights("multihead", "F16", C, heads=2, kv_heads=1)), x32),
        "attention_noncausal_backward.run": run_seed(
            f"--module attention {common} {backward} --heads 2 --no-causal --rope-theta 500 --policy reference",
            safetensors(weights("attention", "F32", C, heads=2, D=4)), x32, dy32),
        "decoder_layer_bfloat16_backward.run": run_seed(
            f"--module decoder_layer {common} {backward} --dtype bfloat16 --threads 1",
            safetensors(weights("decoder_layer", "BF16", C)), x32, dy32),
        "decoder_layer_float64_d8.run": run_seed(
            f"--module decoder_layer {common} --dtype float64 --layer-index 1 --eps 1e-5",
            safetensors(weights("decoder_layer", "F64", C, D=8, F=6)), x64),
    }
    return seeds


def trimmed_tokenizer(path, merges=24):
    """A tokenizer.json with its first merges only and the tokens they, the single characters and
    the file's unk_token need (ids kept), as compact JSON."""
    j = json.loads(path.read_text(encoding="utf-8"))
    model = j["model"]
    kept = model["merges"][:merges]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in kept]
    needed = {t for a, b in pairs for t in (a, b, a + b)}
    needed |= {t for t in model["vocab"] if len(t) == 1 or (t.startswith("<0x") and len(t) == 6)}
    if model.get("unk_token"):
        needed.add(model["unk_token"])
    model["vocab"] = {t: i for t, i in model["vocab"].items() if t in needed}
    model["merges"] = kept
    return json.dumps(j, ensure_ascii=False, separators=(",", ":")).encode()


def tokenizer_seeds():
    folder = DATA / "tokenizer"
    texts = [b"", SEPARATOR + "Hello w\u00f6rld 123 <|begin_of_text|>it's\n\t \U0001F600 <s>x</s>".encode(),
             SEPARATOR + "\u2581a \u2581\u2581b\r\n99999 \u0645\u0631\u062d\u0628\u0627".encode()]
    seeds = {}
    for i, name in enumerate(["llama3", "gpt2", "llama2", "llama2_legacy", "metaspace_split", "sp_converted"]):
        seeds[f"{name}.json"] = trimmed_tokenizer(folder / name / "tokenizer.json") + texts[i % 3]
    return seeds


def main():
    for target, seeds in (("fuzz_npy", npy_seeds()), ("fuzz_safetensors", safetensors_seeds()),
                          ("fuzz_run", run_seeds()), ("fuzz_tokenizer_json", tokenizer_seeds())):
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
        print(f"{folder.relative_to(ROOT)}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")


if __name__ == "__main__":
    main()
