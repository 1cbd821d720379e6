// Google Benchmark suite: every op and module, forward and forward + backward,
// on the reference and simd policies, over sequence lengths N, and one decode
// step with a KV cache against the forward over the whole sequence it replaces. Names read
// "<what>/<policy>/<dtype>/<pass>/N:<n>"; counters give GFLOP/s (counts in
// flops.hpp) and tokens/s. The shapes are the CPU issue's: C = 768, h = 6
// differential heads of D = 64 (the baseline: H = 12 heads of 64), causal.
// benchmarks/peer_pytorch.py runs this binary and PyTorch side by side.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <Eigen/Core>  // after difftx's headers, which include <immintrin.h> first (core/x86_intrinsics.hpp)
#include <difftx/policy/simd.hpp>
#include <difftx/policy/simd/memory_read.hpp>

#include "flops.hpp"

using namespace difftx;
namespace fl = difftx_bench;

namespace {

constexpr index_t C = 768, h = 6, D = 64, F = 2048;

template <class T>
Tensor<T, 3> random_input(index_t n, std::uint64_t seed, index_t batch = 1, index_t width = C) {
  Tensor<T, 3> x({batch, n, width});
  random_stream rng(seed);
  fill_normal(x.view(), rng);
  return x;
}

void set_counters(benchmark::State& state, double flops, double tokens) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
}

// A module's forward, or forward + backward, on x [batch, N, width].
template <class Module>
void run_module(benchmark::State& state, Module& module, index_t n, bool backward, double flops, index_t batch = 1,
                index_t width = C) {
  using T = typename Module::value_type;
  const auto x = random_input<T>(n, 1, batch, width), dy = random_input<T>(n, 2, batch, width);
  Tensor<T, 3> y(x.shape()), dx(x.shape());
  typename Module::saved_type saved;
  for (auto _ : state) {
    module.forward(x, y, saved);
    if (backward) module.backward(x, dy, saved, dx);
    benchmark::ClobberMemory();
  }
  set_counters(state, flops, static_cast<double>(batch * n));
}

template <class T, class Policy>
void register_modules(const std::string& policy, const std::string& dtype, std::initializer_list<index_t> lengths) {
  for (index_t n : lengths)
    for (bool backward : {false, true}) {
      const std::string suffix = "/" + policy + "/" + dtype + (backward ? "/forward_backward" : "/forward") +
                                 "/N:" + std::to_string(n);
      const double N = static_cast<double>(n);
      benchmark::RegisterBenchmark(("MultiHead" + suffix).c_str(), [=](benchmark::State& state) {
        MultiHead<T, D, Policy> module({.d_model = C, .heads = h, .kv_heads = h});
        run_module(state, module, n, backward,
                   fl::multihead_forward(1, N, C, h, h, D, true) + (backward ? fl::multihead_backward(1, N, C, h, h, D, true) : 0));
      })->UseRealTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("Attention" + suffix).c_str(), [=](benchmark::State& state) {
        Attention<T, D, Policy> module({.d_model = C, .heads = 2 * h, .kv_heads = 2 * h});
        run_module(state, module, n, backward,
                   fl::baseline_forward(1, N, C, 2 * h, 2 * h, D, true) +
                       (backward ? fl::baseline_backward(1, N, C, 2 * h, 2 * h, D, true) : 0));
      })->UseRealTime()->Unit(benchmark::kMillisecond);
      // V2 matched to the baseline as the authors do: its 2h output heads of D and
      // key/value heads, so 4h query heads (twice the baseline's attention work).
      benchmark::RegisterBenchmark(("MultiHeadV2" + suffix).c_str(), [=](benchmark::State& state) {
        MultiHeadV2<T, D, Policy> module({.d_model = C, .heads = 2 * h, .kv_heads = 2 * h});
        run_module(state, module, n, backward,
                   fl::multihead_v2_forward(1, N, C, 2 * h, 2 * h, D, true) +
                       (backward ? fl::multihead_v2_backward(1, N, C, 2 * h, 2 * h, D, true) : 0));
      })->UseRealTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("DecoderLayer" + suffix).c_str(), [=](benchmark::State& state) {
        DecoderLayer<T, D, Policy> module({{.d_model = C, .heads = h, .kv_heads = h}, F});
        run_module(state, module, n, backward,
                   fl::decoder_forward(1, N, C, h, h, D, F, true) +
                       (backward ? fl::decoder_backward(1, N, C, h, h, D, F, true) : 0));
      })->UseRealTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("SwiGLU" + suffix).c_str(), [=](benchmark::State& state) {
        SwiGLU<T, Policy> module(C, F);
        run_module(state, module, n, backward, 3 * (fl::linear_forward(N, F, C) + (backward ? fl::linear_backward(N, F, C) : 0)));
      })->UseRealTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("RMSNorm" + suffix).c_str(), [=](benchmark::State& state) {
        RMSNorm<T, Policy> module(C);
        run_module(state, module, n, backward, 0);
      })->UseRealTime()->Unit(benchmark::kMillisecond);
    }
}

