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
#include <limits>
#include <tuple>
#include <array>
#include <string>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/amx_models.hpp"
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
  attention_inputs(index_t maps, index_t B, index_t N, index_t S, index_t H, index_t G, std::uint64_t seed,
                   index_t d = 16)
      : q({B, N, H, maps, d}), k({B, S, G, maps, d}), v(test_support::random_tensor<double, 4>({B, S, G, 16}, seed)) {
    random_stream rng(seed + 1);
    for (auto* t : {&q, &k})
      for (index_t e = 0; e < t->size(); ++e) t->data()[e] = std::round(rng.uniform(-8.5, 8.5)) / 4;
  }
};

template <class T, int Maps, class P>
Tensor<T, 4> forward(const P& policy, const attention_inputs& in, bool causal, int bits,
                     inference_dtype qk = inference_dtype::same,
                     simd_detail::score_tile_fn tile = simd_detail::int8_score_tile<float>(false)) {
  const auto q = test_support::convert<T>(in.q), k = test_support::convert<T>(in.k);
  const auto v = test_support::convert<T>(in.v);
  const index_t B = q.extent(0), N = q.extent(1), H = q.extent(2);
  Tensor<T, 4> o({B, N, H, v.extent(3)}), o2(Maps == 2 ? shape_t<4>{B, N, H, v.extent(3)} : shape_t<4>{});
  Tensor<accum_t<T>, 4> lse({B, H, Maps, N});
  Tensor<accum_t<T>, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{});
  if (Maps == 2) lambda(0) = accum_t<T>(0.375);
  if constexpr (std::is_same_v<P, policy::simd>)
    if (tile != simd_detail::int8_score_tile<float>(false)) {  // another score kernel than this CPU's: past the op's checks
      simd_detail::fused_attention_forward<Maps, T>(policy, q.const_view(), k.const_view(), v.const_view(),
                                                    lambda.const_view(), causal, o.view(), o2.view(), lse.view(), bits,
                                                    qk, simd_detail::score_kernels{tile, nullptr});
      return o;
    }
  attention_forward<Maps>(policy, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), causal, o.view(),
                          o2.view(), lse.view(), bits, qk);
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

// ---------------------------------------------------------------- int8

namespace {

// vpdpbusd modelled on 16 int32 lanes (each adds four u8·s8 products, wrapping
// modulo 2^32), in the layout of the AVX-512 VNNI kernel: it runs that
// kernel's driver (the unsigned offset, its correction, the blocking) on every CPU.
// (Streamed only asks the real kernels to prefetch: nothing to model.)
struct modelled_vnni_int8 {
  static constexpr int rows = 4;
  static constexpr bool offset_a = true;
  template <int R, int C, bool Streamed = false>
  static void dots(index_t kp, const std::int8_t* a, index_t lda, const std::int8_t* b, index_t ldb, std::int32_t* out,
                   index_t ldo) noexcept {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        std::uint32_t lanes[16] = {};
        for (index_t p = 0; p < kp; p += 64)
          for (int l = 0; l < 16; ++l)
            for (int i = 0; i < 4; ++i)
              lanes[l] += static_cast<std::uint32_t>(std::int32_t{static_cast<std::uint8_t>(a[r * lda + p + 4 * l + i])} *
                                                     std::int32_t{b[c * ldb + p + 4 * l + i]});
        std::uint32_t total = 0;
        for (auto x : lanes) total += x;
        out[r * ldo + c] = static_cast<std::int32_t>(total);
      }
  }
};

// Rows of random int8 in [-127, 127] (or all `fill`), as int8_rows of floats.
int8_rows<float> random_int8_rows(index_t rows, index_t cols, std::uint64_t seed, int fill = 0) {
  int8_rows<float> m(rows, cols);
  random_stream rng(seed);
  for (index_t r = 0; r < rows; ++r) {
    std::int32_t sum = 0;
    for (index_t c = 0; c < cols; ++c) {
      const auto v = static_cast<std::int8_t>(fill ? fill : static_cast<int>(std::floor(rng.uniform(-127, 128))));
      m.values.data()[r * m.padded + c] = v;
      sum += v;
    }
    m.sums[static_cast<std::size_t>(r)] = sum;
  }
  return m;
}

