// policy::simd against the reference policy (in long double) over a sweep of
// shapes: N = 1 and N not a multiple of the 64-wide tiles, grouped heads,
// non-causal, B > 1, attention logits up to ±1e4; forward and every gradient,
// in float, double, float16 and bfloat16, within difftx::testing::tolerance.
// Results must not depend on the thread count beyond that tolerance.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <difftx/difftx.hpp>
#include <difftx/policy/simd.hpp>
#include <difftx/policy/simd/amx_tile_model.hpp>
#include <difftx/policy/simd/stream_prefetch.hpp>
#include <difftx/testing/tolerance.hpp>

#include "support/compare_modules.hpp"

using namespace difftx;

namespace {

struct shape_case {
  index_t batch, seq, heads, kv_heads;
  bool causal;
};
// N = 1, N = 64 ± 1, N spanning three tiles with a ragged end, grouped and not.
const shape_case cases[] = {
    {1, 1, 2, 2, true}, {2, 63, 4, 2, true}, {1, 65, 2, 1, false}, {2, 37, 4, 4, false}, {1, 150, 4, 2, true},
};

std::string describe(const shape_case& c) {
  return "B=" + std::to_string(c.batch) + " N=" + std::to_string(c.seq) + " h=" + std::to_string(c.heads) +
         " g=" + std::to_string(c.kv_heads) + (c.causal ? " causal" : " non-causal");
}

// logit_scale: the largest |attention logit| L when it is far from O(1). A
// logit carries an absolute rounding error ~L·u, which exp turns into a
// relative error L·u of its probability, in any implementation: the bars grow
// by L·u (the softmax's own condition number), not by a fudge factor.
template <class T, class Make>
void check_against_reference(const std::string& label, Make make, const shape_t<3>& shape, double input_scale = 1.0,
                             double logit_scale = 0.0) {
  auto oracle = make.template operator()<long double, policy::reference>();
  auto candidate = make.template operator()<T, policy::simd>();
  const auto e = test_support::compare_modules(candidate, oracle, shape, 7, input_scale);
  constexpr double u = scalar_traits<T>::epsilon;
  INFO(label << " " << scalar_traits<T>::name << ": forward " << e.forward / u << " u, backward " << e.backward / u
             << " u (worst " << e.worst_backward << ")");
  CHECK(e.forward <= testing::tolerance<T>::forward + logit_scale * u);
  CHECK(e.backward <= testing::tolerance<T>::backward + logit_scale * u);
}

template <class Make>
void check_all_types(const std::string& label, Make make, const shape_t<3>& shape, double input_scale = 1.0) {
  check_against_reference<float>(label, make, shape, input_scale);
  check_against_reference<double>(label, make, shape, input_scale);
  check_against_reference<Eigen::half>(label, make, shape, input_scale);
  check_against_reference<Eigen::bfloat16>(label, make, shape, input_scale);
}

}  // namespace

TEST_CASE("simd: RMSNorm and SwiGLU") {
  for (index_t C : {5, 16, 67}) {
    check_all_types("RMSNorm C=" + std::to_string(C), [C]<class U, class P>() { return RMSNorm<U, P>(C, 1e-5, 1.0, P{}); },
                    {2, 9, C});
    check_all_types("SwiGLU C=" + std::to_string(C), [C]<class U, class P>() { return SwiGLU<U, P>(C, 2 * C + 3, P{}); },
                    {2, 9, C});
  }
}

// float16/bfloat16 products go through reduced_gemm's blocks (gemm.hpp): sizes
// that cross every block edge (66 rows, 128 columns, depth 256 and 512, 16-wide
// panels, 4-wide dot blocks, vector tails), both write modes of dx, against
// the reference in long double on the same values; float and double through
// Eigen's blocks and decoding's streamed rows.
template <class T>
void check_reduced_linear(index_t M, index_t N, index_t K, const policy::simd& fast = policy::simd{2}) {
  using L = long double;
  const auto x = test_support::random_tensor<T, 2>({M, K}, 11), w = test_support::random_tensor<T, 2>({N, K}, 12),
             dy = test_support::random_tensor<T, 2>({M, N}, 13), start = test_support::random_tensor<T, 2>({M, K}, 14),
             dw0 = test_support::random_tensor<T, 2>({N, K}, 15);
  const auto xl = test_support::convert<L>(x), wl = test_support::convert<L>(w), dyl = test_support::convert<L>(dy);
  Tensor<T, 2> y({M, N}), dx = start, dx_added = start, dw = dw0, dw_added = dw0;
  Tensor<L, 2> y_ref({M, N}), dx_ref({M, K}), dx_added_ref = test_support::convert<L>(start), dw_ref = test_support::convert<L>(dw0),
                            dw_added_ref = dw_ref;
  linear_forward(fast, x.const_view(), w.const_view(), y.view());
  linear_backward(fast, x.const_view(), w.const_view(), dy.const_view(), dx.view(), dw.view());
  linear_backward(fast, x.const_view(), w.const_view(), dy.const_view(), dx_added.view(), dw_added.view(), write_mode::add);
  const policy::reference ref;
  linear_forward(ref, xl.const_view(), wl.const_view(), y_ref.view());
  linear_backward(ref, xl.const_view(), wl.const_view(), dyl.const_view(), dx_ref.view(), dw_ref.view());
  linear_backward(ref, xl.const_view(), wl.const_view(), dyl.const_view(), dx_added_ref.view(), dw_added_ref.view(),
                  write_mode::add);
  const double bar = testing::tolerance<T>::forward;
  INFO(scalar_traits<T>::name << " M=" << M << " N=" << N << " K=" << K << " matmuls "
                              << (fast.matmuls == policy::simd::matmul_library::onednn ? "onednn" : "not forced"));
  CHECK(testing::normwise_difference(y.data(), y_ref.data(), y.size()) <= bar);
  CHECK(testing::normwise_difference(dx.data(), dx_ref.data(), dx.size()) <= bar);
  CHECK(testing::normwise_difference(dx_added.data(), dx_added_ref.data(), dx.size()) <= bar);
  CHECK(testing::normwise_difference(dw.data(), dw_ref.data(), dw.size()) <= bar);
  CHECK(testing::normwise_difference(dw_added.data(), dw_added_ref.data(), dw.size()) <= bar);
}

