// policy::cuda against the reference policy (in double) on random shapes: odd
// N, N not a multiple of the tiles, grouped heads, non-causal, B > 1; forward
// and every gradient of every module, in float32, float16 and bfloat16, within
// difftx::testing::tolerance. Head sizes 64 and 128 exercise the tensor-core
// attention kernels, 8 the CUDA-core ones. Without a GPU the suite exits 77,
// which CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/cuda.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/compare_modules.hpp"

using namespace difftx;

namespace {

template <class T, std::size_t R>
Tensor<T, R> to_device(const Tensor<double, R>& host, const policy::cuda& p) {
  Tensor<T, R> typed(host.shape());
  for (index_t i = 0; i < host.size(); ++i) typed.data()[i] = scalar_traits<T>::from_double(host.data()[i]);
  Tensor<T, R> device(host.shape(), p.memory());
  p.memory().upload(device.data(), typed.data(), static_cast<std::size_t>(typed.size()) * sizeof(T));
  return device;
}

template <class T>
std::vector<double> to_host(const T* device, index_t n, const policy::cuda& p) {
  std::vector<T> typed(static_cast<std::size_t>(n));
  p.memory().download(typed.data(), device, typed.size() * sizeof(T));
  std::vector<double> out(typed.size());
  for (std::size_t i = 0; i < typed.size(); ++i) out[i] = scalar_traits<T>::to_double(typed[i]);
  return out;
}

// Rounds a double through T, so the reference sees exactly what the GPU holds.
template <class T>
double through(double v) {
  return scalar_traits<T>::to_double(scalar_traits<T>::from_double(v));
}

// The module in T on the GPU against the same module in double on the host.
template <class T, class Make>
void check_module(const std::string& label, Make make, const shape_t<3>& shape) {
  policy::cuda p;
  auto reference = make.template operator()<double, policy::reference>(policy::reference{});
  auto gpu = make.template operator()<T, policy::cuda>(p);
  test_support::randomise_parameters(reference, 11);
  auto ref_params = reference.parameters();
  auto gpu_params = gpu.parameters();
  REQUIRE(ref_params.size() == gpu_params.size());
  for (std::size_t i = 0; i < ref_params.size(); ++i) {
    std::vector<T> typed(static_cast<std::size_t>(ref_params[i].size()));
    for (index_t e = 0; e < ref_params[i].size(); ++e) {
      ref_params[i].value[e] = through<T>(ref_params[i].value[e]);
      typed[static_cast<std::size_t>(e)] = scalar_traits<T>::from_double(ref_params[i].value[e]);
    }
    p.memory().upload(gpu_params[i].value, typed.data(), typed.size() * sizeof(T));
  }
  auto x = test_support::random_tensor<double, 3>(shape, 12), dy = test_support::random_tensor<double, 3>(shape, 13);
  for (auto* t : {&x, &dy})
    for (index_t i = 0; i < t->size(); ++i) t->data()[i] = through<T>(t->data()[i]);

  const auto [y_ref, dx_ref] = test_support::run_forward_backward(reference, x, dy);
  const auto x_gpu = to_device<T>(x, p), dy_gpu = to_device<T>(dy, p);
  Tensor<T, 3> y_gpu(shape, p.memory()), dx_gpu(shape, p.memory());
  typename decltype(gpu)::saved_type saved;
  zero_grad(gpu);
  gpu.forward(x_gpu, y_gpu, saved);
  gpu.backward(x_gpu, dy_gpu, saved, dx_gpu);

  double scale = testing::max_abs(dx_ref.data(), dx_ref.size());
  for (const auto& g : ref_params) scale = std::max(scale, testing::max_abs(g.grad, g.size()));
  const double floor = 0.1 * scale;  // as test_support::compare_modules, for the same reason
  const auto y = to_host(y_gpu.data(), y_gpu.size(), p);
  const auto dx = to_host(dx_gpu.data(), dx_gpu.size(), p);
  const double forward = testing::normwise_difference(y.data(), y_ref.data(), y_ref.size());
  double backward = testing::normwise_difference(dx.data(), dx_ref.data(), dx_ref.size(), floor);
  std::string worst = "input";
  for (std::size_t i = 0; i < ref_params.size(); ++i) {
    const auto g = to_host(gpu_params[i].grad, gpu_params[i].size(), p);
    const double d = testing::normwise_difference(g.data(), ref_params[i].grad, ref_params[i].size(), floor);
    if (d > backward) {
      backward = d;
      worst = ref_params[i].name;
    }
  }
  const double u = scalar_traits<T>::epsilon;
  MESSAGE(label << " " << scalar_traits<T>::name << ": forward " << forward / u << " u, backward " << backward / u
                << " u (worst " << worst << ")");
  CHECK(forward <= testing::tolerance<T>::forward);
  CHECK(backward <= testing::tolerance<T>::backward);
}

template <class Make>
void check_all_types(const std::string& label, Make make, const shape_t<3>& shape) {
  check_module<float>(label, make, shape);
  check_module<Eigen::half>(label, make, shape);
  check_module<Eigen::bfloat16>(label, make, shape);
}

struct attention_case {
  index_t batch, seq, heads, kv_heads;
  bool causal;
};
const attention_case cases[] = {{1, 1, 2, 2, true}, {2, 63, 4, 2, true}, {1, 130, 2, 1, false}, {2, 97, 4, 4, true}};

std::string describe(const attention_case& c) {
  return "B=" + std::to_string(c.batch) + " N=" + std::to_string(c.seq) + " h=" + std::to_string(c.heads) +
         " g=" + std::to_string(c.kv_heads) + (c.causal ? " causal" : " non-causal");
}

}  // namespace

