// nccl_communicator (difftx/parallel/nccl.hpp) as rank 0 of 1 on this
// machine's GPU: all_reduce_sum leaves x as it is in every type NCCL sums
// (float32, float64, float16, bfloat16), all_gather copies part into whole,
// barrier and synchronize return, and bad input is input_error before
// anything is sent. A communicator of two ranks whose peer never joins gives
// communication_error at its timeout. Over one rank, the tensor-parallel
// decoder layer equals the plain DecoderLayer (forward and every gradient,
// within difftx::testing::tolerance), and GradientAverager leaves the
// gradients exactly as they are. Without a GPU the suite exits 77, which
// CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/parallel/data_parallel.hpp>
#include <difftx/parallel/nccl.hpp>
#include <difftx/parallel/tensor_parallel.hpp>
#include <difftx/policy/cuda.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/helpers.hpp"

using namespace difftx;
using parallel::nccl_communicator;

namespace {

// host's values as T, in device memory.
template <class T, std::size_t R>
Tensor<T, R> to_device(const Tensor<double, R>& host, const policy::cuda& p) {
  std::vector<T> typed(static_cast<std::size_t>(host.size()));
  for (std::size_t i = 0; i < typed.size(); ++i) typed[i] = scalar_traits<T>::from_double(host.data()[i]);
  Tensor<T, R> device(host.shape(), p.memory());
  p.memory().upload(device.data(), typed.data(), typed.size() * sizeof(T));
  return device;
}

// n elements of T at device, as doubles.
template <class T>
std::vector<double> download(const T* device, index_t n, const policy::cuda& p) {
  std::vector<T> typed(static_cast<std::size_t>(n));
  p.memory().download(typed.data(), device, typed.size() * sizeof(T));
  std::vector<double> out(typed.size());
  for (std::size_t i = 0; i < typed.size(); ++i) out[i] = scalar_traits<T>::to_double(typed[i]);
  return out;
}

// [n] of -3, -2.75, ..., exact in every type NCCL sums.
Tensor<double, 1> quarter_steps(index_t n) {
  Tensor<double, 1> values({n});
  for (index_t i = 0; i < n; ++i) values.data()[i] = -3.0 + 0.25 * static_cast<double>(i);
  return values;
}

std::vector<double> elements(const Tensor<double, 1>& t) { return {t.data(), t.data() + t.size()}; }

template <class T>
void check_all_reduce_sum() {
  INFO(scalar_traits<T>::name);
  policy::cuda p;
  auto comm = nccl_communicator::single(p);
  const auto values = quarter_steps(37);
  auto x = to_device<T>(values, p);
  comm.all_reduce_sum(x.view());
  comm.synchronize();
  CHECK(download(x.data(), x.size(), p) == elements(values));

  Tensor<T, 1> on_host({4});
  test_support::expect_input_error([&] { comm.all_reduce_sum(on_host.view()); }, "nccl_communicator::all_reduce_sum",
                                   "x", "device memory", "host memory");
}

template <class T>
void check_all_gather() {
  INFO(scalar_traits<T>::name);
  policy::cuda p;
  auto comm = nccl_communicator::single(p);
  const auto values = quarter_steps(5);
  const auto part = to_device<T>(values, p);
  Tensor<T, 1> whole({5}, p.memory());
  comm.all_gather(part.const_view(), whole.view());
  comm.synchronize();
  CHECK(download(whole.data(), whole.size(), p) == elements(values));

  Tensor<T, 1> too_long({6}, p.memory());
  test_support::expect_input_error([&] { comm.all_gather(part.const_view(), too_long.view()); },
                                   "nccl_communicator::all_gather", "whole", "shape [5]", "[6]");
  Tensor<T, 1> on_host({5});
  test_support::expect_input_error([&] { comm.all_gather(on_host.const_view(), whole.view()); },
                                   "nccl_communicator::all_gather", "part", "device memory", "host memory");
}

// The layer split over one rank against the plain layer with the same
// default initialisation; then GradientAverager over the plain layer.
template <class T>
void check_tensor_parallel_layer() {
  policy::cuda p;
  auto comm = nccl_communicator::single(p);
  const DecoderLayerConfig config{{.d_model = 64, .heads = 2, .kv_heads = 1, .layer_index = 1}, 96};
  DecoderLayer<T, 32, policy::cuda> plain(config, p);
  parallel::TensorParallelDecoderLayer<nccl_communicator, T, 32, policy::cuda> split(config, comm, p);
  const auto plain_params = plain.parameters();
  const auto split_params = split.parameters();
  REQUIRE(split_params.size() == plain_params.size());
  for (std::size_t i = 0; i < plain_params.size(); ++i) {
    INFO(plain_params[i].name);
    CHECK(split_params[i].name == plain_params[i].name);
    CHECK(download(split_params[i].value, split_params[i].size(), p) ==
          download(plain_params[i].value, plain_params[i].size(), p));
  }

  const shape_t<3> shape{2, 9, 64};
  const auto x = to_device<T>(test_support::random_tensor<double, 3>(shape, 41), p);
  const auto dy = to_device<T>(test_support::random_tensor<double, 3>(shape, 42), p);
  Tensor<T, 3> y_plain(shape, p.memory()), y_split(shape, p.memory());
  Tensor<T, 3> dx_plain(shape, p.memory()), dx_split(shape, p.memory());
  typename decltype(plain)::saved_type saved_plain;
  typename decltype(split)::saved_type saved_split;
  zero_grad(plain);
  zero_grad(split);
  plain.forward(x, y_plain, saved_plain);
  plain.backward(x, dy, saved_plain, dx_plain);
  split.forward(x, y_split, saved_split);
  split.backward(x, dy, saved_split, dx_split);
  comm.synchronize();

  const auto y_want = download(y_plain.data(), y_plain.size(), p);
  const auto y_got = download(y_split.data(), y_split.size(), p);
  const double forward = testing::normwise_difference(y_got.data(), y_want.data(), y_plain.size());
  std::vector<std::vector<double>> want{download(dx_plain.data(), dx_plain.size(), p)};
  std::vector<std::vector<double>> got{download(dx_split.data(), dx_split.size(), p)};
  std::vector<std::string> names{"input"};
  for (std::size_t i = 0; i < plain_params.size(); ++i) {
    want.push_back(download(plain_params[i].grad, plain_params[i].size(), p));
    got.push_back(download(split_params[i].grad, split_params[i].size(), p));
    names.push_back(plain_params[i].name);
  }
  double scale = 0;
  for (const auto& g : want) scale = std::max(scale, testing::max_abs(g.data(), static_cast<index_t>(g.size())));
  double backward = 0;
  std::string worst = "none";
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = testing::normwise_difference(got[i].data(), want[i].data(), static_cast<index_t>(want[i].size()),
                                                  testing::gradient_floor_fraction * scale);
    if (d >= backward) {
      backward = d;
      worst = names[i];
    }
  }
  const double u = scalar_traits<T>::epsilon;
  MESSAGE("TensorParallelDecoderLayer, one rank, " << scalar_traits<T>::name << ": forward " << forward / u
                                                  << " u, backward " << backward / u << " u (worst " << worst << ")");
  CHECK(forward <= testing::tolerance<T>::forward);
  CHECK(backward <= testing::tolerance<T>::backward);