TEST_CASE("simd: float16 and bfloat16 linear across the product's blocks") {
  // M <= 4 is decoding's matrix-vector product; an even K reads bfloat16 rows as pairs (bf16_pair_dots),
  // here with and without a tail past the last whole 2W and with rows past the last whole W.
  for (auto [M, N, K] : {std::array<index_t, 3>{1, 300, 77}, {133, 261, 530}, {67, 17, 1030}, {5, 3, 2}, {3, 7, 19},
                         {1, 300, 78}, {4, 33, 64}, {2, 17, 2}, {1, 40, 98}, {3, 16, 96}, {1, 5, 34}}) {
    check_reduced_linear<Eigen::bfloat16>(M, N, K);
    check_reduced_linear<Eigen::half>(M, N, K);
  }
}

TEST_CASE("simd: float and double linear, decoding's streamed rows among them") {
  // M <= 4 streams w's rows (streamed_dots): depths with and without the eight-vector
  // steps, single-vector steps and a scalar end; rows in whole and ragged slices, pairs
  // of rows and a last row alone.
  for (auto [M, N, K] : {std::array<index_t, 3>{1, 300, 77}, {4, 33, 2048}, {2, 17, 130}, {3, 16, 1}, {1, 1000, 515},
                         {5, 40, 64}, {67, 17, 1030}}) {
    check_reduced_linear<float>(M, N, K);
    check_reduced_linear<double>(M, N, K);
  }
}

// Decoding's products read w's rows one at a time or side by side
// (policy::stream_order, chosen by the CPU): each row's sum is added in the
// same order either way, so both orders give the same bits: float and double
// (two rows side by side), bfloat16 on vdpbf16ps where the CPU has it (two)
// and int8 weights (four). Shapes: 1 and 4 rows of x, rows in whole and
// ragged groups (a last row alone), depths with and without a ragged end.
template <class Weights, class T>
void check_stream_orders(const Weights& w, index_t N, index_t K, policy::simd p) {
  p.threads = 2;
  p.matmuls = policy::simd::matmul_library::difftx;
  for (const index_t M : {1, 4}) {
    const auto x = test_support::random_tensor<T, 2>({M, K}, 11);
    Tensor<T, 2> one({M, N}), side({M, N});
    p.streaming = policy::stream_order::one_row_at_a_time;
    linear_forward(p, x.const_view(), w, one.view());
    p.streaming = policy::stream_order::rows_side_by_side;
    linear_forward(p, x.const_view(), w, side.view());
    INFO(scalar_traits<T>::name << " M=" << M << " N=" << N << " K=" << K);
    CHECK(std::memcmp(one.data(), side.data(), sizeof(T) * static_cast<std::size_t>(one.size())) == 0);
    CHECK(std::any_of(one.data(), one.data() + one.size(), [](T v) { return double(v) != 0; }));
  }
}

TEST_CASE("simd: decoding's products give the same bits reading w's rows one at a time or side by side") {
  for (auto [N, K] : {std::array<index_t, 2>{37, 77}, {130, 1030}, {7, 2048}}) {
    check_stream_orders<cview<float, 2>, float>(test_support::random_tensor<float, 2>({N, K}, 5).const_view(), N, K, {});
    check_stream_orders<cview<double, 2>, double>(test_support::random_tensor<double, 2>({N, K}, 5).const_view(), N, K,
                                                  {});
    const auto wb = test_support::random_tensor<Eigen::bfloat16, 2>({N, K}, 5);
    check_stream_orders<cview<Eigen::bfloat16, 2>, Eigen::bfloat16>(
        wb.const_view(), N, K, {.bf16_products = policy::bf16_product::dot_instructions});
    const auto wf = test_support::random_tensor<float, 2>({N, K}, 6);
    int8_rows<float> w8(N, K);
    for (index_t r = 0; r < N; ++r) w8.set_row(r, wf.data() + r * K);
    check_stream_orders<int8_rows<float>, float>(w8, N, K, {});
  }
  if (policy::simd{.bf16_products = policy::bf16_product::dot_instructions}.bf16_decoding_product_used() !=
      policy::bf16_product::dot_instructions)
    MESSAGE("this CPU has no AVX512_BF16: bfloat16 compared its converting product, which reads one row at a time");
}

// Each library forced: oneDNN's matmul (where built; float16 where the CPU has
// AVX512_FP16, else difftx's product) and difftx's own, rows past decoding's.
TEST_CASE("simd: linear on oneDNN's matmul and on difftx's own products") {
  using library = policy::simd::matmul_library;
  for (const auto matmuls : {library::difftx, library::onednn})
    for (auto [M, N, K] : {std::array<index_t, 3>{133, 261, 530}, {67, 17, 1030}, {5, 3, 2}, {64, 128, 96}}) {
      policy::simd p{2};
      p.matmuls = matmuls;
      check_reduced_linear<float>(M, N, K, p);
      check_reduced_linear<Eigen::bfloat16>(M, N, K, p);
      check_reduced_linear<Eigen::half>(M, N, K, p);
    }
#if defined(DIFFTX_ONEDNN)
  const policy::simd forced{.matmuls = library::onednn};
  MESSAGE("oneDNN's kernels here: float32 " << forced.matmul_kernel<float>() << ", bfloat16 "
                                            << forced.matmul_kernel<Eigen::bfloat16>() << ", float16 "
                                            << forced.matmul_kernel<Eigen::half>());
#else
  MESSAGE("built without oneDNN: matmuls = onednn ran difftx's own products");
#endif
}

