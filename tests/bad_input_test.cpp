// Bad input: every public entry throws difftx::input_error naming the entry,
// the argument, what it expected and what it got, and writes nothing: outputs,
// gradient buffers, saved state and parameters keep their values.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>

#include "support/helpers.hpp"

using namespace difftx;
using test_support::expect_input_error;

namespace {

// A snapshot of every value a call may touch, to prove it touched none.
template <class Module>
std::vector<double> parameters_and_grads(Module& m) {
  std::vector<double> all;
  for (const auto& p : m.parameters())
    for (index_t i = 0; i < p.size(); ++i) {
      all.push_back(p.value[i]);
      all.push_back(p.grad[i]);
    }
  return all;
}
template <class T, std::size_t R>
std::vector<double> values(const Tensor<T, R>& t) {
  return std::vector<double>(t.data(), t.data() + t.size());
}
template <class T, std::size_t R>
Tensor<T, R> filled(const shape_t<R>& shape, double value) {
  Tensor<T, R> t(shape);
  fill_constant(t.view(), value);
  return t;
}

}  // namespace

TEST_CASE("bad configurations are rejected by every constructor") {
  expect_input_error([] { MultiHead<float, 4>({.d_model = 16, .heads = 4, .kv_heads = 3}); }, "MultiHead",
                     "config.kv_heads", "dividing heads = 4", "3");
  expect_input_error([] { DiffAttn<float, 4>({.heads = 6, .kv_heads = 4}); }, "DiffAttn", "config.kv_heads",
                     "dividing heads = 6", "4");
  expect_input_error([] { Attention<float, 4>({.d_model = 16, .heads = 2, .kv_heads = 4}); }, "Attention",
                     "config.kv_heads", "dividing heads = 2", "4");
  expect_input_error([] { DecoderLayer<float, 4>({{.d_model = 16, .heads = 3, .kv_heads = 2}}); }, "MultiHead",
                     "config.kv_heads", "dividing heads = 3", "2");
  expect_input_error([] { MultiHead<float, 4>({.d_model = 16, .heads = 0}); }, "MultiHead", "config.heads", ">= 1",
                     "0");
  expect_input_error([] { MultiHead<float, 4>({.d_model = 0, .heads = 2}); }, "MultiHead", "config.d_model", ">= 1",
                     "0");
  expect_input_error([] { MultiHead<float, 4>({.d_model = 8, .heads = 2, .layer_index = -1}); }, "MultiHead",
                     "config.layer_index", ">= 0", "-1");
  expect_input_error([] { MultiHead<float, 4>({.d_model = 8, .heads = 2, .rope_theta = 0}); }, "MultiHead",
                     "config.rope_theta", "theta > 0", "0");
  // V2: g divides the 2h query heads (it need not divide h); with the switch off, the h heads.
  expect_input_error([] { MultiHeadV2<float, 4>({.d_model = 16, .heads = 3, .kv_heads = 4}); }, "MultiHeadV2",
                     "config.kv_heads", "dividing the 6 query heads", "4");
  expect_input_error([] { MultiHeadV2<float, 4>({.d_model = 16, .heads = 3, .kv_heads = 2, .differential = false}); },
                     "MultiHeadV2", "config.kv_heads", "dividing the 3 query heads", "2");
  expect_input_error([] { MultiHeadV2<float, 4>({.d_model = 16, .heads = 0}); }, "MultiHeadV2", "config.heads", ">= 1",
                     "0");
  expect_input_error([] { MultiHeadV2<float, dynamic>({.d_model = 16, .heads = 2, .head_dim = 5}); }, "MultiHeadV2",
                     "config.head_dim", "positive even head size", "5");
  expect_input_error([] { DecoderLayerV2<float, 4>({{.d_model = 16, .heads = 2, .head_dim = 8}}); }, "MultiHeadV2",
                     "config.head_dim", "compiled head size D = 4", "8");
  expect_input_error([] { RMSNorm<float>(0); }, "RMSNorm", "dim", "positive", "0");
  expect_input_error([] { RMSNorm<float>(8, -1.0); }, "RMSNorm", "eps", "eps > 0", "-1");
  expect_input_error([] { Linear<float>(0, 4); }, "Linear", "in_features", "positive", "0");
  expect_input_error([] { SwiGLU<float>(8, -2); }, "Linear", "out_features", "positive", "-2");
}