template <class Kernel>
void check_int8_products(index_t M, index_t N, index_t K, int fill_a = 0, int fill_b = 0) {
  const auto a = random_int8_rows(M, K, 31, fill_a), b = random_int8_rows(N, K, 32, fill_b);
  std::vector<std::int64_t> got(static_cast<std::size_t>(M * N), -1);
  simd_detail::int8_products_with<Kernel>(policy::simd{2}, a, b, [&](index_t i, index_t j0, index_t n, const std::int32_t* sums) {
    for (index_t c = 0; c < n; ++c) got[static_cast<std::size_t>(i * N + j0 + c)] = sums[c];
  });
  int misses = 0;
  for (index_t i = 0; i < M; ++i)
    for (index_t j = 0; j < N; ++j) {
      std::int64_t exact = 0;
      for (index_t p = 0; p < K; ++p) exact += std::int64_t{a.row(i)[p]} * std::int64_t{b.row(j)[p]};
      misses += got[static_cast<std::size_t>(i * N + j)] != exact;
    }
  INFO("M=" << M << " N=" << N << " K=" << K);
  CHECK(misses == 0);
}

template <class Kernel>
void check_int8_products_everywhere() {
  // Rows of A in micro-kernel steps and ragged (R = 4 or 2), B in fours and
  // ragged, blocks of 64 rows of B, decoding's few rows, depths past one vector.
  for (auto [M, N, K] : {std::array<index_t, 3>{1, 300, 77}, {3, 7, 19}, {133, 261, 530}, {5, 64, 2048}, {67, 17, 1030}})
    check_int8_products<Kernel>(M, N, K);
  check_int8_products<Kernel>(2, 5, 301, 127, -127);  // the largest products: no int16 saturation in AVX2's pairs
  check_int8_products<Kernel>(1, 4, 70000, 127, 127);  // vpdpbusd's raw sums wrap past 2^31; the corrected ones do not
}

}  // namespace

TEST_CASE("low-bit: int8 storage of a vector is the rule of ops/int8.hpp at every length and for every value") {
  // The rule written out value by value: step = max|x| / 127, x8 = nearbyint(x · 127 / max|x|) (half to even);
  // zeros give step 0, a NaN or an infinity of either sign anywhere a NaN step and zeros. Lengths around the
  // vector widths the maximum is taken in, with the largest magnitude and the non-finite value in every lane
  // and in the tail.
  random_stream rng(21);
  auto check = [&]<class A>(A) {
    for (const index_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 1024}) {
      for (index_t special = -1; special < n; special += std::max<index_t>(1, n / 7)) {
        for (int kind = 0; kind < 5; ++kind) {
          std::vector<A> x(static_cast<std::size_t>(n));
          for (auto& v : x) v = A(rng.normal());
          if (special >= 0 && kind == 1) x[static_cast<std::size_t>(special)] = A(-40);  // the largest, negative
          const A sign = special % 2 ? A(-1) : A(1);
          if (special >= 0 && kind == 2) x[static_cast<std::size_t>(special)] = sign * std::numeric_limits<A>::infinity();
          if (special >= 0 && kind == 3)
            x[static_cast<std::size_t>(special)] = std::copysign(std::numeric_limits<A>::quiet_NaN(), sign);
          if (kind == 4) std::fill(x.begin(), x.end(), special % 2 ? A(0) : -A(0));
          if (kind == 0 && n >= 4) x[0] = A(127), x[1] = A(0.5), x[2] = A(1.5), x[3] = A(-2.5);  // ties to even
          A largest(0);
          bool finite = true;
          for (const A v : x) {
            finite = finite && std::isfinite(v);
            if (std::isfinite(v)) largest = std::max(largest, std::abs(v));
          }
          std::vector<std::int8_t> got(static_cast<std::size_t>(n), std::int8_t{99});
          const A step = detail::quantize_int8(x.data(), n, got.data());
          INFO(n << " values, special " << special << ", kind " << kind);
          if (!finite) {
            CHECK(std::isnan(step));
          } else {
            CHECK(step == largest / A(127));
          }
          for (index_t i = 0; i < n; ++i) {
            const auto v = static_cast<std::size_t>(i);
            const std::int8_t want = !finite || largest == A(0)
                                         ? std::int8_t{0}
                                         : static_cast<std::int8_t>(std::nearbyint(x[v] * (A(127) / largest)));
            CHECK(got[v] == want);
          }
          if (kind == 0 && n >= 4) CHECK(std::vector<int>(got.begin(), got.begin() + 4) == std::vector<int>{127, 0, 2, -2});
        }
      }
    }
  };
  check(float{});
  check(double{});
  check(static_cast<long double>(0));
}

