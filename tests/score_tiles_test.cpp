// The fused attention's score tiles on the CPU's matrix instructions, on
// every CPU: AMX's tile model (amx_tile_model.hpp) against the instructions'
// definitions on small cases worked by hand; the int8 score tile on it against
// the exact sums' bits; the bfloat16 score tiles (AMX's on the model,
// vdpbf16ps's on a scalar model) against the float product; and the
// instructions themselves where this CPU and OS run them; and the bfloat16
// backward's S and dP on those tiles against its float products.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/policy/simd/amx_tile_model.hpp>
#include <difftx/testing/compare.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/amx_models.hpp"
#include "support/helpers.hpp"

using namespace difftx;
using simd_detail::amx_config;
using simd_detail::amx_tile_model;

namespace {

// vdpbf16ps lane by lane on the same layouts: each pair's high product first.
void modelled_pairs_score_tile(index_t d2, const Eigen::bfloat16* q2, const Eigen::bfloat16* k2, float scale, float* s) {
  for (index_t i = 0; i < 64; ++i)
    for (index_t t = 0; t < 64; ++t) {
      float sum = 0;
      for (index_t p = 0; p < d2; ++p) {
        sum += float(q2[i * 2 * d2 + 2 * p + 1]) * float(k2[(p * 64 + t) * 2 + 1]);
        sum += float(q2[i * 2 * d2 + 2 * p]) * float(k2[(p * 64 + t) * 2]);
      }
      s[i * 64 + t] = sum * scale;
    }
}

std::uint16_t bf16_bits(float x) { return std::bit_cast<std::uint16_t>(Eigen::bfloat16(x)); }

}  // namespace

