// Low-bit inference (docs/semantics.md, "Low-bit inference"), part of simd_test:
//  - attention-logit quantization (the paper's §3.7): b = 16 is the unquantized
//    output bit for bit; policy::simd against the reference's quantized
//    arithmetic on logits both compute exactly; the reference against the
//    unquantized float64 result within the bound the rounding implies; the
//    decode kernel's rows spanning several key blocks; bad bit counts refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/compare_modules.hpp"
#include "support/helpers.hpp"

using namespace difftx;

namespace {

// Attention inputs whose logits every implementation computes exactly: q and k
// are multiples of 1/4 in [-2, 2] and d = 16, so every product q·k is a
// multiple of 1/16 below 64 and 1/sqrt(d) = 1/4; float and double represent
// every partial sum. Quantization then sees the same logits in every kernel,
// and two kernels of one accumulation type round them identically (a logit
// one rounding apart could land on the other side of a rounding boundary and
// move by a whole step). v is Gaussian.
struct attention_inputs {
  Tensor<double, 5> q, k;
  Tensor<double, 4> v;
  attention_inputs(index_t maps, index_t B, index_t N, index_t S, index_t H, index_t G, std::uint64_t seed)
      : q({B, N, H, maps, 16}), k({B, S, G, maps, 16}), v(test_support::random_tensor<double, 4>({B, S, G, 16}, seed)) {
    random_stream rng(seed + 1);
    for (auto* t : {&q, &k})
      for (index_t e = 0; e < t->size(); ++e) t->data()[e] = std::round(rng.uniform(-8.5, 8.5)) / 4;
  }
};

template <class T, int Maps, class P>
Tensor<T, 4> forward(const P& policy, const attention_inputs& in, bool causal, int bits) {
  const auto q = test_support::convert<T>(in.q), k = test_support::convert<T>(in.k);
  const auto v = test_support::convert<T>(in.v);
  const index_t B = q.extent(0), N = q.extent(1), H = q.extent(2);
  Tensor<T, 4> o({B, N, H, v.extent(3)}), o2(Maps == 2 ? shape_t<4>{B, N, H, v.extent(3)} : shape_t<4>{});
  Tensor<accum_t<T>, 4> lse({B, H, Maps, N});
  Tensor<accum_t<T>, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{});
  if (Maps == 2) lambda(0) = accum_t<T>(0.375);
  attention_forward<Maps>(policy, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), causal,
                          o.view(), o2.view(), lse.view(), bits);
  return o;
}

template <class T, int Maps, class P>
Tensor<T, 4> decode(const P& policy, const attention_inputs& in, const std::vector<index_t>& lengths, int bits) {
  const auto q = test_support::convert<T>(in.q), k = test_support::convert<T>(in.k);
  const auto v = test_support::convert<T>(in.v);
  Tensor<T, 4> o({q.extent(0), q.extent(1), q.extent(2), v.extent(3)});
  Tensor<accum_t<T>, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{});
  if (Maps == 2) lambda(0) = accum_t<T>(0.375);
  attention_decode<Maps>(policy, q.const_view(), k.const_view(), v.const_view(), lengths, lambda.const_view(), o.view(),
                         bits);
  return o;
}

template <class T>
double difference(const Tensor<T, 4>& a, const Tensor<T, 4>& b) {
  return testing::normwise_difference(a.data(), b.data(), a.size());
}

// The bound on the quantized output of one row: each logit moves by at most
// half a step, ε = m / (2 q_max) with m the row's largest |logit|, so every
// probability moves by a factor within e^(±2ε) (the softmax's normaliser moves
// by as much), |p' - p| <= p (e^(2ε) - 1), and |o'_c - o_c| <= (e^(2ε) - 1) ·
// max_t |v_tc| per map; with two maps the second counts λ times.
template <int Maps>
void check_bound(const attention_inputs& in, bool causal, int bits) {
  const policy::reference ref;
  const auto exact = forward<double, Maps>(ref, in, causal, logits_unquantized);
  const auto quantized = forward<double, Maps>(ref, in, causal, bits);
  const index_t B = in.q.extent(0), N = in.q.extent(1), H = in.q.extent(2), G = in.k.extent(2), dv = in.v.extent(3);
  const double levels = (1 << (bits - 1)) - 1, lambda = 0.375;
  double worst = 0, largest_error = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < N; ++i)
      for (index_t h = 0; h < H; ++h) {
        const index_t j = h / (H / G), keys = causal ? i + 1 : N;
        double bound = 0;
        for (index_t m = 0; m < Maps; ++m) {
          double largest = 0;
          for (index_t t = 0; t < keys; ++t) {
            double s = 0;
            for (index_t c = 0; c < 16; ++c) s += in.q(b, i, h, m, c) * in.k(b, t, j, m, c);
            largest = std::max(largest, std::abs(s) / 4);
          }
          bound += (m == 0 ? 1.0 : lambda) * std::expm1(2 * largest / (2 * levels));
        }
        for (index_t c = 0; c < dv; ++c) {
          double v_max = 0;
          for (index_t t = 0; t < keys; ++t) v_max = std::max(v_max, std::abs(in.v(b, t, j, c)));
          const double error = std::abs(quantized(b, i, h, c) - exact(b, i, h, c));
          largest_error = std::max(largest_error, error);
          worst = std::max(worst, error / (bound * v_max + 1e-12));
        }
      }
  INFO("maps " << Maps << ", " << bits << " bits: largest error " << largest_error << ", worst " << worst
               << " of its bound");
  CHECK(worst <= 1.0);
  // It quantizes at all: a 4-bit grid moves logits up to 16 by up to 16/14
  // (a single key, N = 1, has weight 1 whatever its logit).
  if (bits == 4 && N > 1) CHECK(largest_error > 1e-3);
}

}  // namespace

