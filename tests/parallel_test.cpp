// Tensor and data parallelism over MPI (include/difftx/parallel/). CTest runs
// this suite twice: under `mpirun -np 2` and as one process (a one-rank
// communicator, where every parallel module must be its whole twin).
//
// Equality bars: a tensor-parallel module computes the whole module's sums
// grouped by rank (each rank's heads or hidden units, then the all-reduce),
// and rounds each rank's part to T once more before the sum. Both results are
// within tolerance<T> (testing/tolerance.hpp) of the exact one, so their
// difference is bounded by it as well; it is stated per dtype there. Data
// parallelism: see the training case.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/io/safetensors.hpp>
#include <difftx/optim/adamw.hpp>
#include <difftx/parallel/checkpoint.hpp>
#include <difftx/parallel/data_parallel.hpp>
#include <difftx/parallel/mpi.hpp>
#include <difftx/parallel/tensor_parallel.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/helpers.hpp"

using namespace difftx;
using parallel::mpi_communicator;
using test_support::expect_input_error;
using test_support::random_tensor;
using test_support::randomise_parameters;

namespace {

// The communicator every case shares (made after MPI_Init, freed before
// MPI_Finalize in main); a minute is far beyond any collective here, so a
// failing rank ends the run instead of hanging it.
std::optional<mpi_communicator> world_communicator;
mpi_communicator& world() { return *world_communicator; }

template <class T, class Policy>
struct setting {
  using value_type = T;
  using policy_type = Policy;
};
using reference_double = setting<double, policy::reference>;
using simd_float = setting<float, policy::simd>;
using simd_bfloat16 = setting<Eigen::bfloat16, policy::simd>;

constexpr index_t D = 8;

DecoderLayerConfig layer_config(index_t heads, index_t kv_heads) {
  DecoderLayerConfig c;
  c.attention.d_model = 32;
  c.attention.heads = heads;
  c.attention.kv_heads = kv_heads;
  c.attention.layer_index = 1;
  return c;
}

// Runs whole and parallel (its tensor-parallel twin, given whole's values) on
// the same x and dy and checks the output, dx and every gradient gathered whole.
template <class Whole, class Parallel>
void check_equal_to_whole(Whole& whole, Parallel& parallel, const shape_t<3>& shape) {
  using T = typename Whole::value_type;
  randomise_parameters(whole, 17);
  parallel::copy_parts(whole, parallel);
  const auto x = random_tensor<T, 3>(shape, 3), dy = random_tensor<T, 3>(shape, 4);
  Tensor<T, 3> y_whole(shape), dx_whole(shape), y(shape), dx(shape);
  typename Whole::saved_type saved_whole;
  typename Parallel::saved_type saved;
  zero_grad(whole);
  zero_grad(parallel);
  whole.forward(x.view(), y_whole.view(), saved_whole);
  whole.backward(x.view(), dy.view(), saved_whole, dx_whole.view());
  parallel.forward(x.view(), y.view(), saved);
  parallel.backward(x.view(), dy.view(), saved, dx.view());

  const double forward_bar = testing::tolerance<T>::forward, backward_bar = testing::tolerance<T>::backward;
  const double y_difference = testing::normwise_difference(y.data(), y_whole.data(), y.size());
  const double dx_difference = testing::normwise_difference(dx.data(), dx_whole.data(), dx.size());
  CHECK(y_difference <= forward_bar);
  CHECK(dx_difference <= backward_bar);
  double worst_gradient = 0;
  const auto whole_params = whole.parameters();
  const auto parts = parallel.parameters();
  REQUIRE(parts.size() == whole_params.size());
  double largest = 0;
  for (const auto& p : whole_params) largest = std::max(largest, testing::max_abs(p.grad, p.size()));
  for (std::size_t i = 0; i < parts.size(); ++i) {
    INFO(parts[i].name);
    CHECK(parts[i].name == whole_params[i].name);
    CHECK(parts[i].is_shard() == (world().size() > 1 && parts[i].name.ends_with("proj.weight")));
    const auto grad = parallel::whole_parameter(parts[i], parts[i].grad, world());
    REQUIRE(static_cast<index_t>(grad.size()) == whole_params[i].size());
    const double difference = testing::normwise_difference(grad.data(), whole_params[i].grad, whole_params[i].size(),
                                                           testing::gradient_floor_fraction * largest);
    CHECK(difference <= backward_bar);
    worst_gradient = std::max(worst_gradient, difference);
  }
  // The whole model's gradient norm from the parts: each rank's split parameters summed, the whole ones once.
  const double norm = clip_grad_norm(whole.parameters(), 0.0);
  CHECK(std::abs(parallel::clip_grad_norm(parallel.parameters(), 0.0, world()) - norm) <= backward_bar * norm);
  if (world().rank() == 0)
    MESSAGE(world().size() << " ranks, " << scalar_traits<T>::name << ": y " << y_difference / testing::tolerance<T>::storage
                           << " u, dx " << dx_difference / testing::tolerance<T>::storage << " u, worst gradient "
                           << worst_gradient / testing::tolerance<T>::storage << " u");
}

}  // namespace