TEST_CASE("low-bit: int8 products, every kernel against the exact sums") {
  check_int8_products_everywhere<simd_detail::portable_int8>();
  check_int8_products_everywhere<modelled_vnni_int8>();
#if DIFFTX_INT8_DOTS
  if (__builtin_cpu_supports("avx2"))
    check_int8_products_everywhere<simd_detail::avx2_int8>();
  else
    MESSAGE("this CPU has no AVX2: its int8 kernel did not run");
  if (simd_detail::int8_dot_kernel() == simd_detail::int8_kernel::avx512_vnni)
    check_int8_products_everywhere<simd_detail::avx512_vnni_int8>();
  else
    MESSAGE("this CPU has no AVX512_VNNI: vpdpbusd itself did not run, only its model");
#endif
  MESSAGE("int8 kernel chosen on this CPU: " << std::string(simd_detail::int8_kernel_name()));
}

namespace {

// y = x·wᵀ with int8 weights: simd against the reference bit for bit, and both
// against float64 on the unquantized values within
//   (s_x/2)·Σ_k |ŵ_k| + (s_w/2)·Σ_k |x_k|  +  (3·2⁻²⁴ + u_T)·|ŷ|
// (s = max|·|/127 the steps, ŵ = s_w·w8 within s_w/2 of w; the integer sum is
// exact, then one int32-to-float rounding and two products in float, and the
// result rounded to T once).
template <class T>
void check_int8_linear(index_t M, index_t K, index_t N, const policy::simd& p = {}) {
  Linear<T, policy::simd> fast(K, N, p);
  Linear<T, policy::reference> ref(K, N);
  test_support::randomise_parameters(ref, 41);
  copy_parameters(ref, fast);
  const auto x = test_support::random_tensor<T, 3>({1, M, K}, 42);
  Tensor<T, 3> y_ref({1, M, N}), y_fast({1, M, N}), y_plain({1, M, N});
  typename Linear<T, policy::reference>::saved_type saved;
  typename Linear<T, policy::simd>::saved_type saved_fast;
  ref.forward(x, y_plain.view(), saved);
  quantize(ref);
  quantize(fast);
  ref.forward(x, y_ref.view(), saved);
  fast.forward(x, y_fast.view(), saved_fast);
  INFO(scalar_traits<T>::name << " M=" << M << " K=" << K << " N=" << N);
  CHECK(std::memcmp(y_ref.data(), y_fast.data(), sizeof(T) * static_cast<std::size_t>(y_ref.size())) == 0);

  const T* w = ref.parameters()[0].value;
  double worst = 0, largest = 0;
  for (index_t m = 0; m < M; ++m) {
    double x_max = 0, x_sum = 0;
    for (index_t k = 0; k < K; ++k) {
      x_max = std::max(x_max, std::abs(double(x(0, m, k))));
      x_sum += std::abs(double(x(0, m, k)));
    }
    for (index_t n = 0; n < N; ++n) {
      double w_max = 0, w_sum = 0, exact = 0;
      for (index_t k = 0; k < K; ++k) {
        const double wk = double(w[n * K + k]);
        w_max = std::max(w_max, std::abs(wk));
        w_sum += std::abs(wk);
        exact += double(x(0, m, k)) * wk;
      }
      const double s_x = x_max / 127 * (1 + 1e-6), s_w = w_max / 127 * (1 + 1e-6);
      const double integer_part = s_x / 2 * (w_sum + K * s_w / 2) + s_w / 2 * x_sum;
      const double bar = integer_part + (3 * 0x1p-24 + scalar_traits<T>::epsilon) * (std::abs(exact) + integer_part);
      const double error = std::abs(double(y_ref(0, m, n)) - exact);
      largest = std::max(largest, error);
      worst = std::max(worst, error / bar);
    }
  }
  INFO("largest error " << largest << ", worst " << worst << " of its bound");
  CHECK(worst <= 1.0);
  CHECK(testing::normwise_difference(y_ref.data(), y_plain.data(), y_ref.size()) > 1e-4);  // int8 at all: ~1e-3
}

// attention_decode over a cache holding in's keys and values (float or int8),
// the first lengths[b] of sequence b, queries in.q.
template <int Maps, class P>
Tensor<float, 4> decode_cache(const P& policy, const attention_inputs& in, const std::vector<index_t>& lengths,
                              inference_dtype storage) {
  const index_t B = in.k.extent(0), S = in.k.extent(1), G = in.k.extent(2), d = in.k.extent(4), dv = in.v.extent(3);
  KVCache<float> cache({B, S, G, Maps, d, dv, storage}, host_memory());
  for (index_t b = 0; b < B; ++b) {
    const index_t length = lengths[static_cast<std::size_t>(b)];
    Tensor<float, 5> k({1, length, G, Maps, d});
    Tensor<float, 4> v({1, length, G, dv});
    for (index_t t = 0; t < length; ++t)
      for (index_t g = 0; g < G; ++g) {
        for (index_t m = 0; m < Maps; ++m)
          for (index_t c = 0; c < d; ++c) k(0, t, g, m, c) = float(in.k(b, t, g, m, c));
        for (index_t c = 0; c < dv; ++c) v(0, t, g, c) = float(in.v(b, t, g, c));
      }
    cache.append(b, k.const_view(), v.const_view());
  }
  const auto q = test_support::convert<float>(in.q);
  Tensor<float, 4> o({B, q.extent(1), q.extent(2), dv});
  Tensor<float, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{});
  if (Maps == 2) lambda(0) = 0.375f;
  if (storage == inference_dtype::int8)
    attention_decode<Maps>(policy, q.const_view(), cache.int8_view(), cache.lengths(), lambda.const_view(), o.view());
  else
    attention_decode<Maps>(policy, q.const_view(), cache.keys(), cache.values(), cache.lengths(), lambda.const_view(),
                           o.view());
  return o;
}