TEST_CASE("low-bit: the logit grid, by hand") {
  // m = 1: 4 bits have 7 levels a side, 8 bits 127; nearbyint rounds half to even.
  std::vector<double> row{1.0, -0.5, 0.3, 0.07, -1.0};
  detail::quantize_logits(row.data(), 5, 4);  // 0.3·7 = 2.1, 0.07·7 = 0.49, -0.5·7 = -3.5
  CHECK(row == std::vector<double>{1.0, -4.0 / 7, 2.0 / 7, 0.0, -1.0});
  std::vector<float> wide{0.3f, -2.0f, 1.5f};
  detail::quantize_logits(wide.data(), 3, 8);  // m = 2: 0.3 · 63.5 = 19.05, 1.5 · 63.5 = 95.25
  CHECK(wide[0] == 19.0f * (2.0f / 127));
  CHECK(wide[1] == -2.0f);
  CHECK(wide[2] == 95.0f * (2.0f / 127));
  std::vector<double> zeros{0.0, 0.0}, unchanged{0.25, -3.0};
  detail::quantize_logits(zeros.data(), 2, 4);
  detail::quantize_logits(unchanged.data(), 2, 16);
  CHECK(zeros == std::vector<double>{0.0, 0.0});
  CHECK(unchanged == std::vector<double>{0.25, -3.0});
}

TEST_CASE("low-bit: 16 bits is the unquantized attention bit for bit") {
  const attention_inputs in(2, 2, 70, 70, 4, 2, 3);
  const policy::simd fast{2};
  for (bool causal : {true, false}) {
    const auto plain = forward<float, 2>(fast, in, causal, logits_unquantized);
    // The op's default, i.e. what every caller before this option got.
    const auto q = test_support::convert<float>(in.q), k = test_support::convert<float>(in.k);
    const auto v = test_support::convert<float>(in.v);
    Tensor<float, 4> o(plain.shape()), o2(plain.shape());
    Tensor<float, 4> lse({2, 4, 2, 70});
    Tensor<float, 1> lambda({1});
    lambda(0) = 0.375f;
    attention_forward<2>(fast, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), causal, o.view(),
                         o2.view(), lse.view());
    CHECK(std::memcmp(o.data(), plain.data(), sizeof(float) * static_cast<std::size_t>(o.size())) == 0);
    CHECK(difference(forward<float, 2>(fast, in, causal, 8), plain) > 1e-6);  // and 8 bits is not
  }
  // A module built with logit_bits = 16 computes what one built without it does.
  MultiHead<float, 8, policy::simd> a({.d_model = 32, .heads = 2}), b({.d_model = 32, .heads = 2, .logit_bits = 16});
  test_support::randomise_parameters(a, 5);
  copy_parameters(a, b);
  const auto x = test_support::random_tensor<float, 3>({2, 40, 32}, 6);
  Tensor<float, 3> ya(x.shape()), yb(x.shape());
  a.forward(x, ya.view());
  b.forward(x, yb.view());
  CHECK(std::memcmp(ya.data(), yb.data(), sizeof(float) * static_cast<std::size_t>(ya.size())) == 0);
}

TEST_CASE("low-bit: quantized logits, simd against the reference and within the bound") {
  // N = 1, a ragged tile edge and three tiles; grouped heads; causal and not.
  for (auto [N, causal] : {std::pair<index_t, bool>{1, true}, {70, true}, {70, false}, {150, true}})
    for (int bits : {8, 6, 4}) {
      INFO("N = " << N << std::string(causal ? " causal" : " non-causal") << ", " << bits << " bits");
      const attention_inputs two(2, 2, N, N, 4, 2, 7), one(1, 1, N, N, 4, 1, 8);
      const policy::reference ref;
      const policy::simd fast{2};
      // Float against float: the same logits, the same grid; what differs is
      // the softmax and P·V in float, within float's forward tolerance.
      CHECK(difference(forward<float, 2>(fast, two, causal, bits), forward<float, 2>(ref, two, causal, bits)) <=
            testing::tolerance<float>::forward);
      CHECK(difference(forward<float, 1>(fast, one, causal, bits), forward<float, 1>(ref, one, causal, bits)) <=
            testing::tolerance<float>::forward);
      check_bound<2>(two, causal, bits);
      check_bound<1>(one, causal, bits);
    }
}

