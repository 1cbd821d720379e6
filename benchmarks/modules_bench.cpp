// Google Benchmark suite: each module's forward and forward + backward, per
// policy, over several sequence lengths.
#include <benchmark/benchmark.h>

#include <difftx/difftx.hpp>

using namespace difftx;

namespace {

template <class Module>
void run_module(benchmark::State& state, Module& module, index_t batch, index_t seq, index_t width, bool backward) {
  using T = typename Module::value_type;
  Tensor<T, 3> x({batch, seq, width}), y(x.shape()), dy(x.shape()), dx(x.shape());
  random_stream rng(1);
  fill_normal(x.view(), rng);
  fill_normal(dy.view(), rng);
  typename Module::saved_type saved;
  for (auto _ : state) {
    module.forward(x.view(), y.view(), saved);
    if (backward) module.backward(x.view(), dy.view(), saved, dx.view());
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(dx.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * seq), benchmark::Counter::kIsIterationInvariantRate);
}

template <class T, class Policy>
void multihead(benchmark::State& state) {
  const index_t N = state.range(0);
  MultiHead<T, 16, Policy> mh({.d_model = 64, .heads = 2, .kv_heads = 2});
  run_module(state, mh, 1, N, 64, state.range(1) != 0);
}

template <class T, class Policy>
void decoder_layer(benchmark::State& state) {
  const index_t N = state.range(0);
  DecoderLayer<T, 16, Policy> layer({{.d_model = 64, .heads = 2, .kv_heads = 2}});
  run_module(state, layer, 1, N, 64, state.range(1) != 0);
}

}  // namespace

// range(0) = N, range(1) = 0 forward only, 1 forward + backward
BENCHMARK(multihead<float, policy::reference>)->ArgsProduct({{64, 256}, {0, 1}})->Unit(benchmark::kMillisecond);
BENCHMARK(decoder_layer<float, policy::reference>)->ArgsProduct({{64, 256}, {0, 1}})->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