TEST_CASE_TEMPLATE("a tensor-parallel DecoderLayer equals the whole layer: output, dx and every gradient", S,
                   reference_double, simd_float, simd_bfloat16) {
  using T = typename S::value_type;
  using Policy = typename S::policy_type;
  for (const auto& [heads, groups] : {std::pair<index_t, index_t>{4, 4}, {4, 2}, {2, 2}}) {
    CAPTURE(heads);
    CAPTURE(groups);
    const auto config = layer_config(heads, groups);
    DecoderLayer<T, D, Policy> whole(config);
    parallel::TensorParallelDecoderLayer<mpi_communicator, T, D, Policy> parallel(config, world());
    CHECK(parallel.config().attention.heads == heads);
    CHECK(parallel.config().ffn_dim == whole.config().ffn_dim);
    check_equal_to_whole(whole, parallel, {3, 6, 32});
  }
}

TEST_CASE("a tensor-parallel DecoderLayerV2 and a Stack of two layers equal the whole ones") {
  DecoderLayerV2Config v2;
  v2.attention.d_model = 32;
  v2.attention.heads = 2;
  v2.attention.kv_heads = 2;
  DecoderLayerV2<double, D> whole_v2(v2);
  parallel::TensorParallelDecoderLayerV2<mpi_communicator, double, D> parallel_v2(v2, world());
  check_equal_to_whole(whole_v2, parallel_v2, {2, 5, 32});

  using layer = DecoderLayer<double, D>;
  using parallel_layer = parallel::TensorParallelDecoderLayer<mpi_communicator, double, D>;
  std::vector<layer> whole_layers;
  std::vector<parallel_layer> parallel_layers;
  for (index_t l = 0; l < 2; ++l) {
    auto c = layer_config(4, 2);
    c.attention.layer_index = l;
    whole_layers.emplace_back(c);
    parallel_layers.emplace_back(c, world());
  }
  Stack<layer> whole(std::move(whole_layers));
  Stack<parallel_layer> parallel(std::move(parallel_layers));
  check_equal_to_whole(whole, parallel, {2, 5, 32});
}

TEST_CASE("a new tensor-parallel layer starts as its whole twin from the same seed") {
  const auto config = layer_config(4, 2);
  DecoderLayer<float, D, policy::simd> whole(config);
  parallel::TensorParallelDecoderLayer<mpi_communicator, float, D, policy::simd> parallel(config, world());
  const auto whole_params = whole.parameters();
  for (const auto& p : parallel.parameters()) {
    INFO(p.name);
    const auto value = parallel::whole_parameter(p, p.value, world());
    const auto& w = *std::find_if(whole_params.begin(), whole_params.end(), [&](const auto& q) { return q.name == p.name; });
    CHECK(std::equal(value.begin(), value.end(), w.value));
  }
}