TEST_CASE("low-bit: decoding quantizes each row over all its key blocks") {
  // 300 and 520 cached keys: rows spanning two and three blocks of 256, so a
  // grid taken per block instead of per row would differ.
  const attention_inputs two(2, 2, 2, 520, 4, 2, 9);
  const std::vector<index_t> lengths{300, 520};
  const policy::reference ref;
  const policy::simd fast{2};
  for (int bits : {8, 4}) {
    INFO(bits << " bits");
    const auto reference = decode<float, 2>(ref, two, lengths, bits);
    CHECK(difference(decode<float, 2>(fast, two, lengths, bits), reference) <= testing::tolerance<float>::forward);
    CHECK(difference(decode<float, 2>(fast, two, lengths, logits_unquantized), reference) > 1e-5);
  }
}

TEST_CASE("low-bit: prefill then quantized decoding equals the quantized forward") {
  auto run = [](auto module) {
    test_support::randomise_parameters(module, 21);
    const auto x = test_support::random_tensor<double, 3>({2, 9, 32}, 22);
    Tensor<double, 3> full(x.shape());
    module.forward(x, full.view());
    auto cache = module.make_cache(2, 9);
    const auto prompt = test_support::token_range<double>(x, 0, 6);
    Tensor<double, 3> y(prompt.shape()), step({2, 1, 32});
    module.prefill(prompt, cache, y.view());
    double worst = testing::normwise_difference(y.data(), test_support::token_range<double>(full, 0, 6).data(), y.size());
    for (index_t n = 6; n < 9; ++n) {
      module.decode(test_support::token_range<double>(x, n, n + 1), cache, step.view());
      worst = std::max(worst, testing::normwise_difference(step.data(), test_support::token_range<double>(full, n, n + 1).data(),
                                                           step.size()));
    }
    return worst;
  };
  // The reference computes a row's logits the same way in both: equal to rounding.
  CHECK(run(MultiHead<double, 8>({.d_model = 32, .heads = 2, .kv_heads = 1, .logit_bits = 4})) <=
        testing::tolerance<double>::forward);
  CHECK(run(Attention<double, 8>({.d_model = 32, .heads = 4, .kv_heads = 2, .logit_bits = 6})) <=
        testing::tolerance<double>::forward);
  CHECK(run(MultiHeadV2<double, 8>({.d_model = 32, .heads = 2, .kv_heads = 2, .logit_bits = 8})) <=
        testing::tolerance<double>::forward);
}

TEST_CASE("low-bit: bad logit bit counts and a backward through quantized logits are refused") {
  const attention_inputs in(1, 1, 5, 5, 2, 1, 1);
  for (int bits : {3, 9, 0, 15, 17, -4}) {
    const std::string got = std::to_string(bits);
    test_support::expect_input_error([&] { forward<float, 1>(policy::simd{}, in, true, bits); }, "attention_forward",
                                     "logit_bits", "4, 5, 6, 7 or 8 bits, or 16", got);
    test_support::expect_input_error([&] { forward<double, 1>(policy::reference{}, in, true, bits); },
                                     "attention_forward", "logit_bits", "4, 5, 6, 7 or 8 bits, or 16", got);
    test_support::expect_input_error([&] { decode<float, 1>(policy::simd{}, in, {5}, bits); }, "attention_decode",
                                     "logit_bits", "4, 5, 6, 7 or 8 bits, or 16", got);
    test_support::expect_input_error([&] { MultiHead<float, 8>({.d_model = 32, .heads = 2, .logit_bits = bits}); },
                                     "MultiHead", "logit_bits", "4, 5, 6, 7 or 8 bits, or 16", got);
    test_support::expect_input_error([&] { Attention<float, 8>({.d_model = 32, .heads = 4, .logit_bits = bits}); },
                                     "Attention", "logit_bits", "4, 5, 6, 7 or 8 bits, or 16", got);
    test_support::expect_input_error([&] { MultiHeadV2<float, 8>({.d_model = 32, .heads = 2, .logit_bits = bits}); },
                                     "MultiHeadV2", "logit_bits", "4, 5, 6, 7 or 8 bits, or 16", got);
  }
  // Quantization is for inference: a backward is refused before any gradient changes.
  DecoderLayer<double, 8> layer({{.d_model = 32, .heads = 2, .logit_bits = 8}});
  test_support::randomise_parameters(layer, 2);
  const auto x = test_support::random_tensor<double, 3>({1, 4, 32}, 3);
  Tensor<double, 3> y(x.shape()), dx(x.shape());
  decltype(layer)::saved_type saved;
  layer.forward(x, y.view(), saved);
  test_support::expect_input_error([&] { layer.backward(x, y, saved, dx.view()); }, "DecoderLayer::backward",
                                   "config.logit_bits", "a backward needs unquantized logits", "8");
  for (const auto& p : layer.parameters())
    CHECK(std::all_of(p.grad, p.grad + p.size(), [](double g) { return g == 0; }));
}
