#!/usr/bin/env python3
"""One question's raw outputs from benchmarks/measure_cpu.sh -> its results
file (JSON on stdout), the input of benchmarks/render_benchmarks.py:

  {"question", "order", "machine", "date", "quiet", "reproduce",
   "tables": [{"caption", "columns", "rows", "commands"}], "reading"}

Rows hold the figures as they are printed. The reading is
benchmarks/questions.json's template for the question, filled with the
figures here, so that a new measurement cannot keep an old conclusion.

    python3 benchmarks/collect_cpu.py QUESTION RAW_DIR > benchmarks/results/QUESTION.json

Environment (set by measure_cpu.sh): QUIET_STATE (yes, no, unchecked), LOAD
(the load averages when the question finished), THREADS, HAS_PEERS (1 where
torch and transformers were found), DIFFTX (the tool, for its instruction set).
"""

import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx512_fp16",
         "amx_tile", "amx_bf16", "amx_int8"]


def cpuinfo():
    info, flags = {}, []
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key in ("model name", "cpu family", "model") and key not in info:
                info[key] = value
            if key == "flags" and not flags:
                flags = value.split()
    return info, [f for f in FLAGS if f in flags]


def machine(threads):
    info, flags = cpuinfo()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = info.get("model name", platform.processor() or "unknown CPU")
    if "cpu family" in info:
        cpu += f" (family {info['cpu family']}, model {info.get('model', '?')})"
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB; flags: {' '.join(flags) or 'none of ' + ', '.join(FLAGS)}; "
            f"{threads} threads per contender, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")