TEST_CASE("tensor-parallel prefill and decode equal the whole layer's") {
  const auto config = layer_config(4, 2);
  DecoderLayer<double, D> whole(config);
  parallel::TensorParallelDecoderLayer<mpi_communicator, double, D> parallel(config, world());
  randomise_parameters(whole, 5);
  parallel::copy_parts(whole, parallel);
  const auto prompt = random_tensor<double, 3>({2, 5, 32}, 6), step = random_tensor<double, 3>({2, 1, 32}, 7);
  auto whole_cache = whole.make_cache(2, 8);
  auto cache = parallel.make_cache(2, 8);
  Tensor<double, 3> a({2, 5, 32}), b({2, 5, 32}), c({2, 1, 32}), d({2, 1, 32});
  whole.prefill(prompt.view(), whole_cache, a.view());
  parallel.prefill(prompt.view(), cache, b.view());
  CHECK(testing::normwise_difference(b.data(), a.data(), a.size()) <= testing::tolerance<double>::forward);
  whole.decode(step.view(), whole_cache, c.view());
  parallel.decode(step.view(), cache, d.view());
  CHECK(testing::normwise_difference(d.data(), c.data(), c.size()) <= testing::tolerance<double>::forward);
}

TEST_CASE("a whole checkpoint loads into every rank's part, and saving gathers it whole") {
  const auto config = layer_config(4, 2);
  DecoderLayer<Eigen::bfloat16, D, policy::simd> whole(config);
  randomise_parameters(whole, 9);
  io::tensor_file file;
  io::store_parameters(file, whole, io::dtype::bf16, "model.");
  parallel::TensorParallelDecoderLayer<mpi_communicator, Eigen::bfloat16, D, policy::simd> parallel(config, world());
  io::load_parameters(parallel, file, "the checkpoint", "model.");
  io::tensor_file saved;
  io::store_parameters(saved, parallel, io::dtype::bf16, world(), "model.");
  REQUIRE(saved.tensors.size() == file.tensors.size());
  for (const auto& [name, tensor] : file.tensors) {
    INFO(name);
    REQUIRE(saved.tensors.count(name) == 1);
    CHECK(saved.tensors.at(name).shape == tensor.shape);
    CHECK(saved.tensors.at(name).bytes == tensor.bytes);
  }
  // The plain overload cannot gather: it refuses and writes nothing.
  if (world().size() > 1) {
    io::tensor_file untouched;
    expect_input_error([&] { io::store_parameters(untouched, parallel, io::dtype::bf16); }, "store_parameters",
                       "attn.q_proj.weight", "a whole parameter", "rank");
    CHECK(untouched.tensors.empty());
  }
}

TEST_CASE("a checkpoint of the wrong shape fails on every rank and changes nothing") {
  const auto config = layer_config(4, 2);
  parallel::TensorParallelDecoderLayer<mpi_communicator, float, D, policy::simd> parallel(config, world());
  auto other = config;
  other.attention.heads = 2;
  other.attention.kv_heads = 2;
  DecoderLayer<float, D, policy::simd> smaller(other);
  io::tensor_file file;
  io::store_parameters(file, smaller, io::dtype::f32);
  io::tensor_file before;
  io::store_parameters(before, parallel, io::dtype::f32, world());
  // The file records its architecture: the head count differs. Without the record, the shapes do.
  expect_input_error([&] { io::load_parameters(parallel, file, "small.safetensors"); }, "load_parameters",
                     "attn.heads", "4 (the module's)", "2");
  file.metadata.clear();
  expect_input_error([&] { io::load_parameters(parallel, file, "small.safetensors"); }, "load_parameters",
                     "attn.q_proj.weight", "shape [64, 32] in small.safetensors", "shape [32, 32]");
  io::tensor_file after;
  io::store_parameters(after, parallel, io::dtype::f32, world());
  for (const auto& [name, tensor] : before.tensors) CHECK(after.tensors.at(name).bytes == tensor.bytes);
}

