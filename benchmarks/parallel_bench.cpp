// Google Benchmark suite for scale-out over MPI (include/difftx/parallel/):
// one DecoderLayer at the CPU issue's width (C = 768, h = 6 differential heads
// of D = 64, F = 2048), float32 on policy::simd, a global batch of 4 sequences
// of 256 tokens. Run it as one process and under mpirun; every rank runs the
// same fixed iterations (their collectives must match) and rank 0 reports.
//
//   OMP_NUM_THREADS=2 build/release/benchmarks/difftx_parallel_bench
//   OMP_NUM_THREADS=1 mpirun -np 2 build/release/benchmarks/difftx_parallel_bench
//
// Rows: "Whole/..." the plain layer on the whole batch (the one-process
// reference); "DataParallel/.../step" zero_grad, forward, backward and the
// gradient average on this rank's B/p sequences; "DataParallel/average" the
// average alone (one all-reduce of every gradient, 7.1 M floats);
// "TensorParallel/..." the layer with h/p heads and F/p hidden units per rank
// on the whole batch. tokens/s counts the whole batch's tokens.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/parallel/data_parallel.hpp>
#include <difftx/parallel/mpi.hpp>
#include <difftx/parallel/tensor_parallel.hpp>
#include <difftx/policy/simd.hpp>

using namespace difftx;

namespace {

constexpr index_t C = 768, h = 6, D = 64, F = 2048, batch = 4, N = 256;
using layer = DecoderLayer<float, D, policy::simd>;
using parallel_layer = parallel::TensorParallelDecoderLayer<parallel::mpi_communicator, float, D, policy::simd>;
const DecoderLayerConfig config{{.d_model = C, .heads = h, .kv_heads = h}, F};

std::optional<parallel::mpi_communicator> world_communicator;  // between MPI_Init and MPI_Finalize
parallel::mpi_communicator& world() { return *world_communicator; }

Tensor<float, 3> random_input(index_t b, std::uint64_t seed) {
  Tensor<float, 3> x({b, N, C});
  random_stream rng(seed);  // the same on every rank, as tensor parallelism needs
  fill_normal(x.view(), rng);
  return x;
}

template <class Module, class AfterBackward>
void run_steps(benchmark::State& state, Module& module, index_t b, AfterBackward&& after_backward) {
  const auto x = random_input(b, 1), dy = random_input(b, 2);
  Tensor<float, 3> y(x.shape()), dx(x.shape());
  typename Module::saved_type saved;
  world().barrier();
  for (auto _ : state) {
    zero_grad(module);
    module.forward(x, y, saved);
    module.backward(x, dy, saved, dx);
    after_backward();
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(batch * N), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ranks"] = world().size();
}

void whole(benchmark::State& state) {
  layer module(config);
  run_steps(state, module, batch, [] {});
}

void data_parallel_step(benchmark::State& state) {
  layer module(config);
  parallel::GradientAverager<float, parallel::mpi_communicator> average(module.parameters(), world());
  run_steps(state, module, batch / world().size(), [&] { average.average(); });
}

void data_parallel_average(benchmark::State& state) {
  layer module(config);
  parallel::GradientAverager<float, parallel::mpi_communicator> average(module.parameters(), world());
  world().barrier();
  for (auto _ : state) average.average();
  index_t n = 0;
  for (const auto& p : module.parameters()) n += p.size();
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(n) * sizeof(float) * 1e-6,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void tensor_parallel(benchmark::State& state) {
  parallel_layer module(config, world());
  run_steps(state, module, batch, [] {});
}

// Prints nothing: ranks other than 0 run the same benchmarks silently.
class silent_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  world_communicator.emplace();
  {
    const std::string suffix = "/float32/batch:" + std::to_string(batch) + "/N:" + std::to_string(N);
    // Fixed iterations: every rank must run the same collectives.
    using benchmark_fn = void (*)(benchmark::State&);
    const std::pair<std::string, benchmark_fn> benchmarks[] = {
        {"Whole/DecoderLayer" + suffix + "/forward_backward", &whole},
        {"DataParallel/DecoderLayer" + suffix + "/step", &data_parallel_step},
        {"DataParallel/DecoderLayer/float32/average", &data_parallel_average},
        {"TensorParallel/DecoderLayer" + suffix + "/forward_backward", &tensor_parallel}};
    for (const auto& [name, fn] : benchmarks)
      benchmark::RegisterBenchmark(name.c_str(), fn)->Iterations(4)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::Initialize(&argc, argv);
    silent_reporter silent;
    if (world().rank() == 0)
      benchmark::RunSpecifiedBenchmarks();
    else
      benchmark::RunSpecifiedBenchmarks(&silent);
  }
  world_communicator.reset();
  MPI_Finalize();
  return 0;
}