// MultiHead and DecoderLayer with D = 64 compiled against D = 64 given at run
// time (difftx::dynamic): "<module>/<policy>/<dtype>/<pass>/D:compiled|dynamic/N:<n>".
template <class T, class Policy>
void register_head_dim_paths(const std::string& policy, const std::string& dtype, index_t n) {
  const double N = static_cast<double>(n);
  auto add = [&]<index_t HeadDim>(const char* path, bool backward) {
    const std::string suffix = "/" + policy + "/" + dtype + (backward ? "/forward_backward" : "/forward") + "/D:" + path +
                               "/N:" + std::to_string(n);
    benchmark::RegisterBenchmark(("MultiHead" + suffix).c_str(), [=](benchmark::State& state) {
      MultiHead<T, HeadDim, Policy> module({.d_model = C, .heads = h, .kv_heads = h, .head_dim = D});
      run_module(state, module, n, backward,
                 fl::multihead_forward(1, N, C, h, h, D, true) + (backward ? fl::multihead_backward(1, N, C, h, h, D, true) : 0));
    })->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("DecoderLayer" + suffix).c_str(), [=](benchmark::State& state) {
      DecoderLayer<T, HeadDim, Policy> module({{.d_model = C, .heads = h, .kv_heads = h, .head_dim = D}, F});
      run_module(state, module, n, backward,
                 fl::decoder_forward(1, N, C, h, h, D, F, true) + (backward ? fl::decoder_backward(1, N, C, h, h, D, F, true) : 0));
    })->UseRealTime()->Unit(benchmark::kMillisecond);
  };
  for (bool backward : {false, true}) {
    add.template operator()<D>("compiled", backward);
    add.template operator()<dynamic>("dynamic", backward);
  }
}

// The attention op alone: q, k, v already projected, both maps (or one).
template <int Maps, class T, class Policy>
void register_attention_op(const std::string& policy, const std::string& dtype, std::initializer_list<index_t> lengths) {
  const index_t heads = Maps == 2 ? h : 2 * h, dv = Maps * D;
  const std::string name = Maps == 2 ? "op:diff_attention" : "op:attention";
  for (index_t n : lengths)
    for (bool backward : {false, true}) {
      const double N = static_cast<double>(n);
      const double flops = backward ? fl::attention_backward(1, heads, N, Maps, D, dv, true)
                                    : fl::attention_forward(1, heads, N, Maps, D, dv, true);
      benchmark::RegisterBenchmark(
          (name + "/" + policy + "/" + dtype + (backward ? "/backward" : "/forward") + "/N:" + std::to_string(n)).c_str(),
          [=](benchmark::State& state) {
            Policy p;
            random_stream rng(3);
            Tensor<T, 5> q({1, n, heads, Maps, D}), k(q.shape()), dq(q.shape()), dk(q.shape());
            Tensor<T, 4> v({1, n, heads, dv}), o(v.shape()), o2(Maps == 2 ? v.shape() : shape_t<4>{}), d_o(v.shape()),
                dvv(v.shape());
            Tensor<accum_t<T>, 4> lse({1, heads, Maps, n});
            Tensor<accum_t<T>, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{}), dlambda(lambda.shape());
            for (auto* t : {&q, &k}) fill_normal(t->view(), rng);
            fill_normal(v.view(), rng);
            fill_normal(d_o.view(), rng);
            if (Maps == 2) lambda(0) = accum_t<T>(0.5);
            attention_forward<Maps>(p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), true, o.view(),
                                    o2.view(), lse.view());
            for (auto _ : state) {
              if (backward)
                attention_backward<Maps>(p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), true,
                                         o.const_view(), o2.const_view(), lse.const_view(), d_o.const_view(), dq.view(),
                                         dk.view(), dvv.view(), dlambda.view());
              else
                attention_forward<Maps>(p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), true,
                                        o.view(), o2.view(), lse.view());
              benchmark::ClobberMemory();
            }
            set_counters(state, flops, N);
          })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
}

