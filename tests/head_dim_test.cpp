// The run-time head size, difftx::dynamic: every attention module with D taken
// from its config must give the same numbers as the compiled D, bit for bit
// (both run the same kernels on the same shapes; a single thread keeps the
// simd sums in one order), must pass the gradient check at head sizes no
// policy compiles, and must reject a head size that is not positive and even.
// (The PyTorch fixture at D = 6 is in fixtures_test and cli_test.)
#include <doctest/doctest.h>

#include <string>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/compare_modules.hpp"

using namespace difftx;

namespace {

// policy::simd on one thread (its backward sums per-thread partials, whose
// order follows the schedule); the reference has no threads.
template <class Policy>
Policy single_threaded() {
  Policy p{};
  if constexpr (requires { p.threads; }) p.threads = 1;
  return p;
}

// make<U, D>(): the module on number type U with head size template argument D.
template <class Policy, class Make>
void check_identical(const std::string& label, Make make, const shape_t<3>& shape) {
  auto compiled = make.template operator()<float, 8>(single_threaded<Policy>());
  auto runtime = make.template operator()<float, dynamic>(single_threaded<Policy>());
  CHECK(runtime.head_dim() == compiled.head_dim());
  const auto e = test_support::compare_modules(runtime, compiled, shape, 11);
  INFO(label << " on " << Policy::name << ": forward " << e.forward << ", backward " << e.backward << " ("
             << e.worst_backward << ")");
  CHECK(e.forward == 0.0);
  CHECK(e.backward == 0.0);
}

template <class Make>
void check_identical_on_both_policies(const std::string& label, Make make, const shape_t<3>& shape) {
  check_identical<policy::reference>(label, make, shape);
  check_identical<policy::simd>(label, make, shape);
}

}  // namespace

TEST_CASE("dynamic D: bit-identical to the compiled D, forward and every gradient, reference and simd") {
  check_identical_on_both_policies(
      "MultiHead",
      []<class U, index_t D, class P>(P p) {
        return MultiHead<U, D, P>({.d_model = 24, .heads = 4, .kv_heads = 2, .layer_index = 2, .head_dim = 8}, p);
      },
      {2, 70, 24});
  check_identical_on_both_policies(
      "Attention",
      []<class U, index_t D, class P>(P p) {
        return Attention<U, D, P>({.d_model = 24, .heads = 4, .kv_heads = 2, .causal = false, .head_dim = 8}, p);
      },
      {1, 9, 24});
  check_identical_on_both_policies(
      "DecoderLayer",
      []<class U, index_t D, class P>(P p) {
        return DecoderLayer<U, D, P>({{.d_model = 16, .heads = 2, .kv_heads = 1, .layer_index = 1, .head_dim = 8}, 40}, p);
      },
      {2, 5, 16});
}

TEST_CASE("dynamic D: gradient check at head sizes no policy compiles (6, 10; 2 for the smallest)") {
  auto check = [](auto& module, const shape_t<3>& shape, const std::string& label) {
    test_support::randomise_parameters(module, 5);
    const auto x = test_support::random_tensor<double, 3>(shape, 6);
    const auto result = testing::gradcheck(module, x.view());
    INFO(label << "\n" << result.report());
    CHECK(result.passed());
  };
  DecoderLayer<double, dynamic> layer({{.d_model = 12, .heads = 2, .kv_heads = 1, .layer_index = 3, .head_dim = 6}, 20});
  CHECK(layer.head_dim() == 6);
  check(layer, {2, 5, 12}, "DecoderLayer D=6");
  Attention<double, dynamic> baseline({.d_model = 12, .heads = 2, .kv_heads = 1, .head_dim = 10});
  check(baseline, {1, 6, 12}, "Attention D=10");
  MultiHead<double, dynamic> smallest({.d_model = 8, .heads = 3, .head_dim = 2});
  check(smallest, {1, 4, 8}, "MultiHead D=2");
}

TEST_CASE("dynamic D: simd at D = 6 and 40 stays within tolerance of the reference in long double") {
  for (index_t D : {6, 40}) {
    auto make = [D]<class U, class P>() {
      return MultiHead<U, dynamic, P>({.d_model = 32, .heads = 2, .kv_heads = 1, .head_dim = D}, P{});
    };
    auto oracle = make.template operator()<long double, policy::reference>();
    auto candidate = make.template operator()<float, policy::simd>();
    const auto e = test_support::compare_modules(candidate, oracle, {2, 67, 32}, 9);
    INFO("D = " << D << ": forward " << e.forward << ", backward " << e.backward);
    CHECK(e.forward <= testing::tolerance<float>::forward);
    CHECK(e.backward <= testing::tolerance<float>::backward);
  }
}

TEST_CASE("dynamic D: a head size that is not positive and even is refused; a compiled D accepts only itself") {
  for (index_t bad : {0, -2, 5}) {
    CAPTURE(bad);
    test_support::expect_input_error(
        [bad] { MultiHead<float, dynamic>({.d_model = 8, .heads = 2, .head_dim = bad}); }, "MultiHead",
        "config.head_dim", "positive even head size", std::to_string(bad));
    test_support::expect_input_error(
        [bad] { Attention<float, dynamic>({.d_model = 8, .heads = 2, .head_dim = bad}); }, "Attention",
        "config.head_dim", "positive even head size", std::to_string(bad));
    test_support::expect_input_error([bad] { DiffAttn<float, dynamic>({.heads = 2, .head_dim = bad}); }, "DiffAttn",
                                     "config.head_dim", "positive even head size", std::to_string(bad));
  }
  test_support::expect_input_error([] { MultiHead<float, 4>({.d_model = 8, .heads = 2, .head_dim = 8}); }, "MultiHead",
                                   "config.head_dim", "0 or the compiled head size D = 4", "8");
  MultiHead<float, 4> explicit_same({.d_model = 8, .heads = 2, .head_dim = 4});
  MultiHead<float, 4> implied({.d_model = 8, .heads = 2});
  CHECK(explicit_same.head_dim() == 4);
  CHECK(implied.config().head_dim == 4);  // filled in, so a saved config says what ran
}