  parallel::GradientAverager<T, nccl_communicator> average(plain.parameters(), comm);
  average.average();
  comm.synchronize();
  for (std::size_t i = 0; i < plain_params.size(); ++i) {
    INFO(plain_params[i].name);
    CHECK(download(plain_params[i].grad, plain_params[i].size(), p) == want[i + 1]);
  }
}

}  // namespace

TEST_CASE("nccl: one rank of device memory on the policy's stream") {
  policy::cuda p;
  auto comm = nccl_communicator::single(p);
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  CHECK(comm.memory().space() == memory_space::device);
  CHECK(&comm.memory() == &p.memory());
  CHECK(comm.stream() == p.stream());
  CHECK(comm.comm() != nullptr);
}

TEST_CASE("nccl: all_reduce_sum on one rank leaves x as it is, and refuses host memory") {
  check_all_reduce_sum<float>();
  check_all_reduce_sum<double>();
  check_all_reduce_sum<Eigen::half>();
  check_all_reduce_sum<Eigen::bfloat16>();
}

TEST_CASE("nccl: all_gather on one rank copies part into whole, and refuses a wrong size or host memory") {
  check_all_gather<float>();
  check_all_gather<double>();
  check_all_gather<Eigen::bfloat16>();
}

TEST_CASE("nccl: barrier and synchronize return") {
  auto comm = nccl_communicator::single();
  comm.barrier();
  comm.synchronize();
  comm.barrier();
}

TEST_CASE("nccl: bad construction arguments are input_error, before NCCL is called") {
  const ncclUniqueId id{};
  const policy::cuda p;
  test_support::expect_input_error([&] { nccl_communicator comm(id, 2, 2, p); }, "nccl_communicator", "rank",
                                   "a rank in [0, 2)", "2");
  test_support::expect_input_error([&] { nccl_communicator comm(id, 0, 0, p); }, "nccl_communicator", "size",
                                   "at least 1 rank", "0");
  test_support::expect_input_error([&] { nccl_communicator comm(id, 0, 1, p, std::chrono::milliseconds(0)); },
                                   "nccl_communicator", "timeout", "a positive duration", "0 ms");
}

TEST_CASE("nccl: a peer that never joins is communication_error at the timeout") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const auto timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    nccl_communicator comm(id, 0, 2, policy::cuda{}, timeout);  // rank 1 never comes
  } catch (const communication_error& e) {
    message = e.what();
    CHECK(e.where() == "nccl_communicator");
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  INFO("message: " << message);
  CHECK(message.find("within 1500 ms, not every rank of 2 joined the communicator") != std::string::npos);
  CHECK(message.find("no longer usable") != std::string::npos);
  CHECK(waited >= timeout);
  CHECK(waited < timeout + std::chrono::seconds(30));  // aborting a stalled initialisation is prompt
}

TEST_CASE("nccl: TensorParallelDecoderLayer over one rank equals DecoderLayer; GradientAverager leaves gradients") {
  check_tensor_parallel_layer<float>();
  check_tensor_parallel_layer<double>();
  check_tensor_parallel_layer<Eigen::bfloat16>();
}

int main(int argc, char** argv) {
  if (!cuda_device_available()) {
    std::printf("nccl_test: skipped, no CUDA device on this machine\n");
    return 77;
  }
  return doctest::Context(argc, argv).run();
}
