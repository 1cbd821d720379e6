#!/usr/bin/env python3
"""The GPU question's raw outputs from tools/gpu_check.sh -> its results file
(JSON on stdout), the input of benchmarks/render_benchmarks.py, with the keys
benchmarks/collect_cpu.py writes:

  {"question", "order", "machine", "date", "quiet", "reproduce",
   "tables": [{"caption", "columns", "rows", "commands"}], "reading"}

    python3 benchmarks/collect_gpu.py LOG_DIR > benchmarks/results/gpu.json

LOG_DIR is what `tools/gpu_check.sh BUILD LOG_DIR checks bench peers models
ncu` writes. A table whose logs are missing (its step did not
run) is left out; a figure missing from a log it reads is "n/a". Rows hold
the figures as they are printed, and the reading is built from them, so that
a new measurement cannot keep an old conclusion. The tables:

  1. the checks (tests, memcheck, racecheck): summary.txt and each command's log;
  2. the attention op alone, differential against standard, on cuDNN and on
     difftx's kernels: cuda_bench.json (difftx_cuda_bench), and each of its
     kernels' time on cuDNN: ncu_diff_attention.log, ncu_attention.log;
  3. MultiHead and 4. DecoderLayer against PyTorch on the same GPU:
     cuda_bench.json, with benchmarks_gpu.json (peer_pytorch_gpu.py);
  5. CPU against GPU for one DecoderLayer: bench_simd_cuda.log;
  6. a 1B DiffLlama folder's prefill and decode against transformers' generate:
     bench_model.log, bench_model_json.log, transformers_generate.log;
  7. Nsight Compute's view of difftx's own kernels: ncu.log.
"""

import csv
import json
import os
import re
import sys
import time

from collect_cpu import ratio, span, table

BUILD = "build/gpu-pack"  # where tools/gpu_pack.sh builds the binaries the commands below name
REPRODUCE = ('tools/gpu_pack.sh --unpack && DIFFTX_SANITIZER_JOBS=8 tools/gpu_check.sh '
             '"$(tools/gpu_pack.sh --build-dir)" logs checks bench peers models ncu; '
             "python3 benchmarks/collect_gpu.py logs > benchmarks/results/gpu.json")
SHAPES = [(3072, 12, 2048), (3072, 12, 4096), (5120, 20, 2048)]  # the paper's C, h, N (D = 128)
PASSES = [("forward", "forward"), ("forward_backward", "forward + backward")]
ATTENTION = {"cudnn": "cuDNN", "difftx": "difftx's own kernels"}  # difftx_cuda_bench's /attention: names
# Datasheet memory bandwidth, TB/s, by the first of these found in nvidia-smi's name.
HBM_TBPS = [("H100 PCIe", 2.0), ("H100 NVL", 3.9), ("H100", 3.35), ("H200", 4.8)]

# tools/gpu_check.sh's checks: the name of their summary line and log, what runs, the command.
CHECKS = [
    ("cuda_test", "policy::cuda's suite", f"{BUILD}/tests/cuda_test"),
    ("nccl_test", "the NCCL suite on one rank", f"{BUILD}/tests/nccl_test"),
    ("cli_test_gpu", "the tool's gpu cases", f'{BUILD}/tests/cli_test "--test-case=cli gpu:*"'),
    ("check", "`difftx check` with its cuda rows", f"{BUILD}/tools/difftx check"),
    ("pytest_cuda", "the PyTorch extension's CUDA tests", "python3 -m pytest -q python/tests/test_cuda.py"),
    ("memcheck", "compute-sanitizer memcheck over cuda_test",
     f"compute-sanitizer --tool memcheck --error-exitcode 1 {BUILD}/tests/cuda_test"),
    ("racecheck", "compute-sanitizer racecheck over cuda_test (difftx's kernels, not cuDNN's)",
     f"compute-sanitizer --tool racecheck --error-exitcode 1 --kernel-name-exclude kns=cudnn {BUILD}/tests/cuda_test"),
]
CUDA_BENCH = f"{BUILD}/benchmarks/difftx_cuda_bench --benchmark_out=logs/cuda_bench.json --benchmark_out_format=json"
PEER = "python3 benchmarks/peer_pytorch_gpu.py --difftx-json logs/cuda_bench.json --backends flash cudnn --out logs"
BENCH_SIMD_CUDA = (f"{BUILD}/tools/difftx bench --policy simd,cuda --module decoder_layer --batch 1 --seq 2048 "
                   "--d-model 3072 --heads 12 --dtype bfloat16 --backward --repeats 3")
