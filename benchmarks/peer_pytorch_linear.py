#!/usr/bin/env python3
"""PyTorch's Linear products on the CPU, at the shapes of difftx_bench's
op:linear/simd/<dtype>/<library>/ rows, for benchmarks/measure_cpu.sh.

For each M x N x K (tokens x outputs x inputs) and dtype it times
  forward:  y = torch.nn.functional.linear(x, w)         (2·M·N·K FLOPs)
  backward: dx = dy @ w and dw = dyᵀ @ x                  (4·M·N·K FLOPs)
and for int8 (int8 weights, float32 input quantized on each call, forward
only) a Linear through torch.ao.quantization.quantize_dynamic, PyTorch's
int8-weight inference on the CPU.
with torch.set_num_threads(--threads), and prints one JSON object:
{"torch": version, "threads": n, "rows": [{"dtype", "M", "N", "K", "pass", "ms", "gflops"}]}.
Each time is the median of --repeats runs after a warm-up.

    python3 benchmarks/peer_pytorch_linear.py --threads 2
"""

import argparse
import json
import statistics
import time

import torch

SHAPES = [(2048, 2048, 2048), (512, 4096, 1024), (512, 1024, 4096), (8, 4096, 1024), (32, 4096, 1024)]  # difftx_bench's


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows = []
    with torch.inference_mode():
        for name in a.dtypes:
            dtype = torch.float32 if name == "int8" else getattr(torch, name)
            for M, N, K in SHAPES:
                x, w, dy = (torch.randn(*s, dtype=dtype) for s in ((M, K), (N, K), (M, N)))
                if name == "int8":
                    linear = torch.nn.Linear(K, N, bias=False)
                    linear.weight.data.copy_(w)
                    quantized = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                                       dtype=torch.qint8)
                    passes = [("forward", timed(lambda: quantized(x), a.repeats), 2 * M * N * K)]
                else:
                    passes = [("forward", timed(lambda: torch.nn.functional.linear(x, w), a.repeats), 2 * M * N * K),
                              ("backward", timed(lambda: (dy @ w, dy.t() @ x), a.repeats), 4 * M * N * K)]
                for pass_, seconds, flops in passes:
                    rows.append({"dtype": name, "M": M, "N": N, "K": K, "pass": pass_, "ms": seconds * 1e3,
                                 "gflops": flops / seconds / 1e9})
    print(json.dumps({"torch": torch.__version__, "threads": a.threads, "rows": rows}))


if __name__ == "__main__":
    main()