// The int8 cache's output against the float cache's: a key vector k (step
// s_k = max|k|/127) is read within s_k/2 per entry, so logit t moves by at most
// ε_t = (s_k,t / 2)·‖q‖₁/√d; with ε the row's largest, probabilities move by a
// factor within e^(±2ε), and values by at most s_v/2 per entry:
//   |o' - o| <= (e^(2ε) - 1)·(max|v| + max s_v/2) + max s_v/2   per map (λ times the second).
template <int Maps>
void check_int8_cache_bound(const attention_inputs& in, const std::vector<index_t>& lengths, const Tensor<float, 4>& got,
                            const Tensor<float, 4>& plain) {
  const index_t B = in.q.extent(0), T = in.q.extent(1), H = in.q.extent(2), G = in.k.extent(2), d = 16;
  const index_t dv = in.v.extent(3);
  double worst = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < T; ++i)
      for (index_t h = 0; h < H; ++h) {
        const index_t j = h / (H / G), keys = lengths[static_cast<std::size_t>(b)] - T + i + 1;
        double bound = 0, v_max = 0, v_step = 0;
        for (index_t t = 0; t < keys; ++t) {
          double largest = 0;
          for (index_t c = 0; c < dv; ++c) {
            largest = std::max(largest, std::abs(in.v(b, t, j, c)));
            v_max = std::max(v_max, std::abs(in.v(b, t, j, c)));
          }
          v_step = std::max(v_step, largest / 127);
        }
        for (index_t m = 0; m < Maps; ++m) {
          double q_norm = 0, eps = 0;
          for (index_t c = 0; c < d; ++c) q_norm += std::abs(in.q(b, i, h, m, c));
          for (index_t t = 0; t < keys; ++t) {
            double k_max = 0;
            for (index_t c = 0; c < d; ++c) k_max = std::max(k_max, std::abs(in.k(b, t, j, m, c)));
            eps = std::max(eps, k_max / 127 / 2 * q_norm / 4);
          }
          bound += (m == 0 ? 1.0 : 0.375) * (std::expm1(2 * eps) * (v_max + v_step / 2) + v_step / 2);
        }
        for (index_t c = 0; c < dv; ++c)
          worst = std::max(worst, std::abs(double(got(b, i, h, c)) - double(plain(b, i, h, c))) / (bound + 1e-5));
      }
  INFO("worst " << worst << " of its bound");
  CHECK(worst <= 1.0);
}

}  // namespace