TEST_CASE("cuda: RMSNorm and SwiGLU") {
  check_all_types("RMSNorm", []<class U, class P>(P p) { return RMSNorm<U, P>(96, 1e-5, 1.0, p); }, {2, 33, 96});
  check_all_types("SwiGLU", []<class U, class P>(P p) { return SwiGLU<U, P>(96, 160, p); }, {2, 33, 96});
}

TEST_CASE("cuda: MultiHead, tensor-core attention (D = 64, 128) and CUDA-core attention (D = 8)") {
  for (const auto& c : cases) {
    check_all_types(
        "MultiHead D=64 " + describe(c),
        [c]<class U, class P>(P p) {
          return MultiHead<U, 64, P>({.d_model = 128, .heads = c.heads, .kv_heads = c.kv_heads, .layer_index = 2,
                                      .rope_theta = 10000.0, .causal = c.causal},
                                     p);
        },
        {c.batch, c.seq, 128});
    check_all_types(
        "MultiHead D=8 " + describe(c),
        [c]<class U, class P>(P p) {
          return MultiHead<U, 8, P>({.d_model = 48, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal}, p);
        },
        {c.batch, c.seq, 48});
  }
  check_all_types(
      "MultiHead D=128",
      []<class U, class P>(P p) { return MultiHead<U, 128, P>({.d_model = 256, .heads = 2, .kv_heads = 1}, p); },
      {1, 150, 256});
}

TEST_CASE("cuda: baseline Attention and DecoderLayer") {
  check_all_types(
      "Attention D=64",
      []<class U, class P>(P p) { return Attention<U, 64, P>({.d_model = 128, .heads = 4, .kv_heads = 2}, p); },
      {2, 77, 128});
  check_all_types(
      "DecoderLayer D=64",
      []<class U, class P>(P p) {
        return DecoderLayer<U, 64, P>({{.d_model = 128, .heads = 2, .kv_heads = 1, .layer_index = 3}, 192}, p);
      },
      {2, 70, 128});
}

int main(int argc, char** argv) {
  if (!cuda_device_available()) {
    std::printf("cuda_test: skipped, no CUDA device on this machine\n");
    return 77;
  }
  return doctest::Context(argc, argv).run();
}