// Packed weights (Linear::add_packed_weights): oneDNN reads W in its own
// layout, made once. int8 sums are exact either way, so int8 weights give the
// plain product's bits; float and bfloat16 land within their forward bar of
// the plain product (checked against the reference above). N = 4166 makes
// int8's two blocks of packed columns (int8_packed_columns), M = 1100 its two
// chunks of rows, M = 5 the fewest rows oneDNN takes when forced. The packed
// copy is packed before quantize_weights, which packs the int8 rows again.
// Since a product oneDNN declines on the packed layout falls back to W as it
// lies, oneDNN must take each of those products on the packed blocks
// themselves. A packed Linear refuses a backward, a forward refuses a copy
// packed from another type, and with matmuls = difftx nothing is packed.
template <class T>
void check_packed_linear(bool int8) {
  using library = policy::simd::matmul_library;
  constexpr index_t K = 96, N = 4166;
  policy::simd p{2};
  p.matmuls = library::onednn;
  Linear<T, policy::simd> packed(K, N, p), plain(K, N, p);
  random_stream a(7), b(7);
  packed.reset_parameters(a);
  plain.reset_parameters(b);
  packed.add_packed_weights();  // before quantize_weights: int8 rows are packed again from it
  if (int8) {
    plain.quantize_weights();
    packed.quantize_weights();
  }
  INFO(scalar_traits<T>::name << (int8 ? std::string(" int8 weights") : std::string()) << ", packed bytes "
                              << packed.packed_bytes());
#if !defined(DIFFTX_ONEDNN)
  CHECK(packed.packed_bytes() == 0);
#endif
  for (index_t M : {5, 70, 1100}) {
    const auto x = test_support::random_tensor<T, 3>({1, M, K}, 8);
    Tensor<T, 3> y({1, M, N}), y_plain({1, M, N});
    typename Linear<T, policy::simd>::saved_type s, s_plain;
    packed.forward(x, y.view(), s);
    plain.forward(x, y_plain.view(), s_plain);
    INFO("M=" << M);
    if (int8)
      CHECK(testing::normwise_difference(y.data(), y_plain.data(), y.size()) == 0.0);
    else
      CHECK(testing::normwise_difference(y.data(), y_plain.data(), y.size()) <= testing::tolerance<T>::forward);
  }
  if (!int8 && packed.packed_bytes() > 0)  // int8 weights are refused as such first
    test_support::expect_input_error([&] { packed.require_trainable("Linear::backward"); }, "Linear::backward",
                                     "weights", "W alone", "W and its packed copy");
#if defined(DIFFTX_ONEDNN)
  const auto w = test_support::random_tensor<T, 2>({N, K}, 9);
  const int8_rows<accum_t<T>> w8 = simd_detail::quantized_rows<T>(p, w.const_view());
  const auto blocks = int8 ? pack_weights(p, w8) : pack_weights(p, w.const_view());
  // The Linear holds a packed copy exactly where oneDNN's kernel for its products reads W in a layout of its own
  // (asked of oneDNN on this CPU: brgemm's blocks where it has one), and then all of W (int8: its rows).
  CHECK((packed.packed_bytes() > 0) == (blocks != nullptr));
  if (blocks) CHECK(packed.packed_bytes() >= static_cast<std::size_t>(N * (int8 ? 128 : K * sizeof(T))));
  if (blocks)
    for (index_t M : {5, 70, 1100}) {
      const index_t depth = int8 ? w8.padded : K;
      const std::vector<std::uint8_t> rows(static_cast<std::size_t>(M * depth * sizeof(T)), 1);
      std::vector<std::int32_t> c(static_cast<std::size_t>(M * blocks->block_columns));
      for (const auto& block : blocks->blocks)
        CHECK(simd_detail::onednn_matmuls::instance().run(M, {rows.data(), depth, 1}, block, c.data(), block.N, false, 2));
    }
  if (!int8 && blocks && !std::is_same_v<T, float>) {
    const auto w32 = test_support::random_tensor<float, 2>({N, K}, 9);
    const auto x = test_support::random_tensor<T, 2>({5, K}, 8);
    Tensor<T, 2> y({5, N});
    if (const auto float_blocks = pack_weights(p, w32.const_view()))
      test_support::expect_input_error(
          [&] { linear_forward(p, x.const_view(), w.const_view(), *float_blocks, y.view()); }, "linear_forward",
          "packed", "blocks packed by pack_weights from " + std::string(scalar_traits<T>::name), "another type");
    CHECK(std::all_of(y.data(), y.data() + y.size(), [](T v) { return v == T(0); }));
  }
#endif
  policy::simd own{2};
  own.matmuls = library::difftx;
  Linear<T, policy::simd> unpacked(K, N, own);
  unpacked.add_packed_weights();
  CHECK(unpacked.packed_bytes() == 0);
}

TEST_CASE("simd: packed weights for oneDNN give W's products") {
  for (bool int8 : {false, true}) {
    check_packed_linear<float>(int8);
    check_packed_linear<Eigen::bfloat16>(int8);
  }
}

// Decoding panels (ops/decoding_panels.hpp): the reference reads them in
// linear_forward's order (the same bits as from w), simd sums each chunk of
// panels into a partial y and adds those in chunk order (the same bits for
// any thread count), within each type's forward bar of the exact product
// (float16 and bfloat16: panels widened in registers, sums in float, one
// rounding into y). Depths with a ragged last panel, past one chunk (32
// panels) and in many; rows with a ragged last block; one to four rows of x.
template <class T>
void check_decoding_panels(index_t M, index_t N, index_t K) {
  using L = long double;
  const auto x = test_support::random_tensor<T, 2>({M, K}, 21), w = test_support::random_tensor<T, 2>({N, K}, 22);
  const decoding_panels<T> panels(w.data(), N, K);
  Tensor<L, 2> y_exact({M, N});
  linear_forward(policy::reference{}, test_support::convert<L>(x).const_view(), test_support::convert<L>(w).const_view(),
                 y_exact.view());
  Tensor<T, 2> y_ref({M, N}), y_ref_panels({M, N}), y_one({M, N});
  linear_forward(policy::reference{}, x.const_view(), w.const_view(), y_ref.view());
  linear_forward(policy::reference{}, x.const_view(), panels, y_ref_panels.view());
  linear_forward(policy::simd{1}, x.const_view(), panels, y_one.view());
  INFO(scalar_traits<T>::name << " M=" << M << " N=" << N << " K=" << K);
  CHECK(testing::normwise_difference(y_ref_panels.data(), y_ref.data(), y_ref.size()) == 0.0);
  CHECK(testing::normwise_difference(y_one.data(), y_exact.data(), y_one.size()) <= testing::tolerance<T>::forward);
  for (int threads : {2, 3}) {
    Tensor<T, 2> y({M, N});
    linear_forward(policy::simd{threads}, x.const_view(), panels, y.view());
    CHECK(testing::normwise_difference(y.data(), y_one.data(), y.size()) == 0.0);
  }
}

TEST_CASE("simd: decoding panels against the reference, the same bits whatever the threads") {
  for (auto [M, N, K] : {std::array<index_t, 3>{1, 300, 77}, {4, 33, 5000}, {2, 17, 130}, {3, 16, 1}, {1, 1000, 515},
                         {1, 1, 9}, {4, 5, 263}, {1, 64, 256}}) {
    check_decoding_panels<float>(M, N, K);
    check_decoding_panels<double>(M, N, K);
    check_decoding_panels<Eigen::bfloat16>(M, N, K);
    check_decoding_panels<Eigen::half>(M, N, K);
  }
  const auto x = test_support::random_tensor<float, 2>({5, 8}, 1), w = test_support::random_tensor<float, 2>({3, 8}, 2);
  const decoding_panels<float> panels(w.data(), 3, 8);
  Tensor<float, 2> y({5, 3});
  test_support::expect_input_error([&] { linear_forward(policy::simd{}, x.const_view(), panels, y.view()); },
                                   "linear_forward", "x", "at most 4 rows (decoding panels)", "5 rows");
  Tensor<float, 2> y2({2, 3});
  const auto x9 = test_support::random_tensor<float, 2>({2, 9}, 3);
  test_support::expect_input_error([&] { linear_forward(policy::reference{}, x9.const_view(), panels, y2.view()); },
                                   "linear_forward", "w", "decoding panels [N, 9]", "[3, 8]");
  CHECK(std::all_of(y.data(), y.data() + y.size(), [](float v) { return v == 0; }));
}