TEST_CASE("score tiles: the AMX tile model computes tdpbusd and tdpbf16ps as defined") {
  amx_tile_model tiles;
  amx_config config;
  config.shape(0, 2, 8);  // C: 2 rows x 2 lanes
  config.shape(1, 2, 8);  // A: 2 rows x 2 groups
  config.shape(2, 2, 8);  // B: 2 groups x 2 lanes
  tiles.configure(config);
  SUBCASE("u8·s8 into int32, four products a lane, wrapping") {
    // A's bytes are unsigned (255 is 255), B's signed (255 is -1).
    const std::uint8_t a[2][8] = {{1, 2, 3, 4, 5, 6, 7, 8}, {255, 255, 255, 255, 255, 255, 255, 255}};
    const std::uint8_t b[2][8] = {{1, 1, 1, 1, 2, 0, 0, 0}, {1, 0, 0, 0, 255, 255, 255, 255}};
    const std::int32_t start[2][2] = {{10, 20}, {2147483647, 0}};
    tiles.load<0>(start, 8);
    tiles.load<1>(a, 8);
    tiles.load<2>(b, 8);
    tiles.dot_u8s8<0, 1, 2>();
    std::int32_t c[2][2];
    tiles.store<0>(c, 8);
    // Lane (m, n) adds Σ_k Σ_j a[m][4k+j]·b[k][4n+j].
    CHECK(c[0][0] == 10 + (1 + 2 + 3 + 4) + 5);
    CHECK(c[0][1] == 20 + 2 * 1 - (5 + 6 + 7 + 8));
    CHECK(c[1][0] == std::bit_cast<std::int32_t>(std::uint32_t{2147483647} + 4 * 255 + 255));  // wrapped
    CHECK(c[1][1] == 255 * 2 - 4 * 255);
  }
  SUBCASE("bfloat16 pairs into float, denormals read as zero and flushed") {
    // Lane (m, n) adds Σ_k a[m][2k]·b[k][2n] + a[m][2k+1]·b[k][2n+1], in turn.
    const std::uint16_t a[2][4] = {{bf16_bits(1.5f), bf16_bits(-2.0f), bf16_bits(0.25f), bf16_bits(3.0f)},
                                   {bf16_bits(1e-39f), 0, 0, bf16_bits(1e-20f)}};
    const std::uint16_t b[2][4] = {{bf16_bits(1048576.0f), bf16_bits(1.0f), bf16_bits(4.0f), bf16_bits(1.0f)},
                                   {bf16_bits(8.0f), 0, bf16_bits(-1.0f), bf16_bits(1e-20f)}};
    const float start[2][2] = {{1.0f, 0.0f}, {0.0f, 0.0f}};
    tiles.load<0>(start, 8);
    tiles.load<1>(a, 8);
    tiles.load<2>(b, 8);
    tiles.dot_bf16<0, 1, 2>();
    float c[2][2];
    tiles.store<0>(c, 8);
    const float tiny = float(Eigen::bfloat16(1e-20f));
    CHECK(c[0][0] == 1.0f + 1.5f * 1048576.0f - 2.0f + 0.25f * 8.0f);
    CHECK(c[0][1] == 1.5f * 4.0f - 2.0f - 0.25f + 3.0f * tiny);
    CHECK(c[1][0] == 0.0f);  // the denormal 1e-39 read as zero (else 1e-39 · 2^20, a normal float)
    CHECK(c[1][1] == 0.0f);  // 1e-20 · 1e-20 flushed
  }
  SUBCASE("a product on shapes that do not fit is refused, as the CPU faults") {
    config.shape(2, 3, 8);  // B's rows must be A's groups (2)
    tiles.configure(config);
    CHECK_THROWS_AS((tiles.dot_u8s8<0, 1, 2>()), std::logic_error);
  }
  SUBCASE("rows past a tile's shape load as zero and are not stored") {
    const std::int32_t rows[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    std::int32_t out[3][2] = {{0, 0}, {0, 0}, {-1, -1}};
    tiles.load<0>(rows, 8);
    tiles.store<0>(out, 8);
    CHECK(out[1][1] == 4);
    CHECK(out[2][0] == -1);
  }
}

TEST_CASE("score tiles: int8 on AMX gives the exact sums' bits, at every depth step") {
  std::vector<std::pair<std::string, simd_detail::score_tile_fn>> kernels{{"modelled tdpbusd", test_support::modelled_amx_int8_score_tile}};
  if (simd_detail::amx_runs(simd_detail::amx_product::u8s8))
    kernels.emplace_back("tdpbusd", simd_detail::int8_score_tile<float>(true));
  else
    MESSAGE("this CPU or OS runs no AMX-INT8: the int8 score tile ran on the tile model only");
  random_stream rng(11);
  // d4 = 16 and 32 step by a whole tile row, 24 by 12 groups, 17 by one, 2 by two.
  for (index_t d4 : {2, 16, 17, 24, 32}) {
    INFO("d4 = " << d4);
    std::vector<std::int8_t> q8(static_cast<std::size_t>(64 * 4 * d4)), k8(static_cast<std::size_t>(d4 * 64 * 4));
    std::vector<std::int32_t> corr(64);
    std::vector<float> q_steps(64), k_steps(64), s(64 * 64), exact(64 * 64);
    for (auto& x : q8) x = static_cast<std::int8_t>(rng.uniform(-128, 127.99));  // offset queries: any byte
    for (auto& x : k8) x = static_cast<std::int8_t>(rng.uniform(-127, 127.99));
    for (index_t i = 0; i < 64; ++i) {
      q_steps[static_cast<std::size_t>(i)] = static_cast<float>(rng.uniform(0.001, 0.01));
      k_steps[static_cast<std::size_t>(i)] = static_cast<float>(rng.uniform(0.001, 0.01));
    }
    for (index_t t = 0; t < 64; ++t) {
      std::int32_t sum = 0;
      for (index_t c = 0; c < 4 * d4; ++c) sum += k8[static_cast<std::size_t>((c / 4 * 64 + t) * 4 + c % 4)];
      corr[static_cast<std::size_t>(t)] = 128 * sum;
    }
    for (index_t i = 0; i < 64; ++i)
      for (index_t t = 0; t < 64; ++t) {
        std::int64_t sum = 0;  // Σ_c (q + 128 - 128)·k: the signed query times the key
        for (index_t c = 0; c < 4 * d4; ++c)
          sum += (std::int64_t{static_cast<std::uint8_t>(q8[static_cast<std::size_t>(i * 4 * d4 + c)])} - 128) *
                 k8[static_cast<std::size_t>((c / 4 * 64 + t) * 4 + c % 4)];
        exact[static_cast<std::size_t>(i * 64 + t)] =
            float(static_cast<std::int32_t>(sum)) * q_steps[static_cast<std::size_t>(i)] * k_steps[static_cast<std::size_t>(t)];
      }
    for (const auto& [name, kernel] : kernels) {
      INFO(name);
      kernel(d4, q8.data(), k8.data(), corr.data(), q_steps.data(), k_steps.data(), s.data());
      CHECK(std::memcmp(s.data(), exact.data(), s.size() * sizeof(float)) == 0);
    }
  }
}

namespace {

// The bfloat16 forward on a score kernel (nullptr: the float product) for
// q [B,N,H,Maps,d], k [B,M,G,Maps,d], v [B,M,G,16]: o, and lse in float.
template <int Maps>
std::pair<Tensor<Eigen::bfloat16, 4>, Tensor<float, 4>> bf16_forward(index_t N, index_t M, index_t d, bool causal,
                                                                       simd_detail::bf16_score_tile_fn kernel) {
  const index_t B = 2, H = 4, G = 2;
  const auto q = test_support::random_tensor<Eigen::bfloat16, 5>({B, N, H, Maps, d}, 21);
  const auto k = test_support::random_tensor<Eigen::bfloat16, 5>({B, M, G, Maps, d}, 22);
  const auto v = test_support::random_tensor<Eigen::bfloat16, 4>({B, M, G, 16}, 23);
  Tensor<float, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{});
  if (Maps == 2) lambda(0) = 0.375f;
  Tensor<Eigen::bfloat16, 4> o({B, N, H, 16}), o2(Maps == 2 ? shape_t<4>{B, N, H, 16} : shape_t<4>{});
  Tensor<float, 4> lse({B, H, Maps, N});
  simd_detail::fused_attention_forward<Maps, Eigen::bfloat16>(
      policy::simd{2}, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), causal, o.view(), o2.view(),
      lse.view(), logits_unquantized, inference_dtype::same, simd_detail::score_kernels{nullptr, kernel});
  return {std::move(o), std::move(lse)};
}

