// The modules instantiated with float, double, long double, Eigen::half,
// Eigen::bfloat16 and a dual number type defined only here.
//  - Each type against the same module in long double, on inputs and weights
//    exactly representable in the type; the bars are difftx::testing::tolerance.
//  - Dual numbers: the forward's tangent J·dx (and J·dθ) must agree with the
//    backward's Jᵀ·dy: <dy, J·dx + J_θ·dθ> = <Jᵀdy, dx> + <∇θ, dθ>.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include <difftx/difftx.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/dual.hpp"
#include "support/helpers.hpp"

using namespace difftx;
using test_support::normwise_difference;

namespace {

struct errors {
  double forward = 0, backward = 0;
  std::string worst_backward;
};

// Rounds a value to T and back, so the long double reference sees exactly what T holds.
template <class T>
long double through(long double v) {
  return static_cast<long double>(scalar_traits<T>::to_double(scalar_traits<T>::from_double(static_cast<double>(v))));
}

template <class T, class Make>
errors compare_with_long_double(Make make, const shape_t<3>& shape, std::uint64_t seed) {
  auto ref = make.template operator()<long double>();
  auto mod = make.template operator()<T>();
  test_support::randomise_parameters(ref, seed);
  for (auto& p : ref.parameters())
    for (index_t i = 0; i < p.size(); ++i) p.value[i] = through<T>(p.value[i]);
  test_support::copy_parameters(mod, ref);

  auto x_ref = test_support::random_tensor<long double, 3>(shape, seed + 1);
  auto dy_ref = test_support::random_tensor<long double, 3>(mod.output_shape(shape), seed + 2);
  for (auto* t : {&x_ref, &dy_ref})
    for (index_t i = 0; i < t->size(); ++i) t->data()[i] = through<T>(t->data()[i]);
  const auto x = test_support::convert<T>(x_ref), dy = test_support::convert<T>(dy_ref);

  auto run = [](auto& module, const auto& input, const auto& grad_out) {
    using U = typename std::remove_reference_t<decltype(module)>::value_type;
    Tensor<U, 3> y(grad_out.shape()), dx(input.shape());
    typename std::remove_reference_t<decltype(module)>::saved_type saved;
    zero_grad(module);
    module.forward(input.view(), y.view(), saved);
    module.backward(input.view(), grad_out.view(), saved, dx.view());
    return std::pair{std::move(y), std::move(dx)};
  };
  const auto [y_ref, dx_ref] = run(ref, x_ref, dy_ref);
  const auto [y, dx] = run(mod, x, dy);

  errors e;
  e.forward = normwise_difference(y.data(), y_ref.data(), y.size());
  e.backward = normwise_difference(dx.data(), dx_ref.data(), dx.size());
  e.worst_backward = "input";
  auto grads = mod.parameters();
  auto grads_ref = ref.parameters();
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const double d = normwise_difference(grads[i].grad, grads_ref[i].grad, grads[i].size());
    if (d > e.backward) {
      e.backward = d;
      e.worst_backward = grads[i].name;
    }
  }
  return e;
}

template <class T, class Make>
void check_type(const char* module, Make make, const shape_t<3>& shape) {
  const auto e = compare_with_long_double<T>(make, shape, 42);
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