TEST_CASE("simd: decoding's slices of w, each computed once whatever the threads") {
  // Each thread's own run from the front, the rest taken from the back of
  // other runs (for_each_gemv_slice): every row of x meets every slice of w's
  // rows once, with the slice's true row count, for thread counts below, at
  // and past the slice count and a ragged last slice.
  for (int threads : {1, 2, 3, 8})
    for (auto [M, N, slice] : {std::array<index_t, 3>{1, 1, 16}, {4, 300, 16}, {2, 17, 16}, {1, 1000, 1}, {3, 5, 4},
                               {1, 4096, 16}}) {
      const index_t slices = (N + slice - 1) / slice;
      std::vector<std::atomic<int>> visits(static_cast<std::size_t>(M * slices));
      std::atomic<bool> wrong_rows{false};
      simd_detail::for_each_gemv_slice(policy::simd{threads}, M, N, slice, [&](index_t i, index_t j, index_t rows) {
        if (j % slice != 0 || rows != std::min(slice, N - j)) wrong_rows = true;
        visits[static_cast<std::size_t>(i * slices + j / slice)].fetch_add(1);
      });
      INFO("threads=" << threads << " M=" << M << " N=" << N << " slice=" << slice);
      CHECK_FALSE(wrong_rows.load());
      int missed_or_repeated = 0;
      for (const auto& v : visits) missed_or_repeated += v.load() != 1;
      CHECK(missed_or_repeated == 0);
    }
}

TEST_CASE("simd: streaming loops ask for their lines whole groups ahead") {
  // stream_ahead: near is whole groups of at least 8 KiB (the same column of
  // rows further on), far whole nears of at least far_stream_least() or none.
  const index_t far_least = simd_detail::far_stream_least();
  CHECK((far_least == 0 || far_least == 65536));
  for (index_t group : {0, 64, 1000, 2048, 6144, 8192, 24576, 100000}) {
    const simd_detail::stream_distance d = simd_detail::stream_ahead(group);
    INFO("group=" << group);
    const index_t unit = group > 0 ? group : 1;
    CHECK(d.near % unit == 0);
    CHECK(d.near >= simd_detail::least_stream_ahead);
    CHECK(d.near < simd_detail::least_stream_ahead + unit);
    if (far_least == 0) {
      CHECK(d.far == 0);
    } else {
      CHECK(d.far % d.near == 0);
      CHECK(d.far >= far_least);
      CHECK(d.far < far_least + d.near);
    }
  }
  // AMX's slices (gemv_amx_bf16.hpp) read a line of each of their rows in
  // turn: a distance in that order lands on the same row, whole lines on,
  // within the slice or in the slices after it in memory.
  constexpr index_t rows = 16, K = 1024, runs = K / 32, run_bytes = rows * 64, row = K * 2;
  CHECK(simd_detail::amx_slice_bytes_ahead(3, 0, rows, K) == 0);
  CHECK(simd_detail::amx_slice_bytes_ahead(3, 8 * run_bytes, rows, K) == 8 * 64);       // run 11, this slice
  CHECK(simd_detail::amx_slice_bytes_ahead(30, 8 * run_bytes, rows, K) == rows * row - 24 * 64);  // run 6, next slice
  CHECK(simd_detail::amx_slice_bytes_ahead(0, 2 * runs * run_bytes, rows, K) == 2 * rows * row);  // run 0, two on
  const index_t short_rows = 5;  // a slice cut short: its own rows make a run
  CHECK(simd_detail::amx_slice_bytes_ahead(31, 2 * short_rows * 64, short_rows, K) == short_rows * row - 30 * 64);
}

TEST_CASE("simd: several products' slices in one run, each computed once whatever the threads") {
  // Parts of ragged sizes, one of a single row, one of fewer rows than a
  // slice: every slice of every part once, with its part's true row count.
  const std::vector<index_t> rows{300, 1, 17, 64, 5};
  constexpr index_t slice = 16, M = 3;
  for (int threads : {1, 2, 3, 8}) {
    std::vector<std::vector<std::atomic<int>>> visits;
    for (const index_t n : rows) visits.emplace_back(static_cast<std::size_t>(M * ((n + slice - 1) / slice)));
    std::atomic<bool> wrong_rows{false};
    simd_detail::for_each_gemv_slice(policy::simd{threads}, M, std::span<const index_t>(rows), slice,
                                     [&](std::size_t k, index_t i, index_t j, index_t n) {
                                       if (j % slice != 0 || n != std::min(slice, rows[k] - j)) wrong_rows = true;
                                       const index_t slices = (rows[k] + slice - 1) / slice;
                                       visits[k][static_cast<std::size_t>(i * slices + j / slice)].fetch_add(1);
                                     });
    INFO("threads=" << threads);
    CHECK_FALSE(wrong_rows.load());
    int missed_or_repeated = 0;
    for (const auto& part : visits)
      for (const auto& v : part) missed_or_repeated += v.load() != 1;
    CHECK(missed_or_repeated == 0);
  }
}