// Each matrix library forced (oneDNN's u8·s8→s32 matmul where built and its
// sums are exact, for rows past decoding's; 1100 x 4000 sums take two of its
// column blocks): the sums are exact either way, so the bits are the
// reference's. Then every product at its largest (x and w quantize to 127
// throughout) with K = 70000: u8·s8 pairs past int16, where a kernel without
// VNNI saturates, and raw offset sums past 2^31, which the correction undoes.
TEST_CASE("low-bit: int8 Linear, simd equals the reference bit for bit, within the bound of float64") {
  using library = policy::simd::matmul_library;
  for (const auto matmuls : {library::automatic, library::difftx, library::onednn}) {
    policy::simd p{2};
    p.matmuls = matmuls;
    INFO("matmuls " << static_cast<int>(matmuls));
    for (auto [M, K, N] : {std::array<index_t, 3>{1, 77, 300}, {3, 19, 7}, {70, 130, 67}, {133, 530, 261}}) {
      check_int8_linear<float>(M, K, N, p);
      check_int8_linear<Eigen::bfloat16>(M, K, N, p);
      check_int8_linear<double>(M, K, N, p);
    }
  }
#if defined(DIFFTX_ONEDNN)
  check_int8_linear<float>(1100, 19, 4000, policy::simd{.threads = 2, .matmuls = library::onednn});
#endif

  const index_t M = 8, K = 70000, N = 4;
  Linear<float, policy::reference> ref(K, N);
  std::fill_n(ref.parameters()[0].value, K * N, 0.25f);
  quantize(ref);
  Tensor<float, 3> x({1, M, K}), y_ref({1, M, N}), y({1, M, N});
  std::fill_n(x.data(), x.size(), 0.5f);
  typename Linear<float, policy::reference>::saved_type saved;
  ref.forward(x, y_ref.view(), saved);
  CHECK(y_ref(0, 0, 0) == doctest::Approx(K * 0.125).epsilon(1e-6));
  for (const auto matmuls : {library::difftx, library::onednn}) {
    INFO("matmuls " << static_cast<int>(matmuls));
    Linear<float, policy::simd> fast(K, N, policy::simd{.threads = 2, .matmuls = matmuls});
    std::fill_n(fast.parameters()[0].value, K * N, 0.25f);
    quantize(fast);
    typename Linear<float, policy::simd>::saved_type saved_fast;
    fast.forward(x, y.view(), saved_fast);
    CHECK(std::memcmp(y_ref.data(), y.data(), sizeof(float) * static_cast<std::size_t>(y.size())) == 0);
  }
#if defined(DIFFTX_ONEDNN)
  // Where oneDNN's int8 sums are exact (VNNI), forcing it runs it; elsewhere difftx's kernels do.
  const auto kernel = policy::simd{.matmuls = library::onednn}.matmul_kernel<std::int8_t>();
  CHECK(kernel.empty() == !simd_detail::onednn_int8_exact());
  MESSAGE("oneDNN's int8 kernel here: " << (kernel.empty() ? "none (no VNNI: difftx's own)" : kernel));
#endif
}

TEST_CASE("low-bit: decoding over an int8 cache: simd against the reference, within the bound of the float cache") {
  const policy::reference ref;
  const policy::simd fast{2};
  // 4 query rows per group (the in-place path) and 6 or 8 (the dequantized block and Eigen).
  for (auto [H, G, T] : {std::array<index_t, 3>{4, 2, 2}, {8, 1, 1}, {4, 2, 3}}) {
    INFO("H=" << H << " G=" << G << " T=" << T);
    const attention_inputs two(2, 2, T, 520, H, G, 51), one(1, 2, T, 520, H, G, 52);
    const std::vector<index_t> lengths{300, 520};
    const auto two_int8 = decode_cache<2>(ref, two, lengths, inference_dtype::int8);
    const auto one_int8 = decode_cache<1>(ref, one, lengths, inference_dtype::int8);
    CHECK(difference(decode_cache<2>(fast, two, lengths, inference_dtype::int8), two_int8) <= testing::tolerance<float>::forward);
    CHECK(difference(decode_cache<1>(fast, one, lengths, inference_dtype::int8), one_int8) <= testing::tolerance<float>::forward);
    const auto two_plain = decode_cache<2>(ref, two, lengths, inference_dtype::same);
    check_int8_cache_bound<2>(two, lengths, two_int8, two_plain);
    check_int8_cache_bound<1>(one, lengths, one_int8, decode_cache<1>(ref, one, lengths, inference_dtype::same));
    CHECK(difference(two_int8, two_plain) > 1e-5);  // it is int8 at all
  }
}

