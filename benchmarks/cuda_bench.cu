// Google Benchmark suite for policy::cuda at the paper's shapes (C = 3072,
// h = 12, D = 128 at N = 2048 and 4096; C = 5120, h = 20, D = 128 at N = 2048),
// bfloat16: the fused attention op (also over N = 2K..16K), MultiHead, the
// matched baseline Attention (2h heads of D), DecoderLayer and the matched
// BaselineLayer, forward and forward + backward, on difftx's attention kernels
// and on cuDNN's where built (names end in /attention:difftx or :cudnn). Each
// iteration is timed with CUDA events on the policy's stream (manual time);
// counters give TFLOP/s (counts in flops.hpp) and tokens/s.
// benchmarks/peer_pytorch_gpu.py runs this binary and PyTorch side by side.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/cuda.hpp>

#include "flops.hpp"

using namespace difftx;
namespace fl = difftx_bench;
using T = Eigen::bfloat16;

namespace {

struct paper_shape {
  index_t C, h, N, F;
};
const paper_shape shapes[] = {{3072, 12, 2048, 8192}, {3072, 12, 4096, 8192}, {5120, 20, 2048, 13824}};
constexpr index_t D = 128;

// Times `step` with events on the policy's stream.
template <class Step>
void time_on_stream(benchmark::State& state, const policy::cuda& p, Step step) {
  cudaEvent_t start, stop;
  DIFFTX_CUDA_CHECK(cudaEventCreate(&start));
  DIFFTX_CUDA_CHECK(cudaEventCreate(&stop));
  // Scratch freed in one iteration stays mapped for the next, as in PyTorch's
  // caching allocator: the device's default pool would hand it back at each
  // iteration's synchronisation and map it again in the next.
  p.context->keep_freed_memory();
  step();  // warm-up: allocations, cuBLASLt heuristics
  p.context->synchronize();
  for (auto _ : state) {
    DIFFTX_CUDA_CHECK(cudaEventRecord(start, p.stream()));
    step();
    DIFFTX_CUDA_CHECK(cudaEventRecord(stop, p.stream()));
    DIFFTX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DIFFTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void set_counters(benchmark::State& state, double flops, double tokens) {
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
}

template <std::size_t R>
Tensor<T, R> random_device(const shape_t<R>& shape, const policy::cuda& p, std::uint64_t seed) {
  Tensor<T, R> host(shape);
  random_stream rng(seed);
  fill_normal(host.view(), rng);
  Tensor<T, R> device(shape, p.memory());
  p.memory().upload(device.data(), host.data(), static_cast<std::size_t>(host.size()) * sizeof(T));
  return device;
}

template <class Module>
void run_module(benchmark::State& state, Module& layer, const policy::cuda& p, index_t n, index_t c, bool backward,
                double flops) {
  const auto x = random_device<3>({1, n, c}, p, 1), dy = random_device<3>({1, n, c}, p, 2);
  Tensor<T, 3> y(x.shape(), p.memory()), dx(x.shape(), p.memory());
  typename Module::saved_type saved;
  time_on_stream(state, p, [&] {
    layer.forward(x, y, saved);
    if (backward) layer.backward(x, dy, saved, dx);
  });
  set_counters(state, flops, static_cast<double>(n));
}

template <int Maps>
void run_attention_op(benchmark::State& state, const policy::cuda& p, index_t heads, index_t n, bool backward) {
  const index_t dv = Maps * D;
  const auto q = random_device<5>({1, n, heads, Maps, D}, p, 3), k = random_device<5>({1, n, heads, Maps, D}, p, 4);
  const auto v = random_device<4>({1, n, heads, dv}, p, 5), d_o = random_device<4>({1, n, heads, dv}, p, 6);
  Tensor<T, 4> o(v.shape(), p.memory()), o2(Maps == 2 ? v.shape() : shape_t<4>{}, p.memory()), dv_out(v.shape(), p.memory());
  Tensor<T, 5> dq(q.shape(), p.memory()), dk(k.shape(), p.memory());
  Tensor<float, 4> lse({1, heads, Maps, n}, p.memory());
  Tensor<float, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{}, p.memory()), dlambda(lambda.shape(), p.memory());
  time_on_stream(state, p, [&] {
    attention_forward<Maps>(p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), true, o.view(),
                            o2.view(), lse.view());
    if (backward)
      attention_backward<Maps>(p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), true,
                               o.const_view(), o2.const_view(), lse.const_view(), d_o.const_view(), dq.view(), dk.view(),
                               dv_out.view(), dlambda.view());
  });
  const double N = static_cast<double>(n);
  set_counters(state,
               fl::attention_forward(1, heads, N, Maps, D, dv, true) +
                   (backward ? fl::attention_backward(1, heads, N, Maps, D, dv, true) : 0),
               N);
}