// Linear::forward_together (decoding's q, k and v; gate and up as one
// product) gives each Linear's forward bit for bit: W read as it is, as int8
// rows, a mix (one forward each), beside decoding panels (made where x is
// wider than wide_weight_row_bytes: K = 8200 here), and for prompts.
template <class T>
void check_forward_together(index_t K) {
  const policy::simd simd{2};
  random_stream rng(7);
  std::vector<Linear<T, policy::simd>> linears;
  for (index_t n : {64, 20, 33}) linears.emplace_back(K, n, simd).reset_parameters(rng);
  const auto check = [&](const char* weights) {
    for (auto [B, N] : {std::array<index_t, 2>{1, 1}, {2, 2}, {1, 3}, {1, 6}}) {
      const auto x = test_support::random_tensor<T, 3>({B, N, K}, 11);
      std::vector<Tensor<T, 3>> alone, together;
      std::vector<typename Linear<T, policy::simd>::saved_type> saved(6);
      for (std::size_t l = 0; l < linears.size(); ++l) {
        alone.emplace_back(linears[l].output_shape(x.shape()));
        together.emplace_back(linears[l].output_shape(x.shape()));
        linears[l].forward(x.const_view(), alone[l].view(), saved[l]);
      }
      Linear<T, policy::simd>::forward_together(x.const_view(), {{linears[0], together[0].view(), saved[3]},
                                                                 {linears[1], together[1].view(), saved[4]},
                                                                 {linears[2], together[2].view(), saved[5]}});
      INFO(scalar_traits<T>::name << ", " << weights << ", x [" << B << ", " << N << ", " << K << "]");
      for (std::size_t l = 0; l < linears.size(); ++l) {
        CHECK(std::equal(alone[l].data(), alone[l].data() + alone[l].size(), together[l].data(),
                         [](T a, T b) { return std::bit_cast<std::array<char, sizeof(T)>>(a) ==
                                               std::bit_cast<std::array<char, sizeof(T)>>(b); }));
        CHECK(saved[3 + l].input_shape == x.shape());
      }
    }
  };
  check("W");
  linears[1].add_decoding_panels();
  check("W, one with decoding panels where x is wide");
  linears[1].quantize_weights();
  check("int8 rows and W");
  for (auto& l : linears) l.quantize_weights();
  check("int8 rows");
}

TEST_CASE("simd: decoding's projections of one x as one product, the bits of one forward each") {
  for (index_t K : {96, 8200}) {
    check_forward_together<float>(K);
    check_forward_together<double>(K);
    check_forward_together<Eigen::bfloat16>(K);
    check_forward_together<Eigen::half>(K);
  }
  // Bad input: every output checked before any is written.
  const Linear<float, policy::simd> a(8, 4), b(8, 3);
  const auto x = test_support::random_tensor<float, 3>({1, 1, 8}, 1);
  Tensor<float, 3> ya({1, 1, 4}), yb({1, 1, 4});
  Linear<float, policy::simd>::saved_type sa, sb;
  test_support::expect_input_error(
      [&] { Linear<float, policy::simd>::forward_together(x.const_view(), {{a, ya.view(), sa}, {b, yb.view(), sb}}); },
      "Linear::forward", "y", "[1, 1, 3]", "[1, 1, 4]");
  CHECK(std::all_of(ya.data(), ya.data() + ya.size(), [](float v) { return v == 0; }));
}

// The bfloat16 dot-product path (gemm_bf16_pairs.hpp) against the
// convert-while-packing product, element by element, in the three layouts
// and both write modes, over its blocking's edges and odd depths. Both sum
// exact products in float, in different orders: each float result lies within
// K·u₃₂·Σ|a·b| of the exact sum, then each is rounded to bfloat16 once, so two
// results differ by at most 2·K·u₃₂·Σ|a·b| + one bfloat16 step of the
// converting result (2⁻⁷·|c|, plus 2⁻¹⁴·Σ|a·b| for the second-order terms).
// A wrong pairing or a lost panel misses by O(|c|). A scalar model of the
// packing and of vdpbf16ps runs the path's blocking on every CPU; the
// instructions themselves run where the CPU has them.

// The packed layout, word by word: the first `count` rows or columns w of X,
// X(w, p) = src[w · ld + p] when X is stored along the depth (along_k), else
// src[p · ld + w], in ⌈count / width⌉ panels of [⌈k / 2⌉ pairs q][width]:
// word (q, c) of panel s is X(w, 2q) | X(w, 2q + 1) << 16 for w = s · width +
// c, zero where w ≥ count or the depth is past k.
template <bool along_k, index_t width>
void pack_pairs(const Eigen::bfloat16* src, index_t ld, index_t k, index_t count, simd_detail::pair_word* dst) {
  const index_t pairs = (k + 1) / 2;
  auto at = [&](index_t w, index_t p) -> simd_detail::pair_word {
    return p < k ? simd_detail::bf16_bits(along_k ? src[w * ld + p] : src[p * ld + w]) : 0;
  };
  for (index_t s = 0; s < (count + width - 1) / width; ++s)
    for (index_t q = 0; q < pairs; ++q)
      for (index_t c = 0; c < width; ++c) {
        const index_t w = s * width + c;
        dst[(s * pairs + q) * width + c] = w < count ? at(w, 2 * q) | at(w, 2 * q + 1) << 16 : 0;
      }
}

// The micro-kernel's arithmetic, lane by lane: vdpbf16ps adds the high halves'
// product first.
template <int MR, int NV>
struct modelled_bf16_pairs {
  static constexpr index_t rows = MR, cols = 16 * NV;
  template <bool along_k, index_t width>
  static void pack(const Eigen::bfloat16* src, index_t ld, index_t k, index_t count, simd_detail::pair_word* dst) {
    pack_pairs<along_k, width>(src, ld, k, count, dst);
  }
  static void add_product(index_t pairs, const simd_detail::pair_word* a, const simd_detail::pair_word* b, float* c,
                          index_t ldc) noexcept {
    auto half = [](simd_detail::pair_word w, int h) { return std::bit_cast<float>((w >> (16 * h) & 0xffffu) << 16); };
    for (index_t r = 0; r < rows; ++r)
      for (index_t col = 0; col < cols; ++col) {
        float sum = c[r * ldc + col];
        for (index_t q = 0; q < pairs; ++q) {
          const auto x = a[q * rows + r], y = b[q * cols + col];
          sum += half(x, 1) * half(y, 1);
          sum += half(x, 0) * half(y, 0);
        }
        c[r * ldc + col] = sum;
      }
  }
  static constexpr index_t dot_rows = 5;  // a slice that divides none of the chunks below
  static void row_dots(const Eigen::bfloat16* x, const Eigen::bfloat16* first, index_t stride, index_t rows, index_t k,
                       bool /*side_by_side: the model's rows are independent*/, float* out) noexcept {
    for (index_t t = 0; t < rows; ++t) {
      float sum = 0;
      for (index_t c = 0; c < k; c += 2) {
        if (c + 1 < k) sum += float(x[c + 1]) * float(first[t * stride + c + 1]);
        sum += float(x[c]) * float(first[t * stride + c]);
      }
      out[t] = sum;
    }
  }
};