MODEL = "gpu_model"
MODEL_BENCH = f"{BUILD}/tools/difftx bench --model {MODEL} --dtype bfloat16 --seq 512 --new-tokens 64"
MODEL_COMMANDS = [
    f"python3 tools/make_big_checkpoint.py --out {MODEL} --dtype bfloat16",
    f"{MODEL_BENCH} --policy simd,cuda --repeats 2",
    f"{MODEL_BENCH} --policy cuda --repeats 3 --json",
    f"python3 benchmarks/peer_transformers_generate.py --model {MODEL} --dtype bfloat16 --device cuda --attn sdpa "
    "--prompt-tokens 512 --new-tokens 64 --repeats 3"]
NCU_OP = ("ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 30 "
          f"{BUILD}/benchmarks/difftx_cuda_bench --benchmark_filter=^op:OP/cuda/bfloat16/forward_backward/C:3072/"
          "N:4096/attention:cudnn/  (OP: diff_attention, attention)")
NCU = ("ncu --clock-control none --kernel-name-base demangled --kernel-name regex:difftx:: --launch-count 60 "
       f"--section SpeedOfLight --csv {BUILD}/tools/difftx bench --policy cuda --module decoder_layer --batch 1 "
       "--seq 2048 --d-model 3072 --heads 12 --dtype bfloat16 --backward --repeats 1")


# --- reading the logs -------------------------------------------------------------

def read(logs, name):
    """LOG_DIR/name's text, or None where that step did not write it."""
    path = os.path.join(logs, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def read_json(logs, name):
    """LOG_DIR/name parsed, or None where it is missing or was cut short (its command failed: the reading says so)."""
    text = read(logs, name)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        print(f"collect_gpu: {name} is not JSON; left out", file=sys.stderr)
        return None


def json_lines(text):
    """The JSON objects a tool printed one to a line among its other output."""
    out = []
    for line in (text or "").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:  # a line cut short
                pass
    return out


def number(value):
    """value where it is a figure; None for a missing one or an error's text."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cuda_bench(logs):
    """difftx_cuda_bench's Google Benchmark JSON -> (its context, {name without /iterations and /manual_time:
    entry}), with repetitions the median aggregate; ({}, None) where it did not run."""
    data = read_json(logs, "cuda_bench.json")
    if data is None:
        return {}, None
    out = {}
    for b in data.get("benchmarks", []):
        if b.get("error_occurred") or (b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median"):
            continue
        name = re.sub(r"/iterations:\d+|/manual_time|/real_time", "", b.get("run_name", b["name"]))
        if b.get("run_type") == "aggregate" or name not in out:
            out[name] = b
    return data.get("context", {}), out


def summary(logs):
    """summary.txt -> {command: (exit status, seconds)}."""
    lines = (read(logs, "summary.txt") or "").splitlines()
    found = (re.match(r"^(\S+)\s+exit\s+(\d+)\s+(\d+)s\s*$", l) for l in lines)
    return {m[1]: (int(m[2]), int(m[3])) for m in found if m}


# --- formatting -------------------------------------------------------------------

def ms(x):
    if x is None:
        return "n/a"
    return f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 100 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def tflops(x):
    return "n/a" if x is None else f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def pct(x):
    return "n/a" if x is None else f"{x:.0%}"


def percent(x):
    """A figure already in percent."""
    return "n/a" if x is None else f"{x:.0f}%"


def fixed(x, digits):
    return "n/a" if x is None else f"{x:.{digits}f}"


def count(x):
    return "n/a" if x is None else f"{x:,.0f}"


def times(x):
    return "n/a" if x is None else f"{x:.0f}x" if x >= 10 else f"{x:.2f}x"


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def against(items, target, goal, fmt):
    """Where figures stand against a target (`goal` in words): (label, value or None) pairs -> a clause, or None
    if none was measured. Values are compared as printed (two decimals, or whole percent)."""
    measured = [(label, v) for label, v in items if v is not None]
    if not measured:
        return None
    missed = [f"{label} ({fmt(v)})" for label, v in measured if round(v, 2) < target]
    if not missed:
        return f"meeting the {goal} target" + (" everywhere" if len(measured) > 1 else "")
    return f"short of the {goal} target at " + "; ".join(missed)


# --- one function per table: the table (None where its logs are missing) and its sentence ----

def checks(logs, runs):
    rows, cmds, passed, failed, unknown = [], [], [], [], []
    for name, what, cmd in CHECKS:
        text = read(logs, f"{name}.log")
        if text is None and name not in runs:
            continue
        status, seconds = runs.get(name, (None, None))
        found = []
        # A sanitizer's log holds one report per process (DIFFTX_SANITIZER_JOBS): their counts add up.
        if m := re.findall(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", text or ""):
            total, ok, bad = (sum(int(x[i]) for x in m) for i in range(3))
            found.append(f"{ok} of {total} test cases passed" + (f", {bad} failed" if bad else ""))
        if m := re.findall(r"^=*\s*(.*\d+ (?:passed|failed).*?) in [\d.]+s", text or "", re.M):  # pytest's last line
            found.append(m[-1].strip())
        if m := re.findall(r"(\d+) of (\d+) checks pass", text or ""):
            found.append(f"{m[-1][0]} of {m[-1][1]} checks pass")
        if m := re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed", text or ""):
            found.append(f"{sum(map(int, m))} hazards")
        elif m := re.findall(r"ERROR SUMMARY: (\d+) errors?", text or ""):
            found.append(f"{sum(map(int, m))} errors")
        if status == 124:
            found.append("stopped at DIFFTX_STEP_LIMIT")
        result = "; ".join(found) or ("no log" if text is None else "no summary in its log")
        exit_status = "n/a" if status is None else str(status)
        if status is None:
            unknown.append(f"{name} ({result})")
        elif status == 0:
            passed.append(f"{name} ({result})")
        else:
            failed.append(f"{name} (exit {status}: {result})")
        rows.append([name, what, exit_status, result, "n/a" if seconds is None else str(seconds)])
        cmds.append(cmd)
    if not rows:
        return None, None
    t = table("The checks that need a GPU (tools/gpu_check.sh's tests, memcheck and racecheck steps): each "
              "command's exit status, what its log reports and its seconds. The sanitizers run cuda_test.",
              ["command", "what it runs", "exit status", "result", "seconds"], rows, cmds)
    sentence = []
    if failed:
        sentence.append(f"GPU checks failed: {', '.join(failed)}.")
    if passed:
        everything = not (failed or unknown)
        sentence.append(("Every GPU check passed: " if everything else "Passed: ") + ", ".join(passed) + ".")
    if unknown:
        sentence.append(f"Without an exit status in summary.txt: {', '.join(unknown)}.")
    return t, " ".join(sentence)


def default_attention(bench):
    """The attention policy::cuda takes by default, as peer_pytorch_gpu.py does: cuDNN's where the build has it."""
    return "cudnn" if any(k.endswith("/attention:cudnn") for k in bench) else "difftx"