// The attention kernels this build can run: difftx's own, and cuDNN's fused
// attention where CMake found it. Every benchmark runs on each, named by it.
std::vector<policy::cuda_attention> attention_choices() {
  if (built_with_cudnn) return {policy::cuda_attention::difftx, policy::cuda_attention::cudnn};
  return {policy::cuda_attention::difftx};
}

void register_all() {
  // A fixed iteration count: Google Benchmark then runs each body once. Left to
  // find its own count, it re-ran the body with every trial count, and with it
  // the host-side set-up (random weights of a 5120-wide layer): on an H100 the
  // first 32 of these benchmarks took over six minutes that way.
  auto add = [](const std::string& name, auto body) {
    benchmark::RegisterBenchmark(name.c_str(), body)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);
  };
  auto suffix = [](bool backward, index_t C, index_t N, policy::cuda_attention a) {
    return "/cuda/bfloat16/" + std::string(backward ? "forward_backward" : "forward") + "/C:" + std::to_string(C) +
           "/N:" + std::to_string(N) + "/attention:" + std::string(name_of(a));
  };
  for (auto a : attention_choices())
    for (bool backward : {false, true}) {
      // The attention op alone at h = 12 (C = 3072) over N = 2K..16K and at
      // the 5120-wide shape: the differential op against standard attention
      // with 2h heads of D.
      for (const auto& op_shape : {std::array<index_t, 3>{3072, 12, 2048}, {3072, 12, 4096}, {3072, 12, 8192},
                                   {3072, 12, 16384}, {5120, 20, 2048}}) {
        const index_t c = op_shape[0], h = op_shape[1], n = op_shape[2];
        add("op:diff_attention" + suffix(backward, c, n, a),
            [=](benchmark::State& state) { run_attention_op<2>(state, policy::cuda{.attention = a}, h, n, backward); });
        add("op:attention" + suffix(backward, c, n, a),
            [=](benchmark::State& state) { run_attention_op<1>(state, policy::cuda{.attention = a}, 2 * h, n, backward); });
      }
      for (const auto& s : shapes) {
        const std::string tag = suffix(backward, s.C, s.N, a);
        const double N = static_cast<double>(s.N), C = static_cast<double>(s.C), h = static_cast<double>(s.h),
                     F = static_cast<double>(s.F);
        add("MultiHead" + tag, [=](benchmark::State& state) {
          const policy::cuda p = policy::cuda{.attention = a};
          MultiHead<T, D, policy::cuda> layer({.d_model = s.C, .heads = s.h, .kv_heads = s.h}, p);
          run_module(state, layer, p, s.N, s.C, backward,
                     fl::multihead_forward(1, N, C, h, h, D, true) + (backward ? fl::multihead_backward(1, N, C, h, h, D, true) : 0));
        });
        add("Attention" + tag, [=](benchmark::State& state) {
          const policy::cuda p = policy::cuda{.attention = a};
          Attention<T, D, policy::cuda> layer({.d_model = s.C, .heads = 2 * s.h, .kv_heads = 2 * s.h}, p);
          run_module(state, layer, p, s.N, s.C, backward,
                     fl::baseline_forward(1, N, C, 2 * h, 2 * h, D, true) +
                         (backward ? fl::baseline_backward(1, N, C, 2 * h, 2 * h, D, true) : 0));
        });
        add("DecoderLayer" + tag, [=](benchmark::State& state) {
          const policy::cuda p = policy::cuda{.attention = a};
          DecoderLayer<T, D, policy::cuda> layer({{.d_model = s.C, .heads = s.h, .kv_heads = s.h}, s.F}, p);
          run_module(state, layer, p, s.N, s.C, backward,
                     fl::decoder_forward(1, N, C, h, h, D, F, true) +
                         (backward ? fl::decoder_backward(1, N, C, h, h, D, F, true) : 0));
        });
        // The matched baseline layer (2h standard heads of D): the paper's Table 7 compares the two layers' tokens/s.
        add("BaselineLayer" + tag, [=](benchmark::State& state) {
          const policy::cuda p = policy::cuda{.attention = a};
          BaselineLayer<T, D, policy::cuda> layer({{.d_model = s.C, .heads = 2 * s.h, .kv_heads = 2 * s.h}, s.F}, p);
          run_module(state, layer, p, s.N, s.C, backward,
                     fl::baseline_layer_forward(1, N, C, 2 * h, 2 * h, D, F, true) +
                         (backward ? fl::baseline_layer_backward(1, N, C, 2 * h, 2 * h, D, F, true) : 0));
        });
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  // Listing the names needs no device (CTest's cuda_bench_names reads them on a machine without one).
  const bool listing = std::any_of(argv + 1, argv + argc, [](std::string_view arg) {
    return arg == "--benchmark_list_tests" || arg == "--benchmark_list_tests=true";
  });
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!listing && !cuda_device_available()) {
    std::printf("difftx_cuda_bench: no CUDA device on this machine\n");
    return 0;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