// The entries of two M x N bfloat16 results that differ past the bar above,
// magnitude(i, j) the sum of |a·b| (and |c| where the product accumulates).
template <class Magnitude>
void check_agreement(index_t M, index_t N, index_t K, const Eigen::bfloat16* converted, const Eigen::bfloat16* paired,
                     Magnitude&& magnitude) {
  constexpr double u32 = 0x1p-24, bf16_step = 0x1p-7;
  int misses = 0;
  double worst = 0;
  for (index_t i = 0; i < M; ++i)
    for (index_t j = 0; j < N; ++j) {
      const double m = magnitude(i, j), x = double(converted[i * N + j]), y = double(paired[i * N + j]);
      const double bar = 2 * (K + 1) * u32 * m + bf16_step * (std::abs(x) + bf16_step * m);
      const bool agrees = std::abs(x - y) <= bar;  // false for NaN and infinities too
      if (agrees) worst = std::max(worst, std::abs(x - y) / bar);
      misses += !agrees;
    }
  INFO("worst difference " << worst << " of its bar");
  CHECK(misses == 0);
}

template <simd_detail::a_storage AS, simd_detail::b_storage BS, class Kernel>
void check_bf16_pairs(index_t M, index_t N, index_t K, bool accumulate) {
  using simd_detail::a_storage, simd_detail::b_storage;
  using B16 = Eigen::bfloat16;
  const auto a = test_support::random_tensor<B16, 2>({M, K}, 21), b = test_support::random_tensor<B16, 2>({K, N}, 22),
             c0 = test_support::random_tensor<B16, 2>({M, N}, 23);
  // A(i, p) and B(p, j) as the layouts store them.
  const index_t lda = AS == a_storage::rows ? K : M, ldb = BS == b_storage::rows ? N : K;
  auto a_index = [&](index_t i, index_t p) { return AS == a_storage::rows ? i * lda + p : p * lda + i; };
  auto b_index = [&](index_t p, index_t j) { return BS == b_storage::rows ? p * ldb + j : j * ldb + p; };
  const B16* a_stored = a.data();  // the same M·K values, read in the layout's order
  const B16* b_stored = b.data();
  Tensor<B16, 2> converted = c0, paired = c0;
  const policy::simd threads{2};
  simd_detail::converted_gemm<AS, BS>(threads, M, N, K, a_stored, lda, b_stored, ldb, converted.data(), N, accumulate);
  simd_detail::bf16_pair_gemm<AS, BS, Kernel>(threads, M, N, K, a_stored, lda, b_stored, ldb, paired.data(), N,
                                               accumulate);
  INFO("M=" << M << " N=" << N << " K=" << K << std::string(accumulate ? " +=" : " ="));
  check_agreement(M, N, K, converted.data(), paired.data(), [&](index_t i, index_t j) {
    double magnitude = accumulate ? std::abs(double(c0.data()[i * N + j])) : 0.0;
    for (index_t p = 0; p < K; ++p) magnitude += std::abs(double(a_stored[a_index(i, p)]) * double(b_stored[b_index(p, j)]));
    return magnitude;
  });
}

// Decoding's matrix-vector products on the kernel's row_dots against the
// converting ones (reduced_gemv), y = x · wᵀ; the kernel's with w's rows in
// two parts (a third, the rest: y's columns in two outputs, as q and k).
template <class Kernel>
void check_bf16_pair_gemv(index_t M, index_t N, index_t K) {
  using B16 = Eigen::bfloat16;
  const auto x = test_support::random_tensor<B16, 2>({M, K}, 25), w = test_support::random_tensor<B16, 2>({N, K}, 26);
  Tensor<B16, 2> converted({M, N}), paired({M, N});
  const policy::simd threads{2};
  const simd_detail::gemv_part<B16> whole{w.data(), N, converted.data()};
  simd_detail::reduced_gemv(threads, M, K, x.data(), std::span(&whole, 1));
  const index_t N1 = N / 3;
  std::vector<B16> y1(static_cast<std::size_t>(M * N1)), y2(static_cast<std::size_t>(M * (N - N1)));
  const simd_detail::gemv_part<B16> parts[] = {{w.data(), N1, y1.data()}, {w.data() + N1 * K, N - N1, y2.data()}};
  simd_detail::bf16_pair_gemv<Kernel>(threads, M, K, x.data(), std::span<const simd_detail::gemv_part<B16>>(parts));
  for (index_t i = 0; i < M; ++i) {
    std::copy_n(y1.data() + i * N1, N1, paired.data() + i * N);
    std::copy_n(y2.data() + i * (N - N1), N - N1, paired.data() + i * N + N1);
  }
  INFO("matrix-vector M=" << M << " N=" << N << " K=" << K);
  check_agreement(M, N, K, converted.data(), paired.data(), [&](index_t i, index_t j) {
    double magnitude = 0;
    for (index_t p = 0; p < K; ++p) magnitude += std::abs(double(x.data()[i * K + p]) * double(w.data()[j * K + p]));
    return magnitude;
  });
}

template <class Kernel>
void check_bf16_pairs_everywhere() {
  using simd_detail::a_storage, simd_detail::b_storage;
  // Micro-panels of rows and columns with a ragged end (M, N below, at and
  // past them), depth slices of 128 pairs, odd depths (a zero pads the last
  // pair) and none, several row blocks per thread (M = 200), and several
  // column blocks of B: by C's budget (1344 columns) and by B's (2²⁰ words,
  // 3 panels of 32 at 8251 pairs).
  for (auto [M, N, K] : {std::array<index_t, 3>{133, 261, 531}, {67, 17, 1030}, {5, 3, 1}, {1, 300, 77},
                         {13, 64, 2}, {200, 33, 40}, {4, 7, 0}, {5, 1400, 41}, {3, 100, 16501}})
    for (bool accumulate : {false, true}) {
      check_bf16_pairs<a_storage::rows, b_storage::columns, Kernel>(M, N, K, accumulate);
      check_bf16_pairs<a_storage::rows, b_storage::rows, Kernel>(M, N, K, accumulate);
      check_bf16_pairs<a_storage::columns, b_storage::rows, Kernel>(M, N, K, accumulate);
    }
  // Decoding: one to four rows of x; depths below, at and past 32 values
  // with odd ends; w's rows in whole slices, ragged ones and chunks of both.
  for (auto [M, N, K] : {std::array<index_t, 3>{1, 300, 77}, {4, 33, 64}, {2, 17, 2}, {1, 40, 98}, {3, 16, 96},
                         {1, 5, 1}, {2, 64, 31}, {1, 1030, 2048}, {4, 7, 0}})
    check_bf16_pair_gemv<Kernel>(M, N, K);
}