TEST_CASE("forward and backward reject wrong shapes, empty tensors and stale saved state, writing nothing") {
  DecoderLayer<double, 4> layer({{.d_model = 16, .heads = 2, .kv_heads = 1}, 24});
  test_support::randomise_parameters(layer, 1);
  const auto before = parameters_and_grads(layer);
  auto x = test_support::random_tensor<double, 3>({2, 5, 16}, 2);
  auto out = filled<double, 3>({2, 5, 16}, 7.0);
  DecoderLayer<double, 4>::saved_type saved;

  expect_input_error([&] { layer.forward(x.view().reshape<3>({2, 10, 8}), out.view().reshape<3>({2, 10, 8}), saved); },
                     "DecoderLayer::forward", "x", "[B, N, 16]", "[2, 10, 8]");
  Tensor<double, 3> empty({2, 0, 16});
  expect_input_error([&] { layer.forward(empty.view(), empty.view(), saved); }, "DecoderLayer::forward", "x",
                     "non-empty", "[2, 0, 16]");
  auto small_out = filled<double, 3>({2, 4, 16}, 7.0);
  expect_input_error([&] { layer.forward(x.view(), small_out.view(), saved); }, "DecoderLayer::forward", "out",
                     "[2, 5, 16]", "[2, 4, 16]");
  CHECK(values(out) == values(filled<double, 3>({2, 5, 16}, 7.0)));
  CHECK(values(small_out) == values(filled<double, 3>({2, 4, 16}, 7.0)));

  // Backward before any forward, and with the saved state of another shape.
  auto dy = test_support::random_tensor<double, 3>({2, 5, 16}, 3);
  auto dx = filled<double, 3>({2, 5, 16}, 7.0);
  expect_input_error([&] { layer.backward(x.view(), dy.view(), saved, dx.view()); }, "DecoderLayer::backward", "saved",
                     "[2, 5, 16]", "no forward");
  layer.forward(x.view(), out.view(), saved);
  auto x_other = test_support::random_tensor<double, 3>({1, 5, 16}, 4);
  auto dx_other = filled<double, 3>({1, 5, 16}, 7.0);
  expect_input_error([&] { layer.backward(x_other.view(), x_other.view(), saved, dx_other.view()); },
                     "DecoderLayer::backward", "saved", "[1, 5, 16]", "[2, 5, 16]");
  // A mismatched gradient buffer, and a mismatched dout.
  auto dx_wrong = filled<double, 3>({2, 5, 15}, 7.0);
  expect_input_error([&] { layer.backward(x.view(), dy.view(), saved, dx_wrong.view()); }, "DecoderLayer::backward",
                     "dx", "[2, 5, 16]", "[2, 5, 15]");
  auto dy_wrong = test_support::random_tensor<double, 3>({2, 6, 16}, 5);
  expect_input_error([&] { layer.backward(x.view(), dy_wrong.view(), saved, dx.view()); }, "DecoderLayer::backward",
                     "dout", "[2, 5, 16]", "[2, 6, 16]");
  CHECK(values(dx) == values(filled<double, 3>({2, 5, 16}, 7.0)));
  CHECK(values(dx_wrong) == values(filled<double, 3>({2, 5, 15}, 7.0)));
  CHECK(values(dx_other) == values(filled<double, 3>({1, 5, 16}, 7.0)));
  CHECK(parameters_and_grads(layer) == before);
}