def bench_value(bench, name, key, c, n, attention, field="real_time"):
    return number(bench.get(f"{name}/cuda/bfloat16/{key}/C:{c}/N:{n}/attention:{attention}", {}).get(field))


def attention_ops(bench):
    rows, shares, own, own_rates, cudnn, measured = [], [], [], [], [], False
    for n in (2048, 4096, 8192, 16384):
        for key, label in PASSES:
            diff_c, std_c, diff_d, std_d = (bench_value(bench, f"op:{op}", key, 3072, n, a, "TFLOP/s")
                                            for a in ("cudnn", "difftx") for op in ("diff_attention", "attention"))
            share = diff_c / std_c if diff_c and std_c else None
            shares.append((f"N = {n} {label}", share))
            own.append(diff_d / diff_c if diff_d and diff_c else None)
            own_rates.append(diff_d)
            cudnn.append(diff_c)
            measured = measured or any((diff_c, std_c, diff_d, std_d))
            rows.append([str(n), label, tflops(diff_c), tflops(std_c), pct(share), tflops(diff_d), tflops(std_d)])
    if not measured:
        return None, None
    t = table("The fused attention op alone: h = 12 differential heads of 2 x 128 against standard attention with "
              "24 heads of 128, B = 1, bfloat16, causal; TFLOP/s counting the causal (query, key) pairs only "
              "(benchmarks/flops.hpp), forward + backward timed as one; Google Benchmark's mean of 20 CUDA-event "
              "timings. On cuDNN the differential op's target is 90% of standard attention's rate; difftx's own "
              "kernels (`policy::cuda{.attention = policy::cuda_attention::difftx}`) are the fallback for other "
              "types, head sizes and GPUs.",
              ["N", "pass", "differential, cuDNN", "standard, cuDNN", "differential / standard (cuDNN)",
               "differential, difftx", "standard, difftx"],
              rows, [CUDA_BENCH])
    sentence = []
    if clause := against(shares, 0.9, "90%", pct):
        sentence.append(f"On cuDNN the differential attention op runs at {span([v for _, v in shares], '{:.0%}')} "
                        f"of standard attention's TFLOP/s ({span(cudnn, '{:.0f}')} TFLOP/s), {clause}.")
    if any(own):
        sentence.append(f"difftx's own kernels reach {span(own, '{:.0%}')} of cuDNN's rate on the differential op.")
    elif not any(cudnn):
        sentence.append(f"With no cuDNN runs in this log, difftx's own kernels run the differential op at "
                        f"{span(own_rates, '{:.0f}')} TFLOP/s.")
    return t, " ".join(sentence) or None