#if DIFFTX_BF16_PAIRS
// The vector packers against pack_pairs, word for word: depths around the
// 16-pair transposes, counts from one to three panels with ragged ends, both
// storage orders.
template <bool along_k, index_t width>
void check_packing() {
  const index_t ld = 100;  // room for 3 panels (96 values) and 65 depths either way
  const auto x = test_support::random_tensor<Eigen::bfloat16, 2>({ld, ld}, 24);
  for (index_t k : {1, 2, 31, 32, 33, 64, 65})
    for (index_t count : {index_t{1}, width / 2 + 1, width - 1, width, width + 1, 3 * width - 1}) {
      const index_t words = (count + width - 1) / width * ((k + 1) / 2) * width;
      std::vector<simd_detail::pair_word> vector_packed(words, 0xdeadbeef), model(words);
      simd_detail::avx512_bf16_pairs::pack<along_k, width>(x.data(), ld, k, count, vector_packed.data());
      pack_pairs<along_k, width>(x.data(), ld, k, count, model.data());
      INFO((along_k ? "along the depth" : "across it") << ", width " << width << ", k " << k << ", count " << count);
      CHECK(vector_packed == model);
    }
}
#endif

TEST_CASE("simd: the bfloat16 dot-product path agrees with the converting product") {
  check_bf16_pairs_everywhere<modelled_bf16_pairs<12, 2>>();
  check_bf16_pairs_everywhere<modelled_bf16_pairs<7, 1>>();  // micro-panels that divide no block
#if DIFFTX_BF16_PAIRS
  if (simd_detail::bf16_pair_instructions()) {
    constexpr index_t MR = simd_detail::avx512_bf16_pairs::rows, NR = simd_detail::avx512_bf16_pairs::cols;
    check_packing<true, MR>();
    check_packing<false, MR>();
    check_packing<true, NR>();
    check_packing<false, NR>();
    check_bf16_pairs_everywhere<simd_detail::avx512_bf16_pairs>();
  } else {
    MESSAGE("this CPU has no AVX512_BF16: the dot-product instruction itself was not run, only its model");
  }
#else
  MESSAGE("not an x86-64 GNU-compatible build: no dot-product instruction path, only its model checked");
#endif
}

// Several prompts' bfloat16 products on AMX (gemv_amx_bf16.hpp): the tile
// model on every CPU, and the instructions, through linear_forward, where the
// CPU and OS grant tile data. Each result sums exact products in float (within
// K·u₃₂·Σ|x·w| of the exact sum, in whatever order the tile adds them) and is
// rounded to bfloat16 once (2⁻⁸·|y|): the bound below, with the float part
// doubled. A wrong pairing, row or column misses by O(|y|). Shapes: 5, 8 and
// 16 rows of x, a slice of w's rows cut short (40 = 2·16 + 8), one and three
// runs of depth.
TEST_CASE("simd: several rows of bfloat16 x on AMX tiles, modelled everywhere, the instructions where granted") {
  for (auto [M, N, K] : {std::array<index_t, 3>{5, 16, 32}, {8, 40, 96}, {16, 40, 64}, {8, 3, 32}}) {
    const auto x = test_support::random_tensor<Eigen::bfloat16, 2>({M, K}, 1);
    const auto w = test_support::random_tensor<Eigen::bfloat16, 2>({N, K}, 2);
    auto check = [&](const Tensor<Eigen::bfloat16, 2>& y, const char* what) {
      int outside = 0;
      for (index_t i = 0; i < M; ++i)
        for (index_t n = 0; n < N; ++n) {
          double exact = 0, magnitude = 0;
          for (index_t k = 0; k < K; ++k) {
            const double product = double(float(x(i, k))) * double(float(w(n, k)));
            exact += product;
            magnitude += std::abs(product);
          }
          const double bound = std::ldexp(std::abs(exact), -8) + 2.0 * double(K) * std::ldexp(magnitude, -24);
          outside += std::abs(double(float(y(i, n))) - exact) > bound;
        }
      INFO(what << ": M=" << M << " N=" << N << " K=" << K);
      CHECK(outside == 0);
    };
    Tensor<Eigen::bfloat16, 2> y({M, N});
    const simd_detail::gemv_part<Eigen::bfloat16> part{w.data(), N, y.data()};
    simd_detail::amx_bf16_gemv<simd_detail::amx_tile_model>(policy::simd{2}, M, K, x.data(), std::span(&part, 1));
    check(y, "tile model");
    const policy::simd amx{2};  // AMX tiles by default
    if (simd_detail::amx_gemv_takes(amx, M, K)) {
      Tensor<Eigen::bfloat16, 2> y_amx({M, N});
      linear_forward(amx, x.const_view(), w.const_view(), y_amx.view());
      check(y_amx, "AMX");
    } else {
      MESSAGE("no AMX-BF16 tile data here: the tile product was run on its model only");
    }
  }
}

TEST_CASE("simd: MultiHead over the shape sweep") {
  for (const auto& c : cases) {
    auto make = [c]<class U, class P>() {
      return MultiHead<U, 8, P>({.d_model = 24, .heads = c.heads, .kv_heads = c.kv_heads, .layer_index = 3,
                                 .rope_theta = 10000.0, .causal = c.causal},
                                P{});
    };
    check_all_types("MultiHead D=8 " + describe(c), make, {c.batch, c.seq, 24});
  }
}

TEST_CASE("simd: head sizes that fill vectors (D = 32) and the baseline Attention") {
  // llama3 RoPE whose original context (64) puts D = 32's frequencies in all three bands.
  const rope_scaling llama3{.type = rope_type::llama3, .factor = 32.0, .original_max_positions = 64.0};
  for (const auto& c : {cases[1], cases[4]}) {
    check_all_types(
        "MultiHead D=32 llama3 RoPE " + describe(c),
        [c, llama3]<class U, class P>() {
          return MultiHead<U, 32, P>(
              {.d_model = 48, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal, .rope_scaling = llama3},
              P{});
        },
        {c.batch, c.seq, 48});
    check_all_types(
        "Attention D=16 " + describe(c),
        [c]<class U, class P>() {
          return Attention<U, 16, P>({.d_model = 48, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal}, P{});
        },
        {c.batch, c.seq, 48});
  }
}