template <int Maps>
void check_bf16_scores(const std::string& name, simd_detail::bf16_score_tile_fn kernel) {
  // d = 64 steps by 16 pairs, 40 by 10, 6 by 3, 7 pads a pair; N = 1, a
  // ragged tile and three tiles; M keys other than N queries (the queries the
  // last N positions when causal), so query and key blocks are counted apart.
  for (auto [N, M, causal, d] :
       {std::tuple<index_t, index_t, bool, index_t>{1, 1, true, 64}, {70, 70, true, 64}, {70, 70, false, 40},
        {150, 150, true, 6}, {9, 9, false, 7}, {70, 150, true, 64}, {130, 65, false, 40}}) {
    INFO(name << ", Maps = " << Maps << ", N = " << N << ", M = " << M << (causal ? " causal" : " non-causal")
              << ", d = " << d);
    const auto [o, lse] = bf16_forward<Maps>(N, M, d, causal, kernel);
    const auto [o_float, lse_float] = bf16_forward<Maps>(N, M, d, causal, nullptr);
    // The scores differ from the float product's only in the order of float
    // sums: lse (float, never rounded to bfloat16) within float's forward
    // bar; o within bfloat16's (a last-bit flip of its rounding).
    CHECK(testing::normwise_difference(lse.data(), lse_float.data(), lse.size()) <= testing::tolerance<float>::forward);
    CHECK(testing::normwise_difference(o.data(), o_float.data(), o.size()) <=
          testing::tolerance<Eigen::bfloat16>::storage);
  }
}

}  // namespace