def read_json_lines(path):
    """The last JSON object printed in a file (tools print text, then one JSON line)."""
    with open(path) as f:
        lines = [l for l in f.read().splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


def bench_rows(path):
    """Google Benchmark JSON -> {name without /real_time: row}; with repetitions, the median aggregate."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        name = b.get("run_name", b["name"]).replace("/real_time", "")
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("run_type") == "aggregate" or name not in out:
            out[name] = b
    return out


def commands(raw, *names):
    out = []
    for n in names:
        for path in sorted(glob.glob(os.path.join(raw, n + ".cmd"))):
            with open(path) as f:
                out += [l for l in f.read().splitlines() if l]
    return out


def ms(x):
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def span(values, fmt="{:.2f}x"):
    values = [v for v in values if v]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if abs(hi - lo) < 0.005 else fmt.format(lo) + "–" + fmt.format(hi)


def quiet_note():
    state = os.environ.get("QUIET_STATE", "unchecked")
    load = os.environ.get("LOAD", "?")
    if state == "yes":
        return f"Measured on a quiet machine (no compiler, ninja or ctest for 60 s before; load averages {load} after)."
    if state == "no":
        return (f"The machine never got quiet (other builds ran; load averages {load} after): these timings are "
                f"slower and noisier than the machine can do.")
    return f"Measured without waiting for a quiet machine (load averages {load} after)."


def policy_detail():
    try:
        out = subprocess.run([os.environ["DIFFTX"], "bench", "--module", "rmsnorm", "--batch", "1", "--seq", "1",
                              "--d-model", "8", "--repeats", "1", "--json"], capture_output=True, text=True, check=True)
        return read_json_text(out.stdout)["policy_detail"]
    except (KeyError, OSError, subprocess.CalledProcessError, ValueError):
        return "simd"


def table(caption, columns, rows, cmds):
    """One table of a results file."""
    return {"caption": caption, "columns": columns, "rows": rows, "commands": cmds}


def read_json_text(text):
    return json.loads([l for l in text.splitlines() if l.startswith("{")][-1])


# --- one function per question: its tables, and the figures its reading quotes ----

def layers(raw, threads):
    path = os.path.join(raw, "benchmarks.json")
    if not os.path.exists(path):
        sys.exit("collect_cpu: layers needs the PyTorch peer (PYTHON with torch)")
    with open(path) as f:
        data = json.load(f)
    rows, op_rows, vs_naive, vs_sdpa = [], [], [], []
    sgemm = data["machine"]["eigen_sgemm_2048_gflops"]
    for r in data["rows"]:
        for key, label in (("forward", "forward"), ("forward_backward", "forward + backward")):
            d, n, s = r[f"difftx_{key}_ms"], r[f"naive_{key}_ms"], r[f"sdpa_{key}_ms"]
            vs_naive.append(n / d)
            vs_sdpa.append(s / d if s else None)
            rows.append([str(r["N"]), label, ms(d), ms(n), ms(s) if s else "n/a", ratio(n, d), ratio(s, d),
                         ms(r[f"baseline_{key}_ms"])])
        op_rows.append([str(r["N"])] + [f"{r[f'op_{op}_{p}_gflops']:.0f}" for op in ("diff_attention", "attention")
                                        for p in ("forward", "backward")]
                       + [f"{r['op_diff_attention_forward_gflops'] / sgemm:.0%}",
                          f"{r['op_diff_attention_backward_gflops'] / sgemm:.0%}"])
    cmd = commands(raw, "peer.txt")
    torch_version = data["machine"].get("torch", "?")
    tables = [
        table(f"MultiHead, B = 1, C = 768, h = 6 differential heads of 2 x 64, causal, float32; milliseconds "
              f"(difftx: Google Benchmark, PyTorch {torch_version}: median of 3 after a warm-up). "
              f"Ratios are PyTorch's time over difftx's. The last column is difftx's matched baseline "
              f"`Attention` (12 standard heads of 64).",
              ["N", "pass", "difftx", "PyTorch naive", "PyTorch SDPA", "naive / difftx", "SDPA / difftx",
               "difftx baseline"],
              rows, cmd),
        table(f"The fused attention op alone, GFLOP/s over the causal (query, key) pairs; Eigen's SGEMM "
              f"at 2048³ on the same threads: {sgemm:.0f} GFLOP/s.",
              ["N", "differential fwd", "differential bwd", "standard fwd", "standard bwd",
               "differential fwd / SGEMM", "differential bwd / SGEMM"],
              op_rows, [])]
    return tables, {"vs_naive": span(vs_naive), "vs_sdpa": span(vs_sdpa)}


def bfloat16(raw, threads):
    rows, speed = [], []
    for m in ("multihead", "swiglu", "decoder_layer"):
        f = read_json_lines(os.path.join(raw, f"{m}.float32.json"))
        b = read_json_lines(os.path.join(raw, f"{m}.bfloat16.json"))
        for key, label in (("forward_ms", "forward"), ("forward_backward_ms", "forward + backward")):
            speed.append(f[key] / b[key])
            rows.append([m, label, ms(f[key]), ms(b[key]), ratio(f[key], b[key]), b["policy_detail"]])
    tables = [table("B = 1, N = 2048, C = 768, h = 6 (SwiGLU: F = 2048), causal; median milliseconds of 3 "
                    "after a warm-up. The last column is what bfloat16's products ran on.",
                    ["module", "pass", "float32 ms", "bfloat16 ms", "bfloat16 speed vs float32", "bfloat16 policy"],
                    rows, commands(raw, "*.float32.json", "*.bfloat16.json"))]
    return tables, {"speed": span(speed)}


def linear(raw, threads):
    ours = bench_rows(os.path.join(raw, "difftx_bench.json"))
    peer = {}
    if os.path.exists(os.path.join(raw, "peer.json")):
        p = read_json_lines(os.path.join(raw, "peer.json"))
        peer = {(r["dtype"], f"{r['M']}x{r['N']}x{r['K']}", r["pass"]): r["gflops"] for r in p["rows"]}
    rows, onednn_vs, torch_vs, packed_vs = [], [], [], []
    for dtype in ("float32", "bfloat16", "int8"):
        for shape in ("2048x2048x2048", "512x4096x1024", "512x1024x4096", "8x4096x1024", "32x4096x1024"):
            for p in ("forward", "backward"):
                d = ours.get(f"op:linear/simd/{dtype}/difftx/{p}/{shape}", {}).get("GFLOP/s")
                o = ours.get(f"op:linear/simd/{dtype}/onednn/{p}/{shape}", {}).get("GFLOP/s")
                packed = ours.get(f"op:linear/simd/{dtype}/onednn_packed/{p}/{shape}", {}).get("GFLOP/s")
                t = peer.get((dtype, shape, p))
                if d is None:
                    continue
                onednn_vs.append(o / d if o else None)
                packed_vs.append(packed / o if packed and o else None)
                torch_vs.append(t / d if t else None)
                rows.append([dtype, shape.replace("x", " x "), p, f"{d:.0f}", f"{o:.0f}" if o else "not built",
                             f"{packed:.0f}" if packed else "–", f"{t:.0f}" if t else "not run",
                             ratio(o, d) if o else "n/a", ratio(packed, o) if packed and o else "n/a",
                             ratio(t, d) if t else "n/a"])
    tables = [table("GFLOP/s of Linear's products on M tokens x N outputs x K inputs (forward y = x·wᵀ; "
                    "backward dx = dy·w and dw += dyᵀ·x); 2048³, a 375M model's prefill shapes "
                    "(512 tokens, C 1024 to F 4096 and back), and 8 and 32 rows. difftx: `policy::simd{.matmuls = difftx}`, "
                    "oneDNN: `.matmuls = onednn` (Google Benchmark), and on weights packed once into the "
                    "layout its kernel reads (`pack_weights`, forward only); PyTorch: `torch.nn.functional.linear` "
                    "and two matmuls, median of 5. int8: int8 weights and a float32 input quantized on "
                    "each call, forward only (oneDNN: u8·s8→s32, the same sums as difftx's); PyTorch: "
                    "`torch.ao.quantization.quantize_dynamic` on an `nn.Linear`.",
                    ["dtype", "M x N x K", "pass", "difftx", "oneDNN", "oneDNN packed", "PyTorch",
                     "oneDNN / difftx", "packed / unpacked", "PyTorch / difftx"],
                    rows, commands(raw, "difftx_bench.json", "peer.json"))]
    by_dtype = {t: span([v for (r, v) in zip(rows, onednn_vs) if r[0] == t]) for t in ("float32", "bfloat16", "int8")}
    return tables, {**by_dtype, "torch": span(torch_vs), "packed": span(packed_vs)}


def spinning_share(path):
    """The decode's share of its bound in a run with spinning threads, or "not run"."""
    return f"{read_json_lines(path)['decode_share_of_bound']:.0%}" if os.path.exists(path) else "not run"


def checkpoint(raw, threads):
    rows, prefill_x, decode_x = [], [], []
    model_line = ""
    # (the results' name, the row's label, what the peer columns say without a peer run); the int8 row is
    # optional: transformers has no int8 weights on the CPU
    for t, label, no_peer in (("float32", "float32", "not run"), ("bfloat16", "bfloat16", "not run"),
                              ("bfloat16-converting", "bfloat16, products converted to float", "as bfloat16"),
                              ("int8", "float32, int8 weights", "no int8 weights")):
        path = os.path.join(raw, f"difftx.{t}.json")
        if t in ("int8", "bfloat16-converting") and not os.path.exists(path):
            continue
        d = read_json_lines(path)
        peer_path = os.path.join(raw, f"peer.{t}.txt")
        p = read_json_lines(peer_path) if os.path.exists(peer_path) else None
        p_prefill = p["prompt_tokens"] / p["prefill_ms"] * 1e3 if p else None
        p_decode = p["decode_tokens_per_s"] if p else None
        prefill_x.append(d["prefill_tokens_per_s"] / p_prefill if p else None)
        decode_x.append(d["decode_tokens_per_s"] / p_decode if p else None)
        rows.append([label, f"{d['prefill_tokens_per_s']:.0f}", f"{p_prefill:.0f}" if p else no_peer,
                     f"{d['decode_tokens_per_s']:.1f}", f"{p_decode:.1f}" if p else no_peer,
                     ratio(d["decode_tokens_per_s"], p_decode) if p else "n/a",
                     f"{d['decode_share_of_bound']:.0%}" if "decode_share_of_bound" in d else "n/a",
                     spinning_share(os.path.join(raw, f"difftx.{t}.spinning.json"))])
        if p and not model_line:
            model_line = f"{p['parameters'] / 1e6:.0f}M parameters; transformers {p['transformers']}, torch {p['torch']}"
    cmds = commands(raw, "make", "difftx.float32.json", "peer.float32.txt", "difftx.bfloat16.json", "peer.bfloat16.txt",
                    "difftx.int8.json", "difftx.bfloat16-converting.json", "difftx.float32.spinning.json",
                    "difftx.bfloat16.spinning.json", "difftx.int8.spinning.json",
                    "difftx.bfloat16-converting.spinning.json")
    f32 = read_json_lines(os.path.join(raw, "difftx.float32.json"))
    prompt, new = f32["prompt_tokens"], f32["new_tokens"]
    tables = [table(f"A random DiffLlama folder shaped like a 375M Llama-3 model (C 1024, 16 layers, 16 heads "
                    f"of 64 as transformers counts them, 4 key/value heads, F 4096, V 128256 tied, llama3 "
                    f"RoPE; {model_line or 'transformers not run'}), loaded in each dtype. A prompt of {prompt} "
                    f"random tokens in one prefill, then {new} greedy decode steps; medians of 3. transformers: "
                    f"`generate` with SDPA attention; its decode time is generate({new}) minus generate(1). "
                    f"\"of bound\": difftx's decode step time against the time this machine takes to read the "
                    f"bytes a step must read (weights and cache), measured between steps by a plain read that "
                    f"prefetches as the products do (memory_read.hpp). \"spinning\": the "
                    f"same share with OMP_WAIT_POLICY=active, OpenMP's idle threads spinning between steps too "
                    f"(within a step the step's own team spins between parts either way, step_team.hpp). "
                    f"\"products converted "
                    f"to float\": bfloat16 with `--bf16-product converting`, the path of CPUs without "
                    f"AVX512_BF16, where `automatic` decodes on the dot-product instruction.",
                    ["dtype", "difftx prefill tokens/s", "transformers prefill tokens/s",
                     "difftx decode tokens/s", "transformers decode tokens/s", "decode: difftx / transformers",
                     "difftx decode of bound", "of bound, spinning"],
                    rows, cmds)]
    products, streamed = decode_products(raw)
    if products:
        tables.append(products)
    return tables, {"decode": span(decode_x), "prefill": span(prefill_x), "products": streamed}


def decode_products(raw):
    """The decode_product benchmarks (decode_products_bench.cpp) as one table: each weight's products
    against a plain read of their bytes, by matrix size, with sleeping and with spinning threads; and the
    reading's summary, the spinning shares at 8 MB (a layer's matrix)."""
    labels = {"float32": "float32", "bfloat16_vdpbf16ps": "bfloat16 on vdpbf16ps",
              "bfloat16_converting": "bfloat16 converted to float", "int8": "float32, int8 weights",
              "bfloat16_amx_8_rows": "bfloat16, 8 rows of x on AMX tiles"}
    runs = {}  # waiting -> weights -> size in MB -> the benchmark's row
    for policy, waiting in (("passive", "sleeping"), ("active", "spinning")):
        path = os.path.join(raw, f"products.{policy}.json")
        if os.path.exists(path):
            for name, r in bench_rows(path).items():
                _, weights, size = name.replace("/manual_time", "").split("/")[:3]
                runs.setdefault(waiting, {}).setdefault(weights, {})[int(size.split(":")[1])] = r
    if not runs:
        return None, "not measured"
    sizes = sorted({mb for by_weights in runs.values() for by_size in by_weights.values() for mb in by_size})
    rows, streamed = [], []
    for waiting, by_weights in runs.items():
        for weights, by_size in by_weights.items():
            label = labels.get(weights, weights)
            rows.append([label, waiting] +
                        [f"{by_size[mb]['share_of_read']:.0%}" if mb in by_size else "n/a" for mb in sizes] +
                        [f"{by_size[max(by_size)]['read_GBps']:.0f}"])
            if waiting == "spinning" and 8 in by_size:
                streamed.append(f"{by_size[8]['share_of_read']:.0%} ({label})")
    return table("Decoding's products alone (`linear_forward` on one row of x, K = 1024; 8 rows for the AMX "
                 "tiles' row, 8 prompts decoded together), over matrices of each "
                 "size making 1 GB (more than a server's last-level cache), each its own product and parallel "
                 "region as a decode step's are, against "
                 "a plain read of the same bytes on the same threads just before, which prefetches as the "
                 "products do (Google Benchmark, median of 3 repetitions): the share is the read's time over the "
                 "products'. A decode step of the folder "
                 "above reads matrices of 1 to 32 MB and a head of 128 to 512 MB. Threads between products: "
                 "sleeping (OMP_WAIT_POLICY=passive) or spinning (active).",
                 ["weights", "threads between products"] + [f"{mb} MB" for mb in sizes] +
                 [f"read GB/s ({sizes[-1]} MB)"],
                 rows, commands(raw, "products.passive.json", "products.active.json")), ", ".join(streamed)


def generation(raw, threads):
    name, g = next(iter(bench_rows(os.path.join(raw, "generate.json")).items()))
    prompts, prompt_tokens, new = (int(part.split(":")[1]) for part in name.split("/")[2:5])
    batched, alone = ({k[len(way) + 1:]: v for k, v in g.items() if k.startswith(way + "_")}
                      for way in ("batched", "one_at_a_time"))
    step_ms = 1e3 / alone["decode_tokens_per_s"]  # one prompt's decode step, its greedy pick included
    samplers = bench_rows(os.path.join(raw, "sampler.json"))
    chain_rows, shares = [], []
    for n, r in samplers.items():
        _, chain, logits, _ = n.split("/")
        us = r["real_time"] if r.get("time_unit") == "us" else r["real_time"] * 1e3
        shares.append(us / 1e3 / step_ms)
        chain_rows.append([chain.replace("_", " "), logits, f"{us:.0f}", f"{us / 1e3 / step_ms:.1%}"])
    peers = {}
    for b in (1, 8):
        path = os.path.join(raw, f"peer.{b}.txt")
        if os.path.exists(path):
            peers[b] = read_json_lines(path)
    base = alone["decode_tokens_per_s"]
    rows = [["difftx, one prompt at a time", ms(alone["prefill_ms"]), f"{alone['decode_tokens_per_s']:.1f}",
             f"{alone['tokens_per_s']:.1f}", "1.00x"],
            [f"difftx, {prompts} prompts at once", ms(batched["prefill_ms"]), f"{batched['decode_tokens_per_s']:.1f}",
             f"{batched['tokens_per_s']:.1f}", f"{g['decode_ratio']:.2f}x"]]
    no_amx = None  # where the CPU has AMX tiles (on by default), the same without them: its own run, its own ratio
    if os.path.exists(os.path.join(raw, "generate.no-amx.json")):
        no_amx = next(iter(bench_rows(os.path.join(raw, "generate.no-amx.json")).values()))
        rows[1][0] += ", AMX tiles"
        rows.append([f"difftx, {prompts} prompts at once, no AMX tiles", ms(no_amx["batched_prefill_ms"]),
                     f"{no_amx['batched_decode_tokens_per_s']:.1f}", f"{no_amx['batched_tokens_per_s']:.1f}",
                     f"{no_amx['decode_ratio']:.2f}x"])
    for b, p in sorted(peers.items()):
        # transformers' prefill is one generate(1) over the batch; one prompt at a time, prompts times that.
        prefill = p["prefill_ms"] * (prompts if b == 1 else 1)
        total = prompts * new / ((prefill + (new - 1) * p["decode_ms_per_token"] * (prompts if b == 1 else 1)) / 1e3)
        label = "one prompt at a time" if b == 1 else f"{p['batch']} prompts at once"
        rows.append([f"transformers, {label}", ms(prefill),
                     f"{p['decode_tokens_per_s']:.1f}", f"{total:.1f}", ratio(p["decode_tokens_per_s"], base)])
    cmds = commands(raw, "make", "sampler.json", "generate.json", "generate.no-amx.json", "peer.1.txt", "peer.8.txt")
    model = (f"{peers[8]['parameters'] / 1e6:.0f}M parameters; transformers {peers[8]['transformers']}, "
             f"torch {peers[8]['torch']}") if 8 in peers else "transformers not run"
    tables = [table(f"The sampler chain on one row of bfloat16 logits of V = 128256 (Google Benchmark, median of 3 "
                    f"repetitions; the history a prompt of 512 tokens), and its share of one decode step of the "
                    f"375M folder below ({step_ms:.1f} ms: difftx, bfloat16, one prompt at a time). peaked: N(0, 2.5²) "
                    f"with 1000 tokens raised by 14/√rank, a trained model's shape; flat: N(0, 3²), a random "
                    f"model's, where top-p keeps thousands of tokens. Chains: temperature 0.7; Llama-3's defaults "
                    f"temperature 0.6, top-k 50, top-p 0.9; top-p 0.9; min-p 0.05; everything: repetition 1.1, "
                    f"presence and frequency 0.5, temperature 0.8, top-k 40, top-p 0.95, min-p 0.05.",
                    ["chain", "logits", "µs per token", "of a decode step"], chain_rows,
                    commands(raw, "sampler.json")),
              table(f"The 375M DiffLlama folder of \"Decoding a checkpoint\" ({model}), bfloat16: {prompts} prompts "
                    f"of {prompt_tokens} random tokens, {new} greedy new tokens each (no stop token). difftx: "
                    f"`generate(model, prompts, options)` (one packed prefill, then decode steps of one token per "
                    f"prompt over one cache) against `generate(model, prompt, options)` for each, the two in turn "
                    f"in each of 5 runs; medians (the ratio: the median of the runs' ratios). "
                    f"transformers: `generate` on a batch of {prompts} (equal lengths, no padding) and on one "
                    f"prompt, SDPA attention, its decode time generate({new}) minus generate(1), medians of 3; "
                    f"one prompt at a time is that prompt's times {prompts}. prefill ms: until every prompt has its "
                    f"first token; decode tokens/s: the tokens after each prompt's first over the time after the "
                    f"prefill; tokens/s: all {prompts * new} new tokens over the whole time."
                    + (" No AMX tiles: the same runs with `policy::simd::amx_tiles` off (the tool's `--no-amx`), "
                       "its ratio against its own one at a time." if no_amx else ""),
                    ["contender", "prefill ms", "decode tokens/s", "tokens/s", "decode vs difftx one at a time"],
                    rows, cmds)]
    values = {"prompts": prompts, "decode": f"{g['decode_ratio']:.2f}x",
              "total": ratio(batched["tokens_per_s"], alone["tokens_per_s"]),
              "vs_transformers": ratio(batched["decode_tokens_per_s"], peers[8]["decode_tokens_per_s"]) if 8 in peers
              else "n/a",
              "transformers_batch": ratio(peers[8]["decode_tokens_per_s"], peers[1]["decode_tokens_per_s"])
              if 1 in peers and 8 in peers else "n/a",
              "chain": f"{max(shares):.1%}", "step_ms": f"{step_ms:.1f}",
              "amx": (f" On this CPU the batch's bfloat16 products stream the weights once on AMX tiles "
                      f"(tdpbf16ps), a tile row per line of the weights however many prompts. Without them "
                      f"(`--no-amx`, or a CPU without AMX) {prompts} rows are more than decoding's streamed "
                      f"products take, and oneDNN's matrix product runs them: {prompts} prompts then decode at "
                      f"{no_amx['decode_ratio']:.2f}x one prompt's speed, and the batch on tiles is "
                      f"{ratio(batched['decode_tokens_per_s'], no_amx['batched_decode_tokens_per_s'])} the batch "
                      f"without them." if no_amx else "")}
    return tables, values


def lowbit(raw, threads):
    configs = [("f32", "float32", "float32"), ("bf16", "bfloat16", "bfloat16"), ("int8", "int8", "int8"),
               ("w8", "int8", "float32"), ("kv8", "float32", "int8")]
    rows, best = [], []
    for t in sorted({1, int(threads)}):
        base = {k: read_json_lines(os.path.join(raw, f"{k}.{t}.json"))["decode_step_ms"] for k, _, _ in configs}
        for k, w, kv in configs:
            step = base[k]
            rows.append([str(t), w, kv, ms(step), f"{1e3 / step:.0f}", ratio(base["f32"], step), ratio(base["bf16"], step)])
        best.append((t, base["f32"] / base["int8"], base["bf16"] / base["int8"]))
    qk = {k: read_json_lines(os.path.join(raw, f"qk.{k}.json")) for k in ("same", "int8")}
    qk_rows = [[("float32" if k == "same" else "int8"), ms(qk[k]["forward_ms"]),
                ratio(qk["same"]["forward_ms"], qk[k]["forward_ms"])] for k in ("same", "int8")]
    tables = [
        table("One decode step of one DecoderLayer: C = 2048, h = 16 heads of 2 x 64, F = 5632, 4096 tokens "
              "in the cache, batch 1 (weights 51 M values); median of 10 steps.",
              ["threads", "weights", "KV cache", "step ms", "tokens/s", "vs float32", "vs bfloat16"],
              rows, commands(raw, "f32.*", "bf16.*", "int8.*", "w8.*", "kv8.*")),
        table(f"int8 Q·Kᵀ in the fused attention: MultiHead forward, B = 1, N = 2048, C = 768, h = 6, "
              f"float32, {threads} threads; median of 5.",
              ["Q·Kᵀ", "forward ms", "speed vs float32"],
              qk_rows, commands(raw, "qk.*"))]
    more = "".join(f", {b[1]:.2f}x and {b[2]:.2f}x on {b[0]}" for b in best[1:])
    return tables, {"float32": f"{best[0][1]:.2f}x", "bfloat16": f"{best[0][2]:.2f}x", "more_threads": more,
                    "qk": ratio(qk["same"]["forward_ms"], qk["int8"]["forward_ms"])}


def v2(raw, threads):
    b = bench_rows(os.path.join(raw, "difftx_bench.json"))
    rows, vs_base, vs_v1 = [], [], []
    for n in (512, 2048):
        for key, label in (("forward", "forward"), ("forward_backward", "forward + backward")):
            t = {m: b[f"{m}/simd/float32/{key}/N:{n}"]["real_time"] for m in ("MultiHeadV2", "MultiHead", "Attention")}
            vs_base.append(t["MultiHeadV2"] / t["Attention"])
            vs_v1.append(t["MultiHeadV2"] / t["MultiHead"])
            rows.append([str(n), label, ms(t["MultiHeadV2"]), ms(t["MultiHead"]), ms(t["Attention"]),
                         ratio(t["MultiHeadV2"], t["MultiHead"]), ratio(t["MultiHeadV2"], t["Attention"])])
    tables = [table("B = 1, C = 768, causal, float32, milliseconds (Google Benchmark, median of 3 repetitions). "
                    "V2: 12 output heads of 64 on 24 query heads and 12 key/value heads (matched to the "
                    "baseline); V1: `MultiHead`, "
                    "6 heads of 2 x 64; baseline: `Attention`, 12 heads of 64.",
                    ["N", "pass", "V2", "V1", "baseline", "V2 / V1", "V2 / baseline"],
                    rows, commands(raw, "difftx_bench.json"))]
    return tables, {"vs_base": span(vs_base), "vs_v1": span(vs_v1)}


def dynamic(raw, threads):
    b = bench_rows(os.path.join(raw, "difftx_bench.json"))
    rows, r = [], []
    for m in ("MultiHead", "DecoderLayer"):
        for key, label in (("forward", "forward"), ("forward_backward", "forward + backward")):
            c = b.get(f"{m}/simd/float32/{key}/D:compiled/N:1024")
            d = b.get(f"{m}/simd/float32/{key}/D:dynamic/N:1024")
            if not (c and d):
                continue
            r.append(d["real_time"] / c["real_time"])
            rows.append([m, label, ms(c["real_time"]), ms(d["real_time"]), ratio(d["real_time"], c["real_time"])])
    tables = [table("The same module with D = 64 compiled in (`MultiHead<float, 64, policy::simd>`) and "
                    "given at run time (`MultiHead<float, dynamic, policy::simd>`, `.head_dim = 64`); "
                    "B = 1, N = 1024, C = 768, h = 6 (DecoderLayer: F = 2048), float32, milliseconds "
                    "(Google Benchmark, median of 3 repetitions).",
                    ["module", "pass", "compiled D ms", "run-time D ms", "run-time / compiled"],
                    rows, commands(raw, "difftx_bench.json"))]
    return tables, {"ratio": span(r)}


def scaleout(raw, threads):
    runs = {k: bench_rows(os.path.join(raw, f"{k}.json")) for k in ("t1", "t2", "mpi")}
    names = [("Whole/DecoderLayer/float32/batch:4/N:256/forward_backward/iterations:4", "whole layer (one process)"),
             ("DataParallel/DecoderLayer/float32/batch:4/N:256/step/iterations:4",
              "data parallel step (B/p per rank, with the gradient average)"),
             ("DataParallel/DecoderLayer/float32/average/iterations:4", "the gradient average alone (7.1 M floats)"),
             ("TensorParallel/DecoderLayer/float32/batch:4/N:256/forward_backward/iterations:4",
              "tensor parallel (h/p heads, F/p per rank)")]
    rows = []
    for name, label in names:
        cells = []
        for k in ("t1", "t2", "mpi"):
            row = runs[k].get(name)
            cells.append(ms(row["real_time"]) if row and not (k == "mpi" and name.startswith("Whole")) else "—")
        rows.append([label] + cells)
    tp = [runs[k].get(names[3][0], {}).get("real_time") for k in ("t1", "t2", "mpi")]
    tables = [table("One DecoderLayer (C = 768, h = 6, D = 64, F = 2048), float32, `policy::simd`, a global "
                    "batch of 4 x 256 tokens, forward + backward; median milliseconds of 3 repetitions of 4 "
                    "steps (Open MPI over shared memory).",
                    ["step", "1 process x 1 thread", "1 process x 2 threads", "2 ranks x 1 thread"],
                    rows, commands(raw, "t1.json", "t2.json", "mpi.json"))]
    return tables, {"ranks": ratio(tp[0], tp[2]), "threads": ratio(tp[0], tp[1]), "cores": os.cpu_count()}


QUESTIONS = {"layers": layers, "bfloat16": bfloat16, "linear": linear, "checkpoint": checkpoint,
             "generation": generation, "lowbit": lowbit,
             "v2": v2, "dynamic": dynamic, "scaleout": scaleout}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in QUESTIONS:
        sys.exit(f"usage: collect_cpu.py {{{','.join(QUESTIONS)}}} RAW_DIR")
    q, raw = sys.argv[1], sys.argv[2]
    threads = os.environ.get("THREADS", "2")
    tables, values = QUESTIONS[q](raw, threads)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "questions.json"), encoding="utf-8") as f:
        about = json.load(f)[q]
    print(json.dumps({"question": about["question"], "order": about["order"],
                      "machine": machine(threads) + f"; difftx: {policy_detail()}",
                      "date": time.strftime("%Y-%m-%d"), "quiet": os.environ.get("QUIET_STATE", "unchecked"),
                      "reproduce": f"benchmarks/measure_cpu.sh {q}", "tables": tables,
                      "reading": about["reading"].format(**values) + " " + quiet_note()}, indent=1,
                     ensure_ascii=False))


if __name__ == "__main__":
    main()