TEST_CASE("heads, groups or hidden units that do not divide among the ranks: input_error on every rank") {
  if (world().size() == 1) return;  // one rank divides everything
  expect_input_error(
      [] { parallel::TensorParallelDecoderLayer<mpi_communicator, float, D> layer(layer_config(3, 3), world()); },
      "TensorParallel<MultiHead>", "config.heads", "a multiple of the 2 ranks", "3");
  expect_input_error(
      [] { parallel::TensorParallelDecoderLayer<mpi_communicator, float, D> layer(layer_config(4, 1), world()); },
      "TensorParallel<MultiHead>", "config.kv_heads", "a multiple of the 2 ranks", "1");
  expect_input_error([] { parallel::TensorParallel<SwiGLU<float>, mpi_communicator> ffn(world(), 32, 97); },
                     "TensorParallel<SwiGLU>", "ffn_dim", "a multiple of the 2 ranks", "97");
}

TEST_CASE("ranks given different models: input_error on every rank, not a hang") {
  if (world().size() == 1) return;
  auto config = layer_config(4, 2);
  if (world().rank() == 1) config.attention.heads = 2;
  expect_input_error(
      [&] { parallel::TensorParallelDecoderLayer<mpi_communicator, float, D> layer(config, world()); },
      "TensorParallel<MultiHead>", "config", "the same on every rank, as rank 0's (32, 4, 2,", "(32, 2, 2, 1");
  // Data parallelism: replicas of different shapes.
  SwiGLU<float> ffn(32, world().rank() == 0 ? 64 : 128);
  expect_input_error([&] { parallel::GradientAverager<float, mpi_communicator> averager(ffn.parameters(), world()); },
                     "GradientAverager", "parameters (count, then each shape)", "the same on every rank", "128");
}

TEST_CASE("a rank that never joins a collective: communication_error after the timeout, not a hang") {
  if (world().size() == 1) return;
  mpi_communicator comm(MPI_COMM_WORLD, std::chrono::milliseconds(300));
  Tensor<float, 1> x({4});
  fill_constant(x.view(), 1.0);
  if (comm.rank() == 0) {
    CHECK_THROWS_AS(comm.all_reduce_sum(x.view()), communication_error);
    CHECK(x.data()[0] == 1.0f);  // nothing of the caller's was written
    CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("cannot be used again"), communication_error);
  }
  // Rank 1 stood aside for the timeout; it now joins, so the collective
  // rank 0 abandoned completes and both ranks can go on.
  world().barrier();
  if (comm.rank() == 1) comm.all_reduce_sum(x.view());
}

TEST_CASE("an all-gather of the wrong size is input_error before anything is sent") {
  Tensor<float, 1> part({3}), whole({3 * world().size() + 1});
  expect_input_error([&] { world().all_gather(part.const_view(), whole.view()); }, "mpi_communicator::all_gather",
                     "whole", "[" + std::to_string(3 * world().size()) + "]", "[");
  world().barrier();
}