// The token-wise ops on [N, C] rows (the projection is the Q projection, C -> 2hD).
template <class T, class Policy>
void register_token_ops(const std::string& policy, const std::string& dtype, std::initializer_list<index_t> lengths) {
  for (index_t n : lengths)
    for (bool backward : {false, true}) {
      const double N = static_cast<double>(n);
      const std::string suffix = "/" + policy + "/" + dtype + (backward ? "/backward" : "/forward") + "/N:" + std::to_string(n);
      auto add = [&](const std::string& op, double flops, auto body) {
        benchmark::RegisterBenchmark(("op:" + op + suffix).c_str(), [=](benchmark::State& state) {
          body(state);
          set_counters(state, flops, N);
        })->UseRealTime()->Unit(benchmark::kMillisecond);
      };
      add("linear", backward ? fl::linear_backward(N, 2 * h * D, C) : fl::linear_forward(N, 2 * h * D, C),
          [=](benchmark::State& state) {
            Policy p;
            const auto x = random_input<T>(n, 1);
            Tensor<T, 2> w({2 * h * D, C}), y({n, 2 * h * D}), dw(w.shape());
            Tensor<T, 3> dx(x.shape());
            random_stream rng(2);
            fill_normal(w.view(), rng, 0.0, 0.03);
            for (auto _ : state) {
              if (backward)
                linear_backward(p, flatten_rows(x.const_view()), w.const_view(), y.const_view(), flatten_rows(dx.view()),
                                dw.view());
              else
                linear_forward(p, flatten_rows(x.const_view()), w.const_view(), y.view());
              benchmark::ClobberMemory();
            }
          });
      add("rmsnorm", 0, [=](benchmark::State& state) {
        Policy p;
        const auto x = random_input<T>(n, 1);
        Tensor<T, 3> y(x.shape()), dx(x.shape());
        Tensor<T, 1> w({C}), dw({C});
        Tensor<accum_t<T>, 1> rstd({n});
        fill_constant(w.view(), 1.0);
        rmsnorm_forward(p, flatten_rows(x.const_view()), w.const_view(), 1e-5, 1.0, flatten_rows(y.view()), rstd.view());
        for (auto _ : state) {
          if (backward)
            rmsnorm_backward(p, flatten_rows(x.const_view()), w.const_view(), rstd.const_view(), 1.0,
                             flatten_rows(x.const_view()), flatten_rows(dx.view()), dw.view());
          else
            rmsnorm_forward(p, flatten_rows(x.const_view()), w.const_view(), 1e-5, 1.0, flatten_rows(y.view()), rstd.view());
          benchmark::ClobberMemory();
        }
      });
      add("rope", 0, [=](benchmark::State& state) {
        Policy p;
        Tensor<T, 4> q({1, n, 2 * h, D});
        random_stream rng(4);
        fill_normal(q.view(), rng);
        for (auto _ : state) {
          if (backward)
            rope_backward(p, q.view(), 0, 10000.0);
          else
            rope_forward(p, q.view(), 0, 10000.0);
          benchmark::ClobberMemory();
        }
      });
      // V2's head combination at the module's shape: a [N, 4h, D] -> o [N, 2h, D].
      add("diff_heads", 0, [=](benchmark::State& state) {
        Policy p;
        Tensor<T, 3> a({n, 4 * h, D}), o({n, 2 * h, D}), da(a.shape());
        Tensor<T, 2> z({n, 2 * h}), dz(z.shape());
        random_stream rng(6);
        fill_normal(a.view(), rng);
        fill_normal(z.view(), rng);
        for (auto _ : state) {
          if (backward)
            diff_heads_backward(p, a.const_view(), z.const_view(), o.const_view(), da.view(), dz.view());
          else
            diff_heads_forward(p, a.const_view(), z.const_view(), o.view());
          benchmark::ClobberMemory();
        }
      });
      add("swiglu_gate", 0, [=](benchmark::State& state) {
        Policy p;
        Tensor<T, 2> g({n, F}), u(g.shape()), out(g.shape()), dg(g.shape()), du(g.shape());
        random_stream rng(5);
        fill_normal(g.view(), rng);
        fill_normal(u.view(), rng);
        for (auto _ : state) {
          if (backward)
            swiglu_gate_backward(p, g.const_view(), u.const_view(), g.const_view(), dg.view(), du.view());
          else
            swiglu_gate_forward(p, g.const_view(), u.const_view(), out.view());
          benchmark::ClobberMemory();
        }
      });
    }
}