TEST_CASE("score tiles: bfloat16 attention's on tdpbf16ps and vdpbf16ps match the float product's") {
  const std::vector<std::pair<std::string, simd_detail::bf16_score_tile_fn>> models{
      {"modelled tdpbf16ps", test_support::modelled_amx_bf16_score_tile}, {"modelled vdpbf16ps", modelled_pairs_score_tile}};
  for (const auto& [name, kernel] : models) {
    check_bf16_scores<1>(name, kernel);
    check_bf16_scores<2>(name, kernel);
  }
  if (const auto kernel = simd_detail::bf16_score_tile(true, false)) {
    check_bf16_scores<1>("tdpbf16ps", kernel);
    check_bf16_scores<2>("tdpbf16ps", kernel);
  } else {
    MESSAGE("this CPU or OS runs no AMX-BF16: its score tile ran on the tile model only");
  }
  if (const auto kernel = simd_detail::bf16_score_tile(false, true)) {
    check_bf16_scores<1>("vdpbf16ps", kernel);
    check_bf16_scores<2>("vdpbf16ps", kernel);
  } else {
    MESSAGE("this CPU has no AVX512_BF16: the vdpbf16ps score tile ran on its model only");
  }
  // AMX asked for by default (it runs where granted); vdpbf16ps only when the bfloat16 products take it.
  CHECK(policy::simd{}.amx_tiles);
  const bool none_unasked = simd_detail::bf16_score_tile(false, false) == nullptr;
  CHECK(none_unasked);
}

namespace {

// The bfloat16 backward's results: dq, dk, dv and dλ.
struct bf16_gradients {
  Tensor<Eigen::bfloat16, 5> dq, dk;
  Tensor<Eigen::bfloat16, 4> dv;
  float dlambda;
};

// The bfloat16 backward with S and dP on a score kernel (nullptr: the float
// products) for q [B,N,H,Maps,d], k [B,M,G,Maps,d], v [B,M,G,dv] on
// `threads` threads, after a float-product forward (the same o and lse for
// either kernel).
template <int Maps>
bf16_gradients bf16_backward(index_t N, index_t M, index_t d, index_t dv, bool causal, int threads,
                             simd_detail::bf16_score_tile_fn kernel) {
  const index_t B = 2, H = 4, G = 2;
  const auto q = test_support::random_tensor<Eigen::bfloat16, 5>({B, N, H, Maps, d}, 31);
  const auto k = test_support::random_tensor<Eigen::bfloat16, 5>({B, M, G, Maps, d}, 32);
  const auto v = test_support::random_tensor<Eigen::bfloat16, 4>({B, M, G, dv}, 33);
  const auto d_o = test_support::random_tensor<Eigen::bfloat16, 4>({B, N, H, dv}, 34);
  Tensor<float, 1> lambda(Maps == 2 ? shape_t<1>{1} : shape_t<1>{});
  if (Maps == 2) lambda(0) = 0.375f;
  Tensor<Eigen::bfloat16, 4> o({B, N, H, dv}), o2(Maps == 2 ? shape_t<4>{B, N, H, dv} : shape_t<4>{});
  Tensor<float, 4> lse({B, H, Maps, N});
  const policy::simd p{threads};
  simd_detail::fused_attention_forward<Maps, Eigen::bfloat16>(
      p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), causal, o.view(), o2.view(), lse.view(),
      logits_unquantized, inference_dtype::same, simd_detail::score_kernels{});
  bf16_gradients g{Tensor<Eigen::bfloat16, 5>(q.shape()), Tensor<Eigen::bfloat16, 5>(k.shape()),
                   Tensor<Eigen::bfloat16, 4>(v.shape()), 0.0f};
  Tensor<float, 1> dlambda(lambda.shape());
  simd_detail::fused_attention_backward<Maps, Eigen::bfloat16>(
      p, q.const_view(), k.const_view(), v.const_view(), lambda.const_view(), causal, o.const_view(), o2.const_view(),
      lse.const_view(), d_o.const_view(), g.dq.view(), g.dk.view(), g.dv.view(), dlambda.view(), kernel);
  if (Maps == 2) g.dlambda = dlambda(0);
  return g;
}