TEST_CASE("low-bit: an int8 cache holds a quarter of float32's bytes plus its steps") {
  MultiHead<float, 16, policy::simd> diff({.d_model = 64, .heads = 2, .kv_heads = 1});
  Attention<float, 16, policy::simd> base({.d_model = 64, .heads = 4, .kv_heads = 2});
  for (const auto& [plain, int8, steps] :
       {std::tuple{diff.make_cache(3, 40).bytes(), diff.make_cache(3, 40, inference_dtype::int8).bytes(),
                   std::size_t{3 * 40 * 1 * 3 * 4}},  // G = 1, two key halves and the value: 3 steps per token
        std::tuple{base.make_cache(3, 40).bytes(), base.make_cache(3, 40, inference_dtype::int8).bytes(),
                   std::size_t{3 * 40 * 2 * 2 * 4}}}) {
    CHECK(plain == 3 * 40 * 4 * 64);  // g · (maps · D + dv) floats per token: 64 for both
    CHECK(int8 == plain / 4 + steps);
  }
}

namespace {

// A small language model's logits over 8 prompt tokens then 256 decoded ones
// (teacher-forced: the same tokens for every variant), one row per position.
using lm_layer = DecoderLayer<float, 8, policy::simd>;
std::vector<std::vector<float>> decoded_logits(bool int8_weights, inference_dtype cache_storage, bool tied = false) {
  constexpr index_t V = 96, C = 32, prompt = 8, steps = 256;
  std::vector<lm_layer> layers;
  for (index_t l = 0; l < 2; ++l) layers.emplace_back(DecoderLayerConfig{{.d_model = C, .heads = 2, .layer_index = l}, 64});
  LanguageModel<lm_layer> model({.vocab_size = V, .d_model = C, .tie_word_embeddings = tied}, std::move(layers));
  random_stream init(61);
  model.reset_parameters(init);
  if (int8_weights) quantize(model);
  random_stream draw(62);
  Tensor<token_t, 2> tokens({1, prompt + steps});
  for (index_t i = 0; i < tokens.size(); ++i) tokens.data()[i] = static_cast<token_t>(draw.uniform(0, V - 1e-9));
  auto cache = model.make_cache(1, prompt + steps, cache_storage);
  Tensor<token_t, 2> first({1, prompt}), next({1, 1});
  std::copy_n(tokens.data(), prompt, first.data());
  Tensor<float, 3> logits({1, prompt, V}), step({1, 1, V});
  model.prefill(first.const_view(), cache, logits.view());
  std::vector<std::vector<float>> rows;
  for (index_t p = 0; p < prompt; ++p) rows.emplace_back(logits.data() + p * V, logits.data() + (p + 1) * V);
  for (index_t p = prompt; p < prompt + steps; ++p) {
    next(0, 0) = tokens(0, p);
    model.decode(next.const_view(), cache, step.view());
    rows.emplace_back(step.data(), step.data() + V);
  }
  return rows;
}

// The worst normwise difference of two runs' logits over the decoded positions.
double worst_row(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, testing::normwise_difference(a[i].data(), b[i].data(), static_cast<index_t>(a[i].size())));
  return worst;
}

}  // namespace

// Bars, as the largest |logit difference| over the row's largest |logit|:
// int8 storage puts each value within 1/254 of its vector's largest |value|
// (half a step); the cache quantizes keys and values (2 per layer, 2 layers),
// the weights every product on a token's path (q/k/v, out_proj, gate/up,
// down: 4 in series per layer) and the head. With independent roundings adding
// in quadrature that is ~0.6% for the cache and ~1.2% for the weights at this
// size, and 0.58% / 1.44% / 1.49% were measured (this test, Zen 4). The bars
// (2%, 5%) leave room for another machine's float rounding; a cache or weight
// read with the wrong step or at the wrong token misses by tens of percent.
TEST_CASE("low-bit: 256 decoded tokens with int8 weights and an int8 cache stay near float32's logits") {
  const auto plain = decoded_logits(false, inference_dtype::same);
  const double cache = worst_row(decoded_logits(false, inference_dtype::int8), plain);
  const double weights = worst_row(decoded_logits(true, inference_dtype::same), plain);
  const double both = worst_row(decoded_logits(true, inference_dtype::int8), plain);
  MESSAGE("worst logit row, normwise against the float cache and weights: int8 cache " << cache << ", int8 weights "
                                                                                       << weights << ", both " << both);
  CHECK(cache > 0);
  CHECK(cache <= 0.02);
  CHECK(weights <= 0.05);
  CHECK(both <= 0.05);
  // A head tied to the embedding reads an int8 copy of the table: the same bar.
  const double tied = worst_row(decoded_logits(true, inference_dtype::int8, true),
                                decoded_logits(false, inference_dtype::same, true));
  MESSAGE("tied head, int8 weights and cache: " << tied);
  CHECK(tied > 0);
  CHECK(tied <= 0.05);
}

