// The modules instantiated with float, double, long double, Eigen::half,
// Eigen::bfloat16 and a dual number type defined only here.
//  - Each type against the same module in long double, on inputs and weights
//    exactly representable in the type (test_support::compare_modules); the
//    bars are difftx::testing::tolerance.
//  - Dual numbers: the forward's tangent J·dx (and J·dθ) must agree with the
//    backward's Jᵀ·dy: <dy, J·dx + J_θ·dθ> = <Jᵀdy, dx> + <∇θ, dθ>.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include <difftx/difftx.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/compare_modules.hpp"
#include "support/dual.hpp"

using namespace difftx;
using testing::normwise_difference;

namespace {

template <class T, class Make>
void check_type(const char* module, Make make, const shape_t<3>& shape) {
  auto oracle = make.template operator()<long double>();
  auto candidate = make.template operator()<T>();
  const auto e = test_support::compare_modules(candidate, oracle, shape, 42);
  // long double meets itself here (error 0); its own check is the gradcheck.
  const double fwd_bar = testing::tolerance<T>::forward, bwd_bar = testing::tolerance<T>::backward;
  MESSAGE(std::string(module) << " " << scalar_traits<T>::name << ": forward " << e.forward / scalar_traits<T>::epsilon
                 << " u, backward " << e.backward / scalar_traits<T>::epsilon << " u (worst " << e.worst_backward
                 << "); bars " << fwd_bar / scalar_traits<T>::epsilon << " u, " << bwd_bar / scalar_traits<T>::epsilon
                 << " u");
  INFO(module << " in " << scalar_traits<T>::name << ", worst gradient " << e.worst_backward);
  CHECK(e.forward <= fwd_bar);
  CHECK(e.backward <= bwd_bar);
}

template <class Make>
void check_all_types(const char* module, Make make, const shape_t<3>& shape) {
  check_type<float>(module, make, shape);
  check_type<double>(module, make, shape);
  check_type<long double>(module, make, shape);
  check_type<Eigen::half>(module, make, shape);
  check_type<Eigen::bfloat16>(module, make, shape);
}

}  // namespace

TEST_CASE("number types: RMSNorm") {
  check_all_types("RMSNorm", []<class U>() { return RMSNorm<U>(16); }, {2, 7, 16});
}

TEST_CASE("number types: SwiGLU") {
  check_all_types("SwiGLU", []<class U>() { return SwiGLU<U>(16, 40); }, {2, 7, 16});
}

TEST_CASE("number types: MultiHead") {
  check_all_types("MultiHead",
                  []<class U>() { return MultiHead<U, 8>({.d_model = 32, .heads = 4, .kv_heads = 2, .layer_index = 3}); },
                  {2, 9, 32});
}

TEST_CASE("number types: Attention") {
  check_all_types("Attention", []<class U>() { return Attention<U, 8>({.d_model = 32, .heads = 4, .kv_heads = 2}); },
                  {2, 9, 32});
}

TEST_CASE("number types: DecoderLayer") {
  check_all_types(
      "DecoderLayer",
      []<class U>() { return DecoderLayer<U, 8>({{.d_model = 32, .heads = 2, .kv_heads = 1, .layer_index = 1}, 64}); },
      {2, 9, 32});
}