// Elements of a (bfloat16) farther from b than one bfloat16 step at their
// magnitude plus `bar` times b's largest magnitude, or 1 if that is smaller:
// with one key (N = 1) P = 1, so dP - D = dO·V - dO·O cancels, and dq and dk
// are zero in exact arithmetic and rounding noise in float, while their terms
// are O(1) (unit normal inputs).
template <class Tensor_>
index_t beyond_one_step(const Tensor_& a, const Tensor_& b, double bar) {
  const double scale = std::max(1.0, testing::max_abs(b.data(), b.size()));
  index_t count = 0;
  for (index_t e = 0; e < a.size(); ++e) {
    const double x = double(a.data()[e]), y = double(b.data()[e]), magnitude = std::max(std::abs(x), std::abs(y));
    // 8 bits of significand; ilogb(0) is INT_MIN, so zeros get no step
    const double step = magnitude > 0 ? std::ldexp(1.0, std::ilogb(magnitude) - 7) : 0.0;
    if (std::abs(x - y) > step + bar * scale) ++count;
  }
  return count;
}

using named_tile_kernels = std::vector<std::pair<std::string, simd_detail::bf16_score_tile_fn>>;

template <int Maps>
void check_bf16_backward(const named_tile_kernels& kernels) {
  // As check_bf16_scores, with dv = d and 2d (7: an odd width, a zero pair
  // lane); 2 threads take whole (batch row, group) pairs, 3 share each pair's
  // key blocks. The float products' gradients, made once a shape, against
  // each kernel's.
  for (auto [N, M, causal, d] :
       {std::tuple<index_t, index_t, bool, index_t>{1, 1, true, 64}, {70, 70, true, 64}, {70, 70, false, 40},
        {150, 150, true, 6}, {9, 9, false, 7}, {70, 150, true, 64}, {130, 65, false, 40}})
    for (index_t dv : {d, 2 * d})
      for (int threads : {2, 3}) {
        const auto floats = bf16_backward<Maps>(N, M, d, dv, causal, threads, nullptr);
        for (const auto& [name, kernel] : kernels) {
          INFO(name << ", Maps = " << Maps << ", N = " << N << ", M = " << M << ", "
                    << std::string(causal ? "causal" : "non-causal") << ", d = " << d << ", dv = " << dv << ", "
                    << threads << " threads");
          const auto pairs = bf16_backward<Maps>(N, M, d, dv, causal, threads, kernel);
          // S and dP differ from the float products only in the order of float
          // sums (each bfloat16 product is exact in float), so the float
          // gradients differ within float's backward bar, and rounding them to
          // bfloat16 to store them may flip a last bit: one bfloat16 step.
          constexpr double bar = testing::tolerance<float>::backward;
          CHECK(beyond_one_step(pairs.dq, floats.dq, bar) == 0);
          CHECK(beyond_one_step(pairs.dk, floats.dk, bar) == 0);
          CHECK(beyond_one_step(pairs.dv, floats.dv, bar) == 0);
          // dλ = -Σ rowsum(dO ⊙ O₂) reads neither product; only the order in
          // which the threads' partial sums meet may differ.
          CHECK(std::abs(pairs.dlambda - floats.dlambda) <= bar * std::abs(floats.dlambda));
        }
      }
}

}  // namespace

TEST_CASE("score tiles: bfloat16 attention's backward on tdpbf16ps and vdpbf16ps matches the float products'") {
  named_tile_kernels kernels{{"modelled tdpbf16ps", test_support::modelled_amx_bf16_score_tile},
                             {"modelled vdpbf16ps", modelled_pairs_score_tile}};
  if (const auto kernel = simd_detail::bf16_score_tile(true, false))
    kernels.emplace_back("tdpbf16ps", kernel);
  else
    MESSAGE("this CPU or OS runs no AMX-BF16: the backward's tiles ran on the tile model only");
  if (const auto kernel = simd_detail::bf16_score_tile(false, true))
    kernels.emplace_back("vdpbf16ps", kernel);
  else
    MESSAGE("this CPU has no AVX512_BF16: the backward's vdpbf16ps tiles ran on the model only");
  check_bf16_backward<1>(kernels);
  check_bf16_backward<2>(kernels);
}