TEST_CASE("simd: MultiHeadV2 over the shape sweep, its baseline, DecoderLayerV2") {
  for (const auto& c : cases) {
    auto make = [c]<class U, class P>() {
      return MultiHeadV2<U, dynamic, P>(
          {.d_model = 24, .heads = c.heads, .kv_heads = c.kv_heads, .causal = c.causal, .head_dim = 8}, P{});
    };
    check_all_types("MultiHeadV2 D=8 " + describe(c), make, {c.batch, c.seq, 24});
  }
  check_all_types(
      "MultiHeadV2 baseline D=16",
      []<class U, class P>() {
        return MultiHeadV2<U, 16, P>({.d_model = 48, .heads = 4, .kv_heads = 2, .differential = false}, P{});
      },
      {2, 63, 48});
  check_all_types(
      "DecoderLayerV2 D=8",
      []<class U, class P>() {
        return DecoderLayerV2<U, 8, P>({{.d_model = 32, .heads = 2, .kv_heads = 1}, 72}, P{});
      },
      {2, 70, 32});
}

TEST_CASE("simd: DecoderLayer") {
  check_all_types(
      "DecoderLayer D=8",
      []<class U, class P>() {
        return DecoderLayer<U, 8, P>({{.d_model = 32, .heads = 2, .kv_heads = 1, .layer_index = 4}, 72}, P{});
      },
      {2, 70, 32});
}

TEST_CASE("simd: attention logits up to ±1e4 stay finite and match") {
  // Inputs scaled by 40 make the projected scores reach ~1e4 (printed below).
  auto make = []<class U, class P>() {
    return MultiHead<U, 8, P>({.d_model = 24, .heads = 2, .kv_heads = 1, .causal = true}, P{});
  };
  double logits = 0;
  {
    MultiHead<double, 8> probe({.d_model = 24, .heads = 2, .kv_heads = 1});
    test_support::randomise_parameters(probe, 7);
    auto x = test_support::random_tensor<double, 3>({1, 70, 24}, 8, 40.0);
    Tensor<double, 3> y(x.shape());
    MultiHead<double, 8>::saved_type saved;
    probe.forward(x, y, saved);
    double largest = 0;  // |score| = |q·k| / sqrt(D) over all pairs of the first head
    for (index_t i = 0; i < 70; ++i)
      for (index_t t = 0; t <= i; ++t) {
        double s = 0;
        for (index_t c = 0; c < 8; ++c) s += saved.q(0, i, 0, 0, c) * saved.k(0, t, 0, 0, c);
        largest = std::max(largest, std::abs(s) / std::sqrt(8.0));
      }
    MESSAGE("largest |attention logit|: " << largest);
    CHECK(largest > 1e4);
    logits = largest;
  }
  check_against_reference<float>("MultiHead, logits ~1e4", make, {1, 70, 24}, 40.0, logits);
  check_against_reference<double>("MultiHead, logits ~1e4", make, {1, 70, 24}, 40.0, logits);
}

TEST_CASE("simd: results do not depend on the thread count") {
  auto run = [](int threads) {
    DecoderLayer<float, 16, policy::simd> layer({{.d_model = 64, .heads = 2, .kv_heads = 1}, 96}, policy::simd{threads});
    test_support::randomise_parameters(layer, 3);
    auto x = test_support::random_tensor<float, 3>({2, 131, 64}, 4);
    auto dy = test_support::random_tensor<float, 3>({2, 131, 64}, 5);
    auto [y, dx] = test_support::run_forward_backward(layer, x, dy);
    std::vector<std::vector<float>> grads{std::vector<float>(y.data(), y.data() + y.size()),
                                          std::vector<float>(dx.data(), dx.data() + dx.size())};
    for (const auto& p : layer.parameters()) grads.emplace_back(p.grad, p.grad + p.size());
    return grads;
  };
  const auto one = run(1);
  for (int threads : {2, 3}) {
    const auto many = run(threads);
    for (std::size_t i = 0; i < one.size(); ++i) {
      INFO("threads " << threads << ", tensor " << i);
      CHECK(testing::normwise_difference(many[i].data(), one[i].data(), static_cast<index_t>(one[i].size())) <=
            testing::tolerance<float>::backward);
    }
  }
}

TEST_CASE("simd: a decode step's team runs every part once, on its own threads, and passes exceptions on") {
  // run_decode_step holds the threads of a step of few rows (policy/simd/
  // step_team.hpp): each fork inside it runs parts 0 .. n-1 once, part 0 on
  // the calling thread; a fork inside a part runs on its thread alone; a
  // thread left idle past the spin budget still wakes for the next part.
  const policy::simd two{2};
  const auto caller = std::this_thread::get_id();
  int jobs = 0;
  std::atomic<int> wrong{0};
  run_decode_step(two, 1, [&] {
    REQUIRE(simd_detail::step_team::led_here() != nullptr);
    for (int job = 0; job < 200; ++job) {
      std::array<std::atomic<int>, 2> runs{};
      std::array<std::thread::id, 2> ids{};
      if (job % 50 == 49) std::this_thread::sleep_for(simd_detail::step_team::spin_budget * 20);
      simd_detail::fork(job % 2 ? 2 : 3, [&](int t, int n) {
        if (n != 2) ++wrong;  // the team's size, fewer than three asked for
        runs[static_cast<std::size_t>(t)].fetch_add(1);
        ids[static_cast<std::size_t>(t)] = std::this_thread::get_id();
        simd_detail::fork(2, [&](int inner_t, int inner_n) {
          if (inner_t != 0 || inner_n != 1 || std::this_thread::get_id() != ids[static_cast<std::size_t>(t)]) ++wrong;
        });
      });
      if (runs[0] != 1 || runs[1] != 1 || ids[0] != caller || ids[1] == caller) ++wrong;
      ++jobs;
    }
  });
  CHECK(jobs == 200);
  CHECK(wrong.load() == 0);
  CHECK(simd_detail::step_team::led_here() == nullptr);

  // A part's exception, on either thread, reaches run_decode_step's caller.
  for (int thrower : {0, 1})
    CHECK_THROWS_AS(run_decode_step(two, 1, [&] {
                      simd_detail::fork(2, [&](int t, int) {
                        if (t == thrower) throw std::runtime_error("part");
                      });
                    }),
                    std::runtime_error);
  // Steps of more rows than decoding's products (their blocked paths open
  // regions of their own), and one thread, lead no team.
  bool led = true;
  run_decode_step(two, simd_detail::gemv_max_rows + 1, [&] { led = simd_detail::step_team::led_here() != nullptr; });
  CHECK_FALSE(led);
  run_decode_step(policy::simd{1}, 1, [&] { led = simd_detail::step_team::led_here() != nullptr; });
  CHECK_FALSE(led);
}