namespace {

// <dy, J·dx + J_θ·dθ> from one forward in dual numbers, and <Jᵀdy, dx> + <∇θ, dθ>
// from one backward in double, for random dx, dθ and dy.
template <template <class> class Make>
void check_dual(const char* module, const shape_t<3>& shape) {
  using dual_test::Dual;
  auto dual = Make<Dual>::make();
  auto real = Make<double>::make();
  test_support::randomise_parameters(real, 7);
  difftx::random_stream rng(8);
  auto dual_params = dual.parameters();
  auto real_params = real.parameters();
  long double predicted = 0;  // <∇θ, dθ> + <Jᵀdy, dx>, filled after the backward
  std::vector<std::vector<double>> tangents;
  for (std::size_t i = 0; i < dual_params.size(); ++i) {
    tangents.emplace_back();
    for (index_t e = 0; e < dual_params[i].size(); ++e) {
      tangents.back().push_back(rng.normal());
      dual_params[i].value[e] = Dual(real_params[i].value[e], tangents.back().back());
    }
  }
  auto x = test_support::random_tensor<double, 3>(shape, 9);
  auto dy = test_support::random_tensor<double, 3>(shape, 10);
  auto x_tangent = test_support::random_tensor<double, 3>(shape, 11);
  Tensor<Dual, 3> x_dual(shape), y_dual(shape), dy_dual(shape), dx_dual(shape);
  for (index_t i = 0; i < x.size(); ++i) {
    x_dual.data()[i] = Dual(x.data()[i], x_tangent.data()[i]);
    dy_dual.data()[i] = Dual(dy.data()[i]);
  }

  typename decltype(dual)::saved_type dual_saved;
  dual.forward(x_dual.view(), y_dual.view(), dual_saved);
  long double directional = 0;  // <dy, J·dx + J_θ·dθ>
  for (index_t i = 0; i < y_dual.size(); ++i) directional += static_cast<long double>(dy.data()[i]) * y_dual.data()[i].tangent;

  Tensor<double, 3> y(shape), dx(shape);
  typename decltype(real)::saved_type saved;
  zero_grad(real);
  real.forward(x.view(), y.view(), saved);
  real.backward(x.view(), dy.view(), saved, dx.view());
  for (index_t i = 0; i < dx.size(); ++i) predicted += static_cast<long double>(dx.data()[i]) * x_tangent.data()[i];
  for (std::size_t i = 0; i < real_params.size(); ++i)
    for (index_t e = 0; e < real_params[i].size(); ++e)
      predicted += static_cast<long double>(real_params[i].grad[e]) * tangents[i][static_cast<std::size_t>(e)];

  const double relative = static_cast<double>(std::abs(directional - predicted) / std::abs(predicted));
  MESSAGE(std::string(module) << ": <dy, J·d> = " << static_cast<double>(directional) << ", <Jᵀdy, d> = "
                 << static_cast<double>(predicted) << ", relative difference " << relative);
  CHECK(relative < 1e-12);  // both sides are exact up to double rounding of O(10^3) terms

  // The backward also runs in Dual; its value parts are the double backward's
  // (the same operations; only a compiler's choice to fuse multiply-adds differs).
  zero_grad(dual);
  dual.backward(x_dual.view(), dy_dual.view(), dual_saved, dx_dual.view());
  std::vector<double> dual_values(static_cast<std::size_t>(dx.size()));
  for (index_t i = 0; i < dx.size(); ++i) dual_values[static_cast<std::size_t>(i)] = dx_dual.data()[i].value;
  double worst = normwise_difference(dual_values.data(), dx.data(), dx.size());
  for (std::size_t i = 0; i < real_params.size(); ++i) {
    dual_values.resize(static_cast<std::size_t>(real_params[i].size()));
    for (index_t e = 0; e < real_params[i].size(); ++e) dual_values[static_cast<std::size_t>(e)] = dual_params[i].grad[e].value;
    worst = std::max(worst, normwise_difference(dual_values.data(), real_params[i].grad, real_params[i].size()));
  }
  CHECK(worst < 1e-14);
}

template <class U>
struct make_decoder_layer {
  static DecoderLayer<U, 4> make() { return DecoderLayer<U, 4>({{.d_model = 16, .heads = 4, .kv_heads = 2, .layer_index = 2}, 24}); }
};
template <class U>
struct make_attention {
  static Attention<U, 4> make() { return Attention<U, 4>({.d_model = 16, .heads = 4, .kv_heads = 2, .causal = false}); }
};

}  // namespace

TEST_CASE("number types: a dual number type defined only in this test") {
  check_dual<make_decoder_layer>("DecoderLayer<Dual>", {2, 5, 16});
  check_dual<make_attention>("Attention<Dual>", {2, 5, 16});
}