def peer_rows(logs):
    """benchmarks_gpu.json -> (its machine, {(C, N): row}); ({}, None) where the peer did not run."""
    data = read_json(logs, "benchmarks_gpu.json")
    if data is None:
        return {}, None
    return data.get("machine", {}), {(r["C"], r["N"]): r for r in data.get("rows", [])}


def multihead(bench, peer, attention, torch_version):
    rows, ratios, measured = [], [], False
    for c, h, n in SHAPES:
        for key, label in PASSES:
            mine = bench_value(bench, "MultiHead", key, c, n, attention)
            measured = measured or mine is not None
            row = peer.get((c, n), {}) if peer is not None else None
            best = row.get(f"best_pytorch_{key}") if row else None  # the key of its ms: "sdpa-flash_forward_ms"
            theirs = number(row.get(best)) if best else None
            ratios.append((f"C {c} N {n} {label}", theirs / mine if mine and theirs else None))
            rows.append([str(c), str(h), str(n), label, ms(mine),
                         "not run" if row is None else best.split("_")[0] if best else "n/a",
                         "not run" if row is None else ms(theirs), ratio(theirs, mine)])
    if not measured:
        return None, None
    t = table(f"MultiHead against PyTorch's fastest recipe for it on the same GPU (naive, and two or four "
              f"scaled_dot_product_attention calls under each backend timed: benchmarks/peer_pytorch_gpu.py), "
              f"at the paper's shapes (h heads of 2 x 128), B = 1, bfloat16, causal; milliseconds (difftx: mean "
              f"of 20 CUDA-event timings, attention on {ATTENTION[attention]}; "
              + (f"PyTorch {torch_version}: median of 10 after 2 warm-ups" if peer is not None else "PyTorch: not run")
              + "). The ratio is PyTorch's time over difftx's; target 1.2x.",
              ["C", "h", "N", "pass", "difftx ms", "best PyTorch recipe", "PyTorch ms", "PyTorch / difftx"],
              rows, [CUDA_BENCH, PEER])
    clause = against(ratios, 1.2, "1.2x", times)
    sentence = (f"MultiHead runs {span([v for _, v in ratios])} as fast as PyTorch's best recipe at the paper's "
                f"shapes, {clause}." if clause else None)
    return t, sentence


def decoder_layer(bench, peer, attention):
    rows, vs_torch, table7, measured = [], [], [], False
    for c, h, n in SHAPES:
        for key, label in PASSES:
            mine = bench_value(bench, "DecoderLayer", key, c, n, attention)
            base = bench_value(bench, "BaselineLayer", key, c, n, attention)
            measured = measured or mine is not None or base is not None
            theirs = number((peer or {}).get((c, n), {}).get(f"pytorch_decoder_layer_{key}_ms"))
            vs_torch.append(theirs / mine if mine and theirs else None)
            share = base / mine if mine and base else None  # tokens/s over the baseline's: the inverse of the times
            if (c, n) == (3072, 4096):
                table7.append((label, share))
            rows.append([str(c), str(n), label, ms(mine), ms(theirs) if peer is not None else "not run",
                         ratio(theirs, mine), ms(base), pct(share)])
    if not measured:
        return None, None
    t = table("DecoderLayer (SwiGLU F = 8192 at C = 3072, 13824 at C = 5120) against the same layer in PyTorch "
              "eager with the MultiHead recipe fastest above; milliseconds as above, ratio PyTorch's time over "
              "difftx's. The last column is the paper's Table 7 quantity: the differential layer's tokens/s over "
              "difftx's matched BaselineLayer's (2h standard heads of 128), target 90% at C = 3072, N = 4096.",
              ["C", "N", "pass", "difftx ms", "PyTorch eager ms", "PyTorch / difftx", "BaselineLayer ms",
               "tokens/s vs BaselineLayer"],
              rows, [CUDA_BENCH, PEER])
    sentence = []
    if any(vs_torch):
        sentence.append(f"The DecoderLayer is {span(vs_torch)} as fast as PyTorch eager's.")
    if clause := against(table7, 0.9, "90%", pct):
        sentence.append(f"At C = 3072, N = 4096 the differential layer keeps "
                        f"{span([v for _, v in table7], '{:.0%}')} of the baseline layer's tokens/s, {clause}.")
    return t, " ".join(sentence) or None