TEST_CASE("low-bit: int8 weights refuse non-finite values and a backward, nothing changed") {
  Linear<float> bad(8, 3);
  bad.parameters()[0].value[5] = std::numeric_limits<float>::quiet_NaN();
  test_support::expect_input_error([&] { quantize(bad); }, "Linear::quantize_weights", "weight", "finite values",
                                   "output channel 0");
  CHECK_FALSE(bad.weights_quantized());
  DecoderLayer<float, 8, policy::simd> layer({{.d_model = 32, .heads = 2}});
  quantize(layer);
  const auto x = test_support::random_tensor<float, 3>({1, 4, 32}, 3);
  Tensor<float, 3> y(x.shape()), dx(x.shape());
  decltype(layer)::saved_type saved;
  layer.forward(x, y.view(), saved);
  test_support::expect_input_error([&] { layer.backward(x, y, saved, dx.view()); }, "DecoderLayer::backward", "weights",
                                   "float weights", "int8 weights");
  for (const auto& p : layer.parameters())
    CHECK(std::all_of(p.grad, p.grad + p.size(), [](float g) { return g == 0; }));
}

namespace {

// vpdpbusd modelled in the VNNI score tile's layout (q8 offset by 128 [64][4·d4],
// k8 [d4][64][4]): the int8 attention's packing on every CPU.
void modelled_vnni_score_tile(index_t d4, const std::int8_t* q8, const std::int8_t* k8, const std::int32_t* corr,
                              const float* q_steps, const float* k_steps, float* s) {
  for (index_t i = 0; i < 64; ++i)
    for (index_t t = 0; t < 64; ++t) {
      std::uint32_t lane = 0;  // key t's lane: 4 products per depth step, wrapping
      for (index_t p = 0; p < d4; ++p)
        for (index_t b = 0; b < 4; ++b)
          lane += static_cast<std::uint32_t>(std::int32_t{static_cast<std::uint8_t>(q8[i * 4 * d4 + 4 * p + b])} *
                                             std::int32_t{k8[(p * 64 + t) * 4 + b]});
      s[i * 64 + t] = float(static_cast<std::int32_t>(lane - static_cast<std::uint32_t>(corr[t]))) * q_steps[i] * k_steps[t];
    }
}

// int8 Q·Kᵀ against the unquantized float64 output: with s_q, s_k the steps
// of a query row and a key (max|·|/127), q̂ and k̂ within half a step per entry,
//   |ŝ_t - s_t| <= ((s_q/2)·Σ_c |k̂_c| + (s_k/2)·Σ_c |q_c|) / sqrt(d) =: ε_t,
// and the output moves by at most (e^(2ε) - 1)·max|v| per map, ε = max_t ε_t.
template <int Maps>
void check_int8_qk_bound(const attention_inputs& in, bool causal, const Tensor<double, 4>& got) {
  const auto exact = forward<double, Maps>(policy::reference{}, in, causal, logits_unquantized);
  const index_t B = in.q.extent(0), N = in.q.extent(1), H = in.q.extent(2), G = in.k.extent(2), d = in.q.extent(4);
  const double root = std::sqrt(double(d));
  double worst = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < N; ++i)
      for (index_t h = 0; h < H; ++h) {
        const index_t j = h / (H / G), keys = causal ? i + 1 : N;
        double bound = 0, v_max = 0;
        for (index_t t = 0; t < keys; ++t)
          for (index_t c = 0; c < 16; ++c) v_max = std::max(v_max, std::abs(in.v(b, t, j, c)));
        for (index_t m = 0; m < Maps; ++m) {
          double q_max = 0, q_sum = 0, eps = 0;
          for (index_t c = 0; c < d; ++c) {
            q_max = std::max(q_max, std::abs(in.q(b, i, h, m, c)) / root);
            q_sum += std::abs(in.q(b, i, h, m, c)) / root;
          }
          for (index_t t = 0; t < keys; ++t) {
            double k_max = 0, k_sum = 0;
            for (index_t c = 0; c < d; ++c) {
              k_max = std::max(k_max, std::abs(in.k(b, t, j, m, c)));
              k_sum += std::abs(in.k(b, t, j, m, c));
            }
            eps = std::max(eps, q_max / 254 * (k_sum + d * k_max / 254) + k_max / 254 * q_sum);
          }
          bound += (m == 0 ? 1.0 : 0.375) * std::expm1(2 * eps) * v_max;
        }
        for (index_t c = 0; c < 16; ++c)
          worst = std::max(worst, std::abs(got(b, i, h, c) - exact(b, i, h, c)) / (bound * (1 + 1e-9) + 1e-12));
      }
  INFO("worst " << worst << " of its bound");
  CHECK(worst <= 1.0);
}

}  // namespace