// Data parallelism: p ranks, each with B/p sequences and the mean loss over
// its own, averaging gradients, train as one process on all B. Both compute
// the same sums grouped differently.
//  - The first step's averaged gradients: each within tolerance<T>::backward
//    of the exact ones, so of each other (floor as in compare.hpp).
//  - The parameters after k AdamW steps: a step moves p by lr·m̂/(√v̂ + eps),
//    a ratio the gradients' relative error passes on about one to one, and p
//    is rounded to T once per step. Each run is within k·(lr·backward + u·|p|)
//    of exact arithmetic, so the two within twice that.
// A missing or doubled average shows in the gradients as O(1).
TEST_CASE_TEMPLATE("data-parallel training for k steps equals one process on the combined batch", S, reference_double,
                   simd_float) {
  using T = typename S::value_type;
  using Policy = typename S::policy_type;
  using layer = DecoderLayer<T, D, Policy>;
  const index_t ranks = world().size(), per_rank = 2, batch = per_rank * ranks, N = 5, C = 32, steps = 3;
  const auto config = layer_config(4, 2);
  AdamWConfig adam;
  adam.lr.peak = 1e-2;

  // loss = mean over the batch of ½‖out‖²: dout = out / B. first_gradients: after step 0's backward (and average).
  const auto train = [&](Stack<layer>& model, index_t first, index_t count, auto&& after_backward) {
    AdamW<T> optimiser(model.parameters(), adam);
    const auto all = random_tensor<T, 3>({batch, N, C}, 21);
    Tensor<T, 3> x({count, N, C}), out(x.shape()), dout(x.shape()), dx(x.shape());
    std::copy_n(all.data() + first * N * C, x.size(), x.data());
    typename Stack<layer>::saved_type saved;
    std::vector<std::vector<T>> first_gradients;
    for (index_t s = 0; s < steps; ++s) {
      zero_grad(model);
      model.forward(x.view(), out.view(), saved);
      for (index_t i = 0; i < out.size(); ++i)
        dout.data()[i] = store<T>(load(out.data()[i]) / accum_t<T>(static_cast<double>(count)));
      model.backward(x.view(), dout.view(), saved, dx.view());
      after_backward();
      if (s == 0)
        for (const auto& p : model.parameters()) first_gradients.emplace_back(p.grad, p.grad + p.size());
      optimiser.step();
    }
    return first_gradients;
  };
  const auto make = [&] {
    std::vector<layer> layers;
    layers.emplace_back(config);
    layers.emplace_back(config);
    return Stack<layer>(std::move(layers));
  };
  auto alone = make(), replica = make();
  randomise_parameters(alone, 2);
  randomise_parameters(replica, 2);
  const auto expected_gradients = train(alone, 0, batch, [] {});
  parallel::GradientAverager<T, mpi_communicator> averager(replica.parameters(), world(), /*bucket_elements=*/4096);
  CHECK(averager.buckets() > 1);
  const auto gradients = train(replica, world().rank() * per_rank, per_rank, [&] { averager.average(); });

  const auto expected = alone.parameters(), got = replica.parameters();
  double largest = 0, worst_gradient = 0, worst_value = 0;
  for (const auto& g : expected_gradients) largest = std::max(largest, testing::max_abs(g.data(), index_t(g.size())));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].name);
    const double gradient = testing::normwise_difference(gradients[i].data(), expected_gradients[i].data(), got[i].size(),
                                                         testing::gradient_floor_fraction * largest);
    CHECK(gradient <= testing::tolerance<T>::backward);
    double value = 0;
    for (index_t e = 0; e < got[i].size(); ++e)
      value = std::max(value, std::abs(scalar_traits<T>::to_double(got[i].value[e]) -
                                       scalar_traits<T>::to_double(expected[i].value[e])));
    const double scale = testing::max_abs(expected[i].value, expected[i].size());
    CHECK(value <= 2 * steps * (adam.lr.peak * testing::tolerance<T>::backward + testing::tolerance<T>::storage * scale));
    worst_gradient = std::max(worst_gradient, gradient);
    worst_value = std::max(worst_value, value);
  }
  if (world().rank() == 0)
    MESSAGE(world().size() << " ranks, " << scalar_traits<T>::name << ": first gradients "
                           << worst_gradient / testing::tolerance<T>::storage << " u, parameters after " << steps
                           << " steps " << worst_value);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  world_communicator.emplace(MPI_COMM_WORLD, std::chrono::seconds(60));
  doctest::Context context(argc, argv);
  int failed = context.run();
  world_communicator.reset();
  // Every rank reports failure if any rank failed.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