def bench_table(text, pattern):
    """The rows of a `difftx bench` text table: each line that matches `pattern` (named groups), as a dict."""
    return [m.groupdict() for m in (re.match(pattern, l.rstrip()) for l in text.splitlines()) if m]


def cpu_against_gpu(logs):
    text = read(logs, "bench_simd_cuda.log")
    if text is None:
        return None, None
    # cmd_bench.cpp: "%-34s %7d %-16s %10.3f %12.0f %9s %7.2f" (policy, threads, pass, ms, tokens/s, GFLOP/s, x)
    lines = bench_table(text, r"^(?P<policy>.+?)\s+(?P<threads>\d+)\s+(?P<pass>forward\+backward|forward)\s+"
                              r"(?P<ms>[\d.]+)\s+(?P<tokens>[\d.]+)\s+(?P<gflops>[\d.]+|-)\s+(?P<x>[\d.]+)$")
    if not lines:
        return None, None
    rows, speedups = [], []
    for r in lines:
        policy, _, paths = r["policy"].partition(" [attention: ")
        if paths:  # "cuda (GPU, sm_90) [attention: cudnn 4]": the GPU is in the machine line
            kernels = ", ".join(re.sub(r" \d+$", "", p).replace("cudnn", "cuDNN")
                                for p in paths.rstrip("]").split(", "))
            policy = f"{policy.split(' (')[0]}, attention on {kernels}"
        else:
            policy += f", {r['threads']} threads"
        x = float(r["x"])
        rows.append([policy, r["pass"].replace("+", " + "), ms(float(r["ms"])), count(float(r["tokens"])),
                     "n/a" if r["gflops"] == "-" else tflops(float(r["gflops"]) / 1e3), times(x)])
        if r["policy"].startswith("cuda"):
            speedups.append((r["pass"].replace("+", " + "), x))
    header = next((l for l in text.splitlines() if l.startswith("difftx bench: ")), "")
    shape = re.match(r"difftx bench: decoder_layer on x \[(\d+), (\d+), (\d+)\], h = (\d+), g = \d+, D = (\d+), "
                     r"(causal|not causal), F = (\d+), (\w+); median of (\d+)", header)
    about = (f"B = {shape[1]}, N = {shape[2]}, C = {shape[3]}, h = {shape[4]} (D = {shape[5]}), F = {shape[7]}, "
             f"{shape[8]}, {shape[6]}; median of {shape[9]} after a warm-up" if shape else "median after a warm-up")
    first = lines[0]["policy"].split(" ")[0]
    t = table(f"CPU against GPU, one DecoderLayer: {about} (CUDA events on the policy's stream for cuda). The "
              f"cuda rows name the attention kernels that ran.",
              ["policy", "pass", "median ms", "tokens/s", "TFLOP/s", f"speed vs {first}"], rows, [BENCH_SIMD_CUDA])
    sentence = (f"One DecoderLayer runs " + " and ".join(f"{times(x)} ({label})" for label, x in speedups) +
                f" faster on the GPU than on the host's {lines[0]['threads']} threads." if speedups else None)
    return t, sentence


def hbm_rate(gpu):
    """The GPU's datasheet memory bandwidth, TB/s, and its name for the caption; (None, None) if not known here."""
    return next(((rate, name) for name, rate in HBM_TBPS if name in gpu), (None, None))


def bench_model_rows(text):
    """bench_model.cpp's text table -> {policy: its row, with the keys of its --json lines}."""
    # "%-34s %7d %12.3f %16.1f %15.1f %15.3f %16.2f", then " %10.1f %8.1f%% %9.1f%%" or three "-"
    lines = bench_table(text, r"^(?P<policy_detail>.+?)\s+(?P<threads>\d+)\s+(?P<prefill_ms>[\d.]+)\s+"
                              r"(?P<prefill_tokens_per_s>[\d.]+)\s+[\d.]+\s+(?P<decode_ms_per_token>[\d.]+)\s+"
                              r"(?P<decode_tokens_per_s>[\d.]+)\s+(?:(?P<read_GBps>[\d.]+)\s+(?P<share>[\d.]+)%\s+"
                              r"[\d.]+%|-\s+-\s+-)$")
    out = {}
    for r in lines:
        row = {k: float(r[k]) for k in ("prefill_ms", "prefill_tokens_per_s", "decode_ms_per_token",
                                         "decode_tokens_per_s")}
        row.update(policy_detail=r["policy_detail"], threads=int(r["threads"]),
                   read_GBps=float(r["read_GBps"]) if r["read_GBps"] else None,
                   decode_share_of_bound=float(r["share"]) / 100 if r["share"] else None)
        out[r["policy_detail"].split(" ")[0]] = row
    return out