TEST_CASE("every module names itself in its errors") {
  auto x = test_support::random_tensor<double, 3>({1, 3, 8}, 1);
  auto out = filled<double, 3>({1, 3, 6}, 1.0);
  {
    MultiHead<double, 2> m({.d_model = 6, .heads = 2});
    typename MultiHead<double, 2>::saved_type s;
    expect_input_error([&] { m.forward(x.view(), out.view(), s); }, "MultiHead::forward", "x", "[B, N, 6]", "[1, 3, 8]");
  }
  {
    Attention<double, 2> m({.d_model = 6, .heads = 2});
    typename Attention<double, 2>::saved_type s;
    expect_input_error([&] { m.forward(x.view(), out.view(), s); }, "Attention::forward", "x", "[B, N, 6]", "[1, 3, 8]");
  }
  {
    MultiHeadV2<double, 2> m({.d_model = 6, .heads = 2});
    typename MultiHeadV2<double, 2>::saved_type s;
    expect_input_error([&] { m.forward(x.view(), out.view(), s); }, "MultiHeadV2::forward", "x", "[B, N, 6]",
                       "[1, 3, 8]");
    auto x6 = test_support::random_tensor<double, 3>({1, 3, 6}, 2);
    auto dx = filled<double, 3>({1, 3, 6}, 1.0);
    expect_input_error([&] { m.backward(x6.view(), x6.view(), s, dx.view()); }, "MultiHeadV2::backward", "saved",
                       "[1, 3, 6]", "no forward");
    CHECK(values(dx) == values(filled<double, 3>({1, 3, 6}, 1.0)));
  }
  {
    SwiGLU<double> m(6, 8);
    typename SwiGLU<double>::saved_type s;
    expect_input_error([&] { m.forward(x.view(), out.view(), s); }, "SwiGLU::forward", "x", "[B, N, 6]", "[1, 3, 8]");
  }
  {
    RMSNorm<double> m(6);
    typename RMSNorm<double>::saved_type s;
    expect_input_error([&] { m.forward(x.view(), out.view(), s); }, "RMSNorm::forward", "x", "[B, N, 6]", "[1, 3, 8]");
  }
  {
    Linear<double> m(6, 6);
    typename Linear<double>::saved_type s;
    expect_input_error([&] { m.forward(x.view(), out.view(), s); }, "Linear::forward", "x", "[B, N, 6]", "[1, 3, 8]");
  }
  {
    DiffAttn<double, 4> m({.heads = 4, .kv_heads = 2});
    auto q = test_support::random_tensor<double, 5>({1, 3, 4, 2, 4}, 1);
    auto k = test_support::random_tensor<double, 5>({1, 3, 4, 2, 4}, 2);  // 4 groups, not 2
    auto v = test_support::random_tensor<double, 4>({1, 3, 2, 8}, 3);
    auto o = filled<double, 4>({1, 3, 4, 8}, 1.0);
    typename DiffAttn<double, 4>::saved_type s;
    expect_input_error([&] { m.forward(q.view(), k.view(), v.view(), o.view(), s); }, "DiffAttn::forward", "k",
                       "[1, 3, 2, 2, 4]", "[1, 3, 4, 2, 4]");
    CHECK(values(o) == values(filled<double, 4>({1, 3, 4, 8}, 1.0)));
  }
}