TEST_CASE("low-bit: int8 Q·Kᵀ in the fused forward: every score kernel against the reference, within the bound") {
  const policy::reference ref;
  const policy::simd fast{2};
  std::vector<std::pair<std::string, simd_detail::score_tile_fn>> kernels{{"float product on the int8 values", nullptr},
                                                                          {"modelled vpdpbusd", modelled_vnni_score_tile},
                                                                          {"modelled tdpbusd", test_support::modelled_amx_int8_score_tile}};
  if (simd_detail::int8_score_tile<float>(false))
    kernels.emplace_back("vpdpbusd", simd_detail::int8_score_tile<float>(false));
  else
    MESSAGE("this CPU has no AVX512_VNNI: the int8 score tile ran as its model only");
  // d = 16, and d = 6 (the VNNI layout pads the depth to 8); N = 1, a ragged
  // tile and three tiles; causal and not; logit quantization on top.
  for (auto [N, causal, d] : {std::tuple<index_t, bool, index_t>{1, true, 16}, {70, true, 16}, {70, false, 6}, {150, true, 16}}) {
    INFO("N = " << N << std::string(causal ? " causal" : " non-causal") << ", d = " << d);
    const attention_inputs two(2, 2, N, N, 4, 2, 71, d), one(1, 2, N, N, 4, 1, 72, d);
    for (int bits : {logits_unquantized, 6}) {
      const auto two_ref = forward<float, 2>(ref, two, causal, bits, inference_dtype::int8);
      const auto one_ref = forward<float, 1>(ref, one, causal, bits, inference_dtype::int8);
      for (const auto& [name, kernel] : kernels) {
        INFO(name << ", " << bits << " logit bits");
        CHECK(difference(forward<float, 2>(fast, two, causal, bits, inference_dtype::int8, kernel), two_ref) <=
              testing::tolerance<float>::forward);
        CHECK(difference(forward<float, 1>(fast, one, causal, bits, inference_dtype::int8, kernel), one_ref) <=
              testing::tolerance<float>::forward);
      }
    }
    const auto two_int8 = forward<double, 2>(ref, two, causal, logits_unquantized, inference_dtype::int8);
    check_int8_qk_bound<2>(two, causal, two_int8);
    check_int8_qk_bound<1>(one, causal, forward<double, 1>(ref, one, causal, logits_unquantized, inference_dtype::int8));
    if (N > 1) CHECK(difference(two_int8, forward<double, 2>(ref, two, causal, logits_unquantized)) > 1e-6);
  }
  // double computes on the float product whatever the CPU.
  const attention_inputs in(2, 1, 70, 70, 2, 1, 73);
  CHECK(difference(forward<double, 2>(fast, in, true, logits_unquantized, inference_dtype::int8),
                   forward<double, 2>(ref, in, true, logits_unquantized, inference_dtype::int8)) <=
        testing::tolerance<double>::forward);
}

TEST_CASE("low-bit: int8 Q·Kᵀ modules: inference only, and refused where it cannot run") {
  MultiHead<float, 8, policy::simd> module({.d_model = 32, .heads = 2, .qk_dtype = inference_dtype::int8});
  const auto x = test_support::random_tensor<float, 3>({1, 4, 32}, 3);
  Tensor<float, 3> y(x.shape()), dx(x.shape());
  decltype(module)::saved_type saved;
  module.forward(x, y.view(), saved);
  test_support::expect_input_error([&] { module.backward(x, y, saved, dx.view()); }, "MultiHead::backward",
                                   "config.qk_dtype", "int8 is for inference", "int8");
  const attention_inputs wide(1, 1, 3, 3, 1, 1, 1, 1042);
  test_support::expect_input_error(
      [&] { forward<float, 1>(policy::simd{}, wide, true, logits_unquantized, inference_dtype::int8); },
      "attention_forward", "q", "d <= 1040", "1042");
}