def language_model(logs, gpu):
    ours = bench_model_rows(read(logs, "bench_model.log") or "")
    # the cuda row from its own call with --json (more repeats, and the bytes a decode step reads) where it ran
    ours.update({r["policy"]: r for r in json_lines(read(logs, "bench_model_json.log")) if r.get("policy") == "cuda"})
    peer = (json_lines(read(logs, "transformers_generate.log")) or [None])[-1]
    if not ours and not peer:
        return None, None
    rate, rate_name = hbm_rate(gpu)
    peer_prefill = peer["prompt_tokens"] / peer["prefill_ms"] * 1e3 if peer else None
    peer_decode = peer["decode_tokens_per_s"] if peer else None
    rows, facts = [], {}
    for policy, r in ours.items():
        bytes_read = (number(r.get("weights_read_per_token_bytes")), number(r.get("cache_read_per_token_bytes")))
        gbps = (sum(bytes_read) / r["decode_ms_per_token"] / 1e6 if None not in bytes_read else None)
        on_gpu = policy == "cuda"
        share = gbps / (rate * 1e3) if gbps and rate and on_gpu else None
        label = r["policy_detail"] + (f", {r['threads']} threads" if not on_gpu else "")
        prefill, decode = r["prefill_tokens_per_s"], r["decode_tokens_per_s"]
        rows.append([f"difftx, {label}", ms(r["prefill_ms"]), count(prefill), ms(r["decode_ms_per_token"]),
                     f"{decode:.1f}", ratio(prefill, peer_prefill), ratio(decode, peer_decode),
                     fixed(number(r.get("read_GBps")), 0), pct(number(r.get("decode_share_of_bound"))),
                     fixed(gbps, 0) if on_gpu else "—", pct(share) if on_gpu else "—"])
        if on_gpu:
            facts = {"prefill": prefill / peer_prefill if peer else None,
                     "decode": decode / peer_decode if peer else None, "gbps": gbps, "share": share}
    if peer:
        rows.append([f"transformers generate ({peer.get('device', 'cuda')})", ms(peer["prefill_ms"]),
                     count(peer_prefill), ms(peer["decode_ms_per_token"]), f"{peer_decode:.1f}"] + ["—"] * 6)
    model = next((r for r in ours.values() if "layers" in r), None)  # the --json row describes the model
    about = (f"{model['layers']} layers, V = {model['vocab_size']}, C = {model['d_model']}, h = {model['heads']}, "
             f"g = {model['kv_heads']}, D = {model['head_dim']}, F = {model['ffn_dim']}" if model else
             "written by tools/make_big_checkpoint.py")
    params = (f"{peer['parameters'] / 1e9:.2f}B parameters; transformers {peer['transformers']}, "
              f"torch {peer['torch']}" if peer else "transformers not run")
    t = table(f"A random DiffLlama folder of about 1B parameters ({about}; {params}), bfloat16: a prompt of 512 "
              f"random tokens in one prefill, then 64 greedy decode steps. difftx: `difftx bench --model` (medians "
              f"of 2 runs after a warm-up; the cuda row from its own call with --json, medians of 3, where that "
              f"ran); transformers: `generate` with SDPA attention on the same GPU, its decode time generate(64) "
              f"minus generate(1) (its prefill), medians of 3. \"vs transformers\": tokens/s over transformers' "
              f"(target 1.5x for cuda). \"read GB/s\" and \"of bound\": the bytes a decode step reads (weights "
              f"and cache), read again by the same threads or device after each step, and the step's time against "
              f"that read's. \"decode GB/s\": those bytes over the decode step's time, and its share of the "
              + (f"{rate_name}'s {rate} TB/s datasheet rate" if rate else "datasheet rate (not known for this GPU)")
              + " (target 70%).",
              ["contender", "prefill ms", "prefill tokens/s", "decode ms/token", "decode tokens/s",
               "prefill vs transformers", "decode vs transformers", "read GB/s", "of bound", "decode GB/s",
               "of datasheet"],
              rows, MODEL_COMMANDS)
    sentence = []
    if facts.get("decode"):
        sentence.append(f"On the 1B DiffLlama folder difftx's cuda policy decodes at {times(facts['decode'])} "
                        f"transformers' speed and prefills at {times(facts['prefill'])}, "
                        + against([("decode", facts["decode"]), ("prefill", facts["prefill"])], 1.5, "1.5x", times)
                        + ".")
    if facts.get("share"):
        sentence.append(f"Its decode steps read their weights and cache at {facts['gbps']:.0f} GB/s, "
                        f"{pct(facts['share'])} of the {rate_name}'s {rate} TB/s, "
                        + against([("decode", facts["share"])], 0.7, "70%", pct) + ".")
    return t, " ".join(sentence) or None