// One decode step (B = 1, one new token) with `context` tokens already in the
// cache, next to the forward over all context + 1 tokens that it replaces:
// "<module>/<policy>/<dtype>/decode_step/context:<n>" and ".../forward_all/N:<n + 1>".
template <class Module>
void run_decode_step(benchmark::State& state, Module& module, index_t context) {
  using T = typename Module::value_type;
  const auto prompt = random_input<T>(context, 1), token = random_input<T>(1, 2);
  Tensor<T, 3> y_prompt(prompt.shape()), y(token.shape());
  auto cache = module.make_cache(1, context + 1);
  module.prefill(prompt, cache, y_prompt.view());
  for (auto _ : state) {
    cache.truncate(context);  // every step sees the same cache length
    module.decode(token, cache, y.view());
    benchmark::ClobberMemory();
  }
  state.counters["tokens/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["cache_MB"] = static_cast<double>(cache.bytes_per_token() * static_cast<std::size_t>(context)) * 1e-6;
}
template <class Module>
void run_stateless_forward(benchmark::State& state, Module& module, index_t n) {
  using T = typename Module::value_type;
  const auto x = random_input<T>(n, 1);
  Tensor<T, 3> y(x.shape());
  for (auto _ : state) {
    module.forward(x, y.view());
    benchmark::ClobberMemory();
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

template <class T, class Policy>
void register_decoding(const std::string& policy, const std::string& dtype, std::initializer_list<index_t> contexts) {
  auto add = [&](const std::string& module_name, auto make) {
    for (index_t context : contexts) {
      const std::string prefix = module_name + "/" + policy + "/" + dtype;
      benchmark::RegisterBenchmark((prefix + "/decode_step/context:" + std::to_string(context)).c_str(),
                                   [=](benchmark::State& state) {
                                     auto module = make();
                                     run_decode_step(state, module, context);
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((prefix + "/forward_all/N:" + std::to_string(context + 1)).c_str(),
                                   [=](benchmark::State& state) {
                                     auto module = make();
                                     run_stateless_forward(state, module, context + 1);
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  };
  add("MultiHead", [] { return MultiHead<T, D, Policy>({.d_model = C, .heads = h, .kv_heads = h}); });
  add("Attention", [] { return Attention<T, D, Policy>({.d_model = C, .heads = 2 * h, .kv_heads = 2 * h}); });
  add("MultiHeadV2", [] { return MultiHeadV2<T, D, Policy>({.d_model = C, .heads = 2 * h, .kv_heads = 2 * h}); });
  add("DecoderLayer", [] { return DecoderLayer<T, D, Policy>({{.d_model = C, .heads = h, .kv_heads = h}, F}); });
  add("DecoderLayerV2",
      [] { return DecoderLayerV2<T, D, Policy>({{.d_model = C, .heads = 2 * h, .kv_heads = 2 * h}, F}); });
}

// Small problems per thread: a DecoderLayer at B = 8, N = 128, C = 128, h = 4
// (D = 16, F = 384, as `difftx bench` sizes it), forward + backward on 1 and 2
// threads: "DecoderLayer/simd/float32/forward_backward/small/threads:<t>".
void register_small_shape() {
  for (int threads : {1, 2})
    benchmark::RegisterBenchmark(
        ("DecoderLayer/simd/float32/forward_backward/small/threads:" + std::to_string(threads)).c_str(),
        [=](benchmark::State& state) {
          constexpr index_t B = 8, N = 128, Cs = 128, hs = 4, Ds = 16, Fs = 384;
          DecoderLayer<float, Ds, policy::simd> layer({{.d_model = Cs, .heads = hs, .kv_heads = hs}, Fs},
                                                      policy::simd{threads});
          run_module(state, layer, N, true,
                     fl::decoder_forward(B, N, Cs, hs, hs, Ds, Fs, true) + fl::decoder_backward(B, N, Cs, hs, hs, Ds, Fs, true),
                     B, Cs);
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
}

// A bfloat16 Linear's three products (y = x·wᵀ, dx = dy·w, dw += dyᵀ·x) at
// the Q projection's shape (N = 2048, C -> 2hD) on both of reduced_gemm's
// paths in one run: the dot-product instructions (registered only on a CPU
// that has AVX512_BF16) and the converting product they replace.
void register_bf16_products() {
  using namespace simd_detail;
  const index_t M = 2048, N = 2 * h * D, K = C;
  auto add = [&](const std::string& path, auto product) {
    benchmark::RegisterBenchmark(("op:linear_products/simd/bfloat16/" + path + "/N:2048").c_str(),
                                 [=](benchmark::State& state) {
                                   const policy::simd p;
                                   const auto x = random_input<Eigen::bfloat16>(M, 1, 1, K);
                                   const auto dy = random_input<Eigen::bfloat16>(M, 2, 1, N);
                                   const auto w = random_input<Eigen::bfloat16>(N, 3, 1, K);
                                   Tensor<Eigen::bfloat16, 3> y(dy.shape()), dx(x.shape()), dw(w.shape());
                                   for (auto _ : state) {
                                     product.template operator()<a_storage::rows, b_storage::columns>(
                                         p, M, N, K, x.data(), K, w.data(), K, y.data(), N, false);
                                     product.template operator()<a_storage::rows, b_storage::rows>(
                                         p, M, K, N, dy.data(), N, w.data(), K, dx.data(), K, false);
                                     product.template operator()<a_storage::columns, b_storage::rows>(
                                         p, N, K, M, dy.data(), N, x.data(), K, dw.data(), K, true);
                                     benchmark::ClobberMemory();
                                   }
                                   set_counters(state, fl::linear_forward(M, N, K) + fl::linear_backward(M, N, K),
                                                static_cast<double>(M));
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  add("converting", []<a_storage AS, b_storage BS>(auto&&... args) { converted_gemm<AS, BS>(args...); });
#if DIFFTX_BF16_PAIRS
  if (bf16_pair_instructions())
    add("dot_instructions",
        []<a_storage AS, b_storage BS>(auto&&... args) { bf16_pair_gemm<AS, BS, avx512_bf16_pairs>(args...); });
#endif
}

// Linear's products on each matrix library (policy::simd::matmuls: difftx's
// own, oneDNN's matmul where built) at a square size, at a 375M model's
// prefill shapes (512 tokens: C 1024 -> F 4096 and back) and at 8 and 32 rows
// (short prompts, batched decoding: where automatic's choice turns), forward (y = x·wᵀ)
// and backward (dx = dy·w, dw += dyᵀ·x). T = std::int8_t: int8 weights
// (float32 input quantized per row, exact int32 sums), forward only.
// "onednn_packed": oneDNN's forward on weights packed once (pack_weights).
template <class T>
void register_linear_libraries(const std::string& dtype) {
  using library = policy::simd::matmul_library;
  constexpr bool int8_weights = std::is_same_v<T, std::int8_t>;
  using X = std::conditional_t<int8_weights, float, T>;
  for (const std::string name : {"difftx", "onednn", "onednn_packed"}) {
#if !defined(DIFFTX_ONEDNN)
    if (name != "difftx") continue;
#endif
    const auto matmuls = name == "difftx" ? library::difftx : library::onednn;
    const bool packed = name == "onednn_packed";
    for (const auto& [M, N, K] : {std::array<index_t, 3>{2048, 2048, 2048}, {512, 4096, 1024}, {512, 1024, 4096},
                                  {8, 4096, 1024}, {32, 4096, 1024}})
      for (const bool backward : {false, true}) {
        if ((int8_weights || packed) && backward) continue;
        benchmark::RegisterBenchmark(("op:linear/simd/" + dtype + "/" + name + (backward ? "/backward/" : "/forward/") +
                                      std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K))
                                         .c_str(),
                                     [=](benchmark::State& state) {
                                       policy::simd p;
                                       p.matmuls = matmuls;
                                       const auto x = random_input<X>(M, 1, 1, K);
                                       const auto w = random_input<X>(N, 3, 1, K);
                                       Tensor<X, 3> y({1, M, N}), dx(x.shape()), dw(w.shape());
                                       int8_rows<float> w8;
                                       if constexpr (int8_weights) {
                                         w8 = int8_rows<float>(N, K);
                                         for (index_t r = 0; r < N; ++r) w8.set_row(r, w.data() + r * K);
                                       }
#if defined(DIFFTX_ONEDNN)
                                       std::shared_ptr<const policy::simd::packed_weights> packed_w;
                                       if constexpr (int8_weights)
                                         packed_w = packed ? pack_weights(p, w8) : nullptr;
                                       else
                                         packed_w = packed ? pack_weights(p, flatten_rows(w.const_view())) : nullptr;
                                       if (packed && !packed_w) state.SkipWithError("oneDNN reads W as it lies here");
#endif
                                       for (auto _ : state) {
#if defined(DIFFTX_ONEDNN)
                                         if (packed_w) {
                                           if constexpr (int8_weights)
                                             linear_forward(p, flatten_rows(x.const_view()), w8, *packed_w,
                                                            flatten_rows(y.view()));
                                           else
                                             linear_forward(p, flatten_rows(x.const_view()),
                                                            flatten_rows(w.const_view()), *packed_w,
                                                            flatten_rows(y.view()));
                                           benchmark::ClobberMemory();
                                           continue;
                                         }
#endif
                                         if constexpr (int8_weights)
                                           linear_forward(p, flatten_rows(x.const_view()), w8, flatten_rows(y.view()));
                                         else if (backward)
                                           linear_backward(p, flatten_rows(x.const_view()), flatten_rows(w.const_view()),
                                                           flatten_rows(y.const_view()), flatten_rows(dx.view()),
                                                           flatten_rows(dw.view()));
                                         else
                                           linear_forward(p, flatten_rows(x.const_view()), flatten_rows(w.const_view()),
                                                          flatten_rows(y.view()));
                                         benchmark::ClobberMemory();
                                       }
                                       set_counters(state, backward ? fl::linear_backward(M, N, K)
                                                                    : fl::linear_forward(M, N, K),
                                                    static_cast<double>(M));
                                     })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
  }
}

// A prompt of a length oneDNN has not seen: the first product of M rows
// creates a primitive for M (oneDNN's kernels are made for a row count), the
// next one reuses it (onednn_matmul.hpp's cache). Each iteration takes a row
// count this process has not used before (from 65 rows up) and times its first
// product (the iteration's time) and its second (counter warm_ms): the
// difference is what a new prompt length costs once per weight shape.
template <class T>
void register_linear_new_rows([[maybe_unused]] const std::string& dtype) {
#if defined(DIFFTX_ONEDNN)
  using clock = std::chrono::steady_clock;
  for (const auto& [N, K] : {std::array<index_t, 2>{4096, 1024}, {1024, 4096}})
    benchmark::RegisterBenchmark(("op:linear/simd/" + dtype + "/onednn/first_product_at_new_rows/" +
                                  std::to_string(N) + "x" + std::to_string(K))
                                     .c_str(),
                                 [=](benchmark::State& state) {
                                   static index_t next_rows = 65;  // each type's row counts, never reused
                                   policy::simd p;
                                   p.matmuls = policy::simd::matmul_library::onednn;
                                   const auto w = random_input<T>(N, 3, 1, K);
                                   double warm = 0;
                                   for (auto _ : state) {
                                     const index_t M = next_rows++;
                                     const auto x = random_input<T>(M, 1, 1, K);
                                     Tensor<T, 3> y({1, M, N});  // zeroed: its pages are in before the clock
                                     const auto product = [&] {
                                       linear_forward(p, flatten_rows(x.const_view()), flatten_rows(w.const_view()),
                                                      flatten_rows(y.view()));
                                       benchmark::ClobberMemory();
                                     };
                                     const auto start = clock::now();
                                     product();
                                     const auto first = clock::now();
                                     product();
                                     const auto second = clock::now();
                                     state.SetIterationTime(std::chrono::duration<double>(first - start).count());
                                     warm += std::chrono::duration<double>(second - first).count();
                                   }
                                   state.counters["warm_ms"] = 1e3 * warm / static_cast<double>(state.iterations());
                                 })
        ->UseManualTime()
        ->Iterations(16)
        ->Unit(benchmark::kMillisecond);
#endif
}

// The machine's read bandwidth: a 1 GiB tensor (far past every cache) read
// by OMP_NUM_THREADS threads as simd_detail::read_through reads (one
// sequential stream per thread), on the pages a model's weights get (huge
// pages where the kernel gives them). `difftx bench --model` reads the
// model's own weights the same way between decode steps.
void read_bandwidth(benchmark::State& state) {
  constexpr std::size_t count = std::size_t{1} << 28;  // 1 GiB of floats
  Tensor<float, 1> values({static_cast<index_t>(count)});
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < count; ++i) values.data()[i] = 1.0f;  // each thread faults in the pages it will read
  const std::span<const std::byte> region = std::as_bytes(std::span<const float>(values.data(), count));
  for (auto _ : state) benchmark::DoNotOptimize(simd_detail::read_through(omp_get_max_threads(), {&region, 1}));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * count * sizeof(float)));
}

// Eigen's single-precision GEMM at a square size: the rate the kernels are measured against.
void eigen_sgemm(benchmark::State& state) {
  const auto n = static_cast<Eigen::Index>(state.range(0));
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::ClobberMemory();
  }
  set_counters(state, 2.0 * static_cast<double>(n * n * n), 0);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("read_bandwidth", read_bandwidth)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("eigen_sgemm", eigen_sgemm)->Arg(1024)->Arg(2048)->UseRealTime()->Unit(benchmark::kMillisecond);
  register_token_ops<float, policy::simd>("simd", "float32", {2048});
  register_token_ops<Eigen::bfloat16, policy::simd>("simd", "bfloat16", {2048});
  register_bf16_products();
  register_linear_libraries<float>("float32");
  register_linear_libraries<Eigen::bfloat16>("bfloat16");
  register_linear_libraries<std::int8_t>("int8");
  register_linear_new_rows<float>("float32");
  register_linear_new_rows<Eigen::bfloat16>("bfloat16");
  register_token_ops<float, policy::reference>("reference", "float32", {256});
  register_attention_op<2, float, policy::simd>("simd", "float32", {512, 1024, 2048, 4096});
  register_attention_op<1, float, policy::simd>("simd", "float32", {512, 1024, 2048, 4096});
  register_attention_op<2, Eigen::bfloat16, policy::simd>("simd", "bfloat16", {2048});
  register_modules<float, policy::simd>("simd", "float32", {256, 512, 1024, 2048, 4096});
  register_modules<Eigen::bfloat16, policy::simd>("simd", "bfloat16", {2048});
  register_modules<float, policy::reference>("reference", "float32", {256});
  register_head_dim_paths<float, policy::simd>("simd", "float32", 1024);
  register_head_dim_paths<float, policy::reference>("reference", "float32", 128);
  register_small_shape();
  register_decoding<float, policy::simd>("simd", "float32", {1024, 4096});
  register_decoding<Eigen::bfloat16, policy::simd>("simd", "bfloat16", {1024});
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