TEST_CASE("ops check their own arguments") {
  // RoPE needs an even vector size; the ops take it at run time.
  Tensor<double, 4> odd({1, 2, 1, 3});
  expect_input_error([&] { rope_forward(policy::reference{}, odd.view(), 0, 10000.0); }, "rope_forward", "x",
                     "even vector size", "d = 3");
  Tensor<double, 4> pairs({1, 2, 1, 4});
  expect_input_error([&] { rope_forward(policy::reference{}, pairs.view(), -1, 10000.0); }, "rope_forward", "offset",
                     ">= 0", "-1");
  expect_input_error(
      [&] { rope_forward(policy::reference{}, pairs.view(), 0, 10000.0, {.type = rope_type::linear, .factor = 0.0}); },
      "rope_forward", "scaling.factor", "scaling factor > 0", "0");
  expect_input_error(
      [&] {
        MultiHead<double, 2>({.d_model = 8, .heads = 2, .rope_scaling = {.type = rope_type::linear, .factor = -1.0}});
      },
      "MultiHead", "config.rope_scaling.factor", "> 0", "-1");
  expect_input_error(
      [&] { rope_forward(policy::reference{}, pairs.view(), 0, 10000.0, {.type = rope_type::standard, .factor = 2.0}); },
      "rope_forward", "scaling.factor", "use rope_type::linear", "2");
  expect_input_error(
      [&] {
        MultiHead<double, 2>({.d_model = 8,
                              .heads = 2,
                              .rope_scaling = {.type = rope_type::llama3, .factor = 8.0, .low_freq_factor = 2.0,
                                               .high_freq_factor = 1.0, .original_max_positions = 64.0}});
      },
      "MultiHead", "config.rope_scaling.high_freq_factor", "> low_freq_factor (2.0", "1");
  expect_input_error([&] { MultiHead<double, 2>({.d_model = 8, .heads = 2, .subln_eps = 0.0}); }, "MultiHead",
                     "config.subln_eps", "eps > 0", "0");
  Tensor<double, 2> x({3, 4}), w({5, 6}), y({3, 5});
  expect_input_error([&] { linear_forward(policy::reference{}, x.view(), w.view(), y.view()); }, "linear_forward", "w",
                     "[N, 4]", "[5, 6]");
  // Each op's check names the first tensor outside its policy's memory.
  Tensor<double, 2> w_fits({5, 4});
  const TensorView<double, 2> y_elsewhere(y.data(), y.shape(), memory_space::device);
  expect_input_error([&] { linear_forward(policy::reference{}, x.view(), w_fits.view(), y_elsewhere); }, "linear_forward",
                     "y", "host memory", "device memory");
  // Attention: the group count must divide the head count.
  Tensor<double, 5> q({1, 2, 3, 1, 4}), k({1, 2, 2, 1, 4});
  Tensor<double, 4> v({1, 2, 2, 4}), o({1, 2, 3, 4}), none;
  Tensor<double, 4> lse({1, 3, 1, 2});
  expect_input_error(
      [&] {
        attention_forward<1>(policy::reference{}, q.view(), k.view(), v.view(), cview<double, 1>{}, true, o.view(),
                             TensorView<double, 4>{}, lse.view());
      },
      "attention_forward", "k", "dividing the head count H = 3", "G = 2");
  // Causal attention needs at least as many keys as queries (the queries are
  // the last N positions); lambda is [1] or [H] and dlambda takes its shape.
  // Nothing is written: o, o2 and the gradients keep their fill.
  {
    const auto q2 = filled<double, 5>({1, 4, 2, 2, 4}, 0.5), k_short = filled<double, 5>({1, 3, 1, 2, 4}, 0.5);
    const auto k_long = filled<double, 5>({1, 6, 1, 2, 4}, 0.5);
    const auto v_short = filled<double, 4>({1, 3, 1, 6}, 0.5), v_long = filled<double, 4>({1, 6, 1, 6}, 0.5);
    const auto d_o = filled<double, 4>({1, 4, 2, 6}, 0.5);
    auto o_diff = filled<double, 4>({1, 4, 2, 6}, 7.0), o2_diff = filled<double, 4>({1, 4, 2, 6}, 7.0);
    auto lse2 = filled<double, 4>({1, 2, 2, 4}, 7.0);
    const auto lambda_three = filled<double, 1>({3}, 0.2), lambda_heads = filled<double, 1>({2}, 0.2);
    expect_input_error(
        [&] {
          attention_forward<2>(policy::simd{}, q2.view(), k_short.view(), v_short.view(), lambda_heads.view(), true,
                               o_diff.view(), o2_diff.view(), lse2.view());
        },
        "attention_forward", "k", "at least N = 4 keys for causal attention", "M = 3");
    expect_input_error(
        [&] {
          attention_forward<2>(policy::reference{}, q2.view(), k_long.view(), v_long.view(), lambda_three.view(), true,
                               o_diff.view(), o2_diff.view(), lse2.view());
        },
        "attention_forward", "lambda", "shape [1] or [H] = [2]", "[3]");
    CHECK(values(o_diff) == values(filled<double, 4>({1, 4, 2, 6}, 7.0)));
    CHECK(values(lse2) == values(filled<double, 4>({1, 2, 2, 4}, 7.0)));
    attention_forward<2>(policy::simd{}, q2.view(), k_long.view(), v_long.view(), lambda_heads.view(), true,
                         o_diff.view(), o2_diff.view(), lse2.view());
    auto dq = filled<double, 5>(q2.shape(), 7.0), dk = filled<double, 5>(k_long.shape(), 7.0);
    auto dv = filled<double, 4>(v_long.shape(), 7.0);
    auto dlambda_one = filled<double, 1>({1}, 7.0);
    expect_input_error(
        [&] {
          attention_backward<2>(policy::simd{}, q2.view(), k_long.view(), v_long.view(), lambda_heads.view(), true,
                                o_diff.view(), o2_diff.view(), lse2.view(), d_o.view(), dq.view(), dk.view(), dv.view(),
                                dlambda_one.view());
        },
        "attention_backward", "dlambda", "shape [2]", "[1]");
    CHECK(values(dq) == values(filled<double, 5>(q2.shape(), 7.0)));
    CHECK(values(dlambda_one) == std::vector<double>{7.0});
  }
  // V2's head combination pairs query heads: their count must be even, z and o must match it.
  Tensor<double, 3> a_odd({2, 3, 4}), a({2, 4, 4}), o2({2, 2, 4});
  Tensor<double, 2> z({2, 2}), z_wrong({2, 3});
  expect_input_error([&] { diff_heads_forward(policy::reference{}, a_odd.view(), z.view(), o2.view()); },
                     "diff_heads_forward", "a", "even number of query heads", "3 heads");
  expect_input_error([&] { diff_heads_forward(policy::simd{}, a.view(), z_wrong.view(), o2.view()); },
                     "diff_heads_forward", "z", "[2, 2]", "[2, 3]");
  Tensor<double, 3> da({2, 4, 3});
  expect_input_error([&] { diff_heads_backward(policy::simd{}, a.view(), z.view(), o2.view(), da.view(), z.view()); },
                     "diff_heads_backward", "da", "[2, 4, 4]", "[2, 4, 3]");
}