# ncu's time units, in microseconds (older versions spell them out).
MICROSECONDS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def strip_nested(name, opening, closing, keep=0):
    """name without what lies deeper than `keep` levels of the brackets."""
    out, depth = [], 0
    for ch in name:
        if ch == opening:
            depth += 1
            if depth <= keep:
                out.append(ch)
        elif ch == closing and depth:
            if depth <= keep:
                out.append(ch)
            depth -= 1
        elif depth <= keep:
            out.append(ch)
    return "".join(out)


def short_names(kernels):
    """Demangled kernel names -> readable ones: without the return type, the parameters and difftx's namespaces,
    and without template arguments unless two kernels would then share a name (then their outer ones)."""
    def plain(full, keep):
        name = re.sub(r"^void ", "", full).replace("(anonymous namespace)::", "")
        name = name.replace("difftx::cuda_detail::", "").replace("difftx::", "")
        name = name.replace("cudnn_generated_fort_native_", "cudnn ")  # cuDNN's generated kernels: keep the tile
        name = strip_nested(strip_nested(name, "(", ")"), "<", ">", keep)
        return name if len(name) <= 70 else name[:69] + "…"
    bases = [plain(k, 0) for k in kernels]
    return {k: plain(k, 1) if bases.count(b) > 1 else b for k, b in zip(kernels, bases)}


def ncu_launches(text):
    """ncu --csv output (with the profiled program's own lines and ==PROF== ones among it) ->
    {kernel name: {launch ID: {metric name: value, Duration in µs}}}."""
    header, out = None, {}
    for row in csv.reader(l for l in text.splitlines() if l.startswith('"')):
        if "Kernel Name" in row and "Metric Name" in row:
            header = row
            continue
        if header is None or len(row) != len(header):
            continue
        r = dict(zip(header, row))
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        metric = r["Metric Name"]
        if metric in ("Duration", "gpu__time_duration.sum"):  # the SpeedOfLight section's, or asked for by name
            if r["Metric Unit"] not in MICROSECONDS:
                continue
            metric, value = "Duration", value * MICROSECONDS[r["Metric Unit"]]
        out.setdefault(r["Kernel Name"], {}).setdefault(r.get("ID"), {})[metric] = value
    return out


def ncu(logs):
    text = read(logs, "ncu.log")
    launches = ncu_launches(text) if text else {}
    if not launches:
        return None, None
    kernels = []
    for name, by_id in launches.items():
        runs = list(by_id.values())
        kernels.append((sum(r.get("Duration", 0) for r in runs), name, len(runs),
                        mean(r.get("DRAM Throughput") for r in runs),
                        mean(r.get("Compute (SM) Throughput") for r in runs)))
    kernels.sort(reverse=True)
    total = sum(k[0] for k in kernels)
    names = short_names([k[1] for k in kernels[:12]])
    rows = [[names[name], str(n), f"{us:,.0f}", percent(dram), percent(sm)] for us, name, n, dram, sm in kernels[:12]]
    t = table(f"Nsight Compute's Speed Of Light over difftx's own kernels (cuBLASLt's and cuDNN's left out) in the "
              f"first {sum(k[2] for k in kernels)} launches of one DecoderLayer forward and backward, B = 1, "
              f"N = 2048, C = 3072, h = 12, bfloat16, with the GPU's clocks as they were: launches of the same "
              f"kernel summed (duration) or averaged (throughputs, as a share of the peak), the "
              f"{min(12, len(kernels))} longest of {len(kernels)} kernels.",
              ["kernel", "launches", "total µs", "DRAM throughput", "compute (SM) throughput"], rows, [NCU])
    us, name, _, dram, sm = kernels[0]
    sentence = (f"Of difftx's own kernels profiled, {names[name]} takes the most time "
                f"({us / total:.0%} of theirs; DRAM {percent(dram)}, compute {percent(sm)} of the peak)."
                if total else None)
    return t, sentence


def op_flops(bench, op, n):
    """An op's forward + backward FLOPs at C = 3072 as difftx_cuda_bench counted them (its TFLOP/s times its
    time: benchmarks/flops.hpp's count, in units that cancel in a ratio), or None."""
    rate, ms = (bench_value(bench, f"op:{op}", "forward_backward", 3072, n, "cudnn", field)
                for field in ("TFLOP/s", "real_time"))
    return rate * ms if rate and ms else None


def attention_op_kernels(logs, bench):
    """The op's kernels under ncu (ncu_diff_attention.log, ncu_attention.log): each kernel's mean time in one
    forward + backward, differential against standard, beside the FLOPs difftx_cuda_bench counts for each."""
    ops = []
    for op, label in (("diff_attention", "differential"), ("attention", "standard")):
        launches = ncu_launches(read(logs, f"ncu_{op}.log") or "")
        if launches:
            ops.append((label, {name: mean(r.get("Duration") for r in runs.values()) for name, runs in launches.items()}))
    if not ops:
        return None, None
    names = short_names([name for _, kernels in ops for name in kernels])
    rows, totals = [], {}
    for label, kernels in ops:
        totals[label] = sum(kernels.values())
        for name, us in sorted(kernels.items(), key=lambda k: -k[1]):
            rows.append([label, names[name], f"{us:,.1f}", f"{us / totals[label]:.0%}"])
    t = table("The attention op's kernels on cuDNN at N = 4096 (C = 3072, h = 12 differential heads of 2 x 128 "
              "against 24 standard heads of 128, bfloat16, causal), forward then backward: each kernel's mean "
              "time over the profiled launches (Nsight Compute, gpu__time_duration, the GPU's clocks as they "
              "were), and its share of its op's kernel time.",
              ["op", "kernel", "µs", "share"], rows, [NCU_OP])
    sentence = None
    if len(totals) == 2:
        diff, std = totals["differential"], totals["standard"]
        sentence = (f"Under Nsight Compute at N = 4096 the differential op's kernels take {diff:,.0f} µs a forward "
                    f"and backward against {std:,.0f} µs for standard attention ({diff / std:.2f}x")
        flops = [op_flops(bench or {}, op, 4096) for op in ("diff_attention", "attention")]
        if all(flops):
            ratio = flops[0] / flops[1]
            sentence += (f"; benchmarks/flops.hpp counts {ratio:.2f}x the FLOPs, so 90% of standard's rate allows "
                         f"{ratio / 0.9:.2f}x")
        sentence += ")."
    return t, sentence


def machine(logs, peer_machine, host):
    """nvidia-smi's line, PyTorch's versions and the host (Google Benchmark's context), as far as the logs tell
    them; and the GPU's name."""
    gpus = [l for l in (read(logs, "gpu.txt") or "").splitlines() if l.strip()]
    if gpus:
        name, driver, memory = ([p.strip() for p in gpus[0].split(",")] + ["?", "?"])[:3]
        text = f"{name} (driver {driver}, {memory})" + (f", {len(gpus)} GPUs" if len(gpus) > 1 else "")
    else:
        name = peer_machine.get("gpu", "")
        text = name or "an unknown GPU (no gpu.txt)"
    if "torch" in peer_machine:
        text += f"; PyTorch {peer_machine['torch']} (CUDA {peer_machine.get('cuda', '?')})"
    if "num_cpus" in host:
        text += f"; host: {host['num_cpus']} vCPUs" + (f" at {host['mhz_per_cpu'] / 1e3:.1f} GHz"
                                                        if "mhz_per_cpu" in host else "")
    return text, name


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: collect_gpu.py LOG_DIR  (what tools/gpu_check.sh wrote)")
    logs = sys.argv[1]
    runs = summary(logs)
    peer_machine, peer = peer_rows(logs)
    context, bench = cuda_bench(logs)
    where, gpu = machine(logs, peer_machine, context)
    parts = [checks(logs, runs)]
    if bench is not None:
        attention = default_attention(bench)
        parts += [attention_ops(bench), multihead(bench, peer, attention, peer_machine.get("torch", "?")),
                  decoder_layer(bench, peer, attention)]
    parts += [attention_op_kernels(logs, bench), cpu_against_gpu(logs), language_model(logs, gpu), ncu(logs)]
    tables = [t for t, _ in parts if t]
    if not tables:
        sys.exit(f"collect_gpu: nothing measured in {logs}")
    checked = {name for name, _, _ in CHECKS}
    stopped = [f"{name} (exit {status})" for name, (status, _) in runs.items() if status and name not in checked]
    reading = [s for _, s in parts if s]
    if stopped:
        reading.append(f"Commands that failed, whose figures are missing or partial: {', '.join(stopped)}.")
    print(json.dumps({"question": "GPU against cuDNN and PyTorch", "order": 6, "machine": where,
                      "date": peer_machine.get("date", time.strftime("%Y-%m-%d", time.gmtime())), "quiet": "n/a",
                      "reproduce": REPRODUCE, "tables": tables, "reading": " ".join(reading)}, indent=1,
                     ensure_ascii=False))


if __name__ == "__main__":
    main()