TEST_CASE("gradcheck rejects bad options") {
  std::vector<double> z{1.0}, g{0.0};
  testing::gradcheck_options options;
  options.tolerance = 0;
  expect_input_error(
      [&] { testing::gradcheck<double>({{"z", {1}, z.data(), g.data()}}, [] { return 0.0L; }, [] {}, options); },
      "gradcheck", "options.tolerance", "> 0", "0");
}

// Non-finite values: the kernels avoid overflow where the math allows, and
// first_non_finite names where a forward went non-finite where it does not.
TEST_CASE("overflow: lambda's equal exponentials cancel, RMSNorm rescales, first_non_finite names the rest") {
  auto run = []<class Policy>(Policy) {
    MultiHead<float, 4, Policy> attn({.d_model = 16, .heads = 2});
    random_stream rng(3);
    Tensor<float, 3> x({1, 5, 16}), y({1, 5, 16});
    fill_normal(x.view(), rng);
    for (const auto& p : attn.parameters())
      if (p.name.rfind("lambda_", 0) == 0) std::fill_n(p.value, p.size(), 30.0f);  // exp(30·30·4) overflows float
    typename MultiHead<float, 4, Policy>::saved_type saved;
    attn.forward(x.view(), y.view(), saved);
    CHECK_FALSE(first_non_finite(saved));
    CHECK(saved.attn.lambda(0) == doctest::Approx(attn.lambda_init()));  // exactly the difference 0, plus lambda_init
    x(0, 2, 3) = 1e30f;  // the scores (~1e58) overflow float32
    attn.forward(x.view(), y.view(), saved);
    const auto began = first_non_finite(saved);
    REQUIRE(began);
    CHECK(began->tensor == "attn.lse");
    CHECK(began->describe().find("log-sum-exp of the attention scores") != std::string::npos);

    RMSNorm<float, Policy> norm(4);
    Tensor<float, 3> big({1, 1, 4}), normed({1, 1, 4});
    for (index_t c = 0; c < 4; ++c) big(0, 0, c) = 1e20f * static_cast<float>(c + 1);  // the sum of squares overflows
    typename RMSNorm<float, Policy>::saved_type norm_saved;
    norm.forward(big.view(), normed.view(), norm_saved);
    const double rms = std::sqrt((1.0 + 4 + 9 + 16) / 4);
    for (index_t c = 0; c < 4; ++c) CHECK(normed(0, 0, c) == doctest::Approx((c + 1) / rms).epsilon(1e-6));
  };
  run(policy::reference{});
  run(policy::simd{});
}
